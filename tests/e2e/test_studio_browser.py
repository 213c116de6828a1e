"""The Studio in a real browser: Playwright driving Debian's Chromium (issue 14).

``steerflow studio --port 0`` and every flow are real subprocesses; the browser opens the
URL the studio printed, clicks the page's own buttons and reads what its script updates.
Waits are Playwright's bounded ``expect`` and ``tests/waiting.py``, never sleeps.

Chromium is ``$STEERFLOW_CHROMIUM`` or Debian's ``/usr/bin/chromium`` (``.ci/run`` installs
it when missing); Playwright's own browser download is never used. One browser serves the
module; each test gets a fresh context (no cookies) whose pages record every dialog and
every console error, and fail the test if a dialog opened or the CSP refused something.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from ctl_support import (
    clean_env,
    controls,
    ctl_status,
    live_flow,
    run_cli,
    state_db,
    steerflow_argv,
    wait_for,
    write_yaml,
)
from playwright import sync_api
from playwright.sync_api import Browser, BrowserContext, Page, expect

from steerflow.state import SessionRow

CHROMIUM = os.environ.get("STEERFLOW_CHROMIUM", "/usr/bin/chromium")
GATED_CLI = Path(__file__).resolve().with_name("gated_cli.py")
# Without the background-networking flags Chromium keeps dialling Google's hosts, which
# the closed network here refuses; --no-sandbox because CI runs as root.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LIVE_MS = 30_000  # bound on a live update under a loaded two-core machine
XSS = '<script>alert(1)</script><img src=x onerror=alert(2)><a href="javascript:alert(3)">go</a>'

expect.set_options(timeout=LIVE_MS)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium for the module (launch gives it a fresh user-data dir)."""
    # Fails rather than skips: .ci/run installs Debian's chromium when it is missing.
    assert os.access(CHROMIUM, os.X_OK), (
        f"no Chromium at {CHROMIUM}: apt-get install chromium, or set STEERFLOW_CHROMIUM"
    )
    with sync_api.sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Watched:
    """A browser context and what its pages reported."""

    context: BrowserContext
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def page(self) -> Page:
        page = self.context.new_page()

        def on_dialog(dialog: sync_api.Dialog) -> None:
            self.dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", on_dialog)
        page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        page.on(
            "console",
            lambda msg: self.errors.append(msg.text) if msg.type == "error" else None,
        )
        return page


@pytest.fixture
def watched(browser: Browser) -> Iterator[Watched]:
    """A fresh context; no dialog may open and no script error or CSP refusal occur."""
    context = browser.new_context()
    context.set_default_timeout(LIVE_MS)
    seen = Watched(context)
    try:
        yield seen
    finally:
        context.close()
    assert seen.dialogs == [], seen.dialogs
    # Refusals the tests provoke on purpose answer 401/403/409; anything else is a bug
    # (a CSP violation of the studio's own script, a script exception).
    # A page still polling when its test stopped the studio cannot connect: not a bug.
    expected = r"status of (401|403|409)|ERR_CONNECTION_REFUSED"
    unexpected = [e for e in seen.errors if not re.search(expected, e)]
    assert unexpected == [], unexpected


@dataclass
class Studio:
    url: str

    @property
    def base(self) -> str:
        return self.url.split("/?", 1)[0]


@contextmanager
def studio_process(home: Path) -> Iterator[Studio]:
    """``steerflow studio --port 0`` as a subprocess, and the URL (with token) it printed."""
    out = home.parent / "studio.out"
    with open(out, "w") as stdout, open(home.parent / "studio.err", "w") as stderr:
        proc = subprocess.Popen(
            steerflow_argv(home, "studio", "--port", "0"),
            stdout=stdout,
            stderr=stderr,
            env=clean_env(),
        )
    try:

        def announced() -> str | None:
            if proc.poll() is not None:
                err = (home.parent / "studio.err").read_text()
                raise AssertionError(f"studio exited {proc.returncode}: {err}")
            match = re.search(r"steerflow studio: (http://\S+)", out.read_text())
            return match.group(1) if match else None

        yield Studio(wait_for(announced, timeout=30, what="the studio's URL"))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _plan(tmp_path: Path, script: dict[str, object], *, chain: str = "abc") -> list[str]:
    """``a -> b -> c`` on the script model (whose file the test may rewrite later)."""
    plan: list[dict[str, object]] = []
    for i, key in enumerate(chain):
        entry: dict[str, object] = {"agent_id": key, "instruction": f"step {key}"}
        if i:
            entry["depends_on"] = [chain[i - 1]]
        plan.append(entry)
    write_yaml(tmp_path / "plan.yaml", {"name": "browser", "plan": plan})
    path = write_yaml(tmp_path / "script.yaml", script)
    return ["--plan", str(tmp_path / "plan.yaml"), "--model", f"script:{path}"]


def _session(home: Path, sid: str) -> SessionRow:
    with state_db(home) as db:
        row = db.get_session(sid)
    assert row is not None, sid
    return row


def _release(home: Path, key: str) -> None:
    (home / f"release-{key}").touch()


def _shot(page: Page, path: Path) -> None:
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _node(page: Page, key: str) -> sync_api.Locator:
    return page.locator(f'td[data-node-status="{key}"]')


def _mark_live(page: Page) -> None:
    """A marker a reload would wipe: a change seen with it still set arrived live."""
    page.evaluate("window.steerflowTest = 1")


def _still_live(page: Page) -> bool:
    return bool(page.evaluate("window.steerflowTest === 1"))


def _inert(page: Page) -> None:
    """Nothing a payload carried became an element or a link: it is text only."""
    assert page.locator("img").count() == 0
    assert page.locator("a[href^='javascript' i]").count() == 0
    scripts = page.locator("script")
    # Only the studio's own files (node-live.js: the live output of issue 31).
    own = {"/static/studio.js", "/static/node-live.js"}
    assert {scripts.nth(i).get_attribute("src") for i in range(scripts.count())} <= own


def test_live_run_page_pause_message_stop(tmp_path: Path, watched: Watched) -> None:
    home = tmp_path / "home"
    args = _plan(tmp_path, {}, chain="abcd")  # a graceful stop in c leaves d pending
    # a, b and c are each held (gated_cli.py) until the test has seen what it needs while
    # they run, however slow the machine: no node duration is guessed.
    home.mkdir(mode=0o700)
    for key in "abc":
        (home / f"gate-{key}").touch()
    argv = [sys.executable, str(GATED_CLI), "--home", str(home), "flow", *args, "--json"]
    message = "look at <img src=x onerror=alert(9)> first"
    with live_flow(home, args, argv=argv) as flow, studio_process(home) as s:
        sid, run = flow.session_id, flow.run_id
        page = watched.page()
        page.goto(s.url)
        # The token left the address bar for an HttpOnly, SameSite=Strict cookie.
        assert page.url == s.base + "/runs"
        port = s.base.rsplit(":", 1)[1]
        (cookie,) = watched.context.cookies(s.base)
        assert cookie["name"] == f"steerflow_studio_{port}"
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert page.evaluate("document.cookie") == ""  # out of any script's reach
        row = page.locator(f"tr#run-{run}")
        expect(row.locator(".status")).to_have_text("running")
        _shot(page, tmp_path / "runs.png")

        row.locator(f'a[href="/runs/{run}"]').first.click()  # its name, linked
        expect(page).to_have_url(s.base + f"/runs/{run}")
        expect(_node(page, "a")).to_have_text("running")
        _mark_live(page)
        # a finishes and b starts while the page stays loaded: the script's update.
        _release(home, "a")
        expect(_node(page, "a")).to_have_text("completed")
        expect(page.locator('g[data-node="a"]')).to_have_class(re.compile(r"status-completed"))
        expect(_node(page, "b")).to_have_text("running")
        assert _still_live(page)

        # Pause while b runs: it finishes, c is held at the gate.
        page.get_by_role("button", name="Pause").click()
        expect(page.locator("p.notice")).to_contain_text("queued control")
        wait_for(lambda: _session(home, sid).phase == "paused", what="the pause applied")
        _release(home, "b")
        expect(_node(page, "b")).to_have_text("completed")
        expect(_node(page, "c")).to_have_text("paused")
        expect(page.locator("#run-phase")).to_have_text("paused")
        assert ctl_status(home, sid)["phase"] == "paused"
        # The pause row's outcome shows once the flow stamped it.
        expect(page.locator("table").last).to_contain_text("applied")
        _shot(page, tmp_path / "run-paused.png")

        # Nothing pending on the page: it reloads itself for nothing now, so no reload
        # already on its way can wipe what is typed into it (decision 236).
        expect(page.locator("[data-control-pending]")).to_have_count(0)
        page.get_by_placeholder("message").fill(message)
        page.get_by_role("button", name="Send").click()
        expect(page.locator("p.notice")).to_contain_text("queued control")
        page.get_by_role("button", name="Resume").click()
        expect(page.locator("p.notice")).to_contain_text("queued control")
        expect(_node(page, "c")).to_have_text("running")

        def instruction() -> str | None:
            shown = run_cli(home, "show", run, "c", "--json")
            text = json.loads(shown.stdout).get("instruction") if shown.returncode == 0 else None
            return text if isinstance(text, str) and message in text else None

        assert "[OPERATOR STEER]" in wait_for(instruction, what="the message in c's instruction")
        node = watched.page()
        node.goto(s.base + f"/runs/{run}/nodes/c")
        expect(node.locator("mark.steer")).to_contain_text(message)
        _inert(node)
        _shot(node, tmp_path / "node.png")
        node.close()

        # Set cap confirms first too: the new cap against what the chain has spent.
        expect(page.locator("[data-control-pending]")).to_have_count(0)  # as for the message
        page.get_by_placeholder("max tokens").fill("1000000")
        page.get_by_role("button", name="Set cap…").click()
        expect(page.locator("h2")).to_contain_text("change the budget")
        expect(page.locator("#confirm-budget")).to_contain_text("1,000,000 tokens")
        expect(page.locator("#confirm-effect")).to_contain_text("more tokens")
        assert controls(home, sid)[-1].verb == "resume"  # nothing sent by the confirmation
        page.get_by_role("button", name="Set the new cap").click()
        expect(page.locator("p.notice")).to_contain_text("queued control")
        wait_for(lambda: controls(home, sid)[-1].result, what="the budget change stamped")
        # The history says who queued each control (decision 205).
        expect(page.locator("#history")).to_contain_text("budget")
        expect(page.locator("#history")).to_contain_text("; by studio:")

        page.get_by_role("button", name="Stop").click()  # a confirmation page first
        expect(page.locator("h2")).to_contain_text("stop run")
        page.get_by_role("button", name="Stop").click()
        expect(page).to_have_url(
            s.base + f"/runs/{run}?" + "queued=" + controls(home, sid)[-1].id + "&verb=stop"
        )
        wait_for(lambda: controls(home, sid)[-1].result == "applied", what="the stop applied in c")
        _release(home, "c")  # graceful: the in-flight c finishes, d never starts
        expect(page.locator("#run-status")).to_have_text("stopped")
        assert flow.finish() == 75
        # The end re-renders the page: controls gone, the recovery section there.
        expect(page.locator("#recovery")).to_be_visible()
        expect(page.get_by_role("button", name="Pause")).to_have_count(0)
        verbs = [c["verb"] for c in ctl_status(home, sid)["controls"]]
        assert verbs == ["pause", "message", "resume", "budget", "stop"]
        _inert(page)
        _shot(page, tmp_path / "run-stopped.png")


def test_a_sent_form_is_not_replaced_by_the_pages_own_reload(
    tmp_path: Path, watched: Watched
) -> None:
    """Issue 38 item 8: Pause's form was on its way (its POST answered, the redirect not yet
    followed) when the page's poll saw the control it queued and reloaded the page; the
    reload replaced the form's navigation and the "queued control" page never showed
    (3 of 6 runs under CPU load). The POST's answer is held here until the page has
    applied a poll answer counting that control: the page must not reload meanwhile."""
    home = tmp_path / "home"
    args = _plan(tmp_path, {}, chain="ab")
    home.mkdir(mode=0o700)
    (home / "gate-a").touch()
    argv = [sys.executable, str(GATED_CLI), "--home", str(home), "flow", *args, "--json"]
    with live_flow(home, args, argv=argv) as flow, studio_process(home) as s:
        page = watched.page()
        page.goto(s.url.replace("/?", f"/runs/{flow.run_id}?"))
        expect(_node(page, "a")).to_have_text("running")
        held: list[tuple[sync_api.Route, sync_api.APIResponse]] = []
        # The POST reaches the studio (the control is queued); its 303 waits here.
        page.route(
            re.compile(r"/sessions/[^/]+/control$"),
            lambda route: held.append((route, route.fetch(max_redirects=0))),
        )
        page.get_by_role("button", name="Pause").click(no_wait_after=True)

        def next_poll() -> sync_api.Request:
            # Bounded by Playwright's timeout; waiting is also what runs the route handler.
            with page.expect_request(lambda r: "/api/runs/" in r.url) as request:
                pass
            return request.value

        for _ in range(100):
            if held:
                break
            next_poll()
        # The first changed answer (200, not 304) after the control was queued counts it:
        # the insert moved the data_version its cache follows. The script applies an
        # answer before it asks again, so once the next poll went out, a reload that
        # answer called for is on its way.
        for _ in range(100):
            answer = next_poll().response()
            if answer is not None and answer.status == 200:
                break
        else:
            raise AssertionError("no changed poll answer after the pause was queued")
        next_poll()
        assert len(held) == 1
        route, response = held[0]
        assert response.status == 303
        route.fulfill(response=response)
        (pause,) = controls(home, flow.session_id)
        expect(page.locator("p.notice")).to_contain_text(f"queued control {pause.id}")
        expect(page).to_have_url(re.compile(rf"queued={pause.id}&verb=pause$"))
        _release(home, "a")
        wait_for(lambda: _session(home, flow.session_id).phase == "paused", what="paused")


def test_interrupted_run_preflight_resume_and_follow(tmp_path: Path, watched: Watched) -> None:
    home = tmp_path / "home"
    args = _plan(tmp_path, {"b": {"delay": 120.0}})
    with studio_process(home) as s:
        page = watched.page()
        with live_flow(home, args) as flow:
            run = flow.run_id
            flow.wait_nodes(lambda st: st.get("b") == "running", what="b running")
            page.goto(s.url.replace("/?", f"/runs/{run}?"))
            expect(page.locator("#run-status")).to_have_text("running")
            # A 304: the studio's cached answer is current, and the kill commits nothing.
            with page.expect_response(lambda r: "/api/runs/" in r.url and r.status == 304):
                pass
            flow.proc.kill()  # SIGKILL mid-node: no goodbye, nothing committed
            flow.proc.wait(timeout=30)
        # The open page learns it although no row changed (the owner is dead).
        expect(page.locator("#run-status")).to_have_text("interrupted")
        write_yaml(tmp_path / "script.yaml", {})  # the resumed b answers at once
        recovery = page.locator("#recovery")
        expect(recovery.locator("#preflight-verdict")).to_have_text(
            "would replay 1: a; would run 2: b, c"
        )
        dry = json.loads(run_cli(home, "resume", run, "--dry-run", "--json").stdout)
        assert [n["status"] for n in dry["nodes"]] == ["completed", "pending", "pending"]
        # b's call had left when the flow was killed: it may have been paid (decision 217).
        assert [c["node"] for c in dry["in_flight_calls"]] == ["b"]
        expect(recovery.locator("#in-flight-calls")).to_contain_text("b")
        expect(recovery.locator("#in-flight-line")).to_contain_text(
            "1 call was in flight when the run died and may have been paid"
        )
        _shot(page, tmp_path / "recovery.png")

        recovery.get_by_role("link", name="Resume…").click()  # the confirmation first
        expect(page.locator("#confirm-runs")).to_contain_text("b, c")
        expect(page.locator("#in-flight-calls")).to_contain_text("b")  # said before Start
        page.get_by_role("button", name="Start resume").click()
        started = page.locator("p.notice").filter(has_text="steerflow resume started")
        expect(started).to_be_visible()
        # The page reloads itself when the new run appears, with the link to it.
        link = page.locator("#run-resumes a")
        expect(link).to_have_count(1)
        new_run = link.inner_text()
        assert new_run != run
        link.click()
        expect(page).to_have_url(s.base + f"/runs/{new_run}")
        expect(page.locator("#run-status")).to_have_text("completed")
        for key in "abc":
            expect(_node(page, key)).to_have_text("completed")
        expect(page.locator("#run-resumes a")).to_have_text(run)  # resumed from
        _shot(page, tmp_path / "resumed.png")


def test_xss_in_responses_errors_and_paths_stays_inert(tmp_path: Path, watched: Watched) -> None:
    home = tmp_path / "home"
    evil = tmp_path / "<img src=x onerror=alert(5)>"  # the model spec shows this path
    evil.mkdir()
    plan_args = _plan(evil, {"a": {"response": XSS}, "b": {"fail": XSS}}, chain="ab")
    failed = run_cli(home, "flow", *plan_args, "--json")
    assert failed.returncode == 1, failed.stderr
    run = json.loads(failed.stdout)["run_id"]
    with studio_process(home) as s:
        page = watched.page()
        page.goto(s.url)
        expect(page.locator(f"tr#run-{run} .status")).to_have_text("failed")
        expect(page.locator(f"tr#run-{run}")).to_contain_text("<img src=x onerror=alert(5)>")
        _inert(page)
        page.goto(s.base + f"/runs/{run}")
        expect(_node(page, "b")).to_have_text("failed")
        expect(page.locator("#recovery")).to_be_visible()
        _inert(page)
        for key, shown in (("a", "pre.response"), ("b", "pre")):
            page.goto(s.base + f"/runs/{run}/nodes/{key}")
            expect(page.locator(shown).last).to_contain_text("<script>alert(1)</script>")
            _inert(page)
            _shot(page, tmp_path / f"node-{key}.png")


def test_requests_without_token_or_csrf_are_refused(tmp_path: Path, watched: Watched) -> None:
    home = tmp_path / "home"
    # A deadline inside a's call: b and c are left for a resume (a Recovery form).
    args = _plan(tmp_path, {"a": {"delay": 1.0}})
    timed_out = run_cli(home, "flow", *args, "--timeout", "0.5", "--json")
    assert timed_out.returncode == 124, timed_out.stderr
    run = json.loads(timed_out.stdout)["run_id"]
    with studio_process(home) as s:
        page = watched.page()
        for url in (s.base + f"/runs/{run}", s.base + "/?token=" + "x" * 43):
            response = page.goto(url)
            assert response is not None and response.status == 401, url
            expect(page.locator("body")).to_contain_text("open the URL printed")
        assert watched.context.cookies(s.base) == []

        page.goto(s.url.replace("/?", f"/runs/{run}/resume?mode=resume&"))
        form = page.locator("form")
        csrf = form.locator("input[name=csrf]").get_attribute("value")
        assert csrf and re.fullmatch(r"[0-9a-f]{64}", csrf)
        # A tampered CSRF field: the studio refuses and starts nothing.
        form.locator("input[name=csrf]").evaluate("el => { el.value = '0'.repeat(64); }")
        with page.expect_response(re.compile(r"/resume$")) as refused:
            form.get_by_role("button", name="Start resume").click()
        assert refused.value.status == 403
        expect(page.locator("p.error")).to_contain_text("missing or wrong CSRF token")
        _shot(page, tmp_path / "refused.png")

        # Another site's form, with the right CSRF token: the Strict cookie stays home.
        other = watched.page()
        other.set_content(
            f'<form method="post" action="{s.base}/runs/{run}/resume">'
            f'<input type="hidden" name="csrf" value="{csrf}"><button>go</button></form>'
        )
        with other.expect_response(re.compile(r"/resume$")) as cross:
            other.get_by_role("button", name="go").click()
        assert cross.value.status == 401
        assert not (home / "studio").exists()  # no resume was ever started


def test_a_tool_nodes_steps_are_a_timeline_and_their_text_stays_inert(
    tmp_path: Path, watched: Watched
) -> None:
    """Issue 39 item 6: the node page lists each step of the loop, in order, with a bar on
    the node's time axis; a tool's arguments and result are text, never markup."""
    home = tmp_path / "home"
    steps = [
        {"tool_calls": [{"name": "post", "args": {"message": XSS}}]},
        {"tool_calls": [{"name": "post", "args": {"message": "two"}}]},
        {"response": "posted both"},
    ]
    script = write_yaml(tmp_path / "s.yaml", {"a": {"steps": steps}})
    entry = {"agent_id": "a", "instruction": "tell the team", "tools": ["python:tool_fns:post"]}
    plan = write_yaml(tmp_path / "p.yaml", {"plan": [entry]})
    tests_dir = str(Path(__file__).resolve().parent.parent)
    env = {"TOOL_LEDGER": str(tmp_path / "ledger.jsonl"), "PYTHONPATH": tests_dir}
    done = run_cli(home, "flow", "--plan", str(plan), "--model", f"script:{script}",
                   "--allow-python", "--json", env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)["run_id"]
    with studio_process(home) as s:
        page = watched.page()
        page.goto(s.url)  # the token becomes the session cookie
        page.goto(s.base + f"/runs/{run}/nodes/a")
        rows = page.locator("ol.steps > li.step")
        expect(rows).to_have_count(5)
        kinds = [rows.nth(i).get_attribute("class") for i in range(5)]
        assert kinds == [f"step step-{k}" for k in ("model", "tool", "model", "tool", "model")]
        assert [rows.nth(i).get_attribute("data-index") for i in range(5)] == list("12345")
        expect(rows.nth(1)).to_contain_text("post")
        expect(rows.nth(1)).to_contain_text("<script>alert(1)</script>")
        expect(rows.nth(3)).to_contain_text("posted #2")
        expect(rows.nth(4)).to_contain_text("posted both")
        expect(page.locator("ol.steps svg.step-bar rect")).to_have_count(5)
        _inert(page)
        _shot(page, tmp_path / "steps.png")
