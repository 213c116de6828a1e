"""One node in full and the run's result: typed over ``orchestrate._detail``.

The objects are built from the very dicts ``show RUN NODE --json`` and ``result RUN
--json`` print, and ``to_json`` gives those dicts back unchanged, so a Studio page or an
MCP client and the CLI can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steerflow.orchestrate._detail import node_detail as _node_detail
from steerflow.orchestrate._detail import response_text
from steerflow.orchestrate._detail import run_result as _run_result

__all__ = ["NodeDetail", "RunResult", "node_detail", "run_result"]


def _str(value: object) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class NodeDetail:
    """Everything known about one node of a run (``show RUN NODE``)."""

    run_id: str
    session_id: str | None
    id: str
    kind: str
    status: str
    assignee: str | None
    model: str | None
    #: The instruction exactly as the provider received it (steer blocks included), or
    #: None when the node has not run (or the state DB has no row for its call).
    instruction: str | None
    planned_instruction: str | None
    response: object
    #: The validated structured output of a node with an ``output_schema`` (issue 40).
    output: object
    error: str | None
    started_at: float | None
    ended_at: float | None
    duration_s: float | None
    usage: dict[str, Any] | None
    artifacts: tuple[Any, ...]
    parent: str | None
    spawned: tuple[str, ...]
    depends_on: tuple[str, ...]
    replayed: bool
    #: Where the call ran when not in the flow's process (``--executor ray``: ``executor``,
    #: ``node_id``, ``node_ip``, ``pid``, ``worker_id``); None for a local call.
    placement: dict[str, Any] | None
    note: str | None
    checkpoint_error: str | None
    #: The ``show RUN NODE --json`` object this was read from, every member included.
    raw: dict[str, Any]

    @property
    def response_text(self) -> str | None:
        """The response as text (``show --raw``), or None when there is none."""
        return None if self.response is None else response_text(self.response)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeDetail:
        """Type a ``show RUN NODE --json`` object."""
        return cls(
            run_id=str(data["run_id"]),
            session_id=_str(data.get("session_id")),
            id=str(data["id"]),
            kind=str(data["kind"]),
            status=str(data["status"]),
            assignee=_str(data.get("assignee")),
            model=_str(data.get("model")),
            instruction=_str(data.get("instruction")),
            planned_instruction=_str(data.get("planned_instruction")),
            response=data.get("response"),
            output=data.get("output"),
            error=_str(data.get("error")),
            started_at=data.get("started_at"),
            ended_at=data.get("ended_at"),
            duration_s=data.get("duration_s"),
            usage=data.get("usage"),
            artifacts=tuple(data.get("artifacts") or ()),
            parent=_str(data.get("parent")),
            spawned=tuple(data.get("spawned") or ()),
            depends_on=tuple(data.get("depends_on") or ()),
            replayed=bool(data.get("replayed")),
            placement=data.get("placement"),
            note=_str(data.get("note")),
            checkpoint_error=_str(data.get("checkpoint_error")),
            raw=dict(data),
        )

    def to_json(self) -> dict[str, Any]:
        """The ``show RUN NODE --json`` object."""
        return dict(self.raw)


def node_detail(home: Path, target: str, node: str) -> NodeDetail:
    """One node of run ``target``: ``node`` is an agent_id or spawn_id, or a prefix.

    Raises:
        UnknownIdError, AmbiguousIdError: ``target`` or ``node`` names nothing or several.
    """
    return NodeDetail.from_json(_node_detail(home, target, node))


@dataclass(frozen=True)
class RunResult:
    """A run's result (``result RUN``): the synthesis response, else every sink's."""

    run_id: str
    session_id: str | None
    status: str
    #: ``synthesis`` or ``sinks``.
    source: str
    text: str
    #: ``{id, kind, status, response, output, error}`` per node the result is made of.
    nodes: tuple[dict[str, Any], ...]
    raw: dict[str, Any]

    @property
    def completed(self) -> bool:
        """Whether the run completed (``result`` exits 0)."""
        return self.status == "completed"

    def to_json(self) -> dict[str, Any]:
        """The ``result RUN --json`` object without ``exit_code``."""
        return dict(self.raw)


def run_result(home: Path, target: str) -> RunResult:
    """The result of run ``target``.

    Raises:
        CheckpointRecoveryError: the checkpoint is missing or refused.
    """
    data = _run_result(home, target)
    return RunResult(
        run_id=str(data["run_id"]),
        session_id=_str(data.get("session_id")),
        status=str(data["status"]),
        source=str(data["source"]),
        text=str(data["text"]),
        nodes=tuple(data["nodes"]),
        raw=dict(data),
    )
