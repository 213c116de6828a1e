"""End to end: the ``steerflow`` command line in real subprocesses with a temporary home."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from flow_support import (
    PYTHON,
    chain_plan,
    child_env,
    finish,
    node_status,
    run_cli,
    runs_in_process,
    show_in_process,
    start_cli,
    stop,
    wait_for,
    write_yaml,
)

from steerflow.checkpoint import load_checkpoint

HEX32 = re.compile(r"^[0-9a-f]{32}$")
RUN_ID = re.compile(r"^\d{8}T\d{6}-[0-9a-f]{6}$")
DEMO_NODES = [
    "scope",
    "angle-history",
    "angle-tools",
    "angle-risks",
    "draft",
    "review",
    "summary",
    "synthesis",  # the demo's top-level synthesis: last, over every worker's result
]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A steerflow home that does not exist yet."""
    return tmp_path / "home"


def _run_dirs(home: Path) -> list[Path]:
    runs = home / "runs"
    return sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []


def _assert_flow_json(out: dict[str, Any]) -> None:
    """The members CONTRACT §3 requires of a flow/play/resume ``--json`` object."""
    for key in ("session_id", "run_id", "status", "exit_code", "checkpoint"):
        assert key in out, key
    assert "checkpoint_recovery" in out
    assert out["checkpoint_recovery"] is None or isinstance(out["checkpoint_recovery"], dict)
    assert HEX32.match(out["session_id"])
    assert RUN_ID.match(out["run_id"])
    ckpt = out["checkpoint"]
    assert set(ckpt) >= {"path", "version", "persisted", "error"}
    assert isinstance(ckpt["persisted"], bool)
    assert isinstance(out["nodes"], list)
    for node in out["nodes"]:
        assert set(node) >= {"id", "kind", "status"}
        assert node["kind"] in ("planned", "spawned")


# -- help, success, plan files ------------------------------------------------------------


def test_help_lists_every_exit_code() -> None:
    result = run_cli(None, "--help")
    assert result.returncode == 0, result.explain()
    text = result.stdout
    assert "Exit codes" in text
    for code in ("0", "1", "2", "3", "75", "124", "130", "143"):
        assert re.search(rf"^\s*{code}\s+\S", text, re.MULTILINE), f"exit code {code} missing"


@pytest.mark.parametrize("command", ["flow", "play", "agent", "resume"])
def test_a_run_command_lists_its_own_exit_codes(command: str) -> None:
    # Not the global table: "queued" and "kind not allowed" are answers only `ctl` gets.
    result = run_cli(None, command, "--help")
    assert result.returncode == 0, result.explain()
    text = result.stdout[result.stdout.index("Exit codes") :]
    for code in ("0", "1", "2", "3", "75", "124", "130", "143"):
        assert re.search(rf"^\s*{code}\s+\S", text, re.MULTILINE), f"exit code {code} missing"
    assert "queued" not in text and "kind not allowed" not in text, text


def test_play_demo_json(home: Path) -> None:
    result = run_cli(home, "play", "demo", "--json")
    assert result.returncode == 0, result.explain()
    out = result.json
    _assert_flow_json(out)
    assert out["status"] == "completed"
    assert out["exit_code"] == 0
    assert [n["id"] for n in out["nodes"]] == DEMO_NODES
    assert all(n["kind"] == "planned" and n["status"] == "completed" for n in out["nodes"])
    ckpt = out["checkpoint"]
    assert ckpt["persisted"] is True and ckpt["error"] is None
    assert ckpt["version"] == 3  # the CLI writes version 3 by default
    path = Path(ckpt["path"])
    assert path == home / "runs" / out["run_id"] / "checkpoint.json"
    state, report = load_checkpoint(path)
    assert report["status"] == "clean"
    assert set(state["ops"]) == set(DEMO_NODES)
    # progress goes to stderr, the JSON object alone to stdout
    assert result.stdout.count("\n") == 1


def test_home_from_environment(tmp_path: Path) -> None:
    home = tmp_path / "envhome"
    result = run_cli(None, "play", "demo", "--json", env=child_env(STEERFLOW_HOME=str(home)))
    assert result.returncode == 0, result.explain()
    assert Path(result.json["checkpoint"]["path"]).is_relative_to(home)
    listed = run_cli(None, "runs", "--json", env=child_env(STEERFLOW_HOME=str(home)))
    assert [r["run_id"] for r in listed.json["runs"]] == [result.json["run_id"]]


def test_flow_plan_file_yaml_and_json(home: Path, tmp_path: Path) -> None:
    yaml_plan = chain_plan(tmp_path / "chain.yaml")
    result = run_cli(home, "flow", "--plan", yaml_plan, "--json")
    assert result.returncode == 0, result.explain()
    out = result.json
    _assert_flow_json(out)
    assert node_status(out) == {"a": "completed", "b": "completed", "c": "completed"}

    json_plan = tmp_path / "plan.json"
    json_plan.write_text(
        json.dumps({"plan": [{"agent_id": "only", "instruction": "do it", "assignee": "x"}]})
    )
    result = run_cli(home, "flow", "--plan", json_plan, "--json")
    assert result.returncode == 0, result.explain()
    assert result.json["nodes"] == [
        {"id": "only", "kind": "planned", "status": "completed", "assignee": "x"}
    ]
    runs = run_cli(home, "runs", "--json").json["runs"]
    assert len(runs) == 2
    assert runs[0]["run_id"] == result.json["run_id"]  # newest first
    for row in runs:
        assert set(row) >= {"session_id", "run_id", "kind", "status", "created_at"}
        assert row["status"] == "completed" and row["kind"] == "flow"


# -- exit codes -------------------------------------------------------------------------------


def test_failed_node_exits_1_and_skips_dependents(home: Path, tmp_path: Path) -> None:
    plan = chain_plan(tmp_path / "chain.yaml")
    script = write_yaml(tmp_path / "script.yaml", {"b": {"fail": "scripted failure of b"}})
    result = run_cli(home, "flow", "--plan", plan, "--model", f"script:{script}", "--json")
    assert result.returncode == 1, result.explain()
    out = result.json
    assert out["status"] == "failed" and out["exit_code"] == 1
    assert node_status(out) == {"a": "completed", "b": "failed", "c": "skipped"}
    failed = next(n for n in out["nodes"] if n["id"] == "b")
    assert "scripted failure of b" in failed.get("error", "")
    assert run_cli(home, "runs", "--json").json["runs"][0]["status"] == "failed"


def test_bad_plan_file_exits_2_naming_file_line_and_field(home: Path, tmp_path: Path) -> None:
    plan = tmp_path / "bad.yaml"
    plan.write_text(
        "name: bad\n"
        "plan:\n"
        "  - agent_id: a\n"
        "    instruction: one\n"
        "  - agent_id: b\n"
        "    instruction: two\n"
        "    colour: blue\n"
    )
    result = run_cli(home, "flow", "--plan", plan)
    assert result.returncode == 2, result.explain()
    assert f"{plan}:7" in result.stderr
    assert "colour" in result.stderr and "unknown field" in result.stderr
    assert _run_dirs(home) == []

    as_json = run_cli(home, "flow", "--plan", plan, "--json")
    assert as_json.returncode == 2
    assert as_json.json["exit_code"] == 2


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("plan:\n  - {agent_id: a, instruction: x}\n  - {agent_id: a, instruction: y}\n", "'a'"),
        ("plan:\n  - {agent_id: a, instruction: x, depends_on: [ghost]}\n", "ghost"),
        (
            "plan:\n  - {agent_id: a, instruction: x, depends_on: [b]}\n"
            "  - {agent_id: b, instruction: y, depends_on: [a]}\n",
            "cycle",
        ),
        ("plan:\n  - {agent_id: a, instruction: x}\n  - {agent_id: 'b c', instruction: y}\n", ":3"),
    ],
    ids=["duplicate", "unknown-dep", "cycle", "bad-agent-id"],
)
def test_invalid_plans_exit_2(home: Path, tmp_path: Path, text: str, needle: str) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(text)
    result = run_cli(home, "flow", "--plan", plan)
    assert result.returncode == 2, result.explain()
    assert str(plan) in result.stderr and needle in result.stderr
    assert _run_dirs(home) == []


@pytest.mark.parametrize(
    "args",
    [
        ["flow", "--no-such-flag"],
        ["flow", "--plan", "/nonexistent/plan.yaml"],
        ["play", "demo", "--concurrency", "0"],
        ["play", "demo", "--checkpoint-version", "7"],
        ["play", "demo", "--model", "no-such-model"],
        ["play", "no-such-playbook"],
    ],
    ids=[
        "unknown-flag",
        "missing-plan",
        "bad-concurrency",
        "bad-ckpt-version",
        "bad-model",
        "unknown-playbook",
    ],
)
def test_usage_errors_exit_2(home: Path, args: list[str]) -> None:
    result = run_cli(home, *args)
    assert result.returncode == 2, result.explain()
    assert _run_dirs(home) == []


def test_show_unknown_id_exits_3(home: Path) -> None:
    assert run_cli(home, "play", "demo").returncode == 0
    result = run_cli(home, "show", "f" * 32, "--json")
    assert result.returncode == 3, result.explain()
    assert result.json["exit_code"] == 3
    assert run_cli(home, "show", "no-such-run").returncode == 3


# -- dry run, graph, checkpoint shape ---------------------------------------------------------


def test_dry_run_creates_no_run_and_lists_nodes(home: Path) -> None:
    result = run_cli(home, "play", "demo", "--dry-run", "--json")
    assert result.returncode == 0, result.explain()
    out = result.json
    assert [n["id"] for n in out["nodes"]] == DEMO_NODES
    assert all(n["status"] == "pending" for n in out["nodes"])
    assert out["run_id"] is None and out["session_id"] is None
    assert _run_dirs(home) == []
    assert run_cli(home, "runs", "--json").json == {"runs": []}

    text = run_cli(home, "play", "demo", "--dry-run")
    assert text.returncode == 0
    for node in DEMO_NODES:
        assert node in text.stdout + text.stderr
    assert _run_dirs(home) == []


def test_show_graph_writes_mermaid(home: Path) -> None:
    result = run_cli(home, "play", "demo", "--show-graph", "--json")
    assert result.returncode == 0, result.explain()
    graph = home / "runs" / result.json["run_id"] / "graph.mmd"
    text = graph.read_text()
    assert text.startswith("flowchart")
    for node in DEMO_NODES:
        assert node.replace("-", "_") in text
    assert re.search(r"n_scope\s+-->\s+n_angle_tools", text)
    assert "draft" in result.stderr  # the DAG is printed too (on stderr under --json)


def test_checkpoint_v2_has_the_d4_shape(home: Path, tmp_path: Path) -> None:
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "plan": [
                {"agent_id": "lead", "assignee": "boss", "instruction": "start"},
                {"agent_id": "tail", "instruction": "end", "depends_on": ["lead"]},
            ]
        },
    )
    script = write_yaml(
        tmp_path / "script.yaml",
        {
            "lead": {
                "response": "lead done",
                "spawn": [{"agent_id": "extra", "assignee": "helper", "instruction": "help"}],
            }
        },
    )
    result = run_cli(
        home,
        "flow",
        "--plan",
        plan,
        "--model",
        f"script:{script}",
        "--reactive",
        "all",
        "--max-ops",
        "5",
        "--checkpoint-version",
        "2",
        "--json",
    )
    assert result.returncode == 0, result.explain()
    out = result.json
    assert out["checkpoint"]["version"] == 2
    raw = json.loads(Path(out["checkpoint"]["path"]).read_text())
    assert set(raw) >= {
        "version",
        "session_id",
        "prompt",
        "plan",
        "flow_context",
        "ops",
        "spawned",
        "config",
        "max_spawn",
    }
    assert raw["version"] == 2
    assert raw["session_id"] == out["session_id"]
    assert isinstance(raw["prompt"], str)
    assert [(p["agent_id"], p["dep_indices"], p["assignee"]) for p in raw["plan"]] == [
        ("lead", [], "boss"),
        ("tail", [0], None),
    ]
    assert isinstance(raw["flow_context"], dict)
    assert set(raw["ops"]) == {"lead", "tail"}
    for agent_id, entry in raw["ops"].items():
        assert set(entry) >= {"agent_id", "status", "response", "result_digest"}
        assert entry["agent_id"] == agent_id
        assert entry["status"] == "completed"
        assert re.match(r"^blake2b:[0-9a-f]{64}$", entry["result_digest"])
    assert raw["ops"]["lead"]["response"] == "lead done"
    assert len(raw["spawned"]) == 1
    spawned = raw["spawned"][0]
    assert set(spawned) >= {
        "node_id",
        "status",
        "response",
        "operation",
        "assignee",
        "instruction",
        "parent_id",
        "spawn_id",
        "context",
    }
    assert spawned["spawn_id"] == "extra"
    assert spawned["assignee"] == "helper"
    assert spawned["status"] == "completed"
    assert HEX32.match(spawned["node_id"]) and spawned["node_id"] != "extra"
    assert set(raw["config"]) >= {"model_spec", "reactive_spec", "max_ops"}
    assert raw["config"]["max_ops"] == 5
    assert raw["config"]["model_spec"] == f"script:{script}"
    assert raw["max_spawn"] == 3  # max(0, 5 - 2)

    # the loader returns the same logical shape
    state, report = load_checkpoint(Path(out["checkpoint"]["path"]))
    assert report["status"] == "clean" and report["checkpoint_version"] == 2
    assert state["ops"]["lead"]["response"] == "lead done"


def test_default_v3_checkpoint_loads_to_the_same_shape(home: Path, tmp_path: Path) -> None:
    result = run_cli(home, "flow", "--plan", chain_plan(tmp_path / "c.yaml"), "--json")
    assert result.returncode == 0, result.explain()
    state, report = load_checkpoint(Path(result.json["checkpoint"]["path"]))
    assert report["checkpoint_version"] == 3
    assert set(state) >= {
        "session_id",
        "prompt",
        "plan",
        "flow_context",
        "ops",
        "spawned",
        "config",
        "max_spawn",
    }
    assert state["max_spawn"] == 20
    assert [p["dep_indices"] for p in state["plan"]] == [[], [0], [1]]


# -- budgets ---------------------------------------------------------------------------------------


def _spawner(tmp_path: Path, count: int) -> tuple[Path, Path]:
    plan = chain_plan(tmp_path / "plan.yaml", ("root", "mid", "end"))
    spawns = [{"agent_id": f"kid-{i:02d}", "instruction": f"child {i}"} for i in range(count)]
    script = write_yaml(tmp_path / "script.yaml", {"root": {"spawn": spawns}})
    return plan, script


def test_unset_max_ops_allows_20_spawns(home: Path, tmp_path: Path) -> None:
    plan, script = _spawner(tmp_path, 21)
    result = run_cli(
        home, "flow", "--plan", plan, "--model", f"script:{script}", "--reactive", "all", "--json"
    )
    assert result.returncode == 0, result.explain()
    out = result.json
    spawned = [n for n in out["nodes"] if n["kind"] == "spawned"]
    assert len(spawned) == 20
    assert all(n["status"] == "completed" for n in spawned)
    assert [r["reason"] for r in out["spawn_rejections"]] == ["max_spawn_exceeded"]
    assert out["spawn_rejections"][0]["agent_id"] == "kid-20"
    assert "max_spawn_exceeded" in result.stderr


def test_max_ops_5_with_3_planned_allows_2_spawns(home: Path, tmp_path: Path) -> None:
    plan, script = _spawner(tmp_path, 4)
    result = run_cli(
        home,
        "flow",
        "--plan",
        plan,
        "--model",
        f"script:{script}",
        "--reactive",
        "all",
        "--max-ops",
        "5",
        "--json",
    )
    assert result.returncode == 0, result.explain()
    out = result.json
    assert [n["id"] for n in out["nodes"] if n["kind"] == "spawned"] == ["kid-00", "kid-01"]
    assert [r["reason"] for r in out["spawn_rejections"]] == ["max_spawn_exceeded"] * 2


# -- a running flow, seen from other processes ------------------------------------------------


#: Run in place of ``python -m steerflow`` by the listing test: it loads every module the
#: ``flow`` command imports, writes the wall-clock time at which that finished into the file
#: named by ``$SF_TEST_LOADED_AT``, then runs the command line exactly as ``python -m steerflow``
#: does (same ``sys.argv[1:]``, same exit code).
_TIMED_CLI = """
import os, sys, time
import steerflow.cli, steerflow.cli._progress, steerflow.executor, steerflow.orchestrate
with open(os.environ["SF_TEST_LOADED_AT"], "w") as out:
    out.write(repr(time.time()))
steerflow.cli.cli_exit()
"""
CHAIN = ("a", "b", "c")


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time ``pid`` has used so far (``/proc/<pid>/stat``, Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _chain_state(running: str) -> dict[str, str]:
    """The only statuses a linear chain may show while ``running`` runs."""
    at = CHAIN.index(running)
    return {
        key: "completed" if i < at else "running" if i == at else "pending"
        for i, key in enumerate(CHAIN)
    }


def test_running_flow_is_listed_within_1s_and_shows_live_status(home: Path, tmp_path: Path) -> None:
    """CONTRACT: `runs --json` lists a running flow as ``running`` within one second of its start.

    Wall time from ``Popen`` is mostly the child's interpreter start-up and imports, which a
    loaded machine stretches to well over a second (0.25 s of CPU becomes 1 s with six busy
    loops on two cores). So the second is checked where steerflow decides it: the session row
    must be written at most 1 s after the child finished loading its code (wall clock, both
    stamps taken by the child, so a slow test process cannot inflate it), and everything the
    child did before it was listed, interpreter and imports included, must cost at most 1 s
    of CPU, which is what an idle machine turns into wall time.
    """
    plan = chain_plan(tmp_path / "chain.yaml", CHAIN)
    loaded_file = tmp_path / "loaded-at"
    args = ["--home", home, "flow", "--plan", plan, "--model", "echo:delay=1", "--json"]
    proc = subprocess.Popen(
        [PYTHON, "-c", _TIMED_CLI, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(SF_TEST_LOADED_AT=str(loaded_file)),
    )
    try:
        # `runs --json` runs in this process: a poller interpreter's start-up would only add
        # noise. The child's CPU time is read the moment the run is first seen.
        def listed() -> tuple[dict[str, Any], float] | None:
            rows = [r for r in runs_in_process(home) if r["status"] == "running"]
            if not rows:
                if proc.poll() is not None:
                    raise AssertionError(finish(proc).explain())
                return None
            return rows[0], _cpu_seconds(proc.pid)

        row, cpu = wait_for(listed, timeout=10, interval=0.02, what="running run")
        assert RUN_ID.match(row["run_id"]) and HEX32.match(row["session_id"])
        loaded_at = float(loaded_file.read_text())  # written before the CLI started
        registered = row["created_at"] - loaded_at
        assert 0 <= registered <= 1.0, f"session row {registered:.3f} s after the code loaded"
        assert cpu <= 1.0, f"{cpu:.2f} s of CPU before the run was listed"

        # Live node status, seen from another process while the chain runs. Each node runs
        # for 1 s; a test process stalled past one of them may first see a later node, so
        # any running node is accepted, but the snapshot must be exactly what the chain
        # allows then, and a second, later snapshot must show it progressed.
        def live(target: str, after: int) -> dict[str, Any] | None:
            view = show_in_process(home, target)
            running = [k for k, s in node_status(view).items() if s == "running"]
            return view if running and CHAIN.index(running[0]) > after else None

        seen = -1
        for target in (row["session_id"], row["run_id"]):  # look it up both ways
            view = wait_for(
                functools.partial(live, target, seen), timeout=10, what=f"a node after #{seen}"
            )
            node = next(k for k, s in node_status(view).items() if s == "running")
            assert node_status(view) == _chain_state(node), view
            assert view["status"] == "running", view
            assert view["session_id"] == row["session_id"]
            assert {n["kind"] for n in view["nodes"]} == {"planned"}
            seen = CHAIN.index(node)
        result = finish(proc, timeout=15)
    finally:
        stop(proc)
    assert result.returncode == 0, result.explain()
    final = show_in_process(home, row["session_id"])
    assert final["status"] == "completed"
    assert node_status(final) == {"a": "completed", "b": "completed", "c": "completed"}
    shown = run_cli(home, "show", row["run_id"][:12], "--json")
    assert shown.returncode == 0, shown.explain()
    assert set(shown.json) >= {
        "session_id",
        "run_id",
        "status",
        "phase",
        "nodes",
        "checkpoint",
        "checkpoint_recovery",
    }
    for node in shown.json["nodes"]:
        assert set(node) >= {"id", "kind", "status", "assignee"}


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_signal_persists_completed_work(
    home: Path, tmp_path: Path, signum: signal.Signals, code: int
) -> None:
    plan = chain_plan(tmp_path / "chain.yaml")
    proc = start_cli(home, "flow", "--plan", plan, "--model", "echo:delay=2", "--json")
    try:

        def first_done() -> dict[str, Any] | None:
            runs = runs_in_process(home)
            if not runs:
                return None
            view = show_in_process(home, runs[0]["session_id"])
            return view if node_status(view).get("a") == "completed" else None

        view = wait_for(first_done, timeout=10, what="node a completed")
        proc.send_signal(signum)
        result = finish(proc, timeout=15)
    finally:
        stop(proc)
    assert result.returncode == code, result.explain()
    out = result.json
    assert out["status"] == "interrupted" and out["exit_code"] == code
    assert out["checkpoint"]["persisted"] is True
    status = node_status(out)
    assert status["a"] == "completed"
    assert status["c"] == "pending"
    state, report = load_checkpoint(Path(out["checkpoint"]["path"]))
    assert report["status"] in ("clean", "recovered_prefix")
    assert state["ops"]["a"]["status"] == "completed"
    assert "c" not in state["ops"]
    runs = run_cli(home, "runs", "--json").json["runs"]
    assert runs[0]["session_id"] == view["session_id"]
    assert runs[0]["status"] == "interrupted"


def test_sigkilled_flow_reads_interrupted_never_running(home: Path, tmp_path: Path) -> None:
    plan = chain_plan(tmp_path / "chain.yaml")
    proc = start_cli(home, "flow", "--plan", plan, "--model", "echo:delay=2")
    try:
        rows = wait_for(
            lambda: [r for r in runs_in_process(home) if r["status"] == "running"] or None,
            timeout=10,
            what="running run",
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        stop(proc)
    assert proc.returncode == -signal.SIGKILL
    session_id = rows[0]["session_id"]
    listed = run_cli(home, "runs", "--json")
    assert listed.returncode == 0, listed.explain()
    assert [(r["session_id"], r["status"]) for r in listed.json["runs"]] == [
        (session_id, "interrupted")
    ]
    shown = run_cli(home, "show", session_id, "--json")
    assert shown.returncode == 0, shown.explain()
    assert shown.json["status"] == "interrupted"


@pytest.mark.parametrize("version", ["2", "3"])
def test_a_run_directory_keeps_no_empty_staging_directory(home: Path, version: str) -> None:
    """The writer's staging directory is needed only while it writes: a finished run and
    its resume leave just their files (issue 26 item 5)."""
    result = run_cli(home, "play", "demo", "--checkpoint-version", version, "--json")
    assert result.returncode == 0, result.explain()
    resumed = run_cli(home, "resume", result.json["run_id"], "--json")
    assert resumed.returncode == 0, resumed.explain()  # every node replayed
    run_dirs = _run_dirs(home)
    assert len(run_dirs) == 2
    for run_dir in run_dirs:
        names = set(os.listdir(run_dir))
        assert ".checkpoint.json.staging" not in names and "checkpoint.json" in names, names
