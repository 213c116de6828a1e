"""Each node's outcome in hand (issue 40 item 3): ``FlowResult.outcomes`` and ``.output``.

A run's result carries every node's response, validated output and usage, so a program
needs no second read of the checkpoint; ``--json`` prints none of them (the ``result``
member has the sinks' text, ``show RUN NODE`` the rest: decision 287).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from steerflow.errors import UnknownIdError, UsageError
from steerflow.executor import Graph

__all__ = ["NodeOutcome", "find_outcome", "node_outcomes", "parse_output"]

T = TypeVar("T")


@dataclass(frozen=True)
class NodeOutcome:
    """One node as the run left it: its response, output and usage.

    ``response`` is the completed node's reply text (a typed node's: its output as JSON),
    else None (a large one of a version 4 run is read back from its checkpoint when
    asked: decision 393); ``output`` the validated structured output of a node with an
    ``output_schema`` (plain JSON values), else None; ``usage`` what its calls cost
    (``{input_tokens, output_tokens, ..., cost_usd}``), None when nothing was reported.
    """

    id: str
    kind: str
    status: str
    _response: object = field(repr=False)
    output: object
    usage: dict[str, Any] | None
    error: str | None
    _read_back: Callable[[], object] | None = field(default=None, repr=False, compare=False)

    @property
    def response(self) -> object:
        """The reply text (read back from the checkpoint when the run kept it there).

        Raises:
            PersistenceError: It was kept in the checkpoint and cannot be read back
                (the run directory was removed or altered); the message names the file.
        """
        return self._response if self._read_back is None else self._read_back()


def node_outcomes(graph: Graph) -> dict[str, NodeOutcome]:
    """Every node's outcome by its id (agent id, spawn id or ``synthesis``), graph order."""
    out: dict[str, NodeOutcome] = {}
    for op in graph:
        done = op.status == "completed"
        out[op.key] = NodeOutcome(
            id=op.key,
            kind=op.kind,
            status=op.status,
            _response=op.response_in_memory if done else None,
            output=op.output if done else None,
            usage=op.usage.to_json() if op.usage is not None else None,
            error=op.error if op.status == "failed" else None,
            _read_back=op.response_read_back if done else None,
        )
    return out


def find_outcome(outcomes: Mapping[str, NodeOutcome], node: str, run_id: str | None) -> NodeOutcome:
    """The outcome of node ``node``.

    Raises:
        UnknownIdError: No node has that id; the message lists the run's nodes.
    """
    found = outcomes.get(node)
    if found is not None:
        return found
    known = ", ".join(list(outcomes)[:20]) or "none"
    more = ", ..." if len(outcomes) > 20 else ""
    raise UnknownIdError(
        f"run {run_id or '(not started)'} has no node {node!r} (nodes: {known}{more})"
    )


@overload
def parse_output(value: object, cls: None, node: str) -> object: ...
@overload
def parse_output(value: object, cls: type[T], node: str) -> T: ...
def parse_output(value: object, cls: type[Any] | None, node: str) -> object:
    """``value`` parsed into ``cls`` (a pydantic model, dataclass or TypedDict), or as is.

    Raises:
        UsageError: It does not parse into ``cls`` (the message names the node and class).
    """
    if cls is None or value is None:
        return value
    from pydantic import BaseModel, TypeAdapter, ValidationError

    try:
        if isinstance(cls, type) and issubclass(cls, BaseModel):
            return cls.model_validate(value)
        return TypeAdapter(cls).validate_python(value)
    except ValidationError as exc:
        name = getattr(cls, "__name__", repr(cls))
        raise UsageError(f"the output of node {node!r} does not parse as {name}: {exc}") from exc
