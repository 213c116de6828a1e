"""Every error steerflow raises on purpose, and the exit codes of the contract.

The tree is shallow on purpose; the CLI maps classes to exit codes in one place
(``steerflow.cli._app``) by reading ``exit_code``::

    SteerflowError                      1
     |- UsageError                      2   bad flags, plan file or script key
     |   '- PlanValidationError         2   a plan/playbook that does not validate
     |- RefusedError                    3
     |   |- AmbiguousIdError            3   a prefix that matches several ids
     |   |- UnknownIdError              3   an id nothing matches
     |   |- NotRunningError             3   a control aimed at a finished session
     |   |- KindNotAllowedError         3   a control aimed at a kind with no consumer
     |   |- ControlNotApplyingError     3   ``ctl resolve`` on a row not in ``applying``
     |   |- FlowResumeError             3   a resume that cannot be made faithful
     |   |- CheckpointRecoveryError     3   the loader refused a checkpoint (``.report``)
     |   '- DatabaseBusyError           3   a lock wait ran past its bound
     |- ProviderError                   1   a model call failed (``retryable``)
     '- PersistenceError                1   a checkpoint write failed or is uncertain
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import Any, ClassVar

__all__ = [
    "AmbiguousIdError",
    "CheckpointRecoveryError",
    "ControlNotApplyingError",
    "DatabaseBusyError",
    "ExitCode",
    "FlowResumeError",
    "KindNotAllowedError",
    "NotRunningError",
    "PersistenceError",
    "PlanValidationError",
    "ProviderError",
    "RefusedError",
    "SteerflowError",
    "UnknownIdError",
    "UsageError",
]


class ExitCode(IntEnum):
    """Process exit codes of CONTRACT §3."""

    OK = 0
    FAILED = 1
    USAGE = 2
    REFUSED = 3
    DEADLINE = 124
    SIGINT = 130
    SIGTERM = 143


class SteerflowError(Exception):
    """Base class for every error steerflow raises on purpose."""

    code: ClassVar[str] = "error"
    exit_code: ClassVar[ExitCode] = ExitCode.FAILED


class UsageError(SteerflowError):
    """Bad flags, a bad plan file, or an unknown key in a script file."""

    code = "usage"
    exit_code = ExitCode.USAGE


class PlanValidationError(UsageError):
    """A plan or playbook failed validation; the message names the file and field."""

    code = "plan-invalid"


class RefusedError(SteerflowError):
    """The request was understood and refused; nothing was changed."""

    code = "refused"
    exit_code = ExitCode.REFUSED


class AmbiguousIdError(RefusedError):
    """A short prefix matched more than one id."""

    code = "ambiguous-id"


class UnknownIdError(RefusedError):
    """No session, invocation, play or run matched the target."""

    code = "unknown-id"


class NotRunningError(RefusedError):
    """A control was aimed at a session that is not running."""

    code = "not-running"


class KindNotAllowedError(RefusedError):
    """A control was aimed at an invocation kind that has no consumer for it."""

    code = "kind-not-allowed"


class ControlNotApplyingError(RefusedError):
    """``ctl resolve`` was aimed at a control row that is not in ``applying``."""

    code = "control-not-applying"


class FlowResumeError(RefusedError):
    """A resume that cannot be made faithful, or whose target is missing."""

    code = "resume-refused"


class CheckpointRecoveryError(RefusedError):
    """The loader refused a checkpoint; ``report`` says where and why."""

    code = "checkpoint-recovery-refused"

    def __init__(self, report: Mapping[str, Any], message: str | None = None) -> None:
        super().__init__(message or _describe_refusal(report))
        self.report = dict(report)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.report, str(self)))


class DatabaseBusyError(RefusedError):
    """A state-DB lock wait ran past its bound (10 s by default)."""

    code = "database-busy"


class ProviderError(SteerflowError):
    """A model or agent worker call failed."""

    code = "provider-error"

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class PersistenceError(SteerflowError):
    """A checkpoint write failed, or its outcome is uncertain and the writer stopped."""

    code = "persistence-error"


def _describe_refusal(report: Mapping[str, Any]) -> str:
    refusal = report.get("refusal") or {}
    if isinstance(refusal, Mapping):
        where = ", ".join(
            f"{key}={refusal[key]!r}"
            for key in ("seq", "line", "byte_offset")
            if refusal.get(key) is not None
        )
        reason = refusal.get("reason", "unknown")
        return f"checkpoint recovery refused: {reason}" + (f" ({where})" if where else "")
    return "checkpoint recovery refused"
