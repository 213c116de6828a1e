"""Functions that tests name as ``python:fn_nodes:NAME`` model specs (issue 29).

Importable as ``fn_nodes``: pytest puts ``tests/`` on ``sys.path``, and the CLI tests put it
on the child's ``PYTHONPATH``. Module state (the lists and events) is per process.
"""

from __future__ import annotations

import asyncio
import os
import threading

from pydantic import BaseModel

from steerflow import NodeCall
from waiting import loop_turn

#: Every NodeCall ``record`` received, in call order.
SEEN: list[NodeCall] = []
#: Set by a blocking function once it runs; it then waits for RELEASE.
STARTED = threading.Event()
RELEASE = threading.Event()
#: Set once ``waits_forever`` saw its cancellation.
CANCELLED = threading.Event()
NOT_CALLABLE = 5


def reset() -> None:
    SEEN.clear()
    for event in (STARTED, RELEASE, CANCELLED):
        event.clear()


def record(call: NodeCall) -> str:
    SEEN.append(call)
    return f"fn {call.node_id}"


async def record_async(call: NodeCall) -> str:
    SEEN.append(call)
    await loop_turn()
    return f"async fn {call.node_id}"


def counted(call: NodeCall) -> str:
    """One line per call in ``$FN_NODES_LOG``, so calls can be counted across processes."""
    with open(os.environ["FN_NODES_LOG"], "a", encoding="utf-8") as log:
        log.write(call.node_id + "\n")
    return f"counted {call.node_id} after {sorted(call.results)}"


def blocks_until_released(call: NodeCall) -> str:
    """Blocks its thread until the test's event loop sets RELEASE (bounded)."""
    STARTED.set()
    return "released" if RELEASE.wait(timeout=30) else "never released"


async def waits_forever(call: NodeCall) -> str:
    STARTED.set()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        CANCELLED.set()
        raise
    return "unreachable"


def writes_artifact(call: NodeCall) -> str:
    (call.artifact_dir() / "out.txt").write_text(call.node_id, encoding="utf-8")
    return "wrote out.txt"


def raises(call: NodeCall) -> str:
    raise ValueError(f"the function failed on {call.node_id}")


def returns_number(call: NodeCall) -> int:
    return 42


def counted_holding(call: NodeCall) -> str:
    """``counted``, then block (bounded) when this node is ``$FN_NODES_HOLD``: a kill lands
    while it is in flight."""
    answer = counted(call)
    if call.node_id == os.environ.get("FN_NODES_HOLD"):
        threading.Event().wait(timeout=float(os.environ.get("FN_NODES_HOLD_S", "60")))
    return answer


def prints(call: NodeCall) -> str:
    """Prints its node id, a line at a time, between yields to the other nodes' threads."""
    for n in range(int(os.environ.get("FN_NODES_PRINTS", "3"))):
        print(f"print {n} from {call.node_id}")
        os.sched_yield()  # let the other nodes' threads print in between
    return f"printed {call.node_id}"


async def prints_async(call: NodeCall) -> str:
    for n in range(int(os.environ.get("FN_NODES_PRINTS", "3"))):
        print(f"print {n} from {call.node_id}")
        await loop_turn()
    return f"printed {call.node_id}"


def sleeps_an_hour(call: NodeCall) -> str:
    """A hung plain function: only the process's exit ends its thread."""
    with open(os.environ["FN_NODES_LOG"], "a", encoding="utf-8") as log:
        log.write(call.node_id + "\n")
    threading.Event().wait()  # nobody sets it: hung until the process exits
    return "woke up"


class Verdict(BaseModel):
    """What ``judge`` returns for a node with an ``output_schema`` (issue 40)."""

    ok: bool
    seen: dict[str, object]


def judge(call: NodeCall) -> Verdict:
    """A typed function node: its return value is its output; it sees its dependencies'."""
    SEEN.append(call)
    return Verdict(ok=True, seen=call.outputs)
