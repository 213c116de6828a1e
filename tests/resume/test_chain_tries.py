"""Calls a retrying node made across a resume chain (issue 40, decision 278).

The source's open intents give each node's highest attempt number; the ``config`` member
``tries_before`` carries a count for a node a run never called again. A value that is not
a count is ignored (never a crash), and only retrying nodes that still have to run are
carried forward.
"""

from __future__ import annotations

from steerflow.checkpoint._intents import in_flight_call
from steerflow.executor import build_graph
from steerflow.orchestrate._tries import TRIES_KEY, chain_tries, tries_member
from steerflow.plan import parse_plan


def _call(node: str, attempt: int) -> object:
    return in_flight_call(
        {"call_id": f"{attempt:032x}", "node": node, "record": "op", "key": node,
         "attempt": attempt, "model": "echo", "started_at": 1.0,
         "reserved_cost_usd": None, "reserved_tokens": None}
    )  # fmt: skip


def test_the_highest_attempt_or_the_carried_count_wins() -> None:
    config = {TRIES_KEY: {"a": 3, "b": 1, "junk": "x", "neg": -2, "flag": True}}
    tries = chain_tries(config, [_call("b", 4), _call("b", 2), _call("c", 1)])  # type: ignore[list-item]
    assert tries == {"a": 3, "b": 4, "c": 1}
    assert chain_tries({TRIES_KEY: "not a mapping"}, []) == {}


def test_only_retrying_nodes_that_still_run_are_carried_forward() -> None:
    plan = parse_plan(
        {"plan": [
            {"agent_id": "a", "instruction": "x", "retry": {"attempts": 2}},
            {"agent_id": "b", "instruction": "y"},
            {"agent_id": "c", "instruction": "z", "retry": {"attempts": 1}},
        ]},
        source="test",
    )  # fmt: skip
    graph = build_graph(plan)
    graph.by_key["c"].status = "completed"
    assert tries_member({"a": 1, "b": 1, "c": 1, "gone": 2}, graph) == {"a": 1}
