"""The plan model and loader: validation, conditional edges, errors naming file:line and field."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pydantic
import pytest

from steerflow.errors import ExitCode, PlanValidationError, UsageError
from steerflow.plan import (
    AGENT_ID_PATTERN,
    MAX_PLAN_ENTRIES,
    Dependency,
    SpawnSpec,
    SynthesisSpec,
    is_agent_id,
    load_plan_file,
    parse_plan,
    parse_plan_text,
    parse_reactive,
)

GOOD = """\
name: review-pr
description: one line
model: echo
reactive: off
max_ops: 0
concurrency: 4
roles:
  coder: {model: echo, artifacts: ["patch.diff"], escalation: ["echo", "echo"]}
plan:
  - agent_id: research
    assignee: researcher
    instruction: "Read the issue and list the files involved."
  - agent_id: draft
    assignee: coder
    instruction: "Write the patch."
    depends_on: [research]
"""


def _write(tmp_path: Path, text: str, name: str = "plan.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _error(tmp_path: Path, text: str, name: str = "plan.yaml") -> tuple[Path, str]:
    path = _write(tmp_path, text, name)
    with pytest.raises(PlanValidationError) as info:
        load_plan_file(path)
    assert info.value.exit_code == ExitCode.USAGE
    return path, str(info.value)


# -- valid plans -------------------------------------------------------------------------------


def test_contract_example_parses(tmp_path: Path) -> None:
    plan = load_plan_file(_write(tmp_path, GOOD))
    assert plan.name == "review-pr"
    assert plan.reactive == "off"  # YAML's bare `off` keeps its spelling
    assert plan.max_ops == 0 and plan.concurrency == 4
    assert plan.roles["coder"].artifacts == ["patch.diff"]
    assert plan.roles["coder"].escalation == ["echo", "echo"]
    assert [e.agent_id for e in plan.plan] == ["research", "draft"]
    assert plan.plan[1].dependencies == [Dependency(id="research")]


def test_json_plan_file(tmp_path: Path) -> None:
    data = {
        "plan": [
            {"agent_id": "a", "instruction": "x"},
            {"agent_id": "b", "instruction": "y", "depends_on": ["a"]},
        ]
    }
    plan = load_plan_file(_write(tmp_path, json.dumps(data), "plan.json"))
    assert [e.agent_id for e in plan.plan] == ["a", "b"]


def test_conditional_dependencies() -> None:
    plan = parse_plan(
        {
            "plan": [
                {"agent_id": "a", "instruction": "x"},
                {"agent_id": "ok", "instruction": "y", "depends_on": [{"id": "a"}]},
                {
                    "agent_id": "fb",
                    "instruction": "y",
                    "depends_on": [{"id": "a", "when": "failed"}],
                },
                {
                    "agent_id": "al",
                    "instruction": "y",
                    "depends_on": [{"id": "a", "when": "always"}],
                },
                {
                    "agent_id": "ic",
                    "instruction": "y",
                    "depends_on": ["ok", {"id": "a", "if_contains": "LGTM"}],
                },
            ]
        },
        source="t",
    )
    deps = {e.agent_id: e.dependencies for e in plan.plan}
    assert deps["ok"] == [Dependency(id="a", when="completed")]
    assert deps["fb"] == [Dependency(id="a", when="failed")]
    assert deps["al"] == [Dependency(id="a", when="always")]
    assert deps["ic"] == [Dependency(id="ok"), Dependency(id="a", if_contains="LGTM")]


@pytest.mark.parametrize("when", ["sometimes", "COMPLETED", ""])
def test_bad_edge_condition(when: str) -> None:
    with pytest.raises(PlanValidationError, match="when"):
        parse_plan(
            {
                "plan": [
                    {"agent_id": "a", "instruction": "x"},
                    {
                        "agent_id": "b",
                        "instruction": "y",
                        "depends_on": [{"id": "a", "when": when}],
                    },
                ]
            },
            source="t",
        )


def test_reactive_spellings_are_kept() -> None:
    base = {"plan": [{"agent_id": "a", "instruction": "x"}]}
    assert (
        parse_plan_text("reactive: on\nplan: [{agent_id: a, instruction: x}]", source="t").reactive
        == "all"
    )
    assert (
        parse_plan({**base, "reactive": "coder,reviewer"}, source="t").reactive == "coder,reviewer"
    )
    assert parse_plan(base, source="t").reactive is None


def test_models_are_frozen() -> None:
    plan = parse_plan({"plan": [{"agent_id": "a", "instruction": "x"}]}, source="t")
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        plan.plan[0].agent_id = "b"  # type: ignore[misc]


# -- errors that name the file, line and field -------------------------------------------------


def test_unknown_field_names_file_line_and_field(tmp_path: Path) -> None:
    path, msg = _error(
        tmp_path,
        "plan:\n"
        "  - agent_id: a\n"
        "    instruction: x\n"
        "  - agent_id: b\n"
        "    instruction: y\n"
        "    priority: high\n",
    )
    assert f"{path}:6" in msg
    assert "plan[1].priority" in msg
    assert "unknown field" in msg


def test_unknown_top_level_field(tmp_path: Path) -> None:
    path, msg = _error(tmp_path, "name: x\nowner: me\nplan: [{agent_id: a, instruction: x}]\n")
    assert f"{path}:2" in msg and "owner" in msg and "unknown field" in msg


def test_missing_instruction_names_the_entry(tmp_path: Path) -> None:
    path, msg = _error(tmp_path, "plan:\n  - agent_id: a\n    instruction: x\n  - agent_id: b\n")
    assert f"{path}:4" in msg
    assert "plan[1].instruction" in msg


def test_wrong_type_names_line(tmp_path: Path) -> None:
    path, msg = _error(tmp_path, "concurrency: lots\nplan: [{agent_id: a, instruction: x}]\n")
    assert f"{path}:1" in msg and "concurrency" in msg


@pytest.mark.parametrize(
    "bad",
    ["has space", "semi;colon", "x" * 65, "", "slash/id", "ünï", ".", "..", ".hidden", "-x"],
)
def test_bad_agent_id_pattern(tmp_path: Path, bad: str) -> None:
    path, msg = _error(
        tmp_path,
        "plan:\n"
        "  - agent_id: ok\n"
        "    instruction: x\n"
        f"  - agent_id: {json.dumps(bad)}\n"
        "    instruction: y\n",
    )
    assert f"{path}:4" in msg
    assert "plan[1].agent_id" in msg


@pytest.mark.parametrize("bad", [".", "..", ".hidden", "_x", "a\n", "../x"])
def test_agent_id_cannot_name_a_path_component(bad: str) -> None:
    assert AGENT_ID_PATTERN == r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
    assert not is_agent_id(bad)
    with pytest.raises(PlanValidationError, match=r"plan\[0\]\.agent_id"):
        parse_plan({"plan": [{"agent_id": bad, "instruction": "x"}]}, source="t")
    with pytest.raises(ValueError, match="agent_id"):
        SpawnSpec.model_validate({"agent_id": bad, "instruction": "x"})


@pytest.mark.parametrize("good", ["a", "A-b_c.d", "x" * 64, "0", "op-1.v2", "a..b", "x."])
def test_agent_id_pattern_accepts(good: str) -> None:
    assert is_agent_id(good)
    assert re.match(AGENT_ID_PATTERN, good)
    parse_plan({"plan": [{"agent_id": good, "instruction": "x"}]}, source="t")


def test_duplicate_agent_id(tmp_path: Path) -> None:
    path, msg = _error(
        tmp_path,
        "plan:\n  - {agent_id: a, instruction: x}\n  - {agent_id: b, instruction: y}\n"
        "  - {agent_id: a, instruction: z}\n",
    )
    assert str(path) in msg
    assert "plan[2]" in msg and "'a'" in msg and "plan[0]" in msg


def test_unknown_dependency(tmp_path: Path) -> None:
    path, msg = _error(
        tmp_path,
        "plan:\n  - {agent_id: a, instruction: x}\n"
        "  - {agent_id: b, instruction: y, depends_on: [a, ghost]}\n",
    )
    assert str(path) in msg
    assert "plan[1]" in msg and "ghost" in msg and "unknown" in msg


def test_unknown_conditional_dependency() -> None:
    with pytest.raises(PlanValidationError, match="ghost"):
        parse_plan(
            {
                "plan": [
                    {
                        "agent_id": "a",
                        "instruction": "x",
                        "depends_on": [{"id": "ghost", "when": "failed"}],
                    }
                ]
            },
            source="t",
        )


def test_self_dependency(tmp_path: Path) -> None:
    _, msg = _error(tmp_path, "plan:\n  - {agent_id: a, instruction: x, depends_on: [a]}\n")
    assert "itself" in msg or "cycle" in msg


def test_cycle(tmp_path: Path) -> None:
    path, msg = _error(
        tmp_path,
        "plan:\n"
        "  - {agent_id: a, instruction: x, depends_on: [c]}\n"
        "  - {agent_id: b, instruction: y, depends_on: [a]}\n"
        "  - {agent_id: c, instruction: z, depends_on: [b]}\n"
        "  - {agent_id: d, instruction: w}\n",
    )
    assert str(path) in msg and "cycle" in msg
    named = re.search(r"cycle: (.*)", msg)
    assert named is not None
    assert set(named.group(1).replace(" ", "").split("->")) == {"a", "b", "c"}


def test_empty_plan_refused(tmp_path: Path) -> None:
    path, msg = _error(tmp_path, "name: x\nplan: []\n")
    assert "plan" in msg and str(path) in msg


@pytest.mark.parametrize("text", ["- just\n- a list\n", "42\n", ""])
def test_plan_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    path, msg = _error(tmp_path, text)
    assert str(path) in msg


def test_invalid_yaml_names_line(tmp_path: Path) -> None:
    path, msg = _error(tmp_path, "plan:\n  - agent_id: a\n    instruction: [unclosed\n")
    assert re.search(rf"{re.escape(str(path))}:\d+", msg)
    assert "YAML" in msg


def test_invalid_json_names_line(tmp_path: Path) -> None:
    path, msg = _error(tmp_path, '{"plan": [\n  {"agent_id": "a",,}\n]}', "plan.json")
    assert f"{path}:2" in msg and "JSON" in msg


def test_missing_file_is_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not found"):
        load_plan_file(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("field", "value"), [("concurrency", 0), ("concurrency", 257), ("max_ops", -1)]
)
def test_numeric_bounds(field: str, value: int) -> None:
    with pytest.raises(PlanValidationError, match=field):
        parse_plan({field: value, "plan": [{"agent_id": "a", "instruction": "x"}]}, source="t")


# -- the entry limit, reactive policy, spawn specs ---------------------------------------------


def _entries(n: int) -> list[dict[str, Any]]:
    return [{"agent_id": f"n{i}", "instruction": "x"} for i in range(n)]


def test_default_limit_is_1000_and_a_larger_plan_is_refused_not_cut() -> None:
    assert MAX_PLAN_ENTRIES == 1000
    assert len(parse_plan({"plan": _entries(1000)}, source="t").plan) == 1000
    with pytest.raises(PlanValidationError) as info:
        parse_plan({"plan": _entries(1001)}, source="planner")
    message = str(info.value)
    assert "1001" in message and "1000" in message and "--max-plan-entries" in message


def test_limit_is_a_parameter_and_none_means_unlimited(tmp_path: Path) -> None:
    entries = _entries(1500)
    entries[3]["depends_on"] = ["n1499"]  # an edge to a late entry is kept, never dropped
    plan = parse_plan({"plan": entries}, source="t", max_entries=1500)
    assert len(plan.plan) == 1500
    assert [d.id for d in plan.plan[3].dependencies] == ["n1499"]
    assert len(parse_plan({"plan": entries}, source="t", max_entries=None).plan) == 1500
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"plan": entries}))
    with pytest.raises(PlanValidationError, match="1500"):
        load_plan_file(path, max_entries=1499)
    assert len(load_plan_file(path, max_entries=1500).plan) == 1500


def test_a_long_dependency_chain_validates_without_recursion() -> None:
    entries = _entries(5000)
    for i in range(1, 5000):
        entries[i]["depends_on"] = [f"n{i - 1}"]
    assert len(parse_plan({"plan": entries}, source="t", max_entries=None).plan) == 5000
    entries[0]["depends_on"] = ["n4999"]
    with pytest.raises(PlanValidationError, match="cycle"):
        parse_plan({"plan": entries}, source="t", max_entries=None)


@pytest.mark.parametrize(
    ("spec", "enabled", "roles"),
    [
        ("off", False, None),
        (None, False, None),
        (False, False, None),
        ("all", True, None),
        (True, True, None),
        ("coder", True, frozenset({"coder"})),
        ("coder, reviewer", True, frozenset({"coder", "reviewer"})),
    ],
)
def test_parse_reactive(spec: object, enabled: bool, roles: frozenset[str] | None) -> None:
    policy = parse_reactive(spec)  # type: ignore[arg-type]
    assert policy.enabled is enabled
    assert policy.roles == roles


def test_reactive_policy_allows() -> None:
    assert not parse_reactive("off").allows("coder")
    assert parse_reactive("all").allows(None)
    coder = parse_reactive("coder")
    assert coder.allows("coder") and not coder.allows("writer") and not coder.allows(None)
    with pytest.raises(UsageError, match="empty role name"):
        parse_reactive("coder,,x")


def test_spawn_spec_validation() -> None:
    spec = SpawnSpec.model_validate({"agent_id": "fix-1", "instruction": "fix it"})
    assert spec.link_to_emitter is True and spec.depends_on == []
    for bad, field in (
        ({"agent_id": "bad id", "instruction": "x"}, "agent_id"),
        ({"agent_id": "ok"}, "instruction"),
        ({"agent_id": "ok", "instruction": "x", "surprise": 1}, "surprise"),
    ):
        with pytest.raises(ValueError, match=field):
            SpawnSpec.model_validate(bad)


# -- field bounds and defaults (issue 20: each pinned at its edge) -----------------------------


def _one(**fields: object) -> dict[str, Any]:
    return {"plan": [{"agent_id": "a", "instruction": "x", **fields}]}


def test_empty_instruction_is_refused_with_file_line_and_field(tmp_path: Path) -> None:
    path, msg = _error(tmp_path, "plan:\n  - agent_id: a\n    instruction: ''\n")
    assert msg == (
        f"invalid plan:\n  {path}:3: plan[0].instruction: String should have at least 1 character"
    )
    with pytest.raises(ValueError, match="at least 1 character"):
        SpawnSpec.model_validate({"agent_id": "fix-1", "instruction": ""})


def test_inherit_context_defaults_to_false_and_is_kept() -> None:
    assert parse_plan(_one(), source="t").plan[0].inherit_context is False
    assert parse_plan(_one(inherit_context=True), source="t").plan[0].inherit_context is True


@pytest.mark.parametrize(
    ("field", "value"), [("concurrency", 1), ("concurrency", 256), ("max_ops", 0)]
)
def test_numeric_bounds_are_inclusive(field: str, value: int) -> None:
    assert getattr(parse_plan({field: value, **_one()}, source="t"), field) == value


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("concurrency", 0, "concurrency: Input should be greater than or equal to 1"),
        ("concurrency", 257, "concurrency: Input should be less than or equal to 256"),
        ("max_ops", -1, "max_ops: Input should be greater than or equal to 0"),
    ],
)
def test_numeric_bounds_name_the_field_and_line(field: str, value: int, message: str) -> None:
    text = f"name: n\n{field}: {value}\nplan: [{{agent_id: a, instruction: x}}]\n"
    with pytest.raises(PlanValidationError) as info:
        parse_plan_text(text, source="p.yaml")
    assert str(info.value) == f"invalid plan:\n  p.yaml:2: {message}"


def test_assignee_is_at_most_128_characters() -> None:
    assert parse_plan(_one(assignee="r" * 128), source="t").plan[0].assignee == "r" * 128
    text = "plan:\n  - agent_id: a\n    assignee: " + "r" * 129 + "\n    instruction: x\n"
    with pytest.raises(PlanValidationError) as info:
        parse_plan_text(text, source="p.yaml")
    assert str(info.value) == (
        "invalid plan:\n  p.yaml:3: plan[0].assignee: String should have at most 128 characters"
    )


# -- whole-plan refusals name plan[N] and its line ---------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (
            "plan:\n  - agent_id: a\n    instruction: x\n  - agent_id: a\n    instruction: y\n",
            4,
            "plan[1]: Value error, plan[1].agent_id 'a' repeats plan[0]",
        ),
        (
            "name: x\nplan:\n  - agent_id: a\n    instruction: x\n    depends_on: [zz]\n",
            3,
            "plan[0]: Value error, plan[0] ('a') depends on unknown agent_id 'zz'",
        ),
        (
            "plan:\n  - agent_id: a\n    instruction: x\n"
            "  - agent_id: b\n    instruction: x\n    depends_on: [b]\n",
            4,
            "plan[1]: Value error, plan[1] ('b') depends on itself",
        ),
        (
            "roles:\n  coder: {modle: x}\nplan: [{agent_id: a, instruction: x}]\n",
            2,
            "roles.coder.modle: unknown field",
        ),
        ("plan:\n  - {agent_id: a, instruction: x, bogus: 1}\n", 2, "plan[0].bogus: unknown field"),
    ],
)
def test_refusal_names_the_entry_and_its_line(text: str, line: int, message: str) -> None:
    with pytest.raises(PlanValidationError) as info:
        parse_plan_text(text, source="p.yaml")
    assert str(info.value) == f"invalid plan:\n  p.yaml:{line}: {message}"


def test_refusal_of_decoded_data_names_the_source_without_a_line() -> None:
    with pytest.raises(PlanValidationError) as info:
        parse_plan({"plan": [{"agent_id": "a", "instruction": "x"}] * 2}, source="planner")
    assert str(info.value) == (
        "invalid plan:\n  planner: plan[1]: Value error, plan[1].agent_id 'a' repeats plan[0]"
    )
    with pytest.raises(PlanValidationError) as info:
        parse_plan({"plan": []}, source="planner")
    assert str(info.value) == (
        "invalid plan:\n  planner: plan: List should have at least 1 item after validation, not 0"
    )
    with pytest.raises(PlanValidationError) as info:
        parse_plan(["plan"], source="planner")
    assert str(info.value) == "planner: a plan must be a mapping with a 'plan' list"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "plan:\n  - agent_id: a\n    instruction: [unclosed\n",
            "p.yaml:4: invalid YAML: expected ',' or ']', but got '<stream end>'",
        ),
        (
            "plan:\n\t- x\n",
            "p.yaml:2: invalid YAML: found character '\\t' that cannot start any token",
        ),
        ("plan: *nope\n", "p.yaml:1: invalid YAML: found undefined alias 'nope'"),
        (
            '{"plan": [\n  {"agent_id": "a",,}\n]}',
            "p.yaml:2: invalid JSON: Expecting property name enclosed in double quotes",
        ),
    ],
)
def test_undecodable_text_names_the_line(text: str, message: str) -> None:
    with pytest.raises(PlanValidationError) as info:
        parse_plan_text(text, source="p.yaml")
    assert str(info.value) == message


# -- --reactive spellings ----------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["off", "OFF", " Off ", "false", "no", "0", "none", "", "  "])
def test_reactive_off_spellings(spec: str) -> None:
    policy = parse_reactive(spec)
    assert (policy.enabled, policy.roles, policy.spec) == (False, None, "off")
    assert not policy.allows("coder") and not policy.allows(None)


@pytest.mark.parametrize("spec", ["all", "ALL", " all ", "true", "yes", "on", "1", True])
def test_reactive_all_spellings(spec: str | bool) -> None:
    policy = parse_reactive(spec)
    assert (policy.enabled, policy.roles, policy.spec) == (True, None, "all")
    assert policy.allows(None) and policy.allows("anyone")


def test_reactive_role_list_keeps_the_roles_as_written() -> None:
    policy = parse_reactive(" coder , Reviewer ")
    assert (policy.enabled, policy.roles, policy.spec) == (
        True,
        frozenset({"coder", "Reviewer"}),
        "coder,Reviewer",
    )
    assert policy.allows("Reviewer") and not policy.allows("reviewer")
    for bad in ("coder,,x", ",coder", "coder,"):
        with pytest.raises(UsageError, match=re.escape(f"--reactive: {bad!r}: empty role name")):
            parse_reactive(bad)


@pytest.mark.parametrize(("yaml_value", "kept"), [("off", "off"), ("on", "all"), ("'on'", "on")])
def test_plan_reactive_field_keeps_yaml_booleans_as_words(yaml_value: str, kept: str) -> None:
    text = f"reactive: {yaml_value}\nplan: [{{agent_id: a, instruction: x}}]\n"
    assert parse_plan_text(text, source="t").reactive == kept


def _chain(deps: dict[str, list[str]]) -> dict[str, Any]:
    return {
        "plan": [
            {"agent_id": agent, "instruction": "x", "depends_on": on} for agent, on in deps.items()
        ]
    }


@pytest.mark.parametrize(
    ("deps", "cycle"),
    [
        # the cycle is only reached after an entry that was already fully explored
        ({"a": ["b"], "b": [], "c": ["d"], "d": ["c"]}, "c -> d -> c"),
        # the cycle does not pass through the entry the search started from
        ({"a": ["b"], "b": ["c"], "c": ["b"]}, "b -> c -> b"),
    ],
)
def test_every_cycle_is_found_and_named(deps: dict[str, list[str]], cycle: str) -> None:
    with pytest.raises(PlanValidationError) as info:
        parse_plan(_chain(deps), source="t")
    assert str(info.value) == (
        f"invalid plan:\n  t: <root>: Value error, plan has a dependency cycle: {cycle}"
    )


def test_a_diamond_is_not_a_cycle() -> None:
    deps = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": ["d", "a"]}
    assert [e.agent_id for e in parse_plan(_chain(deps), source="t").plan] == list(deps)


# -- decoding and reading errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "reactive: [1]\nplan: [{agent_id: a, instruction: x}]\n",
            "invalid plan:\n  p.yaml:1: reactive: Input should be a valid string"
            "\n  p.yaml:1: reactive: Input should be a valid boolean",
        ),
        (
            "plan:\n  - agent_id: a\n    instruction: x\n  - agent_id: b\n    instruction: y\n"
            "    depends_on:\n      - {id: a, when: never}\n",
            "invalid plan:\n  p.yaml:7: plan[1].depends_on[0]: Input should be a valid string"
            "\n  p.yaml:7: plan[1].depends_on[0].when: Input should be 'completed', 'failed' or "
            "'always'",
        ),
        (
            "plan:\n  - agent_id: a\n    instruction: x\n    depends_on: [1]\n",
            "invalid plan:\n  p.yaml:4: plan[0].depends_on[0]: Input should be a valid string"
            "\n  p.yaml:4: plan[0].depends_on[0]: Input should be a valid dictionary or instance "
            "of Dependency",
        ),
    ],
)
def test_union_member_types_are_not_shown_as_fields(text: str, message: str) -> None:
    with pytest.raises(PlanValidationError) as info:
        parse_plan_text(text, source="p.yaml")
    assert str(info.value) == message


def test_yaml_error_without_a_position_still_names_the_source() -> None:
    with pytest.raises(PlanValidationError) as info:
        parse_plan_text("plan: \x07\n", source="p.yaml")
    assert str(info.value) == (
        "p.yaml: invalid YAML: unacceptable character #x0007: special characters are not allowed"
        '\n  in "<unicode string>", position 6'
    )


def test_json_is_recognised_after_leading_whitespace() -> None:
    with pytest.raises(PlanValidationError) as info:
        parse_plan_text('\n  {"plan": [\n  1,,]}', source="p.json")
    assert str(info.value) == "p.json:3: invalid JSON: Expecting value"


def test_unreadable_plan_file_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(UsageError) as info:
        load_plan_file(missing)
    assert str(info.value) == f"plan file not found: {str(missing)!r}"
    with pytest.raises(UsageError) as info:
        load_plan_file(tmp_path)  # a directory
    assert str(info.value).startswith(f"cannot read plan file {str(tmp_path)!r}: [Errno 21]")
    binary = tmp_path / "plan.yaml"
    binary.write_bytes(b"plan: \xff\xfe\n")
    with pytest.raises(UsageError) as info:
        load_plan_file(binary)
    assert str(info.value).startswith(
        f"cannot read plan file {str(binary)!r}: 'utf-8' codec can't decode byte 0xff"
    )


@pytest.mark.parametrize("spec", [None, False])
def test_reactive_unset_is_off(spec: bool | None) -> None:
    policy = parse_reactive(spec)
    assert (policy.enabled, policy.roles, policy.spec) == (False, None, "off")


# -- synthesis (CONTRACT §10) ------------------------------------------------------------


def test_synthesis_is_parsed_and_its_key_is_reserved(tmp_path: Path) -> None:
    plan = load_plan_file(
        _write(
            tmp_path,
            GOOD.replace("plan:\n", "synthesis: {instruction: Join., model: echo}\nplan:\n", 1),
        )
    )
    assert plan.synthesis is not None
    assert (plan.synthesis.instruction, plan.synthesis.model) == ("Join.", "echo")
    entries = [{"agent_id": "a", "instruction": "x"}]
    assert parse_plan({"plan": entries}, source="t").synthesis is None
    # boundaries: one character each is enough (an empty one is refused below)
    tiny = parse_plan(
        {"synthesis": {"instruction": "J", "model": "e"}, "plan": entries}, source="t"
    )
    assert tiny.synthesis == SynthesisSpec(instruction="J", model="e")
    # reserved whether or not the plan asks for a synthesis: --synthesize may add one
    _, msg = _error(tmp_path, "plan: [{agent_id: synthesis, instruction: x}]\n")
    assert "plan[0].agent_id 'synthesis' is reserved" in msg


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("{instruction: ''}", "synthesis.instruction"),
        ("{model: echo}", "synthesis.instruction"),
        ("{instruction: x, extra: 1}", "synthesis.extra"),
        ("{instruction: x, model: ''}", "synthesis.model"),
    ],
)
def test_bad_synthesis_is_refused(tmp_path: Path, spec: str, field: str) -> None:
    _, msg = _error(tmp_path, f"synthesis: {spec}\nplan: [{{agent_id: a, instruction: x}}]\n")
    assert field in msg
