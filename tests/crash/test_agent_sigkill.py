"""SIGKILL an ``agent`` in the middle of a steered turn, then ``steerflow resume`` it (issue 19).

The agent (a real CLI process with a gated fake ``claude``, see ``tests/e2e/agent_support``)
finishes turn 1, takes an operator message, starts turn 2 and is killed while turn 2 runs.
The resume must replay turn 1 without calling the model again, run turn 2 again with the
very prompt the message produced (the message row is not delivered twice: it stays
``applied``), continue the CLI's own session (``--resume sess-A``) in the same directory,
and a second resume of the same run is refused. A checkpoint whose recorded turn was altered
is refused too (exit 3), before anything runs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

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
from ctl_support import control, ctl_ok, wait_for
from flow_support import child_env, read_invocations, run_cli, stop, write_yaml


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


def test_killed_after_the_next_prompt_is_durable_but_before_its_stamp(tmp_path: Path) -> None:
    """``exit:after:agent-next``: the message row stays ``applying`` (never re-applied), yet
    the resume runs the turn it started, with its text, exactly once."""
    home, gate = tmp_path / "home", Gate(tmp_path / "gate")
    model = "script:" + str(write_yaml(tmp_path / "s.yaml", {"turn-1": {"response": "one"}}))
    env = child_env(STEERFLOW_FAULT="exit:after:agent-next")
    proc = start_gated_agent(home, gate, "agent", "task", "--model", model, "--json", env=env)
    try:
        gate.wait_started("turn-1", proc)
        msg = ctl_ok(home, "msg", session_of(home), "NEXT-PROMPT-TEXT")
        wait_left_pending(home, msg)  # claimed when turn 2 starts
        gate.release("turn-1", "turn-2")
        proc.wait(timeout=WAIT_S)
    finally:
        stop(proc)
    assert proc.returncode == 137
    assert (control(home, msg).result or "").startswith("applying:")
    run_id = json.loads(run_cli(home, "runs", "--json").stdout)["runs"][0]["run_id"]
    resumed = run_cli(home, "resume", run_id, "--json", timeout=WAIT_S)
    assert resumed.returncode == 0, resumed.explain()
    turns = resumed.json["turns"]
    assert [(t["id"], t["replayed"]) for t in turns] == [("turn-1", True), ("turn-2", False)]
    assert turns[1]["response"].count("NEXT-PROMPT-TEXT") == 1
    nodes = [line["node"] for line in read_invocations(home)]
    assert nodes == ["turn-1", "turn-2"]  # turn 2 never ran before the kill
    # At most once: the resume does not stamp or reuse the dead claimant's row.
    assert (control(home, msg).result or "").startswith("applying:")
