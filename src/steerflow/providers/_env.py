"""Numbers read from the environment, shared by the retry policy and the vendors."""

from __future__ import annotations

import math
from collections.abc import Mapping

from steerflow.errors import UsageError

__all__ = ["env_float"]


def env_float(env: Mapping[str, str], name: str, default: float, *, minimum: float = 0.0) -> float:
    """Read a non-negative number from the environment.

    Args:
        env: The environment mapping.
        name: Variable name.
        default: Value when the variable is unset or empty.
        minimum: Smallest accepted value.

    Returns:
        The parsed value, or ``default``.

    Raises:
        UsageError: The value is not a finite number >= ``minimum``.
    """
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value) or value < minimum:
        raise UsageError(f"{name}={raw!r} must be a finite number >= {minimum:g}")
    return value
