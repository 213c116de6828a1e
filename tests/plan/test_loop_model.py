"""Loops in a plan (issue 40 item 4): ``{loop: {id, body, until, max_rounds, on_max_rounds}}``.

A loop item is checked by the plan file's model, and ``steerflow.Loop`` by the very same
model, so the same invalid input gets the same message naming the key, from a file or
from code; a valid loop expands into its round-1 entries (``X.r1``), and folds back
from a checkpoint's plan.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from steerflow import Edge, Loop, Op, Plan, Role
from steerflow.errors import PlanValidationError
from steerflow.plan import load_plan_file, parse_plan, plan_from_checkpoint, plan_to_checkpoint


def _entry(agent_id: str, instruction: str = "do it", **extra: Any) -> dict[str, Any]:
    return {"agent_id": agent_id, "instruction": instruction, **extra}


def _loop(**over: Any) -> dict[str, Any]:
    loop: dict[str, Any] = {
        "id": "refine",
        "body": [_entry("draft"), _entry("critique", depends_on=["draft"])],
        "until": {"node": "critique", "contains": "LGTM"},
    }
    return {"loop": {**loop, **over}}


def _plan(*items: dict[str, Any]) -> dict[str, Any]:
    return {"plan": list(items)}


VALID = _plan(
    _entry("brief"),
    _loop(body=[_entry("draft", depends_on=["brief"]), _entry("critique", depends_on=["draft"])]),
    _entry("publish", depends_on=["refine"]),
)

# (case, plan-file content, what the message must say, naming the key)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    (
        "until-node-not-in-body",
        _plan(_loop(until={"node": "x", "contains": "OK"})),
        "plan[0].loop.until.node: 'x' is not a body entry (body: draft, critique)",
    ),
    (
        "until-contains-missing",
        _plan(_loop(until={"node": "critique"})),
        "plan[0].loop.until: Value error, give {node, contains} (both)",
    ),
    (
        "until-both-forms",
        _plan(_loop(until={"node": "critique", "contains": "x", "python": "python:m:f"})),
        "plan[0].loop.until: Value error, give either {node, contains} or {python}",
    ),
    (
        "until-bad-python",
        _plan(_loop(until={"python": "m.f"})),
        "plan[0].loop.until.python: String should match pattern",
    ),
    ("empty-body", _plan(_loop(body=[])), "plan[0].loop.body: List should have at least 1 item"),
    (
        "body-entry-field",
        _plan(_loop(body=[_entry("draft", "")], until={"node": "draft", "contains": "k"})),
        "plan[0].loop.body[0].instruction: String should have at least 1 character",
    ),
    ("zero-rounds", _plan(_loop(max_rounds=0)), "plan[0].loop.max_rounds: Input should be greater"),
    ("many-rounds", _plan(_loop(max_rounds=101)), "plan[0].loop.max_rounds: Input should be less"),
    (
        "on-max-rounds",
        _plan(_loop(on_max_rounds="explode")),
        "plan[0].loop.on_max_rounds: Input should be 'stop' or 'fail'",
    ),
    ("bad-loop-id", _plan(_loop(id="../x")), "plan[0].loop.id: String should match pattern"),
    ("unknown-loop-key", _plan(_loop(forever=True)), "plan[0].loop.forever: unknown field"),
    (
        "repeated-body-id",
        _plan(_loop(body=[_entry("draft"), _entry("draft")])),
        "plan[0].loop.body[1].agent_id 'draft' repeats body[0]",
    ),
    (
        "body-id-repeats-entry",
        _plan(_entry("draft"), _loop()),
        "plan[1].loop.body[0].agent_id 'draft' repeats plan[0]",
    ),
    (
        "body-depends-on-unknown",
        _plan(_loop(body=[_entry("draft", depends_on=["zz"]), _entry("critique")])),
        "plan[0].loop.body[0] ('draft') depends on unknown agent_id 'zz'",
    ),
    (
        "body-depends-on-its-loop",
        _plan(_loop(body=[_entry("draft", depends_on=["refine"]), _entry("critique")])),
        "plan[0].loop.body[0] ('draft') depends on its own loop",
    ),
    (
        "body-cycle",
        _plan(
            _loop(
                body=[
                    _entry("draft", depends_on=["critique"]),
                    _entry("critique", depends_on=["draft"]),
                ]
            )
        ),
        "plan[0].loop.body has a dependency cycle: draft -> critique -> draft",
    ),
    (
        "body-inherits-context",
        _plan(_loop(body=[_entry("draft"), _entry("critique", inherit_context=True)])),
        "plan[0].loop.body[1].inherit_context: a body entry cannot inherit",
    ),
    (
        "entry-depends-on-body",
        _plan(_loop(), _entry("publish", depends_on=["critique"])),
        "plan[1] ('publish') depends on 'critique', a body entry of loop 'refine': "
        "depend on the loop id 'refine' instead",
    ),
    (
        "entry-takes-a-round-id",
        _plan(_loop(), _entry("draft.r2")),
        "plan[1] id 'draft.r2' is the id of round 2 of loop 'refine''s body entry 'draft'",
    ),
    (
        "round-id-too-long",
        _plan(
            _loop(body=[_entry("d" * 62)], until={"node": "d" * 62, "contains": "k"}, max_rounds=10)
        ),
        "plan[0].loop.max_rounds: round id",
    ),
    (
        "loop-id-repeats-entry",
        _plan(_entry("refine"), _loop()),
        "plan[1].loop.id 'refine' repeats plan[0]",
    ),
    (
        "after-the-loop-unknown-dependency",
        _plan(_loop(), _entry("publish", depends_on=["zz"])),
        "plan[1] ('publish') depends on unknown agent_id 'zz'",
    ),
    (
        "loop-dependency-cycle",
        _plan(
            _entry("a", depends_on=["refine"]),
            _loop(body=[_entry("draft", depends_on=["a"]), _entry("critique")]),
        ),
        "plan has a dependency cycle",
    ),
    (
        "entry-id-repeats-loop",
        _plan(_loop(), _entry("refine")),
        "plan[1].agent_id 'refine' repeats plan[0]",
    ),
    (
        "body-role-with-escalation",
        {
            "roles": {"w": {"escalation": ["echo"]}},
            "plan": [_loop(body=[_entry("draft", assignee="w"), _entry("critique")])],
        },
        "plan[0].loop.body[0].assignee: role 'w' has an escalation ladder",
    ),
    ("reserved-loop-id", _plan(_loop(id="synthesis")), "plan[0].loop.id 'synthesis' is reserved"),
]


def _op(entry: dict[str, Any]) -> Op:
    deps = [Edge(**d) if isinstance(d, dict) else d for d in entry.get("depends_on", [])]
    return Op(**{**entry, "depends_on": deps})


def _from_data(data: dict[str, Any]) -> Plan:
    """The code spelling of plan-file ``data``: ``Op`` and ``Loop`` given as written."""
    ops: list[Op | Loop] = []
    for item in data["plan"]:
        if "loop" in item:
            spec = dict(item["loop"])
            spec["body"] = [_op(e) for e in spec["body"]]
            ops.append(Loop(**spec))
        else:
            ops.append(_op(item))
    roles = {name: Role(**spec) for name, spec in data.get("roles", {}).items()}
    return Plan(ops=ops, roles=roles)


def _problems(message: str) -> list[str]:
    lines = message.splitlines()
    assert lines[0] == "invalid plan:", message
    return [re.sub(r"^  (<Plan>|/\S+?)(:\d+)?: ", "", line) for line in lines[1:]]


def test_the_problem_list_is_not_empty() -> None:
    assert len(INVALID) >= 20


@pytest.mark.parametrize(("data", "says"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_a_bad_loop_is_refused_alike_from_a_file_and_from_code(
    tmp_path: Path, data: dict[str, Any], says: str
) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    with pytest.raises(PlanValidationError) as from_file:
        load_plan_file(path)
    assert says in str(from_file.value)
    if "forever" in str(data):
        return  # an unknown key has no spelling in code: Loop has no such parameter
    with pytest.raises(PlanValidationError) as from_code:
        _from_data(data)
    assert _problems(str(from_code.value)) == _problems(str(from_file.value))
    assert str(from_code.value).startswith("invalid plan:\n  <Plan>: ")


def test_a_loop_expands_into_its_first_round() -> None:
    plan = parse_plan(VALID, source="x")
    assert [e.agent_id for e in plan.plan] == ["brief", "draft.r1", "critique.r1", "publish"]
    deps = {e.agent_id: [d.id for d in e.dependencies] for e in plan.plan}
    assert deps == {
        "brief": [],
        "draft.r1": ["brief"],
        "critique.r1": ["draft.r1"],
        "publish": ["draft.r1", "critique.r1"],
    }
    (loop,) = plan.loops
    assert (loop.id, loop.max_rounds, loop.on_max_rounds) == ("refine", 3, "stop")
    assert loop.body_ids == ["draft", "critique"]


def test_a_condition_on_the_loop_holds_for_each_body_node() -> None:
    data = _plan(_loop(), _entry("fallback", depends_on=[{"id": "refine", "when": "failed"}]))
    plan = parse_plan(data, source="x")
    fallback = plan.plan[-1]
    assert [(d.id, d.when) for d in fallback.dependencies] == [
        ("draft.r1", "failed"),
        ("critique.r1", "failed"),
    ]


def test_a_plan_without_loops_is_read_as_before() -> None:
    plan = parse_plan(_plan(_entry("a"), _entry("b", depends_on=["a"])), source="x")
    assert plan.loops == []
    assert plan.plan == list(plan.items)
    assert plan_to_checkpoint(plan) == [
        {"agent_id": "a", "dep_indices": [], "assignee": None, "instruction": "do it"},
        {"agent_id": "b", "dep_indices": [0], "assignee": None, "instruction": "do it"},
    ]


def test_a_checkpoint_plan_folds_back_into_the_same_loop() -> None:
    data = _plan(
        _entry("brief"),
        _loop(
            body=[_entry("draft", depends_on=["brief"]), _entry("critique", depends_on=["draft"])],
            until={"python": "python:loop_fns:approved"},
            max_rounds=5,
            on_max_rounds="fail",
        ),
        _entry("publish", depends_on=["refine"]),
    )
    plan = parse_plan(data, source="x")
    stored = plan_to_checkpoint(plan)
    assert stored[1]["loop"] == {
        "id": "refine",
        "until": {"python": "python:loop_fns:approved"},
        "max_rounds": 5,
        "on_max_rounds": "fail",
    }
    back = plan_from_checkpoint(stored, source="checkpoint")
    assert [_shape(loop) for loop in back.loops] == [_shape(loop) for loop in plan.loops]
    assert back.plan == plan.plan


def _shape(loop: Any) -> tuple[Any, ...]:
    body = [(e.agent_id, e.instruction, e.dependencies) for e in loop.body]
    return (loop.id, loop.until, loop.max_rounds, loop.on_max_rounds, body)


def test_loop_round_trips_through_yaml() -> None:
    plan = _from_data(VALID)
    again = Plan.from_plan_file(parse_plan(yaml.safe_load(plan.to_yaml()), source="y"))
    assert again == plan
    assert isinstance(again.ops[1], Loop)
    assert again.ops[1].body[0].agent_id == "draft"


def test_a_loop_body_must_hold_ops() -> None:
    with pytest.raises(
        PlanValidationError, match=r"plan\[0\]\.loop\.body\[0\]: expected a steerflow\.Op"
    ):
        Plan(ops=[Loop("l", body=[{"agent_id": "a"}], until={"node": "a", "contains": "k"})])  # type: ignore[list-item]


def test_a_lambda_until_is_refused_with_the_fix() -> None:
    with pytest.raises(Exception, match=r"Loop\.until"):
        Loop("l", body=[Op("a", "x")], until=lambda replies: True)
