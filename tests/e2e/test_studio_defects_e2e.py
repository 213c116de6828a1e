"""Studio and view defects of issue 32, over real HTTP and a real state DB.

The sessions are real rows (``StateDB``); a dead owner is a process this test started
and reaped, so ``effective_status`` judges the run ``interrupted`` as it would a
crashed flow. Where a moment in the past is needed (a run killed 30 s after it began),
the row's clock columns are moved back with SQL on the real file: nothing is mocked.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
from ctl_support import clean_env, steerflow_argv, wait_for
from test_studio_e2e import Studio, studio

from steerflow import views
from steerflow.state import NodeUpdate, Owner, StateDB, this_host

RUN = "20260101T000000-abcdef"


def _dead_owner() -> Owner:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return Owner(this_host(), proc.pid, None)


def _age(home: Path, session_id: str, seconds: float) -> None:
    """Move the session's start (and its only heartbeat) ``seconds`` into the past."""
    with sqlite3.connect(home / "state.db") as conn:
        conn.execute(
            "UPDATE sessions SET created_at = created_at - ?, heartbeat_at = heartbeat_at - ?,"
            " updated_at = updated_at - ? WHERE id = ?",
            (seconds, seconds, seconds, session_id),
        )


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "runs" / RUN).mkdir(parents=True)  # the run page reads its directory
    return home


def test_killed_run_keeps_its_duration_and_its_in_flight_node_stops_growing(
    tmp_path: Path,
) -> None:
    home = _home(tmp_path)
    with StateDB.open(home) as db:
        row = db.create_session(kind="flow", run_id=RUN, owner=_dead_owner(), phase="executing")
        started = time.time() - 20
        db.upsert_nodes(
            row.id,
            [
                NodeUpdate("a", "planned", "completed", detail={"model": "m1",
                           "started_at": started, "ended_at": started + 1}),
                NodeUpdate("b", "planned", "running", detail={"model": "m1",
                           "started_at": started + 1}),
            ],
        )  # fmt: skip
    # It began 30 s ago and never beat again: the last publication is its sign of life.
    _age(home, row.id, 30)
    (listed,) = views.list_runs(home)
    assert listed.status == "interrupted"
    assert listed.duration_s is not None and 25 < listed.duration_s < 60
    shown = views.show_run(home, RUN)
    b = shown.node("b")
    assert b is not None and b.status == "interrupted"
    first = b.duration_s
    assert first is not None and 15 < first < 40

    def settled() -> bool:  # it does not grow: the node died with its run
        again = views.show_run(home, RUN).node("b")
        return again is not None and again.duration_s == first and time.time() > started + 22

    wait_for(settled, timeout=30, what="a second read of the dead node")


def test_runs_page_model_of_a_resumed_run_and_no_phase_once_finished(tmp_path: Path) -> None:
    home = _home(tmp_path)
    with StateDB.open(home) as db:
        done = db.create_session(kind="flow", run_id="20260101T000000-000001", phase="executing")
        db.set_session_status(done.id, "completed")
        resumed = db.create_session(kind="flow", run_id=RUN, phase="executing")
        db.upsert_nodes(
            resumed.id,
            [
                NodeUpdate("a", "planned", "completed", detail={"replayed": True}),
                NodeUpdate("b", "planned", "running", detail={"model": "model-b"}),
            ],
        )
    with studio(home) as s, s.client() as client:
        page = client.get("/runs").text
        done_row = _row(page, done.id)
        assert 'data-field="phase">-</td>' in done_row  # not "executing"
        assert '<td class="model">model-b</td>' in _row(page, resumed.id)
        live = {r["session_id"]: r for r in client.get("/api/runs").json()["runs"]}
        assert live[done.id]["phase"] == "-"
        assert live[resumed.id]["phase"] == "executing"


def _row(page: str, session_id: str) -> str:
    match = re.search(rf'<tr [^>]*data-run="{session_id}".*?</tr>', page, re.S)
    assert match, page
    return match.group(0)


def test_control_log_in_words_with_bidi_controls_named(tmp_path: Path) -> None:
    home = _home(tmp_path)
    with StateDB.open(home) as db:
        row = db.create_session(kind="flow", run_id=RUN, phase="executing")
        stop = db.insert_control(
            session_id=row.id, verb="stop", payload={"now": False, "reason": "evil\u202etxt"}
        )
        msg = db.insert_control(session_id=row.id, verb="message", payload={"text": "hello"})
        db.claim_control(msg.id, "host1:4242:flow-executor:abc")
        db.finalize_control(stop.id, "rejected:no-pending-ops")
    with studio(home) as s, s.client() as client:
        page = client.get(f"/runs/{RUN}").text
        log = page[page.index('id="control-log"') :]
        assert "now: False" not in log and "reason: None" not in log
        assert "stop when idle; reason: evil&lt;U+202E&gt;txt" in log
        assert "\u202e" not in page
        assert "applying:" not in log and "being applied by the flow on host1 (pid 4242)" in log
        assert "rejected: no pending ops" in log
        assert 'data-count="2"' in log
        assert client.get(f"/api/runs/{RUN}").json()["control_count"] == 2


def test_unreadable_state_db_is_a_clean_error_page_and_json(tmp_path: Path) -> None:
    home = _home(tmp_path)
    (home / "state.db").write_bytes(bytes(range(256)) * 16)
    out, err = tmp_path / "studio.out", tmp_path / "studio.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(
            steerflow_argv(home, "studio", "--port", "0"),
            stdout=stdout,
            stderr=stderr,
            env=clean_env(),
        )
    try:

        def announced() -> str | None:
            assert proc.poll() is None, err.read_text()
            match = re.search(r"steerflow studio: (http://\S+)", out.read_text())
            return match.group(1) if match else None

        s = Studio(wait_for(announced, timeout=30, what="the studio's URL"))
        with httpx.Client(base_url=s.base, timeout=30) as client:
            client.get(s.url.removeprefix(s.base))
            page = client.get("/runs")
            assert page.status_code == 503
            assert "state database error" in page.text and "<html" in page.text
            poll = client.get("/api/runs")
            assert poll.status_code == 503
            assert "state database error" in poll.json()["error"]
            assert client.get(f"/api/runs/{RUN}").status_code == 503
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "Traceback" not in err.read_text()


def test_retry_failed_confirms_then_a_second_start_says_it_already_runs(tmp_path: Path) -> None:
    import json
    import os
    import signal

    from ctl_support import run_cli, write_yaml

    home = tmp_path / "home"
    plan = [{"agent_id": "a", "instruction": "one"},
            {"agent_id": "b", "instruction": "two", "depends_on": ["a"]}]  # fmt: skip
    write_yaml(tmp_path / "plan.yaml", {"name": "actions", "plan": plan})
    script = write_yaml(tmp_path / "script.yaml", {"b": {"fail": "boom"}})
    args = ["--plan", str(tmp_path / "plan.yaml"), "--model", f"script:{script}", "--json"]
    failed = run_cli(home, "flow", *args)
    assert failed.returncode == 1, failed.stderr
    run = json.loads(failed.stdout)["run_id"]
    write_yaml(script, {"b": {"delay": 60}})  # the retried b holds the resume running
    with studio(home) as s, s.client() as client:
        plain = client.get(f"/runs/{run}/resume", params={"mode": "resume"}).text
        assert "preflight-refusal" in plain  # a plain resume refuses a failed node
        confirm = client.get(f"/runs/{run}/resume", params={"mode": "retry_failed"}).text
        assert "steerflow resume " + run + " --retry-failed" in confirm
        assert re.search(r'id="confirm-runs".*?b</p>', confirm)
        assert re.search(r'id="confirm-repaid".*?b</p>', confirm)  # b ran, b pays again
        csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', confirm)
        assert csrf
        form = {"csrf": csrf.group(1), "mode": "retry_failed"}
        first = client.post(f"/runs/{run}/resume", data=form)
        assert first.status_code == 303, first.text
        pid = int(first.headers["location"].rsplit("=", 1)[1])
        try:
            again = client.post(f"/runs/{run}/resume", data=form)
            assert again.status_code == 409
            assert f"already running (pid {pid}" in again.text and "started" in again.text
            shown = client.get(f"/runs/{run}/resume", params={"mode": "retry_failed"}).text
            assert 'id="already-running"' in shown and "Start retry failed" not in shown
        finally:
            os.kill(pid, signal.SIGTERM)  # the resume this test started


def test_stop_confirms_with_now_and_a_reason_and_is_not_queued_twice(tmp_path: Path) -> None:
    home = _home(tmp_path)
    with StateDB.open(home) as db:
        row = db.create_session(kind="flow", run_id=RUN, phase="executing")
        db.upsert_nodes(row.id, [NodeUpdate("a", "planned", "running",
                                            detail={"started_at": time.time()})])  # fmt: skip
    with studio(home) as s, s.client() as client:
        confirm = client.get(f"/runs/{RUN}/stop", params={"now": "1", "reason": "wrong data"})
        assert "cancels the calls in flight: a (" in confirm.text
        assert "a resume runs them again" in confirm.text
        csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', confirm.text)
        assert csrf and 'name="now" value="1"' in confirm.text
        sent = client.post(
            f"/sessions/{row.id}/control",
            data={"csrf": csrf.group(1), "verb": "stop", "now": "1", "reason": "wrong data",
                  "back": f"/runs/{RUN}"},
        )  # fmt: skip
        assert sent.status_code == 303
        with StateDB.open(home, create=False) as db:
            (stop,) = db.list_controls(row.id)
        assert stop.payload == {"now": True, "reason": "wrong data"}
        again = client.get(f"/runs/{RUN}/stop").text
        assert f"a stop is already queued (control {stop.id}" in again
        assert "<button>Stop" not in again
        # A second click on the confirmed form: told what is queued, nothing sent twice.
        twice = client.post(
            f"/sessions/{row.id}/control",
            data={"csrf": csrf.group(1), "verb": "stop", "back": f"/runs/{RUN}"},
        )
        assert twice.status_code == 409 and f"(control {stop.id} by studio:" in twice.text
        with StateDB.open(home, create=False) as db:
            assert len(db.list_controls(row.id)) == 1


def test_budget_change_confirms_against_the_spend_and_is_not_queued_twice(
    tmp_path: Path,
) -> None:
    home = _home(tmp_path)
    spent = {"input_tokens": 1000, "output_tokens": 200, "cost_usd": 0.25}
    with StateDB.open(home) as db:
        row = db.create_session(kind="flow", run_id=RUN, phase="executing")
        db.update_node_metadata(row.id, {"budget": {"max_cost": 1.0, "max_tokens": None}})
        db.upsert_nodes(row.id, [NodeUpdate("a", "planned", "completed", detail=spent)])
    with studio(home) as s, s.client() as client:
        run_page = client.get(f"/runs/{RUN}").text
        # Set cap is a GET to the confirmation, not a POST that acts at once.
        assert f'method="get" action="/runs/{RUN}/budget"' in run_page
        assert 'name="verb" value="budget"' not in run_page

        raised = client.get(f"/runs/{RUN}/budget", params={"max_cost": "0.5"})
        assert raised.status_code == 200
        table = raised.text.split('id="confirm-budget"', 1)[1].split("</table>", 1)[0]
        assert "<th>in force</th><td>$1.0000</td><td>none</td>" in table
        assert "<th>new</th><td>$0.5000</td><td>none</td>" in table
        assert "<th>spent</th><td>$0.2500</td><td>1,200 tokens</td>" in table
        assert "the run may spend $0.2500 more" in raised.text
        assert "budget_exhausted" not in raised.text.split('id="confirm-effect"', 1)[1]

        below = client.get(f"/runs/{RUN}/budget", params={"max_tokens": "1200"}).text
        assert "at or below what the chain has spent" in below
        assert "<code>budget_exhausted</code> (exit 76" in below
        tokens_room = client.get(f"/runs/{RUN}/budget", params={"max_tokens": "5000"}).text
        assert "the run may spend 3,800 more tokens" in tokens_room
        for bad in ({"max_cost": "lots"}, {"max_cost": "0"}, {}, {"max_tokens": "1.5"}):
            refused = client.get(f"/runs/{RUN}/budget", params=bad)
            assert refused.status_code == 400, bad
        assert client.get(f"/runs/{RUN}/budget", params={"max_cost": "<b>"}).status_code == 400

        csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', raised.text)
        assert csrf and 'name="max_cost" value="0.5"' in raised.text
        form = {"csrf": csrf.group(1), "verb": "budget", "max_cost": "0.5", "max_tokens": "",
                "back": f"/runs/{RUN}"}  # fmt: skip
        sent = client.post(f"/sessions/{row.id}/control", data=form)
        assert sent.status_code == 303, sent.text
        with StateDB.open(home, create=False) as db:
            (cap,) = db.list_controls(row.id)
        assert cap.payload == {"max_cost": 0.5, "max_tokens": None}
        assert (cap.sender or "").startswith("studio:")

        twice = client.post(f"/sessions/{row.id}/control", data=form)
        assert twice.status_code == 409
        assert f"a budget change is already queued (control {cap.id} by studio:" in twice.text
        shown = client.get(f"/runs/{RUN}/budget", params={"max_cost": "0.5"}).text
        assert 'id="already-queued"' in shown and "Set the new cap" not in shown
        with StateDB.open(home, create=False) as db:
            assert len(db.list_controls(row.id)) == 1
            db.finalize_control(cap.id, "applied")  # the flow applied it: a new one may go
        assert client.post(f"/sessions/{row.id}/control", data=form).status_code == 303

        with StateDB.open(home) as db:
            db.set_session_status(row.id, "completed")
        done = client.get(f"/runs/{RUN}/budget", params={"max_cost": "2"}).text
        assert "the run is completed: no flow would apply a new cap" in done
        assert "Set the new cap" not in done


def test_runs_page_shows_what_each_finished_run_spent(tmp_path: Path) -> None:
    """Issue 32 item 2: tokens and cost per run, from the usage the run stored at its end."""
    home = _home(tmp_path)
    with StateDB.open(home) as db:
        paid = db.create_session(kind="flow", run_id=RUN, phase="executing")
        db.update_node_metadata(
            paid.id, {"usage": {"input_tokens": 1200, "output_tokens": 34, "cost_usd": 0.0123}}
        )
        db.set_session_status(paid.id, "completed")
        free = db.create_session(kind="flow", run_id="20260101T000000-000001")
        db.set_session_status(free.id, "completed")
    with studio(home) as s, s.client() as client:
        page = client.get("/runs").text
        assert "<th>spent</th>" in page
        assert "1,234 tok $0.0123</td>" in _row(page, paid.id)
        assert '<td class="num nowrap">-</td>' in _row(page, free.id)
        run_page = client.get(f"/runs/{RUN}").text
        # The header: cost first, then tokens (issue 42 item 2).
        spent = '<span id="run-spend">$0.0123; 1,234 tokens (1,200 in / 34 out)</span>'
        assert spent in run_page
