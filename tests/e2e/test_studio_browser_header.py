"""Studio 3 (issue 42 items 1 and 2) in a real browser: the run header tells the truth.

One module-scoped fixture builds every run once: a flow SIGKILLed while ``b`` is in
flight, resumed well after the kill (so a "duration to the resume" shows), and a run
whose failed node an escalation retry completed. One Chromium for the module; each test
loads a page and checks several things on it. Waits are bounded (``expect``,
``wait_for``); the wait past the kill is on the clock itself, not a sleep.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import test_studio_browser as shared
from ctl_support import (
    clean_env,
    live_flow,
    run_cli,
    state_db,
    steerflow_argv,
    wait_for,
    write_yaml,
)
from playwright.sync_api import Page, expect
from test_studio_browser import LIVE_MS, Studio, Watched, _shot, studio_process

# The module fixture (its runs and Studio) is built once, on one worker, not once per worker
# that gets one of its tests (about 9 s of processes each time).
pytestmark = pytest.mark.xdist_group("studio_header")

browser = shared.browser
watched = shared.watched

expect.set_options(timeout=LIVE_MS)

#: How long after the kill the resume starts: a duration "to the resume" is this longer.
GAP_S = 1.5


@dataclass
class Runs:
    studio: Studio
    home: Path
    crashed: str
    killed_at: float
    resumed: str
    escalated: str
    big: str


#: b of the escalated run streams colour codes (one split across two chunks): stripped.
COLOURED = ["\x1b[1;31mred\x1b[0m and ", "\x1b[3", "2mgreen\x1b[0m\n", "\x1b]0;title\x07done\n"]


def _escalated_plan(tmp: Path) -> list[str]:
    """``a`` fails at its base model and its escalation retry ``a.esc1`` completes it."""
    base, ladder = tmp / "m0.yaml", tmp / "m1.yaml"
    write_yaml(base, {"a": {"fail": "base model failed"}})
    write_yaml(ladder, {"b": {"stream": COLOURED, "response": "from m1"},
                        "*": {"response": "answer from m1"}})  # fmt: skip
    plan = write_yaml(
        tmp / "esc.yaml",
        {
            "name": "escalated",
            "roles": {"worker": {"model": f"script:{base}", "escalation": [f"script:{ladder}"]}},
            "plan": [
                {"agent_id": "a", "assignee": "worker", "instruction": "do a"},
                {"agent_id": "b", "instruction": "use a", "depends_on": ["a"]},
            ],
        },
    )
    return ["flow", "--plan", str(plan), "--model", f"script:{ladder}", "--json"]


#: A run past the fold (50 rows) and wider than a row of components: 12 chains of 5.
BIG_NODES, BIG_LAYERS = 60, 5


def _big_plan(tmp: Path) -> list[str]:
    width = BIG_NODES // BIG_LAYERS
    plan = [
        {"agent_id": f"n{i:05d}", "instruction": f"step {i}",
         **({"depends_on": [f"n{i - width:05d}"]} if i >= width else {})}
        for i in range(BIG_NODES)
    ]  # fmt: skip
    path = write_yaml(tmp / "big.yaml", {"name": "big", "plan": plan})
    return ["flow", "--plan", str(path), "--model", "echo", "--concurrency", "32", "--json"]


def _started(home: Path, args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        steerflow_argv(home, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=clean_env(),
    )  # fmt: skip


def _run_id(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return str(json.loads(out)["run_id"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    tmp = tmp_path_factory.mktemp("header")
    home = tmp / "home"
    home.mkdir(mode=0o700)
    plan = [
        {"agent_id": "a", "instruction": "step a"},
        {"agent_id": "b", "instruction": "step b", "depends_on": ["a"]},
        {"agent_id": "c", "instruction": "step c", "depends_on": ["b"]},
    ]
    write_yaml(tmp / "plan.yaml", {"name": "nightly import", "plan": plan})
    # a takes half a second, so its checkpoint save is well after the base file was written.
    script = write_yaml(tmp / "script.yaml", {"a": {"delay": 0.5}, "b": {"delay": 120.0}})
    args = ["--plan", str(tmp / "plan.yaml"), "--model", f"script:{script}"]
    with live_flow(home, args) as flow:
        crashed = flow.run_id
        # The two finished runs go alongside the crashed one (separate runs of one home),
        # started once live_flow has picked its session (it takes the newest running one).
        side = [_started(home, _escalated_plan(tmp)), _started(home, _big_plan(tmp))]
        flow.wait_nodes(lambda st: st.get("b") == "running", what="b running", timeout=60)
        killed_at = time.time()
        flow.proc.kill()  # SIGKILL mid-node: no goodbye, no finish recorded
        flow.proc.wait(timeout=30)
    escalated, big = (_run_id(p) for p in side)
    wait_for(lambda: time.time() > killed_at + GAP_S, timeout=30, what="the gap after the kill")
    write_yaml(script, {})  # the resumed b and c answer at once
    again = run_cli(home, "resume", crashed, "--json")
    assert again.returncode == 0, again.stderr
    resumed = str(json.loads(again.stdout)["run_id"])
    with studio_process(home) as s:
        yield Runs(s, home, crashed, killed_at, resumed, escalated, big)


def _open(page: Page, runs: Runs, path: str) -> None:
    page.goto(runs.studio.url.replace("/?", f"{path}?"))


def _seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)s", text.strip())
    assert match, text
    return float(match.group(1))


def _history_index(page: Page, what: str, node: str | None = None) -> int:
    rows = page.locator("#history tbody tr").all_text_contents()
    hits = [i for i, r in enumerate(rows) if what in r and (node is None or node in r)]
    assert hits, (what, rows)
    return hits[0]


def test_crashed_run_duration_on_the_runs_list_stops_at_its_last_event(
    runs: Runs, watched: Watched
) -> None:
    """Item 1: killed at T, resumed T + GAP_S later: the list says T, not T + GAP_S."""
    page = watched.page()
    page.set_viewport_size({"width": 1280, "height": 900})
    _open(page, runs, "/runs")
    row = page.locator(f"tr#run-{runs.crashed}")
    listed = _seconds(row.locator('[data-field="duration"]').inner_text())
    with state_db(runs.home) as db:
        (session,) = [r for r in db.list_sessions(limit=None) if r.run_id == runs.crashed]
    assert listed <= runs.killed_at - session.created_at + 0.3, (listed, runs.killed_at)
    # b was in flight when the run died: not "running" on the list either.
    progress = row.locator('[data-field="progress"]')
    expect(progress).to_contain_text("1 interrupted")
    expect(progress).not_to_contain_text("running")


def test_crashed_run_page_timeline_graph_and_last_save(runs: Runs, watched: Watched) -> None:
    """Item 1: the timeline stops; b reads one word; the last save is the journal's."""
    page = watched.page()
    _open(page, runs, f"/runs/{runs.crashed}")
    axis = _seconds(page.locator("#timeline-end").text_content() or "")
    first_start = float(page.locator('rect[data-bar="a"]').get_attribute("data-start") or 0)
    assert axis <= runs.killed_at - first_start + 0.3, (axis, runs.killed_at - first_start)
    expect(page.locator('td[data-node-status="b"]')).to_have_text("interrupted")
    expect(page.locator('svg.dag g[data-node="b"]')).to_have_class(
        re.compile(r"\bstatus-interrupted\b")
    )
    # a took half a second: its save (the journal) comes after its start, not before.
    assert _history_index(page, "checkpoint saved") > _history_index(page, "node started", "a")
    # Reloaded later, the axis has not grown.
    page.reload()
    assert _seconds(page.locator("#timeline-end").text_content() or "") == axis


def test_escalation_recovered_run_has_no_failure_box_and_spend_is_not_reported(
    runs: Runs, watched: Watched
) -> None:
    """Item 1: a failed attempt an escalation retry completed is not a failure; no
    "0 in / 0 out tokens" where no call reported any. Item 6: no colour codes shown."""
    page = watched.page()
    _open(page, runs, f"/runs/{runs.escalated}")
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator("#failures")).to_have_count(0)
    expect(page.locator("#recovered")).to_contain_text("a.esc1")
    assert "0 in / 0 out" not in page.content()
    _open(page, runs, f"/runs/{runs.escalated}/nodes/b")
    expect(page.locator("dl.facts")).to_contain_text("not reported")
    # Item 6: the colour codes b streamed are stripped, never shown as boxes.
    expect(page.locator("#live-kept-text")).to_have_text("red and green\ndone\n")
    assert "\x1b" not in page.content()


def test_run_header_name_times_reason_chain_and_result(runs: Runs, watched: Watched) -> None:
    """Item 2: the header of the crashed run and of its resume."""
    page = watched.page()
    page.set_viewport_size({"width": 1280, "height": 900})
    _open(page, runs, f"/runs/{runs.crashed}")
    expect(page.locator("#run-name")).to_contain_text("nightly import")
    assert "nightly import" in page.title()
    expect(page.locator("#run-status")).to_have_text("interrupted")
    expect(page.locator("#run-reason")).to_contain_text("killed or crashed")
    # Its end is its last recorded event: before the kill, never the resume's time.
    end = float(page.locator("#run-end").get_attribute("data-at") or 0)
    assert runs.killed_at - 35 < end <= runs.killed_at + 0.3, (end, runs.killed_at)
    shown = _seconds(page.locator("#run-duration").inner_text())
    exact = float(page.locator("#run-duration").get_attribute("data-s") or 0)
    assert 0.4 < exact < 35 and abs(shown - exact) < 0.1
    axis = _seconds(page.locator("#timeline-end").text_content() or "")
    assert axis <= exact + 0.1, (axis, exact)
    expect(page.locator("#run-chain a.run-next")).to_have_text(runs.resumed)
    expect(page.locator("#run-spend")).to_have_text("not reported")

    _open(page, runs, f"/runs/{runs.resumed}")
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator("#run-previous")).to_have_text(runs.crashed)
    expect(page.locator("#run-result")).to_contain_text("c")
    expect(page.locator("#run-end")).to_have_count(1)
    expect(page.locator("#run-reason")).to_have_count(0)


def test_runs_list_controls_fit_1280_and_the_search_box_survives_the_reload(
    runs: Runs, watched: Watched
) -> None:
    """Item 6: Pause and Stop in view at 1280 px; a typed search is not wiped by a reload."""
    with state_db(runs.home) as db:  # a running run of this (live) process
        live = db.create_session(kind="flow", run_id="20260102T000000-0000aa", phase="executing",
                                 name="a long running run name " * 3)  # fmt: skip
    page = watched.page()
    page.set_viewport_size({"width": 1280, "height": 900})
    _open(page, runs, "/runs")
    row = page.locator(f'tr[data-run="{live.id}"]')
    expect(row.get_by_role("button", name="Pause")).to_be_visible()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 1280, width
    for name in ("Pause", "Resume"):
        box = row.get_by_role("button", name=name).bounding_box()
        assert box is not None and box["x"] + box["width"] <= 1280, (name, box)
    stop = row.get_by_role("link", name="Stop…").bounding_box()
    assert stop is not None and stop["x"] + stop["width"] <= 1280, stop
    # Typed, not sent, then the operator looks elsewhere: a new run arrives meanwhile.
    search = page.locator('input[name="q"]')
    search.fill("nightly")
    page.locator("h1").click()
    page.evaluate("window.steerflowTest = 1")
    with (
        page.expect_response(lambda r: "/api/runs" in r.url and r.status == 200),
        state_db(runs.home) as db,
    ):
        db.create_session(kind="flow", run_id="20260102T000000-0000bb", phase="executing")
    with page.expect_request(lambda r: "/api/runs" in r.url):  # the answer was applied
        pass
    assert page.evaluate("window.steerflowTest === 1")  # no reload
    expect(search).to_have_value("nightly")


def test_event_log_filtered_to_one_node(runs: Runs, watched: Watched) -> None:
    """Item 4: from the run page to its log, filtered to b with the form (no script)."""
    page = watched.page()
    _open(page, runs, f"/runs/{runs.crashed}")
    page.locator("#events-link").click()
    page.locator('select[name="node"]').select_option("b")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"/events\?node=b"))
    rows = page.locator("#events tbody tr")
    expect(rows).to_have_count(2)
    assert rows.evaluate_all("rs => rs.map(r => r.getAttribute('data-node'))") == ["b", "b"]
    expect(rows.nth(1)).to_contain_text("node interrupted")
    _shot(page, runs.home.parent / "events-b.png")


def test_large_run_fits_folds_and_finds_a_node(runs: Runs, watched: Watched) -> None:
    """Item 3: a run past 50 nodes: fit to the page, the rest folded, find by id."""
    page = watched.page()
    page.set_viewport_size({"width": 1280, "height": 900})
    _open(page, runs, f"/runs/{runs.big}")
    dag = page.locator("svg.dag")
    expect(dag).to_have_attribute("data-zoom", "fit")  # the default past 50 nodes
    box = dag.bounding_box()
    assert box is not None and box["width"] <= 1280, box
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    # The drawing wraps its 12 chains into rows instead of one 2,300 px wide band.
    view_w = float((dag.get_attribute("viewBox") or "0 0 0 0").split()[2])
    assert view_w <= 1700, view_w
    expect(page.locator("svg.timeline").first.locator("rect[data-bar]")).to_have_count(50)
    expect(page.locator("#timeline-more")).not_to_have_attribute("open", "")
    expect(page.locator("#nodes-more summary")).to_have_text(f"{BIG_NODES - 50} more nodes")
    height = page.evaluate("document.documentElement.scrollHeight")
    page.locator('nav.graph-tools a[data-zoom="100"]').click()
    expect(page.locator("svg.dag")).to_have_attribute("data-zoom", "100")
    # Find by id: the page comes back scrolled to the node, marked.
    page.locator('#find-node input[name="find"]').fill("n00047")
    page.locator("#find-node").get_by_role("button", name="Find").click()
    expect(page).to_have_url(re.compile(r"found=n00047.*#dag-n00047$"))
    found = page.locator('svg.dag g[data-node="n00047"]')
    expect(found).to_have_class(re.compile(r"\bfound\b"))
    expect(found).to_be_in_viewport()
    _shot(page, runs.home.parent / "big-found.png")
    assert height < 6000, height  # 120 rows of everything were well past that
