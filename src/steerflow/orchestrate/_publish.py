"""Publish live node status to the state DB for other processes.

The heartbeat is the lease's renewal now: ``orchestrate._lease``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from steerflow.errors import LeaseLostError, StateDBLostError, SteerflowError
from steerflow.executor import FlowEvent, Graph, Operation
from steerflow.state import NodeStatus, NodeUpdate, StateDB

__all__ = ["NodePublisher"]

_EVENT_STATUS: dict[str, NodeStatus] = {
    "node_started": "running",
    "node_completed": "completed",
    "node_failed": "failed",
    "node_skipped": "skipped",
    "node_replayed": "completed",
    "node_paused": "paused",
    "node_spawned": "pending",
    "node_withheld": "pending",
    "approval_requested": "awaiting_approval",
    "approval_decided": "running",
}


class NodePublisher:
    """Coalesces node status changes and writes them in one transaction per batch.

    Events arrive synchronously on the loop; the write happens in a worker thread
    so the event loop never waits on SQLite. With ``epoch`` every batch is fenced by the
    session's lease in its own transaction; once a batch is refused (the lease was
    taken over, the database lost) nothing more is written and ``on_fenced`` is told.
    """

    def __init__(
        self,
        db: StateDB,
        session_id: str,
        graph: Graph,
        *,
        epoch: int | None = None,
        on_fenced: Callable[[LeaseLostError | StateDBLostError], None] | None = None,
    ) -> None:
        self._db = db
        self._session_id = session_id
        self._graph = graph
        self._epoch = epoch
        self._on_fenced = on_fenced
        self.fenced = False
        self._dirty: dict[str, NodeUpdate] = {}
        self._wake = asyncio.Event()
        self._closing = False
        # One write at a time, in order: an older batch must never land after a newer one.
        self._flush_lock = asyncio.Lock()

    def snapshot_all(self) -> None:
        """Queue every node's current status (initial publication)."""
        for op in self._graph:
            self._queue(op.key, op.status)

    def on_event(self, event: FlowEvent) -> None:
        """Event-bus subscriber."""
        status = _EVENT_STATUS.get(event.type)
        if status is not None and event.node_key is not None:
            self._queue(event.node_key, status)

    def on_gate(self, paused: bool) -> None:
        """When the gate reopens, nodes shown as paused are pending again."""
        if not paused:
            for op in self._graph:
                if op.status == "pending":
                    self._queue(op.key, "pending")

    def _queue(self, key: str, status: NodeStatus) -> None:
        op = self._graph.by_key.get(key)
        if op is None:
            return
        detail: dict[str, object] | None = None
        if op.error:
            detail = {"error": op.error[:500]}
        if op.artifacts:
            detail = (detail or {}) | {"artifacts": op.artifacts[:100]}
        if op.cancelled is not None:
            detail = (detail or {}) | {"cancelled": op.cancelled}
        if op.usage is not None:
            detail = (detail or {}) | op.usage.to_json()
        call = _call_detail(op, self._graph)
        if call:
            detail = (detail or {}) | call
        self._dirty[key] = NodeUpdate(
            node_key=key,
            kind=op.kind,
            status=status,
            node_id=op.node_id,
            assignee=op.assignee,
            detail=detail,
        )
        self._wake.set()

    async def run(self) -> None:
        """Write batches until :meth:`close`; a failed write is retried with the next batch."""
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Write every queued update now."""
        async with self._flush_lock:
            if self.fenced:
                self._dirty.clear()
                return
            if not self._dirty:
                return
            batch, self._dirty = list(self._dirty.values()), {}
            try:
                await asyncio.to_thread(
                    lambda: self._db.upsert_nodes(self._session_id, batch, epoch=self._epoch)
                )
            except (LeaseLostError, StateDBLostError) as exc:
                self.fenced = True  # the rows are no longer this process's to write
                if self._on_fenced is not None:
                    self._on_fenced(exc)
            except SteerflowError:
                for row in batch:
                    self._dirty.setdefault(row.node_key, row)

    async def close(self) -> None:
        """Flush what is left once more and end :meth:`run`."""
        self._closing = True
        self._wake.set()
        await self.flush()


def _call_detail(op: Operation, graph: Graph) -> dict[str, object]:
    """What ``show RUN NODE`` reads about the call (decision: kept here, not in the checkpoint).

    The rendered instruction is what the provider received (steer block and dependency
    results included); a replayed node did not run in this session, so it only says so.
    """
    out: dict[str, object] = {}
    if op.replayed:
        out["replayed"] = True
    if op.rendered_instruction is not None:
        out["instruction"] = op.rendered_instruction
    for name in ("model", "started_at", "ended_at"):
        value = getattr(op, name)
        if value is not None:
            out[name] = value
    if op.extra.get("steers"):
        out["steers"] = op.extra["steers"]
    if op.extra.get("placement"):
        out["placement"] = op.extra["placement"]
    if op.extra.get("streamed"):
        out["streamed"] = True  # its live file gets an end mark (decision 235)
    if op.status == "skipped" and op.extra.get("skipped"):
        out["skipped"] = op.extra["skipped"]
    parent = graph.ops.get(op.parent_id) if op.parent_id else None
    if parent is not None:
        out["parent"] = parent.key
    return out
