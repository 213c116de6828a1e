"""A node's own retries and call limit: plan entry keys ``retry`` and ``timeout_s`` (issue 40).

A try is one provider call with its own write-ahead intent, so a resume counts the tries
earlier runs of its chain made and never lets a node make more than ``1 + attempts``
(decisions 276 and 278). ``timeout_s`` fails one call, not the run: the run-wide
``--timeout`` is a deadline that stops admission, this one is a provider failure like
any other, which the node's retries then apply to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from steerflow.errors import ProviderError, UnsafePathError
from steerflow.executor._graph import Operation
from steerflow.executor._scope import CallScope

if TYPE_CHECKING:
    from steerflow.executor._fence import AdmissionFence
    from steerflow.executor._steer import PauseGate


class _Backoff(Protocol):
    """The call in flight of a node backing off (the executor's ``_Call``)."""

    backing_off: bool


class Runner(Protocol):
    """What the tries need of the executor (``FlowExecutor``)."""

    prior_calls: dict[str, int]
    admission_open: bool
    gate: PauseGate
    fence: AdmissionFence | None

    def inflight_call(self, op: Operation) -> _Backoff | None: ...

    def emit_paused(self, op: Operation) -> None: ...


__all__ = ["TIMEOUT_REASON", "NodeTries", "Runner", "limited", "timeout_error"]

T = TypeVar("T")
R = TypeVar("R")

#: What a call stopped by its node's ``timeout_s`` records as its canceller.
TIMEOUT_REASON = "timeout_s"


def timeout_error(op: Operation) -> ProviderError:
    """The failure of a call that outlived ``op.timeout_s``: names the key and the limit."""
    return ProviderError(
        f"node {op.key!r}: the call took longer than its timeout_s of {op.timeout_s:g} s "
        "and was stopped",
        retryable=True,
    )


async def limited(op: Operation, call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, cancelled once ``op.timeout_s`` has passed (then a :class:`ProviderError`).

    The limit's own :class:`CallScope` swallows only its own cancellation: a stop or
    deadline cancelling the node's call at the same time still reaches the executor's.
    """
    if op.timeout_s is None:
        return await call()
    scope = CallScope()
    timer = asyncio.get_running_loop().call_later(op.timeout_s, scope.cancel, TIMEOUT_REASON)
    try:
        with scope:
            return await call()
    finally:
        timer.cancel()
    raise timeout_error(op)  # only reached when the scope caught its own cancellation


def worth_retrying(exc: ProviderError) -> bool:
    """A failure another try may not repeat: not a path the node may never write."""
    return not isinstance(exc, UnsafePathError)


class NodeTries:
    """Calls ``op`` until one answers or its ``retry.attempts`` are spent (chain-wide)."""

    def __init__(self, executor: Runner, op: Operation) -> None:
        self.executor = executor
        self.op = op

    async def run(self, call: Callable[[], Awaitable[R | None]]) -> R | None:
        """The first answer; None when a try could not be sent (stop, lease, pause).

        Raises:
            ProviderError: The last try's failure, saying how many were made; or, on a
                resume, that earlier runs of the chain already made every try allowed.
        """
        op, attempts = self.op, self.op.retry_attempts
        if attempts is None:
            return await call()
        allowed = 1 + attempts
        before = self.executor.prior_calls.get(op.key, 0)
        if before >= allowed:
            raise ProviderError(
                f"node {op.key!r}: earlier runs of this resume chain already made its "
                f"{before} call(s) (1 + retry.attempts {attempts}), whose results were lost "
                "with the run; it is not called again"
            )
        made = before
        while True:
            made += 1  # counted when sent: a try that raised was made, paid or not
            try:
                return await call()
            except ProviderError as exc:
                if not worth_retrying(exc) or made >= allowed:
                    if made <= 1:
                        raise
                    raise ProviderError(
                        f"{exc} (after {made} calls: retry.attempts is {attempts})",
                        retryable=exc.retryable,
                    ) from exc
            if not await self._wait_for_next():
                return None

    async def _wait_for_next(self) -> bool:
        """Back off, then pass the gate, admission and the lease; False: no more tries.

        A stop during the pause cancels it (``close_admission`` cancels a call backing
        off, even a graceful stop's): the node stays pending, and a resume counts the
        tries made.
        """
        ex, op = self.executor, self.op
        call = ex.inflight_call(op)
        if op.retry_backoff_s > 0:
            if call is not None:
                call.backing_off = True
            try:
                if not ex.admission_open:
                    return False
                await asyncio.sleep(op.retry_backoff_s)
            finally:
                if call is not None:
                    call.backing_off = False
        await ex.gate.wait_open(lambda: ex.emit_paused(op))
        if not ex.admission_open:
            return False
        fence = ex.fence
        return fence is None or fence.fresh() or await fence.hold()
