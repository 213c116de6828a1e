"""Plans built in code: :class:`Plan` and :class:`Op`, checked by the plan file's own model.

A ``Plan`` is validated when it is built, by handing its plan-file form to
:func:`~steerflow.plan.parse_plan`: ids, dependencies and edge conditions, roles,
artifacts, synthesis and limits are refused with the very ``PlanValidationError`` a
plan file with the same content gets (only the source differs: :data:`CODE_SOURCE`
instead of the file name and line). An :class:`Op` alone is not checked: an id's
uniqueness and a dependency only mean something in a plan, and checking it there names
the op by its position and id, as a file's error does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml

from steerflow._values import shown
from steerflow.errors import InvalidValueError, PlanValidationError
from steerflow.plan._load import load_plan_file, parse_plan
from steerflow.plan._loop import DEFAULT_MAX_ROUNDS
from steerflow.plan._model import (
    Dependency,
    EdgeWhen,
    LoopSpec,
    PlanEntry,
    PlanFile,
    RoleSpec,
    SynthesisSpec,
)
from steerflow.plan._schema import output_schema_of
from steerflow.plan._tool_ref import importable_spec, main_spec_problem, tool_spec_of

__all__ = ["CODE_SOURCE", "Edge", "Loop", "Op", "Plan", "Role", "Synthesis"]

#: What a code plan's errors (and its run's ``source``) name instead of a file.
CODE_SOURCE = "<Plan>"


@dataclass(frozen=True)
class Edge:
    """A dependency on op ``id``, conditional on its outcome (a plan file's ``depends_on`` map).

    ``when``: ``completed`` (run only after a success), ``failed`` (a fallback branch)
    or ``always``; ``if_contains`` also requires the source's response to contain it.
    """

    id: str
    when: EdgeWhen = "completed"
    if_contains: str | None = None

    def _data(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id}
        if self.when != "completed":
            out["when"] = self.when
        if self.if_contains is not None:
            out["if_contains"] = self.if_contains
        return out


@dataclass(frozen=True)
class Op:
    """One planned operation (a plan file's ``plan[]`` entry, with the same field names).

    ``depends_on`` holds op ids (run after a success) or :class:`Edge` objects.
    """

    agent_id: str
    instruction: str
    depends_on: Sequence[str | Edge] = ()
    assignee: str | None = None
    inherit_context: bool = False
    artifacts: Sequence[str] = ()
    #: Tool specs (``python:MODULE:FUNCTION``, ``mcp:SERVER[/TOOL]``) or module-level
    #: functions, kept as their importable spec (a lambda or closure is refused).
    tools: Sequence[str | Callable[..., Any]] = ()
    #: Model requests of the node's tool loop before it fails (default 25).
    max_steps: int | None = None
    #: Per-node settings (a plan entry's keys): the model spec that runs this op (wins over
    #: its role's), ``{"attempts": N, "backoff_s": S}`` for failed calls, one call's limit.
    model: str | None = None
    retry: Mapping[str, Any] | None = None
    timeout_s: float | None = None
    #: The reply's JSON Schema; a pydantic model class, dataclass or TypedDict is kept as
    #: its JSON Schema (``FlowResult.output(node, cls)`` parses the output back into it).
    output_schema: Mapping[str, Any] | type | None = None
    #: A function node: the module-level function that runs this op, recorded as the model
    #: ``python:MODULE:QUALNAME`` (one a resume in another process could not import back
    #: is refused here). Not together with ``model`` (decision 279).
    fn: Callable[..., Any] | None = None
    #: Approvals (issue 41): ``"required"`` makes the node wait for an operator before its
    #: call; ``approve``: tool name patterns whose calls wait (added to its role's).
    approval: Literal["required"] | None = None
    approve: Sequence[str] = ()
    _fn_spec: str | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        # Tuples: an Op handed to several plans cannot change under any of them.
        _freeze(self, "depends_on", _items("Op.depends_on", self.depends_on, "op ids"))
        _freeze(self, "approve", _items("Op.approve", self.approve, "tool name patterns"))
        _freeze(self, "artifacts", _items("Op.artifacts", self.artifacts, "paths"))
        _freeze(self, "tools", _tools("Op.tools", self.tools))
        _no_callable_model("Op.model", self.model, "give a function as Op(fn=...)")
        if self.fn is not None:
            if not callable(self.fn):
                raise InvalidValueError("Op.fn", f"{shown(self.fn)} is not a function")
            _freeze(self, "_fn_spec", importable_spec(self.fn, "Op.fn", "a function node"))

    def _data(self) -> dict[str, Any]:
        out: dict[str, Any] = {"agent_id": self.agent_id}
        if self.assignee is not None:
            out["assignee"] = self.assignee
        out["instruction"] = self.instruction
        if self.depends_on:
            out["depends_on"] = [d._data() if isinstance(d, Edge) else d for d in self.depends_on]
        if self.inherit_context is not False:
            out["inherit_context"] = self.inherit_context
        if self.artifacts:
            out["artifacts"] = list(self.artifacts)
        if self.tools:
            out["tools"] = list(self.tools)
        if self.max_steps is not None:
            out["max_steps"] = self.max_steps
        for name in ("model", "retry", "timeout_s", "output_schema"):
            value = getattr(self, name)
            if name == "model" and self._fn_spec is not None:
                # Both given: the plan refuses them, naming the op (``Plan._check_fn``).
                value = self._fn_spec if value is None else value
            if value is not None:
                out[name] = dict(value) if isinstance(value, Mapping) else value
        if isinstance(self.output_schema, type):  # the plan keeps the class's JSON Schema
            out["output_schema"] = _class_schema(self.output_schema)
        if self.approval is not None:
            out["approval"] = self.approval
        if self.approve:
            out["approve"] = list(self.approve)
        return out


@dataclass(frozen=True)
class Loop:
    """A loop among a plan's ops (a plan file's ``{loop: ...}`` item, issue 40 item 4).

    ``body`` runs once per round; round N of body op ``X`` is the node ``X.rN``. A body op
    depends on another by its id (same round); later rounds receive the previous round's
    replies of the whole body. ``until``: ``{"node": ID, "contains": TEXT}``, or
    ``{"python": "python:MODULE:FUNCTION"}``, or a module-level function (kept as its
    importable spec) called with ``{body id: reply}`` after each round. An op after the
    loop depends on it by ``id``.
    """

    id: str
    body: Sequence[Op]
    until: Mapping[str, Any] | Callable[..., Any]
    max_rounds: int = DEFAULT_MAX_ROUNDS
    on_max_rounds: Literal["stop", "fail"] = "stop"

    def __post_init__(self) -> None:
        _freeze(self, "body", _items("Loop.body", self.body, "steerflow.Op objects"))
        if callable(self.until) and not isinstance(self.until, Mapping):
            _freeze(self, "until", {"python": tool_spec_of(self.until, "Loop.until")})
        elif isinstance(self.until, Mapping):
            _freeze(self, "until", MappingProxyType(dict(self.until)))

    def _data(self) -> dict[str, Any]:
        until = dict(self.until) if isinstance(self.until, Mapping) else self.until
        out: dict[str, Any] = {"id": self.id, "body": [op._data() for op in self.body]}
        out["until"] = until
        if self.max_rounds != DEFAULT_MAX_ROUNDS:
            out["max_rounds"] = self.max_rounds
        if self.on_max_rounds != "stop":
            out["on_max_rounds"] = self.on_max_rounds
        return {"loop": out}


@dataclass(frozen=True)
class Role:
    """Per-role settings (a plan file's ``roles.<role>``)."""

    model: str | None = None
    system: str | None = None
    artifacts: Sequence[str] = ()
    escalation: Sequence[str] = ()
    #: Ray resources per call (``num_cpus``, ``num_gpus``, ``memory``, custom names).
    resources: Mapping[str, float] | None = None
    tools: Sequence[str | Callable[..., Any]] = ()
    #: Tool name patterns whose calls wait for an operator's approval (issue 41).
    approve: Sequence[str] = ()

    def __post_init__(self) -> None:
        _freeze(self, "approve", _items("Role.approve", self.approve, "tool name patterns"))
        _no_callable_model(
            "Role.model", self.model, "a role's model is a spec string; give each op fn=..."
        )
        _freeze(self, "artifacts", _items("Role.artifacts", self.artifacts, "paths"))
        _freeze(self, "tools", _tools("Role.tools", self.tools))
        _freeze(self, "escalation", _items("Role.escalation", self.escalation, "model specs"))
        if self.resources is not None:
            _freeze(self, "resources", MappingProxyType(_mapping("Role.resources", self.resources)))

    def _data(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("model", "system"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        for name in ("artifacts", "escalation", "tools", "approve"):
            if getattr(self, name):
                out[name] = list(getattr(self, name))
        if self.resources is not None:
            out["resources"] = dict(self.resources)
        return out


@dataclass(frozen=True)
class Synthesis:
    """A final operation over every worker's result (a plan file's ``synthesis``)."""

    instruction: str
    model: str | None = None
    when_all_failed: Literal["skip", "run"] = "skip"

    def _data(self) -> dict[str, Any]:
        out: dict[str, Any] = {"instruction": self.instruction}
        if self.model is not None:
            out["model"] = self.model
        if self.when_all_failed != "skip":
            out["when_all_failed"] = self.when_all_failed
        return out


#: Top-level scalar settings, in a plan file's order.
_SETTINGS = (
    "name",
    "description",
    "model",
    "reactive",
    "max_ops",
    "concurrency",
    "compact_records",
    "compact_bytes",
)

#: The budget keys, after ``roles`` and ``synthesis`` as in the plan file model.
_BUDGET = ("max_cost", "max_tokens")


@dataclass(frozen=True)
class Plan:
    """A whole plan, validated when built; runs with ``FlowOptions(plan=...)``.

    The fields are a plan file's, except ``ops`` (the file's ``plan`` list). A plan's
    entry limit (``FlowOptions.max_plan_entries``) is checked when it runs, as a file's.

    Raises:
        PlanValidationError: The plan a file with the same content would be refused for,
            with the same message (source :data:`CODE_SOURCE`).
    """

    ops: Sequence[Op | Loop]
    name: str | None = None
    description: str | None = None
    model: str | None = None
    reactive: str | bool | None = None
    max_ops: int | None = None
    concurrency: int | None = None
    compact_records: int | None = None
    compact_bytes: int | None = None
    roles: Mapping[str, Role] = field(default_factory=dict)
    synthesis: Synthesis | None = None
    #: Spend caps for the whole resume chain, and USD per million tokens by model
    #: (``{"MODEL": {"input": IN, "output": OUT}}``, or a ``steerflow.Price``): the plan
    #: file's keys (CONTRACT §11); read back as mappings.
    max_cost: float | None = None
    max_tokens: int | None = None
    prices: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: Tools for every op (specs or module-level functions), how each tool is run
    #: (``{TOOL: {idempotent, approval, timeout_s}}``) and the MCP servers ``mcp:``
    #: tools come from (``{NAME: {command, env} | {url}}``): the plan file's keys.
    tools: Sequence[str | Callable[..., Any]] = ()
    tool_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    mcp_servers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Seconds an approval request waits before it is denied (issue 41).
    approval_timeout_s: float | None = None
    _file: PlanFile = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _freeze(self, "ops", _items("Plan.ops", self.ops, "steerflow.Op objects"))
        _freeze(self, "roles", MappingProxyType(_mapping("Plan.roles", self.roles)))
        _freeze(self, "prices", MappingProxyType(_mapping("Plan.prices", self.prices)))
        _freeze(self, "tools", _tools("Plan.tools", self.tools))
        for name in ("tool_options", "mcp_servers"):
            _freeze(self, name, MappingProxyType(_mapping(f"Plan.{name}", getattr(self, name))))
        _no_callable_model("Plan.model", self.model, "give each op fn=...")
        self._check_types()
        self._check_code_models()
        checked = parse_plan(self.to_data(), source=CODE_SOURCE, max_entries=None)
        _freeze(self, "_file", checked)
        # The model's spelling: a plan file's `reactive: true` reads back as "all".
        _freeze(self, "reactive", checked.reactive)
        # ... and its numbers: a cap or price given as an int reads back as a float.
        _freeze(self, "max_cost", checked.max_cost)
        _freeze(self, "prices", MappingProxyType(_prices_of(checked)))

    def _check_types(self) -> None:
        # A mapping would pass the model's check: the typed objects are the API.
        wrong: list[tuple[str, str, object]] = [
            (f"plan[{i}]", "Op", op)
            for i, op in enumerate(self.ops)
            if not isinstance(op, Op | Loop)
        ]
        wrong += [
            (f"plan[{i}].loop.body[{k}]", "Op", body)
            for i, op in enumerate(self.ops)
            if isinstance(op, Loop)
            for k, body in enumerate(op.body)
            if not isinstance(body, Op)
        ]
        wrong += [
            (f"roles.{name}", "Role", role)
            for name, role in self.roles.items()
            if not isinstance(role, Role)
        ]
        if self.synthesis is not None and not isinstance(self.synthesis, Synthesis):
            wrong.append(("synthesis", "Synthesis", self.synthesis))
        if wrong:
            lines = [
                f"{CODE_SOURCE}: {where}: expected a steerflow.{kind}, not {type(value).__name__}"
                for where, kind, value in wrong
            ]
            raise PlanValidationError("invalid plan:\n  " + "\n  ".join(lines))

    def _check_code_models(self) -> None:
        """``fn`` with ``model``, and model specs a resume could not import (decision 279).

        A plan file cannot name ``fn``; a ``python:__main__:NAME`` string is refused only
        in code, where the script that built the plan is ``__main__``.
        """
        problems: list[tuple[str, str]] = []
        ops = list(self._written_ops())
        for where, op in ops:
            if op.fn is not None and op.model is not None:
                problems.append(
                    (f"{where}.fn", "give fn or model, not both (fn is recorded as the "
                     f"model {op._fn_spec})")
                )  # fmt: skip
        specs = [("model", self.model)]
        specs += [(f"{where}.model", op.model) for where, op in ops]
        for name, role in self.roles.items():
            specs.append((f"roles.{name}.model", role.model))
            specs += [(f"roles.{name}.escalation[{i}]", m) for i, m in enumerate(role.escalation)]
        if self.synthesis is not None:
            specs.append(("synthesis.model", self.synthesis.model))
        for where, spec in specs:
            problem = main_spec_problem(spec)
            if problem is not None:
                problems.append((where, problem))
        if problems:
            lines = [f"{CODE_SOURCE}: {where}: {problem}" for where, problem in problems]
            raise PlanValidationError("invalid plan:\n  " + "\n  ".join(lines))

    def _written_ops(self) -> Iterator[tuple[str, Op]]:
        """Every op with where it is written: ``plan[2]``, or ``plan[3].loop.body[0]``."""
        for index, item in enumerate(self.ops):
            if isinstance(item, Loop):
                for k, op in enumerate(item.body):
                    yield f"plan[{index}].loop.body[{k}]", op
            else:
                yield f"plan[{index}]", item

    @property
    def plan_file(self) -> PlanFile:
        """The validated model the runner executes (what a plan file loads into)."""
        return self._file

    def to_data(self) -> dict[str, Any]:
        """The plan-file mapping (defaults left out), as :meth:`to_yaml` writes it."""
        out: dict[str, Any] = {
            name: getattr(self, name) for name in _SETTINGS if getattr(self, name) is not None
        }
        if self.roles:
            out["roles"] = {name: role._data() for name, role in self.roles.items()}
        if self.synthesis is not None:
            out["synthesis"] = self.synthesis._data()
        out |= {name: getattr(self, name) for name in _BUDGET if getattr(self, name) is not None}
        if self.prices:
            out["prices"] = {model: _price_data(price) for model, price in self.prices.items()}
        if self.tools:
            out["tools"] = list(self.tools)
        for name in ("tool_options", "mcp_servers"):
            if getattr(self, name):
                out[name] = {k: dict(v) for k, v in getattr(self, name).items()}
        if self.approval_timeout_s is not None:
            out["approval_timeout_s"] = self.approval_timeout_s
        out["plan"] = [op._data() for op in self.ops]
        return out

    def to_yaml(self) -> str:
        """The plan as a YAML plan file.

        ``Plan.from_file`` of it gives an equal plan, and ``steerflow flow --plan`` runs it.
        """
        return yaml.dump(
            self.to_data(), Dumper=_ExactDumper, sort_keys=False, allow_unicode=True, width=100
        )

    @classmethod
    def from_file(cls, path: str | Path) -> Plan:
        """Read a YAML or JSON plan file (the checks of ``steerflow flow --plan``).

        Raises:
            UsageError: The file cannot be read.
            PlanValidationError: The file is not a valid plan.
        """
        return cls.from_plan_file(load_plan_file(Path(path), max_entries=None))

    @classmethod
    def from_plan_file(cls, plan: PlanFile) -> Plan:
        """The code form of an already validated plan (a file, playbook or planner reply)."""
        return cls(
            ops=[
                _op_of(item) if isinstance(item, PlanEntry) else _loop_of(item.loop)
                for item in plan.items
            ],
            **{name: getattr(plan, name) for name in _SETTINGS},
            roles={name: _role_of(role) for name, role in plan.roles.items()},
            synthesis=_synthesis_of(plan.synthesis),
            **{name: getattr(plan, name) for name in _BUDGET},
            prices=_prices_of(plan),
            tools=plan.tools,
            tool_options={k: v.model_dump(exclude_none=True) for k, v in plan.tool_options.items()},
            mcp_servers={
                k: v.model_dump(exclude_none=True, exclude_defaults=True)
                for k, v in plan.mcp_servers.items()
            },
            approval_timeout_s=plan.approval_timeout_s,
        )


class _ExactDumper(yaml.SafeDumper):
    """``yaml.safe_dump`` that reads back exactly: each string is read back as it was."""


# YAML reads these as line breaks inside a plain or single-quoted scalar and folds them; in
# double quotes the emitter escapes them (``\N``, ``\L``, ``\P``).
_BREAKS = frozenset("\x85\u2028\u2029")


def _exact_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if _BREAKS.intersection(value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
    return dumper.represent_str(value)


_ExactDumper.add_representer(str, _exact_str)


def _freeze(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)  # frozen dataclass: set once, in __post_init__


def _items(name: str, value: object, what: str) -> tuple[Any, ...]:
    """A list-like argument as a tuple; a str (or a mapping) is refused, never split.

    ``Op(depends_on="ab")`` would otherwise depend on ``a`` and ``b``; a plan file's
    ``depends_on: ab`` is refused too (a list is expected).
    """
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        hint = f" (one item: [{value!r}])" if isinstance(value, str) else ""
        raise InvalidValueError(name, f"{shown(value)} is not a list of {what}{hint}")
    return tuple(value)


def _price_data(price: object) -> object:
    """A plan price as the file spells it: a mapping, or a ``steerflow.Price`` as one."""
    if isinstance(price, Mapping):
        return dict(price)
    if hasattr(price, "input") and hasattr(price, "output"):  # steerflow.Price (layer 1)
        return {"input": price.input, "output": price.output}
    return price


def _tools(name: str, value: object) -> tuple[str, ...]:
    """A tools argument as spec strings: a function becomes its importable spec."""
    items = _items(name, value, "tool specs or functions")
    for i, item in enumerate(items):
        problem = main_spec_problem(item)
        if problem is not None:
            raise InvalidValueError(f"{name}[{i}]", problem)
    return tuple(tool_spec_of(item, f"{name}[{i}]") for i, item in enumerate(items))


def _no_callable_model(name: str, model: object, fix: str) -> None:
    """A function given as a model spec is refused, with where a function goes instead."""
    if model is not None and not isinstance(model, str) and callable(model):
        raise InvalidValueError(name, f"{model!r} is a function, not a model spec: {fix}")


def _mapping(name: str, value: object) -> dict[Any, Any]:
    """A mapping argument as a dict; anything else is refused (``dict("ab")`` would raise)."""
    if not isinstance(value, Mapping):
        raise InvalidValueError(name, f"{shown(value)} is not a mapping")
    return dict(value)


def _op_of(entry: PlanEntry) -> Op:
    deps = [d if isinstance(d, str) else _edge_of(d) for d in entry.depends_on]
    return Op(
        agent_id=entry.agent_id,
        instruction=entry.instruction,
        depends_on=deps,
        assignee=entry.assignee,
        inherit_context=entry.inherit_context,
        artifacts=entry.artifacts,
        tools=entry.tools,
        max_steps=entry.max_steps,
        model=entry.model,
        retry=entry.retry.model_dump() if entry.retry is not None else None,
        timeout_s=entry.timeout_s,
        output_schema=entry.output_schema,
        approval=entry.approval,
        approve=entry.approve,
    )


def _loop_of(loop: LoopSpec) -> Loop:
    return Loop(
        id=loop.id,
        body=[_op_of(entry) for entry in loop.body],
        until=loop.until.model_dump(exclude_none=True),
        max_rounds=loop.max_rounds,
        on_max_rounds=loop.on_max_rounds,
    )


def _edge_of(dep: Dependency) -> Edge:
    return Edge(id=dep.id, when=dep.when, if_contains=dep.if_contains)


def _role_of(role: RoleSpec) -> Role:
    return Role(
        model=role.model,
        system=role.system,
        artifacts=role.artifacts,
        escalation=role.escalation,
        resources=role.resources,
        tools=role.tools,
        approve=role.approve,
    )


def _prices_of(plan: PlanFile) -> dict[str, Mapping[str, float]]:
    return {
        model: MappingProxyType({"input": price.input, "output": price.output})
        for model, price in plan.prices.items()
    }


def _synthesis_of(spec: SynthesisSpec | None) -> Synthesis | None:
    if spec is None:
        return None
    return Synthesis(
        instruction=spec.instruction, model=spec.model, when_all_failed=spec.when_all_failed
    )


def _class_schema(cls: type) -> dict[str, Any]:
    """``Op(output_schema=cls)``'s JSON Schema; a class it cannot be made from is refused."""
    try:
        return output_schema_of(cls)
    except TypeError as exc:
        raise InvalidValueError("Op.output_schema", str(exc)) from None
