"""The ``checkpoint_recovery`` report (CONTRACT §8) and the refusal that carries it.

The report describes *where* and *why*, never *what*: it holds positions, counts,
generation ids and reason codes, and never a prompt, response or context value.
Anything the loader did not establish stays ``None``.

For a version 2 snapshot there is no journal, so ``generation``, ``records_applied``,
``last_seq``, ``stale_generation_records``, ``discarded_tail_bytes`` and
``valid_prefix_seq`` are all ``None`` and a readable file is ``clean``.

A refusal carries, besides CONTRACT §8's ``reason``, ``seq``, ``line`` and
``byte_offset``: ``file`` (the name of the file at fault, ``checkpoint.json`` — the
version 3 base or the version 2 snapshot — or ``checkpoint.json.journal``) and
``entry`` (the ids of the entry at fault: ``{"kind": "op", "agent_id"}`` or
``{"kind": "spawn", "node_id", "spawn_id"}``, or for a call intent
``{"kind": "intent", "node", "call_id"}``).  Ids are names, not values, so the
report stays free of prompts, responses and context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from steerflow.errors import CheckpointRecoveryError

__all__ = ["REPORT_VERSION", "Report", "Status", "describe_entry"]

REPORT_VERSION = 1
Status = Literal["clean", "recovered_prefix", "refused"]


@dataclass
class Report:
    """Mutable while loading; :meth:`as_dict` gives the wire form."""

    checkpoint_version: int | None = None
    generation: str | None = None
    records_applied: int | None = None
    last_seq: int | None = None
    stale_generation_records: int | None = None
    discarded_tail_bytes: int | None = None
    valid_prefix_seq: int | None = None
    refusal: dict[str, Any] | None = None
    # The file a refusal names when the caller does not say (the checkpoint file itself).
    default_file: str | None = None

    @property
    def status(self) -> Status:
        """``refused`` if refused; ``recovered_prefix`` if anything was skipped."""
        if self.refusal is not None:
            return "refused"
        if self.discarded_tail_bytes or self.stale_generation_records:
            return "recovered_prefix"
        return "clean"

    def as_dict(self) -> dict[str, Any]:
        """The report as CONTRACT §8 names it."""
        return {
            "report_version": REPORT_VERSION,
            "status": self.status,
            "checkpoint_version": self.checkpoint_version,
            "generation": self.generation,
            "records_applied": self.records_applied,
            "last_seq": self.last_seq,
            "stale_generation_records": self.stale_generation_records,
            "discarded_tail_bytes": self.discarded_tail_bytes,
            "refusal": None if self.refusal is None else dict(self.refusal),
            "valid_prefix_seq": self.valid_prefix_seq,
        }

    def refuse(
        self,
        reason: str,
        *,
        seq: int | None = None,
        line: int | None = None,
        byte_offset: int | None = None,
        detail: str | None = None,
        file: str | None = None,
        entry: dict[str, Any] | None = None,
    ) -> CheckpointRecoveryError:
        """Record the refusal and return the error to raise (``reason`` is a code)."""
        self.refusal = {
            "reason": reason,
            "seq": seq,
            "line": line,
            "byte_offset": byte_offset,
            "file": file if file is not None else self.default_file,
            "entry": None if entry is None else dict(entry),
        }
        message = f"checkpoint recovery refused: {reason}"
        named = describe_entry(entry)
        if named:
            message += f" at {named}"
        where = ", ".join(
            f"{k}={v!r}"
            for k, v in (
                ("file", self.refusal["file"]),
                ("line", line),
                ("seq", seq),
                ("byte_offset", byte_offset),
            )
            if v is not None
        )
        if where:
            message += f" ({where})"
        if detail:
            message += f": {detail}"
        return CheckpointRecoveryError(self.as_dict(), message)


def describe_entry(entry: dict[str, Any] | None) -> str:
    """``planned node 'a'`` / ``spawned node 'fix-1' (node_id '…')``, or ``""``."""
    if not entry:
        return ""
    if entry.get("kind") == "op":
        return f"planned node {entry.get('agent_id')!r}"
    if entry.get("kind") == "intent":
        call = f" (call_id {entry['call_id']!r})" if entry.get("call_id") else ""
        return f"the call intent of node {entry.get('node')!r}{call}"
    if entry.get("kind") == "step":
        at = f" {entry['index']}" if entry.get("index") is not None else ""
        return f"step{at} of node {entry.get('node')!r}"
    spawn_id, node_id = entry.get("spawn_id"), entry.get("node_id")
    if spawn_id is not None and node_id is not None:
        return f"spawned node {spawn_id!r} (node_id {node_id!r})"
    if node_id is not None:
        return f"spawned node_id {node_id!r}"
    if spawn_id is not None:
        return f"spawned node {spawn_id!r}"
    return f"spawned entry #{entry.get('index')}" if entry.get("index") is not None else ""
