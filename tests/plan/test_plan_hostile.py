"""Plan text a careless or hostile author can write: repeated keys, booleans where a count
goes, nesting past the decoder's stack. Each is a PlanValidationError (exit 2) naming the
source, never a silent reading or a RecursionError."""

from __future__ import annotations

import pytest

from steerflow.errors import ExitCode, PlanValidationError
from steerflow.plan import parse_plan_text

ENTRY = "plan:\n  - agent_id: a\n    instruction: x\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "max_ops: no\n" + ENTRY,
            "p.yaml:1: max_ops: Value error, must be a whole number, not false",
        ),
        (
            "concurrency: yes\n" + ENTRY,
            "p.yaml:1: concurrency: Value error, must be a whole number, not true",
        ),
        (
            '{"max_ops": false, "plan": [{"agent_id": "a", "instruction": "x"}]}',
            "max_ops: Value error",
        ),
    ],
    ids=["yaml-no", "yaml-yes", "json-false"],
)
def test_a_boolean_count_is_refused(text: str, message: str) -> None:
    with pytest.raises(PlanValidationError, match=r"not (true|false)") as caught:
        parse_plan_text(text, source="p.yaml")
    assert message in str(caught.value)
    assert caught.value.exit_code == ExitCode.USAGE


def test_counts_still_read_numbers() -> None:
    plan = parse_plan_text("max_ops: 0\nconcurrency: 2\n" + ENTRY, source="p.yaml")
    assert (plan.max_ops, plan.concurrency) == (0, 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (ENTRY + ENTRY, "p.yaml:4: invalid YAML: duplicate key 'plan'"),
        ("name: a\nname: b\n" + ENTRY, "p.yaml:2: invalid YAML: duplicate key 'name'"),
        (
            "roles:\n  w: {model: echo}\n  w: {model: x}\n" + ENTRY,
            "p.yaml:3: invalid YAML: duplicate key 'w'",
        ),
        (
            '{"plan": [], "plan": [{"agent_id": "a", "instruction": "x"}]}',
            "p.yaml: invalid JSON: duplicate key 'plan'",
        ),
        (
            '{"plan": [{"agent_id": "a", "instruction": "x", "agent_id": "b"}]}',
            "duplicate key 'agent_id'",
        ),
    ],
    ids=["yaml-top", "yaml-name", "yaml-role", "json-top", "json-entry"],
)
def test_a_repeated_key_is_refused_not_overwritten(text: str, message: str) -> None:
    with pytest.raises(PlanValidationError) as caught:
        parse_plan_text(text, source="p.yaml")
    assert message in str(caught.value)


def test_a_merge_key_may_be_overridden_by_an_explicit_one() -> None:
    text = "plan:\n  - &a {agent_id: a, instruction: x}\n  - <<: *a\n    agent_id: b\n"
    plan = parse_plan_text(text, source="p.yaml")
    assert [e.agent_id for e in plan.plan] == ["a", "b"]
    assert plan.plan[1].instruction == "x"


@pytest.mark.parametrize("depth", [500, 100_000])
@pytest.mark.parametrize("form", ["json", "yaml"])
def test_nesting_past_the_stack_is_a_plan_error(form: str, depth: int) -> None:
    nested = "[" * depth + "]" * depth
    if form == "json":
        text = '{"plan": [{"agent_id": "a", "instruction": "x", "extra": ' + nested + "}]}"
    else:
        text = f"plan:\n  - agent_id: a\n    instruction: {nested}\n"
    with pytest.raises(PlanValidationError, match=r"p\.yaml") as caught:
        parse_plan_text(text, source="p.yaml")
    assert caught.value.exit_code == ExitCode.USAGE


def test_a_key_repeated_after_a_merge_is_still_refused() -> None:
    text = "base: &b {instruction: x}\nplan:\n  - <<: *b\n    agent_id: a\n    agent_id: b\n"
    with pytest.raises(
        PlanValidationError, match=r"p\.yaml:5: invalid YAML: duplicate key 'agent_id'"
    ):
        parse_plan_text(text, source="p.yaml")


def test_a_sequence_used_as_a_key_is_left_to_yaml() -> None:
    text = ENTRY + "? [1, 2]\n: 3\n? [1, 2]\n: 4\n"
    with pytest.raises(PlanValidationError, match=r"p\.yaml:4: invalid YAML: found unhashable key"):
        parse_plan_text(text, source="p.yaml")
