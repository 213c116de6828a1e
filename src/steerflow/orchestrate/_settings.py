"""A run's settings, and their one translation to and from the checkpoint ``config``."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from steerflow._values import some_text, whole_number
from steerflow.artifacts import CONFIG_KEY
from steerflow.errors import UsageError
from steerflow.executor import Caps
from steerflow.orchestrate._claim import LINEAGE_KEY
from steerflow.orchestrate._options import FlowOptions
from steerflow.plan import (
    COMPACT_BYTES,
    COMPACT_RECORDS,
    CompactBound,
    PlanFile,
    ReactivePolicy,
    RoleSpec,
    parse_reactive,
)
from steerflow.providers._pricing import Price, positive_price
from steerflow.state import InvocationKind

__all__ = ["RunSettings"]


@dataclass(frozen=True)
class RunSettings:
    """What a run uses after options, plan values and defaults were resolved.

    A fresh run takes them from :class:`FlowOptions` and its plan; a resume takes them
    from the source checkpoint's ``config``, which :meth:`to_checkpoint_config` wrote,
    so a resumed run keeps the settings it started with.
    """

    model: str
    reactive: ReactivePolicy
    max_ops: int
    concurrency: int
    save: Path | None
    playbook: str | None
    kind: InvocationKind
    #: Per-role settings as stored (``model``, ``system``, ...).
    roles: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Version 3 compaction limits (records, bytes of journal before a new base).
    compact_records: int = COMPACT_RECORDS.default
    compact_bytes: int = COMPACT_BYTES.default
    #: The run's artifact contract in its stored form (``steerflow.artifacts``); None
    #: until the run knows its artifact root, and for a source recorded without one.
    artifact_contract: Mapping[str, Any] | None = None
    #: The requested synthesis, ``{"instruction", "model"}`` (model None: the run's; plus
    #: ``"when_all_failed": "run"`` when the plan asks for it), or None.
    synthesis: Mapping[str, Any] | None = None
    #: A resumed run's own source (``_claim.lineage``); never read back into a resume's
    #: settings, so each run of a chain records the run it resumed, not its source's.
    resumed_from: Mapping[str, Any] | None = None
    #: Spend caps of the whole resume chain, and price overrides by model (spec or name).
    caps: Caps = field(default_factory=Caps)
    prices: Mapping[str, Price] = field(default_factory=dict)
    #: The plan's ``name``, kept in the checkpoint so ``db rebuild`` and a resume can name
    #: the run as it was named (``_claim.run_name``).
    plan_name: str | None = None
    #: ``tool_options`` and ``mcp_servers`` as stored (JSON objects; issue 39): a resume
    #: runs a tool node's tools as its first run did.
    tool_options: Mapping[str, Any] = field(default_factory=dict)
    mcp_servers: Mapping[str, Any] = field(default_factory=dict)
    #: Seconds an approval request waits before it is denied (issue 41); None: no bound.
    approval_timeout_s: float | None = None

    @classmethod
    def from_options(cls, options: FlowOptions, plan: PlanFile | None) -> RunSettings:
        """Options first, then the plan's values, then the defaults."""
        reactive: str | bool | None = options.reactive
        if reactive is None and plan is not None:
            reactive = plan.reactive
        max_ops = options.max_ops
        if max_ops is None:
            max_ops = (plan.max_ops or 0) if plan is not None else 0
        return cls(
            model=options.model or (plan.model if plan else None) or "echo",
            reactive=parse_reactive(reactive),
            max_ops=max_ops,
            concurrency=options.concurrency or (plan.concurrency if plan else None) or 4,
            save=options.save,
            playbook=options.playbook,
            kind=options.kind,
            roles={k: _role_config(v) for k, v in (plan.roles if plan else {}).items()},
            compact_records=_flag_or(
                options.compact_records,
                plan.compact_records if plan else None,
                COMPACT_RECORDS,
                "compact_records",
            ),
            compact_bytes=_flag_or(
                options.compact_bytes,
                plan.compact_bytes if plan else None,
                COMPACT_BYTES,
                "compact_bytes",
            ),
            synthesis=_synthesis(options, plan),
            tool_options=_dumped(plan.tool_options if plan else {}),
            mcp_servers=_dumped(plan.mcp_servers if plan else {}),
            caps=_caps(
                options.max_cost if options.max_cost is not None else _plan_cost(plan),
                options.max_tokens if options.max_tokens is not None else _plan_tokens(plan),
            ),
            prices={
                **{k: Price(v.input, v.output) for k, v in (plan.prices if plan else {}).items()},
                **options.price_overrides,
            },
            plan_name=plan.name if plan is not None else None,
            approval_timeout_s=options.approval_timeout_s
            or (plan.approval_timeout_s if plan is not None else None),
        )

    def with_budget(
        self, max_cost: float | None, max_tokens: int | None, prices: Mapping[str, Price]
    ) -> RunSettings:
        """A resume's settings: a cap it was given replaces its chain's; prices add up."""
        return replace(
            self,
            caps=_caps(
                self.caps.max_cost if max_cost is None else max_cost,
                self.caps.max_tokens if max_tokens is None else max_tokens,
            ),
            prices={**self.prices, **prices},
        )

    def with_approval_timeout(self, seconds: float | None) -> RunSettings:
        """A resume's settings with ``--approval-timeout`` if given (None keeps the chain's)."""
        return self if seconds is None else replace(self, approval_timeout_s=seconds)

    def with_compaction(self, records: int | None, size: int | None) -> RunSettings:
        """These settings with the compaction limits a resume was given (None keeps them)."""
        return replace(
            self,
            compact_records=_flag_or(
                records, self.compact_records, COMPACT_RECORDS, "compact_records"
            ),
            compact_bytes=_flag_or(size, self.compact_bytes, COMPACT_BYTES, "compact_bytes"),
        )

    @classmethod
    def from_checkpoint_config(cls, config: Mapping[str, Any]) -> RunSettings:
        """The settings a checkpoint's ``config`` records (missing keys take defaults)."""
        save_dir = config.get("save_dir")
        return cls(
            model=config.get("model_spec") or "echo",
            reactive=parse_reactive(config.get("reactive_spec") or "off"),
            max_ops=int(config.get("max_ops") or 0),
            concurrency=int(config.get("concurrency") or 4),
            save=Path(save_dir) if save_dir else None,
            playbook=config.get("playbook"),
            kind=config.get("kind", "flow"),
            roles=dict(config.get("roles") or {}),
            compact_records=_stored(config.get("compact_records"), COMPACT_RECORDS),
            compact_bytes=_stored(config.get("compact_bytes"), COMPACT_BYTES),
            artifact_contract=config.get(CONFIG_KEY),
            synthesis=_stored_synthesis(config.get("synthesis")),
            caps=_stored_caps(config.get("budget")),
            prices=_stored_prices(config.get("prices")),
            plan_name=config["name"] if isinstance(config.get("name"), str) else None,
            tool_options=dict(config.get("tool_options") or {}),
            mcp_servers=dict(config.get("mcp_servers") or {}),
            approval_timeout_s=_stored_seconds(config.get("approval_timeout_s")),
        )

    def to_checkpoint_config(self) -> dict[str, Any]:
        """The checkpoint's ``config`` object (CONTRACT §5); key order is part of the bytes.

        A compaction limit is stored only when it is not the default, so the config of a
        run with default limits keeps the bytes it always had (docs/decisions.md:
        "Compaction limits").
        """
        config: dict[str, Any] = {
            "model_spec": self.model,
            "reactive_spec": self.reactive.spec,
            "max_ops": self.max_ops,
            "concurrency": self.concurrency,
            "save_dir": str(self.save) if self.save else None,
            "playbook": self.playbook,
            "roles": dict(self.roles),
            "kind": self.kind,
        }
        if self.compact_records != COMPACT_RECORDS.default:
            config["compact_records"] = self.compact_records
        if self.compact_bytes != COMPACT_BYTES.default:
            config["compact_bytes"] = self.compact_bytes
        if self.artifact_contract is not None:
            # The copy that makes the checkpoint unit self-describing (Amendment 1 row 2).
            config[CONFIG_KEY] = self.artifact_contract
        if self.synthesis is not None:
            # The request itself, so a resume knows the run still owes its synthesis.
            config["synthesis"] = dict(self.synthesis)
        if self.resumed_from is not None:
            config[LINEAGE_KEY] = dict(self.resumed_from)
        # Stored only when set, so the config of a run without them keeps its bytes.
        if self.caps.any:
            config["budget"] = self.caps.to_json()
        if self.prices:
            config["prices"] = {k: {"input": p.input, "output": p.output}
                                for k, p in self.prices.items()}  # fmt: skip
        if self.plan_name is not None:
            config["name"] = self.plan_name
        if self.tool_options:
            config["tool_options"] = dict(self.tool_options)
        if self.mcp_servers:
            config["mcp_servers"] = dict(self.mcp_servers)
        if self.approval_timeout_s is not None:
            config["approval_timeout_s"] = self.approval_timeout_s
        return config

    @property
    def role_models(self) -> dict[str, str]:
        """Roles that name their own model."""
        return {k: v["model"] for k, v in self.roles.items() if v.get("model")}

    def model_for(self, assignee: str | None) -> str:
        """The model spec that serves an operation assigned to ``assignee``."""
        return self.role_models.get(assignee or "", self.model)

    @property
    def role_resources(self) -> dict[str, dict[str, float]]:
        """Roles that ask a Ray cluster for resources (``roles.<role>.resources``)."""
        out: dict[str, dict[str, float]] = {}
        for name, role in self.roles.items():
            asked = role.get("resources")
            if isinstance(asked, dict):
                out[name] = {str(k): float(v) for k, v in asked.items()}
        return out

    def escalation_for(self, assignee: str | None) -> list[str]:
        """The role's escalation ladder (``roles.<role>.escalation``), models in order."""
        ladder = (self.roles.get(assignee or "") or {}).get("escalation")
        return [m for m in ladder if isinstance(m, str)] if isinstance(ladder, list) else []

    @property
    def escalation_models(self) -> set[str]:
        """Every model some role's escalation ladder names."""
        return {m for role in self.roles for m in self.escalation_for(role)}

    @property
    def synthesis_model(self) -> str:
        """The model spec that serves the synthesis (its own, else the run's)."""
        model = (self.synthesis or {}).get("model")
        return model if isinstance(model, str) and model else self.model

    def system_for(self, assignee: str | None) -> str | None:
        """The role's system prompt, if it has one."""
        system = (self.roles.get(assignee or "") or {}).get("system")
        return system if isinstance(system, str) else None


def _plan_cost(plan: PlanFile | None) -> float | None:
    return plan.max_cost if plan is not None else None


def _plan_tokens(plan: PlanFile | None) -> int | None:
    return plan.max_tokens if plan is not None else None


def _caps(max_cost: float | None, max_tokens: int | None) -> Caps:
    """Caps from checked values (``FlowOptions.check``, the plan model, a stored config)."""
    return Caps(None if max_cost is None else float(max_cost), max_tokens)


def _stored_caps(value: object) -> Caps:
    if not isinstance(value, Mapping):
        return Caps()
    cost, tokens = value.get("max_cost"), value.get("max_tokens")
    return Caps(
        float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else None,
        tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None,
    )


def _stored_prices(value: object) -> dict[str, Price]:
    if not isinstance(value, Mapping):
        return {}
    out = {}
    for model, spec in value.items():
        if isinstance(spec, Mapping):
            with contextlib.suppress(UsageError):
                out[str(model)] = Price(
                    positive_price(spec.get("input"), str(model)),
                    positive_price(spec.get("output"), str(model)),
                )
    return out


def _role_config(role: RoleSpec) -> dict[str, Any]:
    """A role as the checkpoint's config stores it.

    ``resources`` only when given: the stored form of every plan without Ray placement
    stays byte for byte what it was.
    """
    return role.model_dump(exclude={"resources"} if role.resources is None else None)


def _flag_or(given: int | None, fallback: int | None, bound: CompactBound, name: str) -> int:
    """``given``, else ``fallback``, else the default.

    ``given`` is checked here too (``FlowOptions`` fields can be set after it was built),
    by the check ``--compact-records``/``--compact-bytes`` run, naming the parameter.
    """
    if given is None:
        return bound.default if fallback is None else fallback
    return whole_number(given, name, least=bound.least, most=bound.most, default=bound.default)


def _synthesis(options: FlowOptions, plan: PlanFile | None) -> dict[str, Any] | None:
    """``--synthesize TEXT`` replaces the plan's instruction and keeps the plan's model."""
    spec = plan.synthesis if plan is not None else None
    instruction = options.synthesize
    if instruction is not None:
        some_text(instruction, "synthesize")
    if instruction is None:
        if spec is None:
            return None
        instruction = spec.instruction
    synthesis: dict[str, Any] = {
        "instruction": instruction,
        "model": spec.model if spec is not None else None,
    }
    if spec is not None and spec.when_all_failed != "skip":
        # Stored only when asked for, so every other config keeps the bytes it had.
        synthesis["when_all_failed"] = spec.when_all_failed
    return synthesis


def _stored_synthesis(value: object) -> dict[str, Any] | None:
    """The synthesis a checkpoint ``config`` requests; one without an instruction is none."""
    if not isinstance(value, Mapping) or not isinstance(value.get("instruction"), str):
        return None
    model = value.get("model")
    stored: dict[str, Any] = {
        "instruction": value["instruction"],
        "model": model if isinstance(model, str) else None,
    }
    if value.get("when_all_failed") == "run":
        stored["when_all_failed"] = "run"
    return stored


def _stored(value: object, bound: CompactBound) -> int:
    """A limit read back from a checkpoint ``config``; absent or unusable is the default."""
    if isinstance(value, bool) or not isinstance(value, int):
        return bound.default
    return value if bound.least <= value <= bound.most else bound.default


def _dumped(models: Mapping[str, Any]) -> dict[str, Any]:
    """Plan models by name as stored: JSON objects without their unset (None) members."""
    return {name: model.model_dump(exclude_none=True) for name, model in models.items()}


def _stored_seconds(value: object) -> float | None:
    """A stored positive number of seconds, or None (absent or not one)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return None
    return float(value)
