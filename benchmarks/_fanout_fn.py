"""The node call of ``ray_fanout.py``: sleep 0.5 s, then burn 0.2 s of CPU, say where."""

from __future__ import annotations

import json
import os
import socket
import sys
import time

from steerflow import NodeCall

SLEEP_S = 0.5
BURN_S = 0.2


def call(node: NodeCall) -> str:
    """A sync function: on a local run it shares the flow process's GIL, on Ray it has its own."""
    t_in = time.time()
    time.sleep(SLEEP_S)
    end = time.thread_time() + BURN_S
    n = 0
    while time.thread_time() < end:
        n += 1
    where = {"pid": os.getpid(), "host": socket.gethostname()}
    ray = sys.modules.get("ray")  # only a Ray worker has it: a local run never imports it
    if ray is not None and ray.is_initialized():
        where["ray_node_ip"] = ray.util.get_node_ip_address()
    return json.dumps({"t_in": t_in, "t_out": time.time(), "spins": n, **where})
