"""Resume of an ``agent`` run: replay its finished turns, run the one it was in, go on.

``steerflow resume TARGET`` asks :func:`agent_resume_source` first; a target whose
checkpoint says ``kind: agent`` is prepared here, every other one as a flow.
Every check runs before the resume claims its source or creates anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from steerflow.checkpoint import CHECKPOINT_FILENAME, CheckpointState, load_state
from steerflow.errors import (
    CheckpointRecoveryError,
    FlowResumeError,
    InvalidValueError,
    SteerflowError,
)
from steerflow.executor import Caps
from steerflow.orchestrate._agent_options import (
    DEFAULT_MAX_TURNS,
    AgentSeed,
    TurnOutcome,
    checked_mcp_servers,
)
from steerflow.orchestrate._agent_state import (
    AGENT_CONTEXT_KEY,
    AGENT_KIND,
    is_agent_state,
    read_turns,
    turn_key,
)
from steerflow.orchestrate._claim import preflight_claim
from steerflow.orchestrate._resume import chain_doubt, check_tool_calls, in_flight_notes
from steerflow.orchestrate._stranded import ChainControls, read_chain, stranded_notes
from steerflow.providers import Usage
from steerflow.resume import RunTarget, resolve_run_target
from steerflow.state import ControlRow, SessionRow, StateDB, db_exists

__all__ = ["agent_replay_nodes", "agent_resume_source", "prepare_agent_resume"]


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
    home: Path,
    run: RunTarget,
    *,
    retry_failed: bool = False,
    fork: bool = False,
    redeliver_claimed: bool = False,
    tool_calls: Mapping[str, str] | None = None,
) -> AgentSeed:
    """Load and check an agent run's checkpoint; what the resumed run replays and runs.

    Messages of the chain a dead process left behind are listed in ``stranded`` (and the
    notes); ``redeliver_claimed`` re-queues the claimed ones too (issue 26).

    Raises:
        ResumeClaimedError: The source still runs, or another resume holds it (not ``fork``).
        CheckpointRecoveryError: The checkpoint is refused by the loader.
        FlowResumeError: The turns cannot be replayed faithfully (see
            :meth:`~steerflow.orchestrate._agent_state.AgentTurns.refuse_if_unfaithful`),
            or a message the state DB says a turn was started with is in none of them.
    """
    try:
        return _prepare(
            home, run, retry_failed=retry_failed, fork=fork,
            redeliver_claimed=redeliver_claimed, tool_calls=dict(tool_calls or {}),
        )  # fmt: skip
    except SteerflowError as exc:
        exc.source_ids = {"session_id": run.session_id, "run_id": run.run_id}
        raise


def _prepare(
    home: Path,
    run: RunTarget,
    *,
    retry_failed: bool,
    fork: bool,
    redeliver_claimed: bool,
    tool_calls: dict[str, str],
) -> AgentSeed:
    preflight_claim(home, run.run_id, fork=fork)
    state, report = load_state(run.run_dir / CHECKPOINT_FILENAME, v2_lenient=True)
    check_tool_calls(state, tool_calls)  # before anything runs: no call left to a guess
    session_id = state.session_id or run.session_id
    if not session_id:
        raise FlowResumeError(f"checkpoint of run {run.run_id} records no session_id")
    turns = read_turns(state)
    turns.refuse_if_unfaithful(run.run_id, retry_failed=retry_failed)
    assert turns.model is not None  # refused above otherwise
    chain = read_chain(home, session_id)
    delivered = {c for t in turns.turns for c in t.controls} | set(turns.next_controls)
    _refuse_unaccounted(run.run_id, chain, delivered, len(turns.turns))
    # The turn in flight's messages: delivered by the turn this resume runs, yet a dead
    # agent may have left their rows applying (killed before the stamp): listed, closed.
    in_flight = {c: turn_key(len(turns.turns) + 1) for c in turns.next_controls}
    stranded = chain.stranded(delivered, _claiming_turn, in_flight)
    doubt = chain_doubt(state)
    replayed = [
        TurnOutcome(
            number=t.number,
            status=t.entry.status,
            instruction=t.instruction or "",
            response=t.entry.response if isinstance(t.entry.response, str) else None,
            controls=t.controls,
            replayed=True,
            conversation=t.conversation,
            usage=used.to_json() if (used := Usage.from_json(t.entry.raw.get("usage"))) else None,
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
        stranded=stranded,
        redeliver_claimed=redeliver_claimed,
        notes=[
            *stranded_notes(stranded, redeliver_claimed=redeliver_claimed),
            *in_flight_notes(state, doubt),
        ],
        caps=_caps(state.config.get("budget")),
        spent=_spent(replayed),
        in_flight=state.in_flight,
        doubt=doubt,
        tools=tuple(str(t) for t in state.config.get("tools") or ()),
        mcp_servers=_mcp_servers(state.config.get("mcp_servers")),
        steps=state.steps,
        tool_decisions=tool_calls,
    )


def _mcp_servers(stored: object) -> dict[str, dict[str, Any]]:
    """The source's ``--mcp-server`` declarations; a malformed record refuses the resume."""
    if stored is None:
        return {}
    try:
        return checked_mcp_servers(stored)
    except InvalidValueError as exc:
        raise FlowResumeError(f"checkpoint config.mcp_servers is malformed: {exc}") from None


def _caps(stored: object) -> Caps:
    """The chain's caps as its checkpoint ``config.budget`` records them."""
    if not isinstance(stored, dict):
        return Caps()
    cost, tokens = stored.get("max_cost"), stored.get("max_tokens")
    return Caps(
        float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else None,
        tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None,
    )


def _spent(turns: list[TurnOutcome]) -> Usage:
    total = Usage()
    for turn in turns:
        total = total + (Usage.from_json(turn.usage) or Usage())
    return total


def _refuse_unaccounted(
    run_id: str, chain: ChainControls, delivered: set[str], recorded: int
) -> None:
    """Every message the state DB stamped ``applied`` must be in a recorded turn (decision 113).

    An agent stamps a message ``applied`` only once the turn it starts is durable (its
    prompt on the last entry's ``next``), so one that no recorded turn (nor the turn in
    flight) took means the checkpoint lost entries, typically the last records of its
    journal, and resuming it would drop that turn and the message silently.

    The turn named missing is the first one after the recorded turns: a message is
    stamped only once its turn's prompt is on the entry of the turn before it, so even
    when the message started a later turn (the state DB published which), that turn's
    predecessors had finished and were lost with it.

    Raises:
        FlowResumeError: naming the message and the turn that is missing.
    """
    for session, row in chain.applied:
        if row.id in delivered:
            continue
        missing = turn_key(recorded + 1)
        taker = chain.published_taker(session.id, row.id)
        started = f" (it started {taker})" if taker is not None and taker != missing else ""
        raise FlowResumeError(
            f"agent run {run_id} cannot be resumed: {missing} is missing from the checkpoint "
            f"(it records {recorded} turn(s)): operator message {row.id} (session "
            f"{session.id}){started} was stamped applied, which happens only once the turn "
            "it starts is recorded, yet no recorded turn took it; the checkpoint lost "
            f"{missing}{' and what followed' if started else ''}, and resuming would lose "
            "it and the message"
        )


def _claiming_turn(session: SessionRow, row: ControlRow) -> str | None:
    """The turn a dead agent was starting when it claimed ``row``: one after its last."""
    meta = session.node_metadata.get("agent")
    done = meta.get("turns") if isinstance(meta, dict) else None
    return turn_key(done + 1) if type(done) is int and done >= 0 else None


def _artifact_root(state: CheckpointState, run_dir: Path) -> Path:
    """The source's leg root: a resumed worker continues in the directory it worked in."""
    recorded = state.config.get("artifact_root")
    if isinstance(recorded, str) and recorded:
        return Path(recorded)
    return run_dir / "artifacts"


def agent_replay_nodes(seed: AgentSeed) -> list[dict[str, Any]]:
    """``{id, kind, status}`` per turn a resume replays, then the turn it runs (``pending``).

    No turn to run (nothing was in flight): the resumed agent waits for the messages
    queued for it (re-queued stranded ones included) as at any turn boundary.
    """
    nodes: list[dict[str, Any]] = [
        {"id": turn_key(t.number), "kind": "planned", "status": t.status} for t in seed.turns
    ]
    if seed.next_instruction is not None:
        number = len(seed.turns) + 1
        nodes.append({"id": turn_key(number), "kind": "planned", "status": "pending"})
    return nodes
