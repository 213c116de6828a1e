"""Studio 2 (issue 32) in a real browser: Playwright driving Debian's Chromium.

One browser for the module (``browser`` from test_studio_browser), one finished
15-node run and one studio for the read-only checks (``finished``), one live gated flow
for the live ones. Waits are Playwright's bounded ``expect`` and ``waiting.wait_for``.

The geometry check reads the rendered SVG: every edge polyline, segment by segment,
against every node box shrunk by 1 px (an edge may touch the box it starts or ends on,
never enter one).
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import test_studio_browser as shared
from ctl_support import clean_env, live_flow, run_cli, wait_for, write_yaml
from playwright.sync_api import Browser, Page, expect
from test_studio_browser import GATED_CLI, LIVE_MS, Studio, Watched, _shot, studio_process

# The module fixture (its runs and Studio) is built once, on one worker, not once per worker
# that gets one of its tests (about 9 s of processes each time).
pytestmark = pytest.mark.xdist_group("studio_runs")

# The shared fixtures: one Chromium for this module, a fresh watched context per test.
browser = shared.browser
watched = shared.watched

expect.set_options(timeout=LIVE_MS)

#: 15 nodes: the issue's chain with a skip-layer edge, a failure branch, an ``always``
#: edge, an ``if_contains`` edge and a fan-in over three layers.
PLAN = [
    {"agent_id": "fetch", "instruction": "fetch"},
    {"agent_id": "parse", "instruction": "parse", "depends_on": ["fetch"]},
    {"agent_id": "chart", "instruction": "chart", "depends_on": ["parse"]},
    {"agent_id": "report", "instruction": "report", "depends_on": ["parse", "chart"]},
    {"agent_id": "lint", "instruction": "lint", "depends_on": ["fetch"]},
    {"agent_id": "fixup", "instruction": "fix", "depends_on": [{"id": "lint", "when": "failed"}]},
    {"agent_id": "notify", "instruction": "n", "depends_on": [{"id": "lint", "when": "always"}]},
    {"agent_id": "stats", "instruction": "s", "depends_on": ["parse"]},
    {"agent_id": "table", "instruction": "t", "depends_on": ["stats"]},
    {"agent_id": "review", "instruction": "r",
     "depends_on": [{"id": "report", "if_contains": "ok"}]},
    {"agent_id": "archive", "instruction": "a", "depends_on": ["fetch", "table"]},
    {"agent_id": "index", "instruction": "i", "depends_on": ["parse"]},
    {"agent_id": "summary", "instruction": "s", "depends_on": ["index", "table", "report"]},
    {"agent_id": "mail", "instruction": "m", "depends_on": ["summary", "fetch"]},
    {"agent_id": "done", "instruction": "d", "depends_on": ["mail", "archive", "notify"]},
]  # fmt: skip


@dataclass
class Finished:
    studio: Studio
    run: str
    shots: Path


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Finished]:
    """A finished 15-node run (lint fails: its fallback runs) and a studio over it."""
    tmp = tmp_path_factory.mktemp("finished")
    home = tmp / "home"
    write_yaml(tmp / "plan.yaml", {"name": "quarterly report", "plan": PLAN})
    script = write_yaml(tmp / "script.yaml", {"lint": {"fail": "lint found 3 problems"},
                                             "report": {"response": "ok"}})  # fmt: skip
    done = run_cli(
        home, "flow", "--plan", str(tmp / "plan.yaml"), "--model", f"script:{script}", "--json"
    )
    assert done.returncode in (0, 1), done.stderr
    run = json.loads(done.stdout)["run_id"]
    with studio_process(home) as s:
        yield Finished(s, run, tmp)


def _boxes(page: Page) -> list[tuple[str, float, float, float, float]]:
    return page.eval_on_selector_all(
        "svg.dag g[data-node] rect",
        "els => els.map(r => [r.parentNode.getAttribute('data-node'),"
        " +r.getAttribute('x'), +r.getAttribute('y'), +r.getAttribute('width'),"
        " +r.getAttribute('height')])",
    )


def _edges(page: Page) -> list[tuple[str, list[tuple[float, float]]]]:
    raw = page.eval_on_selector_all(
        "svg.dag g.edge polyline",
        "els => els.map(p => [p.parentNode.getAttribute('data-edge'), p.getAttribute('points')])",
    )
    return [(k, [tuple(map(float, pt.split(","))) for pt in pts.split()]) for k, pts in raw]


def _crosses(a: tuple[float, float], b: tuple[float, float], box: tuple[float, ...]) -> bool:
    """Whether segment a-b enters the rectangle ``box`` shrunk by 1 px (Liang-Barsky)."""
    x, y, w, h = box[0] + 1, box[1] + 1, box[2] - 2, box[3] - 2
    t0, t1 = 0.0, 1.0
    dx, dy = b[0] - a[0], b[1] - a[1]
    for p, q in ((-dx, a[0] - x), (dx, x + w - a[0]), (-dy, a[1] - y), (dy, y + h - a[1])):
        if p == 0:
            if q < 0:
                return False
            continue
        t = q / p
        if p < 0:
            t0 = max(t0, t)
        else:
            t1 = min(t1, t)
        if t0 > t1:
            return False
    return True


def test_runs_list_run_graph_and_timeline_at_desktop_and_phone_width(
    finished: Finished, watched: Watched
) -> None:
    s, run = finished.studio, finished.run
    page = watched.page()
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(s.url)
    row = page.locator(f"tr#run-{run}")
    expect(row).to_contain_text("quarterly report")  # the plan's name, linked
    expect(row.locator('[data-field="phase"]')).to_have_text("-")  # finished: no phase
    _shot(page, finished.shots / "runs-1280.png")

    row.get_by_role("link", name="quarterly report").click()
    expect(page.locator("svg.dag")).to_be_visible()
    boxes = _boxes(page)
    assert len(boxes) == 15
    edges = _edges(page)
    deps = sum(len(e.get("depends_on", [])) for e in PLAN)
    assert len(edges) == deps
    hits = [
        (key, name)
        for key, points in edges
        for a, b in itertools.pairwise(points)
        for name, *box in boxes
        if _crosses(a, b, box)
    ]
    assert hits == [], hits
    # Every bend is on the canvas (none routed off its edge).
    width, height = page.eval_on_selector(
        "svg.dag", "s => [+s.getAttribute('width'), +s.getAttribute('height')]"
    )
    off = [
        (k, p) for k, pts in edges for p in pts if not (0 <= p[0] <= width and 0 <= p[1] <= height)
    ]
    assert off == [], off
    # parse -> report skips chart's layer: it bends around chart, not through it.
    (skip,) = [pts for key, pts in edges if key == "parse>report"]
    assert len(skip) >= 4
    assert page.locator("svg.dag polyline[marker-end='url(#arrow)']").count() == deps
    expect(page.locator('g[data-edge="lint>fixup"]')).to_have_class(re.compile("edge-failed"))
    expect(page.locator('g[data-edge="lint>fixup"] text')).to_have_text("on failure")
    expect(page.locator('g[data-edge="report>review"] text')).to_contain_text("if contains")
    expect(page.locator('g[data-edge="lint>notify"]')).to_have_class(re.compile("edge-always"))
    # Nodes are links to their pages.
    assert page.locator('svg.dag a[href$="/nodes/report"]').count() == 1
    # The failed node's error is on the run page itself.
    expect(page.locator("#failures")).to_contain_text("lint found 3 problems")
    bars = page.locator("svg.timeline rect[data-bar]")
    assert bars.count() == 15
    widths = [float(bars.nth(i).get_attribute("width") or 0) for i in range(15)]
    assert sum(1 for w in widths if w > 0) >= 13  # every node that ran has a bar
    expect(page.locator("#history")).to_contain_text("node failed")
    _shot(page, finished.shots / "run-1280.png")

    # Timestamps never wrap; at phone width the page still lays out, in dark mode too.
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 800})
        for cell in page.locator("#history td.nowrap").all()[:3]:
            # One line box for the text: the timestamp did not wrap (the row may be taller).
            lines = cell.evaluate(
                "e => { const r = document.createRange(); r.selectNodeContents(e);"
                " return [getComputedStyle(e).whiteSpace, r.getClientRects().length]; }"
            )
            assert lines == ["nowrap", 1], (width, lines)
    page.emulate_media(color_scheme="dark")
    bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert bg == "rgb(15, 17, 21)", bg  # the theme's dark background (issue 42 item 7)
    _shot(page, finished.shots / "run-390-dark.png")
    # No inline script: the only script is the studio's file.
    assert page.locator("script:not([src])").count() == 0


def test_readable_without_javascript(finished: Finished, browser: Browser) -> None:
    context = browser.new_context(java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto(finished.studio.url)
        expect(page.locator(f"tr#run-{finished.run}")).to_contain_text("quarterly report")
        page.goto(finished.studio.base + f"/runs/{finished.run}")
        expect(page.locator("svg.dag g[data-node]")).to_have_count(15)
        expect(page.locator("svg.timeline rect[data-bar]")).to_have_count(15)
    finally:
        context.close()


def test_live_durations_models_and_control_log(tmp_path: Path, watched: Watched) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    plan = [{"agent_id": "a", "instruction": "one"},
            {"agent_id": "b", "instruction": "two", "depends_on": ["a"]}]  # fmt: skip
    write_yaml(tmp_path / "plan.yaml", {"name": "live", "plan": plan})
    script = write_yaml(tmp_path / "script.yaml", {})
    args = ["--plan", str(tmp_path / "plan.yaml"), "--model", f"script:{script}"]
    for key in "ab":
        (home / f"gate-{key}").touch()
    argv = [sys.executable, str(GATED_CLI), "--home", str(home), "flow", *args, "--json"]
    with live_flow(home, args, argv=argv) as flow, studio_process(home) as s:
        page = watched.page()
        page.goto(s.url)
        page.goto(s.base + f"/runs/{flow.run_id}")
        wait_for(lambda: (home / "started-a").exists(), what="a to start")
        b = page.locator('td[data-node-duration="b"]')
        expect(b).to_have_text("-")  # b has not started when the page loads
        page.evaluate("window.steerflowTest = 1")
        (home / "release-a").touch()
        # b starts after load: its model and a growing duration appear without a reload.
        expect(page.locator('td[data-node-model="b"]')).to_have_text(re.compile("script"))
        expect(b).to_have_text(re.compile(r"^\d+\.\d s$|^\d+\.\ds$"))
        first = b.inner_text()
        expect(b).not_to_have_text(first)
        assert page.evaluate("window.steerflowTest === 1")
        # a finished after load: its duration is the final one, as a reload shows it.
        final = json.loads(run_cli(home, "show", flow.run_id, "--json").stdout)
        (a,) = [n for n in final["nodes"] if n["id"] == "a"]
        expect(page.locator('td[data-node-duration="a"]')).to_have_text(f"{a['duration_s']:.1f}s")
        # A control sent from the CLI shows in the log without touching the page.
        sent = run_cli(home, "ctl", "msg", flow.session_id, "from the terminal")
        assert sent.returncode == 0, sent.stderr
        expect(page.locator("#control-log")).to_contain_text("from the terminal")
        (home / "release-b").touch()
        assert flow.finish() == 0
        expect(page.locator("#run-status")).to_have_text("completed")
    assert clean_env()  # the helper is used by live_flow; keeps the import honest
