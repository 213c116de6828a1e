"""``python:`` node functions for the Ray tests; they run in Ray's workers.

Each call appends ``<event> <node> <pid> <run id>`` to the log file its instruction names
(``LOG=/path``: a worker does not see the flow process's environment), so the tests count
calls and see cancellations across processes and nodes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re

import ray

from steerflow import NodeCall

_LOG = re.compile(r"LOG=(\S+)")
_SECONDS = re.compile(r"SLEEP=([0-9.]+)")


def _log(call: NodeCall, event: str) -> None:
    found = _LOG.search(call.instruction)
    if found:
        with open(found.group(1), "a", encoding="utf-8") as log:
            log.write(f"{event} {call.node_id} {os.getpid()} {call.run_id}\n")


def _where() -> dict[str, object]:
    return {
        "ray_node_id": ray.get_runtime_context().get_node_id(),
        "ip": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
    }


def _ran_before(call: NodeCall) -> bool:
    found = _LOG.search(call.instruction)
    if not found or not os.path.exists(found.group(1)):
        return False
    with open(found.group(1), encoding="utf-8") as log:
        return any(line.split()[:2] == ["start", call.node_id] for line in log)


async def where(call: NodeCall) -> str:
    """Sleeps ``SLEEP=`` seconds (default 0), then says where it ran and what it received.

    With ``ONCE`` in the instruction only the node's first call sleeps (a retry is quick).
    """
    seconds = float(found.group(1)) if (found := _SECONDS.search(call.instruction)) else 0.0
    if "ONCE" in call.instruction and _ran_before(call):
        seconds = 0.0
    _log(call, "start")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        _log(call, "cancelled")
        raise
    _log(call, "end")
    return json.dumps({"node": call.node_id, **_where(), "instruction": call.instruction})
