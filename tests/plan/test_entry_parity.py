"""One table of invalid per-node input, refused alike by a plan file and by code (issue 40).

Each case is the same content written two ways: a plan file (``parse_plan_text``) and
``Plan``/``Op``. Both raise :class:`PlanValidationError` with the same problem lines
(only the source differs: the file name and line against ``<Plan>``), and the message
names the key. A case only one side can express leaves the other out. Data-driven, so
other plan entry kinds (a ``loop:`` entry, ``steerflow.Loop``) add rows to ``CASES``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from steerflow.errors import PlanValidationError
from steerflow.plan import CODE_SOURCE, Op, Plan, parse_plan_text

SOURCE = "plan.yaml"


def shout(call: object) -> str:
    """A module-level function: what ``Op(fn=...)`` takes."""
    return "x"


@dataclass(frozen=True)
class Case:
    """One invalid input: as a plan file, as code, and what the message must name."""

    id: str
    #: The plan file's content; None when a file cannot say it (a Python callable).
    file: dict[str, Any] | None
    #: Builds the same plan in code; None: ``Plan(ops=[Op(**entry)])`` of ``file``'s
    #: single entry. A case code cannot express sets ``code_error`` instead.
    code: Callable[[], object] | None
    names: str
    #: When code refuses it another way (a keyword Python itself refuses): that type.
    code_error: type[Exception] = PlanValidationError


def _entry(**extra: Any) -> dict[str, Any]:
    return {"agent_id": "a", "instruction": "do it", **extra}


def _one(**extra: Any) -> Case:
    """Shorthand for a case whose only entry carries ``extra`` on both sides."""
    key = next(iter(extra))
    return Case("", {"plan": [_entry(**extra)]}, None, f"plan[0].{key}")


def _case(case_id: str, base: Case, names: str | None = None) -> Case:
    return Case(case_id, base.file, base.code, names or base.names, base.code_error)


CASES: list[Case] = [
    _case("model-empty", _one(model="")),
    _case("model-not-text", _one(model=5)),
    _case("retry-attempts-negative", _one(retry={"attempts": -1}), "plan[0].retry.attempts"),
    _case("retry-attempts-text", _one(retry={"attempts": "x"}), "plan[0].retry.attempts"),
    _case("retry-attempts-bool", _one(retry={"attempts": True}), "plan[0].retry.attempts"),
    _case("retry-attempts-missing", _one(retry={"backoff_s": 1}), "plan[0].retry.attempts"),
    _case(
        "retry-unknown-key",
        _one(retry={"attempts": 1, "tries": 2}),
        "plan[0].retry.tries: unknown field",
    ),
    _case(
        "retry-backoff-negative",
        _one(retry={"attempts": 1, "backoff_s": -1}),
        "plan[0].retry.backoff_s",
    ),
    _case("retry-not-a-mapping", _one(retry=3), "plan[0].retry"),
    _case("timeout-zero", _one(timeout_s=0)),
    _case("timeout-negative", _one(timeout_s=-5)),
    _case("timeout-infinite", _one(timeout_s=math.inf)),
    _case("timeout-text", _one(timeout_s="soon")),
    Case(
        "retry-on-a-tool-node",
        {"plan": [_entry(tools=["python:os:getcwd"], retry={"attempts": 1})]},
        None,
        "plan[0] ('a').retry: a node with tools is not retried",
    ),
    Case(
        "fn-and-model",
        None,
        lambda: Plan(ops=[Op("a", "do it", fn=shout, model="echo")]),
        "plan[0].fn: give fn or model, not both",
    ),
    Case(
        "unknown-entry-key",
        {"plan": [_entry(modle="echo")]},
        lambda: Op("a", "do it", modle="echo"),  # type: ignore[call-arg]
        "modle",
        code_error=TypeError,
    ),
]


def _problems(message: str) -> list[str]:
    """The message's problem lines without where they were found (file:line or <Plan>)."""
    lines = message.splitlines()
    assert lines[0] == "invalid plan:", message
    return [re.sub(rf"^  ({re.escape(CODE_SOURCE)}|{SOURCE})(:\d+)?: ", "", x) for x in lines[1:]]


def _from_file(data: dict[str, Any]) -> str:
    text = yaml.safe_dump(data, sort_keys=False)
    with pytest.raises(PlanValidationError) as refused:
        parse_plan_text(text, source=SOURCE)
    return str(refused.value)


def _from_code(case: Case) -> str:
    build = case.code
    if build is None:
        assert case.file is not None
        entries = case.file["plan"]
        ops = [Op(**entry) for entry in entries]
        rest = {k: v for k, v in case.file.items() if k != "plan"}

        def build() -> object:
            return Plan(ops=ops, **rest)

    with pytest.raises(case.code_error) as refused:
        build()
    return str(refused.value)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_same_invalid_input_gets_the_same_error_from_a_file_and_from_code(
    case: Case,
) -> None:
    file_message = _from_file(case.file) if case.file is not None else None
    code_message = _from_code(case)
    for message in (file_message, code_message):
        if message is not None:
            assert case.names in message, message
    if file_message is not None and case.code_error is PlanValidationError:
        assert _problems(code_message) == _problems(file_message)
        assert code_message.startswith(f"invalid plan:\n  {CODE_SOURCE}: ")
        assert file_message.startswith(f"invalid plan:\n  {SOURCE}:")


def test_every_case_names_a_distinct_input() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert all(c.file is not None or c.code is not None for c in CASES)
