"""Connecting to a Ray cluster, and what the flow process knows of it.

``ray`` is imported here and only when a run asks for ``--executor ray``: a missing extra
is one usage error naming it, and a local run never pays Ray's import.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from steerflow.errors import ExitCode, RefusedError, SteerflowError, UsageError, quote_input
from steerflow.providers import Provider
from steerflow.state import BUSY_TIMEOUT_S

__all__ = [
    "CONNECT_BOUND_S",
    "EXECUTORS",
    "Executor",
    "RayCluster",
    "RayConnectStoppedError",
    "RayUnavailableError",
    "connect_ray",
    "connect_stopped",
    "join_ray",
]

#: ``--executor`` values (CONTRACT §11; env ``STEERFLOW_EXECUTOR``).
Executor = Literal["local", "ray"]
EXECUTORS: tuple[Executor, ...] = ("local", "ray")

#: How long joining a cluster may take: the state DB's bound (decision 243).
CONNECT_BOUND_S = BUSY_TIMEOUT_S
_NO_ANSWER = f"no answer within {CONNECT_BOUND_S:g} s"
#: HTTP/2's client connection preface and an empty SETTINGS frame (RFC 9113 §3.4).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_H2_SETTINGS = 4  # the frame type a server's preface starts with
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
    with none the run is refused before anything is allocated. Blocking: a run joins
    through :func:`join_ray`, which bounds this and lets a signal end the wait.

    Raises:
        UsageError: no ``ray`` package, or a Ray Client (``ray://``) address.
        RayUnavailableError: nothing answers at the address.
    """
    target = _target(address)
    ray = import_ray()
    try:
        _connect(ray, target, time.monotonic() + CONNECT_BOUND_S)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise _unavailable(address, target, exc) from None
    return RayCluster(ray, target)


async def join_ray(address: str | None) -> RayCluster:
    """:func:`connect_ray` off the loop, ended within :data:`CONNECT_BOUND_S` (decision 243).

    ``ray.init`` blocks in Ray's C++ client, retrying for minutes an address that accepts
    and never answers, and no signal handler runs meanwhile; on a daemon thread it
    cannot hold the loop. A cancellation (SIGINT, SIGTERM) ends the wait at once, and an
    abandoned thread that connects after all leaves the cluster again.

    Raises:
        UsageError: As :func:`connect_ray`.
        RayUnavailableError: Nothing answered as a Ray cluster within the bound.
    """
    target = _target(address)
    ray = await asyncio.to_thread(import_ray)
    abandoned = threading.Event()

    def connect() -> None:
        _connect(ray, target, time.monotonic() + CONNECT_BOUND_S)
        if abandoned.is_set():  # connected after the run gave up on it
            ray.shutdown()

    try:
        async with asyncio.timeout(CONNECT_BOUND_S):
            await _on_daemon_thread(connect)
    except TimeoutError:
        abandoned.set()
        raise _unavailable(address, target, ConnectionError(_NO_ANSWER)) from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise _unavailable(address, target, exc) from None
    except BaseException:
        abandoned.set()
        raise
    return RayCluster(ray, target)


class RayConnectStoppedError(SteerflowError):
    """SIGINT came while joining the cluster; nothing was started (exit 130)."""

    code = "interrupted"
    exit_code = ExitCode.SIGINT


class _RayConnectTerminatedError(RayConnectStoppedError):
    exit_code = ExitCode.SIGTERM


def connect_stopped(reason: str, address: str | None) -> RayConnectStoppedError:
    """The one-line end of a run stopped by ``reason`` (a signal's name) while joining."""
    target = (address or os.environ.get("RAY_ADDRESS") or "auto").strip()
    cls = _RayConnectTerminatedError if reason == "SIGTERM" else RayConnectStoppedError
    return cls(
        f"--executor ray: stopped by {reason} while connecting to the Ray cluster at "
        f"{quote_input(target)}; nothing was started"
    )


def _target(address: str | None) -> str:
    """The address to join, checked: a usage error is said before Ray is even imported."""
    if address is not None and not address.strip():
        raise UsageError("--ray-address is empty: give the head's HOST:PORT, or leave it out")
    target = (address or os.environ.get("RAY_ADDRESS") or "auto").strip()
    if target.startswith("ray://"):
        raise UsageError(
            f"--ray-address {quote_input(target)}: Ray Client addresses are not supported; "
            "run steerflow "
            "on a node of the cluster and give the GCS address (HOST:PORT)"
        )
    if target != "auto":
        _host_port(target)
    return target


def _unavailable(address: str | None, target: str, exc: BaseException) -> RayUnavailableError:
    hint = (
        ""
        if address or os.environ.get("RAY_ADDRESS")
        else (
            " (no --ray-address or RAY_ADDRESS given, and no cluster started on this host: "
            "`ray start --head` starts one)"
        )
    )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return RayUnavailableError(
        f"--executor ray: cannot connect to the Ray cluster at {quote_input(target)}: {first}{hint}"
    )


def _connect(ray: ModuleType, target: str, deadline: float) -> None:
    if target != "auto":
        _reachable(target, deadline)
    _init(ray, target)


async def _on_daemon_thread(work: Callable[[], None]) -> None:
    """Run ``work`` on a daemon thread of its own; a cancelled wait abandons the thread."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.done():  # the wait was cancelled or timed out meanwhile
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def run() -> None:
        error: BaseException | None = None
        try:
            work()
        except Exception as exc:
            error = exc
        except BaseException as exc:  # a SystemExit on this thread must not end the run
            error = RuntimeError(f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=run, name="steerflow-ray-connect", daemon=True).start()
    await done


def _host_port(target: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    host = host.strip("[]")
    # 253 characters is the longest DNS name; an empty label ("..") is no host name either
    if not sep or not host or not port.isdigit() or len(host) > 253:
        raise UsageError(
            f"--ray-address {quote_input(target)}: not HOST:PORT (the head's GCS address, as "
            "`ray start --head` prints it)"
        )
    return host, int(port)


def _reachable(target: str, deadline: float) -> None:
    """Fail fast when no Ray GCS answers at ``HOST:PORT``: ``ray.init`` retries for minutes.

    The GCS is a gRPC server: to HTTP/2's connection preface it answers with its SETTINGS
    frame at once. Something that refuses, accepts and says nothing, closes, or answers
    something else is refused here, before Ray's client (which would retry it for minutes,
    logging to stderr) is started. With ``RAY_USE_TLS`` the GCS speaks TLS first: only the
    TCP connection is checked, and the bound on ``ray.init`` does the rest.
    """
    host, port = _host_port(target)
    try:
        with socket.create_connection((host, port), timeout=_left(deadline)) as sock:
            if os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true"):
                return
            sock.sendall(_H2_PREFACE)
            head = b""
            while len(head) < 9:  # a frame header: length (3), type (1), flags, stream id
                sock.settimeout(_left(deadline))
                chunk = sock.recv(9 - len(head))
                if not chunk:
                    raise ConnectionError("the connection was closed without an answer")
                head += chunk
    except UnicodeError:
        raise UsageError(
            f"--ray-address {quote_input(target)}: {host!r} is not a host name"
        ) from None
    except TimeoutError:
        raise ConnectionError(_NO_ANSWER) from None
    except ConnectionError:
        raise
    except OSError as exc:
        raise ConnectionError(exc.strerror or str(exc)) from None
    if head[3] != _H2_SETTINGS:
        raise ConnectionError("something answered, but not a Ray GCS (no HTTP/2 reply)")


def _left(deadline: float) -> float:
    return max(0.01, deadline - time.monotonic())


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
