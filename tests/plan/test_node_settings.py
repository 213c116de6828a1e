"""Per-node settings in plans (issue 40 items 1 and 5): ``Op(fn=...)``, model specs a resume
could not import, the checkpoint's copy of an entry, and consent for an entry's model."""

from __future__ import annotations

from typing import Any

import pytest

import fn_nodes
from steerflow import Op, Plan, Role, Synthesis
from steerflow.errors import InvalidValueError, PlanValidationError, UsageError
from steerflow.executor import build_graph
from steerflow.orchestrate._consent import check_agent_worker_consent, check_python_consent
from steerflow.plan import parse_plan, plan_from_checkpoint, plan_to_checkpoint


def _plan(*entries: dict[str, Any], **extra: Any) -> Any:
    return parse_plan({"plan": list(entries), **extra}, source="plan.yaml")


def test_a_function_op_records_its_importable_spec_as_its_model() -> None:
    op = Op("a", "do it", fn=fn_nodes.record)
    assert op.fn is fn_nodes.record
    plan = Plan([op, Op("b", "then", depends_on=["a"])])
    assert plan.to_data()["plan"][0]["model"] == "python:fn_nodes:record"
    assert plan.plan_file.plan[0].model == "python:fn_nodes:record"
    assert plan.plan_file.plan[1].model is None
    # Read back from its YAML, the op names the spec (the callable is not data).
    again = Plan.from_plan_file(plan.plan_file)
    assert again.ops[0].model == "python:fn_nodes:record" and again.ops[0].fn is None


def test_a_function_op_that_a_resume_could_not_import_is_refused() -> None:
    with pytest.raises(InvalidValueError, match=r"Op\.fn.*lambda cannot be a function node"):
        Op("a", "x", fn=lambda call: "x")

    def inner(call: object) -> str:
        return "x"

    with pytest.raises(InvalidValueError, match="inside another function"):
        Op("a", "x", fn=inner)
    with pytest.raises(InvalidValueError, match=r"Op\.fn.*not a function"):
        Op("a", "x", fn="python:fn_nodes:record")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "names"),
    [
        (lambda: Op("a", "x", model=fn_nodes.record), "Op.model"),  # type: ignore[arg-type]
        (lambda: Role(model=fn_nodes.record), "Role.model"),  # type: ignore[arg-type]
        (lambda: Plan([Op("a", "x")], model=fn_nodes.record), "Plan.model"),  # type: ignore[arg-type]
    ],
)
def test_a_function_is_not_a_model_spec(build: Any, names: str) -> None:
    with pytest.raises(InvalidValueError, match="is a function, not a model spec") as refused:
        build()
    assert names in str(refused.value)
    assert "fn=" in str(refused.value)


@pytest.mark.parametrize(
    ("build", "where"),
    [
        (lambda: Plan([Op("a", "x", model="python:__main__:f")]), "plan[0].model"),
        (lambda: Plan([Op("a", "x")], model=" python:__main__:f"), "model"),
        (
            lambda: Plan(
                [Op("a", "x", assignee="w")], roles={"w": Role(model="python:__main__:f")}
            ),
            "roles.w.model",
        ),
        (
            lambda: Plan([Op("a", "x")], roles={"w": Role(escalation=["python:__main__:f"])}),
            "roles.w.escalation[0]",
        ),
        (
            lambda: Plan([Op("a", "x")], synthesis=Synthesis("sum", model="python:__main__:f")),
            "synthesis.model",
        ),
    ],
)
def test_a_main_spec_given_in_code_is_refused_when_the_plan_is_built(
    build: Any, where: str
) -> None:
    with pytest.raises(PlanValidationError) as refused:
        build()
    message = str(refused.value)
    assert f"<Plan>: {where}: 'python:__main__:f' names a function of the script" in message
    assert "define it with `def` at the top level of a module" in message


def test_a_main_tool_spec_given_in_code_is_refused() -> None:
    with pytest.raises(InvalidValueError, match=r"Op\.tools\[0\].*__main__"):
        Op("a", "x", tools=["python:__main__:f"])


def test_the_checkpoint_keeps_an_entrys_settings_only_when_set() -> None:
    plan = _plan(
        {"agent_id": "a", "instruction": "x", "model": "echo", "timeout_s": 2.5,
         "retry": {"attempts": 2, "backoff_s": 0.5}},
        {"agent_id": "b", "instruction": "y"},
    )  # fmt: skip
    stored = plan_to_checkpoint(plan)
    assert stored[0]["model"] == "echo"
    assert stored[0]["retry"] == {"attempts": 2, "backoff_s": 0.5}
    assert stored[0]["timeout_s"] == 2.5
    assert set(stored[1]) == {"agent_id", "dep_indices", "assignee", "instruction"}
    again = plan_from_checkpoint(stored, source="checkpoint")
    assert again.plan[0] == plan.plan[0]
    a, b = build_graph(again)
    assert (a.pinned_model, a.retry_attempts, a.retry_backoff_s, a.timeout_s) == (
        "echo", 2, 0.5, 2.5
    )  # fmt: skip
    assert (b.pinned_model, b.retry_attempts, b.timeout_s) == (None, None, None)


def test_an_entry_model_needs_the_same_consent_as_a_roles() -> None:
    plan = _plan(
        {"agent_id": "a", "instruction": "x", "model": "python:fn_nodes:record"},
        {"agent_id": "b", "instruction": "y", "model": "claude-code/sonnet"},
    )
    with pytest.raises(UsageError) as python:
        check_python_consent(plan, "plan.yaml", model="echo", given_model=None, allowed=False)
    assert "'python:fn_nodes:record' (plan entry 'a') for node(s) a" in str(python.value)
    with pytest.raises(UsageError) as worker:
        check_agent_worker_consent(plan, "plan.yaml", model="echo", given_model=None, allowed=False)
    assert "'claude-code/sonnet' (plan entry 'b') for node(s) b" in str(worker.value)
    # Consent by --model covers that spec; the flags cover every one.
    check_python_consent(
        plan, "plan.yaml", model="echo", given_model="python:fn_nodes:record", allowed=False
    )
    check_agent_worker_consent(plan, "plan.yaml", model="echo", given_model=None, allowed=True)


def test_an_entry_model_wins_over_its_roles_in_the_consent_message() -> None:
    plan = _plan(
        {"agent_id": "a", "instruction": "x", "assignee": "w"},
        {"agent_id": "b", "instruction": "y", "assignee": "w", "model": "echo"},
        roles={"w": {"model": "python:fn_nodes:record"}},
    )
    with pytest.raises(UsageError) as refused:
        check_python_consent(plan, "plan.yaml", model="echo", given_model=None, allowed=False)
    # b runs at its own model (echo), so only a needs the function's consent.
    assert "(role 'w') for node(s) a." in str(refused.value)
