"""The tracer a run uses: the application's own provider, or one of ours over OTLP/HTTP.

An application that already set a global tracer provider (Logfire, Phoenix's
``register``, its own SDK set-up) gets steerflow's spans in it, as it is: nothing of its
configuration is touched (decision 381). Otherwise one process-wide provider is built
the SDK's standard way: ``Resource.create()`` reads ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES``, ``OTLPSpanExporter()`` reads
``OTEL_EXPORTER_OTLP_ENDPOINT``/``OTEL_EXPORTER_OTLP_HEADERS`` (and their ``TRACES_``
forms), and a ``BatchSpanProcessor`` exports on its own thread, never on the run's loop.

An endpoint that cannot be reached costs one connection attempt: the exporter's
session then refuses at once, without the SDK's backoff retries, spans are dropped and
one warning says so (decision 382).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

import requests
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

__all__ = ["TracerHandle", "tracer_handle"]

_log = logging.getLogger("steerflow.tracing")
#: The exporter's own logger: its retry and failure lines are replaced by our one warning.
_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.common.http",
)
_MARK = "steerflow-otlp-unreachable"
#: Longest a run's end waits for its spans to leave (an endpoint that answers takes ms).
FLUSH_TIMEOUT_MS = 5000


class _UnreachableError(RuntimeError):
    """Raised by the session instead of a connection error: the SDK does not retry it."""


class _OneShotSession(requests.Session):
    """A requests session that gives up on an endpoint after it could not connect.

    The SDK retries a connection error with backoff until its timeout (10 s by default)
    and logs each try; a run's spans are not worth that. One immediate retry covers a
    stale pooled connection; after that the endpoint counts as unreachable.
    """

    def __init__(self) -> None:
        super().__init__()
        self.unreachable: str | None = None

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kw: Any) -> Any:
        if self.unreachable is not None:
            raise _UnreachableError(_MARK)
        for attempt in (1, 2):
            try:
                return super().request(_text(method), _text(url), *args, **kw)
            except (requests.ConnectionError, requests.Timeout) as exc:
                if attempt == 2:
                    self.unreachable = f"{_text(url)} cannot be reached ({type(exc).__name__})"
        raise _UnreachableError(_MARK)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _QuietFilter(logging.Filter):
    """Drops the exporter's lines about our own refusal (the one warning says it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _MARK not in record.getMessage()


class _GuardedExporter(SpanExporter):
    """The OTLP exporter, with one warning the first time its endpoint is unreachable."""

    def __init__(self, inner: SpanExporter, session: _OneShotSession) -> None:
        self.inner = inner
        self.session = session
        self.warned = False
        self.dropped = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.session.unreachable is not None:
            self.dropped += len(spans)
            return SpanExportResult.FAILURE
        result = self.inner.export(spans)
        if self.session.unreachable is not None:
            self.dropped += len(spans)
            if not self.warned:
                self.warned = True
                _log.warning(
                    "steerflow: traces: the OTLP endpoint %s; this process's spans are "
                    "dropped (the run goes on)",
                    self.session.unreachable,
                )
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class TracerHandle:
    """The tracer and whether steerflow owns its provider (then it flushes it)."""

    def __init__(self, tracer: trace.Tracer, provider: TracerProvider | None) -> None:
        self.tracer = tracer
        #: Ours, or None: an application's provider is flushed by the application.
        self.provider = provider

    @property
    def own(self) -> bool:
        """Whether the provider is steerflow's (no application provider was set)."""
        return self.provider is not None

    def flush(self) -> None:
        """Export what is batched (ours only), waiting at most ``FLUSH_TIMEOUT_MS``."""
        if self.provider is not None:
            self.provider.force_flush(FLUSH_TIMEOUT_MS)


_lock = threading.Lock()
_own: TracerProvider | None = None


def _version() -> str:
    # Called in a thread (the run's tracer is built off the loop): metadata is a disk read.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("steerflow")
    except PackageNotFoundError:  # a source tree without metadata
        return "0"


def _build_provider() -> TracerProvider:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    attributes: dict[str, str] = {}
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        attributes[SERVICE_NAME] = "steerflow"  # the SDK's default is unknown_service
    # No shutdown at exit: each run flushed its spans when it ended (bounded), and the SDK's
    # exit hook would wait out a request to an endpoint that never answers (decision 382).
    provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
    session = _OneShotSession()
    for name in _EXPORTER_LOGGERS:
        logging.getLogger(name).addFilter(_QuietFilter())
    exporter = _GuardedExporter(OTLPSpanExporter(session=session), session)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def tracer_handle() -> TracerHandle:
    """The application's global provider if it set one, else steerflow's own (built once)."""
    global _own
    current = trace.get_tracer_provider()
    if not isinstance(current, trace.ProxyTracerProvider) and current is not _own:
        return TracerHandle(current.get_tracer("steerflow", _version()), None)
    with _lock:
        if _own is None:
            _own = _build_provider()
        return TracerHandle(_own.get_tracer("steerflow", _version()), _own)
