"""Tracing tests: the SDK's in-memory exporter behind a global tracer provider.

A global provider can be set once per process: this worker's one stays for the session,
and each test reads only the spans it made (the exporter is cleared before it).
That is also the case issue 45 item 2 names: an application's own provider, used as is.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER = InMemorySpanExporter()


def _install() -> None:
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _install()
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()
