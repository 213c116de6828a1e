"""Escalation ladders through the CLI: splice, refusal, and the chain across resumes.

Each model of a ladder is a ``script:`` file: a node fails at the base model and the
retry (spawn id ``<agent_id>.esc<N>``) answers or fails at the next one.  Between
generations a script file is rewritten: the model spec (its path) stays what the
checkpoint recorded, its behaviour changes.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from flow_support import finish, read_invocations, run_cli, start_cli, stop, wait_for, write_yaml
from resume_support import new_runs, resume, single_run

from steerflow.checkpoint import entry_digest, load_checkpoint

pytestmark = pytest.mark.timeout(180)


def ladder_plan(tmp_path: Path, models: int) -> tuple[Path, list[Path]]:
    """Plan ``a`` (role ``worker``: base + ``models`` ladder steps) -> ``b``, fallback ``fb``."""
    scripts = [tmp_path / f"m{i}.yaml" for i in range(models + 1)]
    write_yaml(scripts[0], {"a": {"fail": "base model failed"}})
    for i, script in enumerate(scripts[1:], 1):
        write_yaml(script, {"*": {"response": f"answer from m{i}"}})
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "roles": {
                "worker": {
                    "model": f"script:{scripts[0]}",
                    "escalation": [f"script:{s}" for s in scripts[1:]],
                }
            },
            "plan": [
                {"agent_id": "a", "assignee": "worker", "instruction": "do a"},
                {"agent_id": "b", "instruction": "use a", "depends_on": ["a"]},
                {
                    "agent_id": "fb",
                    "instruction": "fallback",
                    "depends_on": [{"id": "a", "when": "failed"}],
                },
            ],
        },
    )
    return plan, scripts


def state_of(run_dir: Path) -> dict[str, Any]:
    state, _ = load_checkpoint(run_dir)
    return state


def retries(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["spawn_id"]: e for e in state["spawned"] if e.get("escalated_from")}


def keys_by_node(state: dict[str, Any]) -> dict[str, str]:
    keys = {p["node_id"]: p["agent_id"] for p in state["plan"]}
    keys.update({e["node_id"]: e["spawn_id"] for e in state["spawned"]})
    return keys


def chain(state: dict[str, Any]) -> set[tuple[str, str, str]]:
    """``(retry, escalated_from key, parent key)`` of every recorded retry."""
    keys = keys_by_node(state)
    return {
        (key, keys[e["escalated_from"]], keys[e["parent_id"]]) for key, e in retries(state).items()
    }


def node(home: Path, run: str, key: str) -> dict[str, Any]:
    shown = run_cli(home, "show", run, key, "--json")
    assert shown.returncode == 0, shown.explain()
    return shown.json


def interrupt_when_invoked(home: Path, plan: Path, key: str) -> None:
    """Start ``flow --plan``; SIGINT it once ``key`` is invoked (its call is cancelled)."""
    proc = start_cli(home, "flow", "--plan", plan, "--json")
    try:
        wait_for(
            lambda: any(line["node"] == key for line in read_invocations(home)),
            timeout=60,
            what=f"{key} invoked",
        )
        proc.send_signal(signal.SIGINT)
        done = finish(proc, timeout=60)
    finally:
        stop(proc)
    assert done.returncode == 130, done.explain()


def test_a_retry_rescues_the_node_and_the_fallback_stays_quiet(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plan, scripts = ladder_plan(tmp_path, 1)
    done = run_cli(home, "flow", "--plan", plan, "--json")
    assert done.returncode == 0, done.explain()
    assert {n["id"]: n["status"] for n in done.json["nodes"]} == {
        "a": "failed",
        "b": "completed",
        "fb": "skipped",
        "a.esc1": "completed",
    }
    # progress shows each attempt and its model
    assert f"start a (model script:{scripts[0]})" in done.stderr
    assert f"node spawned a.esc1 (escalation 1 after a, model script:{scripts[1]})" in done.stderr
    assert f"start a.esc1 (model script:{scripts[1]})" in done.stderr
    run = done.json["run_id"]
    retry = node(home, run, "a.esc1")
    assert (retry["escalation_attempt"], retry["model"]) == (1, f"script:{scripts[1]}")
    assert retry["instruction"] == "do a" and retry["parent"] == "a"
    assert "### a.esc1 (completed)\nanswer from m1" in node(home, run, "b")["instruction"]
    state = state_of(single_run(home))
    assert chain(state) == {("a.esc1", "a", "a")}
    assert retries(state)["a.esc1"]["model"] == f"script:{scripts[1]}"


def test_a_retry_refused_by_the_budget_is_printed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plan, _ = ladder_plan(tmp_path, 1)
    done = run_cli(home, "flow", "--plan", plan, "--max-ops", "3", "--json")
    assert done.returncode == 1, done.explain()
    assert "spawn rejected a (max_spawn_exceeded: spawn budget of 0 used up)" in done.stderr
    assert {n["id"]: n["status"] for n in done.json["nodes"]} == {
        "a": "failed",
        "b": "skipped",
        "fb": "completed",
    }
    assert done.json["spawn_rejections"] == [
        {
            "emitter": "a",
            "agent_id": "a.esc1",
            "reason": "max_spawn_exceeded",
            "detail": "spawn budget of 0 used up",
        }
    ]


def test_a_failed_retry_still_gates_its_dependents_under_retry_failed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plan, scripts = ladder_plan(tmp_path, 1)
    write_yaml(scripts[1], {"a.esc1": {"fail": "m1 failed too"}})
    first = run_cli(home, "flow", "--plan", plan, "--json")
    assert first.returncode == 1, first.explain()
    statuses = {n["id"]: n["status"] for n in first.json["nodes"]}
    assert statuses["a.esc1"] == "failed" and statuses["fb"] == "completed"
    assert statuses["b"] == "skipped"
    source = single_run(home)
    refused = resume(home, source.name, "--json")
    assert refused.returncode == 3, refused.explain()
    assert "'a.esc1' failed in the recorded run" in refused.json["error"]["message"]
    write_yaml(scripts[1], {"*": {"response": "answer from m1"}})
    again = resume(home, source.name, "--retry-failed", "--json")
    assert again.returncode == 0, again.explain()
    statuses = {n["id"]: n["status"] for n in again.json["nodes"]}
    # a stays the failed attempt it was; b waited for the retried retry and used its answer
    assert statuses == {"a": "failed", "b": "completed", "fb": "completed", "a.esc1": "completed"}
    run = again.json["run_id"]
    assert "### a.esc1 (completed)\nanswer from m1" in node(home, run, "b")["instruction"]
    assert node(home, run, "a.esc1")["model"] == f"script:{scripts[1]}"
    assert chain(state_of(new_runs(home, [source])[0])) == {("a.esc1", "a", "a")}


def test_pending_then_failed_then_retried_across_two_resumes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plan, scripts = ladder_plan(tmp_path, 1)
    model = f"script:{scripts[1]}"
    write_yaml(scripts[1], {"a.esc1": {"delay": 60}})
    interrupt_when_invoked(home, plan, "a.esc1")
    gen0 = single_run(home)
    state = state_of(gen0)
    assert retries(state)["a.esc1"]["status"] == "pending"
    assert chain(state) == {("a.esc1", "a", "a")}

    write_yaml(scripts[1], {"a.esc1": {"fail": "m1 failed"}})
    first = resume(home, gen0.name, "--json")  # pending runs without --retry-failed
    assert first.returncode == 1, first.explain()
    gen1 = new_runs(home, [gen0])[0]
    state = state_of(gen1)
    entry = retries(state)["a.esc1"]
    assert (entry["status"], entry["model"]) == ("failed", model)
    assert chain(state) == {("a.esc1", "a", "a")}
    # remapped: the resumed run's planned node ids, not the source's
    assert entry["escalated_from"] == state["plan"][0]["node_id"] == entry["parent_id"]
    assert entry["escalated_from"] != state_of(gen0)["plan"][0]["node_id"]

    write_yaml(scripts[1], {"*": {"response": "answer from m1"}})
    second = resume(home, gen1.name, "--retry-failed", "--json")
    assert second.returncode == 0, second.explain()
    gen2 = new_runs(home, [gen0, gen1])[0]
    state = state_of(gen2)
    entry = retries(state)["a.esc1"]
    assert (entry["status"], entry["model"], entry["response"]) == (
        "completed",
        model,
        "answer from m1",
    )
    assert chain(state) == {("a.esc1", "a", "a")}
    assert state["ops"]["a"]["status"] == "failed" and state["ops"]["b"]["status"] == "completed"
    run = second.json["run_id"]
    assert node(home, run, "a.esc1")["model"] == model
    assert "answer from m1" in node(home, run, "b")["instruction"]


def final_graph(home: Path, run_dir: Path, run: str) -> tuple[set[Any], str, dict[str, str]]:
    state = state_of(run_dir)
    statuses = {k: v["status"] for k, v in state["ops"].items()}
    statuses.update({e["spawn_id"]: e["status"] for e in state["spawned"]})
    return chain(state), node(home, run, "b")["instruction"], statuses


def test_restored_retries_then_a_further_escalation_pick_the_same_anchor(tmp_path: Path) -> None:
    straight_home, broken_home = tmp_path / "straight", tmp_path / "broken"
    plan, scripts = ladder_plan(tmp_path, 3)
    write_yaml(scripts[1], {"a.esc1": {"fail": "m1 failed"}})
    write_yaml(scripts[2], {"a.esc2": {"fail": "m2 failed"}})
    straight = run_cli(straight_home, "flow", "--plan", plan, "--json")
    assert straight.returncode == 0, straight.explain()
    expected = final_graph(straight_home, single_run(straight_home), straight.json["run_id"])
    assert expected[0] == {
        ("a.esc1", "a", "a"),
        ("a.esc2", "a", "a.esc1"),
        ("a.esc3", "a", "a.esc2"),
    }

    write_yaml(scripts[2], {"a.esc2": {"delay": 60}})
    interrupt_when_invoked(broken_home, plan, "a.esc2")
    source = single_run(broken_home)
    assert {k: e["status"] for k, e in retries(state_of(source)).items()} == {
        "a.esc1": "failed",
        "a.esc2": "pending",
    }
    write_yaml(scripts[2], {"a.esc2": {"fail": "m2 failed"}})
    resumed = resume(broken_home, source.name, "--json")
    assert resumed.returncode == 0, resumed.explain()
    got = final_graph(broken_home, new_runs(broken_home, [source])[0], resumed.json["run_id"])
    assert got == expected
    assert "### a.esc3 (completed)\nanswer from m3" in got[1]


@pytest.mark.parametrize(
    ("corrupt", "why"),
    [
        (
            lambda e, s: e.update(spawn_id="a.esc2", escalation=2),
            "attempt 2 cannot follow attempt 0",
        ),
        (lambda e, s: e.update(escalation=2), "records attempt 2 but its spawn_id is attempt 1"),
        (lambda e, s: e.update(escalation=True), "escalation 'True' is not an attempt number"),
        (
            lambda e, s: e.pop("escalated_from"),
            "records escalation attempt 1 but not the operation it retries",
        ),
        (
            lambda e, s: e.update(escalated_from=s["plan"][1]["node_id"]),
            "has no recorded failed first attempt",
        ),
        (lambda e, s: e.update(parent_id="f" * 32), "is neither 'a' nor a retry of it"),
    ],
)
def test_a_chain_that_cannot_be_rebuilt_refuses_the_resume(
    tmp_path: Path, corrupt: Any, why: str
) -> None:
    home = tmp_path / "home"
    plan, scripts = ladder_plan(tmp_path, 1)
    write_yaml(scripts[1], {"a.esc1": {"fail": "m1 failed too"}})
    first = run_cli(home, "flow", "--plan", plan, "--checkpoint-version", "2", "--json")
    assert first.returncode == 1, first.explain()
    path = single_run(home) / "checkpoint.json"
    doc = json.loads(path.read_text())
    (entry,) = [e for e in doc["spawned"] if e.get("escalated_from")]
    corrupt(entry, doc)
    # Sealed again: a consistently wrong entry, which only the chain rules can refuse
    # (an unsealed edit is refused by its digest, see the next test).
    entry["result_digest"] = entry_digest(entry)
    path.write_text(json.dumps(doc))
    refused = resume(home, single_run(home).name, "--retry-failed", "--json")
    assert refused.returncode == 3, refused.explain()
    error = refused.json["error"]
    assert error["code"] == "resume-refused"
    assert "escalation chain cannot be rebuilt" in error["message"] and why in error["message"]
    assert f"spawned node {entry['spawn_id']!r}" in error["message"]


def _journal_lines(run_dir: Path) -> list[dict[str, Any]]:
    journal = run_dir / "checkpoint.json.journal"
    return [json.loads(line) for line in journal.read_text().splitlines()]


def _write_journal(run_dir: Path, records: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    (run_dir / "checkpoint.json.journal").write_text(text)


@pytest.mark.parametrize("flags", [(), ("--retry-failed",)])
def test_a_retry_that_lost_its_witness_is_refused_as_itself(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    """Issue 26 item 6: ``escalated_from`` is covered by the retry's digest. Dropped from
    every journal record of ``a.esc1``, the retry no longer loads as an ordinary spawn
    under the failed ``a`` (refused as ``a``, or with --retry-failed ``a`` paid for again
    and the retry rejected as a duplicate): the resume names ``a.esc1`` and runs nothing."""
    home = tmp_path / "home"
    plan, _ = ladder_plan(tmp_path, 1)
    done = run_cli(home, "flow", "--plan", plan, "--json")
    assert done.returncode == 0, done.explain()
    run_dir = single_run(home)
    records = _journal_lines(run_dir)
    touched = 0
    for record in records:
        if record["entry"].get("spawn_id") == "a.esc1":
            record["entry"].pop("escalated_from")
            touched += 1
    assert touched >= 2  # the pending intent and the outcome
    _write_journal(run_dir, records)
    invoked = len(read_invocations(home))
    refused = resume(home, run_dir.name, *flags, "--json")
    assert refused.returncode == 3, refused.explain()
    message = refused.json["error"]["message"]
    assert message.startswith("spawned node 'a.esc1': "), message
    assert "result_digest" in message
    assert len(read_invocations(home)) == invoked
