"""Recovery views: the checkpoint recovery report and a resume preflight.

The report is read with ``checkpoint.load_state``, the loader every reader and the
resume share. The preflight runs the very code of ``steerflow resume --dry-run``
(``orchestrate.prepare_resume``, then a dry ``FlowRun``; for an agent run
``prepare_agent_resume``), so what it says would be replayed, would run, or refuses
is what the resume would do, including the operator messages of the chain that a
dead process left behind (``stranded_messages``, issue 26).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steerflow.checkpoint import CHECKPOINT_FILENAME, load_state
from steerflow.errors import CheckpointRecoveryError, SteerflowError, UsageError
from steerflow.resume import RunTarget, resolve_run_target

__all__ = [
    "CheckpointReport",
    "PreflightRefusal",
    "ResumePreflight",
    "checkpoint_report",
    "resume_preflight",
]


@dataclass(frozen=True)
class CheckpointReport:
    """How a run's checkpoint loads: ``clean``, ``recovered_prefix``, ``refused`` or ``missing``."""

    run_id: str
    session_id: str | None
    path: Path
    #: ``missing`` when the run saved no checkpoint, else the report's ``status``.
    status: str
    version: int | None
    #: The ``checkpoint_recovery`` report (CONTRACT §8), None when the file is missing.
    report: dict[str, Any] | None
    #: Why the loader refused the checkpoint, else None.
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON object: ids, path, status, version, the report and the refusal."""
        return {
            "run_id": self.run_id,
            "session_id": self.session_id,
            "path": str(self.path),
            "status": self.status,
            "version": self.version,
            "checkpoint_recovery": self.report,
            "error": self.error,
        }


def checkpoint_report(home: Path, target: str) -> CheckpointReport:
    """Load run ``target``'s checkpoint and report how (never raising for a refusal).

    Raises:
        UnknownIdError, AmbiguousIdError: ``target`` names no run or several.
    """
    run = resolve_run_target(home, target)
    path = run.run_dir / CHECKPOINT_FILENAME
    if not path.is_file():
        return CheckpointReport(run.run_id, run.session_id, path, "missing", None, None)
    try:
        _, report = load_state(path, v2_lenient=True)
        error = None
    except CheckpointRecoveryError as exc:
        report, error = exc.report, str(exc)
    return CheckpointReport(
        run_id=run.run_id,
        session_id=run.session_id,
        path=path,
        status=str(report.get("status")),
        version=report.get("checkpoint_version"),
        report=report,
        error=error,
    )


@dataclass(frozen=True)
class PreflightRefusal:
    """Why a resume would be refused: the error code, message and exit code it would give."""

    code: str
    message: str
    exit_code: int
    #: For ``artifacts-unsettled``: each artifact that no longer matches.
    unsettled: tuple[dict[str, Any], ...] = ()
    #: For ``checkpoint-recovery-refused``: the loader's report.
    checkpoint_recovery: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``error`` object of ``resume --dry-run --json`` plus what it carries."""
        return {
            "code": self.code,
            "message": self.message,
            "exit_code": self.exit_code,
            "unsettled": list(self.unsettled),
            "checkpoint_recovery": self.checkpoint_recovery,
        }


@dataclass(frozen=True)
class ResumePreflight:
    """What ``steerflow resume TARGET --dry-run`` would do: replay and run, or refuse."""

    run_id: str
    session_id: str | None
    refusal: PreflightRefusal | None
    #: ``{id, kind, status[, error]}`` per node of the resumed graph: ``completed`` ones
    #: are replayed, the others run.
    nodes: tuple[dict[str, Any], ...] = ()
    degraded_context: tuple[str, ...] = ()
    #: ``--rerun-unsettled``: ``{id, unsettled}`` per completed node that runs again.
    rerun_unsettled: tuple[dict[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()
    checkpoint_recovery: dict[str, Any] | None = None
    #: ``agent`` or ``flow`` (a refused preflight that never read the kind: ``flow``).
    kind: str = "flow"
    #: The chain's messages nothing would deliver: ``{control_id, session_id, run_id,
    #: text, sent_at, state, claimant, claimed_by, redelivered_as}`` each.
    stranded_messages: tuple[dict[str, Any], ...] = ()
    #: Calls the source left in flight, which may have been paid (decision 217):
    #: ``{node, attempt, model, started_at, reserved_cost_usd, reserved_tokens, call_id}``.
    in_flight_calls: tuple[dict[str, Any], ...] = ()
    #: ``resume --from NODE``: ``{node, rerun, instruction_edited}``; None otherwise.
    rerun_from: dict[str, Any] | None = None

    @property
    def in_flight_line(self) -> str | None:
        """``3 calls were in flight when the run died and may have been paid: about $…``."""
        from steerflow.orchestrate._resume import in_flight_line

        calls = self.in_flight_calls
        return in_flight_line([c["reserved_cost_usd"] for c in calls]) if calls else None

    @property
    def allowed(self) -> bool:
        """Whether the resume would start."""
        return self.refusal is None

    @property
    def replayed(self) -> list[str]:
        """Nodes whose recorded outcome the resume would replay."""
        return [str(n["id"]) for n in self.nodes if n["status"] == "completed"]

    @property
    def to_run(self) -> list[str]:
        """Nodes the resume would run (again)."""
        return [str(n["id"]) for n in self.nodes if n["status"] != "completed"]

    def to_json(self) -> dict[str, Any]:
        """A JSON object: verdict, refusal, nodes (replayed / to run) and notes."""
        return {
            "run_id": self.run_id,
            "session_id": self.session_id,
            "allowed": self.allowed,
            "refusal": self.refusal.to_json() if self.refusal else None,
            "replayed": self.replayed,
            "to_run": self.to_run,
            "nodes": list(self.nodes),
            "degraded_context": list(self.degraded_context),
            "rerun_unsettled": list(self.rerun_unsettled),
            "warnings": list(self.warnings),
            "checkpoint_recovery": self.checkpoint_recovery,
            "kind": self.kind,
            "stranded_messages": list(self.stranded_messages),
            "in_flight_calls": list(self.in_flight_calls),
            **({"rerun_from": self.rerun_from} if self.rerun_from is not None else {}),
        }


def resume_preflight(
    home: Path,
    target: str,
    *,
    retry_failed: bool = False,
    allow_degraded_context: bool = False,
    fork: bool = False,
    rerun_unsettled: bool = False,
    redeliver_claimed: bool = False,
    from_node: str | None = None,
    instruction: str | None = None,
) -> ResumePreflight:
    """Run ``resume TARGET --dry-run`` (with these flags) and describe its verdict.

    Nothing is claimed, allocated or written. A refusal is returned, not raised; only a
    ``target`` that names no run (or several) raises. Runs an event loop of its own:
    from inside one, call it in a worker thread. ``allow_degraded_context`` and
    ``rerun_unsettled`` do not apply to an agent run (a usage-error refusal, as the CLI),
    nor do ``from_node`` and ``instruction`` (``resume --from NODE --instruction TEXT``).

    Raises:
        UnknownIdError, AmbiguousIdError: ``target`` names no run or several.
    """
    from steerflow.orchestrate import FlowOptions, FlowRun, prepare_resume
    from steerflow.orchestrate._agent_resume import agent_resume_source

    run = resolve_run_target(home, target)
    try:
        agent = agent_resume_source(home, target)
        if agent is not None:
            if allow_degraded_context or rerun_unsettled:
                raise UsageError(
                    "--allow-degraded-context and --rerun-unsettled do not apply to an agent run"
                )
            if from_node is not None or instruction is not None:
                raise UsageError("--from and --instruction do not apply to an agent run")
            return _agent_preflight(home, agent, retry_failed, fork, redeliver_claimed)
        seed = prepare_resume(
            home,
            target,
            retry_failed=retry_failed,
            allow_degraded_context=allow_degraded_context,
            fork=fork,
            rerun_unsettled=rerun_unsettled,
            redeliver_claimed=redeliver_claimed,
            from_node=from_node,
            instruction=instruction,
        )
        options = FlowOptions(resume=seed, dry_run=True, checkpoint_version=3)
        result = asyncio.run(FlowRun(options, home=home).run())
    except SteerflowError as exc:
        ids = exc.source_ids or {}
        return ResumePreflight(
            run_id=run.run_id,
            session_id=ids.get("session_id") or run.session_id,
            refusal=PreflightRefusal(
                code=exc.code,
                message=str(exc),
                exit_code=int(exc.exit_code),
                unsettled=tuple(getattr(exc, "unsettled", None) or ()),
                checkpoint_recovery=getattr(exc, "report", None),
            ),
            checkpoint_recovery=getattr(exc, "report", None),
        )
    return ResumePreflight(
        run_id=run.run_id,
        session_id=seed.resumed_from,
        refusal=None,
        nodes=tuple(result.nodes),
        degraded_context=tuple(result.degraded_context),
        rerun_unsettled=tuple(result.rerun_unsettled),
        warnings=tuple(result.warnings),
        checkpoint_recovery=result.checkpoint_recovery,
        stranded_messages=tuple(result.stranded_messages),
        in_flight_calls=tuple(result.in_flight_calls),
        rerun_from=result.rerun_from,
    )


def _agent_preflight(
    home: Path, run: RunTarget, retry_failed: bool, fork: bool, redeliver_claimed: bool
) -> ResumePreflight:
    """The preflight of an agent run: the turns it replays and the one it runs."""
    from steerflow.orchestrate._agent_resume import agent_replay_nodes, prepare_agent_resume

    seed = prepare_agent_resume(
        home, run, retry_failed=retry_failed, fork=fork, redeliver_claimed=redeliver_claimed
    )
    return ResumePreflight(
        run_id=run.run_id,
        session_id=seed.resumed_from,
        refusal=None,
        nodes=tuple(agent_replay_nodes(seed)),
        warnings=tuple(seed.notes),
        checkpoint_recovery=seed.checkpoint_recovery,
        kind="agent",
        stranded_messages=tuple(m.to_json() for m in seed.stranded),
        in_flight_calls=tuple(call.to_json() for call in seed.in_flight),
    )
