"""The completion observers that turn node outcomes into checkpoint records."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from steerflow.checkpoint import CheckpointWriter
from steerflow.errors import PersistenceError
from steerflow.executor import EventBus, FlowEvent, Graph, Operation, SharedContext
from steerflow.home import RunDir
from steerflow.orchestrate._resume import BRANCHES_DIR

__all__ = ["CheckpointRecorder", "write_private"]


class CheckpointRecorder:
    """Records outcomes and spawn intent; failures are reported, never raised into the run.

    ``info`` is the result's ``checkpoint`` object; its ``error`` keeps the first failure.
    """

    def __init__(
        self,
        writer: CheckpointWriter,
        graph: Graph,
        run_dir: RunDir,
        context: SharedContext,
        events: EventBus,
        info: dict[str, Any],
    ) -> None:
        self.writer = writer
        self.graph = graph
        self.run_dir = run_dir
        self.context = context
        self.events = events
        self.info = info

    async def flush(self) -> None:
        """Publish the initial snapshot, then re-record rebuilt spawns that still have to run."""
        try:
            await self.writer.flush()
        except PersistenceError as exc:
            self._failed(None, exc)
        rebuilt = [op for op in self.graph if op.kind == "spawned" and op.status == "pending"]
        if rebuilt:
            await self.record_intent(rebuilt)

    async def record_outcome(self, op: Operation) -> None:
        """Completion observer: persist the branch, then the node's outcome."""
        if op.status not in ("completed", "failed"):
            return
        response = op.response if op.status == "completed" else {"error": op.error}
        try:
            if op.branch:
                await asyncio.to_thread(_save_branch, self.run_dir.path, op)
            if op.kind == "planned":
                await self.writer.record(
                    op.key, status=op.status, response=response, flow_context=self.context.content
                )
            else:
                await self._record_spawned(op, op.status, response, self.context.content)
        except (PersistenceError, OSError) as exc:
            self._failed(op, exc)

    async def record_intent(self, children: list[Operation]) -> None:
        """Spawn observer: record accepted spawns as ``pending`` (recorded, never invoked)."""
        for child in children:
            try:
                await self._record_spawned(child, "pending", None, None)
            except PersistenceError as exc:
                self._failed(child, exc)

    async def _record_spawned(
        self, op: Operation, status: str, response: object, flow_context: dict[str, Any] | None
    ) -> None:
        await self.writer.record_spawned(
            op.node_id,
            status=status,
            response=response,
            flow_context=flow_context,
            operation=op.instruction,
            assignee=op.assignee,
            instruction=op.instruction,
            parent_id=op.parent_id,
            spawn_id=op.key,
            context=None,
            depends_on=[self.graph.ops[e.source].key for e in op.edges],
        )

    def _failed(self, op: Operation | None, exc: Exception) -> None:
        self.info["error"] = self.info["error"] or str(exc)
        self.events.emit(
            FlowEvent(
                type="checkpoint_failed",
                node_key=op.key if op else None,
                data={"error": str(exc)},
            )
        )


def _save_branch(run_path: Path, op: Operation) -> None:
    """Persist a node's conversation so a resume can restore what it inherits."""
    branches = run_path / BRANCHES_DIR
    branches.mkdir(mode=0o700, exist_ok=True)
    data = json.dumps([{"role": m.role, "content": m.content} for m in op.branch])
    tmp = branches / f".{op.key}.{os.getpid()}.tmp"
    write_private(tmp, data)
    os.replace(tmp, branches / f"{op.key}.json")


def write_private(path: Path, text: str) -> None:
    """Write a 0600 file without following a symlink at ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
