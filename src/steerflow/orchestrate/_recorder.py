"""The completion observers that turn node outcomes into checkpoint records."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steerflow.checkpoint import CheckpointWriter, save_branch
from steerflow.errors import PersistenceError
from steerflow.executor import EventBus, FlowEvent, Graph, Operation, SharedContext
from steerflow.home import RunDir

__all__ = ["CheckpointOutcome", "CheckpointRecorder", "replay_entries", "write_private"]


#: Reconciliations a run may attempt: enough for transient errors (a full disk that was
#: cleared, an EIO on a network filesystem), few enough that a dead disk fails fast.
MAX_RECONCILES = 3


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

    def to_json(self) -> dict[str, Any]:
        """The result's ``checkpoint`` object (CONTRACT §3)."""
        return {
            "path": self.path,
            "version": self.version,
            "persisted": self.persisted,
            "error": self.error,
            "reconciled": self.reconciled,
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
        self._recovery = asyncio.Lock()

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
        )

    async def flush(self) -> None:
        """Persist replayed branches, then publish the initial snapshot/base.

        The writer was built with :func:`replay_entries`, so that first publication
        already holds every replayed outcome and every rebuilt spawn; the branches go
        first, so no published entry lacks the conversation a resume restores from it.
        """
        for op in self.graph:
            if op.replayed and op.branch:
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
        if op.branch:
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
                )
            else:
                await self._record_spawned(op, op.status, response, self.context.content)

        await self._durably(op, record)

    async def record_intent(self, children: list[Operation]) -> None:
        """Spawn observer: record accepted spawns as ``pending`` (recorded, never invoked)."""
        for child in children:
            await self._durably(child, functools.partial(self._record_spawned, child, "pending"))

    async def _durably(self, op: Operation | None, write: Callable[[], Awaitable[None]]) -> None:
        """``write``; after a write error, reconcile once and ``write`` again."""
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


def _spawn_fields(graph: Graph, op: Operation) -> dict[str, Any]:
    """The members of a spawned entry besides node id, status and response."""
    return {
        "operation": op.instruction,
        "assignee": op.assignee,
        "instruction": op.instruction,
        "parent_id": op.parent_id,
        "spawn_id": op.key,
        "context": None,
        "depends_on": [graph.ops[e.source].key for e in op.edges],
    }


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
        # A replayed emitter witnesses its children by their node ids in this run.
        witness = {"spawned_ids": list(op.spawned_ids)} if done and op.spawned_ids else {}
        if op.kind == "planned" and done:
            ops[op.key] = {
                "agent_id": op.key,
                "status": "completed",
                "response": op.response,
                **witness,
            }
        elif op.kind == "spawned" and (done or op.status == "pending"):
            entry = {"node_id": op.node_id, "status": "completed" if done else "pending"}
            entry["response"] = op.response if done else None
            spawned.append({**entry, **_spawn_fields(graph, op), **witness})
    return ops, spawned


def _save_branch(run_path: Path, op: Operation) -> None:
    """Persist a node's conversation so a resume can restore what it inherits."""
    save_branch(run_path, op.key, op.branch)


def write_private(path: Path, text: str) -> None:
    """Write a 0600 file without following a symlink at ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
