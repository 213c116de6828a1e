"""Large responses kept in the checkpoint only, once durable (issue 43 item 2, decision 393).

A batch of 10,000 nodes held every reply until the run ended (~40 MB of a 185 MiB peak
at 10,000 echo nodes). With a version 4 checkpoint, once a completed node's record is
acknowledged its response of :data:`KEEP_IN_MEMORY_BELOW` characters or more is dropped
from the operation, which reads it back from the checkpoint when a dependent renders its
prompt, a condition tests it, a view or the run's result asks.
"""

from __future__ import annotations

import functools

from steerflow.checkpoint import CheckpointWriter
from steerflow.errors import PersistenceError
from steerflow.executor import Graph

__all__ = ["KEEP_IN_MEMORY_BELOW", "ResponseKeeper"]

#: A shorter response stays in memory: its read-back closure and the read (a ``pread``
#: and a JSON decode) would cost more than the text.
KEEP_IN_MEMORY_BELOW = 1024


class ResponseKeeper:
    """The writer's ``on_saved`` half that drops a durable large response from memory."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.writer: CheckpointWriter | None = None  # set once the writer exists

    def saved(self, what: str, key: str) -> None:
        """``what``/``key``'s record is durable: keep its response in the checkpoint only."""
        writer = self.writer
        if writer is None or what not in ("op", "spawn") or not writer.reads_back:
            return
        op = self.graph.by_key.get(key) if what == "op" else self.graph.ops.get(key)
        if op is None or op.status != "completed" or op.response_read_back is not None:
            return
        text = op.response_in_memory
        if not isinstance(text, str) or len(text) < KEEP_IN_MEMORY_BELOW:
            return
        try:
            recorded = writer.read_response(what, key)
        except PersistenceError:
            return  # kept in memory: nothing is lost, it only costs memory
        # Another record of this node may be on its way (its entry is the last one the
        # writer holds): only a response the checkpoint returns as it is may leave.
        if recorded != text:
            return
        op.keep_response_elsewhere(functools.partial(writer.read_response, what, key))
