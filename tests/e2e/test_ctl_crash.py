"""A flow that dies between claiming a message and stamping it (ADR-0069 D3, CONTRACT §7).

``STEERFLOW_FAULT=exit:after:control-claim`` makes the flow process ``os._exit(137)``
right after the poller wrote ``applying:<claimant>``. The row must stay visibly
mid-apply, no later poller or run may apply it again, and only ``ctl resolve``
closes it.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from ctl_support import (
    control,
    ctl,
    ctl_ok,
    ctl_status,
    independent_plan,
    invocations,
    live_flow,
    run_cli,
    state_db,
    wait_stamped,
    write_yaml,
)

from steerflow.control import ControlPoller, SteeringTarget
from steerflow.state import StateDB
from waiting import wait_until_async


class _Recorder(SteeringTarget):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")

    def has_pending_operation(self) -> bool:
        return True

    def add_operator_message(self, text: str, *, ts: float, control_id: str) -> None:
        self.calls.append(f"message:{text}")


def _poll_once_as_new_consumer(home: Path, session_id: str) -> list[str]:
    """A fresh poller for the dead session, ticking a few times: what did it apply?"""

    async def go() -> list[str]:
        target = _Recorder()
        # forced_list: under LISTEN the safety-net listing is 20 s by default (decision 124)
        poller = ControlPoller(home, session_id, target, interval=0.01, forced_list=0.05)
        task = asyncio.ensure_future(poller.run())
        # Three listings of the session's rows: the claimed one is never among them.
        await wait_until_async(lambda: poller.listings >= 3, timeout=10, what="three listings")
        await poller.stop()
        await task
        return target.calls

    return asyncio.run(go())


def test_crash_after_claim_leaves_applying_until_resolved(
    tmp_path: Path, state_backend: str
) -> None:
    home = tmp_path / "home"
    independent_plan(tmp_path / "plan.yaml", 2)
    # The first node stays in flight far longer than the three `ctl` processes below can
    # take, even on a loaded machine: the flow dies at the message's claim, never waiting
    # this out (the seam fires before the has-pending check, so the delay changes nothing).
    write_yaml(tmp_path / "script.yaml", {"*": {"delay": 30.0}})
    args = [
        "--plan", str(tmp_path / "plan.yaml"),
        "--model", f"script:{tmp_path / 'script.yaml'}",
        "--concurrency", "1",
    ]  # fmt: skip
    with live_flow(home, args, env={"STEERFLOW_FAULT": "exit:after:control-claim"}) as flow:
        sid, run_id = flow.session_id, flow.run_id
        flow.wait_nodes(lambda s: s.get("n000") == "running", what="first node running")
        applied = ctl_ok(home, "pause", sid)
        assert wait_stamped(home, applied, alive=flow.proc).result == "applied"
        resumed = ctl_ok(home, "resume", sid)
        assert wait_stamped(home, resumed, alive=flow.proc).result == "applied"
        lost = ctl_ok(home, "msg", sid, "claimed-then-crashed")
        assert flow.finish(timeout=30) == 137  # died at the seam

    row = control(home, lost)
    assert row.applied_at is None and row.result is not None
    assert row.result.startswith("applying:") and row.is_applying
    host, pid, executor = row.result.removeprefix("applying:").split(":")[:3]
    assert (host, pid, executor) == (socket.gethostname(), str(flow.proc.pid), "flow-executor")

    view = ctl_status(home, sid)
    assert view["status"] == "interrupted"  # the owner is dead
    assert [c["result"] for c in view["controls"]] == ["applied", "applied", row.result]

    # A new consumer of that session never applies the claimed row again...
    assert _poll_once_as_new_consumer(home, sid) == []
    assert control(home, lost) == row
    # ... and neither does a resumed run (its own session; the message is not replayed).
    # The resumed run reads the script file afresh: let its nodes finish at once.
    write_yaml(tmp_path / "script.yaml", {"*": {"delay": 0}})
    resumed_run = run_cli(home, "resume", run_id, "--json", timeout=60)
    assert resumed_run.returncode == 0, resumed_run.stderr
    assert control(home, lost) == row
    assert not any("claimed-then-crashed" in str(line) for line in invocations(home))
    with state_db(home) as db:
        newest = db.list_sessions(limit=1)[0]
    assert newest.id != sid
    state_text = (home / "runs").glob("*/checkpoint.json*")
    assert all("claimed-then-crashed" not in p.read_text() for p in state_text)

    # Writers refuse the dead session, so add a pending row the way another caller could.
    with state_db(home) as db:
        pending = db.insert_control(session_id=sid, verb="message", payload={"text": "queued"})
        before = db.count_controls()

    # resolve refuses a pending row and an applied row, leaving both unchanged.
    for other in (pending.id, applied):
        snapshot = control(home, other)
        proc = ctl(home, "resolve", other, "--as", "abandoned")
        assert proc.returncode == 3, proc.stderr
        assert "not applying" in proc.stderr
        assert control(home, other) == snapshot
    proc = ctl(home, "resolve", "0" * 32, "--as", "applied")
    assert proc.returncode == 3 and "unknown control id" in proc.stderr
    assert control(home, lost) == row

    # resolve closes the applying row, once.
    proc = ctl(home, "resolve", lost, "--as", "abandoned", "--by", "oncall")
    assert proc.returncode == 0, proc.stderr
    closed = control(home, lost)
    assert closed.result == "abandoned:oncall" and closed.applied_at is not None
    assert lost in proc.stdout
    again = ctl(home, "resolve", lost, "--as", "applied")
    assert again.returncode == 3
    assert control(home, lost) == closed
    with state_db(home) as db:
        assert db.count_controls() == before


def test_resolve_as_applied_and_without_by(tmp_path: Path) -> None:
    """``--as applied`` stores ``applied``; ``--as abandoned`` without ``--by``: ``abandoned``."""
    home = tmp_path / "home"
    with StateDB.open(home) as db:
        session = db.create_session(kind="flow")
        a = db.insert_control(session_id=session.id, verb="message", payload={"text": "a"})
        b = db.insert_control(session_id=session.id, verb="message", payload={"text": "b"})
        assert db.claim_control(a.id, "h:1:flow-executor:x")
        assert db.claim_control(b.id, "h:1:flow-executor:x")
    assert ctl(home, "resolve", a.id, "--as", "applied").returncode == 0
    assert ctl(home, "resolve", b.id, "--as", "abandoned").returncode == 0
    assert control(home, a.id).result == "applied"
    assert control(home, b.id).result == "abandoned"
    assert control(home, a.id).applied_at is not None
