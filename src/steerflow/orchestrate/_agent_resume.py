"""Resume of an ``agent`` run: replay its finished turns, run the one it was in, go on.

``steerflow resume TARGET`` asks :func:`agent_resume_source` first; a target whose
checkpoint says ``kind: agent`` is prepared here, every other one as a flow.
Every check runs before the resume claims its source or creates anything.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from steerflow.checkpoint import CHECKPOINT_FILENAME, CheckpointState, load_state
from steerflow.errors import CheckpointRecoveryError, FlowResumeError, SteerflowError
from steerflow.orchestrate._agent_options import DEFAULT_MAX_TURNS, AgentSeed, TurnOutcome
from steerflow.orchestrate._agent_state import (
    AGENT_CONTEXT_KEY,
    AGENT_KIND,
    is_agent_state,
    read_turns,
)
from steerflow.orchestrate._claim import preflight_claim
from steerflow.resume import RunTarget, resolve_run_target
from steerflow.state import StateDB, db_exists

__all__ = ["agent_resume_source", "prepare_agent_resume"]


def agent_resume_source(home: Path, target: str) -> RunTarget | None:
    """The resolved run when ``target`` is an agent run, else ``None`` (resume it as a flow).

    A checkpoint that cannot be read is left to the flow path, which reports it.
    """
    run = resolve_run_target(home, target)
    kind = _session_kind(home, run.session_id)
    if kind is not None and kind != AGENT_KIND:
        return None  # a flow: its (maybe large) checkpoint is loaded once, by the flow resume
    checkpoint = run.run_dir / CHECKPOINT_FILENAME
    if not checkpoint.is_file():
        return None
    try:
        state, _ = load_state(checkpoint, v2_lenient=True)
    except CheckpointRecoveryError:
        return None
    return run if is_agent_state(state) else None


def _session_kind(home: Path, session_id: str | None) -> str | None:
    if session_id is None or not db_exists(home):
        return None
    with StateDB.open(home, create=False) as db:
        session = db.get_session(session_id)
    return session.kind if session is not None else None


def prepare_agent_resume(
    home: Path, run: RunTarget, *, retry_failed: bool = False, fork: bool = False
) -> AgentSeed:
    """Load and check an agent run's checkpoint; what the resumed run replays and runs.

    Raises:
        ResumeClaimedError: The source still runs, or another resume holds it (not ``fork``).
        CheckpointRecoveryError: The checkpoint is refused by the loader.
        FlowResumeError: The turns cannot be replayed faithfully (see
            :meth:`~steerflow.orchestrate._agent_state.AgentTurns.refuse_if_unfaithful`).
    """
    try:
        return _prepare(home, run, retry_failed=retry_failed, fork=fork)
    except SteerflowError as exc:
        exc.source_ids = {"session_id": run.session_id, "run_id": run.run_id}
        raise


def _prepare(home: Path, run: RunTarget, *, retry_failed: bool, fork: bool) -> AgentSeed:
    preflight_claim(home, run.run_id, fork=fork)
    state, report = load_state(run.run_dir / CHECKPOINT_FILENAME, v2_lenient=True)
    session_id = state.session_id or run.session_id
    if not session_id:
        raise FlowResumeError(f"checkpoint of run {run.run_id} records no session_id")
    turns = read_turns(state)
    turns.refuse_if_unfaithful(run.run_id, retry_failed=retry_failed)
    assert turns.model is not None  # refused above otherwise
    replayed = [
        TurnOutcome(
            number=t.number,
            status=t.entry.status,
            instruction=t.instruction or "",
            response=t.entry.response if isinstance(t.entry.response, str) else None,
            controls=t.controls,
            replayed=True,
            conversation=t.conversation,
        )
        for t in turns.turns
    ]
    next_instruction, next_controls = turns.next_instruction, turns.next_controls
    if replayed and replayed[-1].status == "failed":  # --retry-failed: that turn runs again
        failed = replayed.pop()
        next_instruction, next_controls = failed.instruction, failed.controls
    if replayed and turns.conversation is not None:
        # The resumed checkpoint keeps the worker's session on its last entry (an older
        # checkpoint kept it in the flow context, which the resumed run no longer uses).
        replayed[-1] = replace(replayed[-1], conversation=turns.conversation)
    # Turns, their prompts and controls now live in the entries (decision 112).
    context = {k: v for k, v in state.flow_context.items() if k != AGENT_CONTEXT_KEY}
    return AgentSeed(
        task=state.prompt,
        model=turns.model,
        max_turns=turns.max_turns or DEFAULT_MAX_TURNS,
        artifact_root=_artifact_root(state, run.run_dir),
        resumed_from=session_id,
        source_run_id=run.run_id,
        turns=replayed,
        next_instruction=next_instruction,
        next_controls=next_controls,
        conversation=turns.conversation,
        flow_context=context,
        checkpoint_recovery=report,
        fork=fork,
    )


def _artifact_root(state: CheckpointState, run_dir: Path) -> Path:
    """The source's leg root: a resumed worker continues in the directory it worked in."""
    recorded = state.config.get("artifact_root")
    if isinstance(recorded, str) and recorded:
        return Path(recorded)
    return run_dir / "artifacts"
