"""End to end: ``--model claude-code/...`` and ``codex/...`` with fake agent executables.

The CLI runs as a subprocess; the agent CLI it starts is the fake of the provider tests
(``tests/providers/llm_fakes.py``), written into ``tmp_path`` and selected with
``STEERFLOW_CLAUDE_BIN`` / ``STEERFLOW_CODEX_BIN``. The fake records its argv, cwd,
stdin and pid (and its child's pid) in a log, which the tests assert against.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flow_support import (
    child_env,
    finish,
    node_status,
    run_cli,
    show_in_process,
    start_cli,
    stop,
    wait_for,
    write_yaml,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
from llm_fakes import FakeAgent, pid_gone, wait_gone, write_fake_agent

#: SIGINT to exit: the worker gets SIGTERM, then SIGKILL after this grace.
KILL_GRACE_S = 2.0
#: Bound on SIGINT -> exit 130 (grace, plus interpreter and checkpoint work, with slack).
SIGINT_EXIT_BOUND_S = 15.0
#: ``--timeout`` of the deadline test, counted from the session's creation. Before it the
#: quick first step must finish and the hanging second one must start and record itself:
#: about 0.1 s idle and 0.3 s with six busy loops on two cores, so 10 s is a wide margin.
DEADLINE_S = 10
#: The deadline test's SIGTERM-to-SIGKILL grace: its worker ignores SIGTERM, so only the
#: SIGKILL ends it either way, and a short grace pays for part of the longer deadline.
DEADLINE_KILL_GRACE_S = 0.5

CODER_SYSTEM = "You are CODER-PERSONA."


def claude_result(text: str, *, cost: float = 0.01) -> str:
    """What ``claude -p --output-format json`` prints."""
    return json.dumps(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": text,
            "total_cost_usd": cost,
            "usage": {"input_tokens": 5, "cache_read_input_tokens": 100, "output_tokens": 9},
        }
    )


def codex_events(text: str) -> str:
    """What ``codex exec --json`` prints (JSONL events)."""
    events = [
        {"type": "thread.started", "thread_id": "t1"},
        {"type": "item.completed", "item": {"type": "agent_message", "text": text}},
        {"type": "turn.completed", "usage": {"input_tokens": 40, "output_tokens": 6}},
    ]
    return "".join(json.dumps(e) + "\n" for e in events)


def agent_env(**extra: str) -> dict[str, str]:
    """The CLI child's environment: no inherited steerflow settings, the fakes' variables."""
    env = {k: v for k, v in child_env().items() if not k.startswith("STEERFLOW_")}
    env["STEERFLOW_AGENT_KILL_GRACE_S"] = str(KILL_GRACE_S)
    env.update(extra)
    return env


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def claude(tmp_path: Path) -> Iterator[FakeAgent]:
    agent = write_fake_agent(tmp_path / "bin", "claude")
    yield agent
    kill_leftover_workers(agent)


@pytest.fixture
def codex(tmp_path: Path) -> Iterator[FakeAgent]:
    agent = write_fake_agent(tmp_path / "bin", "codex")
    yield agent
    kill_leftover_workers(agent)


def two_step_plan(path: Path, first: str, second: str) -> Path:
    """``<first> -> <second>``, both assigned to the ``coder`` role (with a system prompt)."""
    return write_yaml(
        path,
        {
            "name": "agents",
            "roles": {"coder": {"system": CODER_SYSTEM}},
            "plan": [
                {"agent_id": first, "assignee": "coder", "instruction": f"Do {first.upper()}"},
                {
                    "agent_id": second,
                    "assignee": "coder",
                    "instruction": f"Then {second.upper()}",
                    "depends_on": [first],
                },
            ],
        },
    )


def run_for(agent: FakeAgent, needle: str) -> list[dict[str, Any]]:
    """The fake's recorded runs whose prompt contains ``needle``."""
    return [r for r in agent.runs() if needle in r["stdin"]]


def kill_leftover_workers(agent: FakeAgent) -> None:
    """Teardown: SIGKILL the process group of every recorded fake worker still running.

    Runs after the test's own assertions (which check that the flow stopped its workers),
    for when a test failed: a flow killed by :func:`stop` cannot stop its workers, and a
    hanging fake that ignores SIGTERM would otherwise outlive the test run. Each worker
    leads its own process group (``start_new_session``), which its child shares.
    """
    for run in agent.runs():
        pids = [p for p in (run["pid"], run.get("grandchild")) if p is not None]
        if not all(pid_gone(p) for p in pids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run["pid"], signal.SIGKILL)


def test_claude_code_run_collects_artifacts_per_node(
    home: Path, tmp_path: Path, claude: FakeAgent
) -> None:
    claude.configure(
        stdout=claude_result("generic"),
        when=[
            ["Do ANALYZE", {"stdout": claude_result("analysis A-1"),
                            "artifacts": {"report.md": "the report", "out/notes.txt": "n"}}],
            ["Then BUILD", {"stdout": claude_result("built B-2"),
                            "artifacts": {"build.log": "ok"}}],
        ],
    )  # fmt: skip
    plan = two_step_plan(tmp_path / "plan.yaml", "analyze", "build")
    env = agent_env(STEERFLOW_CLAUDE_BIN=str(claude.path))
    result = run_cli(home, "flow", "--plan", plan, "--model", "claude-code/sonnet", "--json",
                     env=env)  # fmt: skip
    assert result.returncode == 0, result.explain()
    out = result.json
    assert node_status(out) == {"analyze": "completed", "build": "completed"}
    run_dir = Path(out["run_dir"])
    assert run_dir == home / "runs" / out["run_id"]

    # Files the worker wrote in its cwd end up in <run_dir>/artifacts/<agent_id>/.
    artifacts = run_dir / "artifacts"
    assert (artifacts / "analyze" / "report.md").read_text() == "the report"
    assert (artifacts / "analyze" / "out" / "notes.txt").read_text() == "n"
    assert (artifacts / "build" / "build.log").read_text() == "ok"
    assert not (artifacts / "build" / "report.md").exists()
    assert stat.S_IMODE((artifacts / "analyze").stat().st_mode) == 0o700

    assert len(claude.runs()) == 2
    [analyze], [build] = run_for(claude, "Do ANALYZE"), run_for(claude, "Then BUILD")
    for run, key in ((analyze, "analyze"), (build, "build")):
        assert Path(run["cwd"]) == artifacts / key
        assert run["argv"][0] == str(claude.path)
        # In a run the call is watched, so claude streams its events (decision 193).
        assert run["argv"][1:] == [
            "-p", "--output-format", "stream-json", "--verbose", "--model", "sonnet",
            "--permission-mode", "acceptEdits", "--append-system-prompt", CODER_SYSTEM,
        ]  # fmt: skip
        assert pid_gone(run["pid"])
    assert analyze["stdin"] == "Do ANALYZE"  # the prompt goes in on stdin
    assert build["stdin"].startswith("Then BUILD") and "analysis A-1" in build["stdin"]

    # Usage and the CLI's reported cost are summed over both runs.
    expected = {"input_tokens": 210, "output_tokens": 18}
    assert {k: out["usage"][k] for k in expected} == expected
    assert out["usage"]["cost_usd"] == pytest.approx(0.02)
    assert show_in_process(home, out["run_id"])["usage"] == out["usage"]


def test_non_zero_exit_fails_only_that_node(home: Path, tmp_path: Path, claude: FakeAgent) -> None:
    claude.configure(
        stdout=claude_result("fine"),
        when=[["BAD-STEP", {"stdout": "", "exit": 3,
                            "stderr": "x" * 3000 + "\nquota exhausted for sonnet\n"}]],
    )  # fmt: skip
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "name": "one-bad",
            "plan": [
                {"agent_id": "good", "instruction": "GOOD-STEP"},
                {"agent_id": "bad", "instruction": "BAD-STEP"},
                {"agent_id": "after", "instruction": "AFTER-STEP", "depends_on": ["bad"]},
            ],
        },
    )
    env = agent_env(STEERFLOW_CLAUDE_BIN=str(claude.path))
    result = run_cli(home, "flow", "--plan", plan, "--model", "claude-code/sonnet", "--json",
                     env=env)  # fmt: skip
    assert result.returncode == 1, result.explain()
    out = result.json
    assert out["status"] == "failed" and out["exit_code"] == 1
    assert node_status(out) == {"good": "completed", "bad": "failed", "after": "skipped"}
    error = next(n["error"] for n in out["nodes"] if n["id"] == "bad")
    assert error.startswith("claude-code/sonnet: claude exited with code 3: ")
    assert error.endswith("quota exhausted for sonnet")  # the tail of stderr
    assert len(error) < 2200  # a tail, not all of it
    assert len(run_for(claude, "GOOD-STEP")) == len(run_for(claude, "BAD-STEP")) == 1
    assert run_for(claude, "AFTER-STEP") == []


def test_sigint_stops_the_worker_and_its_child_then_resume_completes(
    home: Path, tmp_path: Path, claude: FakeAgent
) -> None:
    claude.configure(
        stdout=claude_result("prepared P-1"),
        when=[["Then BUILD", {"hang": True, "grandchild": True,
                              "artifacts": {"partial.txt": "half done"}}]],
    )  # fmt: skip
    plan = two_step_plan(tmp_path / "plan.yaml", "prep", "build")
    env = agent_env(STEERFLOW_CLAUDE_BIN=str(claude.path))
    proc = start_cli(home, "flow", "--plan", plan, "--model", "claude-code/sonnet", "--json",
                     env=env)  # fmt: skip
    try:
        hung = wait_for(
            lambda: run_for(claude, "Then BUILD") or (proc.poll() is not None and ["exited"]),
            timeout=30,
            what="the build worker to start",
        )
        assert hung != ["exited"], finish(proc).explain()
        [worker] = hung
        assert not pid_gone(worker["pid"]) and not pid_gone(worker["grandchild"])
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        result = finish(proc, timeout=SIGINT_EXIT_BOUND_S + 5)
        elapsed = time.monotonic() - sent
    finally:
        stop(proc)
    assert result.returncode == 130, result.explain()
    assert elapsed < SIGINT_EXIT_BOUND_S, elapsed
    # The worker and the process it started are gone (the flow waited for them).
    assert wait_gone(worker["pid"], timeout=5), worker
    assert wait_gone(worker["grandchild"], timeout=5), worker
    out = result.json
    assert out["status"] == "interrupted" and out["exit_code"] == 130
    assert node_status(out) == {"prep": "completed", "build": "pending"}
    assert out["checkpoint"]["persisted"] is True
    first_run = Path(out["run_dir"])
    assert (first_run / "artifacts" / "build" / "partial.txt").read_text() == "half done"

    # Resume with a fast worker: prep is replayed (not run again), build runs and completes.
    claude.configure(stdout=claude_result("built B-2"))
    resumed = run_cli(home, "resume", out["run_id"], "--json", env=env)
    assert resumed.returncode == 0, resumed.explain()
    again = resumed.json
    assert again["status"] == "completed"
    assert node_status(again) == {"prep": "completed", "build": "completed"}
    assert again["resumed_from"] == out["session_id"]
    assert again["run_id"] != out["run_id"]
    assert len(run_for(claude, "Do PREP")) == 1
    builds = run_for(claude, "Then BUILD")
    assert len(builds) == 2
    assert "prepared P-1" in builds[1]["stdin"]  # the replayed result still feeds its dependent
    # A resume writes its legs under the source run's artifact root (Amendment 1 row 9):
    # the re-run worker finds what its cancelled attempt left in the same leg directory.
    assert Path(builds[1]["cwd"]) == first_run / "artifacts" / "build"
    assert all(pid_gone(r["pid"]) for r in claude.runs())


def test_deadline_stops_the_worker_and_its_child_then_resume_completes(
    home: Path, tmp_path: Path, claude: FakeAgent
) -> None:
    """``--timeout`` cancels an agent worker (it could run for hours) instead of waiting
    for it: SIGTERM, SIGKILL after the grace, node left pending, exit 124, resumable."""
    claude.configure(
        stdout=claude_result("prepared P-1"),
        when=[["Then BUILD", {"hang": True, "grandchild": True, "ignore_term": True,
                              "artifacts": {"partial.txt": "half done"}}]],
    )  # fmt: skip
    plan = two_step_plan(tmp_path / "plan.yaml", "prep", "build")
    env = agent_env(
        STEERFLOW_CLAUDE_BIN=str(claude.path),
        STEERFLOW_AGENT_KILL_GRACE_S=str(DEADLINE_KILL_GRACE_S),
    )
    proc = start_cli(home, "flow", "--plan", plan, "--model", "claude-code/sonnet", "--json",
                     "--timeout", DEADLINE_S, env=env)  # fmt: skip
    try:
        hung = wait_for(
            lambda: run_for(claude, "Then BUILD") or (proc.poll() is not None and ["exited"]),
            timeout=DEADLINE_S + 20,
            what="the build worker to start",
        )
        # The fake records itself only once it ignores SIGTERM, so a record means the
        # deadline found it running and ignoring SIGTERM; no record means the deadline came
        # first (exit 124 with build never started) and nothing below would be tested.
        assert hung != ["exited"], (
            f"the flow ended before the build worker started within its {DEADLINE_S} s "
            f"deadline\n{finish(proc).explain()}"
        )
        [worker] = hung
        # The worker ignores SIGTERM: only the SIGKILL after the grace ends it.
        result = finish(proc, timeout=DEADLINE_S + SIGINT_EXIT_BOUND_S + 5)
    finally:
        stop(proc)
    assert result.returncode == 124, result.explain()
    assert wait_gone(worker["pid"], timeout=5), worker
    assert wait_gone(worker["grandchild"], timeout=5), worker
    out = result.json
    assert out["status"] == "timed_out" and out["exit_code"] == 124
    assert node_status(out) == {"prep": "completed", "build": "pending"}
    assert out["checkpoint"]["persisted"] is True
    assert (Path(out["run_dir"]) / "artifacts" / "build" / "partial.txt").read_text() == "half done"
    # What the cancelled worker had produced is recorded for the operator.
    shown = show_in_process(home, out["session_id"])
    [build] = [n for n in shown["nodes"] if n["id"] == "build"]
    assert build["status"] == "pending"
    assert build["detail"]["cancelled"] == "deadline"
    assert build["detail"]["artifacts"] == ["partial.txt"]

    claude.configure(stdout=claude_result("built B-2"))
    resumed = run_cli(home, "resume", out["run_id"], "--json", env=env)
    assert resumed.returncode == 0, resumed.explain()
    assert node_status(resumed.json) == {"prep": "completed", "build": "completed"}
    assert len(run_for(claude, "Do PREP")) == 1
    assert len(run_for(claude, "Then BUILD")) == 2


def test_codex_run(home: Path, tmp_path: Path, codex: FakeAgent) -> None:
    codex.configure(
        stdout=codex_events("from events"),
        when=[
            ["Do DESIGN", {"last_message": "design D-1", "artifacts": {"design.md": "d"}}],
            ["Then PATCH", {"last_message": "patched", "artifacts": {"patch.diff": "+1"}}],
        ],
    )
    plan = two_step_plan(tmp_path / "plan.yaml", "design", "patch")
    env = agent_env(STEERFLOW_CODEX_BIN=str(codex.path))
    result = run_cli(home, "flow", "--plan", plan, "--model", "codex/gpt-test", "--json",
                     env=env)  # fmt: skip
    assert result.returncode == 0, result.explain()
    out = result.json
    assert node_status(out) == {"design": "completed", "patch": "completed"}
    artifacts = Path(out["run_dir"]) / "artifacts"
    assert (artifacts / "design" / "design.md").read_text() == "d"
    assert (artifacts / "patch" / "patch.diff").read_text() == "+1"

    assert len(codex.runs()) == 2
    [design], [patch] = run_for(codex, "Do DESIGN"), run_for(codex, "Then PATCH")
    for run, key in ((design, "design"), (patch, "patch")):
        assert Path(run["cwd"]) == artifacts / key
        argv = run["argv"]
        assert argv[0] == str(codex.path)
        last = argv.index("--output-last-message")
        assert argv[1:last] == [
            "exec", "--model", "gpt-test", "--sandbox", "workspace-write",
            "--skip-git-repo-check", "--json",
        ]  # fmt: skip
        assert argv[last + 2 :] == ["-"]  # the prompt comes on stdin
        # The last-message file lives outside the artifact directory (and is cleaned up).
        assert artifacts not in Path(argv[last + 1]).parents
        assert not Path(argv[last + 1]).exists()
        # codex has no system-prompt flag: the role's system text leads the prompt.
        assert run["stdin"].startswith(f"{CODER_SYSTEM}\n\n---\n\n")
    assert design["stdin"].endswith("Do DESIGN")
    assert "design D-1" in patch["stdin"]  # the reply is the last-message file
    assert "from events" not in patch["stdin"]
    assert out["usage"] == {
        "input_tokens": 80,
        "output_tokens": 12,
        "cache_read_tokens": None,
        "cache_write_tokens": None,
        "cost_usd": None,
    }
