"""OpenTelemetry traces of a run (issue 45, extra ``otel``; docs/tracing.md).

Nothing here imports ``opentelemetry`` at load time: :func:`tracing_requested` is all a
run without tracing touches (decision 380). With the switch on, the runner imports
:mod:`steerflow.tracing._run` and hands it the events it already emits.
"""

from __future__ import annotations

from steerflow.tracing._switch import OTEL_ENV, tracing_requested

__all__ = ["OTEL_ENV", "tracing_requested"]
