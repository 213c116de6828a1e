"""A cancel scope around one awaited call that records who cancelled it."""

from __future__ import annotations

import asyncio
from types import TracebackType

__all__ = ["CallScope"]


class CallScope:
    """Cancel the call awaited inside ``with scope:`` and say why.

    The canceller calls :meth:`cancel` with a reason (a signal name, ``deadline``); the
    reason is recorded before the task is cancelled, so afterwards ``cancelled_by`` is a
    fact rather than a guess. The scope swallows only the cancellation it caused: when the
    task was also cancelled from elsewhere (its caller, the task group), the
    ``CancelledError`` propagates. The code after the ``with`` block checks
    ``cancelled_by``, as with anyio's ``CancelScope.cancelled_caught``.

    A scope is used once, inside the task it cancels.
    """

    def __init__(self) -> None:
        self.cancelled_by: str | None = None
        self._task: asyncio.Task[object] | None = None
        self._active = False

    @property
    def active(self) -> bool:
        """True while the ``with`` block runs (only then can :meth:`cancel` reach the call)."""
        return self._active

    def __enter__(self) -> CallScope:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("CallScope must be entered inside a task")
        self._task = task
        self._active = True
        return self

    def cancel(self, reason: str) -> bool:
        """Record ``reason``, then cancel the call; False if none runs or one was cancelled."""
        if not self._active or self.cancelled_by is not None or self._task is None:
            return False
        self.cancelled_by = reason
        self._task.cancel()
        return True

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._active = False
        if self.cancelled_by is None or self._task is None:
            return False
        # Undo our own cancel request; one still counted came from someone else.
        others = self._task.uncancel()
        return exc_type is asyncio.CancelledError and others == 0
