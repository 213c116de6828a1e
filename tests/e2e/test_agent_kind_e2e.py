"""End to end: ``steerflow agent`` steered with ``ctl`` from other processes (issue 19).

Every agent here is a real CLI subprocess; turns are held open by a gate (see
``agent_support``) so each control is known to arrive while a turn runs.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from agent_support import (
    WAIT_S,
    Gate,
    claude_runs,
    session_of,
    start_gated_agent,
    wait_left_pending,
    write_gated_claude,
)
from ctl_support import control, controls, count_controls, ctl, ctl_ok, wait_for
from flow_support import (
    child_env,
    finish,
    read_invocations,
    run_cli,
    start_cli,
    stop,
    write_yaml,
)

STEER = "[OPERATOR STEER]"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def gate(tmp_path: Path) -> Gate:
    return Gate(tmp_path / "gate")


def script(tmp_path: Path, **entries: Any) -> str:
    return "script:" + str(write_yaml(tmp_path / "script.yaml", entries or {"*": {}}))


def invocation_counts(home: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in read_invocations(home):
        counts[line["node"]] = counts.get(line["node"], 0) + 1
    return counts


def test_message_sent_mid_turn_starts_the_next_turn_exactly_once(
    home: Path, tmp_path: Path, gate: Gate
) -> None:
    model = script(tmp_path, **{"turn-1": {"response": "first answer"}})
    proc = start_gated_agent(home, gate, "agent", "fix the bug", "--model", model, "--json")
    try:
        gate.wait_started("turn-1", proc)
        session = session_of(home)
        msg = ctl_ok(home, "msg", session, "use the other API")
        wait_left_pending(home, msg)
        gate.release("turn-1")
        gate.wait_started("turn-2", proc)
        # Durable in the checkpoint first, then stamped: applied once turn 2 has started.
        wait_for(
            lambda: control(home, msg).result == "applied",
            timeout=WAIT_S,
            what="the message to be stamped applied",
        )
        gate.release("turn-2")
        result = finish(proc, timeout=WAIT_S)
    finally:
        stop(proc)
    assert result.returncode == 0, result.explain()
    out = result.json
    assert out["kind"] == "agent" and out["status"] == "completed"
    assert [t["id"] for t in out["turns"]] == ["turn-1", "turn-2"]
    first, second = (t["response"] for t in out["turns"])
    assert first == "first answer"
    assert second.count(STEER) == 1 and second.count("use the other API") == 1
    assert out["turns"][1]["controls"] == [msg]
    assert out["result"] == second
    # One call per turn: the message started exactly one more turn, and no third.
    assert invocation_counts(home) == {"turn-1": 1, "turn-2": 1}
    assert [c.result for c in controls(home, session) if c.verb == "message"] == ["applied"]

    with_json = run_cli(home, "ctl", "status", session, "--json")
    assert with_json.returncode == 0 and json.loads(with_json.stdout)["turns"] == 2
    shown = run_cli(home, "show", out["run_id"], "--json").json
    assert [(n["id"], n["status"]) for n in shown["nodes"]] == [
        ("turn-1", "completed"),
        ("turn-2", "completed"),
    ]
    res = run_cli(home, "result", out["run_id"], "--json").json
    assert [n["id"] for n in res["nodes"]] == ["turn-2"] and res["nodes"][0]["response"] == second
    node = run_cli(home, "show", out["run_id"], "turn-2", "--json").json
    assert "use the other API" in json.dumps(node)


def test_two_messages_make_one_turn_in_order(home: Path, tmp_path: Path, gate: Gate) -> None:
    proc = start_gated_agent(home, gate, "agent", "task", "--model", script(tmp_path), "--json")
    try:
        gate.wait_started("turn-1", proc)
        session = session_of(home)
        first = ctl_ok(home, "msg", session, "ALPHA correction")
        second = ctl_ok(home, "msg", session, "BETA correction")
        wait_left_pending(home, first)
        wait_left_pending(home, second)
        status = json.loads(run_cli(home, "ctl", "status", session, "--json").stdout)
        assert status["turns"] == 0  # turn 1 is still running
        gate.release("turn-1", "turn-2")
        result = finish(proc, timeout=WAIT_S)
    finally:
        stop(proc)
    assert result.returncode == 0, result.explain()
    turns = result.json["turns"]
    assert len(turns) == 2
    steered = turns[1]["response"]
    assert steered.count(STEER) == 1
    assert steered.index("ALPHA correction") < steered.index("BETA correction")
    assert turns[1]["controls"] == [first, second]
    assert not gate.started("turn-3")
    assert {control(home, c).result for c in (first, second)} == {"applied"}


def test_pause_and_resume_are_refused_without_a_row(home: Path, tmp_path: Path, gate: Gate) -> None:
    proc = start_gated_agent(home, gate, "agent", "task", "--model", script(tmp_path), "--json")
    try:
        gate.wait_started("turn-1", proc)
        session = session_of(home)
        for verb in ("pause", "resume"):
            refused = ctl(home, verb, session)
            assert refused.returncode == 3, refused.stderr
            assert "kind not allowed" in refused.stderr
        assert count_controls(home) == 0
        gate.release("turn-1")
        result = finish(proc, timeout=WAIT_S)
    finally:
        stop(proc)
    assert result.returncode == 0, result.explain()
    assert count_controls(home) == 0


def test_stop_ends_the_agent_after_the_current_turn(home: Path, tmp_path: Path, gate: Gate) -> None:
    proc = start_gated_agent(home, gate, "agent", "task", "--model", script(tmp_path), "--json")
    try:
        gate.wait_started("turn-1", proc)
        session = session_of(home)
        msg = ctl_ok(home, "msg", session, "one more thing")
        wait_left_pending(home, msg)
        stop_id = ctl_ok(home, "stop", session, "--reason", "enough")
        wait_for(
            lambda: control(home, stop_id).result == "applied",
            timeout=WAIT_S,
            what="the stop to be applied",
        )
        gate.release("turn-1")
        result = finish(proc, timeout=WAIT_S)
    finally:
        stop(proc)
    assert result.returncode == 75, result.explain()
    out = result.json
    assert out["status"] == "stopped" and out["stopped_by"]["control_id"] == stop_id
    assert [t["status"] for t in out["turns"]] == ["completed"]  # the turn in flight finished
    assert not gate.started("turn-2")
    assert control(home, msg).result == "rejected:no-pending-ops"
    assert invocation_counts(home) == {"turn-1": 1}


def test_stop_now_cancels_the_turn_and_resume_runs_it(
    home: Path, tmp_path: Path, gate: Gate
) -> None:
    model = script(tmp_path)
    proc = start_gated_agent(home, gate, "agent", "task", "--model", model, "--json")
    try:
        gate.wait_started("turn-1", proc)
        ctl_ok(home, "stop", session_of(home), "--now")
        result = finish(proc, timeout=WAIT_S)
    finally:
        stop(proc)
    assert result.returncode == 75, result.explain()
    assert result.json["turns"] == []  # cancelled, so not recorded
    gate.release("turn-1")
    resumed = start_gated_agent(home, gate, "resume", result.json["run_id"], "--json")
    try:
        again = finish(resumed, timeout=WAIT_S)
    finally:
        stop(resumed)
    assert again.returncode == 0, again.explain()
    assert [t["status"] for t in again.json["turns"]] == ["completed"]
    assert invocation_counts(home) == {"turn-1": 2}


def test_max_turns_reached_rejects_the_pending_message(
    home: Path, tmp_path: Path, gate: Gate
) -> None:
    args = ("agent", "task", "--model", script(tmp_path), "--max-turns", "1", "--json")
    proc = start_gated_agent(home, gate, *args)
    try:
        gate.wait_started("turn-1", proc)
        msg = ctl_ok(home, "msg", session_of(home), "keep going")
        wait_left_pending(home, msg)
        gate.release("turn-1")
        result = finish(proc, timeout=WAIT_S)
    finally:
        stop(proc)
    assert result.returncode == 0, result.explain()
    out = result.json
    assert out["status"] == "completed" and len(out["turns"]) == 1
    assert out["rejected_controls"] == [{"control_id": msg, "result": "rejected:max-turns"}]
    assert control(home, msg).result == "rejected:max-turns"
    assert not gate.started("turn-2")


def test_claude_code_agent_resumes_its_own_session(home: Path, tmp_path: Path, gate: Gate) -> None:
    claude, log = write_gated_claude(tmp_path / "bin", gate)
    env = child_env(STEERFLOW_CLAUDE_BIN=str(claude))
    proc = start_gated_agent(
        home, gate, "agent", "refactor the parser", "--model", "claude-code/sonnet", "--json",
        env=env,
    )  # fmt: skip
    try:
        gate.wait_started(1, proc)
        msg = ctl_ok(home, "msg", session_of(home), "keep the public API")
        wait_left_pending(home, msg)
        gate.release(1)
        gate.wait_started(2, proc)
        gate.release(2)
        result = finish(proc, timeout=WAIT_S)
    finally:
        stop(proc)
    assert result.returncode == 0, result.explain()
    first, second = claude_runs(log)
    assert "--resume" not in first["argv"]
    assert first["stdin"] == "refactor the parser"
    # Turn 2 continues the CLI's own session: no transcript, only the steered prompt.
    resume_at = second["argv"].index("--resume")
    assert second["argv"][resume_at + 1] == "sess-A"
    assert second["stdin"].startswith(STEER) and "keep the public API" in second["stdin"]
    assert "refactor the parser" not in second["stdin"]
    # Both turns ran in the one leg directory.
    leg = Path(result.json["run_dir"]) / "artifacts" / "agent"
    assert Path(first["cwd"]) == leg and Path(second["cwd"]) == leg
    assert [t["response"] for t in result.json["turns"]] == ["reply 1", "reply 2"]


def test_codex_agent_gets_the_earlier_turns_as_a_transcript(
    home: Path, tmp_path: Path, gate: Gate
) -> None:
    codex, log = write_gated_claude(tmp_path / "bin", gate, "codex")
    env = child_env(STEERFLOW_CODEX_BIN=str(codex))
    proc = start_gated_agent(home, gate, "agent", "TASK-ONE", "--model", "codex/x", "--json",
                             env=env)  # fmt: skip
    try:
        gate.wait_started(1, proc)
        msg = ctl_ok(home, "msg", session_of(home), "CORRECTION-TWO")
        wait_left_pending(home, msg)
        gate.release(1, 2)
        result = finish(proc, timeout=WAIT_S)
    finally:
        stop(proc)
    assert result.returncode == 0, result.explain()
    first, second = claude_runs(log)
    assert "--resume" not in second["argv"] and "resume" not in second["argv"]
    transcript = second["stdin"]
    assert transcript.index("TASK-ONE") < transcript.index("reply 1")
    assert transcript.index("reply 1") < transcript.index("CORRECTION-TWO")
    assert first["cwd"] == second["cwd"]


def test_openai_agent_keeps_the_conversation_in_process(home: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
    from llm_fakes import FakeLLMServer, Reply

    held = threading.Event()
    server = FakeLLMServer("openai").start()
    try:
        server.push(Reply(text="first reply", gate=held), Reply(text="second reply"))
        env = child_env(
            OPENAI_BASE_URL=server.base_url,
            OPENAI_API_KEY="sk-test",
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
        )
        proc = start_cli(home, "agent", "FIRST-TASK", "--model", "openai/test-model", "--json",
                         env=env)  # fmt: skip
        try:
            assert server.wait_for(1, timeout=WAIT_S)
            msg = ctl_ok(home, "msg", session_of(home), "SECOND-STEER")
            wait_left_pending(home, msg)
            held.set()
            result = finish(proc, timeout=WAIT_S)
        finally:
            held.set()
            stop(proc)
    finally:
        server.close()
    assert result.returncode == 0, result.explain()
    assert [t["response"] for t in result.json["turns"]] == ["first reply", "second reply"]
    _, second = server.bodies()
    roles = [(m["role"], m["content"]) for m in second["messages"] if m["role"] != "system"]
    assert [r for r, _ in roles] == ["user", "assistant", "user"]
    assert roles[0][1] == "FIRST-TASK" and roles[1][1] == "first reply"
    assert "SECOND-STEER" in roles[2][1] and roles[2][1].startswith(STEER)
