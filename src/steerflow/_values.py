"""The checks of option values that the command line and the Python API share.

Each check takes the value and the name to blame: the CLI passes its flag
(``--timeout``), the API its parameter (``timeout_s``). So both refuse exactly the same
values, for the same reason, each naming what its caller wrote (docs/decisions.md,
decision 245). A refusal is an :class:`~steerflow.errors.InvalidValueError` (a
``UsageError``: exit 2).

Values arrive typed: the CLI's option types parse the text first (``'12x' is not an
integer``) and hand the number over; the API takes numbers only, so ``"5"`` for a number
of seconds is refused, never parsed, and ``True`` is not the integer 1.

Layer 0 and standard library only: ``ctl`` imports it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TypeVar

from steerflow.errors import ECHO_LIMIT, InvalidValueError, quote_input

__all__ = [
    "CHECKPOINT_VERSIONS",
    "EXECUTORS",
    "MAX_CONCURRENCY",
    "one_of",
    "positive_seconds",
    "positive_usd",
    "shown",
    "some_text",
    "whole_number",
]

#: ``--concurrency`` / ``concurrency``: operations running at once (a plan's key too).
MAX_CONCURRENCY = 256
#: ``--checkpoint-version`` / ``checkpoint_version``.
CHECKPOINT_VERSIONS = (2, 3, 4)
#: ``--executor`` / ``executor`` (CONTRACT §11).
EXECUTORS = ("local", "ray")

T = TypeVar("T")


def shown(value: object) -> str:
    """A value as a refusal quotes it: text with quotes, anything else by its repr, bounded."""
    if isinstance(value, str):
        return quote_input(value)
    try:
        text = repr(value)
    except ValueError:  # an int past the interpreter's digit limit
        return f"an integer of {value.bit_length()} bits" if isinstance(value, int) else "?"
    if len(text) <= ECHO_LIMIT:
        return text
    return f"{text[:ECHO_LIMIT]}... ({len(text)} characters)"


def _number(value: object) -> float | None:
    """``value`` as a float when it is a real number (not a bool, not text), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:  # an int too large for a float: infinite for our purposes
        return math.inf


def positive_seconds(value: object, name: str) -> float:
    """A positive, finite number of seconds (``nan``, ``inf``, 0 and below are refused)."""
    number = _number(value)
    if number is None or not math.isfinite(number) or number <= 0:
        raise InvalidValueError(name, f"{shown(value)} is not a positive, finite number of seconds")
    return number


def positive_usd(value: object, name: str) -> float:
    """A positive, finite amount of USD (a spend cap)."""
    number = _number(value)
    if number is None or not math.isfinite(number) or number <= 0:
        raise InvalidValueError(name, f"{shown(value)} is not a positive, finite number of USD")
    return number


def whole_number(
    value: object, name: str, *, least: int, most: int | None = None, default: int | None = None
) -> int:
    """An integer (not a bool, not a float) from ``least`` to ``most`` (None: no upper bound)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValueError(name, f"{shown(value)} is not an integer")
    if value < least or (most is not None and value > most):
        give = f"{least}..{most}" if most is not None else f"{least} or more"
        if default is not None:
            give += f" (default {default})"
        raise InvalidValueError(name, f"{shown(value)} is out of range: give {give}")
    return value


def one_of(value: T, name: str, choices: Iterable[T]) -> T:
    """``value`` when it is one of ``choices`` (compared with ``==``, bools never match)."""
    options = tuple(choices)
    if isinstance(value, bool) or value not in options:
        listed = ", ".join(shown(choice) for choice in options)
        raise InvalidValueError(name, f"{shown(value)} is not one of {listed}")
    return value


def some_text(value: object, name: str) -> str:
    """A str that is not empty or only whitespace."""
    if not isinstance(value, str):
        raise InvalidValueError(name, f"{shown(value)} is not a str")
    if not value.strip():
        raise InvalidValueError(name, f"{shown(value)} is empty or only whitespace")
    return value
