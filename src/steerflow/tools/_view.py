"""A tool node's steps as the readers show them (``show RUN NODE``, its ``--json`` ``steps``).

The journal holds a tool call twice (its intent, then its end) under one step index;
a reader wants one line per step, so the records of an index are merged: the last
record's status and result, the intent's start time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["node_steps"]


def node_steps(steps: Iterable[Mapping[str, Any]], record: str, key: str) -> list[dict[str, Any]]:
    """The steps of the node recorded as (``record``, ``key``), one dict per index, in order."""
    merged: dict[int, dict[str, Any]] = {}
    for step in steps:
        if step["record"] != record or step["key"] != key:
            continue
        index = int(step["index"])
        merged[index] = _merge(merged.get(index), step)
    return [merged[i] for i in sorted(merged)]


def _merge(before: dict[str, Any] | None, step: Mapping[str, Any]) -> dict[str, Any]:
    data = dict(step["data"])
    started = (before or {}).get("started_at", data.get("started_at"))
    ended = data.get("ended_at")
    out: dict[str, Any] = {
        "index": int(step["index"]),
        "kind": step["type"],
        "status": step["status"],
        "started_at": started,
        "ended_at": ended,
        "duration_s": round(ended - started, 3) if ended and started else None,
    }
    if step["type"] == "model":
        out.update(
            model=data.get("model"),
            text=data.get("text", ""),
            tool_calls=data.get("tool_calls", []),
            usage=data.get("usage"),
            # one rendered block may carry several messages: their ids joined by ","
            steered=[
                i for m in data.get("steered", ()) for i in str(m.get("control_id")).split(",")
            ],
        )
        return out
    if step["type"] == "approval":  # issue 41: the request, and its decision once made
        out.update(
            call_id=step["call_id"],
            request_id=data.get("request_id"),
            tool=data.get("tool"),
            args=data.get("args"),
            text=data.get("text", ""),
            edited_args=data.get("edited_args"),
            reason=data.get("reason"),
            sender=data.get("sender"),
            control_id=data.get("control_id"),
        )
        return out
    out.update(
        call_id=step["call_id"],
        tool=data.get("tool"),
        args=data.get("args"),
        result=data.get("result"),
        truncated=bool(data.get("truncated")),
        idempotent=bool(data.get("idempotent")),
        decision=data.get("decision"),
    )
    return out
