"""Validated plan and playbook models (CONTRACT §5).

Everything read from a plan file, a playbook or a planner reply passes through
these models before a graph is built, so the executor only ever sees valid,
acyclic plans with unique ids.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    field_validator,
    model_validator,
)

from steerflow.errors import PlanValidationError
from steerflow.plan._keys import SYNTHESIS_KEY
from steerflow.plan._loop import (
    DEFAULT_MAX_ROUNDS,
    MAX_ROUNDS_LIMIT,
    PYTHON_UNTIL_PATTERN,
    check_loops,
    expand,
)

__all__ = [
    "AGENT_ID_PATTERN",
    "COMPACT_BYTES",
    "COMPACT_RECORDS",
    "MAX_ARTIFACT_PATH",
    "MAX_PLAN_ENTRIES",
    "SYNTHESIS_KEY",
    "CompactBound",
    "Dependency",
    "EdgeWhen",
    "LoopItem",
    "LoopSpec",
    "McpServerSpec",
    "PlanEntry",
    "PlanFile",
    "RetrySpec",
    "RoleSpec",
    "SpawnSpec",
    "SynthesisSpec",
    "ToolOptionSpec",
    "UntilSpec",
    "artifact_path_problem",
    "resource_problem",
]

# The first character keeps ids from naming a path component: ``.``, ``..`` and dot-files
# are refused, because an id becomes its leg's artifact directory name.
AGENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# Default of ``--max-plan-entries``: a larger plan is refused, never cut.
MAX_PLAN_ENTRIES = 1000
_AGENT_ID_RE = re.compile(AGENT_ID_PATTERN)


class CompactBound(NamedTuple):
    """Accepted range and default of one version 3 compaction limit."""

    least: int
    most: int
    default: int


# ``--compact-records`` / plan ``compact_records``: journal records before a compaction.
# Past a million records a load replays an unbounded journal; the floor is one.
COMPACT_RECORDS = CompactBound(1, 1_000_000, 128)
# ``--compact-bytes`` / plan ``compact_bytes``: journal bytes before a compaction. Below
# 1 KiB one ordinary record triggers it; past 1 GiB the journal outgrows any sane load.
COMPACT_BYTES = CompactBound(1_024, 1_073_741_824, 8_388_608)
#: Longest declared artifact path (characters); a component is at most 255 bytes (NAME_MAX).
MAX_ARTIFACT_PATH = 1024

EdgeWhen = Literal["completed", "failed", "always"]
AgentId = Annotated[str, Field(pattern=AGENT_ID_PATTERN)]
#: A tool's name and an MCP server's name: what a model API accepts as a function name.
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
#: ``python:MODULE:FUNCTION``, ``mcp:SERVER`` or ``mcp:SERVER/TOOL`` (CONTRACT §12).
TOOL_SPEC_PATTERN = (
    r"^(python:[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*"
    r"|mcp:[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(/[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})?)$"
)
ToolSpecText = Annotated[str, Field(pattern=TOOL_SPEC_PATTERN)]
ToolName = Annotated[str, Field(pattern=TOOL_NAME_PATTERN)]
#: ``max_steps`` bounds: model requests of one tool node (default 25, CONTRACT §12).
MAX_STEPS_LIMIT = 10_000
#: A tool name pattern of ``approve`` (``fnmatch``, case-sensitive): 1 to 128 printable
#: characters, so a typo'd empty pattern cannot silently match nothing (issue 41).
ApprovePattern = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[\x21-\x7e]+$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class RetrySpec(_Strict):
    """``retry``: how often a failed call is tried again, and the pause before each try.

    A reply its node's ``output_schema`` refuses is asked again the same way (decision 276).
    """

    #: Tries after the first: a node makes at most ``1 + attempts`` calls.
    attempts: int = Field(ge=0, le=100, strict=True)
    backoff_s: float = Field(default=0.0, ge=0, le=3_600, allow_inf_nan=False)


class Dependency(_Strict):
    """A dependency edge, optionally conditional on the source's outcome.

    ``when`` decides whether the dependent runs once the source is terminal:
    ``completed`` (default) runs it only after a success, ``failed`` only after
    a failure (a fallback branch), ``always`` in both cases. ``if_contains``
    additionally requires the source's response text to contain a substring.
    A dependent whose edge condition is not met is recorded as ``skipped``.
    """

    id: AgentId
    when: EdgeWhen = "completed"
    if_contains: str | None = None


class PlanEntry(_Strict):
    """One planned operation."""

    agent_id: AgentId
    assignee: str | None = Field(default=None, max_length=128)
    instruction: str = Field(min_length=1)
    depends_on: list[AgentId | Dependency] = Field(default_factory=list)
    inherit_context: bool = False
    #: Files this node must leave in its leg directory (besides its role's). The
    #: description reaches a planner through the schema: a chat model writes no files.
    artifacts: list[str] = Field(
        default_factory=list,
        description="Relative paths of files this node must write into its own directory; "
        "it fails without them. Only for nodes run by an agent worker or a script: a plain "
        "chat model writes no files, so leave this empty for its nodes.",
    )

    #: Tools this node's model may call (``python:MOD:FN``, ``mcp:SERVER[/TOOL]``), added
    #: to its role's and the plan's: a node with any runs a model-and-tool loop.
    tools: list[ToolSpecText] = Field(default_factory=list)
    #: Model requests the loop may make before the node fails (default 25).
    max_steps: int | None = Field(default=None, ge=1, le=MAX_STEPS_LIMIT, strict=True)
    #: ``required``: the node waits for an operator's approval before its call, with its
    #: instruction as the request; ``approve``: tool name patterns whose calls wait
    #: (added to its role's). Issue 41.
    approval: Literal["required"] | None = None
    approve: list[ApprovePattern] = Field(default_factory=list)
    #: Per-node settings (issue 40 item 1): the model that runs this entry (wins over its
    #: role's and the plan's), how a failed call is tried again, and the longest one call
    #: may take before it fails.
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Leave this out: the operator's plan file chooses per-node models, "
        "a generated plan cannot.",
    )
    retry: RetrySpec | None = None
    timeout_s: float | None = Field(default=None, gt=0, le=86_400, allow_inf_nan=False)
    #: A JSON Schema the reply must satisfy (issue 40 item 2): asked for as structured
    #: output, validated, recorded as JSON beside the text.
    output_schema: dict[str, object] | None = None

    @field_validator("output_schema")
    @classmethod
    def _json_schema(cls, value: dict[str, object] | None) -> dict[str, object] | None:
        if value is not None:
            from steerflow.plan._schema import schema_problem

            problem = schema_problem(value)
            if problem:
                raise ValueError(problem)
        return value

    @property
    def dependencies(self) -> list[Dependency]:
        """Dependencies normalized to :class:`Dependency` objects."""
        return [d if isinstance(d, Dependency) else Dependency(id=d) for d in self.depends_on]


class RoleSpec(_Strict):
    """Per-role settings: model, system prompt, declared artifacts, Ray placement."""

    model: str | None = None
    system: str | None = None
    artifacts: list[str] = Field(default_factory=list)
    escalation: list[str] = Field(default_factory=list)
    #: Tools every node of the role may call (issue 39).
    tools: list[ToolSpecText] = Field(default_factory=list)
    #: Tool name patterns whose calls wait for an operator's approval (issue 41).
    approve: list[ApprovePattern] = Field(default_factory=list)
    #: What one of the role's calls asks a Ray cluster for (``--executor ray``): ``num_cpus``,
    #: ``num_gpus``, ``memory`` (bytes) and custom resources by name. Ignored when local.
    resources: dict[str, float] | None = Field(
        default=None,
        description="Ray resources per call of this role (num_cpus, num_gpus, memory in "
        "bytes, custom names); only used with --executor ray.",
    )

    @field_validator("resources")
    @classmethod
    def _resources(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None:
            for name, amount in value.items():
                problem = resource_problem(name, amount)
                if problem:
                    raise ValueError(f"resources.{name}: {problem}")
        return value


class ToolOptionSpec(_Strict):
    """``tool_options.<TOOL>``: how one tool is run (CONTRACT §12)."""

    #: True: calling it twice does no more than once, so a call a crash interrupted
    #: simply runs again on resume; otherwise the resume asks the operator.
    idempotent: bool | None = None
    approval: Literal["required", "never"] | None = None
    timeout_s: float | None = Field(default=None, gt=0, le=86_400, allow_inf_nan=False)


class McpServerSpec(_Strict):
    """``mcp_servers.<NAME>``: a stdio command (with its environment) or an HTTP URL."""

    command: list[str] | None = Field(default=None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    url: str | None = Field(default=None, pattern=r"^https?://")

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSpec:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of command (stdio) and url (streamable HTTP)")
        if self.url is not None and self.env:
            raise ValueError("env applies to a command, not to a url")
        return self


class SpawnSpec(_Strict):
    """A reactive spawn request carried by an operation's result."""

    agent_id: AgentId
    instruction: str = Field(min_length=1)
    assignee: str | None = None
    depends_on: list[AgentId] = Field(default_factory=list)
    link_to_emitter: bool = True
    artifacts: list[str] = Field(default_factory=list)

    @field_validator("artifacts")
    @classmethod
    def _artifact_paths(cls, paths: list[str]) -> list[str]:
        for index, path in enumerate(paths):
            problem = artifact_path_problem(path)
            if problem:
                raise ValueError(f"artifacts[{index}] {path!r}: {problem}")
        return paths


class SynthesisSpec(_Strict):
    """A final operation that receives every worker's final result (CONTRACT §10)."""

    instruction: str = Field(min_length=1)
    #: The model that runs it; None: the run's model.
    model: str | None = Field(default=None, min_length=1)
    #: When no worker completed: ``skip`` (the default; there is nothing to synthesize,
    #: so nothing is paid for) or ``run`` (over the failures' errors). Decision 103.
    when_all_failed: Literal["skip", "run"] = "skip"


class PriceSpec(_Strict):
    """``prices.<MODEL>``: USD per million input and output tokens."""

    input: float = Field(ge=0, allow_inf_nan=False)
    output: float = Field(ge=0, allow_inf_nan=False)

    @field_validator("input", "output", mode="before")
    @classmethod
    def _price_is_a_number(cls, value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"must be a number (USD per million tokens), not {value!r}")
        return value


# Loops (issue 40 item 4): a plan item beside entries, checked and expanded by plan._loop.


class UntilSpec(_Strict):
    """When a loop ends early: a body node's reply contains a text, or a function says so.

    ``{node, contains}``: after a round, the reply of body node ``node`` in that round
    contains ``contains``. ``{python: "python:MODULE:FUNCTION"}``: the function, called
    with ``{body id: reply}`` of the round's completed nodes, returns true.
    """

    node: str | None = Field(default=None, pattern=AGENT_ID_PATTERN)
    contains: str | None = Field(default=None, min_length=1)
    python: str | None = Field(default=None, pattern=PYTHON_UNTIL_PATTERN)

    @model_validator(mode="after")
    def _one_form(self) -> UntilSpec:
        texts = self.node is not None or self.contains is not None
        if texts and self.python is not None:
            raise ValueError("give either {node, contains} or {python}, not both")
        if self.python is None and (self.node is None or self.contains is None):
            raise ValueError("give {node, contains} (both) or {python: python:MODULE:FUNCTION}")
        return self


class LoopSpec(_Strict):
    """One loop: its id, its body (run once per round), when it ends."""

    id: str = Field(pattern=AGENT_ID_PATTERN)
    body: list[PlanEntry] = Field(min_length=1)
    until: UntilSpec
    max_rounds: int = Field(default=DEFAULT_MAX_ROUNDS, ge=1, le=MAX_ROUNDS_LIMIT, strict=True)
    on_max_rounds: Literal["stop", "fail"] = "stop"

    @property
    def body_ids(self) -> list[str]:
        """The body entries' base ids, in body order."""
        return [entry.agent_id for entry in self.body]


class LoopItem(_Strict):
    """A plan list item that is a loop: ``{loop: {...}}``."""

    loop: LoopSpec


#: What pydantic names the two kinds of plan item in an error location; left out of the
#: field a message names (``plan[2].loop.until``, not ``plan[2].<loop>.loop.until``).
ITEM_TAGS = frozenset({"<entry>", "<loop>"})


def _item_kind(value: object) -> str:
    if isinstance(value, LoopItem) or (isinstance(value, dict) and "loop" in value):
        return "<loop>"
    return "<entry>"


PlanItem = Annotated[
    Annotated[PlanEntry, Tag("<entry>")] | Annotated[LoopItem, Tag("<loop>")],
    Discriminator(_item_kind),
]


class PlanFile(_Strict):
    """A plan file, playbook, or planner reply.

    ``items`` is the ``plan`` list as written (entries and loops); :attr:`plan` is its
    entries with each loop replaced by its round-1 entries, what a graph is built from.
    """

    name: str | None = None
    description: str | None = None
    model: str | None = None
    reactive: str | bool | None = None
    max_ops: int | None = Field(default=None, ge=0)
    concurrency: int | None = Field(default=None, ge=1, le=256)
    # Version 3 compaction limits; the flags win over these
    # (docs/decisions.md: "Compaction limits").
    compact_records: int | None = Field(
        default=None, ge=COMPACT_RECORDS.least, le=COMPACT_RECORDS.most, strict=True
    )
    compact_bytes: int | None = Field(
        default=None, ge=COMPACT_BYTES.least, le=COMPACT_BYTES.most, strict=True
    )
    roles: dict[str, RoleSpec] = Field(default_factory=dict)
    synthesis: SynthesisSpec | None = None
    # Spend caps for the whole resume chain and prices by model; the flags win (§11).
    max_cost: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_tokens: int | None = Field(default=None, ge=1, strict=True)
    prices: dict[str, PriceSpec] = Field(default_factory=dict)
    #: Tools for every node, how each is run, and the MCP servers they come from.
    tools: list[ToolSpecText] = Field(default_factory=list)
    tool_options: dict[ToolName, ToolOptionSpec] = Field(default_factory=dict)
    mcp_servers: dict[ToolName, McpServerSpec] = Field(default_factory=dict)
    #: Seconds an approval request waits before it is denied (``--approval-timeout``).
    approval_timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    items: list[PlanItem] = Field(alias="plan", min_length=1)
    _entries: list[PlanEntry] = PrivateAttr(default_factory=list)
    _where: list[str] = PrivateAttr(default_factory=list)

    @property
    def plan(self) -> list[PlanEntry]:
        """The plan's entries, each loop as its round-1 entries (``X.r1``)."""
        return self._entries

    @property
    def loops(self) -> list[LoopSpec]:
        """The plan's loops, in plan order."""
        return [item.loop for item in self.items if isinstance(item, LoopItem)]

    @field_validator("reactive", mode="before")
    @classmethod
    def _reactive_text(cls, value: object) -> object:
        # YAML reads a bare `off` as False and `on` as True; keep the spelling.
        if value is False:
            return "off"
        if value is True:
            return "all"
        return value

    @field_validator("max_cost", mode="before")
    @classmethod
    def _cost_is_a_number(cls, value: object) -> object:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"must be a number of USD, not {value!r}")
        return value

    @field_validator("max_ops", "concurrency", mode="before")
    @classmethod
    def _count_is_not_a_boolean(cls, value: object) -> object:
        # Lax ints take booleans: YAML `max_ops: no` would silently mean 0, "no cap".
        if isinstance(value, bool):
            raise ValueError(f"must be a whole number, not {str(value).lower()}")
        return value

    @model_validator(mode="after")
    def _graph_is_sound(self) -> PlanFile:
        if any(isinstance(item, LoopItem) for item in self.items):
            check_loops(self.items, valid_id=is_agent_id, find_cycle=_find_cycle)
            self._check_loop_roles()
            self._entries = expand(self.items)
        else:
            self._entries = [item for item in self.items if isinstance(item, PlanEntry)]
        ids: dict[str, int] = {}
        for index, entry in enumerate(self.plan):
            if entry.agent_id == SYNTHESIS_KEY:
                raise ValueError(
                    f"{self.where(index)}.agent_id {SYNTHESIS_KEY!r} is reserved for the run's "
                    "synthesis: give the entry another id"
                )
            if entry.agent_id in ids:
                raise ValueError(
                    f"{self.where(index)}.agent_id {entry.agent_id!r} repeats "
                    f"{self.where(ids[entry.agent_id])}"
                )
            ids[entry.agent_id] = index
        self._check_artifact_paths()
        self._check_retries()
        for index, entry in enumerate(self.plan):
            for dep in entry.dependencies:
                if dep.id not in ids:
                    raise ValueError(
                        f"{self.where(index)} ({entry.agent_id!r}) depends on unknown agent_id "
                        f"{dep.id!r}"
                    )
                if dep.id == entry.agent_id:
                    raise ValueError(f"{self.where(index)} ({entry.agent_id!r}) depends on itself")
        cycle = _find_cycle({e.agent_id: [d.id for d in e.dependencies] for e in self.plan})
        if cycle:
            raise ValueError("plan has a dependency cycle: " + " -> ".join(cycle))
        return self

    def _check_loop_roles(self) -> None:
        # An escalation retry (X.rN.esc1) is no round node: the round it replaces could
        # never close, so a body entry may not take a role with a ladder.
        for at, item in enumerate(self.items):
            if not isinstance(item, LoopItem):
                continue
            for k, entry in enumerate(item.loop.body):
                role = self.roles.get(entry.assignee or "")
                if role is not None and role.escalation:
                    raise ValueError(
                        f"plan[{at}].loop.body[{k}].assignee: role {entry.assignee!r} has an "
                        "escalation ladder, which a loop body does not support (a failed "
                        "round ends the loop); give the body entry another role"
                    )

    def where(self, index: int) -> str:
        """Where entry ``index`` of :attr:`plan` was written (``plan[2].loop.body[0]``)."""
        if len(self._entries) == len(self.items):
            return f"plan[{index}]"  # no loop: the lists are the same
        if not self._where:
            self._where = [
                label
                for at, item in enumerate(self.items)
                for label in (
                    [f"plan[{at}].loop.body[{k}]" for k in range(len(item.loop.body))]
                    if isinstance(item, LoopItem)
                    else [f"plan[{at}]"]
                )
            ]
        return self._where[index]

    @model_validator(mode="after")
    def _typed_entries_call_no_tools(self) -> PlanFile:
        # A tool loop's last reply is not asked for structured output (decision 284): say
        # so when the plan is read rather than fail or ignore the schema at run time.
        for index, entry in enumerate(self.plan):
            if entry.output_schema is not None and self.tools_of(entry):
                raise ValueError(
                    f"{self.where(index)} ({entry.agent_id!r}).output_schema: a node with tools "
                    "cannot have an output_schema yet; give the schema to a node that "
                    "depends on the tool node"
                )
        return self

    def tools_of(self, entry: PlanEntry) -> list[str]:
        """The tool specs of one entry: the plan's, its role's, its own (first wins)."""
        role = self.roles.get(entry.assignee or "")
        specs = [*self.tools, *(role.tools if role else ()), *entry.tools]
        return list(dict.fromkeys(specs))

    def approve_of(self, entry: PlanEntry) -> list[str]:
        """The tool name patterns whose calls wait for approval: its role's and its own."""
        role = self.roles.get(entry.assignee or "")
        return list(dict.fromkeys([*(role.approve if role else ()), *entry.approve]))

    def check_mcp_servers(self, declared: Mapping[str, object] | None = None) -> None:
        """Every ``mcp:SERVER`` spec names a declared server (``declared``: the plan's).

        Not a model rule: a resume rebuilds its plan from the checkpoint, where the
        servers are in the run's ``config`` (checked against those instead).
        """
        servers = self.mcp_servers if declared is None else declared
        named = [("tools", self.tools)]
        named += [(f"roles.{name}.tools", role.tools) for name, role in self.roles.items()]
        named += [(f"{self.where(i)}.tools", e.tools) for i, e in enumerate(self.plan)]
        for where, specs in named:
            for spec in specs:
                if spec.startswith("mcp:"):
                    server = spec[4:].split("/", 1)[0]
                    if server not in servers:
                        known = ", ".join(sorted(servers)) or "none"
                        raise PlanValidationError(
                            f"{where}: {spec!r} names MCP server {server!r}, which "
                            f"mcp_servers does not declare (declared: {known})"
                        )

    def _check_retries(self) -> None:
        # A tool node's loop journals each step and may have run tools with effects:
        # calling it again from the start would run them twice (decision 278).
        for index, entry in enumerate(self.plan):
            if entry.retry is not None and entry.retry.attempts > 0 and self.tools_of(entry):
                raise ValueError(
                    f"plan[{index}] ({entry.agent_id!r}).retry: a node with tools is not "
                    "retried (its tools would run again); drop retry, or the tools"
                )

    def _check_artifact_paths(self) -> None:
        # Checked here rather than per field so the message names the entry's agent_id.
        for name, role in self.roles.items():
            for index, path in enumerate(role.artifacts):
                problem = artifact_path_problem(path)
                if problem:
                    raise ValueError(f"roles.{name}.artifacts[{index}] {path!r}: {problem}")
        for at, entry in enumerate(self.plan):
            for index, path in enumerate(entry.artifacts):
                problem = artifact_path_problem(path)
                if problem:
                    raise ValueError(
                        f"{self.where(at)} ({entry.agent_id!r}).artifacts[{index}] {path!r}: "
                        f"{problem}"
                    )


#: Ray's own resource names, which a plan spells as keyword options instead.
_RAY_BUILTIN_RESOURCES = {"CPU": "num_cpus", "GPU": "num_gpus"}
_RESOURCE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:/-]{0,127}$")


def resource_problem(name: str, amount: object) -> str | None:
    """Why ``resources.<name>: <amount>`` cannot be a Ray request, or None.

    Ray's rules, checked here so a bad plan is refused when it is read rather than when a
    call is placed: a quantity is a finite number >= 0, one above 1 is whole (Ray rounds
    fractions only below 1), ``memory`` is whole bytes, and ``CPU``/``GPU`` are spelled
    ``num_cpus``/``num_gpus``.
    """
    if name in _RAY_BUILTIN_RESOURCES:
        return f"spell it {_RAY_BUILTIN_RESOURCES[name]!r}"
    if name == "object_store_memory" or not _RESOURCE_NAME_RE.match(name):
        return "not a resource name a call can request"
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        return f"{amount!r} is not a number"
    if not math.isfinite(amount) or amount < 0:
        return f"{amount!r} is not a finite number >= 0"
    if name == "memory" and amount != int(amount):
        return f"{amount!r} is not a whole number of bytes"
    if amount > 1 and amount != int(amount):
        return f"{amount!r}: a quantity above 1 must be a whole number"
    return None


def _find_cycle(edges: dict[str, list[str]]) -> list[str] | None:
    """Return one dependency cycle as a list of ids, or None.

    Iterative: a long dependency chain (thousands of entries) must not hit the
    interpreter's recursion limit.
    """
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(edges, white)
    for start in edges:
        if colour[start] != white:
            continue
        colour[start] = grey
        path = [start]
        todo = [iter(edges.get(start, []))]
        while todo:
            dep = next(todo[-1], None)
            if dep is None:
                colour[path.pop()] = black
                todo.pop()
            elif colour.get(dep) == grey:
                return [*path[path.index(dep) :], dep]
            elif colour.get(dep) == white:
                colour[dep] = grey
                path.append(dep)
                todo.append(iter(edges.get(dep, [])))
    return None


def artifact_path_problem(path: object) -> str | None:
    """Why ``path`` cannot name a declared artifact, or None if it can.

    A declared artifact is a file relative to its leg directory, spelled canonically: no
    leading ``/``, no empty, ``.`` or ``..`` component, no NUL. Canonical spelling keeps one
    file from being declared (and recorded) under two names.
    """
    if not isinstance(path, str) or not path:
        return "must be a non-empty relative path"
    if path.startswith("/"):
        return "must be relative to the leg directory, not absolute"
    if "\0" in path:
        return "must not contain a NUL character"
    if len(path) > MAX_ARTIFACT_PATH:
        return f"is longer than {MAX_ARTIFACT_PATH} characters"
    for part in path.split("/"):
        if part == "..":
            return "must stay inside the leg directory (no '..' component)"
        if part in ("", "."):
            return "must not have an empty or '.' component"
        if len(part.encode("utf-8", "surrogatepass")) > 255:
            return "has a component longer than 255 bytes"
    return None


def is_agent_id(value: str) -> bool:
    """True if ``value`` is a valid stable agent id (the whole string: no trailing newline)."""
    return isinstance(value, str) and _AGENT_ID_RE.fullmatch(value) is not None
