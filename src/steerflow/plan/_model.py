"""Validated plan and playbook models (CONTRACT §5).

Everything read from a plan file, a playbook or a planner reply passes through
these models before a graph is built, so the executor only ever sees valid,
acyclic plans with unique ids.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "AGENT_ID_PATTERN",
    "MAX_PLAN_ENTRIES",
    "Dependency",
    "EdgeWhen",
    "PlanEntry",
    "PlanFile",
    "RoleSpec",
    "SpawnSpec",
]

# The first character keeps ids from naming a path component: ``.``, ``..`` and dot-files
# are refused, because an id becomes its leg's artifact directory name.
AGENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# Default of ``--max-plan-entries``: a larger plan is refused, never cut.
MAX_PLAN_ENTRIES = 1000
_AGENT_ID_RE = re.compile(AGENT_ID_PATTERN)

EdgeWhen = Literal["completed", "failed", "always"]
AgentId = Annotated[str, Field(pattern=AGENT_ID_PATTERN)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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

    @property
    def dependencies(self) -> list[Dependency]:
        """Dependencies normalized to :class:`Dependency` objects."""
        return [d if isinstance(d, Dependency) else Dependency(id=d) for d in self.depends_on]


class RoleSpec(_Strict):
    """Per-role settings: model, system prompt and declared artifacts."""

    model: str | None = None
    system: str | None = None
    artifacts: list[str] = Field(default_factory=list)
    escalation: list[str] = Field(default_factory=list)


class SpawnSpec(_Strict):
    """A reactive spawn request carried by an operation's result."""

    agent_id: AgentId
    instruction: str = Field(min_length=1)
    assignee: str | None = None
    depends_on: list[AgentId] = Field(default_factory=list)
    link_to_emitter: bool = True


class PlanFile(_Strict):
    """A plan file, playbook, or planner reply."""

    name: str | None = None
    description: str | None = None
    model: str | None = None
    reactive: str | bool | None = None
    max_ops: int | None = Field(default=None, ge=0)
    concurrency: int | None = Field(default=None, ge=1, le=256)
    roles: dict[str, RoleSpec] = Field(default_factory=dict)
    plan: list[PlanEntry] = Field(min_length=1)

    @field_validator("reactive", mode="before")
    @classmethod
    def _reactive_text(cls, value: object) -> object:
        # YAML reads a bare `off` as False and `on` as True; keep the spelling.
        if value is False:
            return "off"
        if value is True:
            return "all"
        return value

    @model_validator(mode="after")
    def _graph_is_sound(self) -> PlanFile:
        ids: dict[str, int] = {}
        for index, entry in enumerate(self.plan):
            if entry.agent_id in ids:
                raise ValueError(
                    f"plan[{index}].agent_id {entry.agent_id!r} repeats plan[{ids[entry.agent_id]}]"
                )
            ids[entry.agent_id] = index
        for index, entry in enumerate(self.plan):
            for dep in entry.dependencies:
                if dep.id not in ids:
                    raise ValueError(
                        f"plan[{index}] ({entry.agent_id!r}) depends on unknown agent_id {dep.id!r}"
                    )
                if dep.id == entry.agent_id:
                    raise ValueError(f"plan[{index}] ({entry.agent_id!r}) depends on itself")
        cycle = _find_cycle({e.agent_id: [d.id for d in e.dependencies] for e in self.plan})
        if cycle:
            raise ValueError("plan has a dependency cycle: " + " -> ".join(cycle))
        return self


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


def is_agent_id(value: str) -> bool:
    """True if ``value`` is a valid stable agent id (the whole string: no trailing newline)."""
    return isinstance(value, str) and _AGENT_ID_RE.fullmatch(value) is not None
