"""The shared retry policy, driven with fake attempts and a recording sleep."""

from __future__ import annotations

import asyncio
import random

import pytest

from steerflow.errors import ProviderError, UsageError
from steerflow.providers._retry import (
    Failure,
    RetryPolicy,
    call_with_retry,
    is_transient_status,
)


class FlakyError(Exception):
    """A scripted attempt failure."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


def _classify(exc: BaseException) -> Failure | None:
    return exc.failure if isinstance(exc, FlakyError) else None


class Script:
    """Attempts that fail as scripted, then succeed."""

    def __init__(self, *failures: Failure) -> None:
        self.failures = list(failures)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise FlakyError(self.failures.pop(0))
        return "ok"


class Sleeps:
    """A sleep that records its delays and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


TRANSIENT = Failure(transient=True, message="HTTP 503: busy")


def test_policy_defaults() -> None:
    policy = RetryPolicy.from_env({})
    assert (policy.max_attempts, policy.total_s) == (4, 60.0)


def test_policy_from_env() -> None:
    policy = RetryPolicy.from_env(
        {"STEERFLOW_PROVIDER_MAX_ATTEMPTS": "7", "STEERFLOW_PROVIDER_BACKOFF_S": "0.01"}
    )
    assert policy.max_attempts == 7
    assert policy.backoff_s == 0.01


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("STEERFLOW_PROVIDER_MAX_ATTEMPTS", "0"),
        ("STEERFLOW_PROVIDER_MAX_ATTEMPTS", "2.5"),
        ("STEERFLOW_PROVIDER_BACKOFF_S", "fast"),
        ("STEERFLOW_PROVIDER_TOTAL_S", "-1"),
        ("STEERFLOW_PROVIDER_TIMEOUT_S", "nan"),
    ],
)
def test_bad_env_values_are_usage_errors(name: str, value: str) -> None:
    with pytest.raises(UsageError, match=name):
        RetryPolicy.from_env({name: value})


def test_full_jitter_stays_under_the_exponential_cap() -> None:
    policy = RetryPolicy(backoff_s=1.0, max_backoff_s=5.0)
    rng = random.Random(7)
    for retry, cap in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (10, 5.0)]:
        draws = [policy.backoff(retry, rng) for _ in range(200)]
        assert all(0.0 <= d <= cap for d in draws)
        assert max(draws) > cap / 2  # jitter spreads over the whole range


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 529])
def test_transient_statuses(status: int) -> None:
    assert is_transient_status(status)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_permanent_statuses(status: int) -> None:
    assert not is_transient_status(status)


async def test_transient_failures_are_retried_until_success() -> None:
    script, sleeps = Script(TRANSIENT, TRANSIENT), Sleeps()
    result = await call_with_retry(
        script, classify=_classify, policy=RetryPolicy(), label="m", sleep=sleeps
    )
    assert result == "ok"
    assert script.calls == 3
    assert len(sleeps.delays) == 2


async def test_attempts_are_bounded() -> None:
    script, sleeps = Script(*[TRANSIENT] * 10), Sleeps()
    with pytest.raises(ProviderError, match="gave up after 4 attempt") as caught:
        await call_with_retry(
            script, classify=_classify, policy=RetryPolicy(), label="m", sleep=sleeps
        )
    assert caught.value.retryable is True
    assert script.calls == 4
    assert len(sleeps.delays) == 3


async def test_total_time_is_bounded() -> None:
    # A server that keeps asking for 8 s pauses exhausts a 10 s budget after two attempts.
    slow = Failure(transient=True, message="HTTP 429", retry_after=8.0)
    script = Script(*[slow] * 10)

    now = [0.0]

    class Clock(Sleeps):
        async def __call__(self, delay: float) -> None:
            self.delays.append(delay)
            now[0] += delay

    sleeps = Clock()
    policy = RetryPolicy(max_attempts=10, total_s=10.0, max_backoff_s=8.0)
    with pytest.raises(ProviderError, match="budget") as caught:
        await call_with_retry(
            script,
            classify=_classify,
            policy=policy,
            label="m",
            sleep=sleeps,
            clock=lambda: now[0],
        )
    assert caught.value.retryable is True
    assert script.calls == 2
    assert sleeps.delays == [8.0]


async def test_retry_after_is_honoured_up_to_the_cap() -> None:
    script, sleeps = Script(Failure(True, "HTTP 429", retry_after=3.0)), Sleeps()
    policy = RetryPolicy(backoff_s=0.01, max_backoff_s=2.0)
    await call_with_retry(script, classify=_classify, policy=policy, label="m", sleep=sleeps)
    assert sleeps.delays == [2.0]


async def test_permanent_failure_is_immediate() -> None:
    script, sleeps = Script(Failure(transient=False, message="HTTP 401: no")), Sleeps()
    with pytest.raises(ProviderError, match="HTTP 401") as caught:
        await call_with_retry(
            script, classify=_classify, policy=RetryPolicy(), label="m", sleep=sleeps
        )
    assert caught.value.retryable is False
    assert script.calls == 1
    assert sleeps.delays == []


async def test_unknown_exceptions_propagate_unchanged() -> None:
    async def broken() -> str:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        await call_with_retry(broken, classify=_classify, policy=RetryPolicy(), label="m")


async def test_per_call_timeout_counts_as_transient() -> None:
    calls = 0

    async def slow_then_fast() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.Event().wait()  # never set: only the timeout ends it
        return "ok"

    result = await call_with_retry(
        slow_then_fast,
        classify=_classify,
        policy=RetryPolicy(backoff_s=0.0),
        label="m",
        timeout_s=0.05,
    )
    assert (result, calls) == ("ok", 2)


async def test_cancellation_is_not_retried() -> None:
    started = asyncio.Event()
    calls = 0

    async def hang() -> str:
        nonlocal calls
        calls += 1
        started.set()
        await asyncio.Event().wait()
        return "never"

    task = asyncio.create_task(
        call_with_retry(hang, classify=_classify, policy=RetryPolicy(), label="m")
    )
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == 1
