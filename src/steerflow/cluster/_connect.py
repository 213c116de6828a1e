"""Connecting to a Ray cluster, and what the flow process knows of it.

``ray`` is imported here and only when a run asks for ``--executor ray``: a missing extra
is one usage error naming it, and a local run never pays Ray's import.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, Literal

from steerflow.cluster._placement import describe_request, unplaceable
from steerflow.cluster._provider import ray_provider
from steerflow.errors import RefusedError, UsageError, quote_input
from steerflow.providers import Provider

__all__ = ["EXECUTORS", "Executor", "RayCluster", "RayUnavailableError", "connect_ray"]

#: ``--executor`` values (CONTRACT §11; env ``STEERFLOW_EXECUTOR``).
Executor = Literal["local", "ray"]
EXECUTORS: tuple[Executor, ...] = ("local", "ray")

#: How long the head's address may take to accept a TCP connection.
_CONNECT_TIMEOUT_S = 5.0
#: How long a node list stays fresh for the pre-dispatch placement check.
_NODES_TTL_S = 1.0


class RayUnavailableError(RefusedError):
    """The Ray cluster named by ``--ray-address``/``RAY_ADDRESS`` cannot be reached."""

    code = "ray-unavailable"


def import_ray() -> ModuleType:
    """``ray``, or the one-line usage error that names the extra to install."""
    try:
        import ray
    except ImportError:
        raise UsageError(
            "--executor ray needs the 'ray' Python package, which is not installed: "
            "pip install 'steerflow[ray]'"
        ) from None
    return ray


def connect_ray(address: str | None) -> RayCluster:
    """Join the cluster at ``address`` (else ``RAY_ADDRESS``, else one started on this host).

    Never starts a cluster: Ray's ``auto`` finds one that ``ray start`` runs here, and
    with none the run is refused before anything is allocated.

    Raises:
        UsageError: no ``ray`` package, or a Ray Client (``ray://``) address.
        RayUnavailableError: nothing answers at the address.
    """
    if address is not None and not address.strip():
        raise UsageError("--ray-address is empty: give the head's HOST:PORT, or leave it out")
    ray = import_ray()
    target = (address or os.environ.get("RAY_ADDRESS") or "auto").strip()
    if target.startswith("ray://"):
        raise UsageError(
            f"--ray-address {quote_input(target)}: Ray Client addresses are not supported; "
            "run steerflow "
            "on a node of the cluster and give the GCS address (HOST:PORT)"
        )
    try:
        if target != "auto":
            _reachable(target)
        _init(ray, target)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        hint = (
            ""
            if address or os.environ.get("RAY_ADDRESS")
            else (
                " (no --ray-address or RAY_ADDRESS given, and no cluster started on this host: "
                "`ray start --head` starts one)"
            )
        )
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RayUnavailableError(
            f"--executor ray: cannot connect to the Ray cluster at {quote_input(target)}: "
            f"{first}{hint}"
        ) from None
    return RayCluster(ray, target)


def _reachable(target: str) -> None:
    """Fail fast when nothing listens at ``HOST:PORT``: ``ray.init`` retries for minutes."""
    host, sep, port = target.rpartition(":")
    host = host.strip("[]")
    # 253 characters is the longest DNS name; an empty label ("..") is no host name either
    if not sep or not host or not port.isdigit() or len(host) > 253:
        raise UsageError(
            f"--ray-address {quote_input(target)}: not HOST:PORT (the head's GCS address, as "
            "`ray start --head` prints it)"
        )
    try:
        socket.create_connection((host, int(port)), timeout=_CONNECT_TIMEOUT_S).close()
    except UnicodeError:
        raise UsageError(
            f"--ray-address {quote_input(target)}: {host!r} is not a host name"
        ) from None
    except OSError as exc:
        raise ConnectionError(exc.strerror or str(exc)) from None


def _init(ray: ModuleType, target: str) -> None:
    # ray.init replaces the process's SIGTERM handler (with sys.exit) when it runs on the
    # main thread: a flow's own SIGTERM handling (persist, exit 143) must stay in force.
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if on_main else None
    try:
        ray.init(
            address=target,
            logging_level=logging.ERROR,
            log_to_driver=False,
            namespace="steerflow",
        )
    finally:
        if on_main and previous is not None:
            signal.signal(signal.SIGTERM, previous)
    _cluster_errors_to_stderr(ray)


def _cluster_errors_to_stderr(ray: ModuleType) -> None:
    """Send the cluster's error messages (a raylet that died, ...) to stderr.

    Ray's driver prints them to stdout from a thread of its own, and no ``ray.init``
    option turns that off; stdout is where ``--json`` prints its one object. Done by
    wrapping the one function that thread calls; a Ray without it is left as it is.
    """
    module = getattr(getattr(ray, "_private", None), "worker", None)
    original = getattr(module, "print_to_stdstream", None)
    if module is None or original is None or getattr(original, "_steerflow", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        original({**data, "is_err": True}, ignore_prefix)

    to_stderr._steerflow = True  # type: ignore[attr-defined]
    module.print_to_stdstream = to_stderr


class RayCluster:
    """The connected cluster: its alive nodes, the call task, and the wrapped providers."""

    def __init__(self, ray: ModuleType, address: str) -> None:
        from steerflow.cluster._worker import run_call

        self.ray = ray
        self.address = address
        # Ray retries a task whose worker died (3 times by default): that would run paid
        # work again behind the executor's back. A lost call fails its node instead.
        self.task = ray.remote(num_returns="streaming", max_retries=0)(run_call)
        self._nodes: list[dict[str, Any]] = []
        self._nodes_at = 0.0
        self._lock = threading.Lock()

    def nodes(self, *, fresh: bool = False) -> list[dict[str, Any]]:
        """Alive nodes (``NodeID``, ``NodeManagerAddress``, ``Resources``); blocking call."""
        with self._lock:
            if fresh or time.monotonic() - self._nodes_at > _NODES_TTL_S:
                self._nodes = [n for n in self.ray.nodes() if n.get("Alive")]
                self._nodes_at = time.monotonic()
            return list(self._nodes)

    def unplaceable(
        self, roles: Mapping[str | None, Mapping[str, float] | None], *, fresh: bool = False
    ) -> list[tuple[str | None, str]]:
        """The roles whose calls no alive node can hold, with what each lacks."""
        return unplaceable(roles, [n.get("Resources") or {} for n in self.nodes(fresh=fresh)])

    def check_roles(self, roles: Mapping[str | None, Mapping[str, float] | None]) -> None:
        """Refuse (exit 2) a run with a role no node can ever place, before anything runs."""
        missing = self.unplaceable(roles, fresh=True)
        if missing:
            role, why = missing[0]
            name = f"role {role!r}" if role else "nodes without a role"
            raise UsageError(
                f"{name} asks Ray for {describe_request(roles[role])}, which no alive node "
                f"of the cluster at {self.address} can give: {why}"
            )

    def wrap(
        self, resources_for: Callable[[str | None], Mapping[str, float] | None]
    ) -> Callable[[Provider], Provider]:
        """``ProviderCache(wrap=...)``: each provider's node calls go to this cluster."""
        return lambda inner: ray_provider(inner, self, resources_for)

    def close(self) -> None:
        """Leave the cluster (the flow's calls have ended); blocking call."""
        self.ray.shutdown()
