"""The completion observers that turn node outcomes into checkpoint records."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from steerflow.artifacts import DECLARED_MEMBER
from steerflow.checkpoint import CheckpointWriter, save_branch
from steerflow.errors import PersistenceError
from steerflow.executor import (
    LOOP_MEMBER,
    CallIntent,
    EventBus,
    FlowEvent,
    Graph,
    Operation,
    SharedContext,
)
from steerflow.home import RunDir
from steerflow.resume._from import EDITED_MEMBER

__all__ = ["CheckpointOutcome", "CheckpointRecorder", "replay_entries", "write_private"]


#: Reconciliations a run may attempt: enough for transient errors (a full disk that was
#: cleared, an EIO on a network filesystem), few enough that a dead disk fails fast.
MAX_RECONCILES = 3


class RecordFence(Protocol):
    """Whether an outcome may still be recorded as the run's (``LeaseKeeper`` is one)."""

    def fresh(self) -> bool:
        """True while the lease is known held without asking the database."""
        ...

    async def may_record(self) -> bool:
        """Whether to record, confirmed by the database once the local deadline passed."""
        ...


@dataclass(frozen=True)
class CheckpointOutcome:
    """How a run's checkpoint ended; :meth:`CheckpointRecorder.close` is its only author.

    ``error`` is the first failure that could not be recovered from; ``recovered`` the
    distinct failures a reconcile recovered from (warnings, not losses: decision 27).
    """

    path: str
    version: int
    persisted: bool = False
    error: str | None = None
    reconciled: int = 0
    recovered: tuple[str, ...] = field(default=())
    #: Every byte the run wrote to its checkpoint files (bases, snapshots, journal).
    bytes_written: int = 0

    def to_json(self) -> dict[str, Any]:
        """The result's ``checkpoint`` object (CONTRACT §3)."""
        return {
            "path": self.path,
            "version": self.version,
            "persisted": self.persisted,
            "error": self.error,
            "reconciled": self.reconciled,
            "bytes_written": self.bytes_written,
        }


class CheckpointRecorder:
    """Records outcomes and spawn intent; failures are reported, never raised into the run.

    After a write error the writer refuses records until it reconciles (Amendment 2 §3);
    the recorder reconciles (the durable prefix is reloaded and republished) and records
    the same outcome again, so one transient error does not leave every later outcome
    unpersisted (decision 27).  :meth:`close` sums it up as a :class:`CheckpointOutcome`.
    """

    def __init__(
        self,
        writer: CheckpointWriter,
        graph: Graph,
        run_dir: RunDir,
        context: SharedContext,
        events: EventBus,
    ) -> None:
        self.writer = writer
        self.graph = graph
        self.run_dir = run_dir
        self.context = context
        self.events = events
        self._error: str | None = None  # the first failure no reconcile recovered from
        self.recovered: list[str] = []  # distinct errors a retry recovered from
        self.reconciles = 0  # reconcile() calls made
        # Set once an outcome could not be made durable: the run can no longer end
        # persisted, so ``on_lost`` closes admission rather than pay for more work (decision 35).
        self.lost = False
        self.on_lost: Callable[[], None] | None = None
        # The run's lease (decision 121): a process whose run was taken over records
        # nothing more as the run's. ``withheld`` counts what it did not record.
        self.fence: RecordFence | None = None
        self.withheld = 0
        self._recovery = asyncio.Lock()
        # Branch files are written only for nodes a resume can restore a conversation
        # from (decision 64): node ids some node starts from, outcomes already decided
        # on, and branches whose save has begun (so no branch is written twice at once).
        self._sources: set[str] = set()
        self._decided: set[str] = set()
        self._saving: set[str] = set()
        for op in graph:
            self._note_sources(op)

    async def close(self) -> CheckpointOutcome:
        """Close the writer; what the checkpoint holds and what went wrong on the way."""
        writer = self.writer
        try:
            await writer.close()
        except PersistenceError as exc:
            self._error = self._error or str(exc)
        # ``writer.persisted`` remembers every failure; one the recorder recovered from
        # by reconciling is a warning, not a loss (decision 27).
        healthy = writer.persisted or (bool(self.recovered) and not writer.stopped)
        error = self._error if self._error is not None or healthy else writer.error
        return CheckpointOutcome(
            path=str(writer.path),
            version=writer.version,
            persisted=healthy and self._error is None,
            error=error,
            reconciled=self.reconciles,
            recovered=tuple(self.recovered),
            bytes_written=writer.bytes_written,
        )

    async def flush(self) -> None:
        """Persist replayed branches, then publish the initial snapshot/base.

        The writer was built with :func:`replay_entries`, so that first publication
        already holds every replayed outcome and every rebuilt spawn; the branches go
        first, so no published entry lacks the conversation a resume restores from it.
        """
        for op in self.graph:
            if op.replayed:
                self._decided.add(op.node_id)
                if self._claim_branch(op):
                    try:
                        await asyncio.to_thread(_save_branch, self.run_dir.path, op)
                    except OSError as exc:
                        self._failed(op, exc)
        await self._durably(None, self.writer.flush)

    async def record_outcome(self, op: Operation) -> None:
        """Completion observer: persist the branch, then the node's outcome."""
        if op.status not in ("completed", "failed") or op.replayed:
            return  # a replayed outcome is in the initial publication already
        response = op.response if op.status == "completed" else {"error": op.error}
        self._decided.add(op.node_id)
        if self._claim_branch(op):
            try:
                await asyncio.to_thread(_save_branch, self.run_dir.path, op)
            except OSError as exc:
                self._failed(op, exc)
                return

        async def record() -> None:
            # The context is read at each attempt: a retry restates the current one.
            if op.kind == "planned":
                await self.writer.record(
                    op.key,
                    status=op.status,
                    response=response,
                    flow_context=self.context.content,
                    spawned_ids=op.spawned_ids or None,
                    artifacts=_artifacts(op) or None,
                    **_usage_member(op),
                    **_edited_member(op),
                    **_loop_member(op),
                    **_output_member(op),
                )
            else:
                await self._record_spawned(op, op.status, response, self.context.content)

        await self._durably(op, record)

    async def record_call(self, op: Operation, intent: CallIntent) -> bool:
        """The executor's ``before_call``: make the call's intent durable (decision 217).

        True once acknowledged (the call may leave); False when the run may no longer
        record (a lease taken over) or the checkpoint cannot hold it (the call is not
        sent; the loss closed admission). A version 2 checkpoint records no intents.
        """
        return await self._journal(
            op,
            lambda: self.writer.record_call(
                intent.call_id,
                node=intent.node,
                record=intent.record,
                key=intent.key,
                attempt=intent.attempt,
                model=intent.model,
                started_at=intent.started_at,
                reserved_cost_usd=intent.reserved_cost_usd,
                reserved_tokens=intent.reserved_tokens,
            ),
        )

    async def record_step(self, op: Operation, entry: dict[str, Any]) -> bool:
        """The executor's ``on_step``: journal one step of a tool node's loop (decision 254).

        True once acknowledged; False when nothing more can be recorded (a lease taken
        over, a lost checkpoint): the loop then stops before its next step. A version 2
        checkpoint records no steps (a tool node there is not durable step by step).
        """
        return await self._journal(op, lambda: self.writer.record_step(entry))

    async def _journal(self, op: Operation, write: Callable[[], Awaitable[bool]]) -> bool:
        """A journal record (version 3 and later) the caller waits on: True once acknowledged."""
        if self.writer.version < 3:
            return True
        if self.lost:
            return False
        acknowledged = False

        async def durable() -> None:
            nonlocal acknowledged
            acknowledged = await write()

        await self._durably(op, durable)
        return acknowledged

    async def record_intent(self, children: list[Operation]) -> None:
        """Spawn observer: record accepted spawns as ``pending`` (recorded, never invoked).

        A child a resume would rebuild starts from the branch of a node that may already
        be recorded without one (a ``depends_on`` other than its emitter): that branch is
        saved now, before the intent that makes it needed is published.
        """
        for child in children:
            self._note_sources(child)
            for source in _sources_of(child):
                op = self.graph.ops.get(source)
                if op is not None and op.node_id in self._decided and self._claim_branch(op):
                    try:
                        await asyncio.to_thread(_save_branch, self.run_dir.path, op)
                    except OSError as exc:
                        self._failed(op, exc)
            await self._durably(child, functools.partial(self._record_spawned, child, "pending"))

    def _note_sources(self, op: Operation) -> None:
        self._sources.update(_sources_of(op))

    def _claim_branch(self, op: Operation) -> bool:
        """True if ``op``'s branch must be saved and no save of it has begun yet.

        Only a completed node's branch is ever restored (``resume.plan_replay`` loads
        replayed nodes only), and only one some node starts from: an ``inherit_context``
        entry's first dependency, a spawned node's emitter or first dependency.
        """
        needed = op.node_id in self._sources or bool(op.spawned_ids)
        if not needed or op.status != "completed" or not op.branch:
            return False
        if op.node_id in self._saving:
            return False
        self._saving.add(op.node_id)
        return True

    async def _durably(self, op: Operation | None, write: Callable[[], Awaitable[None]]) -> None:
        """``write``; after a write error, reconcile once and ``write`` again.

        Nothing is written once the fence says the run is no longer this process's.
        """
        fence = self.fence
        if fence is not None and not fence.fresh() and not await fence.may_record():
            self.withheld += 1
            return
        try:
            await write()
            return
        except PersistenceError as exc:
            first = exc
        try:
            # Observers that failed in one batch all land here; the first reconciles,
            # the others then find the writer healthy. Version 2 never stops: its
            # retry rewrites the whole file.
            async with self._recovery:
                if self.writer.stopped:
                    if self.reconciles >= MAX_RECONCILES:
                        self._failed(op, first)
                        return
                    self.reconciles += 1
                    await self.writer.reconcile()
            await write()
        except PersistenceError as exc:
            same = str(exc) == str(first)
            self._failed(op, first if same else PersistenceError(f"{first} (then: {exc})"))
            return
        if str(first) not in self.recovered:
            self.recovered.append(str(first))
        self.events.emit(
            FlowEvent(
                type="checkpoint_reconciled",
                node_key=op.key if op else None,
                data={"error": str(first)},
            )
        )

    async def _record_spawned(
        self,
        op: Operation,
        status: str,
        response: object = None,
        flow_context: dict[str, Any] | None = None,
    ) -> None:
        await self.writer.record_spawned(
            op.node_id,
            status=status,
            response=response,
            flow_context=flow_context,
            spawned_ids=(op.spawned_ids or None) if status != "pending" else None,
            **_spawn_fields(self.graph, op),
            **_artifacts_member(op),
            **(_usage_member(op) if status != "pending" else {}),
            **(_loop_member(op) if status != "pending" else {}),
            **(_output_member(op) if status != "pending" else {}),
        )

    def _failed(self, op: Operation | None, exc: Exception) -> None:
        self._error = self._error or str(exc)
        self.events.emit(
            FlowEvent(
                type="checkpoint_failed",
                node_key=op.key if op else None,
                data={"error": str(exc)},
            )
        )
        if not self.lost:
            self.lost = True
            if self.on_lost is not None:
                self.on_lost()


def _sources_of(op: Operation) -> list[str]:
    """Node ids whose conversation ``op`` starts from when it runs (on a resume, too).

    Mirrors ``FlowExecutor._history`` and ``orchestrate.apply_replay`` (a spawned node
    clones its emitter's branch) and ``resume``'s degraded-context check (which looks at
    a spawned node's first dependency).
    """
    sources = [op.parent_id] if op.parent_id is not None else []
    if op.edges and (op.inherit_context or op.kind == "spawned"):
        sources.append(op.edges[0].source)
    return sources


def _spawn_fields(graph: Graph, op: Operation) -> dict[str, Any]:
    """The members of a spawned entry besides node id, status and response."""
    fields: dict[str, Any] = {
        "operation": op.instruction,
        "assignee": op.assignee,
        "instruction": op.instruction,
        "parent_id": op.parent_id,
        "spawn_id": op.key,
        "context": None,
        "depends_on": [graph.ops[e.source].key for e in op.edges],
    }
    if op.escalated_from is not None:
        # The splice witness and the attempt's model, in every state of the entry
        # (pending, completed, failed; recorded, replaced, replayed): Amendment 3 item 4.
        fields["escalated_from"] = op.escalated_from
        fields["model"] = op.pinned_model
        # The attempt number: with it the digest covers what the retry is (decision 111).
        fields["escalation"] = op.escalation
    if op.declared_artifacts:
        # The config's contract copy predates every spawn: the entry carries the leg's
        # declaration, so the checkpoint unit still describes its whole contract.
        fields[DECLARED_MEMBER] = list(op.declared_artifacts)
    return fields


def _artifacts(op: Operation) -> list[dict[str, Any]]:
    """The entry's ``artifacts`` member: what the live check found, sorted by path."""
    if op.status != "completed":
        return []
    return [record.to_json() for record in sorted(op.artifact_records, key=lambda r: r.path)]


def _artifacts_member(op: Operation) -> dict[str, Any]:
    found = _artifacts(op)
    return {"artifacts": found} if found else {}


#: ``Operation.extra`` key of a replayed entry's recorded ``usage`` (kept, not re-spent).
RECORDED_USAGE = "recorded_usage"


def _usage_member(op: Operation) -> dict[str, Any]:
    """The entry's ``usage`` (covered by its digest): what the call cost, when reported."""
    return {"usage": op.usage.to_json()} if op.usage is not None else {}


def _edited_member(op: Operation) -> dict[str, Any]:
    """The entry's ``instruction_edited`` (covered by its digest): a ``--from`` fork's edit."""
    edited = op.extra.get(EDITED_MEMBER)
    return {EDITED_MEMBER: edited} if edited else {}


def _loop_member(op: Operation) -> dict[str, Any]:
    """The entry's ``loop`` (covered by its digest): a loop round's record (decision 290)."""
    record = op.extra.get(LOOP_MEMBER)
    return {LOOP_MEMBER: dict(record)} if isinstance(record, dict) else {}


def _output_member(op: Operation) -> dict[str, Any]:
    """The entry's ``output`` (covered by its digest): a typed node's validated value.

    Present exactly when the node has an ``output_schema`` and completed (a JSON ``null``
    output included); a resume's replayed entry keeps the member it was recorded with.
    """
    if op.status != "completed":
        return {}
    if op.replayed:
        return {"output": op.output} if RECORDED_OUTPUT in op.extra else {}
    return {"output": op.output} if op.output_schema is not None else {}


#: ``Operation.extra`` flag of a replayed node whose entry carried an ``output``.
RECORDED_OUTPUT = "recorded_output"


def replay_entries(graph: Graph) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """A resumed graph's initial checkpoint entries: ``(ops, spawned)`` for the writer.

    Every replayed outcome, and every rebuilt spawn that still has to run (as
    ``pending`` intent), shaped as :meth:`CheckpointRecorder.record_outcome` and
    :meth:`~CheckpointRecorder.record_intent` would record them, so the resumed run's
    first publication holds all of them at once (decision 43).
    """
    ops: dict[str, dict[str, Any]] = {}
    spawned: list[dict[str, Any]] = []
    for op in graph:
        done = op.replayed and op.status == "completed"
        # A failed attempt an escalation retry replaced is replayed as it was recorded:
        # the retry's splice needs its anchor's entry in every later checkpoint.
        replaced = op.replayed and op.status == "failed"
        # A replayed emitter witnesses its children by their node ids in this run.
        witness = {"spawned_ids": list(op.spawned_ids)} if done and op.spawned_ids else {}
        if done:
            witness |= _artifacts_member(op)
        if (done or replaced) and RECORDED_USAGE in op.extra:
            witness["usage"] = op.extra[RECORDED_USAGE]
        if done or replaced:
            witness |= _loop_member(op)
        if done:
            witness |= _output_member(op)
        if op.kind == "planned" and (done or replaced):
            ops[op.key] = {
                "agent_id": op.key,
                "status": op.status,
                "response": op.response,
                **witness,
                **_edited_member(op),
            }
        elif op.kind == "spawned" and (done or replaced or op.status == "pending"):
            entry = {"node_id": op.node_id, "status": op.status}
            entry["response"] = op.response if done or replaced else None
            spawned.append({**entry, **_spawn_fields(graph, op), **witness})
    return ops, spawned


def _save_branch(run_path: Path, op: Operation) -> None:
    """Persist a node's conversation so a resume can restore what it inherits."""
    save_branch(run_path, op.key, list(op.branch))


def write_private(path: Path, text: str) -> None:
    """Write a 0600 file without following a symlink at ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
