"""Reading what a run produced: ``show RUN NODE`` and ``result RUN`` (issue 18), end to end.

Every check drives the real command line in a subprocess against a temporary home; the
recorded responses are read back from the checkpoint with the loader to compare.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from flow_support import (
    CliResult,
    child_env,
    cli_args,
    cli_in_process,
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
from resume_support import response_of, run_dirs, single_run

from steerflow.home import new_run_id


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A steerflow home that does not exist yet."""
    return tmp_path / "home"


def _plan(path: Path, nodes: list[tuple[str, list[str]]]) -> Path:
    entries: list[dict[str, Any]] = []
    for agent_id, deps in nodes:
        entry: dict[str, Any] = {"agent_id": agent_id, "instruction": f"step {agent_id}"}
        if deps:
            entry["depends_on"] = deps
        entries.append(entry)
    return write_yaml(path, {"name": "t", "plan": entries})


def _flow(home: Path, plan: Path, script: Path, *extra: object) -> CliResult:
    return run_cli(home, "flow", "--plan", plan, "--model", f"script:{script}", *extra)


def _show(home: Path, run: str, node: str) -> dict[str, Any]:
    result = run_cli(home, "show", run, node, "--json")
    assert result.returncode == 0, result.explain()
    return result.json


def _raw_stdout(home: Path, *args: str) -> tuple[int, bytes, bytes]:
    """Run the CLI keeping stdout as bytes (text mode would translate line endings)."""
    proc = subprocess.run(
        cli_args(home, list(args)), capture_output=True, env=child_env(), timeout=60, check=False
    )
    return proc.returncode, proc.stdout, proc.stderr


# -- a completed planned run ---------------------------------------------------------------


def test_completed_run_node_detail_result_and_listing(home: Path, tmp_path: Path) -> None:
    plan = _plan(tmp_path / "plan.yaml", [("a", []), ("b", ["a"]), ("c", ["a"])])
    script = write_yaml(
        tmp_path / "s.yaml",
        {"a": {"response": "alpha facts"}, "b": {"response": "beta answer"}},
    )
    flow = _flow(home, plan, script, "--json")
    assert flow.returncode == 0, flow.explain()
    run = flow.json["run_id"]
    c_response = response_of(single_run(home), "c")
    # Sinks (b and c, nobody depends on them) in plan order, each under its id.
    expected = f"### b\nbeta answer\n\n### c\n{c_response}"
    assert flow.json["result"] == expected

    b = _show(home, run, "b")
    assert (b["id"], b["kind"], b["status"]) == ("b", "planned", "completed")
    assert b["model"] == f"script:{script}"
    assert b["response"] == "beta answer" == response_of(single_run(home), "b")
    # The instruction as the provider received it: own text plus the dependency's result.
    assert b["instruction"].startswith("step b\n\n[RESULTS OF DEPENDENCIES]\n### a (completed)")
    assert "alpha facts" in b["instruction"]
    assert b["started_at"] <= b["ended_at"] and b["duration_s"] is not None
    assert b["depends_on"] == ["a"] and b["parent"] is None and b["spawned"] == []
    assert b["replayed"] is False and b["error"] is None
    assert "escalation_attempt" in b

    human = run_cli(home, "show", run, "b")
    assert human.returncode == 0, human.explain()
    for line in ("status: completed", f"model: script:{script}", "response:", "beta answer"):
        assert line in human.stdout, human.explain()
    assert "instruction (as the provider received it):\nstep b\n" in human.stdout

    result = run_cli(home, "result", run)
    assert result.returncode == 0, result.explain()
    assert result.stdout == expected + "\n"
    as_json = run_cli(home, "result", run, "--json")
    assert as_json.returncode == 0
    assert as_json.json["text"] == expected and as_json.json["source"] == "sinks"
    assert [n["id"] for n in as_json.json["nodes"]] == ["b", "c"]

    overview = run_cli(home, "show", run)
    assert overview.returncode == 0, overview.explain()
    header = next(line for line in overview.stdout.splitlines() if "STATUS" in line)
    assert "DURATION" in header and "MODEL" in header
    assert any(
        line.split()[:2] == ["completed", "planned"] and f"script:{script}" in line
        for line in overview.stdout.splitlines()
    ), overview.stdout
    assert "summary: 3 completed, 0 failed, 0 skipped, 0 pending" in overview.stdout
    summary = run_cli(home, "show", run, "--json").json["summary"]
    assert (summary["completed"], summary["total"]) == (3, 3)

    listing = run_cli(home, "runs")
    first, second = listing.stdout.splitlines()[:2]
    assert first.split() == ["RUN", "STATUS", "KIND", "DURATION", "SESSION", "NAME"]
    assert second.startswith(run) and second.split()[3].endswith("s")
    assert run_cli(home, "runs", "--json").json["runs"][0]["duration_s"] >= 0


def test_flow_prints_at_most_40_result_lines(home: Path, tmp_path: Path) -> None:
    plan = _plan(tmp_path / "plan.yaml", [("only", [])])
    long = "\n".join(f"line {i}" for i in range(1, 101))
    script = write_yaml(tmp_path / "s.yaml", {"only": {"response": long}})
    flow = _flow(home, plan, script)
    assert flow.returncode == 0, flow.explain()
    run = single_run(home).name
    tail = flow.stdout.split("result:\n", 1)[1].splitlines()
    assert tail[:40] == ["### only", *[f"line {i}" for i in range(1, 40)]]
    assert tail[40:] == [f"... 61 more lines: steerflow result {run}"]


# -- exact bytes, escaped terminal text ----------------------------------------------------


def test_raw_is_byte_equal_and_human_output_is_escaped(home: Path, tmp_path: Path) -> None:
    reply = "héllo \x1b]0;pwned\x07 \x1b[31mred\x1b[0m\ttab\r\nsecond line  \n\n  "
    plan = _plan(tmp_path / "plan.yaml", [("a", [])])
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"a": {"response": reply}}), encoding="utf-8")
    flow = _flow(home, plan, script, "--json")
    assert flow.returncode == 0, flow.explain()
    run = flow.json["run_id"]
    recorded = response_of(single_run(home), "a")
    assert recorded == reply

    code, out, err = _raw_stdout(home, "show", run, "a", "--raw")
    assert code == 0, err
    assert out == recorded.encode("utf-8")

    human = run_cli(home, "show", run, "a")
    assert human.returncode == 0, human.explain()
    assert "\x1b" not in human.stdout and "\x07" not in human.stdout
    assert "\\x1b]0;pwned\\x07" in human.stdout and "\\x0d" in human.stdout
    result = run_cli(home, "result", run)
    assert "\x1b" not in result.stdout and "\\x1b[31mred" in result.stdout
    # --json stays exact.
    assert _show(home, run, "a")["response"] == reply


# -- spawned nodes, prefixes, unknown and ambiguous ids ------------------------------------


def test_spawned_nodes_links_prefixes_and_refusals(home: Path, tmp_path: Path) -> None:
    plan = _plan(tmp_path / "plan.yaml", [("review", [])])
    spawns = [
        {"agent_id": "fix-1", "assignee": "coder", "instruction": "fix the first thing"},
        {"agent_id": "fix-2", "assignee": "coder", "instruction": "fix the second thing"},
    ]
    script = write_yaml(
        tmp_path / "s.yaml",
        {"review": {"response": "two fixes needed", "spawn": spawns}, "fix-2": {"response": "ok"}},
    )
    flow = _flow(home, plan, script, "--reactive", "all", "--json")
    assert flow.returncode == 0, flow.explain()
    run = flow.json["run_id"]

    review = _show(home, run, "review")
    assert review["spawned"] == ["fix-1", "fix-2"] and review["parent"] is None
    fix = _show(home, run, "fix-2")
    assert (fix["kind"], fix["parent"], fix["assignee"]) == ("spawned", "review", "coder")
    assert fix["instruction"].startswith("fix the second thing")
    assert "two fixes needed" in fix["instruction"]  # the emitter's result, as received
    assert fix["response"] == "ok" and fix["model"] == f"script:{script}"
    human = run_cli(home, "show", run, "fix-1")
    assert "spawned by: review" in human.stdout, human.explain()
    assert _show(home, run, "fix-1")["id"] == "fix-1"
    assert _show(home, run, "rev")["id"] == "review"  # unambiguous prefix

    ambiguous = run_cli(home, "show", run, "fix", "--json")
    assert ambiguous.returncode == 3, ambiguous.explain()
    assert ambiguous.json["error"]["code"] == "ambiguous-id"
    assert "fix-1" in ambiguous.stderr and "fix-2" in ambiguous.stderr
    unknown = run_cli(home, "show", run, "nope")
    assert unknown.returncode == 3, unknown.explain()
    assert "nope" in unknown.stderr and "review" in unknown.stderr
    assert run_cli(home, "show", run, "nope", "--json").json["error"]["code"] == "unknown-id"

    # The emitter is depended on by its children, so the children are the result.
    result = run_cli(home, "result", run, "--json")
    assert result.returncode == 0, result.explain()
    assert [n["id"] for n in result.json["nodes"]] == ["fix-1", "fix-2"]


def test_result_of_a_run_without_checkpoint_is_refused(home: Path) -> None:
    run_dir = home / "runs" / new_run_id()
    run_dir.mkdir(parents=True)
    result = run_cli(home, "result", run_dir.name, "--json")
    assert result.returncode == 3, result.explain()
    assert result.json["error"]["code"] == "checkpoint-recovery-refused"


# -- a failed node -------------------------------------------------------------------------


def test_failed_node_detail_and_partial_result(home: Path, tmp_path: Path) -> None:
    plan = _plan(tmp_path / "plan.yaml", [("a", []), ("b", ["a"]), ("c", [])])
    script = write_yaml(
        tmp_path / "s.yaml", {"b": {"fail": "provider exploded"}, "c": {"response": "c done"}}
    )
    flow = _flow(home, plan, script, "--json")
    assert flow.returncode == 1, flow.explain()
    run = flow.json["run_id"]
    assert flow.json["result"] == "### b (failed)\nerror: provider exploded\n\n### c\nc done"

    b = _show(home, run, "b")
    assert (b["status"], b["error"], b["response"]) == ("failed", "provider exploded", None)
    assert b["instruction"].startswith("step b") and b["ended_at"] is not None
    human = run_cli(home, "show", run, "b")
    assert "error:\nprovider exploded" in human.stdout, human.explain()
    raw = run_cli(home, "show", run, "b", "--raw", "--json")
    assert raw.returncode == 3 and raw.json["error"]["code"] == "no-response"

    result = run_cli(home, "result", run)
    assert result.returncode == 1, result.explain()
    assert result.stdout == "### b (failed)\nerror: provider exploded\n\n### c\nc done\n"


# -- a live run, read from another process -------------------------------------------------


def test_live_run_read_midway(home: Path, tmp_path: Path) -> None:
    plan = _plan(tmp_path / "plan.yaml", [("a", []), ("b", ["a"]), ("c", ["b"])])
    script = write_yaml(tmp_path / "s.yaml", {"a": {"response": "first part"}, "b": {"delay": 120}})
    proc = start_cli(home, "flow", "--plan", plan, "--model", f"script:{script}")
    try:

        def b_running() -> str | None:
            dirs = run_dirs(home)
            if not dirs:
                return None
            code, out = cli_in_process(home, "show", dirs[0].name, "b", "--json")
            return dirs[0].name if code == 0 and json.loads(out)["status"] == "running" else None

        run = wait_for(b_running, timeout=30, what="b running")
        a = _show(home, run, "a")
        assert (a["status"], a["response"]) == ("completed", "first part")
        b = _show(home, run, "b")
        assert b["response"] is None and b["ended_at"] is None
        assert b["instruction"].startswith("step b") and "first part" in b["instruction"]
        assert b["model"] == f"script:{script}" and b["started_at"] is not None
        c = _show(home, run, "c")
        assert (c["status"], c["instruction"], c["note"]) == ("pending", None, "has not run yet")
        human = run_cli(home, "show", run, "c")
        assert "has not run yet" in human.stdout, human.explain()
        assert "instruction (as the provider received it): not rendered yet" in human.stdout
        overview = run_cli(home, "show", run)
        assert "1 completed, 0 failed, 0 skipped, 1 pending, 1 running" in overview.stdout

        partial = run_cli(home, "result", run)
        assert partial.returncode == 1, partial.explain()
        assert partial.stdout == "### c (pending)\n(no response)\n"
        assert "running" in partial.stderr
        proc.send_signal(signal.SIGTERM)
        assert finish(proc).returncode == 143
    finally:
        stop(proc)


# -- the operator steer block, as the provider received it -------------------------------


def test_instruction_includes_the_operator_steer_block(home: Path, tmp_path: Path) -> None:
    keys = [f"n{i}" for i in range(1, 9)]
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {"name": "t", "plan": [{"agent_id": k, "instruction": f"step {k}"} for k in keys]},
    )
    script = write_yaml(tmp_path / "s.yaml", {"*": {"delay": 0.75}})
    args = ["--plan", plan, "--model", f"script:{script}", "--concurrency", "1"]
    proc = start_cli(home, "flow", *args)
    try:

        def first_running() -> str | None:
            runs = [r for r in runs_in_process(home) if r["status"] == "running"]
            if not runs:
                return None
            view = show_in_process(home, runs[0]["session_id"])
            return runs[0]["session_id"] if "running" in node_status(view).values() else None

        session = wait_for(first_running, timeout=30, what="the first node running")
        sent = run_cli(home, "ctl", "msg", session, "use the v2 API")
        assert sent.returncode == 0, sent.explain()
        control_id = sent.stdout.splitlines()[0]
        assert finish(proc, timeout=60).returncode == 0
    finally:
        stop(proc)
    run_dir = single_run(home)
    # The script model echoes exactly the instruction it received after "[echo KEY]\n".
    received = {k: str(response_of(run_dir, k)).split("\n", 1)[1] for k in keys}
    steered = [k for k in keys if "[OPERATOR STEER]" in received[k]]
    assert len(steered) == 1, received
    node = _show(home, run_dir.name, steered[0])
    assert node["instruction"] == received[steered[0]]
    assert node["instruction"].startswith("[OPERATOR STEER]\n")
    assert "use the v2 API" in node["instruction"]
    assert node["instruction"].endswith(f"\n\nstep {steered[0]}")
    assert node["steers"] == [control_id]


# -- a resumed run -------------------------------------------------------------------------


def test_resumed_run_shows_replayed_responses_from_the_original(home: Path, tmp_path: Path) -> None:
    plan = _plan(tmp_path / "plan.yaml", [("a", []), ("b", ["a"])])
    script = write_yaml(
        tmp_path / "s.yaml", {"a": {"response": "original a"}, "b": {"fail_once": "flaky"}}
    )
    first = _flow(home, plan, script, "--json")
    assert first.returncode == 1, first.explain()
    source = first.json["run_id"]
    original = _show(home, source, "a")

    again = run_cli(home, "resume", source, "--retry-failed", "--json")
    assert again.returncode == 0, again.explain()
    run = again.json["run_id"]
    assert again.json["result"].startswith("### b\n")

    a = _show(home, run, "a")
    assert a["replayed"] is True
    assert a["replayed_from"]["run_id"] == source
    new_dir = next(d for d in run_dirs(home) if d.name == run)
    assert a["response"] == "original a" == response_of(new_dir, "a")
    # What the original run's provider received, not a new call.
    assert a["instruction"] == original["instruction"] and a["model"] == original["model"]
    assert a["started_at"] == original["started_at"]
    human = run_cli(home, "show", run, "a")
    assert f"completed (replayed: recorded by run {source})" in human.stdout, human.explain()
    assert "original a" in human.stdout
    b = _show(home, run, "b")
    assert b["replayed"] is False and b["status"] == "completed"


# -- result with a synthesis-like sink -----------------------------------------------------


def test_result_of_a_single_joining_sink(home: Path) -> None:
    # The echo planner ends in one node that joins both explorations.
    flow = run_cli(home, "flow", "compare two caching strategies", "--json")
    assert flow.returncode == 0, flow.explain()
    run = flow.json["run_id"]
    result = run_cli(home, "result", run, "--json")
    assert result.returncode == 0, result.explain()
    assert [n["id"] for n in result.json["nodes"]] == ["synthesize"]
    synth = response_of(single_run(home), "synthesize")
    assert result.json["text"] == f"### synthesize\n{synth}" == flow.json["result"]
