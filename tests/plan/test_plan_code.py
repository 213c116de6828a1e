"""Plans built in code (issue 29 item 1): the plan file's validation, and an exact round trip.

``Plan``/``Op`` are checked by the very model a plan file is, so the same content is refused
with the same message on both paths: only the source differs (``<Plan>`` against the file
name and line).
"""

from __future__ import annotations

import dataclasses
import json
import re
import string
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import steerflow
from steerflow.errors import PlanValidationError, UsageError
from steerflow.orchestrate import FlowOptions, run_flow
from steerflow.plan import (
    CODE_SOURCE,
    Edge,
    Op,
    Plan,
    Role,
    Synthesis,
    bundled_playbooks,
    load_plan_file,
)


def _entry(agent_id: str = "a", instruction: str = "do it", **extra: Any) -> dict[str, Any]:
    return {"agent_id": agent_id, "instruction": instruction, **extra}


# (case, plan-file content, what the message must name: the op and the field)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("bad-id", {"plan": [_entry("../x")]}, "plan[0].agent_id: String should match pattern"),
    ("dot-id", {"plan": [_entry(".hidden")]}, "plan[0].agent_id"),
    (
        "repeated-id",
        {"plan": [_entry("a"), _entry("a")]},
        "plan[1].agent_id 'a' repeats plan[0]",
    ),
    (
        "unknown-dependency",
        {"plan": [_entry("a"), _entry("b", depends_on=["zz"])]},
        "plan[1] ('b') depends on unknown agent_id 'zz'",
    ),
    (
        "self-dependency",
        {"plan": [_entry("a", depends_on=["a"])]},
        "plan[0] ('a') depends on itself",
    ),
    (
        "cycle",
        {"plan": [_entry("a", depends_on=["b"]), _entry("b", depends_on=["a"])]},
        "plan has a dependency cycle: a -> b -> a",
    ),
    ("empty-instruction", {"plan": [_entry(instruction="")]}, "plan[0].instruction"),
    (
        "bad-edge-condition",
        {"plan": [_entry("a"), _entry("b", depends_on=[{"id": "a", "when": "sometimes"}])]},
        "plan[1].depends_on[0].when: Input should be 'completed', 'failed' or 'always'",
    ),
    (
        "edge-to-bad-id",
        {"plan": [_entry("a"), _entry("b", depends_on=[{"id": "../a"}])]},
        "plan[1].depends_on[0].id",
    ),
    (
        "reserved-id",
        {"plan": [_entry("synthesis")]},
        "plan[0].agent_id 'synthesis' is reserved",
    ),
    (
        "absolute-artifact",
        {"plan": [_entry(artifacts=["/etc/passwd"])]},
        "plan[0] ('a').artifacts[0] '/etc/passwd': must be relative",
    ),
    (
        "role-artifact-escapes",
        {"roles": {"w": {"artifacts": ["../x"]}}, "plan": [_entry(assignee="w")]},
        "roles.w.artifacts[0] '../x': must stay inside the leg directory",
    ),
    (
        "long-assignee",
        {"plan": [_entry(assignee="r" * 129)]},
        "plan[0].assignee: String should have at most 128 characters",
    ),
    (
        "empty-synthesis",
        {"synthesis": {"instruction": ""}, "plan": [_entry()]},
        "synthesis.instruction",
    ),
    (
        "synthesis-policy",
        {"synthesis": {"instruction": "sum", "when_all_failed": "maybe"}, "plan": [_entry()]},
        "synthesis.when_all_failed",
    ),
    ("concurrency-zero", {"concurrency": 0, "plan": [_entry()]}, "concurrency: Input should be"),
    ("concurrency-huge", {"concurrency": 257, "plan": [_entry()]}, "concurrency"),
    ("negative-max-ops", {"max_ops": -1, "plan": [_entry()]}, "max_ops"),
    ("boolean-max-ops", {"max_ops": True, "plan": [_entry()]}, "max_ops: Value error, must be"),
    ("compact-records", {"compact_records": 0, "plan": [_entry()]}, "compact_records"),
    ("compact-bytes", {"compact_bytes": 10, "plan": [_entry()]}, "compact_bytes"),
    ("zero-max-cost", {"max_cost": 0, "plan": [_entry()]}, "max_cost"),
    ("nan-max-cost", {"max_cost": float("nan"), "plan": [_entry()]}, "max_cost"),
    ("zero-max-tokens", {"max_tokens": 0, "plan": [_entry()]}, "max_tokens"),
    ("negative-price", {"prices": {"m": {"input": -1, "output": 1}}, "plan": [_entry()]}, "prices"),
    ("price-missing-output", {"prices": {"m": {"input": 1}}, "plan": [_entry()]}, "prices"),
    ("no-ops", {"plan": []}, "plan: List should have at least 1 item"),
    ("wrong-type", {"plan": [_entry(inherit_context="perhaps")]}, "plan[0].inherit_context"),
]


def _from_data(data: dict[str, Any]) -> Plan:
    """The code spelling of plan-file ``data``: every value handed over as written."""

    def op(entry: dict[str, Any]) -> Op:
        deps = [Edge(**d) if isinstance(d, dict) else d for d in entry.get("depends_on", [])]
        return Op(**{**entry, "depends_on": deps})

    rest = {k: v for k, v in data.items() if k not in ("plan", "roles", "synthesis")}
    synthesis = data.get("synthesis")
    return Plan(
        ops=[op(e) for e in data["plan"]],
        roles={name: Role(**spec) for name, spec in data.get("roles", {}).items()},
        synthesis=Synthesis(**synthesis) if synthesis is not None else None,
        **rest,
    )


def _problems(message: str) -> list[str]:
    """The message's problem lines without where they were found (file:line or <Plan>)."""
    lines = message.splitlines()
    assert lines[0] == "invalid plan:", message
    return [re.sub(r"^  (<Plan>|/\S+?)(:\d+)?: ", "", line) for line in lines[1:]]


@pytest.mark.parametrize(("data", "names"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_a_code_plan_is_refused_exactly_as_the_same_plan_file(
    tmp_path: Path, data: dict[str, Any], names: str
) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    with pytest.raises(PlanValidationError) as from_file:
        load_plan_file(path)
    with pytest.raises(PlanValidationError) as from_code:
        _from_data(data)
    assert names in str(from_file.value)
    assert _problems(str(from_code.value)) == _problems(str(from_file.value))
    assert str(from_code.value).startswith(f"invalid plan:\n  {CODE_SOURCE}: ")
    # Plan.from_file refuses the file with the file's own message.
    with pytest.raises(PlanValidationError) as via_plan:
        Plan.from_file(path)
    assert str(via_plan.value) == str(from_file.value)


def test_a_mapping_is_not_an_op() -> None:
    with pytest.raises(PlanValidationError) as refused:
        Plan(
            ops=[Op("a", "x"), {"agent_id": "b", "instruction": "x"}],  # type: ignore[list-item]
            roles={"w": {"model": "echo"}},  # type: ignore[dict-item]
            synthesis={"instruction": "sum"},  # type: ignore[arg-type]
        )
    assert str(refused.value) == (
        "invalid plan:\n  <Plan>: plan[1]: expected a steerflow.Op, not dict"
        "\n  <Plan>: roles.w: expected a steerflow.Role, not dict"
        "\n  <Plan>: synthesis: expected a steerflow.Synthesis, not dict"
    )


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda: Op("x", "i", depends_on="ab"), "Op.depends_on: 'ab' is not a list of op ids"),
        (lambda: Op("x", "i", artifacts="out.txt"), "Op.artifacts: 'out.txt' is not a list"),
        (lambda: Op("x", "i", depends_on={"a": "b"}), "Op.depends_on: {'a': 'b'} is not a list"),
        (lambda: Role(escalation="echo"), "Role.escalation: 'echo' is not a list"),
        (lambda: Role(artifacts="a.txt"), "Role.artifacts: 'a.txt' is not a list"),
        (lambda: Role(resources=2), "Role.resources: 2 is not a mapping"),
        (lambda: Plan(ops=Op("a", "x")), "Plan.ops: Op("),
        (lambda: Plan(ops=[Op("a", "x")], roles="w"), "Plan.roles: 'w' is not a mapping"),
        (lambda: Plan(ops=[Op("a", "x")], prices=[1]), "Plan.prices: [1] is not a mapping"),
    ],
)
def test_a_str_or_a_scalar_is_never_taken_for_a_list(build: Any, says: str) -> None:
    """``Op(depends_on="ab")`` is refused, not split into ``a`` and ``b`` (issue 38)."""
    with pytest.raises(UsageError) as refused:
        build()
    assert isinstance(refused.value, steerflow.InvalidValueError)
    assert refused.value.exit_code == 2
    assert f"invalid value for {says}" in str(refused.value)


def test_a_str_dependency_on_ops_named_by_its_letters_is_refused() -> None:
    with pytest.raises(UsageError, match=r"Op\.depends_on: 'ab'"):
        Plan(ops=[Op("a", "x"), Op("b", "y"), Op("c", "z", depends_on="ab")])
    # ... as a plan file's `depends_on: ab` is (a list is expected).
    with pytest.raises(PlanValidationError, match="depends_on"):
        steerflow.plan.parse_plan(
            {"plan": [_entry("a"), _entry("b"), _entry("c", depends_on="ab")]}, source="p"
        )


def test_a_plan_takes_a_price_object_and_reads_it_back_as_a_mapping() -> None:
    plan = Plan(ops=[Op("a", "x")], prices={"m": steerflow.Price(1, 2)})
    assert dict(plan.prices["m"]) == {"input": 1.0, "output": 2.0}
    assert plan.to_data()["prices"] == {"m": {"input": 1.0, "output": 2.0}}


def test_plans_and_ops_are_frozen() -> None:
    op = Op("a", "do a", depends_on=["b"], artifacts=["out.txt"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.instruction = "other"  # type: ignore[misc]
    assert op.depends_on == ("b",) and op.artifacts == ("out.txt",)
    roles = {"w": Role(model="echo")}
    plan = Plan(ops=[Op("b", "do b"), op], roles=roles)
    roles["x"] = Role()  # the caller's dict is copied
    assert set(plan.roles) == {"w"}
    with pytest.raises(TypeError):
        plan.roles["y"] = Role()  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.ops = ()  # type: ignore[misc]


def test_the_root_package_exports_them_lazily() -> None:
    assert steerflow.Plan is Plan and steerflow.Op is Op
    assert steerflow.Edge is Edge and steerflow.Role is Role and steerflow.Synthesis is Synthesis


# -- round trips ------------------------------------------------------------------------------

_IDS = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,12}\Z").filter(lambda s: s != "synthesis")
# Any text a file can hold: UTF-8 (no lone surrogates); YAML keeps every other character.
_TEXT = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=40)
_OPT_TEXT = st.none() | _TEXT
_PATHS = st.lists(
    st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=8), min_size=1
).map("/".join)


@st.composite
def _plans(draw: st.DrawFn) -> Plan:
    ids = draw(st.lists(_IDS, min_size=1, max_size=6, unique=True))
    roles = draw(
        st.dictionaries(
            _TEXT,
            st.builds(
                Role,
                model=_OPT_TEXT,
                system=_OPT_TEXT,
                artifacts=st.lists(_PATHS, max_size=2),
                escalation=st.lists(_TEXT, max_size=2),
            ),
            max_size=2,
        )
    )
    ops = []
    for index, agent_id in enumerate(ids):
        earlier = ids[:index]  # edges only point back: no cycle
        deps = draw(
            st.lists(
                st.sampled_from(earlier).flatmap(
                    lambda dep: (
                        st.just(dep)
                        | st.builds(
                            Edge,
                            id=st.just(dep),
                            when=st.sampled_from(["completed", "failed", "always"]),
                            if_contains=_OPT_TEXT,
                        )
                    )
                ),
                max_size=3,
            )
            if earlier
            else st.just([])
        )
        ops.append(
            Op(
                agent_id=agent_id,
                instruction=draw(_TEXT),
                depends_on=deps,
                assignee=draw(st.none() | st.sampled_from([*roles, "other"])),
                inherit_context=draw(st.booleans()),
                artifacts=draw(st.lists(_PATHS, max_size=2)),
            )
        )
    return Plan(
        ops=ops,
        name=draw(_OPT_TEXT),
        description=draw(_OPT_TEXT),
        model=draw(_OPT_TEXT),
        reactive=draw(st.none() | st.booleans() | st.sampled_from(["off", "all", "w,x"])),
        max_ops=draw(st.none() | st.integers(0, 10_000)),
        concurrency=draw(st.none() | st.integers(1, 256)),
        compact_records=draw(st.none() | st.integers(1, 1_000_000)),
        compact_bytes=draw(st.none() | st.integers(1_024, 1_073_741_824)),
        max_cost=draw(st.none() | st.floats(0.001, 1e6) | st.integers(1, 1000)),
        max_tokens=draw(st.none() | st.integers(1, 10**9)),
        prices=draw(
            st.dictionaries(
                _TEXT,
                st.fixed_dictionaries(
                    {"input": st.floats(0, 1e4), "output": st.floats(0, 1e4) | st.integers(0, 99)}
                ),
                max_size=2,
            )
        ),
        roles=roles,
        synthesis=draw(
            st.none()
            | st.builds(
                Synthesis,
                instruction=_TEXT,
                model=_OPT_TEXT,
                when_all_failed=st.sampled_from(["skip", "run"]),
            )
        ),
    )


# 60 examples: each writes and parses a YAML file through the plan model (~0.1 s on a
# loaded two-core machine): the suite keeps to its 8-minute budget (issue 38 item 8).
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=_plans())
def test_a_code_plan_saved_and_read_back_is_equal(tmp_path: Path, plan: Plan) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(plan.to_yaml(), encoding="utf-8")
    again = Plan.from_file(path)
    assert again == plan
    assert again.to_yaml() == plan.to_yaml()
    # The runner gets the model a plan file loads into.
    assert again.plan_file == load_plan_file(path) == plan.plan_file


FULL = """\
name: review
description: every feature a plan file has
model: echo
reactive: off
max_ops: 12
concurrency: 2
compact_records: 64
compact_bytes: 65536
max_cost: 2.5
max_tokens: 100000
prices:
  echo: {input: 3, output: 15.5}
roles:
  worker:
    model: echo
    system: be brief
    artifacts: [notes.md]
    escalation: [echo, "script:x.yaml"]
synthesis:
  instruction: merge everything
  when_all_failed: run
plan:
  - agent_id: a
    instruction: first
  - {agent_id: b, instruction: "second: with a colon", assignee: worker, inherit_context: true}
  - agent_id: c
    instruction: |
      third
      over two lines
    depends_on: [a, {id: b, when: failed}, {id: a, when: always, if_contains: "yes"}]
    artifacts: [out/c.txt]
"""


def _files(tmp_path: Path) -> list[Path]:
    full = tmp_path / "full.yaml"
    full.write_text(FULL, encoding="utf-8")
    as_json = tmp_path / "full.json"
    as_json.write_text(json.dumps(yaml.safe_load(FULL)), encoding="utf-8")
    root = Path(steerflow.__file__).parent / "plan" / "playbooks"
    return [full, as_json, *(root / f"{name}.yaml" for name in bundled_playbooks())]


def test_a_plan_file_read_saved_and_read_again_is_equal(tmp_path: Path) -> None:
    for path in _files(tmp_path):
        plan = Plan.from_file(path)
        assert plan.plan_file == load_plan_file(path), path
        saved = tmp_path / "saved.yaml"
        saved.write_text(plan.to_yaml(), encoding="utf-8")
        assert Plan.from_file(saved) == plan, path
        assert load_plan_file(saved) == load_plan_file(path), path


def test_reactive_keeps_the_models_spelling() -> None:
    assert Plan(ops=[Op("a", "x")], reactive=True).reactive == "all"
    assert Plan(ops=[Op("a", "x")], reactive=False).reactive == "off"
    assert Plan(ops=[Op("a", "x")], reactive=True) == Plan(ops=[Op("a", "x")], reactive="all")


def test_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="plan file not found"):
        Plan.from_file(tmp_path / "nope.yaml")


# -- FlowOptions(plan=...) --------------------------------------------------------------------


@pytest.mark.parametrize(
    "other",
    [{"plan_path": Path("p.yaml")}, {"playbook": "research"}],
    ids=["plan_path", "playbook"],
)
def test_a_code_plan_excludes_a_plan_file_and_a_playbook(other: dict[str, Any]) -> None:
    name = next(iter(other))
    with pytest.raises(UsageError, match=f"give either plan or {name}, not both"):
        FlowOptions(plan=Plan(ops=[Op("a", "x")]), **other)


def test_flow_options_take_only_a_plan_object() -> None:
    with pytest.raises(UsageError, match=r"takes a steerflow\.Plan"):
        FlowOptions(plan={"plan": []})  # type: ignore[arg-type]


async def test_a_code_plan_over_the_entry_limit_is_refused_when_it_runs(tmp_path: Path) -> None:
    plan = Plan(ops=[Op("a", "x"), Op("b", "y")])  # built: the limit belongs to a run
    options = FlowOptions(plan=plan, model="echo", max_plan_entries=1)
    with pytest.raises(PlanValidationError, match="more than the limit of 1"):
        await run_flow(options, home=tmp_path / "home")
    assert not (tmp_path / "home" / "runs").exists()  # refused before anything was made
