"""Node calls on a Ray cluster (``--executor ray``): the flow process stays their one owner.

Only the provider call of an admitted node leaves the process, as a Ray task
(:mod:`steerflow.cluster._worker`); scheduling, steering, the control poller, admission, the
lease and the checkpoint writer stay where they are, so every rule of a local run holds
unchanged. ``ray`` (extra ``ray``) is imported only when a run asks for it.
"""

from __future__ import annotations

from steerflow.cluster._connect import (
    CONNECT_BOUND_S,
    EXECUTORS,
    Executor,
    RayCluster,
    RayConnectStoppedError,
    connect_ray,
    connect_stopped,
    join_ray,
)
from steerflow.cluster._placement import ray_options, request_of, unplaceable

__all__ = [
    "CONNECT_BOUND_S",
    "EXECUTORS",
    "Executor",
    "RayCluster",
    "RayConnectStoppedError",
    "connect_ray",
    "connect_stopped",
    "join_ray",
    "ray_options",
    "request_of",
    "unplaceable",
]
