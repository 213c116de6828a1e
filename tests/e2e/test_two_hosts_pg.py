"""Two "hosts" on one PostgreSQL state DB: a flow on ``host-a``, ``ctl`` and readers on
``host-b`` (``STEERFLOW_HOST_ID``, two processes with different host identities).

Pause, message and stop cross hosts through the database alone, and ``show`` prints the
run's status, phase and node statuses from the database; ``resume``, ``verify`` and node
detail, which need the run directory, say in one line that it is not reachable from the
other host. When the flow's
process dies, its own host sees it ``interrupted`` at once (the pid is gone), while
the other host judges by the heartbeat only: ``running`` until the heartbeat is older
than the 30 s window, then ``interrupted``. (The heartbeat is aged in the row rather
than waited out.)
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
from ctl_support import (
    control,
    ctl_status,
    independent_plan,
    live_flow,
    run_cli,
    state_db,
    wait_for,
    wait_stamped,
    write_yaml,
)

from pg_support import PgRaw, PgServer
from steerflow.state import HEARTBEAT_STALE_S, HOST_ID_ENV, STATE_DB_URL_ENV

GATED_CLI = Path(__file__).resolve().with_name("gated_cli.py")
PYTHON = sys.executable


def _gate(home: Path, *nodes: str) -> None:
    for node in nodes:
        (home / f"gate-{node}").touch()


def _on(host: str, home: Path, url: str, *args: str) -> dict[str, object]:
    """Run ``steerflow --state-db URL ARGS`` as a process of ``host``; return its result.

    The environment names no database (blank): the flag alone selects it.
    """
    proc = run_cli(home, "--state-db", url, *args, env={HOST_ID_ENV: host, STATE_DB_URL_ENV: ""})
    return {"code": proc.returncode, "out": proc.stdout, "err": proc.stderr}


def _queued(host: str, home: Path, url: str, *args: str) -> str:
    result = _on(host, home, url, "ctl", *args)
    assert result["code"] == 0, result
    return str(result["out"]).splitlines()[0].strip()


def _status(host: str, home: Path, url: str, sid: str) -> str:
    result = _on(host, home, url, "ctl", "status", sid, "--json")
    assert result["code"] == 0, result
    return str(json.loads(str(result["out"]))["status"])


@pytest.mark.timeout(180)
def test_pause_message_stop_and_liveness_across_hosts(
    tmp_path: Path, pg: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = pg.new_database()
    monkeypatch.setenv(STATE_DB_URL_ENV, url)  # this test process reads the same database
    home_a, home_b = tmp_path / "host-a", tmp_path / "host-b"  # no shared files
    home_a.mkdir(mode=0o700)
    home_b.mkdir(mode=0o700)
    independent_plan(tmp_path / "plan.yaml", 6)
    write_yaml(tmp_path / "script.yaml", {"*": {}})
    args = [
        "--plan", str(tmp_path / "plan.yaml"),
        "--model", f"script:{tmp_path / 'script.yaml'}",
        "--concurrency", "1",
    ]  # fmt: skip
    # n000 and n001 are held (gated_cli.py) until the test releases them: the flow is live
    # for every control below however slow the machine, with no node duration to guess.
    _gate(home_a, "n000", "n001")
    flow_argv = [PYTHON, str(GATED_CLI), "--home", str(home_a), "flow", *args, "--json"]
    with live_flow(home_a, args, env={HOST_ID_ENV: "host-a"}, argv=flow_argv) as flow:
        sid = flow.session_id
        with state_db(home_b) as db:
            row = db.get_session(sid)
        assert row is not None and row.owner_host == "host-a"

        paused = _queued("host-b", home_b, url, "pause", sid)
        assert wait_stamped(home_b, paused, alive=flow.proc).result == "applied"
        assert ctl_status(home_b, sid)["phase"] == "paused"
        live = _on("host-b", home_b, url, "show", sid, "--json")  # live, from the DB alone
        assert live["code"] == 0, live
        shown = json.loads(str(live["out"]))
        assert (shown["status"], shown["phase"], shown["reachable"]) == ("running", "paused", False)
        resumed = _queued("host-b", home_b, url, "resume", sid)
        assert wait_stamped(home_b, resumed, alive=flow.proc).result == "applied"
        message = _queued("host-b", home_b, url, "msg", sid, "from host-b")
        # Claimed by host-a's poller before n000 ends, so it is rendered into n001 (held
        # next); released sooner, n001 could start first under load and hold the message
        # for n002, which waits for n001 (as test_two_hosts_netns.py already waits).
        wait_for(lambda: control(home_b, message).result, timeout=30,
                 what="the message claimed", alive=flow.proc)  # fmt: skip
        (home_a / "release-n000").touch()  # the message is rendered into n001, held next
        assert wait_stamped(home_b, message, alive=flow.proc).result == "applied"
        stop = _queued("host-b", home_b, url, "stop", sid, "--reason", "from host-b")
        assert wait_stamped(home_b, stop, alive=flow.proc).result == "applied"
        (home_a / "release-n001").touch()  # graceful: the in-flight n001 finishes first
        assert flow.finish(timeout=60) == 75
        run_id = flow.run_id
    assert _status("host-b", home_b, url, sid) == "stopped"
    listed = _on("host-b", home_b, url, "runs", "--json")
    assert listed["code"] == 0, listed
    runs = json.loads(str(listed["out"]))["runs"]
    assert [(r["session_id"], r["status"]) for r in runs] == [(sid, "stopped")]

    # What needs the checkpoint says, in one line, that the run directory is not here.
    for command in (("resume", run_id), ("resume", sid), ("verify", run_id), ("show", sid, "n000")):
        result = _on("host-b", home_b, url, *command)
        assert result["code"] == 3, (command, result)
        lines = str(result["err"]).strip().splitlines()
        assert len(lines) == 1, (command, lines)
        assert f"run {run_id} (session {sid}, started on host-a)" in lines[0]
        assert "is missing: not reachable from this host (host-b)" in lines[0]
    assert not (home_b / "runs").exists()

    # Plain `show` reads status, phase and node statuses from the state DB on any host,
    # and says in one line that the checkpoint (node detail, resume, verify) is elsewhere.
    with state_db(home_b) as db:
        rows = [(n.node_key, n.status) for n in db.list_nodes(sid)]
    assert ("n000", "completed") in rows, rows
    for target in (run_id, sid):
        result = _on("host-b", home_b, url, "show", target, "--json")
        assert result["code"] == 0, (target, result)
        view = json.loads(str(result["out"]))
        assert (view["run_id"], view["session_id"], view["status"]) == (run_id, sid, "stopped")
        assert [(n["id"], n["status"]) for n in view["nodes"]] == rows
        assert (view["reachable"], view["owner_host"], view["checkpoint"]) == (
            False,
            "host-a",
            None,
        )
        human = _on("host-b", home_b, url, "show", target)
        assert human["code"] == 0, (target, human)
        text = str(human["out"]).splitlines()
        assert "status: stopped" in text[1], text
        assert [line for line in text if line.startswith("checkpoint:")] == [
            "checkpoint: not reachable from this host (run directory on host-a); "
            "node detail, resume and verify need it"
        ], text
        assert any(line.split()[:1] == ["completed"] and "n000" in line for line in text), text
    on_a = _on("host-a", home_a, url, "show", run_id, "--json")
    assert on_a["code"] == 0, on_a
    view_a = json.loads(str(on_a["out"]))
    assert view_a["reachable"] is True and set(view_a) == set(view)  # the same keys
    assert not (home_b / "runs").exists()

    # A second flow, killed: its own host sees the dead pid, the other host the heartbeat.
    for name in ("release-n000", "release-n001", "started-n000", "started-n001"):
        (home_a / name).unlink()
    with live_flow(home_a, args, env={HOST_ID_ENV: "host-a"}, argv=flow_argv) as flow:
        sid = flow.session_id
        flow.proc.send_signal(signal.SIGKILL)
        flow.proc.wait(timeout=30)
    assert _status("host-a", home_a, url, sid) == "interrupted"
    assert _status("host-b", home_b, url, sid) == "running"  # never judged by a local pid
    # ctl from the other host still queues (the heartbeat is fresh): "queued" only.
    _queued("host-b", home_b, url, "msg", sid, "late")
    conn = PgRaw(url)
    try:
        conn.execute(
            "UPDATE sessions SET heartbeat_at = heartbeat_at - ? WHERE id = ?",
            (HEARTBEAT_STALE_S + 1, sid),
        )
    finally:
        conn.close()
    wait_for(
        lambda: _status("host-b", home_b, url, sid) == "interrupted",
        what="host-b to see the stale heartbeat",
    )
    refused = _on("host-b", home_b, url, "ctl", "pause", sid)
    assert refused["code"] == 3, refused
    assert "interrupted, not running" in str(refused["err"])
