"""Every error steerflow raises on purpose, and the exit codes of the contract.

The tree is shallow on purpose; the CLI maps classes to exit codes in one place
(``steerflow.cli._app``) by reading ``exit_code``::

    SteerflowError                      1
     |- UsageError                      2   bad flags, plan file or script key
     |   |- InvalidValueError           2   one option's value refused (``.parameter``)
     |   '- PlanValidationError         2   a plan/playbook that does not validate
     |- RefusedError                    3
     |   |- AmbiguousIdError            3   a prefix that matches several ids
     |   |- UnknownIdError              3   an id nothing matches
     |   |- NoResponseError             3   ``show --raw`` of a node with no response
     |   |- NotRunningError             3   a control aimed at a finished session
     |   |- KindNotAllowedError         3   a control aimed at a kind with no consumer
     |   |- ControlNotApplyingError     3   ``ctl resolve`` on a row not in ``applying``
     |   |- FlowResumeError             3   a resume that cannot be made faithful
     |   |   |- ResumeClaimedError      3   the source is held or was already resumed
     |   |   |- ArtifactContractError   3   recorded artifacts with no usable persisted contract
     |   |   '- ArtifactsUnsettledError 3   recorded artifacts that no longer match (``.unsettled``)
     |   |- CheckpointRecoveryError     3   the loader refused a checkpoint (``.report``)
     |   |- HomeRefusedError            3   a home we cannot write, or one others can
     |   |- DatabaseBusyError           3   a lock wait ran past its bound
     |   '- LeaseLostError              3   a resume took over this run's lease (``taken over``)
     |- ProviderError                   1   a model call failed (``retryable``)
     |   |- UnsafePathError             1   a leg path would leave its directory (node fails)
     |   '- FunctionNodeError           1   a ``python:`` function raised or returned a non-str
     |- PersistenceError                1   a checkpoint write failed or is uncertain
     '- StateDBLostError                1   the state DB went away under a live run
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import Any, ClassVar

__all__ = [
    "AmbiguousIdError",
    "ArtifactContractError",
    "ArtifactsUnsettledError",
    "CheckpointRecoveryError",
    "ControlNotApplyingError",
    "DatabaseBusyError",
    "ExitCode",
    "FlowResumeError",
    "FunctionNodeError",
    "HomeRefusedError",
    "InvalidValueError",
    "KindNotAllowedError",
    "LeaseLostError",
    "NoResponseError",
    "NotRunningError",
    "PersistenceError",
    "PlanValidationError",
    "ProviderError",
    "RefusedError",
    "ResumeClaimedError",
    "StateDBLostError",
    "SteerflowError",
    "UnknownIdError",
    "UnsafePathError",
    "UsageError",
    "quote_input",
]


class ExitCode(IntEnum):
    """Process exit codes of CONTRACT §3."""

    OK = 0
    FAILED = 1
    USAGE = 2
    REFUSED = 3
    STOPPED = 75
    BUDGET = 76
    DEADLINE = 124
    SIGINT = 130
    SIGTERM = 143


class SteerflowError(Exception):
    """Base class for every error steerflow raises on purpose."""

    code: ClassVar[str] = "error"
    exit_code: ClassVar[ExitCode] = ExitCode.FAILED
    #: The ids (``session_id``, ``run_id``) of the run the error is about, when known:
    #: for a refused resume, its source. ``--json`` prints them with the error.
    source_ids: dict[str, str | None] | None = None


class UsageError(SteerflowError):
    """Bad flags, a bad plan file, or an unknown key in a script file."""

    code = "usage"
    exit_code = ExitCode.USAGE


class InvalidValueError(UsageError):
    """One option's value was refused; the message names the option as the caller wrote it.

    ``parameter`` is the Python parameter (``timeout_s``) when the value came through the
    API, the flag (``--timeout``) or environment variable when it came from the command
    line; ``problem`` is what is wrong with the value, without the name. The CLI and the
    API run the same checks (``steerflow._values``), so they refuse the same values.
    """

    code = "invalid-value"

    def __init__(self, parameter: str, problem: str) -> None:
        super().__init__(f"invalid value for {parameter}: {problem}")
        self.parameter = parameter
        self.problem = problem

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle with both fields (the message is made from them)."""
        return (type(self), (self.parameter, self.problem))


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


class NoResponseError(RefusedError):
    """A node has no response to print (it failed, was skipped, or has not run)."""

    code = "no-response"


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


class ResumeClaimedError(FlowResumeError):
    """One resume per source: another resume holds the source, or already continued it.

    ``holder_session_id`` is the session holding (or that held) the source;
    ``newest_run_id`` is the newest run of the chain to resume instead, when known.
    """

    code = "resume-claimed"

    def __init__(
        self, message: str, *, holder_session_id: str, newest_run_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.holder_session_id = holder_session_id
        self.newest_run_id = newest_run_id

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle with the keyword-only fields, which ``Exception`` alone would drop."""
        return (_rebuild_claimed, (str(self), self.holder_session_id, self.newest_run_id))


def _rebuild_claimed(message: str, holder: str, newest: str | None) -> ResumeClaimedError:
    return ResumeClaimedError(message, holder_session_id=holder, newest_run_id=newest)


class ArtifactContractError(FlowResumeError):
    """A node recorded artifacts, but the contract its run persisted cannot vouch for them.

    Missing, unreadable, or disagreeing with the checkpoint's copy or with what the entry
    records: an absent record is not evidence, so nothing is settled from it.
    """

    code = "artifact-contract-refused"


class ArtifactsUnsettledError(FlowResumeError):
    """Recorded artifacts are missing or changed; ``unsettled`` lists them (JSON objects)."""

    code = "artifacts-unsettled"

    def __init__(self, message: str, *, unsettled: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.unsettled = unsettled

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle with the list, which ``Exception`` alone would drop."""
        return (_rebuild_unsettled, (str(self), self.unsettled))


def _rebuild_unsettled(message: str, unsettled: list[dict[str, Any]]) -> ArtifactsUnsettledError:
    return ArtifactsUnsettledError(message, unsettled=unsettled)


class CheckpointRecoveryError(RefusedError):
    """The loader refused a checkpoint; ``report`` says where and why."""

    code = "checkpoint-recovery-refused"

    def __init__(self, report: Mapping[str, Any], message: str | None = None) -> None:
        super().__init__(message or _describe_refusal(report))
        self.report = dict(report)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle with the report and the exact message."""
        return (type(self), (self.report, str(self)))


class HomeRefusedError(RefusedError):
    """The home cannot be written, or is shared (writable by others, or not ours)."""

    code = "home-refused"


class DatabaseBusyError(RefusedError):
    """A state-DB lock wait ran past its bound (10 s by default)."""

    code = "database-busy"


class LeaseLostError(RefusedError):
    """Another process took over this session's lease (a resume, on any host).

    The holder admits nothing more and exits 3; the message contains ``taken over`` and
    names the run, the new owner's session and host (CONTRACT §11).
    """

    code = "lease-taken-over"

    def __init__(
        self,
        message: str,
        *,
        session_id: str,
        new_session_id: str | None = None,
        new_host: str | None = None,
    ) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.new_session_id = new_session_id
        self.new_host = new_host

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle with the keyword-only fields, which ``Exception`` alone would drop."""
        return (
            _rebuild_lease_lost,
            (str(self), self.session_id, self.new_session_id, self.new_host),
        )


def _rebuild_lease_lost(
    message: str, session_id: str, new_session_id: str | None, new_host: str | None
) -> LeaseLostError:
    return LeaseLostError(
        message, session_id=session_id, new_session_id=new_session_id, new_host=new_host
    )


class StateDBLostError(SteerflowError):
    """The state database went away under a live run.

    Deleted, replaced, made unwritable, its session row gone, or unreachable for longer
    than the lease.

    The run stops admitting; what it completed stays resumable from its checkpoint.
    """

    code = "state-db-lost"


class ProviderError(SteerflowError):
    """A model or agent worker call failed."""

    code = "provider-error"

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class FunctionNodeError(ProviderError):
    """A ``python:MODULE:FUNCTION`` node's function raised, or returned something not a str.

    The node fails with this message, which names the spec and, for a raise, the
    exception's type and text (the exception itself is the ``__cause__``).
    """

    code = "function-node-error"

    def __init__(self, spec: str, problem: str) -> None:
        super().__init__(f"{spec} {problem}")
        self.spec = spec


class UnsafePathError(ProviderError):
    """A leg directory, or a path written inside one, would leave it (``..``, absolute, symlink).

    Raised while running a node; the node fails with this message, the run goes on.
    """

    code = "unsafe-path"


class PersistenceError(SteerflowError):
    """A checkpoint write failed, or its outcome is uncertain and the writer stopped."""

    code = "persistence-error"


def _describe_refusal(report: Mapping[str, Any]) -> str:
    refusal = report.get("refusal") or {}
    if isinstance(refusal, Mapping):
        where = ", ".join(
            f"{key}={refusal[key]!r}"
            for key in ("file", "entry", "seq", "line", "byte_offset")
            if refusal.get(key) is not None
        )
        reason = refusal.get("reason", "unknown")
        return f"checkpoint recovery refused: {reason}" + (f" ({where})" if where else "")
    return "checkpoint recovery refused"


#: How much of a user-supplied target an error line echoes.
ECHO_LIMIT = 200


def quote_input(value: object, limit: int = ECHO_LIMIT) -> str:
    """``repr`` of user input for an error line, at most ``limit`` characters of it.

    A pasted log or a whole file given as a TARGET must not flood the terminal; the
    length says how much was left out.
    """
    text = str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"
