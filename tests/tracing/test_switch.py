"""The switch (decision 380): the flag wins, else ``STEERFLOW_OTEL``; a bad value is exit 2."""

from __future__ import annotations

import pytest

from steerflow.errors import UsageError
from steerflow.tracing import tracing_requested


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        (None, None, False),
        (None, "1", True),
        (None, "TRUE", True),
        (None, "0", False),
        (None, "", False),
        (False, "1", False),  # FlowOptions(otel=False) beats the environment
        (True, "0", True),  # --otel beats it too
    ],
)
def test_the_flag_wins_else_the_environment(
    flag: bool | None, env: str | None, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is None:
        monkeypatch.delenv("STEERFLOW_OTEL", raising=False)
    else:
        monkeypatch.setenv("STEERFLOW_OTEL", env)
    assert tracing_requested(flag) is expected


def test_a_value_that_is_neither_on_nor_off_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STEERFLOW_OTEL", "maybe")
    with pytest.raises(UsageError, match=r"STEERFLOW_OTEL='maybe': expected 1 or 0"):
        tracing_requested(None)
