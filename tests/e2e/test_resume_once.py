"""One resume per source (issue 10 item 2; docs/decisions.md), across real processes.

Two ``steerflow resume R`` started at the same moment: exactly one proceeds, the other
exits 3 naming the session that holds R, and every pending node runs once. A later
``resume R`` after a resumed run saved a checkpoint is refused naming the newest run of
the chain, unless ``--fork``. A claimer that died before its first checkpoint blocks
nothing. ``runs`` and ``show`` tell who resumed a run.

Invocations are counted from ``<home>/script-invocations.jsonl`` (the ``script:`` model).
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

from flow_support import (
    PYTHON,
    CliResult,
    child_env,
    finish,
    node_status,
    read_invocations,
    run_cli,
    start_cli,
    stop,
    write_yaml,
)
from resume_support import (
    CHECKPOINT,
    Crafted,
    SourceGuard,
    invocation_counts,
    ops_of,
    resume,
    run_dirs,
    run_plan,
    wait_for,
    write_script,
)

from steerflow.checkpoint import load_checkpoint
from steerflow.state import StateDB

BARRIER_CLI = Path(__file__).with_name("barrier_cli.py")
CHAIN = [("a", []), ("b", ["a"]), ("c", ["b"])]


def _claimed(result: CliResult, *fragments: str) -> str:
    """Exit 3, ``resume-claimed``, a message holding every fragment."""
    assert result.returncode == 3, result.explain()
    body = result.json
    assert body["status"] == "refused" and body["exit_code"] == 3, result.explain()
    assert body["error"]["code"] == "resume-claimed", result.explain()
    message = str(body["error"]["message"])
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def _ok(result: CliResult) -> dict[str, Any]:
    assert result.returncode == 0, result.explain()
    body = result.json
    assert body["status"] == "completed", result.explain()
    return body


def _crafted_source(tmp_path: Path, script: dict[str, Any]) -> tuple[Path, Path, Path]:
    """A v2 source whose ``a`` completed and ``b -> c`` are pending: (home, run dir, script)."""
    home = tmp_path / "home"
    script_path = write_script(tmp_path / "script.yaml", script)
    crafted = Crafted(script_path, concurrency=1)
    crafted.node("a")
    crafted.node("b", "a")
    crafted.node("c", "b")
    crafted.done("a", "A")
    return home, crafted.write(home), script_path


def _chain(tmp_path: Path) -> tuple[Path, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """R (c failed) -> H1 = resume R --retry-failed -> H2 = resume H1: (home, R, H1, H2)."""
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", {"c": {"fail_once": "transient"}})
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "name": "once",
            "plan": [
                {"agent_id": k, "instruction": f"step {k}", **({"depends_on": d} if d else {})}
                for k, d in CHAIN
            ],
        },
    )
    source = run_plan(home, plan, script)
    assert source.returncode == 1, source.explain()
    first = _ok(resume(home, source.json["run_id"], "--retry-failed", "--json"))
    second = _ok(resume(home, first["run_id"], "--json"))
    return home, source.json, first, second


def _session_ids(home: Path) -> list[str]:
    with StateDB.open(home, create=False) as db:
        return [row.id for row in db.list_sessions(limit=None)]


def _b_checkpointed(home: Path, source: Path) -> bool:
    """Whether the (one) resumed run's checkpoint records b completed."""
    for run in run_dirs(home):
        if run != source and (run / CHECKPOINT).is_file():
            state, _ = load_checkpoint(run / CHECKPOINT)
            return (state["ops"].get("b") or {}).get("status") == "completed"
    return False


def _start_at_barrier(
    home: Path, barrier: Path, ready: Path, *args: object
) -> subprocess.Popen[str]:
    argv = [PYTHON, str(BARRIER_CLI), str(barrier), str(ready), "--home", str(home)]
    return subprocess.Popen(
        [*argv, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def test_two_resumes_at_the_same_moment_exactly_one_proceeds(tmp_path: Path) -> None:
    # b takes a while, so the winner is still running when the loser claims.
    home, run_dir, _ = _crafted_source(tmp_path, {"b": {"delay": 1.0}})
    guard = SourceGuard.of(run_dir)
    barrier = tmp_path / "go"
    ready = [tmp_path / "ready-1", tmp_path / "ready-2"]
    procs = [_start_at_barrier(home, barrier, r, "resume", run_dir.name, "--json") for r in ready]
    try:
        wait_for(lambda: all(r.exists() for r in ready), timeout=60, what="both at the barrier")
        barrier.touch()
        results = [finish(proc, timeout=90) for proc in procs]
    finally:
        for proc in procs:
            stop(proc)
    codes = sorted(r.returncode for r in results)
    assert codes == [0, 3], "\n".join(r.explain() for r in results)
    winner = next(r for r in results if r.returncode == 0)
    loser = next(r for r in results if r.returncode == 3)
    body = _ok(winner)
    _claimed(loser, body["session_id"], run_dir.name)
    assert node_status(body) == dict.fromkeys("abc", "completed")
    assert invocation_counts(home) == {"b": 1, "c": 1}, "a pending node ran twice"
    guard.assert_unchanged()
    # The loser left nothing behind: no session row, no run directory.
    assert _session_ids(home) == [body["session_id"]]
    assert [p.name for p in run_dirs(home)] == sorted([run_dir.name, body["run_id"]])


def test_a_later_resume_is_refused_naming_the_newest_run_of_the_chain(tmp_path: Path) -> None:
    home, source, first, second = _chain(tmp_path)
    dirs = run_dirs(home)
    guard = SourceGuard.of(*dirs)
    calls = len(read_invocations(home))
    for flags in ((), ("--dry-run",)):
        refused = resume(home, source["run_id"], "--retry-failed", *flags, "--json")
        _claimed(
            refused,
            source["run_id"],
            first["run_id"],
            first["session_id"],
            f"steerflow resume {second['run_id']}",
            "--fork",
        )
    # The middle of the chain is continued too: it points at the same newest run.
    _claimed(resume(home, first["run_id"], "--json"), f"steerflow resume {second['run_id']}")
    guard.assert_unchanged()
    assert run_dirs(home) == dirs, "a refused resume left a run directory"
    assert len(read_invocations(home)) == calls, "a refused resume invoked a node"
    # The newest run itself is resumable (all done: nothing runs).
    third = _ok(resume(home, second["run_id"], "--json"))
    assert ops_of(Path(third["run_dir"])) == ops_of(Path(second["run_dir"]))
    assert len(read_invocations(home)) == calls


def test_fork_branches_from_an_already_resumed_run(tmp_path: Path) -> None:
    home, source, first, _ = _chain(tmp_path)
    source_dir = home / "runs" / source["run_id"]
    guard = SourceGuard.of(source_dir)
    assert invocation_counts(home) == {"a": 1, "b": 1, "c": 2}
    fork = _ok(resume(home, source["run_id"], "--retry-failed", "--fork", "--json"))
    guard.assert_unchanged()
    assert fork["resumed_from"] == source["session_id"]
    assert invocation_counts(home) == {"a": 1, "b": 1, "c": 3}, "the fork runs c again"
    shown = run_cli(home, "show", source["run_id"], "--json")
    assert shown.returncode == 0, shown.explain()
    by = [(b["run_id"], b["fork"]) for b in shown.json["resumed_by"]]
    assert by == [(first["run_id"], False), (fork["run_id"], True)]
    # A fork does not reopen the source for plain resumes.
    _claimed(resume(home, source["run_id"], "--retry-failed", "--json"), first["run_id"])


def test_a_claimer_killed_before_its_first_checkpoint_does_not_block(tmp_path: Path) -> None:
    home, run_dir, _ = _crafted_source(tmp_path, {})
    guard = SourceGuard.of(run_dir)
    killed = run_cli(
        home,
        "resume",
        run_dir.name,
        "--json",
        env=child_env(STEERFLOW_FAULT="exit:after:resume-claim"),
    )
    assert killed.returncode == 137, killed.explain()  # died holding the claim
    dead_dir = next(p for p in run_dirs(home) if p != run_dir)
    assert not (dead_dir / CHECKPOINT).exists()
    assert read_invocations(home) == []
    body = _ok(resume(home, run_dir.name, "--json"))
    guard.assert_unchanged()
    assert invocation_counts(home) == {"b": 1, "c": 1}
    shown = run_cli(home, "show", run_dir.name, "--json")
    assert [b["run_id"] for b in shown.json["resumed_by"]] == [body["run_id"]]
    runs = {r["run_id"]: r for r in run_cli(home, "runs", "--json").json["runs"]}
    assert runs[dead_dir.name]["status"] == "interrupted"


def test_a_claimer_killed_after_its_first_checkpoint_is_the_run_to_resume(tmp_path: Path) -> None:
    home, run_dir, script = _crafted_source(tmp_path, {"c": {"delay": 60}})
    guard = SourceGuard.of(run_dir)
    proc = start_cli(home, "resume", run_dir.name)
    try:
        wait_for(lambda: invocation_counts(home)["c"] == 1, timeout=60, what="c in flight")
        wait_for(lambda: _b_checkpointed(home, run_dir), timeout=30, what="b checkpointed")
        proc.send_signal(signal.SIGKILL)
        assert finish(proc, timeout=30).returncode == -signal.SIGKILL
    finally:
        stop(proc)
    killed_dir = next(p for p in run_dirs(home) if p != run_dir)
    state, _ = load_checkpoint(killed_dir / CHECKPOINT)
    assert state["ops"]["b"]["status"] == "completed"
    calls = len(read_invocations(home))
    _claimed(
        resume(home, run_dir.name, "--json"),
        killed_dir.name,
        f"steerflow resume {killed_dir.name}",
    )
    guard.assert_unchanged()
    assert len(read_invocations(home)) == calls
    write_script(script, {})  # c is quick now
    body = _ok(resume(home, killed_dir.name, "--json"))
    assert invocation_counts(home) == {"b": 1, "c": 2}  # b acknowledged: never again
    assert body["resumed_from"] == state["session_id"]


def test_runs_and_show_tell_who_resumed_a_run(tmp_path: Path) -> None:
    home, source, first, second = _chain(tmp_path)
    listed = {r["run_id"]: r for r in run_cli(home, "runs", "--json").json["runs"]}
    assert [b["run_id"] for b in listed[source["run_id"]]["resumed_by"]] == [first["run_id"]]
    assert [b["session_id"] for b in listed[first["run_id"]]["resumed_by"]] == [
        second["session_id"]
    ]
    assert listed[second["run_id"]]["resumed_by"] == []
    assert listed[first["run_id"]]["resumed_from"] == source["session_id"]
    assert listed[first["run_id"]]["resumed_from_run"] == source["run_id"]
    shown = run_cli(home, "show", first["run_id"], "--json").json
    assert shown["resumed_from"] == source["session_id"]
    assert shown["resumed_by"] == [
        {
            "session_id": second["session_id"],
            "run_id": second["run_id"],
            "fork": False,
            "status": "completed",
            "created_at": shown["resumed_by"][0]["created_at"],
        }
    ]
    text = run_cli(home, "runs")
    assert text.returncode == 0, text.explain()
    line = next(x for x in text.stdout.splitlines() if x.startswith(source["run_id"]))
    assert f"resumed by {first['run_id']}" in line
    shown_text = run_cli(home, "show", first["run_id"])
    assert f"resumed from {source['run_id']}" in shown_text.stdout
    assert f"resumed by {second['run_id']}" in shown_text.stdout


def _a_checkpointed_while_b_runs(home: Path, proc: subprocess.Popen[str]) -> Path | None:
    """The flow's run dir once a is checkpointed, b is in flight and ``runs`` lists it running."""
    if proc.poll() is not None:
        raise AssertionError(f"the flow exited early: {finish(proc).explain()}")
    dirs = run_dirs(home)
    if len(dirs) != 1 or not (dirs[0] / CHECKPOINT).is_file():
        return None
    try:
        state, _ = load_checkpoint(dirs[0] / CHECKPOINT)
    except Exception:  # a torn read while the writer works: try again
        return None
    if (state["ops"].get("a") or {}).get("status") != "completed":
        return None
    if invocation_counts(home)["b"] != 1:
        return None
    listed = run_cli(home, "runs", "--json").json["runs"]
    running = [r for r in listed if r["run_id"] == dirs[0].name and r["status"] == "running"]
    return dirs[0] if running else None


def test_a_run_that_still_runs_is_not_resumable_until_its_owner_is_gone(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", {"b": {"delay": 120}})
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "name": "live",
            "plan": [
                {"agent_id": k, "instruction": f"step {k}", **({"depends_on": d} if d else {})}
                for k, d in CHAIN
            ],
        },
    )
    proc = start_cli(home, "flow", "--plan", plan, "--model", f"script:{script}", "--json")
    try:
        run_dir = wait_for(
            lambda: _a_checkpointed_while_b_runs(home, proc),
            timeout=60,
            what="a checkpointed, b in flight, the run listed running",
        )
        live = run_cli(home, "show", run_dir.name, "--json").json["session_id"]
        guard = SourceGuard.of(run_dir)
        for flags in ((), ("--dry-run",), ("--fork",)):
            _claimed(
                resume(home, run_dir.name, *flags, "--json"),
                f"run {run_dir.name} is still running (session {live}",
                "SIGINT",
                f"steerflow resume {run_dir.name}",
            )
        assert proc.poll() is None, "the live run was disturbed"
        assert invocation_counts(home) == {"a": 1, "b": 1}, "a refused resume invoked a node"
        assert run_dirs(home) == [run_dir], "a refused resume left a run directory"
        assert _session_ids(home) == [live], "a refused resume left a session"
        proc.send_signal(signal.SIGKILL)
        assert finish(proc, timeout=30).returncode == -signal.SIGKILL
    finally:
        stop(proc)
    guard.assert_unchanged()
    listed = {r["run_id"]: r for r in run_cli(home, "runs", "--json").json["runs"]}
    assert listed[run_dir.name]["status"] == "interrupted"
    write_script(script, {})  # b is quick now
    body = _ok(resume(home, run_dir.name, "--json"))
    assert body["resumed_from"] == live
    assert node_status(body) == dict.fromkeys("abc", "completed")
    # b was in flight when the owner died (never acknowledged): it runs once more; a never.
    assert invocation_counts(home) == {"a": 1, "b": 2, "c": 1}
