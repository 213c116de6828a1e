"""Function nodes: the ``python:MODULE:FUNCTION`` model spec (issue 29, decisions 170-171).

The function gets one :class:`NodeCall` and returns the node's response text. Everything
around the call is the executor's, as for any provider: the response is recorded and
replayed (a resume never calls the function again for a completed node), and steering,
pause, stop and the deadline apply. An ``async def`` function runs on the loop and is
cancelled like a model call; a plain function runs on a daemon thread, so a function that
blocks stalls neither the loop nor, once cancelled, the process's exit. What a function
prints goes to its node's live output (``_stdout``), never to steerflow's stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import importlib
import inspect
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from steerflow.errors import FunctionNodeError, UsageError
from steerflow.providers._base import (
    DependencyResult,
    PlanRequest,
    Provider,
    ProviderRequest,
    ProviderResponse,
)
from steerflow.providers._paths import ensure_leg_dir
from steerflow.providers._stdout import Sink, call_sink, routed_stdout

T = TypeVar("T")

__all__ = ["DEADLINE_GRACE_S", "PYTHON_PREFIX", "FunctionProvider", "NodeCall", "resolve_function"]

PYTHON_PREFIX = "python:"
#: Seconds a function still running at the run's deadline may take to return (decision 241).
DEADLINE_GRACE_S = 5.0
_USAGE = "use python:MODULE:FUNCTION (an importable module on PYTHONPATH)"


@dataclass(frozen=True)
class NodeCall:
    """What a ``python:`` function receives: one node's call, read-only.

    ``instruction`` is the complete rendered instruction (operator steer block, the node's
    instruction, its dependencies' results), exactly what a model would get;
    ``dependencies`` holds those results as data. The artifact directory is not made
    until :meth:`artifact_dir` is called, so a function that writes nothing costs no
    ``mkdir``.
    """

    run_id: str
    node_id: str
    instruction: str
    dependencies: tuple[DependencyResult, ...] = ()
    assignee: str | None = None
    #: Where the node's artifact directory is (or will be); it may not exist yet.
    artifact_path: Path = field(default=Path(), repr=False)

    @property
    def results(self) -> dict[str, str]:
        """The completed dependencies' responses by node id (failed ones left out)."""
        return {d.node_id: d.text for d in self.dependencies if d.status == "completed"}

    @property
    def outputs(self) -> dict[str, object]:
        """The completed typed dependencies' structured outputs by node id (issue 40)."""
        return {
            d.node_id: d.output
            for d in self.dependencies
            if d.status == "completed" and d.output is not None
        }

    def artifact_dir(self) -> Path:
        """Make (0700, first call only; no symlink followed) and return the node's directory.

        Blocking I/O: from an ``async def`` function, ``await asyncio.to_thread(
        call.artifact_dir)``. A file written there is the node's artifact, checked like any
        (a role's declared ``artifacts`` must exist when the function returns).
        """
        return ensure_leg_dir(self.artifact_path.parent, self.artifact_path.name)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def resolve_function(spec: str) -> Callable[[NodeCall], Any]:
    """The node function a ``python:MODULE:FUNCTION`` model spec names (import_callable)."""
    return import_callable(spec, "model spec")


def import_callable(spec: str, what: str) -> Callable[..., Any]:
    """Import the function a ``python:MODULE:FUNCTION`` spec names (a node's or a tool's).

    ``FUNCTION`` may be dotted (``Class.method``). The module is found on ``sys.path`` as
    the process has it: steerflow does not add the working directory (decision 171).

    Raises:
        UsageError: A malformed spec, a module that cannot be imported (or raised while
            importing), a missing attribute, or one that is not callable; one line that
            names the spec.
    """
    module_name, sep, qualname = spec.removeprefix(PYTHON_PREFIX).partition(":")
    if not module_name or not sep or not qualname:
        raise UsageError(f"{what} {spec!r}: {_USAGE}")
    try:
        target: object = importlib.import_module(module_name)
    # an ImportError, whatever the module raised, or its sys.exit(): steerflow must not end
    # with the module's exit code (0 would read as success)
    except (Exception, SystemExit) as exc:
        raise UsageError(
            f"{what} {spec!r}: cannot import module {module_name!r} ({_one_line(exc)})"
        ) from None
    for part in qualname.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(
                f"{what} {spec!r}: module {module_name!r} has no function {qualname!r}"
            ) from None
    if not callable(target):
        raise UsageError(
            f"{what} {spec!r}: {module_name}.{qualname} is not callable "
            f"(a {type(target).__name__} object, not a function)"
        )
    return target


class FunctionProvider(Provider):
    """Calls a Python function for each node it serves.

    What the function prints goes to its node's live output, not to steerflow's stdout
    (decision 242). Nothing bounds a function's call but the run's end: at the deadline
    one still running gets :data:`DEADLINE_GRACE_S` to return, then its node is cancelled
    and a plain function's thread abandoned (decision 241).
    """

    # The function asks for its directory through NodeCall.artifact_dir (decision 170).
    needs_artifact_dir: ClassVar[bool] = False
    deadline_grace_s: ClassVar[float | None] = DEADLINE_GRACE_S

    def __init__(self, spec: str) -> None:
        self.spec = spec.strip()
        self.function = resolve_function(self.spec)
        # an instance with ``async def __call__`` is a coroutine function too
        self._is_async = inspect.iscoroutinefunction(self.function) or (
            inspect.iscoroutinefunction(type(self.function).__call__)
        )

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        """Call the function with the node's :class:`NodeCall`; its str is the response."""
        call = NodeCall(
            run_id=request.run_id,
            node_id=request.node_key,
            instruction=request.instruction,
            dependencies=request.dependencies,
            assignee=request.assignee,
            artifact_path=request.artifact_dir,
        )
        sink = call_sink(request.live)
        try:
            if self._is_async:
                with routed_stdout(sink):
                    result = await self.function(call)
            else:
                result = await _in_daemon_thread(self.function, call, sink)
        # the node fails with it (a sys.exit() too); CancelledError passes through
        except (Exception, SystemExit) as exc:
            raise FunctionNodeError(self.spec, f"raised {_one_line(exc)}") from exc
        if request.output_schema is not None and not isinstance(result, str):
            return _structured(self.spec, result)
        if not isinstance(result, str):
            raise FunctionNodeError(
                self.spec, f"returned {type(result).__name__}, not str: return the response text"
            )
        return ProviderResponse(text=result)

    async def plan(self, request: PlanRequest) -> object:
        """A function answers nodes; it does not plan (a usage error, not a bad reply to retry)."""
        raise UsageError(
            f"{self.spec} cannot plan a flow: give --plan FILE or --playbook NAME, and the "
            "function as the model of the nodes (or roles) it serves"
        )


class _DaemonPool:
    """Daemon threads for plain functions, reused; a new one whenever none is idle.

    Not ``asyncio.to_thread``: the default executor's threads are joined when the loop
    closes, so a cancelled call that still blocks would hold the process's exit (``ctl
    stop --now``, SIGINT) until it returned. Here a cancelled call's thread is abandoned
    (it rejoins the pool if its function ever returns) and its late result dropped. A
    thread per call would be simpler but costs ~4x echo's time per node (decision 170).
    """

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads between jobs; never more than the jobs they can take

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            grow = self._idle == 0
            if not grow:
                self._idle -= 1
        if grow:
            threading.Thread(target=self._serve, name="steerflow-fn", daemon=True).start()
        self._work.put(job)

    def _serve(self) -> None:
        while True:
            self._work.get()()
            with self._lock:
                self._idle += 1


_POOL = _DaemonPool()


def _routed(function: Callable[[NodeCall], Any], call: NodeCall, sink: Sink) -> Any:
    with routed_stdout(sink):
        return function(call)


async def _in_daemon_thread(function: Callable[[NodeCall], Any], call: NodeCall, sink: Sink) -> Any:
    """Run ``function(call)`` on a pool thread, its prints to ``sink``.

    Its result is awaited without blocking the loop.
    """
    return await in_daemon_thread(functools.partial(_routed, function, call, sink))


async def in_daemon_thread(job: Callable[[], T]) -> T:
    """``job()`` on a daemon pool thread (see :class:`_DaemonPool`), awaited off the loop.

    Cancelling the await abandons the thread: a blocked ``job`` never holds the process's
    exit. ``python:`` tools run here too (issue 39 item 5). The caller's context variables
    are the job's.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():  # cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def work() -> None:
        try:
            value = context.run(job)
        except Exception as exc:  # delivered to the awaiting task, not lost in the thread
            _deliver(loop, settle, None, exc)
        except BaseException as exc:  # SystemExit in a node must not end the run's process
            _deliver(loop, settle, None, RuntimeError(_one_line(exc)))
        else:
            _deliver(loop, settle, value, None)

    _POOL.submit(work)
    return await future


def _deliver(
    loop: asyncio.AbstractEventLoop,
    settle: Callable[[Any, BaseException | None], None],
    value: Any,
    error: BaseException | None,
) -> None:
    # RuntimeError: the loop closed while the thread ran, so nobody is waiting
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(settle, value, error)


def _structured(spec: str, result: object) -> ProviderResponse:
    """A node with an ``output_schema``: the function's return value is its output.

    A pydantic model is dumped in JSON mode, a dataclass instance as its fields; any other
    value must already be plain JSON (dict, list, str, number, bool). The executor
    validates it against the schema like a model's reply.
    """
    import dataclasses
    import json

    value: object = result
    if hasattr(result, "model_dump") and callable(result.model_dump):
        value = result.model_dump(mode="json")
    elif dataclasses.is_dataclass(result) and not isinstance(result, type):
        value = dataclasses.asdict(result)
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise FunctionNodeError(
            spec, f"returned {type(result).__name__}, which is not JSON ({exc})"
        ) from None
    return ProviderResponse(text=text, output=value)
