"""The run's side of its traces (issue 45): open the tracer when asked, close it at the end.

``opentelemetry`` is imported only once tracing is asked for (``otel=True`` or
``STEERFLOW_OTEL=1``); without the ``otel`` extra that is a usage error naming it, said
before anything runs (decision 380). Tracing is never in the way of the run: its end is
recorded and flushed here, in a thread, bounded.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from steerflow.errors import UsageError
from steerflow.home import is_run_id
from steerflow.tracing import tracing_requested

if TYPE_CHECKING:
    from steerflow.tracing._run import RunTracer

__all__ = ["close_trace", "open_trace"]


def _import_tracer() -> type[RunTracer]:
    try:
        from steerflow.tracing._run import RunTracer
    except ImportError as exc:
        if not (exc.name or "").startswith(("opentelemetry", "requests")):
            raise
        from steerflow.tracing._switch import INSTALL_HINT

        raise UsageError(
            f"traces (--otel or STEERFLOW_OTEL=1) need the OpenTelemetry SDK, which is not "
            f"installed: {INSTALL_HINT}"
        ) from None
    return RunTracer


async def open_trace(
    flag: bool | None,
    *,
    home: Path,
    kind: str,
    resumed_from: str | None = None,
    source_run_id: str | None = None,
) -> RunTracer | None:
    """The run's tracer, or None when tracing is off (then nothing was imported)."""
    if not tracing_requested(flag):
        return None

    def begin() -> RunTracer:
        # In a thread: the SDK's import and the source's trace file are disk reads. The
        # thread runs in a copy of this context, so an application's current span is seen.
        tracer_class = _import_tracer()
        source_root = None
        if source_run_id is not None and is_run_id(source_run_id):
            from steerflow.tracing._context import read_root

            source_root = read_root(home / "runs" / source_run_id)
        return tracer_class.begin(kind=kind, resumed_from=resumed_from, source_root=source_root)

    return await asyncio.to_thread(begin)


async def close_trace(
    tracer: RunTracer,
    *,
    status: str,
    exit_code: int | None = None,
    usage: dict[str, Any] | None = None,
    error: BaseException | None = None,
) -> None:
    """End the run's span and send what is batched (off the loop, at most a few seconds)."""
    tracer.end(status=status, exit_code=exit_code, usage=usage, error=error)
    await asyncio.to_thread(tracer.flush)
