"""Inputs and outputs of one flow run, independent of the command line."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, overload

from steerflow._values import (
    CHECKPOINT_VERSIONS,
    EXECUTORS,
    MAX_CONCURRENCY,
    one_of,
    positive_seconds,
    positive_usd,
    shown,
    some_text,
    whole_number,
)
from steerflow.checkpoint import InFlightCall
from steerflow.errors import ExitCode, InvalidValueError, UsageError
from steerflow.executor import Caps, Graph, InFlightDoubt
from steerflow.orchestrate._outcome import NodeOutcome, find_outcome, parse_output
from steerflow.orchestrate._stranded import StrandedMessage
from steerflow.plan import (
    COMPACT_BYTES,
    COMPACT_RECORDS,
    MAX_PLAN_ENTRIES,
    Plan,
    PlanFile,
    parse_reactive,
)
from steerflow.providers import Usage
from steerflow.providers._pricing import Price, PriceLike, as_prices
from steerflow.resume import ReplayPlan

__all__ = [
    "EndStatus",
    "FlowOptions",
    "FlowResult",
    "ResumeSeed",
    "RunStatus",
    "RunValues",
    "check_executor",
    "check_run_values",
    "exit_code_for",
    "node_summaries",
    "usage_total",
]

#: How a run that started ended; stored as the session status.
EndStatus = Literal[
    "completed", "failed", "timed_out", "interrupted", "stopped", "budget_exhausted"
]

T = TypeVar("T")

_SIGNAL_EXIT = {signal.SIGINT: ExitCode.SIGINT, signal.SIGTERM: ExitCode.SIGTERM}


def exit_code_for(status: EndStatus, stop_signal: int | None) -> ExitCode:
    """The CONTRACT §3 exit code of a run (flow or agent) that ended ``status``."""
    if status == "completed":
        return ExitCode.OK
    if status == "timed_out":
        return ExitCode.DEADLINE
    if status == "stopped":
        return ExitCode.STOPPED
    if status == "budget_exhausted":
        return ExitCode.BUDGET
    if status == "interrupted" and stop_signal:
        return _SIGNAL_EXIT.get(signal.Signals(stop_signal), ExitCode.FAILED)
    return ExitCode.FAILED


#: ``FlowResult.status``: an end status, or ``planned`` for a dry run (CONTRACT §3).
RunStatus = Literal[
    "planned", "completed", "failed", "timed_out", "interrupted", "stopped", "budget_exhausted"
]


@dataclass
class ResumeSeed:
    """What a resume hands the runner: the persisted plan and the checked replay.

    ``replay`` is pure data (no executor types); the runner applies it with
    ``apply_replay`` once the fresh graph is built and before anything executes, which
    pre-marks replayed nodes and rebuilds spawned ones.
    """

    plan: PlanFile
    prompt: str
    config: dict[str, Any]
    resumed_from: str
    source_run_id: str | None
    replay: ReplayPlan
    flow_context: dict[str, Any] = field(default_factory=dict)
    max_spawn: int | None = None
    degraded: list[str] = field(default_factory=list)
    checkpoint_recovery: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    # ``resume --fork``: an explicit branch, never refused by other resumes of the source.
    fork: bool = False
    # The source run's artifact root: the resumed run's legs are written there too, so
    # replayed and re-run legs share one root (Amendment 1 row 9). None: a fresh root.
    artifact_root: Path | None = None
    # Messages of the chain nothing will deliver (issue 26); re-queued after the first
    # checkpoint (``applying`` ones only with ``resume --redeliver-claimed``).
    stranded: list[StrandedMessage] = field(default_factory=list)
    redeliver_claimed: bool = False
    #: What the chain up to the source spent (its checkpoint's record): a cap is the
    #: total for the whole chain, so the resumed run starts counting from here.
    spent: Usage | None = None
    #: The source's calls that left and have no outcome (write-ahead intents, decision
    #: 217), and every call of the chain in that state: counted as spent.
    in_flight: tuple[InFlightCall, ...] = ()
    doubt: InFlightDoubt = field(default_factory=InFlightDoubt)
    #: Every step of the source's tool nodes (copied into the resumed run's checkpoint;
    #: an unfinished node's loop continues after them), the ``(record, key)`` of the
    #: nodes whose outcome ended them, and the operator's ``--tool-call`` decisions.
    steps: tuple[dict[str, Any], ...] = ()
    finished_steps: set[tuple[str, str]] = field(default_factory=set)
    tool_decisions: dict[str, str] = field(default_factory=dict)
    #: The ``loop`` member of each recorded entry of a loop's round, by node key: the
    #: rounds decided and why a loop ended (issue 40 item 4).
    loop_records: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class FlowOptions:
    """Everything ``flow``/``play``/``resume`` decide before running.

    ``None`` means "not given": the plan file or playbook value, then the default, applies.
    The plan comes from one place: ``plan`` (built in code), ``plan_path``, ``playbook``,
    a resume's checkpoint or, with none of them, the model's planner.

    Every value is checked when the options are built (and again when a run starts), by
    the checks the command line runs on its flags, so the API refuses exactly what the
    CLI refuses; the error names the parameter (``timeout_s``), not the flag.

    Raises:
        InvalidValueError: A value the matching flag would refuse (``timeout_s=0``,
            ``concurrency=0``, ``max_ops=-1``, ``max_cost=nan``, a bad ``prices`` entry...).
        UsageError: ``plan`` given with ``plan_path``, ``playbook`` or ``resume``.
    """

    prompt: str | None = None
    plan_path: Path | None = None
    playbook: str | None = None
    model: str | None = None
    reactive: str | None = None
    max_ops: int | None = None
    concurrency: int | None = None
    save: Path | None = None
    timeout_s: float | None = None
    #: ``--approval-timeout``: seconds an approval request waits before it is denied
    #: (issue 41); a resume keeps its chain's unless given.
    approval_timeout_s: float | None = None
    checkpoint_version: int = 3
    dry_run: bool = False
    show_graph: bool = False
    kind: Literal["flow", "play"] = "flow"
    default_max_spawn: int = 20
    resume: ResumeSeed | None = None
    # Version 3 compaction limits (``--compact-records``/``--compact-bytes``); a resume
    # keeps its source's unless given (docs/decisions.md: "Compaction limits").
    compact_records: int | None = None
    compact_bytes: int | None = None
    # Plans (file, playbook, planner reply) over this many entries are refused; resume
    # does not apply it (the checkpoint's plan was accepted when the run started).
    max_plan_entries: int = MAX_PLAN_ENTRIES
    # A plan file or playbook may name claude-code/codex workers only with this consent.
    allow_agent_workers: bool = False
    # ... and ``python:`` function nodes with this one (the same spec as --model also counts).
    allow_python: bool = False
    #: Consent to start the plan's MCP servers for its ``mcp:`` tools (``--allow-mcp``).
    allow_mcp: bool = False
    # ``--synthesize TEXT``: a final operation over every worker's result; it replaces the
    # instruction of the plan's ``synthesis`` (whose model it keeps).
    synthesize: str | None = None
    # Spend caps for the whole resume chain (``--max-cost``/``--max-tokens``; a resume
    # keeps its chain's unless given) and ``--price`` overrides, by model spec or name.
    max_cost: float | None = None
    max_tokens: int | None = None
    #: By model spec or name: a ``steerflow.Price``, an ``(IN, OUT)`` pair or
    #: ``{"input": IN, "output": OUT}`` (USD per million tokens); kept as ``Price``.
    prices: Mapping[str, PriceLike] = field(default_factory=dict)
    #: True when built from the command line's flags: a budget refusal then names the
    #: flag (``--max-cost``), else the parameter (``max_cost``; issue 40 item 5).
    names_flags: bool = False
    # A plan built in code (``steerflow.Plan``): run as a plan file with the same content
    # would be, and recorded the same way, so ``steerflow resume RUN`` continues it.
    plan: Plan | None = None
    # Where node calls run (``--executor``, env ``STEERFLOW_EXECUTOR``): this process, or a
    # Ray cluster (``--ray-address``, else Ray's own ``RAY_ADDRESS``). Not recorded: a
    # resume says again where its calls run.
    executor: str = "local"
    ray_address: str | None = None
    # OpenTelemetry traces (issue 45, extra ``otel``): True/False, or None for the
    # environment's ``STEERFLOW_OTEL``. Not recorded: a resume says again whether it is traced.
    otel: bool | None = None

    def __post_init__(self) -> None:
        self.check()

    @property
    def price_overrides(self) -> dict[str, Price]:
        """``prices`` as ``Price`` objects (what :meth:`check` normalised them to)."""
        return as_prices(self.prices)

    def check(self) -> None:
        """Refuse what the CLI refuses, naming the parameter; normalise numbers and prices.

        Raises:
            InvalidValueError, UsageError: As the class says.
        """
        check_run_values(self)
        if self.approval_timeout_s is not None:
            self.approval_timeout_s = positive_seconds(
                self.approval_timeout_s, "approval_timeout_s"
            )
        if self.max_ops is not None:
            whole_number(self.max_ops, "max_ops", least=0)
        if self.concurrency is not None:
            whole_number(self.concurrency, "concurrency", least=1, most=MAX_CONCURRENCY)
        one_of(self.checkpoint_version, "checkpoint_version", CHECKPOINT_VERSIONS)
        one_of(self.kind, "kind", ("flow", "play"))
        whole_number(self.default_max_spawn, "default_max_spawn", least=0)
        whole_number(self.max_plan_entries, "max_plan_entries", least=1)
        for name, bound in (("compact_records", COMPACT_RECORDS), ("compact_bytes", COMPACT_BYTES)):
            value = getattr(self, name)
            if value is not None:
                whole_number(value, name, least=bound.least, most=bound.most, default=bound.default)
        if self.synthesize is not None:
            some_text(self.synthesize, "synthesize")
        if self.reactive is not None:
            if not isinstance(self.reactive, str):
                raise InvalidValueError("reactive", f"{shown(self.reactive)} is not a str")
            parse_reactive(self.reactive, name="reactive")
        self._check_plan()

    def _check_plan(self) -> None:
        if self.plan is None:
            return
        if not isinstance(self.plan, Plan):
            raise UsageError(f"FlowOptions(plan=...) takes a steerflow.Plan, not {self.plan!r}")
        others = [
            name
            for name, value in (
                ("plan_path", self.plan_path),
                ("playbook", self.playbook),
                ("resume", self.resume),
            )
            if value is not None
        ]
        if others:
            raise UsageError(
                f"FlowOptions: give either plan or {others[0]}, not both (a run has one plan)"
            )


def check_executor(executor: str) -> None:
    """Refuse an ``--executor`` value other than ``local`` or ``ray`` (CONTRACT §11)."""
    one_of(executor, "executor", EXECUTORS)


class RunValues(Protocol):
    """The fields ``FlowOptions`` and ``AgentOptions`` share, checked alike."""

    timeout_s: float | None
    max_cost: float | None
    max_tokens: int | None
    prices: Mapping[str, PriceLike]
    executor: str
    ray_address: str | None


def check_run_values(options: RunValues) -> None:
    """The checks ``FlowOptions`` and ``AgentOptions`` share; numbers and prices normalised.

    ``timeout_s``, ``max_cost``, ``max_tokens``, ``prices``, ``executor`` and
    ``ray_address``, each refused as its flag would be and named as the parameter.
    """
    if options.timeout_s is not None:
        options.timeout_s = positive_seconds(options.timeout_s, "timeout_s")
    if options.max_cost is not None:
        options.max_cost = positive_usd(options.max_cost, "max_cost")
    if options.max_tokens is not None:
        whole_number(options.max_tokens, "max_tokens", least=1)
    options.prices = as_prices(options.prices)
    check_executor(options.executor)
    if options.ray_address is not None:
        some_text(options.ray_address, "ray_address")


@dataclass
class FlowResult:
    """The outcome of one run, as printed by ``--json``."""

    session_id: str | None
    run_id: str | None
    status: RunStatus
    exit_code: ExitCode
    checkpoint: dict[str, Any]
    checkpoint_recovery: dict[str, Any] | None
    nodes: list[dict[str, Any]]
    run_dir: str | None = None
    warnings: list[str] = field(default_factory=list)
    spawn_rejections: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: str | None = None
    degraded_context: list[str] = field(default_factory=list)
    graph_text: str | None = None
    error: dict[str, str] | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    #: ``resume --rerun-unsettled``: ``{id, unsettled}`` per node that ran again.
    rerun_unsettled: list[dict[str, Any]] = field(default_factory=list)
    #: ``resume --from NODE``: ``{node, rerun, instruction_edited}`` (``RerunFrom``).
    rerun_from: dict[str, Any] | None = None
    #: ``ctl stop``: ``{control_id, reason, now}`` of the stop that ended the run.
    stopped_by: dict[str, Any] | None = None
    #: A resume: the chain's messages nothing would deliver (``StrandedMessage.to_json``).
    stranded_messages: list[dict[str, Any]] = field(default_factory=list)
    #: A resume's source calls that may have been paid (CONTRACT §12 ``in_flight_calls``).
    in_flight_calls: list[dict[str, Any]] = field(default_factory=list)
    #: The caps (``{max_cost, max_tokens}``, members null when not set).
    budget: dict[str, Any] = field(default_factory=lambda: Caps().to_json())
    #: Once the budget ended the run: ``{spent, line}`` (the chain's spend, the line said).
    budget_exhausted: dict[str, Any] | None = None
    #: Each loop's ``{id, rounds, ended, nodes}`` (issue 40 item 4); absent when none.
    loops: list[dict[str, Any]] = field(default_factory=list)
    #: Every node's response, output and usage by node id (not in ``--json``: decision 287).
    #: Not in the repr either: ``asyncio.run`` formats its main task's repr at the end
    #: (Python 3.11), which would copy every response of a batch once more (decision 388).
    outcomes: dict[str, NodeOutcome] = field(default_factory=dict, repr=False)
    #: The class each ``Op(output_schema=cls)`` gave, by op id: ``output``'s default.
    output_classes: dict[str, type] = field(default_factory=dict, repr=False)

    def response(self, node: str) -> object:
        """Node ``node``'s response (its reply text), or None when it did not complete.

        Raises:
            UnknownIdError: The run has no node ``node`` (the message lists them).
        """
        return find_outcome(self.outcomes, node, self.run_id).response

    @overload
    def output(self, node: str, cls: None = None) -> Any: ...
    @overload
    def output(self, node: str, cls: type[T]) -> T: ...
    def output(self, node: str, cls: type[Any] | None = None) -> Any:
        """Node ``node``'s validated structured output, parsed into ``cls``.

        ``cls`` (a pydantic model class, a dataclass or a TypedDict) defaults to the class
        its ``Op(output_schema=...)`` was given; without one the plain JSON value is
        returned. None when the node has no output (no schema, or it did not complete).

        Raises:
            UnknownIdError: The run has no node ``node`` (the message lists them).
            UsageError: The output does not parse into ``cls``.
        """
        outcome = find_outcome(self.outcomes, node, self.run_id)
        return parse_output(outcome.output, cls or self.output_classes.get(node), node)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object (CONTRACT §3)."""
        out: dict[str, Any] = {
            "session_id": self.session_id,
            "run_id": self.run_id,
            "status": self.status,
            "exit_code": int(self.exit_code),
            "checkpoint": self.checkpoint,
            "checkpoint_recovery": self.checkpoint_recovery,
            "nodes": self.nodes,
            "run_dir": self.run_dir,
            "warnings": self.warnings,
            "spawn_rejections": self.spawn_rejections,
            "resumed_from": self.resumed_from,
            "degraded_context": self.degraded_context,
            "usage": self.usage,
            "budget": self.budget,
            "stranded_messages": self.stranded_messages,
            "in_flight_calls": self.in_flight_calls,
        }
        if self.budget_exhausted is not None:
            out["budget_exhausted"] = self.budget_exhausted
        if self.loops:
            out["loops"] = self.loops
        if self.error is not None:
            out["error"] = self.error
        if self.stopped_by is not None:
            out["stopped_by"] = self.stopped_by
        if self.rerun_unsettled:
            out["rerun_unsettled"] = self.rerun_unsettled
        if self.rerun_from is not None:
            out["rerun_from"] = self.rerun_from
            out["rerun"] = list(self.rerun_from["rerun"])
        return out


def node_summaries(graph: Graph) -> list[dict[str, Any]]:
    """``{id, kind, status, assignee}`` per node; ``id`` is the agent_id or spawn_id."""
    return [
        {
            "id": op.key,
            "kind": op.kind,
            "status": op.status,
            "assignee": op.assignee,
            **({"error": op.error} if op.error else {}),
            **({"reason": op.extra["skipped"]} if "skipped" in op.extra else {}),
        }
        for op in graph
    ]


def usage_total(graph: Graph, *calls: Usage | None) -> dict[str, Any]:
    """Token and cost totals over every node that reported usage, and ``calls``.

    ``calls`` are the run's other paid calls (the planner's), counted like a node's.
    A member is null when no call reported it (CONTRACT §11).
    """
    total = Usage()
    for usage in [*(op.usage for op in graph), *calls]:
        if usage is not None:
            total = total + usage
    return total.to_json()
