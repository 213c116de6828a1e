"""How many calls each retrying node made in earlier runs of its resume chain (issue 40).

A node with ``retry: {attempts: N}`` makes at most ``1 + N`` calls across the whole
chain (decision 278). A call's write-ahead intent carries its attempt number, counted
from the chain's first run, so the source's open intents say how many calls each node
made; a run that never called the node again has no intent of it, so the checkpoint
``config`` carries the count forward (member :data:`TRIES_KEY`, only when some).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from steerflow.checkpoint import InFlightCall
from steerflow.executor import Graph

__all__ = ["TRIES_KEY", "chain_tries", "tries_member"]

#: The checkpoint ``config`` member: calls made by earlier runs, by node key.
TRIES_KEY = "tries_before"


def chain_tries(config: Mapping[str, Any], in_flight: Iterable[InFlightCall]) -> dict[str, int]:
    """Calls each node made in the chain up to a checkpoint whose outcome is not recorded."""
    stored = config.get(TRIES_KEY)
    out: dict[str, int] = {}
    if isinstance(stored, Mapping):
        for key, count in stored.items():
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                out[str(key)] = count
    for call in in_flight:
        out[call.node] = max(out.get(call.node, 0), call.attempt)
    return out


def tries_member(tries: Mapping[str, int], graph: Graph) -> dict[str, int]:
    """What a resumed run's ``config`` carries: retrying nodes that still have to run."""
    out: dict[str, int] = {}
    for key, count in sorted(tries.items()):
        op = graph.by_key.get(key)
        if op is not None and op.retry_attempts is not None and not op.terminal:
            out[key] = count
    return out
