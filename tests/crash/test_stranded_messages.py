"""Operator messages a killed process left behind, found and re-queued by ``resume`` (issue 26).

Real processes throughout: a live ``steerflow agent`` (or ``flow``) whose ``script:`` calls
are held open by a gate (``tests/e2e/agent_gate_cli.py``), a second ``steerflow ctl msg``
process, SIGKILL (or an exit at the ``control-claim`` seam), then ``steerflow resume`` in a
new process.

* An agent claims a message only when the turn that renders it starts: one sent during the
  turn the agent is killed in is still pending, and the resume delivers it (no duplicate is
  possible: nobody applied it) instead of re-running the turn without it and leaving the row
  ``applying`` for ever, unnoticed (the issue's repro).
* A message the dead process had claimed (an agent between claim and the durable prompt, a
  flow's queue waiting for the next node) is listed by ``resume --dry-run``, the preflight and
  ``resume``: text, when sent, who claimed it. Without ``--redeliver-claimed`` it stays lost
  (D3) and the warning says so; with it, it is re-queued as a new message of the resumed
  session and the old row is resolved ``abandoned:redelivered:<new id>``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from agent_support import (
    WAIT_S,
    Gate,
    session_of,
    start_gated_agent,
    wait_left_pending,
)
from ctl_support import control, controls, ctl_ok, wait_for
from flow_support import child_env, finish, read_invocations, run_cli, stop, write_yaml

from steerflow.views import resume_preflight

pytestmark = pytest.mark.timeout(300)


def _script(tmp_path: Path) -> str:
    return "script:" + str(write_yaml(tmp_path / "s.yaml", {"turn-1": {"response": "one"}}))


def _killed(proc: Any) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=WAIT_S)
    assert proc.returncode == -signal.SIGKILL


def _run_id(home: Path) -> str:
    runs = json.loads(run_cli(home, "runs", "--json").stdout)["runs"]
    return str(runs[-1]["run_id"])  # the oldest: the source


def _recovery_page(home: Path, run_id: str) -> str:
    """The Studio's page of ``run_id`` (its recovery section), over real loopback HTTP."""
    import threading

    import httpx

    from steerflow.studio import listen

    listening = listen(home, port=0)
    thread = threading.Thread(target=listening.run, name="studio", daemon=True)
    thread.start()
    try:
        wait_for(lambda: listening.server.started, timeout=30, what="the studio to start")
        base, _, query = listening.url.partition("/?")
        with httpx.Client(base_url=base, timeout=30) as client:
            assert client.get("/?" + query).status_code == 303  # the token becomes a cookie
            page = client.get(f"/runs/{run_id}")
            assert page.status_code == 200, page.text
            return page.text
    finally:
        listening.server.should_exit = True
        thread.join(timeout=30)


def _resume_gated(home: Path, gate: Gate, *args: str, env: dict[str, str] | None = None) -> Any:
    proc = start_gated_agent(home, gate, "resume", *args, "--json", env=env)
    try:
        return finish(proc, timeout=WAIT_S)
    finally:
        stop(proc)


def test_a_message_sent_mid_turn_survives_a_sigkill_of_the_agent(tmp_path: Path) -> None:
    """The repro: an 8 s turn, ``ctl msg SID hello`` during it, SIGKILL, ``resume``."""
    home, gate = tmp_path / "home", Gate(tmp_path / "gate")
    proc = start_gated_agent(home, gate, "agent", "t", "--model", _script(tmp_path), "--json")
    try:
        gate.wait_started("turn-1", proc)
        session = session_of(home)
        msg = ctl_ok(home, "msg", session, "hello")
        # The poller saw the row and left it pending: the turn that renders it (turn 2)
        # has not started. Before issue 26 it was claimed here and held in memory.
        wait_left_pending(home, msg)
        _killed(proc)
    finally:
        stop(proc)
    sent = control(home, msg)
    assert sent.result is None and sent.applied_at is None
    run_id = _run_id(home)

    dry = run_cli(home, "resume", run_id, "--dry-run", "--json")
    assert dry.returncode == 0, dry.explain()
    (listed,) = dry.json["stranded_messages"]
    assert listed == {
        "control_id": msg,
        "session_id": session,
        "run_id": run_id,
        "text": "hello",
        "sent_at": sent.created_at,
        "state": "pending",
        "claimant": None,
        "claimed_by": None,
        "redelivered_as": None,
        "sender": sent.sender,  # who sent it (decision 205): `steerflow ctl`
        "delivered_in": None,  # no turn in flight took it (issue 38 item 5)
    }
    assert (sent.sender or "").startswith("cli:")
    assert any(msg in w and "re-queues it" in w for w in dry.json["warnings"])
    assert msg in dry.stderr
    assert dry.json["nodes"] == [{"id": "turn-1", "kind": "planned", "status": "pending"}]
    preflight = resume_preflight(home, run_id)
    assert preflight.allowed and preflight.kind == "agent"
    assert [m["control_id"] for m in preflight.stranded_messages] == [msg]
    page = _recovery_page(home, run_id)
    table = page[page.index('id="stranded-messages"') :]
    assert f"<td><code>{msg}</code></td><td>pending</td><td>hello</td>" in table
    assert control(home, msg).result is None  # a dry run writes nothing

    gate.release("turn-1", "turn-2")
    resumed = _resume_gated(home, gate, run_id)
    assert resumed.returncode == 0, resumed.explain()
    out = resumed.json
    (listed,) = out["stranded_messages"]
    new = listed["redelivered_as"]
    assert isinstance(new, str) and len(new) == 32
    # Turn 1 was in flight: it runs again; then the message starts turn 2, exactly once.
    assert [(t["id"], t["replayed"]) for t in out["turns"]] == [
        ("turn-1", False),
        ("turn-2", False),
    ]
    assert out["turns"][1]["controls"] == [new]
    assert out["turns"][1]["response"].count("hello") == 1
    assert control(home, msg).result == f"abandoned:redelivered:{new}"
    again = control(home, new)
    assert again.session_id == out["session_id"] and again.result == "applied"
    assert again.payload == {"text": "hello", "redelivered_from": msg}
    assert again.sender == sent.sender  # the operator sent it; the resume only moved it
    assert [line["node"] for line in read_invocations(home)] == ["turn-1", "turn-1", "turn-2"]


def _claimed_then_killed(tmp_path: Path) -> tuple[Path, Gate, str, str]:
    """An agent killed right after it claimed a message at the end of turn 1.

    ``exit:after:control-claim``: the row reads ``applying:<claimant>`` and turn 2's prompt
    was never recorded, so nothing will ever deliver it.
    """
    home, gate = tmp_path / "home", Gate(tmp_path / "gate")
    env = child_env(STEERFLOW_FAULT="exit:after:control-claim")
    args = ("agent", "t", "--model", _script(tmp_path), "--json")
    proc = start_gated_agent(home, gate, *args, env=env)
    try:
        gate.wait_started("turn-1", proc)
        session = session_of(home)
        msg = ctl_ok(home, "msg", session, "CLAIMED-TEXT")
        wait_left_pending(home, msg)
        gate.release("turn-1")
        proc.wait(timeout=WAIT_S)
    finally:
        stop(proc)
    assert proc.returncode == 137
    assert (control(home, msg).result or "").startswith("applying:")
    return home, gate, session, msg


def test_a_claimed_message_of_a_dead_agent_is_listed_and_stays_lost(tmp_path: Path) -> None:
    home, gate, session, msg = _claimed_then_killed(tmp_path)
    claim = control(home, msg).result
    assert claim is not None
    run_id = _run_id(home)
    dry = run_cli(home, "resume", run_id, "--dry-run", "--json")
    assert dry.returncode == 0, dry.explain()
    (listed,) = dry.json["stranded_messages"]
    assert (listed["control_id"], listed["state"], listed["text"]) == (
        msg,
        "applying",
        "CLAIMED-TEXT",
    )
    assert listed["claimant"] == claim.removeprefix("applying:")
    assert listed["claimed_by"] == "turn-2"  # the turn it was claimed for
    assert listed["session_id"] == session and listed["run_id"] == run_id
    assert listed["sent_at"] == control(home, msg).created_at
    (warning,) = dry.json["warnings"]
    assert msg in warning and "lost" in warning and "--redeliver-claimed" in warning

    # Without the flag the resume goes on: the message stays lost, and says so.
    resumed = _resume_gated(home, gate, run_id)
    assert resumed.returncode == 0, resumed.explain()
    assert [(t["id"], t["replayed"]) for t in resumed.json["turns"]] == [("turn-1", True)]
    assert resumed.json["stranded_messages"][0]["redelivered_as"] is None
    assert "lost" in resumed.stderr and msg in resumed.stderr
    assert control(home, msg).result == claim  # never stamped by anyone but its claimant
    assert [line["node"] for line in read_invocations(home)] == ["turn-1"]


def test_redeliver_claimed_requeues_a_claimed_message(tmp_path: Path) -> None:
    home, gate, session, msg = _claimed_then_killed(tmp_path)
    run_id = _run_id(home)
    dry = run_cli(home, "resume", run_id, "--dry-run", "--redeliver-claimed", "--json")
    assert dry.returncode == 0, dry.explain()
    assert "re-queues it" in dry.json["warnings"][0]
    gate.release("turn-2")
    resumed = _resume_gated(home, gate, run_id, "--redeliver-claimed")
    assert resumed.returncode == 0, resumed.explain()
    out = resumed.json
    new = out["stranded_messages"][0]["redelivered_as"]
    assert [(t["id"], t["replayed"]) for t in out["turns"]] == [
        ("turn-1", True),
        ("turn-2", False),
    ]
    assert out["turns"][1]["controls"] == [new]
    assert out["turns"][1]["response"].count("CLAIMED-TEXT") == 1
    assert control(home, msg).result == f"abandoned:redelivered:{new}"
    assert control(home, new).result == "applied"
    assert control(home, new).session_id == out["session_id"] != session
    # A second resume finds nothing left to redeliver in the chain.
    assert resume_preflight(home, out["run_id"]).stranded_messages == ()


PLAN = {
    "plan": [
        {"agent_id": "a", "instruction": "do a"},
        {"agent_id": "b", "instruction": "do b", "depends_on": ["a"]},
    ]
}


@pytest.mark.parametrize("redeliver", [False, True])
def test_a_flow_message_queued_for_the_next_node_is_listed_after_a_sigkill(
    tmp_path: Path, redeliver: bool
) -> None:
    """A flow claims a message on arrival and holds it for the next operation to start:
    killed before ``b`` starts, the message is claimed, undelivered, and listed."""
    home, gate = tmp_path / "home", Gate(tmp_path / "gate")
    plan = write_yaml(tmp_path / "plan.yaml", PLAN)
    model = "script:" + str(write_yaml(tmp_path / "s.yaml", {"*": {}}))
    proc = start_gated_agent(home, gate, "flow", "--plan", plan, "--model", model, "--json")
    try:
        gate.wait_started("a", proc)
        session = session_of(home)
        msg = ctl_ok(home, "msg", session, "FLOW-STEER")
        wait_for(
            lambda: (control(home, msg).result or "").startswith("applying:"),
            timeout=WAIT_S,
            what="the flow to claim the message",
        )
        _killed(proc)
    finally:
        stop(proc)
    run_id = _run_id(home)
    dry = run_cli(home, "resume", run_id, "--dry-run", "--json")
    assert dry.returncode == 0, dry.explain()
    (listed,) = dry.json["stranded_messages"]
    assert (listed["control_id"], listed["state"], listed["claimed_by"]) == (msg, "applying", None)
    assert listed["text"] == "FLOW-STEER" and listed["session_id"] == session
    assert [m["control_id"] for m in resume_preflight(home, run_id).stranded_messages] == [msg]

    gate.release("a", "b")
    flags = ("--redeliver-claimed",) if redeliver else ()
    resumed = _resume_gated(home, gate, run_id, *flags)
    assert resumed.returncode == 0, resumed.explain()
    rendered = run_cli(home, "show", resumed.json["run_id"], "b", "--json").json["instruction"]
    (listed,) = resumed.json["stranded_messages"]
    if redeliver:
        new = listed["redelivered_as"]
        assert rendered.count("FLOW-STEER") == 1
        assert control(home, msg).result == f"abandoned:redelivered:{new}"
        (row,) = [c for c in controls(home, resumed.json["session_id"]) if c.verb == "message"]
        assert (row.id, row.result) == (new, "applied")
    else:
        assert "FLOW-STEER" not in rendered
        assert listed["redelivered_as"] is None
        assert (control(home, msg).result or "").startswith("applying:")
        assert any(msg in w and "lost" in w for w in resumed.json["warnings"])
