"""Rerun from a node (issue 40 item 6): what a ``resume --from NODE`` fork replays and runs.

The cut itself over hand-made version 2 checkpoints (a diamond with a synthesis, a chain,
spawns, failures), then real in-process runs with the ``echo`` model: the edited
instruction is what the node ran with, it is recorded (entry, config, ``show``) and a
changed record refuses the next resume. The paid-for count against a real provider
is in ``tests/e2e/test_rerun_from_e2e.py``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

import steerflow
from steerflow.checkpoint import entry_digest, load_state
from steerflow.errors import ExitCode, FlowResumeError, UsageError
from steerflow.orchestrate import FlowOptions, node_detail
from steerflow.resume import paid_nodes, plan_replay, rerun_cut

SYNTH = {"instruction": "Combine.", "when_all_failed": "skip"}


def _planned(agent_id: str, deps: list[int]) -> dict[str, Any]:
    return {
        "agent_id": agent_id,
        "dep_indices": deps,
        "assignee": None,
        "instruction": f"Do {agent_id}.",
        "node_id": uuid.uuid5(uuid.NAMESPACE_DNS, agent_id).hex,
    }


def _done(agent_id: str, status: str = "completed", **more: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "agent_id": agent_id,
        "status": status,
        "response": f"{agent_id} said" if status == "completed" else {"error": "boom"},
        **more,
    }
    entry["result_digest"] = entry_digest(entry)
    return entry


def _spawn(spawn_id: str, parent: str, depends_on: list[str]) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "node_id": uuid.uuid5(uuid.NAMESPACE_DNS, spawn_id).hex,
        "status": "completed",
        "response": f"{spawn_id} said",
        "operation": f"work {spawn_id}",
        "assignee": None,
        "instruction": f"work {spawn_id}",
        "parent_id": uuid.uuid5(uuid.NAMESPACE_DNS, parent).hex,
        "spawn_id": spawn_id,
        "context": None,
        "depends_on": depends_on,
    }
    entry["result_digest"] = entry_digest(entry)
    return entry


def _write(
    tmp_path: Path,
    plan: list[dict[str, Any]],
    ops: list[dict[str, Any]],
    *,
    spawned: list[dict[str, Any]] | None = None,
    synthesis: bool = False,
) -> Path:
    config: dict[str, Any] = {"model_spec": "echo", "reactive_spec": "all", "kind": "flow"}
    if synthesis:
        config["synthesis"] = SYNTH
    doc = {
        "version": 2,
        "session_id": uuid.uuid4().hex,
        "prompt": "",
        "plan": plan,
        "flow_context": {},
        "ops": {op["agent_id"]: op for op in ops},
        "spawned": spawned or [],
        "config": config,
    }
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "checkpoint.json").write_text(json.dumps(doc))
    return run_dir


def _diamond(tmp_path: Path, **statuses: str) -> Path:
    """a -> b, a -> c, b and c -> d, and a synthesis over all; every node completed."""
    plan = [_planned("a", []), _planned("b", [0]), _planned("c", [0]), _planned("d", [1, 2])]
    ops = [_done(k, statuses.get(k, "completed")) for k in ("a", "b", "c", "d")]
    return _write(tmp_path, plan, [*ops, _done("synthesis")], synthesis=True)


def _chain(tmp_path: Path) -> Path:
    plan = [_planned("a", []), _planned("b", [0]), _planned("c", [1])]
    return _write(tmp_path, plan, [_done("a"), _done("b"), _done("c")])


def _rerun(
    run_dir: Path, node: str, *, instruction: str | None = None, retry_failed: bool = False
) -> tuple[list[str], list[str]]:
    """``(replayed, paid)``: what a fork from ``node`` replays, and what it runs."""
    state, _ = load_state(run_dir / "checkpoint.json", v2_lenient=True)
    cut, _ = rerun_cut(state, node, instruction=instruction, run_id="src")
    # Hand-made: no branch files, so a rebuilt spawn inherits an empty conversation.
    replay = plan_replay(cut, run_dir, retry_failed=retry_failed, allow_degraded_context=True)
    replayed = [*replay.completed, *(s.spawn_id for s in replay.spawned if s.status == "completed")]
    return sorted(replayed), list(paid_nodes(replay, cut))


@pytest.mark.parametrize(
    ("node", "replayed", "paid"),
    [
        ("a", [], ["a", "b", "c", "d", "synthesis"]),
        ("b", ["a", "c"], ["b", "d", "synthesis"]),
        ("c", ["a", "b"], ["c", "d", "synthesis"]),
        ("d", ["a", "b", "c"], ["d", "synthesis"]),
        ("synthesis", ["a", "b", "c", "d"], ["synthesis"]),
    ],
)
def test_a_diamond_replays_what_is_not_downstream(
    tmp_path: Path, node: str, replayed: list[str], paid: list[str]
) -> None:
    assert _rerun(_diamond(tmp_path), node) == (replayed, paid)


@pytest.mark.parametrize(
    ("node", "replayed", "paid"),
    [("a", [], ["a", "b", "c"]), ("b", ["a"], ["b", "c"]), ("c", ["a", "b"], ["c"])],
)
def test_a_chain_replays_everything_upstream(
    tmp_path: Path, node: str, replayed: list[str], paid: list[str]
) -> None:
    assert _rerun(_chain(tmp_path), node) == (replayed, paid)


def test_a_failed_node_downstream_runs_again_without_retry_failed(tmp_path: Path) -> None:
    assert _rerun(_diamond(tmp_path, d="failed"), "b") == (["a", "c"], ["b", "d", "synthesis"])


def test_a_failed_node_elsewhere_needs_retry_failed_as_a_fork_would(tmp_path: Path) -> None:
    run_dir = _diamond(tmp_path, c="failed")
    with pytest.raises(FlowResumeError, match=r"node 'c' failed.*--retry-failed"):
        _rerun(run_dir, "b")
    assert _rerun(run_dir, "b", retry_failed=True) == (["a"], ["b", "c", "d", "synthesis"])


def test_spawns_of_a_node_that_runs_again_are_dropped_and_waiters_rerun(tmp_path: Path) -> None:
    """``a`` spawned ``s1`` (after a) and ``s2`` (after a and b); ``b`` spawned ``s3``."""
    s1, s2 = _spawn("s1", "a", ["a"]), _spawn("s2", "a", ["a", "b"])
    s3 = _spawn("s3", "b", ["b"])
    a = _done("a", spawned_ids=[s1["node_id"], s2["node_id"]])
    b = _done("b", spawned_ids=[s3["node_id"]])
    plan = [_planned("a", []), _planned("b", [0])]
    run_dir = _write(tmp_path, plan, [a, b], spawned=[s1, s2, s3])
    # From b: s3 is b's own (b asks again), s2 waits for b (runs again), s1 replays.
    assert _rerun(run_dir, "b") == (["a", "s1"], ["b", "s2"])
    # From a: every spawn is a's (or under it): all asked for again.
    assert _rerun(run_dir, "a") == ([], ["a", "b"])


def test_an_unknown_node_exits_2_naming_the_nodes_and_the_closest(tmp_path: Path) -> None:
    state, _ = load_state(_diamond(tmp_path) / "checkpoint.json", v2_lenient=True)
    with pytest.raises(UsageError) as refused:
        rerun_cut(state, "bb")
    assert refused.value.exit_code == ExitCode.USAGE
    message = str(refused.value)
    assert "a, b, c, d, synthesis" in message
    assert "did you mean b" in message


def test_a_spawned_node_is_refused_naming_its_emitter(tmp_path: Path) -> None:
    s1 = _spawn("s1", "a", ["a"])
    run_dir = _write(
        tmp_path, [_planned("a", [])], [_done("a", spawned_ids=[s1["node_id"]])], spawned=[s1]
    )
    state, _ = load_state(run_dir / "checkpoint.json", v2_lenient=True)
    with pytest.raises(UsageError, match=r"'s1' is a spawned node.*rerun from 'a'"):
        rerun_cut(state, "s1")


def test_an_empty_instruction_is_refused(tmp_path: Path) -> None:
    state, _ = load_state(_chain(tmp_path) / "checkpoint.json", v2_lenient=True)
    with pytest.raises(UsageError, match="non-empty"):
        rerun_cut(state, "b", instruction="  ")


def test_the_edit_replaces_the_instruction_and_is_recorded(tmp_path: Path) -> None:
    state, _ = load_state(_diamond(tmp_path) / "checkpoint.json", v2_lenient=True)
    cut, rerun = rerun_cut(state, "b", instruction="Do b twice.", run_id="src")
    edit = {"original": "Do b.", "instruction": "Do b twice.", "run_id": "src"}
    assert rerun.edited == edit
    assert [i["instruction"] for i in cut.plan if i["agent_id"] == "b"] == ["Do b twice."]
    assert cut.config["edited_instructions"] == {"b": edit}
    assert state.config.get("edited_instructions") is None  # the source is untouched
    synth, _ = rerun_cut(state, "synthesis", instruction="Say it short.")
    assert synth.config["synthesis"]["instruction"] == "Say it short."


def test_a_source_entry_that_does_not_match_its_digest_refuses_the_cut(tmp_path: Path) -> None:
    """Even an entry the fork would run again: the source must be faithful to be cut."""
    run_dir = _diamond(tmp_path)
    doc = json.loads((run_dir / "checkpoint.json").read_text())
    doc["ops"]["d"]["response"] = "changed"
    (run_dir / "checkpoint.json").write_text(json.dumps(doc))
    state, _ = load_state(run_dir / "checkpoint.json", v2_lenient=True)
    with pytest.raises(FlowResumeError, match=r"node 'd'.*result_digest"):
        rerun_cut(state, "b")


# -- real runs (in process, the echo model) ------------------------------------------------


PLAN = {
    "name": "diamond",
    "synthesis": {"instruction": "Combine everything."},
    "plan": [
        {"agent_id": "a", "instruction": "Do a."},
        {"agent_id": "b", "instruction": "Do b.", "depends_on": ["a"]},
        {"agent_id": "c", "instruction": "Do c.", "depends_on": ["a"]},
        {"agent_id": "d", "instruction": "Do d.", "depends_on": ["b", "c"]},
    ],
}


def _first_run(tmp_path: Path) -> tuple[Path, str]:
    home = tmp_path / "home"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    options = FlowOptions(plan_path=plan, model="echo", checkpoint_version=2)
    result = asyncio.run(steerflow.run_flow(options, home=home))
    assert result.status == "completed"
    return home, str(result.run_id)


def _fork(home: Path, run_id: str, node: str, instruction: str | None = None) -> Any:
    seed = steerflow.prepare_resume(home, run_id, from_node=node, instruction=instruction)
    options = FlowOptions(resume=seed, checkpoint_version=2)
    return asyncio.run(steerflow.run_flow(options, home=home))


def test_a_rerun_runs_the_edited_instruction_and_records_it(tmp_path: Path) -> None:
    home, source = _first_run(tmp_path)
    before = (home / "runs" / source / "checkpoint.json").read_bytes()
    result = _fork(home, source, "b", "Do b, in French.")
    assert result.status == "completed"
    assert result.rerun_from["rerun"] == ["b", "d", "synthesis"]
    assert result.to_json()["rerun"] == ["b", "d", "synthesis"]
    assert result.run_id != source
    assert (home / "runs" / source / "checkpoint.json").read_bytes() == before  # a fork
    state, _ = steerflow.load_checkpoint(Path(str(result.run_dir)))
    edit = {"original": "Do b.", "instruction": "Do b, in French.", "run_id": source}
    assert "Do b, in French." in state["ops"]["b"]["response"]  # echo: what it received
    assert "Do b, in French." not in state["ops"]["a"]["response"]
    assert state["ops"]["b"]["instruction_edited"] == edit
    assert state["config"]["edited_instructions"] == {"b": edit}
    detail = node_detail(home, str(result.run_id), "b")
    assert detail["instruction_edited"] == edit
    assert node_detail(home, str(result.run_id), "c")["instruction_edited"] is None
    assert detail["replayed"] is False
    assert node_detail(home, str(result.run_id), "a")["replayed"] is True


def test_the_edit_is_carried_down_the_chain(tmp_path: Path) -> None:
    home, source = _first_run(tmp_path)
    first = _fork(home, source, "b", "Do b, in French.")
    again = _fork(home, str(first.run_id), "c")  # b replays, with its edit
    state, _ = steerflow.load_checkpoint(Path(str(again.run_dir)))
    assert again.rerun_from["rerun"] == ["c", "d", "synthesis"]
    assert state["ops"]["b"]["instruction_edited"]["instruction"] == "Do b, in French."
    assert set(state["config"]["edited_instructions"]) == {"b"}


@pytest.mark.parametrize(
    ("where", "refusal"),
    [
        ("config", r"node 'b': its entry's instruction_edited .* does not match the config"),
        ("dropped", r"node 'b': its entry records an edited instruction .* no longer lists"),
        ("entry", r"node 'b': the stored response does not match its result_digest"),
        ("plan", r"node 'b': the plan's instruction is not the edited one"),
    ],
)
def test_a_changed_edit_record_refuses_the_next_resume(
    tmp_path: Path, where: str, refusal: str
) -> None:
    home, source = _first_run(tmp_path)
    fork = _fork(home, source, "b", "Do b, in French.")
    path = Path(str(fork.run_dir)) / "checkpoint.json"
    doc = json.loads(path.read_text())
    if where == "config":
        doc["config"]["edited_instructions"]["b"]["original"] = "Do something else."
    elif where == "dropped":
        del doc["config"]["edited_instructions"]
    elif where == "entry":  # the digest covers the entry's copy
        doc["ops"]["b"]["instruction_edited"]["original"] = "Do something else."
    else:
        next(i for i in doc["plan"] if i["agent_id"] == "b")["instruction"] = "Do b, quietly."
    path.write_text(json.dumps(doc))
    with pytest.raises(FlowResumeError, match=refusal):
        steerflow.prepare_resume(home, str(fork.run_id), fork=True)


def test_instruction_without_from_is_a_usage_error(tmp_path: Path) -> None:
    home, source = _first_run(tmp_path)
    with pytest.raises(UsageError, match="--from"):
        steerflow.prepare_resume(home, source, instruction="Do b, in French.")


def test_a_rerun_of_an_unknown_node_names_the_source(tmp_path: Path) -> None:
    home, source = _first_run(tmp_path)
    with pytest.raises(UsageError, match="not a node of this run") as refused:
        steerflow.prepare_resume(home, source, from_node="e")
    assert refused.value.source_ids["run_id"] == source


def test_resume_run_reruns_from_python(tmp_path: Path) -> None:
    """``steerflow.resume_run(home, run, from_node=...)``: the CLI's fork, in one call."""
    home, source = _first_run(tmp_path)
    result = asyncio.run(
        steerflow.resume_run(home, source, from_node="c", instruction="Do c, twice.")
    )
    assert result.status == "completed"
    assert result.rerun_from == {
        "node": "c",
        "rerun": ["c", "d", "synthesis"],
        "instruction_edited": {
            "original": "Do c.",
            "instruction": "Do c, twice.",
            "run_id": source,
        },
    }
    state, _ = steerflow.load_checkpoint(Path(str(result.run_dir)))
    assert "Do c, twice." in state["ops"]["c"]["response"]
    assert state["ops"]["b"]["response"] == _source_response(home, source, "b")  # replayed


def _source_response(home: Path, run_id: str, key: str) -> object:
    state, _ = steerflow.load_checkpoint(home / "runs" / run_id)
    return state["ops"][key]["response"]
