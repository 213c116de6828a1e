"""The steps of a tool node's loop, each journaled before the next begins (issue 39).

A version 3 journal may hold records of kind ``step``: one per model reply and per tool
call of a node that runs a model-and-tool loop (decision 254).  Their entry is exactly
:data:`STEP_MEMBERS` plus a ``result_digest`` over them, so an edited reply, argument
or result is refused like an edited response:

- ``node``, ``record``, ``key``: the node, and the outcome entry it belongs to (``op`` and
  the agent id, or ``spawn`` and the node id);
- ``index``: the step's place in the node's loop, 1, 2, ... with no gap;
- ``type``: ``model`` (a reply, recorded as soon as it returned; ``call_id`` is the
  write-ahead intent of that request, which the step closes) or ``tool`` (``call_id`` the
  model's id for the call);
- ``status``: ``completed`` for a model step; for a tool step ``in_flight`` (its intent,
  recorded before the tool starts), then one more record at the same index ending it:
  ``completed``, ``failed`` (the tool answered with an error) or ``skipped`` (the operator
  chose not to run it again after a crash); an ``approval`` step (issue 41, ``call_id``
  the call it asks about, or ``instruction`` for an op's own approval) is ``awaiting``
  (the request, before the node waits), then ``approved`` or ``denied`` at that index;
- ``data``: the step's content (text, tool calls and usage; arguments, result and times).

The order rule is checked by :class:`StepLog` wherever steps are folded (the writer's
state, the loader, a base's ``steps``): a deleted, reordered or repeated step is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._digest import result_digest

__all__ = [
    "APPROVAL_STATUSES",
    "STEP_MEMBERS",
    "STEP_STATUSES",
    "StepError",
    "StepLog",
    "check_step",
    "step_digest",
]

STEP_MEMBERS = ("node", "record", "key", "index", "type", "call_id", "status", "data")
#: What a step's ``status`` may be; ``in_flight`` only for a tool step not yet ended.
STEP_STATUSES = frozenset({"completed", "failed", "in_flight", "skipped"})
#: An ``approval`` step's statuses (issue 41): ``awaiting`` (the request, recorded before
#: the node waits), then ``approved`` or ``denied`` at the same index.
APPROVAL_STATUSES = frozenset({"awaiting", "approved", "denied"})
_TYPES = ("model", "tool", "approval")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
#: A vendor's tool call id: printable, bounded (OpenAI ``call_…``, Anthropic ``toolu_…``).
_CALL_ID = re.compile(r"[\x21-\x7e]{1,256}")


class StepError(ValueError):
    """A step fails the format or order rules; ``detail`` says which."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def step_digest(entry: Mapping[str, object]) -> str:
    """The ``result_digest`` of a step: over every member but the digest itself."""
    return result_digest({name: entry.get(name) for name in STEP_MEMBERS})


def check_step(entry: object, *, sealed: bool = True) -> None:
    """Validate one step entry's members (raise :class:`StepError`); ``sealed``: digest too."""
    if not isinstance(entry, dict):
        raise StepError("step is not an object")
    allowed = {*STEP_MEMBERS, "result_digest"} if sealed else set(STEP_MEMBERS)
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise StepError(f"step has unknown members {unknown!r}")
    missing = [name for name in STEP_MEMBERS if name not in entry]
    if sealed and "result_digest" not in entry:
        missing.append("result_digest")
    if missing:
        raise StepError(f"step lacks {missing!r}")
    for name in ("node", "key"):
        if not isinstance(entry[name], str) or not _ID.fullmatch(entry[name]):
            raise StepError(f"step {name} is not an id")
    if entry["record"] not in ("op", "spawn"):
        raise StepError("step record is not 'op' or 'spawn'")
    index = entry["index"]
    if isinstance(index, bool) or not isinstance(index, int) or index < 1:
        raise StepError("step index is not a positive integer")
    if entry["type"] not in _TYPES:
        raise StepError("step type is not 'model', 'tool' or 'approval'")
    if not isinstance(entry["call_id"], str) or not _CALL_ID.fullmatch(entry["call_id"]):
        raise StepError("step call_id is not a printable id")
    statuses = APPROVAL_STATUSES if entry["type"] == "approval" else STEP_STATUSES
    if entry["status"] not in statuses:
        raise StepError(f"{entry['type']} step status is not one of {sorted(statuses)}")
    if entry["type"] == "model" and entry["status"] != "completed":
        raise StepError("a model step is recorded only once it completed")
    if not isinstance(entry["data"], dict):
        raise StepError("step data is not an object")
    if sealed and entry["result_digest"] != step_digest(entry):
        raise StepError("step result_digest does not match its members")


#: The status a step is recorded with first and ended from at the same index, by type.
_OPEN = {"tool": ("in_flight",), "approval": ("awaiting",)}


@dataclass
class StepLog:
    """Every node's steps in recorded order, folded one entry at a time.

    A step's index is the next one of its node, or the index of that node's last step
    when that is a tool call still ``in_flight`` and this entry ends it (same call id).
    Anything else (a gap, a step recorded twice, an ended call changed) is refused.
    """

    by_node: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def of(cls, entries: Iterable[dict[str, Any]]) -> StepLog:
        """Fold ``entries`` (already member-checked) in order; raise :class:`StepError`."""
        log = cls()
        for entry in entries:
            log.add(entry)
        return log

    def add(self, entry: dict[str, Any]) -> None:
        """Fold one member-checked entry, or raise :class:`StepError` naming the rule."""
        steps = self.by_node.setdefault((entry["record"], entry["key"]), [])
        index = entry["index"]
        if index == len(steps) + 1:
            steps.append(entry)
            return
        last = steps[-1] if steps else None
        if (
            last is not None
            and index == last["index"]
            and last["type"] == entry["type"]
            and last["status"] in _OPEN.get(last["type"], ())
            and entry["status"] not in _OPEN.get(last["type"], ())
            and last["call_id"] == entry["call_id"]
        ):
            steps[-1] = entry
            return
        if last is not None and entry == last:
            return  # a writer's retry after a reconciliation adopted the first copy
        raise StepError(
            f"step {index} of node {entry['node']!r} does not follow step "
            f"{len(steps)} (a step is missing, repeated or out of order)"
        )

    def entries(self) -> list[dict[str, Any]]:
        """Every step, node by node in first-recorded order, each node's in index order."""
        return [entry for steps in self.by_node.values() for entry in steps]

    def of_node(self, record: str, key: str) -> tuple[dict[str, Any], ...]:
        """The steps recorded for one node, in order."""
        return tuple(self.by_node.get((record, key), ()))

    def __bool__(self) -> bool:
        return bool(self.by_node)
