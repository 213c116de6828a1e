"""Loops at run time (issue 40 item 4): each round's nodes are added as the last one ends.

Round 1 of a loop is planned (``plan._loop.expand``). When the last node of round N
becomes terminal, the loop's ``until`` is evaluated; unless it is met, a body node failed
or round N was the last, round N+1 is added to the graph: ``X.r<N+1>`` for each body
entry ``X``, depending on its body dependencies in the same round and on every node of
round N, whose replies it receives (the reviser sees the draft and the critique). Entries
after the loop have their edges moved onto the new round. The new nodes are recorded as
``pending`` (the spawn observers) before the closing node's outcome, which carries the
decision in its ``loop`` member (covered by its digest, decision 290); so a resume sees
every round that was begun and never starts a round twice.

Round nodes are ordinary nodes: steering, pause, stop, budget and deadline apply to them
as to any other. A round added while admission is closed is withheld, and a resume runs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from steerflow.executor._graph import Edge, Graph, Operation
from steerflow.plan._loop import round_id, split_round_id
from steerflow.plan._model import LoopSpec

if TYPE_CHECKING:
    from steerflow.executor._scheduler import FlowExecutor

__all__ = ["LOOP_MEMBER", "EndReason", "LoopRunner", "LoopState", "import_until"]

#: ``Operation.extra`` key and checkpoint entry member of a round node's loop record.
LOOP_MEMBER = "loop"

EndReason = Literal["until_met", "max_rounds", "failed", "stopped"]

# What a later round's node takes from its round-1 node besides identity and outcome:
# the entry's settings (model, tools, artifacts, ...), whatever fields they are.
_NOT_COPIED = frozenset(
    {
        "key",
        "node_id",
        "kind",
        "edges",
        "parent_id",
        "status",
        "_response",
        "_read_back",
        "error",
        "_rendered",
        "branch",
        "usage",
        "artifacts",
        "artifact_records",
        "replayed",
        "extra",
        "cancelled",
        "spawn_requests",
        "spawned_ids",
        "model",
        "started_at",
        "ended_at",
        "escalated_from",
        "escalation",
        "pinned_model",
        "inherit_context",
    }
)


@dataclass
class LoopState:
    """One loop while it runs: the round it is at and, once over, why it ended."""

    spec: LoopSpec
    round: int = 1
    ended: EndReason | None = None
    #: Why a ``python`` until could not decide (the loop then ended ``failed``).
    error: str | None = None
    rounds: dict[int, list[str]] = field(default_factory=dict)

    @property
    def fails_run(self) -> bool:
        """True when the loop's end fails the run (``on_max_rounds: fail``)."""
        return self.ended == "max_rounds" and self.spec.on_max_rounds == "fail"

    def to_json(self, *, finished: bool = True) -> dict[str, Any]:
        """``{id, rounds, ended, nodes}``: ``ended`` ``stopped`` when the run ended first."""
        ended: str | None = self.ended
        if ended is None and finished:
            ended = "stopped"
        return {
            "id": self.spec.id,
            "rounds": self.round,
            "ended": ended,
            "nodes": [self.rounds[n] for n in sorted(self.rounds)],
        }


def import_until(spec: str) -> Callable[..., Any]:
    """The function a ``python:MODULE:FUNCTION`` until names (UsageError if it cannot be)."""
    from steerflow.providers.function import import_callable

    return import_callable(spec, "loop until")


class LoopRunner:
    """Adds each round of a flow's loops, and keeps what each loop did."""

    def __init__(self, graph: Graph, loops: Sequence[LoopSpec]) -> None:
        self.graph = graph
        self.states = {loop.id: LoopState(loop) for loop in loops}
        self._owner = {base: s for s in self.states.values() for base in s.spec.body_ids}
        for state in self.states.values():
            self._note_rounds(state)

    def round_of(self, op: Operation) -> tuple[LoopState, int] | None:
        """The loop and round ``op`` belongs to, or None for a node of no loop."""
        split = split_round_id(op.key)
        if split is None or split[0] not in self._owner:
            return None
        state = self._owner[split[0]]
        return (state, split[1]) if round_id(split[0], split[1]) in self.graph.by_key else None

    def restore(self, records: Mapping[str, Mapping[str, Any]]) -> None:
        """Continue a resumed run's loops: their rounds as rebuilt, ends as recorded.

        ``records``: the ``loop`` member of each recorded entry, by node key. A later
        round's rebuilt node takes its round-1 node's settings and starts from no
        conversation (it receives the previous round's replies instead).
        """
        for op in self.graph:
            found = self.round_of(op)
            if found is None:
                continue
            state, number = found
            if number > 1:
                _copy_settings(self.graph.by_key[round_id(_base(op.key), 1)], op)
                op.branch = []
            # Only a replayed outcome's decision stands: a node run again decides again.
            record = records.get(op.key) if op.replayed else None
            if record is not None:
                op.extra[LOOP_MEMBER] = dict(record)
                ended = record.get("ended")
                if ended in ("until_met", "max_rounds", "failed"):
                    state.ended = ended
        for state in self.states.values():
            self._note_rounds(state)
            # Any intent of round N recorded means round N-1 decided to go on; one a crash
            # cut short is completed now, so the first publication records the rest.
            if state.ended is None and len(state.rounds.get(state.round, ())) < len(
                state.spec.body
            ):
                self._build_round(state, state.round)
            self._move_dependents(state, 1, state.round)

    async def settle(self, op: Operation, executor: FlowExecutor) -> None:
        """``op`` became terminal: if it closed its round, decide and maybe add the next.

        Called before ``op``'s outcome is recorded (its ``loop`` member carries the
        decision) and before its future resolves (nothing waiting on it sees a round end
        before the next round's edges are in place).
        """
        found = self.round_of(op)
        if found is None:
            return
        state, number = found
        record: dict[str, Any] = {"id": state.spec.id, "round": number}
        op.extra[LOOP_MEMBER] = record
        if state.ended is not None or number != state.round:
            return
        nodes = [self.graph.by_key[round_id(b, number)] for b in state.spec.body_ids]
        if op.status == "failed" or any(n.status == "failed" for n in nodes):
            state.ended = record["ended"] = "failed"
            return
        if not all(n.terminal for n in nodes):
            return
        reason = self._decide(state, number, nodes)
        if reason is not None:
            state.ended = record["ended"] = reason
            if state.error is not None and op.status == "completed":
                # The round could not be judged: its closing node fails, so nothing that
                # needs the loop's result runs on an undecided one (decision 291).
                op.status, op.error = "failed", f"loop {state.spec.id!r} until: {state.error}"
            return
        record["next"] = number + 1
        await self._add_round(state, number + 1, op, executor)

    def _decide(self, state: LoopState, number: int, nodes: list[Operation]) -> EndReason | None:
        """Why the loop ends after round ``number`` (None: it goes on)."""
        until = state.spec.until
        if until.python is not None:
            replies = {
                base: n.response
                for base, n in zip(state.spec.body_ids, nodes, strict=True)
                if n.status == "completed"
            }
            try:
                met = import_until(until.python)(replies)
            except Exception as exc:  # user code: its failure ends the loop, not the run
                state.error = f"{until.python}: {type(exc).__name__}: {exc}"[:500]
                return "failed"
            if not isinstance(met, bool):
                state.error = f"{until.python} returned {type(met).__name__}, not a bool"
                return "failed"
        else:
            target = self.graph.by_key[round_id(str(until.node), number)]
            met = target.status == "completed" and str(until.contains) in str(target.response)
        if met:
            return "until_met"
        if number >= state.spec.max_rounds:
            return "max_rounds"
        return None

    async def _add_round(
        self, state: LoopState, number: int, closing: Operation, executor: FlowExecutor
    ) -> None:
        fresh = self._build_round(state, number)
        self._move_dependents(state, number - 1, number)
        for op in fresh:
            executor.emit_spawned(op, closing, loop=state.spec.id, round=number)
        if fresh:
            for observer in executor.spawn_observers:
                await observer(fresh)
            for op in fresh:
                executor.launch(op)

    def _build_round(self, state: LoopState, number: int) -> list[Operation]:
        """Add round ``number``'s nodes not in the graph yet; the ones added."""
        body = state.spec.body_ids
        previous = [self.graph.by_key[round_id(b, number - 1)].node_id for b in body]
        fresh: list[Operation] = []
        for entry in _in_dependency_order(state.spec):
            key = round_id(entry.agent_id, number)
            if key in self.graph.by_key:  # a resume rebuilt it: recorded intent already
                continue
            inner = [
                Edge(self.graph.by_key[round_id(d.id, number)].node_id, d.when, d.if_contains)
                for d in entry.dependencies
                if d.id in body
            ]
            op = Operation(
                key=key,
                instruction=entry.instruction,
                kind="spawned",
                edges=[*inner, *(Edge(source) for source in previous)],
            )
            _copy_settings(self.graph.by_key[round_id(entry.agent_id, 1)], op)
            self.graph.add(op)
            fresh.append(op)
        self._note_rounds(state)
        return fresh

    def _move_dependents(self, state: LoopState, old: int, new: int) -> None:
        """Edges of nodes outside the loop on round ``old``'s nodes move to round ``new``'s."""
        if old == new:
            return
        moves = {
            self.graph.by_key[round_id(b, old)].node_id: self.graph.by_key[round_id(b, new)]
            for b in state.spec.body_ids
            if round_id(b, old) in self.graph.by_key and round_id(b, new) in self.graph.by_key
        }
        for op in self.graph:
            # Only the plan's entries depend on the loop; a node a round node spawned
            # (or retried) waits on that very node.
            if op.kind != "planned" or self.round_of(op) is not None:
                continue
            if any(e.source in moves for e in op.edges):
                op.edges = [
                    Edge(moves[e.source].node_id, e.when, e.if_contains) if e.source in moves else e
                    for e in op.edges
                ]

    def _note_rounds(self, state: LoopState) -> None:
        rounds: dict[int, list[str]] = {}
        for key in self.graph.by_key:
            split = split_round_id(key)
            if split is not None and self._owner.get(split[0]) is state:
                rounds.setdefault(split[1], []).append(key)
        body = state.spec.body_ids
        state.rounds = {
            n: sorted(keys, key=lambda k: body.index(_base(k))) for n, keys in rounds.items()
        }
        state.round = max(rounds, default=1)

    def failed_loops(self) -> list[str]:
        """Ids of loops whose end fails the run."""
        return [s.spec.id for s in self.states.values() if s.fails_run]

    def to_json(self, *, finished: bool = True) -> list[dict[str, Any]]:
        """Each loop's ``{id, rounds, ended, nodes}``, in plan order."""
        return [state.to_json(finished=finished) for state in self.states.values()]


def _base(key: str) -> str:
    split = split_round_id(key)
    return split[0] if split is not None else key


def _in_dependency_order(spec: LoopSpec) -> list[Any]:
    """The body entries, each after the body entries it depends on (the body is acyclic)."""
    body = set(spec.body_ids)
    placed: list[Any] = []
    seen: set[str] = set()
    todo = list(spec.body)
    while todo:
        ready = [e for e in todo if all(d.id in seen or d.id not in body for d in e.dependencies)]
        for entry in ready:
            placed.append(entry)
            seen.add(entry.agent_id)
        todo = [e for e in todo if e.agent_id not in seen]
    return placed


def _copy_settings(template: Operation, op: Operation) -> None:
    for spec in dataclasses.fields(Operation):
        if spec.name not in _NOT_COPIED:
            setattr(op, spec.name, getattr(template, spec.name))
