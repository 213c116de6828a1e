"""SIGKILL an ``agent`` in the middle of a steered turn, then ``steerflow resume`` it (issue 19).

The agent (a real CLI process with a gated fake ``claude``, see ``tests/e2e/agent_support``)
finishes turn 1, takes an operator message, starts turn 2 and is killed while turn 2 runs.
The resume must replay turn 1 without calling the model again, run turn 2 again with the
very prompt the message produced (the message row is not delivered twice: it stays
``applied``), continue the CLI's own session (``--resume sess-A``) in the same directory,
and a second resume of the same run is refused. A checkpoint whose recorded turn was altered
is refused too (exit 3), before anything runs. Killed after turn 2's prompt is durable but
before its message's stamp, the resume lists the message as stranded, delivers it once (turn
2) and stamps the old row ``applied`` (issue 38 item 5).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from agent_support import (
    WAIT_S,
    Gate,
    claude_runs,
    session_of,
    start_gated_agent,
    wait_left_pending,
    write_gated_claude,
)
from ctl_support import control, controls, ctl_ok, wait_for
from flow_support import child_env, finish, read_invocations, run_cli, stop, write_yaml

from steerflow.views import resume_preflight


def _kill_agent_and_worker(proc_pid: int, worker_pid: int) -> None:
    os.kill(proc_pid, signal.SIGKILL)
    # The worker leads its own process group; a SIGKILLed agent cannot stop it.
    os.killpg(worker_pid, signal.SIGKILL)


def test_sigkill_mid_turn_then_resume_replays_finished_turns(tmp_path: Path) -> None:
    home, gate = tmp_path / "home", Gate(tmp_path / "gate")
    claude, log = write_gated_claude(tmp_path / "bin", gate)
    env = child_env(STEERFLOW_CLAUDE_BIN=str(claude))
    proc = start_gated_agent(home, gate, "agent", "port the module", "--model",
                             "claude-code/sonnet", "--json", env=env)  # fmt: skip
    try:
        gate.wait_started(1, proc)
        session = session_of(home)
        msg = ctl_ok(home, "msg", session, "keep it backwards compatible")
        wait_left_pending(home, msg)  # claimed when turn 2 starts
        gate.release(1)
        gate.wait_started(2, proc)
        # Turn 2's prompt is durable, so its message is stamped; kill after the stamp landed.
        wait_for(
            lambda: control(home, msg).result == "applied",
            timeout=WAIT_S,
            what="the message to be stamped applied",
        )
        killed_turn = claude_runs(log)[1]
        _kill_agent_and_worker(proc.pid, killed_turn["pid"])
        proc.wait(timeout=WAIT_S)
    finally:
        stop(proc)
    assert proc.returncode == -signal.SIGKILL

    gate.release(3)  # the resumed turn 2 is the fake's third run
    resumed = run_cli(home, "resume", session, "--json", env=env, timeout=WAIT_S)
    assert resumed.returncode == 0, resumed.explain()
    out = resumed.json
    assert out["status"] == "completed" and out["resumed_from"] == session
    assert [(t["id"], t["replayed"]) for t in out["turns"]] == [
        ("turn-1", True),
        ("turn-2", False),
    ]
    assert [t["response"] for t in out["turns"]] == ["reply 1", "reply 3"]
    runs = claude_runs(log)
    assert len(runs) == 3  # turn 1 once; turn 2 killed once and run again: nothing else
    assert runs[2]["stdin"] == killed_turn["stdin"]  # the same steered prompt
    assert runs[2]["argv"][runs[2]["argv"].index("--resume") + 1] == "sess-A"
    assert runs[2]["cwd"] == runs[0]["cwd"]
    assert control(home, msg).result == "applied"
    assert out["turns"][1]["controls"] == [msg]

    again = run_cli(home, "resume", session, "--json", env=env, timeout=WAIT_S)
    assert again.returncode == 3, again.explain()
    assert len(claude_runs(log)) == 3


def test_resume_refuses_an_altered_turn(tmp_path: Path) -> None:
    home = tmp_path / "home"
    model = "script:" + str(write_yaml(tmp_path / "s.yaml", {"turn-1": {"response": "ORIGINAL"}}))
    first = run_cli(home, "agent", "task", "--model", model, "--json", timeout=WAIT_S)
    assert first.returncode == 0, first.explain()
    run_dir = Path(first.json["run_dir"])
    journal = run_dir / "checkpoint.json.journal"
    journal.write_text(journal.read_text().replace("ORIGINAL", "TAMPERED"))
    refused = run_cli(home, "resume", first.json["run_id"], "--json", timeout=WAIT_S)
    assert refused.returncode == 3, refused.explain()
    assert "turn-1" in refused.stdout + refused.stderr
    assert len(read_invocations(home)) == 1  # nothing ran again


@pytest.mark.parametrize("point", ["agent-next", "agent-steered"])
def test_killed_before_the_stamp_the_resume_lists_delivers_once_and_stamps_it(
    tmp_path: Path, point: str
) -> None:
    """Killed once turn 2's prompt is durable, before its message is stamped (issue 38 item 5).

    ``agent-next``: right after the prompt is recorded; ``agent-steered``: right after the
    ``steer: 1 operator message(s) start turn 2`` line (the stamp is the poller's next
    tick). The row reads ``applying:<dead claimant>``. ``resume --dry-run`` and the resume
    list it as stranded (the turn it was claimed for delivers it), the resume runs turn 2
    with it exactly once, and the old row ends ``applied`` instead of ``applying`` for good.
    """
    home, gate = tmp_path / "home", Gate(tmp_path / "gate")
    model = "script:" + str(write_yaml(tmp_path / "s.yaml", {"turn-1": {"response": "one"}}))
    env = child_env(STEERFLOW_FAULT=f"exit:after:{point}")
    proc = start_gated_agent(home, gate, "agent", "task", "--model", model, "--json", env=env)
    try:
        gate.wait_started("turn-1", proc)
        session = session_of(home)
        msg = ctl_ok(home, "msg", session, "NEXT-PROMPT-TEXT")
        wait_left_pending(home, msg)  # claimed when turn 2 starts
        gate.release("turn-1", "turn-2")
        killed = finish(proc, timeout=WAIT_S)
    finally:
        stop(proc)
    assert killed.returncode == 137, killed.explain()
    steered = "steer: 1 operator message(s) start turn 2"
    assert (steered in killed.stderr) == (point == "agent-steered"), killed.stderr
    claim = control(home, msg).result or ""
    assert claim.startswith("applying:")
    run_id = json.loads(run_cli(home, "runs", "--json").stdout)["runs"][0]["run_id"]

    dry = run_cli(home, "resume", run_id, "--dry-run", "--json", timeout=WAIT_S)
    assert dry.returncode == 0, dry.explain()
    (listed,) = dry.json["stranded_messages"]
    assert (listed["control_id"], listed["state"], listed["text"]) == (
        msg,
        "applying",
        "NEXT-PROMPT-TEXT",
    )
    assert (listed["claimant"], listed["claimed_by"]) == (claim.removeprefix("applying:"), "turn-2")
    assert (listed["delivered_in"], listed["redelivered_as"]) == ("turn-2", None)
    assert listed["session_id"] == session and listed["run_id"] == run_id
    (warning,) = dry.json["warnings"]
    assert msg in warning and "turn-2" in warning and "lost" not in warning, warning
    assert msg in dry.stderr
    assert dry.json["nodes"][-1] == {"id": "turn-2", "kind": "planned", "status": "pending"}
    assert [m["control_id"] for m in resume_preflight(home, run_id).stranded_messages] == [msg]
    assert control(home, msg).result == claim  # a dry run writes nothing

    resumed = run_cli(home, "resume", run_id, "--json", timeout=WAIT_S)
    assert resumed.returncode == 0, resumed.explain()
    out = resumed.json
    (listed,) = out["stranded_messages"]
    assert (listed["control_id"], listed["delivered_in"]) == (msg, "turn-2")
    assert listed["redelivered_as"] is None  # delivered by its own turn, never re-queued
    assert msg in resumed.stderr
    turns = out["turns"]
    assert [(t["id"], t["replayed"]) for t in turns] == [("turn-1", True), ("turn-2", False)]
    assert turns[1]["controls"] == [msg]
    assert turns[1]["response"].count("NEXT-PROMPT-TEXT") == 1
    nodes = [line["node"] for line in read_invocations(home)]
    assert nodes == ["turn-1", "turn-2"]  # turn 2 never ran before the kill; once after
    row = control(home, msg)
    assert row.result == "applied" and row.applied_at is not None  # closed, not applying
    assert [c.result for c in controls(home, out["session_id"]) if c.verb == "message"] == []
    # Nothing is left behind for a later resume of the chain.
    assert resume_preflight(home, out["run_id"]).stranded_messages == ()
