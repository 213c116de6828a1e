"""``python:MODULE:FUNCTION`` nodes through the real CLI (issue 29 item 2, decisions 170-171).

The functions are ``tests/fn_nodes.py``, put on the child's ``PYTHONPATH``. ``counted``
appends one line per call to ``$FN_NODES_LOG``, so calls are counted across processes: a
flow killed mid-run (a fault seam, or SIGKILL) and resumed in a new process never calls the
function again for a node its checkpoint recorded completed.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from flow_support import child_env, finish, run_cli, start_cli, stop, wait_for, write_yaml
from resume_support import run_dirs, single_run

from steerflow.checkpoint import load_checkpoint
from steerflow.state import StateDB

pytestmark = pytest.mark.timeout(120)

TESTS = Path(__file__).resolve().parents[1]
IDS = ("a", "b", "c", "d")


def _env(log: Path, **extra: str) -> dict[str, str]:
    return child_env(PYTHONPATH=str(TESTS), FN_NODES_LOG=str(log), **extra)


def _calls(log: Path) -> Counter[str]:
    return Counter(log.read_text().split()) if log.exists() else Counter()


def _chain(path: Path, **top: Any) -> Path:
    entries: list[dict[str, Any]] = []
    for i, agent_id in enumerate(IDS):
        entry: dict[str, Any] = {"agent_id": agent_id, "instruction": f"step {agent_id}"}
        if i:
            entry["depends_on"] = [IDS[i - 1]]
        entries.append(entry)
    return write_yaml(path, {**top, "name": "chain", "plan": entries})


def _completed(run_dir: Path) -> set[str]:
    state, report = load_checkpoint(run_dir / "checkpoint.json")
    assert report["status"] in ("clean", "recovered_prefix"), report
    return {k for k, e in state["ops"].items() if e["status"] == "completed"}


def _resume_and_check(home: Path, log: Path, run_dir: Path, before: Counter[str]) -> None:
    done_at_kill = _completed(run_dir)
    assert done_at_kill <= set(before), "a node recorded completed was never called"
    assert done_at_kill != set(IDS), "the kill came too late to test anything"
    resumed = run_cli(home, "resume", run_dir.name, "--json", env=_env(log))
    assert resumed.returncode == 0, resumed.explain()
    assert resumed.json["status"] == "completed", resumed.explain()
    after = _calls(log) - before
    for node in done_at_kill:
        assert after[node] == 0, f"{node} was completed at the kill and was called again"
    for node in set(IDS) - done_at_kill:
        assert after[node] == 1, f"{node}: {after}"
    # the replayed responses are the recorded returns
    state, _ = load_checkpoint(Path(resumed.json["run_dir"]) / "checkpoint.json")
    responses = {k: e["response"] for k, e in state["ops"].items()}
    assert responses == {
        node: f"counted {node} after {[IDS[IDS.index(node) - 1]] if node != 'a' else []}"
        for node in IDS
    }


def test_killed_at_a_seam_and_resumed_in_a_new_process(tmp_path: Path) -> None:
    home, log = tmp_path / "home", tmp_path / "calls.log"
    plan = _chain(tmp_path / "plan.yaml")
    killed = run_cli(
        home, "flow", "--plan", plan, "--model", "python:fn_nodes:counted",
        env=_env(log, STEERFLOW_FAULT="exit:after:ack:3"),  # the base, then a and b
    )  # fmt: skip
    assert killed.returncode == 137, killed.explain()
    before = _calls(log)
    run_dir = single_run(home)
    assert _completed(run_dir) == {"a", "b"}
    _resume_and_check(home, log, run_dir, before)


def test_sigkilled_with_a_call_in_flight_and_resumed(tmp_path: Path) -> None:
    home, log = tmp_path / "home", tmp_path / "calls.log"
    plan = _chain(tmp_path / "plan.yaml", model="python:fn_nodes:counted_holding")
    proc = start_cli(
        home, "flow", "--plan", plan, "--allow-python", env=_env(log, FN_NODES_HOLD="c")
    )
    try:
        wait_for(lambda: _calls(log)["c"] == 1, timeout=60, what="c's call")
        proc.send_signal(signal.SIGKILL)
        assert finish(proc).returncode == -signal.SIGKILL
    finally:
        stop(proc)
    before = _calls(log)
    run_dir = single_run(home)
    assert {"a", "b"} <= _completed(run_dir) and "c" not in _completed(run_dir)
    # the resume runs the checkpoint's model, without --allow-python: the run had consent
    _resume_and_check(home, log, run_dir, before)
    assert _calls(log)["c"] == 2  # in flight at the kill: called again, once


def test_a_plan_naming_a_function_needs_allow_python(tmp_path: Path) -> None:
    home, log = tmp_path / "home", tmp_path / "calls.log"
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "roles": {"tester": {"model": "python:fn_nodes:counted"}},
            "plan": [
                {"agent_id": "scope", "instruction": "read"},
                {"agent_id": "check", "assignee": "tester", "instruction": "run the tests"},
            ],
        },
    )
    refused = run_cli(home, "flow", "--plan", plan, env=_env(log))
    assert refused.returncode == 2, refused.explain()
    line = refused.stderr.strip().splitlines()[-1]
    assert line == (
        f"steerflow: error: {plan} names Python functions that run in this process: "
        "'python:fn_nodes:counted' (role 'tester') for node(s) check. "
        "Pass --allow-python, or give the function with --model, to run them"
    ), refused.explain()
    as_json = run_cli(home, "flow", "--plan", plan, "--json", env=_env(log))
    assert as_json.returncode == 2 and "--allow-python" in as_json.json["error"]["message"]
    # --model naming another function is no consent for this one
    other = run_cli(
        home, "flow", "--plan", plan, "--model", "python:fn_nodes:record", env=_env(log)
    )
    assert other.returncode == 2 and "'python:fn_nodes:counted'" in other.stderr
    assert not log.exists() and run_dirs(home) == [], "a refused plan ran something"

    allowed = run_cli(home, "flow", "--plan", plan, "--allow-python", "--json", env=_env(log))
    assert allowed.returncode == 0, allowed.explain()
    assert _calls(log) == Counter({"check": 1})
    same = run_cli(
        home, "flow", "--plan", plan, "--model", "python:fn_nodes:counted", env=_env(log)
    )
    assert same.returncode == 0, same.explain()


def test_a_playbook_naming_a_function_needs_allow_python(tmp_path: Path) -> None:
    home, log = tmp_path / "home", tmp_path / "calls.log"
    (home / "playbooks").mkdir(parents=True)
    write_yaml(
        home / "playbooks" / "checks.yaml",
        {
            "roles": {"r": {"escalation": ["python:fn_nodes:counted"]}},
            "plan": [{"agent_id": "only", "assignee": "r", "instruction": "x"}],
        },
    )
    refused = run_cli(home, "play", "checks", env=_env(log))
    assert refused.returncode == 2, refused.explain()
    assert "'python:fn_nodes:counted' (role 'r' escalation)" in refused.stderr
    assert "--allow-python" in refused.stderr
    assert run_cli(home, "play", "checks", "--allow-python", env=_env(log)).returncode == 0


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("python:fn_nodes_nosuch:fn", "cannot import module 'fn_nodes_nosuch'"),
        ("python:fn_nodes:nosuch", "module 'fn_nodes' has no function 'nosuch'"),
        ("python:fn_nodes:NOT_CALLABLE", "is not callable"),
    ],
)
def test_a_function_that_cannot_be_imported_is_refused_before_any_call(
    tmp_path: Path, spec: str, problem: str
) -> None:
    home, log = tmp_path / "home", tmp_path / "calls.log"
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "roles": {"bad": {"model": spec}},
            "plan": [
                {"agent_id": "first", "instruction": "runs the good function"},
                {"agent_id": "second", "assignee": "bad", "instruction": "x"},
            ],
        },
    )
    args = ("flow", "--plan", plan, "--model", "python:fn_nodes:counted", "--allow-python")
    result = run_cli(home, *args, env=_env(log))
    assert result.returncode == 2, result.explain()
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"steerflow: error: model spec {spec!r}: ") and problem in line
    assert not log.exists(), "a node was called before the bad spec was refused"


def test_an_error_from_the_function_fails_its_node_naming_it(tmp_path: Path) -> None:
    home, log = tmp_path / "home", tmp_path / "calls.log"
    plan = _chain(tmp_path / "plan.yaml")
    result = run_cli(
        home, "flow", "--plan", plan, "--model", "python:fn_nodes:raises", "--json", env=_env(log)
    )
    assert result.returncode == 1, result.explain()
    nodes = {n["id"]: n for n in result.json["nodes"]}
    assert nodes["a"]["status"] == "failed"
    error = "python:fn_nodes:raises raised ValueError: the function failed on a"
    assert nodes["a"]["error"] == error
    assert {nodes[k]["status"] for k in IDS[1:]} == {"skipped"}


@pytest.mark.parametrize("how", ["SIGINT", "stop --now"])
def test_a_blocked_plain_function_does_not_hold_the_process_exit(tmp_path: Path, how: str) -> None:
    """The blocked call's thread is abandoned: the process exits while it still blocks
    (for 100 s, far past ``finish``'s 30 s bound), and the node is left for a resume."""
    home, log = tmp_path / "home", tmp_path / "calls.log"
    plan = _chain(tmp_path / "plan.yaml")
    env = _env(log, FN_NODES_HOLD="b", FN_NODES_HOLD_S="100")
    proc = start_cli(
        home, "flow", "--plan", plan, "--model", "python:fn_nodes:counted_holding", env=env
    )
    try:
        wait_for(lambda: _calls(log)["b"] == 1, timeout=60, what="b's call")
        if how == "SIGINT":
            proc.send_signal(signal.SIGINT)
        else:
            with StateDB.open(home) as db:
                (session,) = db.list_sessions(limit=1)
            sent = run_cli(home, "ctl", "stop", session.id, "--now", env=env)
            assert sent.returncode == 0, sent.explain()
        done = finish(proc, timeout=30)
    finally:
        stop(proc)
    assert done.returncode == (130 if how == "SIGINT" else 75), done.explain()
    assert _completed(single_run(home)) == {"a"}


def test_a_function_cannot_plan(tmp_path: Path) -> None:
    home, log = tmp_path / "home", tmp_path / "calls.log"
    result = run_cli(home, "flow", "do things", "--model", "python:fn_nodes:counted", env=_env(log))
    assert result.returncode == 2, result.explain()
    assert result.stderr.strip().splitlines()[-1] == (
        "steerflow: error: python:fn_nodes:counted cannot plan a flow: give --plan FILE or "
        "--playbook NAME, and the function as the model of the nodes (or roles) it serves"
    )
    assert not log.exists()


@pytest.mark.parametrize("exit_call", ["sys.exit(0)", "raise SystemExit('bye')"])
def test_a_module_that_exits_at_import_is_a_usage_error_naming_it(
    tmp_path: Path, exit_call: str
) -> None:
    """``SystemExit`` from the import is no way out of steerflow: exit 0 would read as success."""
    home, log = tmp_path / "home", tmp_path / "calls.log"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "exits_now.py").write_text(f"import sys\n{exit_call}\n")
    plan = _chain(tmp_path / "plan.yaml")
    env = child_env(PYTHONPATH=f"{tmp_path / 'mods'}:{TESTS}", FN_NODES_LOG=str(log))
    for json_flag in ((), ("--json",)):
        result = run_cli(
            home, "flow", "--plan", plan, "--model", "python:exits_now:f", *json_flag, env=env
        )
        assert result.returncode == 2, result.explain()
        (line,) = result.stderr.strip().splitlines()
        code = "0" if "exit(0)" in exit_call else "bye"
        assert line == (
            "steerflow: error: model spec 'python:exits_now:f': cannot import module "
            f"'exits_now' (SystemExit: {code})"
        ), result.explain()
        if json_flag:
            assert result.json["exit_code"] == 2 and result.json["error"]["code"] == "usage"
    assert run_dirs(home) == []


def _live_text(run_dir: Path, node: str) -> str:
    segments = sorted((run_dir / "live" / node).glob("*.txt"), key=lambda p: int(p.stem))
    return "".join(p.read_text(encoding="utf-8") for p in segments)


@pytest.mark.parametrize("function", ["prints", "prints_async"])
def test_a_functions_print_goes_to_its_node_output_never_to_stdout(
    tmp_path: Path, function: str
) -> None:
    """Four functions printing at once: ``--json`` stays one object, and each node's live
    output holds its own lines, in order, and no other node's."""
    home, log = tmp_path / "home", tmp_path / "calls.log"
    nodes = ["p1", "p2", "p3", "p4"]
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {"plan": [{"agent_id": n, "instruction": "print"} for n in nodes]},
    )
    result = run_cli(
        home, "flow", "--plan", plan, "--model", f"python:fn_nodes:{function}",
        "--concurrency", "4", "--json", env=_env(log, FN_NODES_PRINTS="200"),
    )  # fmt: skip
    assert result.returncode == 0, result.explain()
    assert result.json["status"] == "completed"
    assert "print" not in result.stderr, result.explain()
    run_dir = Path(result.json["run_dir"])
    for node in nodes:
        expected = "".join(f"print {n} from {node}\n" for n in range(200))
        assert _live_text(run_dir, node) == expected, node


def test_a_hung_plain_function_is_cancelled_after_the_deadlines_grace(tmp_path: Path) -> None:
    """A plain function hung for good: ``--timeout 2`` still ends the run (124), the node
    cancelled by the deadline and left for a resume, its thread abandoned."""
    home, log = tmp_path / "home", tmp_path / "calls.log"
    plan = write_yaml(tmp_path / "plan.yaml", {"plan": [{"agent_id": "a", "instruction": "x"}]})
    started = time.monotonic()
    result = run_cli(
        home, "flow", "--plan", plan, "--model", "python:fn_nodes:sleeps_an_hour",
        "--timeout", "2", "--json", env=_env(log), timeout=90,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.returncode == 124, result.explain()
    assert result.json["status"] == "timed_out"
    (node,) = result.json["nodes"]
    assert node["status"] == "pending", result.explain()
    assert _calls(log) == Counter({"a": 1})
    # the deadline (2 s), the grace (5 s), and a loaded machine's start-up and exit
    assert elapsed < 45, elapsed
    shown = run_cli(home, "show", result.json["run_id"], "--json")
    assert shown.returncode == 0, shown.explain()
    (node,) = shown.json["nodes"]
    assert node["status"] == "pending" and node["detail"]["cancelled"] == "deadline", node
