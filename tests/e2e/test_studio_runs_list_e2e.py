"""Studio 3 (issue 42 items 4, 6): the runs list's time range and sorts, the event log.
Real HTTP on loopback, real state DB rows (the colour codes: test_studio_browser_header).

The rows' clock columns are moved with SQL on the real file where a run must have begun
in the past (as in test_studio_defects_e2e): nothing is mocked.
"""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path

from test_studio_e2e import studio

from steerflow.state import NodeUpdate, StateDB


def _rows(page: str) -> list[str]:
    return re.findall(r'<tr id="run-([0-9T-]+-[0-9a-f]+)"', page)


def test_time_range_and_sorts_by_start_duration_and_spend(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    # (run, started seconds ago, lasted seconds, cost)
    runs = [
        ("20260101T000000-00000a", 3 * 86400, 5.0, 0.5),  # old, short, costly
        ("20260101T000000-00000b", 600, 90.0, 0.01),  # recent, long
        ("20260101T000000-00000c", 60, 20.0, None),  # newest, nothing reported
    ]
    now = time.time()
    with StateDB.open(home) as db:
        for run, ago, lasted, cost in runs:
            (home / "runs" / run).mkdir(parents=True)
            row = db.create_session(kind="flow", run_id=run, name=f"run {run[-1]}")
            usage = {"input_tokens": 10, "output_tokens": 1, "cost_usd": cost}
            db.update_node_metadata(
                row.id, {"finished_at": now - ago + lasted, "usage": usage if cost else None}
            )
            db.set_session_status(row.id, "completed")
            with sqlite3.connect(home / "state.db") as conn:
                conn.execute("UPDATE sessions SET created_at = ? WHERE id = ?", (now - ago, row.id))
    with studio(home) as s, s.client() as client:

        def listed(**params: str) -> list[str]:
            return [r[-1] for r in _rows(client.get("/runs", params=params).text)]

        assert listed() == ["c", "b", "a"]  # newest first
        assert listed(since="24h") == ["c", "b"]
        assert listed(since="1h", sort="oldest") == ["b", "c"]
        assert listed(sort="duration") == ["b", "c", "a"]
        assert listed(sort="spend") == ["a", "b", "c"]
        assert listed(since="nonsense") == ["c", "b", "a"]  # an unknown range is ignored
        page = client.get("/runs", params={"since": "24h", "sort": "duration", "q": "run"}).text
        # The form keeps what was chosen; the status links keep the range and the sort.
        assert '<option value="24h" selected>' in page
        assert '<option value="duration" selected>' in page
        assert "/runs?status=failed&amp;q=run&amp;since=24h&amp;sort=duration" in page
        # The live answer lists the same rows in the same order.
        live = client.get("/api/runs", params={"sort": "spend"}).json()["runs"]
        assert [r["run_id"][-1] for r in live] == ["a", "b", "c"]


def test_event_log_has_run_level_events_in_milliseconds_and_filters(tmp_path: Path) -> None:
    """Item 4: stopped with its reason, paused, the run's end; by kind and by node."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    run = "20260101T000000-0000ee"
    (home / "runs" / run).mkdir(parents=True)
    with StateDB.open(home) as db:
        row = db.create_session(kind="flow", run_id=run, name="stopped one")
        pause = db.insert_control(session_id=row.id, verb="pause", payload=None)
        db.finalize_control(pause.id, "applied")
        stop = db.insert_control(
            session_id=row.id, verb="stop", payload={"now": False, "reason": "wrong input"}
        )
        db.finalize_control(stop.id, "applied")
        db.upsert_nodes(row.id, [NodeUpdate("a", "planned", "completed", detail={
            "started_at": time.time() - 2.5, "ended_at": time.time() - 2.0})])  # fmt: skip
        db.update_node_metadata(
            row.id,
            {"finished_at": time.time(),
             "stopped_by": {"control_id": stop.id, "reason": "wrong input", "now": False}},
        )  # fmt: skip
        db.set_session_status(row.id, "stopped")
    with studio(home) as s, s.client() as client:
        run_page = client.get(f"/runs/{run}").text
        assert re.search(r'id="run-reason">stopped by an operator when idle \(control \w{8}\): '
                         r"wrong input<", run_page)  # fmt: skip
        assert f'href="/runs/{run}/events"' in run_page
        log = client.get(f"/runs/{run}/events").text
        times = re.findall(r'<td class="nowrap">([^<]+)</td>', log)
        assert times and all(
            re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z", t) for t in times
        )
        runs = client.get(f"/runs/{run}/events", params={"kind": "run"}).text
        for what in ("run started", "stop requested", "run stopped"):
            assert f"<td>{what}</td>" in runs, what
        assert "wrong input" in runs and "<td>pause applied</td>" not in runs
        controls = client.get(f"/runs/{run}/events", params={"kind": "control"}).text
        assert "<td>pause applied</td>" in controls and "<td>run started</td>" not in controls
        one = client.get(f"/runs/{run}/events", params={"node": "a"}).text
        assert re.findall(r'data-node="(\w+)"', one) == ["a", "a"]
        assert 'id="events-count">2 of ' in one
        # An unknown node or kind filters nothing out (the form is shown off).
        every = client.get(f"/runs/{run}/events", params={"node": "../x", "kind": "nope"}).text
        assert every.count("<tr data-at=") == len(times)
