"""``CheckpointWriter``: admission on the event loop, persistence on a worker thread.

Order
    A call to :meth:`CheckpointWriter.record` or :meth:`~CheckpointWriter.record_spawned`
    is *admitted* synchronously, before its first ``await``: the entry is normalized, the
    context is captured, and the item joins one FIFO queue.  That queue position is the
    single total order of both methods.

Persistence
    One drain task holds the writer lock while items are queued.  Each turn it takes
    *every* queued item and hands the batch to the format backend on a worker thread,
    so one fsync covers every record admitted during the previous one (group commit);
    the next turn starts as soon as a batch is durable.  Callers wait on their own
    ticket, never on the lock, so waking them costs the disk nothing.

Acknowledgement
    ``await record(...)`` returns once the batch holding its item is durable: for
    version 2 the new snapshot is renamed into place and the directory synced; for
    version 3 the journal line is written and fsync'd and the files are still reachable.

Cancellation
    A cancelled caller stops waiting, but its admitted item keeps its place and is
    persisted like any other.  The drain holds the lock until its worker thread has
    finished, even when cancelled itself, so ownership is never released while I/O is
    still mutating the checkpoint (:meth:`close` and :meth:`reconcile` take the lock).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from steerflow import _faults
from steerflow.errors import PersistenceError

from . import _capture
from ._digest import JSON, normalize
from ._intents import IntentError, check_intent
from ._seed import seed_entries
from ._state import Item, Kind, State, Ticket
from ._steps import StepError, StepLog, check_step
from ._v2 import V2Backend
from ._v3 import V3Backend
from ._v4 import V4Backend

__all__ = ["CheckpointWriter", "SavedHook"]

SavedHook = Callable[[str, str], None]
"""``on_saved(kind, key)``: kind is ``"flush"``, ``"op"`` or ``"spawn"``; key the node id."""

_PLANNED_STATUSES = frozenset({"completed", "failed"})
_SPAWNED_STATUSES = frozenset({"completed", "failed", "pending"})


class _Backend(Protocol):
    version: int
    bytes_written: int

    def persist(self, batch: list[Ticket]) -> None: ...

    def close(self) -> None: ...


class CheckpointWriter:
    """Writes one run's checkpoint (version 2 snapshot, or version 3 base + journal).

    Args:
        path: the ``checkpoint.json`` path inside the run directory.
        session_id: the flow session id.
        prompt: the flow prompt.
        plan: the plan, as stored in the checkpoint (``dep_indices`` form).
        config: execution settings replayed on resume.
        max_spawn: spawn budget; omitted from the file when None.
        flow_context: the initial shared context.
        version: 2 (default), 3 or 4 (segments under a manifest, decision 340).
        max_records: v3 compaction threshold in journal records.
        max_bytes: v3 compaction threshold in encoded journal bytes.
        on_saved: optional hook called on the event loop after each acknowledgement.
        ops: initial planned entries by agent id (``status``, ``response``, ...), and
        spawned: initial spawned entries (``node_id``, ``status``, ``response``, the
            fields of :meth:`record_spawned`): what a resumed run replays.  They are
            checked and sealed like recorded entries and are part of the very first
            snapshot or base, never journaled (see :mod:`._seed`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        session_id: str,
        prompt: str,
        plan: Sequence[object],
        config: Mapping[str, object],
        max_spawn: int | None = None,
        flow_context: Mapping[str, object] | None = None,
        version: int = 2,
        max_records: int = 128,
        max_bytes: int = 8_388_608,
        on_saved: SavedHook | None = None,
        ops: Mapping[str, Mapping[str, object]] | None = None,
        spawned: Sequence[Mapping[str, object]] | None = None,
        steps: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        if version not in (2, 3, 4) or isinstance(version, bool):
            raise ValueError(f"unsupported checkpoint version: {version!r}")
        for name, limit in (("max_records", max_records), ("max_bytes", max_bytes)):
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ValueError(f"{name} must be a positive integer, got {limit!r}")
        self.path = Path(path)
        self.version = version
        self.persisted = True
        self.error: str | None = None
        self.records_acknowledged = 0
        #: Records admitted so far (synchronously, in call order), acknowledged or not.
        self.records_admitted = 0
        self.on_saved = on_saved
        meta: dict[str, JSON] = {
            "session_id": session_id,
            "prompt": prompt,
            "plan": normalize(list(plan)),
            "config": normalize(dict(config)),
            "max_spawn": max_spawn,
        }
        try:
            self._ctx: _capture.Frozen = _capture.freeze(dict(flow_context or {}))
        except ValueError as exc:
            raise PersistenceError(f"the initial flow context cannot be stored: {exc}") from exc
        initial_ops, initial_spawned = seed_entries(ops, spawned)
        state = State(
            meta=meta,
            context=self._ctx,
            to_json=_capture.to_jsonable,
            ops=initial_ops,
            spawned=initial_spawned,
            spawn_index={str(e["node_id"]): i for i, e in enumerate(initial_spawned)},
            steps=_seed_steps(steps),
        )
        self._backend: _Backend
        if version == 2:
            self._backend = V2Backend(os.fspath(self.path), state)
        elif version == 4:
            self._backend = V4Backend(
                os.fspath(self.path), state, max_records=max_records, max_bytes=max_bytes
            )
        else:
            self._backend = V3Backend(
                os.fspath(self.path), state, max_records=max_records, max_bytes=max_bytes
            )
        self._queue: list[Ticket] = []
        self._lock = asyncio.Lock()
        self._drainer: asyncio.Task[None] | None = None
        self._closed = False

    # -- public API --------------------------------------------------------------

    async def flush(self) -> None:
        """Publish the initial snapshot/base if needed and persist everything admitted."""
        self._check_open()
        ticket = Ticket(None)
        self._queue.append(ticket)
        await self._settle(ticket, "flush", "")

    async def record(
        self,
        agent_id: str,
        *,
        status: str,
        response: object,
        flow_context: Mapping[str, object] | None = None,
        spawned_ids: Sequence[str] | None = None,
        artifacts: Sequence[Mapping[str, object]] | None = None,
        **extra: object,
    ) -> None:
        """Record a planned node's outcome; returns once it is acknowledged.

        ``spawned_ids`` lists the node ids of the spawns this operation had accepted;
        the entry then carries them (covered by its ``result_digest``) so a resume can
        tell that a child's entry is missing.  None or empty: no such member.
        ``artifacts`` (``[{"path", "bytes", "digest"}]``, sorted by path) likewise
        becomes the covered ``artifacts`` member; :meth:`record_spawned` takes it as
        an extra field.  Extra keyword fields (an agent turn's ``turn``, ``controls``,
        ``instruction``, ...) are kept in the entry verbatim after normalization.
        """
        if status not in _PLANNED_STATUSES:
            raise ValueError(f"planned status must be completed or failed, got {status!r}")
        if "result_digest" in extra:
            raise ValueError("reserved entry fields passed as extras: ['result_digest']")
        raw: dict[str, object] = {
            "agent_id": agent_id,
            "status": status,
            "response": response,
            **extra,
        }
        _add_spawned_ids(raw, spawned_ids)
        if artifacts:
            raw["artifacts"] = list(artifacts)
        ticket = self._admit("op", agent_id, raw, flow_context)
        await self._settle(ticket, "op", agent_id)

    async def record_spawned(
        self,
        node_id: str,
        *,
        status: str,
        response: object,
        flow_context: Mapping[str, object] | None = None,
        operation: str | None = None,
        assignee: str | None = None,
        instruction: str | None = None,
        parent_id: str | None = None,
        spawn_id: str | None = None,
        context: object = None,
        spawned_ids: Sequence[str] | None = None,
        **extra: object,
    ) -> None:
        """Record (or replace, by ``node_id``) a spawned node; returns once acknowledged.

        Extra keyword fields (``emitter_workload``, ``escalated_from``, ...) are kept
        in the entry verbatim after normalization.  ``spawned_ids`` is as for
        :meth:`record` (a pending entry never ran, so it has none).
        """
        if status not in _SPAWNED_STATUSES:
            raise ValueError(f"spawned status must be completed, failed or pending: {status!r}")
        if status == "pending" and response is not None:
            raise ValueError("a pending spawned entry must have response=None")
        if status == "pending" and spawned_ids:
            raise ValueError("a pending spawned entry cannot list spawned_ids")
        clash = sorted(set(extra) & {"result_digest", "node_id"})
        if clash:
            raise ValueError(f"reserved entry fields passed as extras: {clash!r}")
        raw: dict[str, object] = {
            "node_id": node_id,
            "status": status,
            "response": response,
            "operation": operation,
            "assignee": assignee,
            "instruction": instruction,
            "parent_id": parent_id,
            "spawn_id": spawn_id,
            "context": context,
            **extra,
        }
        _add_spawned_ids(raw, spawned_ids)
        ticket = self._admit("spawn", node_id, raw, flow_context)
        await self._settle(ticket, "spawn", node_id)

    async def record_call(
        self,
        call_id: str,
        *,
        node: str,
        record: str,
        key: str,
        attempt: int,
        model: str | None,
        started_at: float,
        reserved_cost_usd: float | None = None,
        reserved_tokens: int | None = None,
    ) -> bool:
        """Record a call's write-ahead intent; returns once it is acknowledged.

        Called before the call leaves the process (decision 217): the outcome later
        recorded under ``record`` (``"op"`` or ``"spawn"``) and ``key`` (its agent id
        or node id) closes it, and a resume counts an intent left open as a call that
        may have been paid.  ``call_id`` is 32 lowercase hex characters.

        Returns False, writing nothing, for version 2: a snapshot rewrite per call
        would cost more than the call, and version 2 is the library's legacy default.
        """
        self._check_open()
        entry: dict[str, Any] = {
            "call_id": call_id,
            "type": "call",
            "node": node,
            "record": record,
            "key": key,
            "attempt": attempt,
            "model": model,
            "started_at": started_at,
            "reserved_cost_usd": reserved_cost_usd,
            "reserved_tokens": reserved_tokens,
        }
        try:
            check_intent(entry, sealed=False)  # the writer seals it (adds its digest)
        except IntentError as exc:
            raise ValueError(f"cannot record the intent of {node!r}: {exc}") from None
        if self.version == 2:
            return False
        ticket = Ticket(Item("intent", call_id, entry, None, self._ctx))
        self._queue.append(ticket)
        await self._settle(ticket, "intent", call_id)
        return True

    async def record_step(self, entry: dict[str, Any]) -> bool:
        """Record one step of a tool node's loop; returns once it is acknowledged.

        ``entry`` holds exactly :data:`~._steps.STEP_MEMBERS` (the writer adds its
        digest). A model reply is recorded as soon as it returned, a tool call before
        it starts (``in_flight``) and again when it ended (decision 254). Returns False,
        writing nothing, for version 2, which has no journal to hold steps.
        """
        self._check_open()
        entry = dict(entry)
        try:
            check_step(entry, sealed=False)
        except StepError as exc:
            raise ValueError(f"cannot record a step of {entry.get('node')!r}: {exc}") from None
        if self.version == 2:
            return False
        key = f"{entry['record']}:{entry['key']}:{entry['index']}"
        ticket = Ticket(Item("step", key, entry, None, self._ctx))
        self._queue.append(ticket)
        await self._settle(ticket, "step", key)
        return True

    @property
    def bytes_written(self) -> int:
        """Total bytes this writer wrote to checkpoint files (snapshots, bases, journal).

        Counts every write that reached a file, including a base or snapshot whose
        publication later failed; read it on the event loop between records.
        """
        return self._backend.bytes_written

    @property
    def stopped(self) -> bool:
        """True while the writer refuses records until :meth:`reconcile` (version 3)."""
        return getattr(self._backend, "broken", None) is not None

    @property
    def reads_back(self) -> bool:
        """True when :meth:`read_response` can serve what was recorded (version 4, healthy)."""
        return isinstance(self._backend, V4Backend) and self.persisted and not self.stopped

    def read_response(self, kind: str, key: str) -> object:
        """The response last recorded for ``key`` (``kind`` ``"op"`` or ``"spawn"``).

        Read back from the checkpoint's files, also once the writer is closed (decision
        393); from any thread.

        Raises:
            PersistenceError: Not a version 4 writer, nothing recorded for it, or its
                file cannot be read back as written.
        """
        if not isinstance(self._backend, V4Backend):
            raise PersistenceError(f"a version {self.version} checkpoint keeps no read-back")
        return self._backend.read_entry(kind, key).get("response")

    async def reconcile(self) -> None:
        """Resume writing after a failure (version 3): adopt the durable prefix on disk.

        Reloads what is durably recorded, publishes it as a new generation and clears
        the stop.  ``persisted`` and ``error`` keep describing the earlier failure.
        Version 2 never stops, so this is a no-op there.

        Raises:
            PersistenceError: the checkpoint could not be reloaded or republished.
        """
        self._check_open()
        reconcile = getattr(self._backend, "reconcile", None)
        if reconcile is None:
            return
        async with self._lock:
            await self._run(reconcile)

    async def close(self) -> None:
        """Persist anything still queued, then release files and the writer lock."""
        if self._closed:
            return
        try:
            if self._queue:
                ticket = Ticket(None)
                self._queue.append(ticket)
                await self._settle(ticket, "flush", "")
        finally:
            self._closed = True
            async with self._lock:
                await self._run(self._backend.close)

    # -- internals ---------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise PersistenceError(f"checkpoint writer for {os.fspath(self.path)!r} is closed")

    def _admit(
        self,
        kind: Kind,
        key: str,
        raw: dict[str, object],
        flow_context: Mapping[str, object] | None,
    ) -> Ticket:
        """Synchronous admission: no await between reading live values and queuing."""
        self._check_open()
        if flow_context is not None and not isinstance(flow_context, Mapping):
            raise TypeError(f"flow_context must be a mapping or None, got {type(flow_context)}")
        try:
            entry = normalize(raw)  # a private copy; its digest is added off the loop
            context, ops = _capture.capture(self._ctx, flow_context)
            patch = ops if ops and self.version >= 3 else None
        except ValueError as exc:
            self._fail(f"cannot record {key!r}: {exc}")
            raise PersistenceError(f"cannot record {key!r}: {exc}") from exc
        self._ctx = context
        ticket = Ticket(Item(kind, key, entry, patch, context))
        self._queue.append(ticket)
        self.records_admitted += 1
        return ticket

    async def _settle(self, ticket: Ticket, kind: str, key: str) -> None:
        if not ticket.done:
            ticket.waiter = asyncio.get_running_loop().create_future()
            self._kick()
            # A cancelled caller cancels only its own waiter: its admitted item stays in
            # the order and the drain (which owns the lock) still persists it.
            await ticket.waiter
        if ticket.error is None and not ticket.done:
            raise PersistenceError(f"checkpoint write for {key or 'flush'!r} was interrupted")
        if ticket.error is not None:
            raise ticket.error
        if kind == "intent":
            # Its own seams: a crash test kills the process with the intent durable
            # and the call not yet sent, apart from the outcome records' ``ack``.
            _faults.seam("intent-ack", "after")
            return
        if kind == "step":
            return  # a step's seams are the loop's (tools._loop), around each step
        _faults.seam("ack", "before")
        if kind != "flush":
            self.records_acknowledged += 1
        if self.on_saved is not None:
            self.on_saved(kind, key)
        _faults.seam("ack", "after")

    def _kick(self) -> None:
        """Make sure a drain is running; it persists everything queued, batch by batch."""
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        """Persist queued items until none are left, one batch per worker-thread call.

        One task owns the writer lock for as long as items keep arriving, so the next
        batch (everything admitted during the previous write + fsync) starts as soon as
        the previous one is durable, instead of after a chain of lock hand-offs through
        callers whose items that batch already covered.
        """
        async with self._lock:
            batch: list[Ticket] = []
            try:
                while self._queue:
                    batch, self._queue = self._queue, []
                    await self._persist(batch)
                    for ticket in batch:  # wake in admission order
                        if ticket.waiter is not None and not ticket.waiter.done():
                            ticket.waiter.set_result(None)
                    batch = []
            finally:  # interrupted (loop teardown): nobody may wait forever
                for ticket in (*batch, *self._queue):
                    if ticket.waiter is not None and not ticket.waiter.done():
                        ticket.waiter.set_result(None)

    async def _persist(self, batch: list[Ticket]) -> None:
        try:
            await self._run(self._backend.persist, batch)
        except Exception as exc:  # a backend bug must still settle every caller
            error = (
                exc
                if isinstance(exc, PersistenceError)
                else PersistenceError(f"checkpoint write failed: {exc!r}")
            )
            for other in batch:
                if not other.done:
                    other.done, other.error = True, error
        finally:
            for other in batch:
                if other.error is not None:
                    self._fail(str(other.error))
            stopped = getattr(self._backend, "broken", None)
            if stopped is not None:  # even when every ticket had been acknowledged
                self._fail(f"checkpoint writer stopped: {stopped}")

    async def _run(self, func: Callable[..., None], *args: Any) -> None:
        """Run ``func`` on a worker thread; never abandon it while it is running."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, func, *args)
        cancelled = False
        while True:
            try:
                await asyncio.shield(future)
                break
            except asyncio.CancelledError:
                cancelled = True  # keep waiting: the thread still owns the files
                if future.done():
                    break
        if cancelled:
            if not future.cancelled() and future.exception() is not None:
                pass  # retrieved here; the batch's tickets already carry the error
            raise asyncio.CancelledError
        future.result()

    def _fail(self, message: str) -> None:
        self.persisted = False
        if self.error is None:
            self.error = message


def _seed_steps(steps: Sequence[Mapping[str, Any]] | None) -> StepLog:
    """A resume's steps, published in its first base (a tool node continues after them)."""
    entries = [dict(step) for step in steps or ()]
    try:
        for entry in entries:
            check_step(entry)  # sealed: they come from a checkpoint, digest included
        return StepLog.of(entries)
    except StepError as exc:
        raise ValueError(f"an initial step cannot be stored: {exc}") from None


def _add_spawned_ids(raw: dict[str, object], spawned_ids: Sequence[str] | None) -> None:
    """Put a non-empty ``spawned_ids`` into ``raw`` after checking it holds node ids."""
    if spawned_ids is None:
        return
    if isinstance(spawned_ids, str) or not all(
        isinstance(node_id, str) and node_id for node_id in spawned_ids
    ):
        raise ValueError(f"spawned_ids must be a sequence of node ids, got {spawned_ids!r}")
    ids = list(spawned_ids)
    if len(set(ids)) != len(ids):
        raise ValueError(f"spawned_ids repeats a node id: {ids!r}")
    if ids:
        raw["spawned_ids"] = ids
