"""End to end: a plan entry's own ``model``, ``retry`` and ``timeout_s`` (issue 40 item 1).

Real processes throughout: the CLI runs each flow; the vendor is a loopback
OpenAI-shaped server that counts every request it received (what was paid), so a retry
is seen where it costs, at the server. The crash tests SIGKILL the flow between two
tries of one node and resume it with the CLI: across the whole resume chain a node
never makes more than ``1 + retry.attempts`` calls.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flow_support import CliResult, finish, run_cli, start_cli, stop, write_yaml
from test_budget_e2e import _env  # the loopback vendor's environment (one attempt per call)

from steerflow.checkpoint import load_checkpoint
from waiting import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
from llm_fakes import FakeLLMServer, Reply

FAIL = Reply(status=500)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    fake = FakeLLMServer("openai").start()
    try:
        yield fake
    finally:
        fake.close()


def _nodes(result: CliResult) -> dict[str, dict[str, Any]]:
    out = result.json
    return {node["id"]: node for node in out["nodes"]}


def _show(home: Path, run_id: str, node: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    shown = run_cli(home, "show", run_id, node, "--json", env=env)
    assert shown.returncode == 0, shown.explain()
    return shown.json


def _newest_run(home: Path) -> str:
    runs = sorted((home / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    return runs[-1].name


def test_an_entry_model_runs_its_node_instead_of_its_roles_and_after_a_crash(
    home: Path, tmp_path: Path
) -> None:
    script = tmp_path / "script.yaml"
    # The scripted node is held long enough to be killed mid-call.
    write_yaml(script, {"special": {"response": "FROM-SCRIPT", "delay": 60}})
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "roles": {"writer": {"model": "echo"}},
            "plan": [
                {"agent_id": "plain", "assignee": "writer", "instruction": "Say plain."},
                {
                    "agent_id": "special",
                    "assignee": "writer",
                    "instruction": "Say special.",
                    "model": f"script:{script}",
                    "depends_on": ["plain"],
                },
            ],
        },
    )
    proc = start_cli(home, "flow", "--plan", plan, "--json", "--checkpoint-version", "3")
    try:
        invocations = home / "script-invocations.jsonl"
        wait_until(
            lambda: invocations.is_file() and "special" in invocations.read_text(),
            timeout=60,
            what="the scripted node's call",
        )
        proc.send_signal(signal.SIGKILL)
        finish(proc, timeout=30)
    finally:
        stop(proc)
    run_id = _newest_run(home)
    state, _ = load_checkpoint(home / "runs" / run_id)
    # The plan the checkpoint keeps carries the entry's model: what a resume runs it at.
    stored = {item["agent_id"]: item for item in state["plan"]}
    assert stored["special"]["model"] == f"script:{script}"
    assert "model" not in stored["plain"]
    assert [c["model"] for c in state["in_flight"]] == [f"script:{script}"]

    write_yaml(script, {"special": {"response": "FROM-SCRIPT"}})  # no hold this time
    resumed = run_cli(home, "resume", run_id, "--json", timeout=120)
    assert resumed.returncode == 0, resumed.explain()
    new_run = resumed.json["run_id"]
    special = _show(home, new_run, "special")
    assert special["response"] == "FROM-SCRIPT"
    assert special["model"] == f"script:{script}"
    plain = _show(home, new_run, "plain")
    assert plain["model"] == "echo"
    assert "Say plain." in plain["response"]  # echo's reply, replayed


def test_retry_calls_a_failing_node_again_exactly_attempts_times(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    # FLAKY fails twice then answers; DOWN never answers.
    server.route("FLAKY", FAIL, FAIL, Reply(text="flaky ok"))
    server.route("DOWN", FAIL)
    server.forever(Reply(text="steady ok"))
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "plan": [
                {"agent_id": "flaky", "instruction": "FLAKY", "retry": {"attempts": 2}},
                {
                    "agent_id": "down",
                    "instruction": "DOWN",
                    "retry": {"attempts": 1, "backoff_s": 0.2},
                },
                {"agent_id": "steady", "instruction": "STEADY"},
            ]
        },
    )
    run = run_cli(home, "flow", "--plan", plan, "--model", "openai/test-model", "--json",
                  "--checkpoint-version", "3", env=_env(server), timeout=120)  # fmt: skip
    assert run.returncode == 1, run.explain()
    assert len(server.matching("FLAKY")) == 3  # 1 + attempts
    assert len(server.matching("DOWN")) == 2
    assert len(server.matching("STEADY")) == 1
    nodes = _nodes(run)
    assert nodes["flaky"]["status"] == "completed"
    assert nodes["steady"]["status"] == "completed"
    assert nodes["down"]["status"] == "failed"
    down = _show(home, run.json["run_id"], "down", env=_env(server))
    assert "after 2 calls: retry.attempts is 1" in down["error"]
    assert "500" in down["error"]


def test_timeout_s_fails_one_call_and_the_run_goes_on(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    server.route("STALL", Reply(text="too late", delay=120))
    server.forever(Reply(text="quick ok"))
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "plan": [
                {
                    "agent_id": "stall",
                    "instruction": "STALL",
                    "timeout_s": 1,
                    "retry": {"attempts": 1},
                },
                {"agent_id": "quick", "instruction": "QUICK"},
                {"agent_id": "after", "instruction": "AFTER", "depends_on": ["quick"]},
            ]
        },
    )
    run = run_cli(home, "flow", "--plan", plan, "--model", "openai/test-model", "--json",
                  env=_env(server), timeout=120)  # fmt: skip
    assert run.returncode == 1, run.explain()
    nodes = _nodes(run)
    assert nodes["quick"]["status"] == "completed"
    assert nodes["after"]["status"] == "completed"
    assert nodes["stall"]["status"] == "failed"
    assert run.json["status"] != "timed_out"  # a node's limit is not the run's deadline
    assert len(server.matching("STALL")) == 2  # the limit's failure is retried
    error = _show(home, run.json["run_id"], "stall", env=_env(server))["error"]
    assert "took longer than its timeout_s of 1 s" in error


def _kill_after(server: FakeLLMServer, home: Path, args: list[object], needle: str, n: int) -> None:
    """Run ``args`` and SIGKILL it once the ``n``-th request matching ``needle`` arrived.

    The node backs off for seconds after each failed try, so the kill lands between two.
    """
    proc = start_cli(home, *args, env=_env(server))
    try:
        wait_until(lambda: len(server.matching(needle)) >= n, timeout=60, what=f"request {n}")
        proc.send_signal(signal.SIGKILL)
        finish(proc, timeout=30)
    finally:
        stop(proc)


def test_crashes_between_tries_never_exceed_one_plus_attempts_across_the_chain(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    server.route("DOWN", FAIL)
    server.forever(Reply(text="ok"))
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "plan": [
                {
                    "agent_id": "down",
                    "instruction": "DOWN",
                    "retry": {"attempts": 2, "backoff_s": 3},
                },
                {"agent_id": "up", "instruction": "UP"},
            ]
        },
    )
    flow: list[object] = ["flow", "--plan", plan, "--model", "openai/test-model", "--json",
                          "--checkpoint-version", "3"]  # fmt: skip
    _kill_after(server, home, flow, "DOWN", 1)
    first = _newest_run(home)
    state, _ = load_checkpoint(home / "runs" / first)
    # ("up" may be in flight too: the kill lands whenever DOWN's first try came back.)
    assert [(c["node"], c["attempt"]) for c in state["in_flight"] if c["node"] == "down"] == [
        ("down", 1)
    ]

    _kill_after(server, home, ["resume", first, "--json"], "DOWN", 2)
    second = _newest_run(home)
    state, _ = load_checkpoint(home / "runs" / second)
    assert [(c["node"], c["attempt"]) for c in state["in_flight"] if c["node"] == "down"] == [
        ("down", 2)
    ]
    assert state["config"]["tries_before"] == {"down": 1}

    last = run_cli(home, "resume", second, "--json", env=_env(server), timeout=120)
    assert last.returncode == 1, last.explain()
    assert len(server.matching("DOWN")) == 3  # 1 + attempts, across three runs
    assert _nodes(last)["down"]["status"] == "failed"
    assert _nodes(last)["up"]["status"] == "completed"
    error = _show(home, last.json["run_id"], "down", env=_env(server))["error"]
    assert "after 3 calls: retry.attempts is 2" in error

    # Nothing is left to call: every try of the chain was made.
    state, _ = load_checkpoint(home / "runs" / last.json["run_id"])
    assert "in_flight" not in state
    assert json.dumps(state["plan"]).count('"retry"') == 1


#: The module beside the script: importable by the script and by a resume.
NODE_FUNCTIONS = """\
import os
from pathlib import Path

LOG = Path(os.environ["FN_LOG"])


def _called(name):
    with LOG.open("a") as log:
        log.write(name + "\\n")


def shout(call):
    _called("shout")
    return call.instruction.upper()


def crash_once(call):
    _called("crash_once")
    if os.environ.get("FN_CRASH") == "1":
        os._exit(137)  # the process dies mid-call: nothing after this is recorded
    return "finished after a crash"
"""

BUILD_AND_RUN = """\
import asyncio, sys
from pathlib import Path

import steerflow
import nodefns

plan = steerflow.Plan(
    ops=[
        steerflow.Op("a", "shout this", fn=nodefns.shout),
        steerflow.Op("b", "then this", fn=nodefns.crash_once, depends_on=["a"]),
        steerflow.Op("c", "and echo", depends_on=["b"]),
    ],
    concurrency=1,
)
options = steerflow.FlowOptions(plan=plan, model="echo", allow_python=True, checkpoint_version=3)
result = asyncio.run(steerflow.run_flow(options, home=Path(sys.argv[1])))
print(result.run_id, result.status)
"""

MAIN_FUNCTION = """\
import sys
import steerflow

def shout(call):
    return call.instruction.upper()

try:
    if sys.argv[1] == "fn":
        steerflow.Op("a", "x", fn=shout)
    else:
        steerflow.Plan(ops=[steerflow.Op("a", "x", model="python:__main__:shout")])
except steerflow.SteerflowError as exc:
    print(type(exc).__name__, exc)
    sys.exit(2)
print("built")
"""


def _script_env(folder: Path, **extra: str) -> dict[str, str]:
    import os

    from flow_support import child_env

    paths = [str(folder), os.environ.get("PYTHONPATH", "")]
    return child_env(PYTHONPATH=os.pathsep.join(p for p in paths if p), **extra)


def test_a_function_op_built_in_a_script_is_resumed_by_the_cli(home: Path, tmp_path: Path) -> None:
    import subprocess

    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "nodefns.py").write_text(NODE_FUNCTIONS)
    (folder / "build.py").write_text(BUILD_AND_RUN)
    log = tmp_path / "calls.log"
    crashed = subprocess.run(
        [sys.executable, str(folder / "build.py"), str(home)],
        capture_output=True, text=True, timeout=120, check=False,
        env=_script_env(folder, FN_LOG=str(log), FN_CRASH="1"),
    )  # fmt: skip
    assert crashed.returncode == 137, crashed.stderr
    assert log.read_text().split() == ["shout", "crash_once"]
    run_id = _newest_run(home)
    state, _ = load_checkpoint(home / "runs" / run_id)
    models = {item["agent_id"]: item.get("model") for item in state["plan"]}
    assert models == {"a": "python:nodefns:shout", "b": "python:nodefns:crash_once", "c": None}

    # Another process, the CLI: it imports nodefns again from PYTHONPATH (the consent was
    # given to the run: resume has no --allow-python, and needs none).
    resumed = run_cli(home, "resume", run_id, "--json",
                      env=_script_env(folder, FN_LOG=str(log)), timeout=120)  # fmt: skip
    assert resumed.returncode == 0, resumed.explain()
    nodes = _nodes(resumed)
    assert {k: v["status"] for k, v in nodes.items()} == dict.fromkeys("abc", "completed")
    # a was replayed, not called again; b ran once more, this time to the end.
    assert log.read_text().split() == ["shout", "crash_once", "crash_once"]
    new_run = resumed.json["run_id"]
    assert _show(home, new_run, "a")["response"] == "SHOUT THIS"
    assert _show(home, new_run, "b")["response"] == "finished after a crash"
    assert _show(home, new_run, "b")["model"] == "python:nodefns:crash_once"


@pytest.mark.parametrize("how", ["fn", "spec"])
def test_a_function_of_the_script_itself_is_refused_when_the_plan_is_built(
    tmp_path: Path, how: str
) -> None:
    import subprocess

    script = tmp_path / "main_fn.py"
    script.write_text(MAIN_FUNCTION)
    done = subprocess.run(
        [sys.executable, str(script), how],
        capture_output=True, text=True, timeout=60, check=False, env=_script_env(tmp_path),
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "built" not in done.stdout
    assert "(__main__), which a resume in another process does not import" in done.stdout
    assert "define it with `def` at the top level of a module" in done.stdout
    expected = "Op.fn" if how == "fn" else "plan[0].model"
    assert expected in done.stdout


def test_a_planner_cannot_choose_a_nodes_model(home: Path, server: FakeLLMServer) -> None:
    chosen = {"plan": [{"agent_id": "a", "instruction": "NODE-A", "model": "python:os:getcwd"}]}
    plain = {"plan": [{"agent_id": "a", "instruction": "NODE-A"}]}
    # The first reply picks the code that runs its node: refused with feedback, then the
    # second (without a model) runs at the run's model.
    server.push(Reply(text=json.dumps(chosen)), Reply(text=json.dumps(plain)))
    server.forever(Reply(text="node done"))
    run = run_cli(home, "flow", "Do the thing.", "--model", "openai/test-model", "--json",
                  env=_env(server), timeout=120)  # fmt: skip
    assert run.returncode == 0, run.explain()
    assert _nodes(run)["a"]["status"] == "completed"
    retry_body = json.dumps(server.bodies()[1])
    assert "a generated plan cannot choose a node's model (a): leave model out" in retry_body
    assert len(server.matching("NODE-A")) >= 1

    server.push(Reply(text=json.dumps(chosen)), Reply(text=json.dumps(chosen)))
    refused = run_cli(home, "flow", "Do it again.", "--model", "openai/test-model", "--json",
                      env=_env(server), timeout=120)  # fmt: skip
    assert refused.returncode != 0, refused.explain()
    assert "a generated plan cannot choose a node's model" in refused.stdout + refused.stderr


def test_an_entry_model_that_runs_code_needs_consent(home: Path, tmp_path: Path) -> None:
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {"plan": [{"agent_id": "a", "instruction": "x", "model": "python:fn_nodes:record"}]},
    )
    refused = run_cli(home, "flow", "--plan", plan, "--json")
    assert refused.returncode == 2, refused.explain()
    assert "'python:fn_nodes:record' (plan entry 'a') for node(s) a" in refused.stderr
    assert "--allow-python" in refused.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())
