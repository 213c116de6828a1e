"""``steerflow resume``: one CLI test per resolution, refusal and replay rule (ADR D5, Amd. 1).

Every test drives the real command line in a subprocess.  Each refusal test also proves
that the source run's ``checkpoint.json`` and ``checkpoint.json.journal`` are byte for
byte unchanged (:class:`resume_support.SourceGuard`), and that nothing was invoked.
Invocations are counted from ``<home>/script-invocations.jsonl`` (the ``script:`` model).
Crafted checkpoints are version 2 files in a fabricated ``<home>/runs/<run id>/``.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from flow_support import (
    CliResult,
    finish,
    node_status,
    read_invocations,
    run_cli,
    start_cli,
    stop,
    write_yaml,
)
from resume_support import (
    Crafted,
    SourceGuard,
    fabricate_run,
    invocation_counts,
    new_runs,
    ops_of,
    response_of,
    resume,
    run_dirs,
    run_plan,
    session_metadata,
    single_run,
    spawned_of,
    wait_checkpoint,
    wait_for,
    write_script,
)

from steerflow.checkpoint import load_checkpoint

# -- shared shapes ---------------------------------------------------------------------------


def _plan(path: Path, nodes: list[tuple[str, list[str]]], **extra: dict[str, Any]) -> Path:
    entries = []
    for agent_id, deps in nodes:
        entry: dict[str, Any] = {"agent_id": agent_id, "instruction": f"step {agent_id}"}
        if deps:
            entry["depends_on"] = deps
        entry.update(extra.get(agent_id, {}))
        entries.append(entry)
    return write_yaml(path, {"name": "resume-test", "plan": entries})


DIAMOND = [("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"])]
CHAIN = [("a", []), ("b", ["a"]), ("c", ["b"])]


def _refused(result: CliResult, *fragments: str, code: str = "resume-refused") -> str:
    """Exit 3 with one JSON refusal object whose message holds every fragment."""
    assert result.returncode == 3, result.explain()
    body = result.json
    assert body["status"] == "refused", result.explain()
    assert body["exit_code"] == 3
    assert body["error"]["code"] == code, result.explain()
    message = str(body["error"]["message"])
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "steerflow: error:" in result.stderr
    return message


def _ok(result: CliResult, status: str = "completed") -> dict[str, Any]:
    assert result.returncode == 0, result.explain()
    body = result.json
    assert body["status"] == status, result.explain()
    return body


def _completed_source(tmp_path: Path, *extra: object) -> tuple[Path, Path, dict[str, Any]]:
    """A finished chain run (v3 by default): (home, run dir, its --json result)."""
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", {"a": {"response": "A"}})
    result = run_plan(home, _plan(tmp_path / "plan.yaml", CHAIN), script, *extra)
    body = _ok(result)
    return home, single_run(home), body


def _failed_source(
    tmp_path: Path, nodes: list[tuple[str, list[str]]], script: dict[str, Any], *extra: object
) -> tuple[Path, Path, dict[str, Any], Path]:
    """A run that ends with a failed node (exit 1): (home, run dir, --json, script path)."""
    home = tmp_path / "home"
    script_path = write_script(tmp_path / "script.yaml", script)
    result = run_plan(home, _plan(tmp_path / "plan.yaml", nodes), script_path, *extra)
    assert result.returncode == 1, result.explain()
    return home, single_run(home), result.json, script_path


def _resume_refused_nothing_ran(
    home: Path,
    target: object,
    *flags: object,
    fragments: tuple[str, ...],
    code: str = "resume-refused",
) -> str:
    before_runs = run_dirs(home)
    before_calls = len(read_invocations(home))
    message = _refused(resume(home, target, *flags, "--json"), *fragments, code=code)
    assert run_dirs(home) == before_runs, "a refused resume created a run directory"
    assert len(read_invocations(home)) == before_calls, "a refused resume invoked a node"
    return message


# == target resolution ==========================================================================


def test_target_exact_run_directory(tmp_path: Path) -> None:
    home, run_dir, source = _completed_source(tmp_path)
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, run_dir, "--json"))
    guard.assert_unchanged()
    assert body["resumed_from"] == source["session_id"]
    assert body["run_id"] != source["run_id"]
    assert invocation_counts(home, run_id=body["run_id"]) == {}


def test_target_run_directory_outside_the_home_is_refused(tmp_path: Path) -> None:
    home, run_dir, _ = _completed_source(tmp_path)
    stray = tmp_path / "elsewhere" / run_dir.name
    stray.parent.mkdir()
    stray.mkdir()
    (stray / "checkpoint.json").write_bytes((run_dir / "checkpoint.json").read_bytes())
    guard = SourceGuard.of(run_dir, stray)
    _resume_refused_nothing_ran(home, stray, fragments=("not a run of this home",))
    guard.assert_unchanged()


def test_target_full_run_id(tmp_path: Path) -> None:
    home, run_dir, source = _completed_source(tmp_path)
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, source["run_id"], "--json"))
    guard.assert_unchanged()
    assert body["resumed_from"] == source["session_id"]


def test_target_unambiguous_run_id_prefix(tmp_path: Path) -> None:
    home, run_dir, source = _completed_source(tmp_path)
    other = Crafted(tmp_path / "script.yaml")
    other.node("x")
    other.done("x", "X")
    other_dir = other.write(home, run_id="20200101T000000-aaaaaa")
    guard = SourceGuard.of(run_dir, other_dir)
    prefix = source["run_id"][:-2]
    body = _ok(resume(home, prefix, "--json"))
    guard.assert_unchanged()
    assert body["resumed_from"] == source["session_id"]


def test_target_ambiguous_run_id_prefix_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    dirs = []
    for run_id in ("20250101T000000-abc123", "20250101T000000-abc456"):
        crafted = Crafted(tmp_path / "script.yaml")
        crafted.node("a")
        dirs.append(crafted.write(home, run_id=run_id))
    guard = SourceGuard.of(*dirs)
    message = _resume_refused_nothing_ran(
        home,
        "20250101T000000-abc",
        fragments=("20250101T000000-abc123", "20250101T000000-abc456"),
        code="ambiguous-id",
    )
    assert "ambiguous" in message.lower()
    guard.assert_unchanged()


def _ids(home: Path, session_id: str) -> dict[str, str]:
    """session, invocation and play ids of one session, read from the state DB."""
    from steerflow.state import StateDB

    with StateDB.open(home, create=False) as db:
        inv = db.backend.query("SELECT id FROM invocations WHERE session_id = ?", (session_id,))
        play = db.backend.query("SELECT id FROM plays WHERE session_id = ?", (session_id,))
    return {
        "session": session_id,
        "invocation": str(inv[0]["id"]),
        **({"play": str(play[0]["id"])} if play else {}),
    }


@pytest.mark.parametrize(
    ("kind", "length"),
    [
        ("session", 32),
        ("session", 8),
        ("invocation", 32),
        ("invocation", 8),
        ("play", 32),
        ("play", 8),
    ],
)
def test_target_through_state_db(tmp_path: Path, kind: str, length: int) -> None:
    """Session, invocation and play ids (full or prefix) resolve through the session's run id."""
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", {"a": {"response": "A"}})
    if kind == "play":  # a play row exists only for playbook runs
        (home / "playbooks").mkdir(parents=True)
        _plan(home / "playbooks" / "chainbook.yaml", CHAIN)
        source = _ok(run_cli(home, "play", "chainbook", "--model", f"script:{script}", "--json"))
    else:
        source = _ok(run_plan(home, _plan(tmp_path / "plan.yaml", CHAIN), script))
    run_dir = single_run(home)
    target = _ids(home, source["session_id"])[kind][:length]
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, target, "--json"))
    guard.assert_unchanged()
    assert body["resumed_from"] == source["session_id"]
    assert invocation_counts(home, run_id=body["run_id"]) == {}


@pytest.mark.parametrize("target", ["deadbeef", "20990101T000000-ffffff", "./runs/nothing-here"])
def test_target_missing_is_refused_naming_it(tmp_path: Path, target: str) -> None:
    home, run_dir, _ = _completed_source(tmp_path)
    guard = SourceGuard.of(run_dir)
    # Nothing matches: the same `unknown-id` as `show` (issue 11 item 6).
    _resume_refused_nothing_ran(home, target, fragments=(repr(target),), code="unknown-id")
    guard.assert_unchanged()


def test_target_missing_without_state_db_is_refused_naming_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    _resume_refused_nothing_ran(home, "cafe1234", fragments=("'cafe1234'",), code="unknown-id")
    assert not (home / "state.db").exists(), "resolving a target created the state DB"


def test_target_run_directory_without_checkpoint_is_refused(tmp_path: Path) -> None:
    home, run_dir, _ = _completed_source(tmp_path)
    empty = home / "runs" / "20200101T000000-0000aa"
    empty.mkdir(mode=0o700)
    guard = SourceGuard.of(run_dir, empty)
    for target in (empty, empty.name):
        _resume_refused_nothing_ran(home, target, fragments=("no checkpoint.json", empty.name))
    guard.assert_unchanged()


def test_target_session_without_run_id_is_refused(tmp_path: Path) -> None:
    from steerflow.state import StateDB

    home, run_dir, _ = _completed_source(tmp_path)
    with StateDB.open(home) as db:
        bare = db.create_session(kind="flow", prompt="no run")
        db.set_session_status(bare.id, "interrupted")
    guard = SourceGuard.of(run_dir)
    _resume_refused_nothing_ran(home, bare.id, fragments=(bare.id, "no run id"))
    _resume_refused_nothing_ran(home, bare.id[:10], fragments=(bare.id, "no run id"))
    guard.assert_unchanged()


def test_target_session_whose_run_directory_is_missing_is_refused(tmp_path: Path) -> None:
    from steerflow.state import StateDB

    home, run_dir, _ = _completed_source(tmp_path)
    with StateDB.open(home) as db:
        ghost = db.create_session(kind="flow", run_id="20200101T000000-dead00")
    guard = SourceGuard.of(run_dir)
    _resume_refused_nothing_ran(home, ghost.id, fragments=("20200101T000000-dead00", "missing"))
    guard.assert_unchanged()


# == settings come from the checkpoint ===========================================================


def test_model_and_concurrency_come_from_checkpoint(tmp_path: Path) -> None:
    """A run with ``--model script:X --concurrency 1``: the resume uses the same model
    (its invocations are logged by the script model) and runs one node at a time."""
    home, run_dir, source, _ = _failed_source(
        tmp_path,
        DIAMOND,
        {"*": {"delay": 0.2}, "a": {"fail_once": "transient"}},
        "--concurrency",
        "1",
    )
    assert invocation_counts(home) == {"a": 1}
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, source["run_id"], "--retry-failed", "--json"))
    guard.assert_unchanged()
    calls = [c for c in read_invocations(home) if c["run_id"] == body["run_id"]]
    assert sorted(c["node"] for c in calls) == ["a", "b", "c", "d"]
    ts = {c["node"]: c["ts"] for c in calls}
    # b and c are independent: with concurrency 4 they would start together.
    assert abs(ts["b"] - ts["c"]) >= 0.15, ts
    new_state, _ = load_checkpoint(Path(body["checkpoint"]["path"]))
    old_state, _ = load_checkpoint(run_dir / "checkpoint.json")
    # The same settings; the resumed run also records which run it resumed (decision 132).
    lineage = new_state["config"].pop("resumed_from")
    assert lineage == {"session_id": source["session_id"], "run_id": run_dir.name, "fork": False}
    assert "resumed_from" not in old_state["config"]
    # ... and each its own run id (decision 247).
    assert new_state["config"].pop("run_id") == body["run_id"]
    assert old_state["config"].pop("run_id") == run_dir.name
    assert new_state["config"] == old_state["config"]
    assert new_state["config"]["concurrency"] == 1
    assert new_state["config"]["model_spec"].startswith("script:")


def test_reactive_and_max_ops_come_from_checkpoint(tmp_path: Path) -> None:
    """``--reactive all --max-ops 3`` on a 2-node plan leaves one spawn; the resume keeps both."""
    home, run_dir, source, _ = _failed_source(
        tmp_path,
        [("a", []), ("b", ["a"])],
        {
            "a": {"fail_once": "transient"},
            "b": {
                "spawn": [
                    {"agent_id": "x1", "assignee": "coder", "instruction": "one"},
                    {"agent_id": "x2", "assignee": "coder", "instruction": "two"},
                ]
            },
        },
        "--reactive",
        "all",
        "--max-ops",
        "3",
    )
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, source["run_id"], "--retry-failed", "--json"))
    guard.assert_unchanged()
    statuses = node_status(body)
    assert statuses.get("x1") == "completed", body  # reactive came from the checkpoint
    assert "x2" not in statuses
    assert [(r["agent_id"], r["reason"]) for r in body["spawn_rejections"]] == [
        ("x2", "max_spawn_exceeded")
    ]
    new_state, _ = load_checkpoint(Path(body["checkpoint"]["path"]))
    assert new_state["config"]["reactive_spec"] == "all"
    assert new_state["config"]["max_ops"] == 3
    assert new_state["max_spawn"] == 1


def test_dry_run_resume_runs_nothing_and_lists_nodes(tmp_path: Path) -> None:
    home, run_dir, source, _ = _failed_source(tmp_path, CHAIN, {"b": {"fail_once": "transient"}})
    guard = SourceGuard.of(run_dir)
    before_calls = read_invocations(home)
    result = resume(home, source["run_id"], "--retry-failed", "--dry-run", "--json")
    body = _ok(result, status="planned")
    guard.assert_unchanged()
    assert read_invocations(home) == before_calls
    assert run_dirs(home) == [run_dir], "a dry run created a run directory"
    assert node_status(body) == {"a": "completed", "b": "pending", "c": "pending"}
    text = resume(home, source["run_id"], "--retry-failed", "--dry-run")
    assert text.returncode == 0, text.explain()
    listed = re.findall(r"^\s+(\w+)\s+planned\s+(\w+)\s*$", text.stdout, flags=re.M)
    assert listed == [("completed", "a"), ("pending", "b"), ("pending", "c")], text.explain()
    assert read_invocations(home) == before_calls
    assert run_dirs(home) == [run_dir]
    assert _session_count(home) == 1, "a dry run created a session"
    guard.assert_unchanged()


def _session_count(home: Path) -> int:
    from steerflow.state import StateDB

    with StateDB.open(home, create=False) as db:
        return len(db.list_sessions(limit=None))


def test_show_graph_writes_into_the_new_run_directory(tmp_path: Path) -> None:
    home, run_dir, source = _completed_source(tmp_path)
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, source["run_id"], "--show-graph", "--json"))
    guard.assert_unchanged()
    new_dir = Path(body["run_dir"])
    assert new_dir != run_dir
    graph = (new_dir / "graph.mmd").read_text()
    assert "a" in graph and "c" in graph
    assert not (run_dir / "graph.mmd").exists()


def test_timeout_is_accepted(tmp_path: Path) -> None:
    home, run_dir, source, _ = _failed_source(tmp_path, CHAIN, {"c": {"fail_once": "transient"}})
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, source["run_id"], "--retry-failed", "--timeout", "30", "--json"))
    guard.assert_unchanged()
    assert invocation_counts(home, run_id=body["run_id"]) == {"c": 1}


def test_timeout_deadline_on_resume_exits_124_and_is_resumable(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", {"*": {"delay": 0.3}})
    crafted = Crafted(script, concurrency=1)
    crafted.node("a")
    crafted.node("b", "a")
    crafted.node("c", "b")
    crafted.done("a", "A")
    run_dir = crafted.write(home)
    guard = SourceGuard.of(run_dir)
    result = resume(home, run_dir.name, "--timeout", "0.1", "--json")
    assert result.returncode == 124, result.explain()
    guard.assert_unchanged()
    body = result.json
    assert node_status(body)["c"] == "pending"
    # the partial resumed run is itself resumable and finishes the rest
    final = _ok(resume(home, body["run_id"], "--json"))
    assert node_status(final) == {"a": "completed", "b": "completed", "c": "completed"}
    assert invocation_counts(home) == {"b": 1, "c": 1}


# == replay rules ================================================================================


def test_empty_plan_is_refused(tmp_path: Path) -> None:
    home, run_dir, _ = _completed_source(tmp_path)
    state, _ = load_checkpoint(run_dir / "checkpoint.json")
    state = {**state, "plan": [], "ops": {}, "spawned": []}
    crafted_dir = fabricate_run(home, state)
    guard = SourceGuard.of(run_dir, crafted_dir)
    _resume_refused_nothing_ran(home, crafted_dir.name, fragments=("empty plan",))
    guard.assert_unchanged()


def test_completed_nodes_are_replayed_and_never_invoked_again(tmp_path: Path) -> None:
    home, run_dir, source, _ = _failed_source(
        tmp_path, CHAIN, {"a": {"response": "A"}, "c": {"fail_once": "transient"}}
    )
    assert invocation_counts(home) == {"a": 1, "b": 1, "c": 1}
    recorded = ops_of(run_dir)
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, source["run_id"], "--retry-failed", "--json"))
    guard.assert_unchanged()
    assert invocation_counts(home) == {"a": 1, "b": 1, "c": 2}
    new_ops = ops_of(Path(body["run_dir"]))
    for key in ("a", "b"):
        assert new_ops[key]["response"] == recorded[key]["response"]
    # c read b's replayed result
    assert recorded["b"]["response"] in str(new_ops["c"]["response"])


def test_pending_nodes_run_with_restored_results(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", {})
    crafted = Crafted(script)
    for agent_id, deps in DIAMOND:
        crafted.node(agent_id, *deps)
    crafted.done("a", "RESULT-A")
    crafted.done("b", "RESULT-B")
    run_dir = crafted.write(home)
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, run_dir.name, "--json"))
    guard.assert_unchanged()
    assert invocation_counts(home) == {"c": 1, "d": 1}
    new_dir = Path(body["run_dir"])
    assert "RESULT-A" in str(response_of(new_dir, "c"))
    assert "RESULT-B" in str(response_of(new_dir, "d"))
    assert response_of(new_dir, "a") == "RESULT-A"


def test_failed_node_is_refused_without_retry_failed(tmp_path: Path) -> None:
    home, run_dir, source, _ = _failed_source(tmp_path, CHAIN, {"b": {"fail_once": "transient"}})
    guard = SourceGuard.of(run_dir)
    message = _resume_refused_nothing_ran(
        home, source["run_id"], fragments=("'b'", "failed", "--retry-failed")
    )
    assert "side effects" in message
    guard.assert_unchanged()


def test_failed_node_reruns_with_retry_failed(tmp_path: Path) -> None:
    home, run_dir, source, _ = _failed_source(tmp_path, CHAIN, {"b": {"fail_once": "transient"}})
    assert invocation_counts(home) == {"a": 1, "b": 1}
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, source["run_id"], "--retry-failed", "--json"))
    guard.assert_unchanged()
    assert invocation_counts(home) == {"a": 1, "b": 2, "c": 1}
    assert node_status(body) == {"a": "completed", "b": "completed", "c": "completed"}


def _inherit_source(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    """d inherits b's conversation; d fails once, then b's branch file is removed."""
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", {"d": {"fail_once": "transient"}})
    plan = _plan(tmp_path / "plan.yaml", DIAMOND, d={"inherit_context": True})
    result = run_plan(home, plan, script)
    assert result.returncode == 1, result.explain()
    run_dir = single_run(home)
    branch = run_dir / "branches" / "b.json"
    assert branch.is_file(), "the runner did not persist b's branch"
    branch.unlink()
    return home, run_dir, result.json


def test_inherit_context_with_missing_branch_is_refused(tmp_path: Path) -> None:
    home, run_dir, source = _inherit_source(tmp_path)
    guard = SourceGuard.of(run_dir)
    _resume_refused_nothing_ran(
        home, source["run_id"], "--retry-failed", fragments=("d", "--allow-degraded-context")
    )
    guard.assert_unchanged()


def test_inherit_context_degraded_when_allowed_and_named(tmp_path: Path) -> None:
    home, run_dir, source = _inherit_source(tmp_path)
    guard = SourceGuard.of(run_dir)
    body = _ok(
        resume(home, source["run_id"], "--retry-failed", "--allow-degraded-context", "--json")
    )
    guard.assert_unchanged()
    assert body["degraded_context"] == ["d"]
    assert invocation_counts(home, run_id=body["run_id"]) == {"d": 1}
    meta = session_metadata(home, body["session_id"])
    assert meta["degraded_context"] == ["d"]
    assert meta["resumed_from"] == source["session_id"]
    shown = run_cli(home, "show", body["run_id"], "--json")
    assert shown.returncode == 0, shown.explain()
    assert shown.json["resumed_from"] == source["session_id"]
    assert node_status(shown.json)["d"] == "completed"


def test_inherit_context_with_branch_present_is_not_degraded(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", {"d": {"fail_once": "transient"}})
    plan = _plan(tmp_path / "plan.yaml", DIAMOND, d={"inherit_context": True})
    source = run_plan(home, plan, script)
    assert source.returncode == 1, source.explain()
    run_dir = single_run(home)
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, source.json["run_id"], "--retry-failed", "--json"))
    guard.assert_unchanged()
    assert body["degraded_context"] == []


def test_settle_check_tampered_response_is_refused(tmp_path: Path) -> None:
    home, run_dir, _ = _completed_source(tmp_path, "--checkpoint-version", "2")
    doc = json.loads((run_dir / "checkpoint.json").read_text())
    doc["ops"]["b"]["response"] = "an edited result"  # digest left as it was
    del doc["ops"]["c"]
    tampered = fabricate_run(home, doc)
    guard = SourceGuard.of(run_dir, tampered)
    _resume_refused_nothing_ran(home, tampered.name, fragments=("'b'", "result_digest"))
    guard.assert_unchanged()


def test_settle_check_tampered_spawned_response_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    crafted = Crafted(write_script(tmp_path / "script.yaml", {}), reactive="all")
    crafted.node("a")
    crafted.node("b", "a")
    crafted.done("a", "A")
    entry = crafted.spawn("s1", parent="a", response="S1")
    entry["response"] = "S1 edited"
    run_dir = crafted.write(home)
    guard = SourceGuard.of(run_dir)
    _resume_refused_nothing_ran(home, run_dir.name, fragments=("'s1'", "result_digest"))
    guard.assert_unchanged()


def test_settle_check_response_that_cannot_be_digested_is_refused(tmp_path: Path) -> None:
    """A hand-edited v2 file may hold NaN (json reads it); the check refuses, never crashes."""
    home = tmp_path / "home"
    crafted = Crafted(write_script(tmp_path / "script.yaml", {}))
    crafted.node("a")
    crafted.node("b", "a")
    crafted.done("a", "A")["response"] = float("nan")
    run_dir = crafted.write(home, branches=False)
    guard = SourceGuard.of(run_dir)
    result = resume(home, run_dir.name, "--json")
    guard.assert_unchanged()
    assert result.returncode == 3, result.explain()
    assert read_invocations(home) == []
    assert "Traceback" not in result.stderr


def test_entry_without_result_digest_is_accepted(tmp_path: Path) -> None:
    home = tmp_path / "home"
    crafted = Crafted(write_script(tmp_path / "script.yaml", {}))
    crafted.node("a")
    crafted.node("b", "a")
    crafted.done("a", "OLD-STYLE-A", digest=False)
    run_dir = crafted.write(home)
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, run_dir.name, "--json"))
    guard.assert_unchanged()
    assert invocation_counts(home) == {"b": 1}
    assert "OLD-STYLE-A" in str(response_of(Path(body["run_dir"]), "b"))


def test_checkpoint_entry_outside_the_plan_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    crafted = Crafted(write_script(tmp_path / "script.yaml", {}))
    crafted.node("a")
    crafted.node("b", "a")
    crafted.done("a", "A")
    crafted.done("ghost", "G")
    run_dir = crafted.write(home)
    guard = SourceGuard.of(run_dir)
    _resume_refused_nothing_ran(home, run_dir.name, fragments=("'ghost'", "not in its plan"))
    guard.assert_unchanged()


@pytest.mark.parametrize("damage", ["truncated", "not-an-object", "ops-mistyped"])
def test_unreadable_source_checkpoint_is_refused(tmp_path: Path, damage: str) -> None:
    home, run_dir, _ = _completed_source(tmp_path, "--checkpoint-version", "2")
    text = (run_dir / "checkpoint.json").read_text()
    if damage == "truncated":
        bad = text[: len(text) // 2]
    elif damage == "not-an-object":
        bad = "[1, 2, 3]"
    else:
        doc = json.loads(text)
        doc["ops"] = ["a"]
        bad = json.dumps(doc)
    broken = home / "runs" / "20200101T000000-bad000"
    broken.mkdir(mode=0o700)
    (broken / "checkpoint.json").write_text(bad)
    guard = SourceGuard.of(run_dir, broken)
    result = resume(home, broken.name, "--json")
    guard.assert_unchanged()
    assert result.returncode == 3, result.explain()
    body = result.json
    assert body["error"]["code"] == "checkpoint-recovery-refused", result.explain()
    assert body["checkpoint_recovery"]["status"] == "refused"
    assert run_dirs(home) == sorted([run_dir, broken])
    assert "Traceback" not in result.stderr


# == spawned reconstruction (crafted v2 checkpoints) ============================================


def _spawn_base(tmp_path: Path, **script: Any) -> Crafted:
    crafted = Crafted(
        write_script(tmp_path / "script.yaml", {"*": {"delay": 0.05}, **script}), reactive="all"
    )
    crafted.node("a")
    crafted.node("b", "a")
    crafted.done("a", "A")
    return crafted


def test_spawned_entry_without_operation_is_refused(tmp_path: Path) -> None:
    crafted = _spawn_base(tmp_path)
    crafted.spawn("s1", parent="a", drop=("operation",))
    run_dir = crafted.write(tmp_path / "home")
    guard = SourceGuard.of(run_dir)
    _resume_refused_nothing_ran(tmp_path / "home", run_dir.name, fragments=("'s1'", "operation"))
    guard.assert_unchanged()


@pytest.mark.parametrize("status", ["running", "done", None])
def test_spawned_entry_with_bad_status_is_refused(tmp_path: Path, status: str | None) -> None:
    crafted = _spawn_base(tmp_path)
    crafted.spawn("s1", parent="a", status="completed", response="S1")["status"] = status
    run_dir = crafted.write(tmp_path / "home")
    guard = SourceGuard.of(run_dir)
    _resume_refused_nothing_ran(
        tmp_path / "home", run_dir.name, fragments=("'s1'", repr(status), "completed or failed")
    )
    guard.assert_unchanged()


def test_spawned_entry_with_assignee_but_no_spawn_id_is_refused(tmp_path: Path) -> None:
    crafted = _spawn_base(tmp_path)
    entry = crafted.spawn("s1", parent="a", drop=("spawn_id",))
    run_dir = crafted.write(tmp_path / "home")
    guard = SourceGuard.of(run_dir)
    _resume_refused_nothing_ran(
        tmp_path / "home", run_dir.name, fragments=(entry["node_id"], "assignee", "spawn_id")
    )
    guard.assert_unchanged()


def test_spawned_entry_whose_parent_is_not_terminal_is_refused(tmp_path: Path) -> None:
    """b is planned but pending in the checkpoint: it cannot have emitted anything."""
    crafted = _spawn_base(tmp_path)
    crafted.spawn("s1", parent="b", depends_on=["b"])
    run_dir = crafted.write(tmp_path / "home")
    guard = SourceGuard.of(run_dir)
    _resume_refused_nothing_ran(
        tmp_path / "home", run_dir.name, fragments=("'s1'", crafted.node_ids["b"], "parent")
    )
    guard.assert_unchanged()


def test_spawned_entry_whose_parent_is_unknown_is_refused(tmp_path: Path) -> None:
    crafted = _spawn_base(tmp_path)
    crafted.spawn("s1", parent="f" * 32, depends_on=["a"])
    run_dir = crafted.write(tmp_path / "home")
    guard = SourceGuard.of(run_dir)
    _resume_refused_nothing_ran(
        tmp_path / "home", run_dir.name, fragments=("'s1'", "f" * 32, "neither terminal")
    )
    guard.assert_unchanged()


def _dup_spawn_id(c: Crafted) -> str:
    c.spawn("s1", parent="a")
    c.spawn("s1", parent="a")
    return "'s1'"


def _spawn_id_is_planned(c: Crafted) -> str:
    c.spawn("b", parent="a")
    return "'b'"


def _dup_node_id(c: Crafted) -> str:
    first = c.spawn("s1", parent="a")
    c.spawn("s2", parent="a", node_id=first["node_id"])
    return str(first["node_id"])


@pytest.mark.parametrize("build", [_dup_spawn_id, _spawn_id_is_planned, _dup_node_id])
def test_spawned_entries_that_collide_are_refused(tmp_path: Path, build: Any) -> None:
    """Two entries with one spawn_id or node_id, or a spawn_id that is a planned agent_id,
    cannot be rebuilt into one graph: refused (exit 3), never a crash or a silent drop."""
    crafted = _spawn_base(tmp_path)
    named = build(crafted)
    run_dir = crafted.write(tmp_path / "home")
    guard = SourceGuard.of(run_dir)
    _resume_refused_nothing_ran(tmp_path / "home", run_dir.name, fragments=(named,))
    guard.assert_unchanged()


def test_spawned_entries_in_a_cycle_are_refused(tmp_path: Path) -> None:
    crafted = _spawn_base(tmp_path)
    crafted.spawn("s1", parent="a", status="failed", depends_on=["s2"])
    crafted.spawn("s2", parent="s1", status="failed", depends_on=["s1"])
    run_dir = crafted.write(tmp_path / "home")
    guard = SourceGuard.of(run_dir)
    _resume_refused_nothing_ran(
        tmp_path / "home", run_dir.name, "--retry-failed", fragments=("cycle",)
    )
    guard.assert_unchanged()


def test_one_bad_spawned_entry_refuses_the_whole_resume(tmp_path: Path) -> None:
    crafted = _spawn_base(tmp_path)
    crafted.spawn("good1", parent="a", response="G1")
    crafted.spawn("good2", parent="good1", response="G2", depends_on=["good1"])
    crafted.spawn("bad", parent="a", drop=("operation",))
    crafted.spawn("good3", parent="a", status="failed")
    run_dir = crafted.write(tmp_path / "home")
    guard = SourceGuard.of(run_dir)
    message = _resume_refused_nothing_ran(
        tmp_path / "home", run_dir.name, "--retry-failed", fragments=("'bad'",)
    )
    for good in ("good1", "good2", "good3"):
        assert good not in message
    assert read_invocations(tmp_path / "home") == []
    guard.assert_unchanged()


def test_good_spawned_entries_are_rebuilt_and_replayed(tmp_path: Path) -> None:
    """s1 (from a) and s2 (from s1) completed: both replayed, b runs, nothing else."""
    home = tmp_path / "home"
    crafted = _spawn_base(tmp_path)
    crafted.spawn("s1", parent="a", response="S1")
    crafted.spawn("s2", parent="s1", response="S2", depends_on=["s1"])
    run_dir = crafted.write(home)
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, run_dir.name, "--json"))
    guard.assert_unchanged()
    assert invocation_counts(home) == {"b": 1}
    assert node_status(body) == {
        "a": "completed",
        "b": "completed",
        "s1": "completed",
        "s2": "completed",
    }
    kinds = {n["id"]: n["kind"] for n in body["nodes"]}
    assert kinds["s1"] == kinds["s2"] == "spawned"
    rebuilt = spawned_of(Path(body["run_dir"]))
    assert rebuilt["s1"]["response"] == "S1" and rebuilt["s2"]["response"] == "S2"
    assert rebuilt["s2"]["parent_id"] == rebuilt["s1"]["node_id"]
    # a planned node never depends on spawned ones
    assert "S1" not in str(response_of(Path(body["run_dir"]), "b"))


def test_failed_spawned_entry_is_refused_without_retry_failed(tmp_path: Path) -> None:
    crafted = _spawn_base(tmp_path)
    crafted.done("b", "B")
    crafted.spawn("s1", parent="a", status="failed")
    run_dir = crafted.write(tmp_path / "home")
    guard = SourceGuard.of(run_dir)
    message = _resume_refused_nothing_ran(
        tmp_path / "home", run_dir.name, fragments=("'s1'", "failed", "--retry-failed")
    )
    assert "side effects" in message
    guard.assert_unchanged()


def test_retry_failed_reruns_failed_spawned_entries_in_original_order(tmp_path: Path) -> None:
    """s1 (from a) and its child s2 failed: with --retry-failed s1 runs again, and s2 waits
    for s1 exactly as in the original run (it reads s1's new result)."""
    home = tmp_path / "home"
    crafted = _spawn_base(tmp_path, s1={"response": "S1-AGAIN", "delay": 0.3})
    crafted.done("b", "B")
    crafted.spawn("s1", parent="a", status="failed")
    crafted.spawn("s2", parent="s1", status="failed", depends_on=["s1"])
    run_dir = crafted.write(home)
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, run_dir.name, "--retry-failed", "--json"))
    guard.assert_unchanged()
    calls = read_invocations(home)
    assert [c["node"] for c in calls] == ["s1", "s2"]
    assert calls[1]["ts"] - calls[0]["ts"] >= 0.3 - 0.01, calls
    new_dir = Path(body["run_dir"])
    assert response_of(new_dir, "s1") == "S1-AGAIN"
    assert "### s1 (completed)\nS1-AGAIN" in str(response_of(new_dir, "s2"))
    assert node_status(body) == {
        "a": "completed",
        "b": "completed",
        "s1": "completed",
        "s2": "completed",
    }


# == the resumed run itself ======================================================================


def test_resumed_run_has_own_session_dir_checkpoint_and_resumed_from(tmp_path: Path) -> None:
    home, run_dir, source, _ = _failed_source(tmp_path, CHAIN, {"c": {"fail_once": "transient"}})
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, source["run_id"], "--retry-failed", "--json"))
    guard.assert_unchanged()
    assert body["session_id"] != source["session_id"]
    assert body["run_id"] != source["run_id"]
    assert body["resumed_from"] == source["session_id"]
    new_dir = Path(body["run_dir"])
    assert new_dir.parent == run_dir.parent and new_dir != run_dir
    assert new_runs(home, [run_dir]) == [new_dir]
    assert body["checkpoint"]["path"] == str(new_dir / "checkpoint.json")
    assert body["checkpoint"]["persisted"] is True
    assert body["checkpoint"]["version"] == 3
    state, report = load_checkpoint(new_dir / "checkpoint.json")
    assert report["status"] == "clean"
    assert state["session_id"] == body["session_id"]
    assert {k: v["status"] for k, v in state["ops"].items()} == dict.fromkeys("abc", "completed")
    meta = session_metadata(home, body["session_id"])
    assert meta["resumed_from"] == source["session_id"]
    assert meta["run_id"] == body["run_id"]
    shown = run_cli(home, "show", body["session_id"], "--json")
    assert shown.returncode == 0, shown.explain()
    assert shown.json["resumed_from"] == source["session_id"]
    assert shown.json["run_id"] == body["run_id"]


def test_resume_of_a_resumed_run(tmp_path: Path) -> None:
    home, run_dir, source, _ = _failed_source(tmp_path, CHAIN, {"c": {"fail_once": "transient"}})
    first = _ok(resume(home, source["run_id"], "--retry-failed", "--json"))
    first_dir = Path(first["run_dir"])
    guard = SourceGuard.of(run_dir, first_dir)
    calls = len(read_invocations(home))
    second = _ok(resume(home, first["run_id"], "--json"))
    guard.assert_unchanged()
    assert len(read_invocations(home)) == calls, "an all-done resume invoked a node"
    assert second["resumed_from"] == first["session_id"]
    assert ops_of(Path(second["run_dir"])) == ops_of(first_dir)


def test_resume_reads_a_v2_source_and_writes_v3(tmp_path: Path) -> None:
    home, run_dir, source, _ = _failed_source(
        tmp_path, CHAIN, {"b": {"fail_once": "transient"}}, "--checkpoint-version", "2"
    )
    assert not (run_dir / "checkpoint.json.journal").exists()
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, source["run_id"], "--retry-failed", "--json"))
    guard.assert_unchanged()
    assert body["checkpoint_recovery"]["checkpoint_version"] == 2
    assert body["checkpoint"]["version"] == 3
    assert invocation_counts(home) == {"a": 1, "b": 2, "c": 1}


# == spawned nodes end to end =====================================================================


SPAWN_PLAN = [("a", []), ("b", ["a"]), ("c", ["a"])]


def test_spawned_node_not_reinvoked_after_failure(tmp_path: Path) -> None:
    home, run_dir, source, _ = _failed_source(
        tmp_path,
        [("a", []), ("b", ["a"])],
        {
            "a": {
                "response": "A",
                "spawn": [{"agent_id": "s1", "assignee": "coder", "instruction": "fix"}],
            },
            "s1": {"response": "S1"},
            "b": {"fail_once": "transient", "delay": 0.2},
        },
        "--reactive",
        "all",
    )
    assert node_status(source)["s1"] == "completed"
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, source["run_id"], "--retry-failed", "--json"))
    guard.assert_unchanged()
    assert invocation_counts(home) == {"a": 1, "s1": 1, "b": 2}
    assert node_status(body) == {"a": "completed", "b": "completed", "s1": "completed"}
    assert spawned_of(Path(body["run_dir"]))["s1"]["response"] == "S1"


@pytest.mark.parametrize("version", ["3", "2"])
def test_spawned_node_not_reinvoked_after_sigkill(tmp_path: Path, version: str) -> None:
    """Kill the flow (SIGKILL) once a and its spawned s1 are checkpointed while c still runs."""
    home = tmp_path / "home"
    script_path = tmp_path / "script.yaml"
    spawn = {
        "response": "A",
        "spawn": [{"agent_id": "s1", "assignee": "coder", "instruction": "fix"}],
    }
    write_script(script_path, {"a": spawn, "s1": {"response": "S1"}, "c": {"delay": 60}})
    plan = _plan(tmp_path / "plan.yaml", SPAWN_PLAN)
    proc = start_cli(
        home, "flow", "--plan", plan, "--model", f"script:{script_path}", "--reactive", "all",
        "--checkpoint-version", version,
    )  # fmt: skip
    try:
        wait_checkpoint(
            home,
            lambda s: (
                {"a", "b"} <= set(s["ops"])
                and any(
                    e.get("spawn_id") == "s1" and e["status"] == "completed" for e in s["spawned"]
                )
            ),
            what="a, b and s1 checkpointed",
        )
        wait_for(lambda: invocation_counts(home)["c"] == 1, timeout=10, what="c in flight")
        proc.send_signal(signal.SIGKILL)
        killed = finish(proc, timeout=10)
        assert killed.returncode == -signal.SIGKILL
    finally:
        stop(proc)
    run_dir = single_run(home)
    write_script(script_path, {"a": spawn, "s1": {"response": "S1"}})  # c is quick now
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, run_dir.name, "--json"))
    guard.assert_unchanged()
    assert invocation_counts(home) == {"a": 1, "b": 1, "s1": 1, "c": 2}
    assert node_status(body) == {
        "a": "completed",
        "b": "completed",
        "c": "completed",
        "s1": "completed",
    }


def test_spawned_node_in_flight_at_sigkill_is_not_dropped(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script_path = tmp_path / "script.yaml"
    spawn = {
        "response": "A",
        "spawn": [{"agent_id": "s1", "assignee": "coder", "instruction": "fix"}],
    }
    write_script(script_path, {"a": spawn, "s1": {"delay": 60}})
    plan = _plan(tmp_path / "plan.yaml", [("a", []), ("b", ["a"])])
    proc = start_cli(
        home, "flow", "--plan", plan, "--model", f"script:{script_path}", "--reactive", "all"
    )
    try:
        wait_checkpoint(home, lambda s: {"a", "b"} <= set(s["ops"]), what="a and b checkpointed")
        wait_for(lambda: invocation_counts(home)["s1"] == 1, timeout=10, what="s1 in flight")
        proc.send_signal(signal.SIGKILL)
        finish(proc, timeout=10)
    finally:
        stop(proc)
    run_dir = single_run(home)
    write_script(script_path, {"a": spawn})
    result = resume(home, run_dir.name, "--json")
    # Either the resume runs s1 again, or it refuses; it must not report success without s1.
    if result.returncode == 0:
        assert node_status(result.json).get("s1") == "completed", result.explain()
        assert invocation_counts(home)["s1"] == 2
    else:
        assert result.returncode == 3, result.explain()


def test_source_journal_with_torn_tail_is_not_repaired_by_resume(tmp_path: Path) -> None:
    """A v3 source whose journal ends in a torn line: the resume folds the valid prefix,
    reports ``recovered_prefix``, and leaves both files exactly as they were."""
    home, run_dir, source, _ = _failed_source(tmp_path, CHAIN, {"c": {"fail_once": "transient"}})
    journal = run_dir / "checkpoint.json.journal"
    assert journal.is_file()
    with open(journal, "ab") as handle:
        handle.write(b'{"version":3,"gener')
    guard = SourceGuard.of(run_dir)
    body = _ok(resume(home, source["run_id"], "--retry-failed", "--json"))
    guard.assert_unchanged()
    report = body["checkpoint_recovery"]
    assert report["status"] == "recovered_prefix", report
    assert report["discarded_tail_bytes"] == len(b'{"version":3,"gener')
    assert invocation_counts(home) == {"a": 1, "b": 1, "c": 2}
    assert os.path.getsize(journal) > 0
