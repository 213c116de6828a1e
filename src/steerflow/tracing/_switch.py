"""Whether a run is traced: ``--otel``/``otel=True``, else ``STEERFLOW_OTEL=1``.

Kept free of ``opentelemetry`` imports: every run asks this, and a run without the
switch must not pay for the SDK (issue 45 item 3).
"""

from __future__ import annotations

import os

from steerflow.errors import UsageError

__all__ = ["INSTALL_HINT", "OTEL_ENV", "tracing_requested"]

#: The environment switch (CONTRACT §12 "Traces").
OTEL_ENV = "STEERFLOW_OTEL"
INSTALL_HINT = "pip install 'steerflow[otel]'"
_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"", "0", "false", "no", "off"})


def tracing_requested(flag: bool | None) -> bool:
    """``flag`` when given (``--otel``, ``FlowOptions(otel=...)``), else the environment.

    Raises:
        UsageError: ``STEERFLOW_OTEL`` holds something that is neither on nor off.
    """
    if flag is not None:
        return flag
    raw = os.environ.get(OTEL_ENV, "").strip().lower()
    if raw in _ON:
        return True
    if raw in _OFF:
        return False
    raise UsageError(f"{OTEL_ENV}={os.environ[OTEL_ENV]!r}: expected 1 or 0")
