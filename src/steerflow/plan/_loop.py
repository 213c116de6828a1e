"""Loops in a plan (issue 40 item 4): ``{loop: {id, body, until, max_rounds, on_max_rounds}}``.

A loop item stands in a plan's list beside ordinary entries. Its body entries run once per
round; round N of body entry ``X`` is the node ``X.rN`` (CONTRACT §12). Only round 1 is
planned: :func:`expand` turns each loop item into its round-1 entries, so everything that
reads a plan's entries (the graph, the checkpoint's ``plan``, a resume) sees ordinary
entries; later rounds are added while the run runs (``executor._loops``).

Dependencies (decision 289): a body entry depends on another body entry of its loop by
its base id (the same round), and on an id outside the loop (an entry or another loop),
which applies to round 1 only; an entry outside depends on the loop by its id, meaning
every body node of the loop's last round.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from steerflow.plan._keys import SYNTHESIS_KEY

__all__ = [
    "CHECKPOINT_MEMBER",
    "DEFAULT_MAX_ROUNDS",
    "MAX_ROUNDS_LIMIT",
    "check_loops",
    "checkpoint_marks",
    "expand",
    "fold_checkpoint",
    "is_loop",
    "loop_dependencies",
    "round_id",
    "split_round_id",
]

#: Rounds a loop runs at most when ``max_rounds`` is not given (decision 288).
DEFAULT_MAX_ROUNDS = 3
#: The largest ``max_rounds`` accepted: a runaway loop is a plan error, not a bill.
MAX_ROUNDS_LIMIT = 100
#: ``python:MODULE:FUNCTION``, the spelling of a function node's model spec.
PYTHON_UNTIL_PATTERN = r"^python:[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
_ROUND_RE = re.compile(r"\A(?P<base>.+)\.r(?P<n>[1-9][0-9]*)\Z")


def round_id(base: str, number: int) -> str:
    """The node id of round ``number`` of body entry ``base``: ``<base>.r<number>``."""
    return f"{base}.r{number}"


def split_round_id(key: str) -> tuple[str, int] | None:
    """``("draft", 2)`` for ``draft.r2``; None for an id that names no round."""
    match = _ROUND_RE.match(key)
    return (match.group("base"), int(match.group("n"))) if match else None


def is_loop(item: object) -> bool:
    """True for a plan item that is a loop (``LoopItem``), not an entry."""
    return hasattr(item, "loop")


def check_loops(
    items: Sequence[Any],
    *,
    valid_id: Callable[[str], bool],
    find_cycle: Callable[[dict[str, list[str]]], list[str] | None],
) -> None:
    """Refuse a plan whose loops cannot run, naming the key (``plan[2].loop.until.node``).

    ``items``: a plan's entries and ``LoopItem`` objects (``plan._model``, which calls
    this with its id check and cycle finder: this module sits below it).

    Raises:
        ValueError: the first problem found.
    """
    outside: dict[str, int] = {}
    for index, item in enumerate(items):
        name = item.loop.id if is_loop(item) else item.agent_id
        earlier = outside.setdefault(name, index)
        if earlier != index and (is_loop(item) or is_loop(items[earlier])):
            key = "loop.id" if is_loop(item) else "agent_id"
            raise ValueError(f"plan[{index}].{key} {name!r} repeats plan[{earlier}]")
    for index, item in enumerate(items):
        if is_loop(item):
            _check_loop(index, item.loop, outside, valid_id, find_cycle)
    _check_round_ids(items, outside)
    for index, item in enumerate(items):
        if not is_loop(item):
            for dep in item.dependencies:
                owner = _body_owner(items, dep.id)
                if owner is not None and dep.id not in outside:
                    raise ValueError(
                        f"plan[{index}] ({item.agent_id!r}) depends on {dep.id!r}, a body "
                        f"entry of loop {owner!r}: depend on the loop id {owner!r} instead"
                    )


def _check_loop(
    index: int,
    loop: Any,
    outside: dict[str, int],
    valid_id: Callable[[str], bool],
    find_cycle: Callable[[dict[str, list[str]]], list[str] | None],
) -> None:
    where = f"plan[{index}].loop"
    if loop.id == SYNTHESIS_KEY:
        raise ValueError(f"{where}.id {SYNTHESIS_KEY!r} is reserved for the run's synthesis")
    body = loop.body_ids
    seen: dict[str, int] = {}
    for at, base in enumerate(body):
        if base in seen:
            raise ValueError(f"{where}.body[{at}].agent_id {base!r} repeats body[{seen[base]}]")
        if base in outside:
            raise ValueError(f"{where}.body[{at}].agent_id {base!r} repeats plan[{outside[base]}]")
        seen[base] = at
    for at, entry in enumerate(loop.body):
        if entry.inherit_context:
            raise ValueError(
                f"{where}.body[{at}].inherit_context: a body entry cannot inherit a "
                "conversation; each round receives the previous round's replies instead"
            )
        for dep in entry.dependencies:
            if dep.id == loop.id:
                raise ValueError(f"{where}.body[{at}] ({entry.agent_id!r}) depends on its own loop")
            if dep.id not in seen and dep.id not in outside:
                raise ValueError(
                    f"{where}.body[{at}] ({entry.agent_id!r}) depends on unknown agent_id "
                    f"{dep.id!r}"
                )
            if dep.id == entry.agent_id:
                raise ValueError(f"{where}.body[{at}] ({entry.agent_id!r}) depends on itself")
    if loop.until.node is not None and loop.until.node not in seen:
        raise ValueError(
            f"{where}.until.node: {loop.until.node!r} is not a body entry (body: {', '.join(body)})"
        )
    cycle = find_cycle(
        {e.agent_id: [d.id for d in e.dependencies if d.id in seen] for e in loop.body}
    )
    if cycle:
        raise ValueError(f"{where}.body has a dependency cycle: " + " -> ".join(cycle))
    longest = round_id(max(body, key=len), loop.max_rounds)
    if not valid_id(longest):
        raise ValueError(
            f"{where}.max_rounds: round id {longest!r} would not be a valid id "
            "(at most 64 characters): shorten the body ids"
        )


def _check_round_ids(items: Sequence[Any], outside: dict[str, int]) -> None:
    """No id of the plan is the id a round of some body entry will take."""
    for item in items:
        if not is_loop(item):
            continue
        for base in item.loop.body_ids:
            for number in range(1, item.loop.max_rounds + 1):
                taken = round_id(base, number)
                if taken in outside:
                    raise ValueError(
                        f"plan[{outside[taken]}] id {taken!r} is the id of round {number} of "
                        f"loop {item.loop.id!r}'s body entry {base!r}: give it another id"
                    )


def _body_owner(items: Iterable[Any], node: str) -> str | None:
    for item in items:
        if is_loop(item) and node in item.loop.body_ids:
            return str(item.loop.id)
    return None


def loop_dependencies(loop: Any) -> list[str]:
    """The ids outside the loop its body depends on (its edges in the plan's graph)."""
    body = set(loop.body_ids)
    return list(dict.fromkeys(d.id for e in loop.body for d in e.dependencies if d.id not in body))


def expand(items: Sequence[Any]) -> list[Any]:
    """The plan's entries with each loop replaced by its round-1 entries (in body order).

    A dependency on a loop becomes one on each of its round-1 body nodes, with the same
    condition; the executor moves it onto each later round as that round is added.
    """
    loops = {item.loop.id: item.loop for item in items if is_loop(item)}

    def outward(deps: Iterable[Any]) -> list[Any]:
        out: list[Any] = []
        for dep in deps:
            if dep.id in loops:
                out += [
                    dep.model_copy(update={"id": round_id(b, 1)}) for b in loops[dep.id].body_ids
                ]
            else:
                out.append(dep)
        return out

    entries: list[Any] = []
    for item in items:
        if not is_loop(item):
            if any(d.id in loops for d in item.dependencies):
                item = item.model_copy(update={"depends_on": outward(item.dependencies)})
            entries.append(item)
            continue
        body = set(item.loop.body_ids)
        for entry in item.loop.body:
            inner = [
                d.model_copy(update={"id": round_id(d.id, 1)})
                for d in entry.dependencies
                if d.id in body
            ]
            outer = outward(d for d in entry.dependencies if d.id not in body)
            update = {"agent_id": round_id(entry.agent_id, 1), "depends_on": [*inner, *outer]}
            entries.append(entry.model_copy(update=update))
    return entries


#: The checkpoint ``plan`` member that marks a round-1 entry as a loop's (decision 290).
CHECKPOINT_MEMBER = "loop"


def checkpoint_marks(loops: Sequence[Any]) -> dict[str, dict[str, object]]:
    """The ``loop`` member of each round-1 item of a checkpoint's ``plan``, by its id.

    It carries what the loop is beyond its entries (id, until, rounds, what reaching the
    last round means), so a resume rebuilds the loop from the checkpoint alone.
    """
    marks: dict[str, dict[str, object]] = {}
    for loop in loops:
        spec = {
            "id": loop.id,
            "until": loop.until.model_dump(exclude_none=True),
            "max_rounds": loop.max_rounds,
            "on_max_rounds": loop.on_max_rounds,
        }
        for base in loop.body_ids:
            marks[round_id(base, 1)] = spec
    return marks


def fold_checkpoint(entries: list[object]) -> list[object]:
    """A checkpoint's plan entries (``depends_on`` by id) with its loops folded back.

    The inverse of :func:`expand` over items marked by :func:`checkpoint_marks`: each run of
    marked items becomes one ``{loop: ...}`` at the place of its first, their ids lose
    ``.r1``, and a dependency on any of a loop's round-1 nodes from outside it becomes one
    on the loop (once).
    """
    owner: dict[str, str] = {}
    loops: dict[str, dict[str, object]] = {}
    for entry in entries:
        mark = entry.get(CHECKPOINT_MEMBER) if isinstance(entry, dict) else None
        if isinstance(mark, dict) and isinstance(entry, dict):
            loop_id = str(mark.get("id"))
            loop = loops.setdefault(loop_id, {**mark, "body": []})
            owner[str(entry.get("agent_id"))] = loop_id
            body = loop["body"]
            assert isinstance(body, list)
            body.append(entry)
    if not loops:
        return entries
    out: list[object] = []
    placed: set[str] = set()
    for entry in entries:
        if not isinstance(entry, dict):
            out.append(entry)
            continue
        owned = owner.get(str(entry.get("agent_id")))
        if owned is None:
            out.append(_folded_entry(entry, owner, None))
        elif owned not in placed:
            placed.add(owned)
            loop = loops[owned]
            body = loop["body"]
            assert isinstance(body, list)
            folded = [_folded_entry(e, owner, owned) for e in body]
            out.append({"loop": {**loop, "body": folded}})
    return out


def _folded_entry(entry: dict[str, object], owner: dict[str, str], loop_id: str | None) -> object:
    out = {k: v for k, v in entry.items() if k != CHECKPOINT_MEMBER}
    if loop_id is not None:
        out["agent_id"] = _base(str(entry.get("agent_id")))
    deps: list[object] = []
    seen: set[str] = set()
    given = entry.get("depends_on")
    for dep in given if isinstance(given, list) else []:
        target = dep.get("id") if isinstance(dep, dict) else None
        dep_owner = owner.get(str(target))
        if dep_owner is not None and dep_owner == loop_id and isinstance(dep, dict):
            deps.append({**dep, "id": _base(str(target))})
        elif dep_owner is not None and isinstance(dep, dict):
            if dep_owner not in seen:  # a dependency on the loop, spelled once per body node
                seen.add(dep_owner)
                deps.append({**dep, "id": dep_owner})
        else:
            deps.append(dep)
    out["depends_on"] = deps
    return out


def _base(key: str) -> str:
    split = split_round_id(key)
    return split[0] if split is not None else key
