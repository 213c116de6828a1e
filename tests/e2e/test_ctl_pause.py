"""``ctl pause`` / ``ctl resume`` against a live flow process (ADR-0069 D2).

The flow is ``a -> (b1, b2) -> c -> d`` on the ``script:`` model: ``a`` and the
``b`` nodes take long enough to be in flight when a pause lands. Holding is
observed through the published node statuses (``paused`` comes from the
executor's node-paused event), the session phase and the script invocation log.

The controls that must land while a node is still in flight are queued in this
process (:func:`flow_support.cli_in_process`: the real CLI writing the real state DB,
without a child interpreter's start-up on the critical path); the others are sent
by separate ``ctl`` processes. The flow always runs in its own process.
"""

from __future__ import annotations

from pathlib import Path

from ctl_support import (
    ctl_ok,
    ctl_status,
    invocations,
    live_flow,
    node_metadata,
    node_statuses,
    session_phase,
    wait_for,
    wait_stamped,
    write_yaml,
)
from flow_support import cli_in_process

from waiting import holds_for

# How long `a`, `b1` and `b2` run. The controls that must land while one of them is in
# flight are queued in process and applied within about 0.2 s of the node starting even
# with both CPUs of a 2-core box oversubscribed several times over: a wide margin that an
# idle run pays for twice, as it waits for these nodes to finish.
IN_FLIGHT_S = 4.0


def _plan(tmp_path: Path) -> list[str]:
    write_yaml(
        tmp_path / "plan.yaml",
        {
            "name": "pause-chain",
            "concurrency": 4,
            "plan": [
                {"agent_id": "a", "assignee": "w", "instruction": "first"},
                {"agent_id": "b1", "assignee": "w", "instruction": "left", "depends_on": ["a"]},
                {"agent_id": "b2", "assignee": "w", "instruction": "right", "depends_on": ["a"]},
                {"agent_id": "c", "assignee": "w", "instruction": "join",
                 "depends_on": ["b1", "b2"]},
                {"agent_id": "d", "assignee": "w", "instruction": "last", "depends_on": ["c"]},
            ],
        },
    )  # fmt: skip
    write_yaml(
        tmp_path / "script.yaml",
        {"a": {"delay": IN_FLIGHT_S}, "b1": {"delay": IN_FLIGHT_S}, "b2": {"delay": IN_FLIGHT_S}},
    )
    return ["--plan", str(tmp_path / "plan.yaml"), "--model", f"script:{tmp_path / 'script.yaml'}"]


def _send(home: Path, verb: str, target: str) -> str:
    """``ctl VERB TARGET`` run in this process; returns the queued control id."""
    code, out = cli_in_process(home, "ctl", verb, target)
    assert code == 0, f"ctl {verb} {target} exited {code}: {out}"
    control_id = out.splitlines()[0].strip()
    assert len(control_id) == 32 and int(control_id, 16) >= 0, out
    assert "queued" in out, out
    return control_id


def _invoked(home: Path) -> list[str]:
    return [line["node"] for line in invocations(home)]


def _completed(home: Path, session_id: str) -> set[str]:
    return {k for k, status in node_statuses(home, session_id).items() if status == "completed"}


def _assert_held(flow_home: Path, session_id: str, held: set[str], window_s: float) -> None:
    """Over ``window_s``, the held nodes stay ``paused`` and are never invoked."""

    def check() -> None:
        statuses = node_statuses(flow_home, session_id)
        assert all(statuses[k] == "paused" for k in held), statuses
        assert not held & set(_invoked(flow_home)), _invoked(flow_home)

    holds_for(check, seconds=window_s)


def test_pause_holds_unstarted_ops_and_resume_releases(tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = _plan(tmp_path)
    with live_flow(home, args) as flow:
        sid = flow.session_id
        flow.wait_nodes(lambda s: s.get("a") == "running", what="a running")

        # Pause while `a` is in flight, then pause again (a separate `ctl` process, by id
        # prefix): both apply, the gate is the same one.
        first = _send(home, "pause", sid)
        assert wait_stamped(home, first, alive=flow.proc).result == "applied"
        assert "a" not in _completed(home, sid), "`a` finished before the first pause applied"
        second = ctl_ok(home, "pause", sid[:8])  # a prefix works as well
        assert wait_stamped(home, second, alive=flow.proc).result == "applied"
        assert "a" in _invoked(home)
        assert session_phase(home, sid) == "paused"

        # In-flight `a` finishes; b1/b2 reach the gate and are held there.
        statuses = flow.wait_nodes(
            lambda s: s["a"] == "completed" and s["b1"] == "paused" and s["b2"] == "paused",
            what="a completed and b1/b2 held at the gate",
        )
        assert statuses["c"] == "pending" and statuses["d"] == "pending", statuses
        _assert_held(home, sid, {"b1", "b2"}, window_s=0.6)
        view = ctl_status(home, sid)
        assert view["phase"] == "paused" and view["poller"] == "active"
        assert [c["result"] for c in view["controls"]] == ["applied", "applied"]

        # Resume twice: the first opens the gate, the second is a no-op. From here on the
        # pause below must land while b1/b2 are still in flight, so all three are queued
        # in process.
        r1 = _send(home, "resume", sid)
        r2 = _send(home, "resume", sid)
        assert wait_stamped(home, r1, alive=flow.proc).result == "applied"
        assert wait_stamped(home, r2, alive=flow.proc).result == "applied"
        flow.wait_nodes(
            lambda s: s["b1"] in ("running", "completed") and s["b2"] in ("running", "completed"),
            what="b1/b2 released",
        )
        wait_for(lambda: session_phase(home, sid) == "executing", what="phase executing")

        # Resume then pause: a fresh gate holds what reaches the boundary afterwards (c),
        # while b1/b2, already in flight, run to completion.
        p3 = _send(home, "pause", sid)
        assert wait_stamped(home, p3, alive=flow.proc).result == "applied"
        assert not {"b1", "b2"} & _completed(home, sid), "b1/b2 finished before the pause applied"
        assert session_phase(home, sid) == "paused"
        flow.wait_nodes(
            lambda s: s["b1"] == "completed" and s["b2"] == "completed" and s["c"] == "paused",
            what="b1/b2 completed and c held by the new gate",
        )
        assert node_metadata(home, sid)["poller"] == "active"
        _assert_held(home, sid, {"c"}, window_s=0.4)
        assert "d" not in _invoked(home)

        r3 = ctl_ok(home, "resume", sid)
        assert wait_stamped(home, r3, alive=flow.proc).result == "applied"
        assert flow.finish(timeout=60) == 0, flow.stderr()

    result = flow.result()
    assert result["status"] == "completed"
    assert sorted(_invoked(home)) == ["a", "b1", "b2", "c", "d"]  # each ran exactly once
    meta = node_metadata(home, sid)
    assert meta["poller"] == "stopped"
    log = meta["control_log"]
    assert [e["id"] for e in log] == [first, second, r1, r2, p3, r3]
    assert [e["verb"] for e in log] == ["pause", "pause", "resume", "resume", "pause", "resume"]
    assert all(e["result"] == "applied" for e in log)
    # Each applied control is a line of the flow's progress, in the order applied.
    applied = [line for line in flow.stderr().splitlines() if line.startswith("operator ")]
    pause = "operator pause applied: nodes not yet started wait for a resume"
    resume = "operator resume applied"
    assert applied == [pause, pause, resume, resume, pause, resume]
