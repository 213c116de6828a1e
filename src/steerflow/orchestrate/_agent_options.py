"""Inputs and outputs of one ``agent`` run (issue 19), independent of the command line."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from steerflow._values import some_text, whole_number
from steerflow.checkpoint import InFlightCall
from steerflow.errors import ExitCode, InvalidValueError
from steerflow.executor import Caps, InFlightDoubt
from steerflow.orchestrate._options import EndStatus, check_run_values
from steerflow.orchestrate._stranded import StrandedMessage
from steerflow.plan._model import TOOL_NAME_PATTERN, TOOL_SPEC_PATTERN, McpServerSpec
from steerflow.providers import Usage
from steerflow.providers._pricing import PriceLike

__all__ = [
    "CONTINUE_INSTRUCTION",
    "DEFAULT_MAX_TURNS",
    "AgentOptions",
    "AgentResult",
    "AgentSeed",
    "TurnOutcome",
]

DEFAULT_MAX_TURNS = 20
#: The instruction under the steer block of a turn started by operator messages.
CONTINUE_INSTRUCTION = (
    "Continue the task you are working on, taking the operator's messages above into account."
)


@dataclass(frozen=True)
class TurnOutcome:
    """One turn of this run or replayed from the source run."""

    number: int
    status: str  # completed | failed
    instruction: str
    response: str | None
    controls: tuple[str, ...] = ()
    replayed: bool = False
    error: str | None = None
    #: The worker's own session id after this turn (``claude-code``), if it reported one.
    conversation: str | None = None
    #: What the turn's call cost (CONTRACT §11 ``usage``), when it reported any.
    usage: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": f"turn-{self.number}",
            "turn": self.number,
            "status": self.status,
            "response": self.response,
            "controls": list(self.controls),
            "replayed": self.replayed,
            **({"error": self.error} if self.error else {}),
        }


@dataclass
class AgentSeed:
    """What a resume of an agent hands the runner: the checked turns to replay."""

    task: str
    model: str
    max_turns: int
    artifact_root: Path
    resumed_from: str
    source_run_id: str
    turns: list[TurnOutcome]
    next_instruction: str | None
    next_controls: tuple[str, ...]
    conversation: str | None
    flow_context: dict[str, Any]
    checkpoint_recovery: dict[str, Any] | None = None
    fork: bool = False
    #: Messages of the chain nothing will deliver (issue 26), and the warnings about them.
    stranded: list[StrandedMessage] = field(default_factory=list)
    redeliver_claimed: bool = False
    notes: list[str] = field(default_factory=list)
    #: The chain's caps (its checkpoint ``config.budget``) and its turns' spend.
    caps: Caps = field(default_factory=Caps)
    spent: Usage | None = None
    #: The source's turns that left and have no outcome (decision 217), and every call
    #: of the chain in that state: counted as spent.
    in_flight: tuple[InFlightCall, ...] = ()
    doubt: InFlightDoubt = field(default_factory=InFlightDoubt)
    #: ``--tool`` specs of the source run, its recorded steps, and the operator's
    #: ``--tool-call`` decisions (issue 39).
    tools: tuple[str, ...] = ()
    steps: tuple[dict[str, Any], ...] = ()
    tool_decisions: dict[str, str] = field(default_factory=dict)
    #: The source run's ``--mcp-server`` declarations, as its checkpoint config keeps them.
    mcp_servers: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class AgentOptions:
    """Everything ``steerflow agent`` (or ``resume`` of an agent run) decides before running.

    Checked when built, as ``FlowOptions`` is: what ``steerflow agent``'s flags refuse is
    refused here, naming the parameter (``max_turns``, ``timeout_s``, ...).

    Raises:
        InvalidValueError: A value the matching flag would refuse.
    """

    task: str = ""
    model: str = "echo"
    max_turns: int = DEFAULT_MAX_TURNS
    timeout_s: float | None = None
    save: Path | None = None
    resume: AgentSeed | None = None
    # Spend caps and price overrides, as for a flow (enforced before each turn).
    max_cost: float | None = None
    max_tokens: int | None = None
    prices: Mapping[str, PriceLike] = field(default_factory=dict)
    #: True when built from flags: a budget refusal names the flag, else the parameter.
    names_flags: bool = False
    # Where each turn's call runs, as for a flow (``--executor``, ``--ray-address``).
    executor: str = "local"
    ray_address: str | None = None
    # OpenTelemetry traces (issue 45, extra ``otel``): True/False, or None for the
    # environment's ``STEERFLOW_OTEL``. Not recorded: a resume says again whether it is traced.
    otel: bool | None = None
    #: ``--tool SPEC`` (``python:MODULE:FUNCTION``): each turn runs a tool loop; naming a
    #: tool here is its own consent (issue 39 item 1).
    tools: Sequence[str] = ()
    #: ``--mcp-server NAME=...``: the MCP servers ``mcp:NAME[/TOOL]`` tools come from, as a
    #: plan's ``mcp_servers`` (``{NAME: {command, env} | {url}}``); declaring one on the
    #: command line is its consent, as naming a tool is (decision 310).
    mcp_servers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tools = tuple(self.tools)
        self.check()

    def check(self) -> None:
        """Refuse what ``steerflow agent`` refuses, naming the parameter."""
        check_run_values(self)
        whole_number(self.max_turns, "max_turns", least=1)
        some_text(self.model, "model")
        if self.resume is None:
            some_text(self.task, "task")
        servers = checked_mcp_servers(self.mcp_servers)
        for spec in self.tools:
            if not isinstance(spec, str) or not re.fullmatch(TOOL_SPEC_PATTERN, spec):
                raise InvalidValueError(
                    "tools", f"{spec!r}: a tool is python:MODULE:FUNCTION, mcp:SERVER or "
                    "mcp:SERVER/TOOL"
                )  # fmt: skip
            server = spec[4:].split("/", 1)[0] if spec.startswith("mcp:") else None
            if server is not None and server not in servers:
                known = ", ".join(sorted(servers)) or "none"
                raise InvalidValueError(
                    "tools", f"{spec!r} names MCP server {server!r}, which is not declared "
                    f"(declare it with --mcp-server {server}=COMMAND; declared: {known})"
                )  # fmt: skip


def checked_mcp_servers(data: object) -> dict[str, dict[str, Any]]:
    """``mcp_servers`` checked by the plan key's own model; the stored (JSON) form.

    Raises:
        InvalidValueError: Not a mapping, a bad server name, or a bad declaration.
    """
    if not isinstance(data, Mapping):
        raise InvalidValueError("mcp_servers", f"{data!r} is not a mapping")
    out: dict[str, dict[str, Any]] = {}
    for name, spec in data.items():
        if not isinstance(name, str) or not re.fullmatch(TOOL_NAME_PATTERN, name):
            raise InvalidValueError("mcp_servers", f"{name!r} is not a server name")
        try:
            checked = McpServerSpec.model_validate(spec)
        except ValidationError as exc:
            why = "; ".join(e["msg"] for e in exc.errors())
            raise InvalidValueError(f"mcp_servers.{name}", why) from None
        out[name] = checked.model_dump(exclude_none=True, exclude_defaults=True)
    return out


@dataclass
class AgentResult:
    """How an agent run ended; ``to_json`` is the ``--json`` object."""

    session_id: str
    invocation_id: str
    run_id: str
    run_dir: str
    status: EndStatus
    exit_code: ExitCode
    checkpoint: dict[str, Any]
    turns: list[TurnOutcome] = field(repr=False)  # every reply: see ``FlowResult.outcomes``
    checkpoint_recovery: dict[str, Any] | None = None
    resumed_from: str | None = None
    stopped_by: dict[str, Any] | None = None
    rejected: list[dict[str, str]] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    #: ``{max_cost, max_tokens}``, and once the budget ended the run, what was spent.
    budget: dict[str, Any] = field(default_factory=dict)
    spent_line: str | None = None
    warnings: list[str] = field(default_factory=list)
    #: A resume: the chain's messages nothing would deliver (``StrandedMessage.to_json``).
    stranded_messages: list[dict[str, Any]] = field(default_factory=list)
    #: A resume's source calls that may have been paid (CONTRACT §12 ``in_flight_calls``).
    in_flight_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def result_text(self) -> str | None:
        """The last completed turn's response: what the agent finally said."""
        for turn in reversed(self.turns):
            if turn.status == "completed":
                return turn.response
        return None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "session_id": self.session_id,
            "invocation_id": self.invocation_id,
            "run_id": self.run_id,
            "kind": "agent",
            "status": self.status,
            "exit_code": int(self.exit_code),
            "checkpoint": self.checkpoint,
            "checkpoint_recovery": self.checkpoint_recovery,
            "nodes": [
                {
                    "id": f"turn-{t.number}",
                    "kind": "planned",
                    "status": t.status,
                    "assignee": "agent",
                }
                for t in self.turns
            ],
            "turns": [t.to_json() for t in self.turns],
            "run_dir": self.run_dir,
            "resumed_from": self.resumed_from,
            "rejected_controls": self.rejected,
            "usage": self.usage,
            "budget": self.budget,
            "warnings": self.warnings,
            "stranded_messages": self.stranded_messages,
            "in_flight_calls": self.in_flight_calls,
            "result": self.result_text,
        }
        if self.stopped_by is not None:
            out["stopped_by"] = self.stopped_by
        return out
