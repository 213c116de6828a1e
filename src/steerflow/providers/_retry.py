"""The retry policy shared by the network providers.

Each attempt runs under a per-call timeout. Transient failures (HTTP 408, 409,
429, 5xx, connection errors and timeouts) are retried with exponential backoff
and full jitter, bounded both in attempts and in total time; anything else
fails at once. The vendor SDKs' own retries are switched off
(``max_retries=0``) so this module is the single, tested policy.

Environment knobs (read when a provider is built):

* ``STEERFLOW_PROVIDER_MAX_ATTEMPTS`` - attempts per call, default 4.
* ``STEERFLOW_PROVIDER_BACKOFF_S`` - backoff base in seconds, default 0.5.
* ``STEERFLOW_PROVIDER_MAX_BACKOFF_S`` - cap of one backoff sleep, default 8.
* ``STEERFLOW_PROVIDER_TOTAL_S`` - no new attempt starts after this many
  seconds from the first one, default 60.
* ``STEERFLOW_PROVIDER_TIMEOUT_S`` - per-call timeout when the request does
  not carry one, default 300.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from steerflow.errors import ProviderError, UsageError
from steerflow.providers._env import env_float

__all__ = [
    "Failure",
    "RetryPolicy",
    "call_with_retry",
    "classify_sdk_error",
    "is_transient_status",
]

T = TypeVar("T")

_MESSAGE_LIMIT = 500


@dataclass(frozen=True)
class Failure:
    """How one failed attempt is to be treated.

    Attributes:
        transient: True if another attempt may succeed (429, 5xx, network).
        message: A short description for the final error.
        retry_after: Seconds the server asked us to wait, if it said.
    """

    transient: bool
    message: str
    retry_after: float | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds of the retry loop.

    Attributes:
        max_attempts: Attempts per call, at least 1.
        backoff_s: Base of the exponential backoff (first retry waits up to this).
        max_backoff_s: Cap of a single backoff sleep.
        total_s: No new attempt starts once this much time has passed.
        timeout_s: Per-attempt timeout used when the request has none.
    """

    max_attempts: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    total_s: float = 60.0
    timeout_s: float = 300.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetryPolicy:
        """Build the policy from ``STEERFLOW_PROVIDER_*`` variables.

        Args:
            env: The environment to read; ``os.environ`` when None.

        Returns:
            The configured policy, defaults where a variable is unset.

        Raises:
            UsageError: A variable is set to something that is not a valid number.
        """
        env = os.environ if env is None else env
        attempts = env_float(env, "STEERFLOW_PROVIDER_MAX_ATTEMPTS", cls.max_attempts, minimum=1)
        if attempts != int(attempts):
            raise UsageError("STEERFLOW_PROVIDER_MAX_ATTEMPTS must be a whole number")
        return cls(
            max_attempts=int(attempts),
            backoff_s=env_float(env, "STEERFLOW_PROVIDER_BACKOFF_S", cls.backoff_s),
            max_backoff_s=env_float(env, "STEERFLOW_PROVIDER_MAX_BACKOFF_S", cls.max_backoff_s),
            total_s=env_float(env, "STEERFLOW_PROVIDER_TOTAL_S", cls.total_s),
            timeout_s=env_float(env, "STEERFLOW_PROVIDER_TIMEOUT_S", cls.timeout_s, minimum=0.001),
        )

    def backoff(self, retry: int, rng: random.Random | None = None) -> float:
        """Full-jitter sleep before retry number ``retry`` (1 for the first retry).

        Args:
            retry: 1-based index of the retry about to happen.
            rng: Random source (tests pass a seeded one).

        Returns:
            A uniform draw from ``[0, min(max_backoff_s, backoff_s * 2**(retry-1))]``.
        """
        ceiling = min(self.max_backoff_s, self.backoff_s * (2 ** min(retry - 1, 60)))
        return (rng or random).uniform(0.0, ceiling)


def is_transient_status(status: int) -> bool:
    """True for HTTP statuses worth retrying: 408, 409, 429 and every 5xx."""
    return status in (408, 409, 429) or 500 <= status <= 599


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 3] + "..."


def _retry_after(headers: Any) -> float | None:
    """Parse ``retry-after-ms`` / ``retry-after`` (seconds form only)."""
    if headers is None:
        return None
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(header)
        if raw is None:
            continue
        try:
            value = float(raw) / divisor
        except (TypeError, ValueError):
            continue
        if math.isfinite(value) and value >= 0:
            return value
    return None


def classify_sdk_error(sdk: ModuleType, exc: BaseException) -> Failure | None:
    """Classify an exception raised by the ``openai`` or ``anthropic`` SDK.

    Both SDKs share the same exception layout (``APIStatusError`` with
    ``status_code``, ``APIConnectionError`` and its ``APITimeoutError``).

    Args:
        sdk: The imported SDK module.
        exc: The exception an attempt raised.

    Returns:
        The failure classification (other API errors are permanent), or None
        if ``exc`` is not an SDK API error.
    """
    if isinstance(exc, sdk.APIStatusError):
        status = int(exc.status_code)
        response = getattr(exc, "response", None)
        return Failure(
            transient=is_transient_status(status),
            message=f"HTTP {status}: {_short(str(exc))}",
            retry_after=_retry_after(getattr(response, "headers", None)),
        )
    if isinstance(exc, sdk.APITimeoutError):
        return Failure(transient=True, message="request timed out")
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        detail = f" ({_short(str(cause))})" if cause is not None and str(cause) else ""
        return Failure(transient=True, message=f"connection error{detail}")
    if isinstance(exc, sdk.APIError):  # e.g. a reply that does not validate
        return Failure(transient=False, message=f"{type(exc).__name__}: {_short(str(exc))}")
    if isinstance(exc, json.JSONDecodeError):  # the SDK decodes bodies with json.loads
        return Failure(transient=False, message=f"the server's reply is not JSON ({exc})")
    return None


async def call_with_retry(
    call: Callable[[], Awaitable[T]],
    *,
    classify: Callable[[BaseException], Failure | None],
    policy: RetryPolicy,
    label: str,
    timeout_s: float | None = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Run ``call`` under the retry policy.

    Args:
        call: Makes one attempt; called afresh for every attempt.
        classify: Maps an exception to a :class:`Failure`; None re-raises it as is.
        policy: Attempt, backoff and time bounds.
        label: Prefix of error messages (the model spec).
        timeout_s: Per-attempt timeout; ``policy.timeout_s`` when None.
        sleep: Awaitable sleep (injectable for tests).
        rng: Random source for the jitter.
        clock: Monotonic clock (injectable for tests).

    Returns:
        The first successful result.

    Raises:
        ProviderError: Non-transient failure (``retryable=False``) at once, or
            transient failures until attempts or time ran out (``retryable=True``).
        asyncio.CancelledError: The caller was cancelled; propagated unchanged.
    """
    per_call = timeout_s if timeout_s is not None and timeout_s > 0 else policy.timeout_s
    started = clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            async with asyncio.timeout(per_call):
                return await call()
        except ProviderError:
            raise
        except TimeoutError as exc:
            failure = Failure(transient=True, message=f"no reply within {per_call:g} s")
            cause: BaseException = exc
        except Exception as exc:
            found = classify(exc)
            if found is None:
                raise
            failure, cause = found, exc
        if not failure.transient:
            raise ProviderError(f"{label}: {failure.message}", retryable=False) from cause
        elapsed = clock() - started
        if attempt >= policy.max_attempts:
            raise ProviderError(
                f"{label}: gave up after {attempt} attempt(s) in {elapsed:.1f} s: "
                f"{failure.message}",
                retryable=True,
            ) from cause
        delay = policy.backoff(attempt, rng)
        if failure.retry_after is not None:
            delay = max(delay, min(failure.retry_after, policy.max_backoff_s))
        if elapsed + delay >= policy.total_s:
            raise ProviderError(
                f"{label}: gave up after {attempt} attempt(s): retry budget of "
                f"{policy.total_s:g} s spent: {failure.message}",
                retryable=True,
            ) from cause
        await sleep(delay)
