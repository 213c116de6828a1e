"""Prepare a resume: resolve, claim, load, plan (``resume.plan_replay``), seed the run.

The D5 rules live in :mod:`steerflow.resume`; this module only applies the checked
:class:`~steerflow.resume.ReplayPlan` to a graph.  Every check runs before any graph is
built; a refusal names the node and never touches the source run directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from steerflow.artifacts import ArtifactContract, read_source_contract
from steerflow.checkpoint import (
    BRANCHES_DIR,
    CHECKPOINT_FILENAME,
    CheckpointState,
    context_problem,
    load_branch,
    load_state,
)
from steerflow.errors import FlowResumeError, SteerflowError, UsageError
from steerflow.executor import LOOP_MEMBER, Edge, Graph, InFlightDoubt, Operation
from steerflow.orchestrate._claim import preflight_claim
from steerflow.orchestrate._options import ResumeSeed
from steerflow.orchestrate._recorder import RECORDED_OUTPUT, RECORDED_USAGE
from steerflow.orchestrate._stranded import (
    StrandedMessage,
    read_chain,
    rendered_into,
    stranded_notes,
)
from steerflow.providers import USAGE_MEMBERS, Usage
from steerflow.resume import (
    ReplayPlan,
    ReplaySpawn,
    RerunFrom,
    RunTarget,
    paid_nodes,
    plan_replay,
    rerun_cut,
    resolve_run_target,
)
from steerflow.resume._from import EDITED_KEY, EDITED_MEMBER
from steerflow.state import StateDB, db_exists

__all__ = [
    "BRANCHES_DIR",
    "EDITED_KEY",
    "apply_replay",
    "load_branch",
    "prepare_resume",
    "rerun_from_json",
    "rerun_report",
]


def prepare_resume(
    home: Path,
    target: str,
    *,
    retry_failed: bool = False,
    allow_degraded_context: bool = False,
    fork: bool = False,
    rerun_unsettled: bool = False,
    save: Path | None = None,
    accept_checkpoint_contract: bool = False,
    redeliver_claimed: bool = False,
    tool_calls: Mapping[str, str] | None = None,
    from_node: str | None = None,
    instruction: str | None = None,
) -> ResumeSeed:
    """Resolve ``target``, load and check its checkpoint, and describe the replay.

    Unless ``fork``, a source that another resume holds or already continued is
    refused first (``ResumeClaimedError``; docs/decisions.md, one resume per source).
    A refusal once the target is resolved carries the source's ids in ``source_ids``
    (``resume --json`` prints them).

    Recorded artifacts are settled against the contract the source run persisted
    (``ArtifactContractError``/``ArtifactsUnsettledError``; with ``rerun_unsettled``
    the unsettled nodes and their dependents run again). When the state DB's copy of that
    contract is missing (a lost or replaced DB), the checkpoint's own copy is used if it
    declares no artifacts, else only with ``accept_checkpoint_contract``; the seed's notes
    say so. All of it happens before the resume claims its source or creates anything,
    so a refusal leaves nothing behind.
    ``save``, when given, must name the source run's artifact root (``UsageError``).
    Messages of the chain a dead process left behind are listed in ``stranded`` (and
    the notes); ``redeliver_claimed`` re-queues the claimed ones too (issue 26).
    ``tool_calls``: the operator's ``--tool-call CALL_ID=retry|skip`` decisions for tool
    calls a crash left unfinished; one that is neither idempotent nor decided refuses the
    resume (``ToolCallUndecidedError``, issue 39 item 3).
    ``from_node`` (``resume --from NODE``, issue 40 item 6): a fork (whatever ``fork``
    says) that runs NODE and everything downstream of it again and replays the rest,
    ``instruction`` replacing NODE's (``UsageError`` without ``from_node``, or for a
    node the run does not have); ``seed.replay.rerun_from`` names what it pays for
    (see :mod:`steerflow.resume._from`).
    """
    if instruction is not None and from_node is None:
        raise UsageError("--instruction edits the node a rerun starts from: give --from NODE")
    run = resolve_run_target(home, target)
    known: dict[str, str | None] = {"session_id": run.session_id, "run_id": run.run_id}
    try:
        return _prepare(
            home,
            run,
            known,
            retry_failed=retry_failed,
            allow_degraded_context=allow_degraded_context,
            fork=fork,
            rerun_unsettled=rerun_unsettled,
            save=save,
            accept_checkpoint_contract=accept_checkpoint_contract,
            redeliver_claimed=redeliver_claimed,
            tool_calls=dict(tool_calls or {}),
            rerun=(from_node, instruction),
        )
    except SteerflowError as exc:
        exc.source_ids = dict(known)
        raise


def _prepare(
    home: Path,
    run: RunTarget,
    known: dict[str, str | None],
    *,
    retry_failed: bool,
    allow_degraded_context: bool,
    fork: bool,
    rerun_unsettled: bool,
    save: Path | None,
    accept_checkpoint_contract: bool,
    redeliver_claimed: bool,
    tool_calls: dict[str, str],
    rerun: tuple[str | None, str | None] = (None, None),
) -> ResumeSeed:
    from_node, instruction = rerun
    fork = fork or from_node is not None  # a rerun never continues its source
    preflight_claim(home, run.run_id, fork=fork)
    state, report, session_id = _load(home, run, known)
    # The contract the source persisted, never one re-derived from today's roles.
    source = read_source_contract(
        home, state, accept_checkpoint_contract=accept_checkpoint_contract
    )
    contract = source.contract
    root = _artifact_root(contract, state.config, run.run_dir)
    if save is not None and not _same_dir(save, root):
        raise UsageError(
            f"--save {str(save)!r} is not the artifact root of run {run.run_id} "
            f"({str(root)!r}): a resume writes its legs beside the ones it replays"
        )
    cut, rerun_from = _cut(state, run.run_id, from_node, instruction)
    replay = plan_replay(
        cut,
        run.run_dir,
        retry_failed=retry_failed,
        allow_degraded_context=allow_degraded_context,
        contract=contract,
        rerun_unsettled=rerun_unsettled,
        spawn_id_of=lambda node_id: _published_spawn_id(home, session_id, node_id),
    )
    if rerun_from is not None:
        rerun_from = replace(rerun_from, rerun=paid_nodes(replay, cut))
        replay = replace(replay, rerun_from=rerun_from)
    stranded = _stranded(home, session_id, state)
    doubt = chain_doubt(state)
    return ResumeSeed(
        plan=replay.plan,
        prompt=state.prompt,
        config=dict(cut.config),
        resumed_from=session_id,
        source_run_id=run.run_id,
        replay=replay,
        flow_context=dict(state.flow_context),
        max_spawn=state.max_spawn,
        degraded=list(replay.degraded),
        checkpoint_recovery=report,
        notes=[
            *([source.note] if source.note else []),
            *replay.notes,
            *stranded_notes(stranded, redeliver_claimed=redeliver_claimed),
            *in_flight_notes(state, doubt),
        ],
        fork=fork,
        artifact_root=root,
        stranded=stranded,
        redeliver_claimed=redeliver_claimed,
        spent=chain_spent(state),
        in_flight=state.in_flight,
        doubt=doubt,
        **_tool_steps(cut, tool_calls),
        loop_records=loop_records(cut),
    )


def _load(
    home: Path, run: RunTarget, known: dict[str, str | None]
) -> tuple[CheckpointState, dict[str, Any], str]:
    """The source's checkpoint, its recovery report and session id, its context checked."""
    checkpoint = run.run_dir / CHECKPOINT_FILENAME
    # lexists, not is_file: a FIFO, a directory or a link there is refused by the loader,
    # which names what it found, instead of being reported as absent.
    if not os.path.lexists(checkpoint):
        raise _no_checkpoint(home, run, checkpoint)
    # v2 leniency: a bad v2 entry is refused by the resume rules (resume-refused), as always.
    state, report = load_state(checkpoint, v2_lenient=True)
    session_id = state.session_id or run.session_id
    if not session_id:
        raise FlowResumeError(f"checkpoint of run {run.run_id} records no session_id")
    known["session_id"] = session_id
    # A context the loader accepts (a hand-made file, a journal's deep patch) but the
    # writer would refuse must stop the resume here, before a run directory or session
    # exists, not when the new checkpoint is first written.
    _check_context(state, run.run_id)
    return state, report, session_id


def _cut(
    state: CheckpointState, run_id: str, from_node: str | None, instruction: str | None
) -> tuple[CheckpointState, RerunFrom | None]:
    """The checkpoint a ``--from`` fork replays (``state`` itself for any other resume)."""
    if from_node is None:
        return state, None
    return rerun_cut(state, from_node, instruction=instruction, run_id=run_id)


def loop_records(state: CheckpointState) -> dict[str, dict[str, Any]]:
    """The ``loop`` member of every recorded outcome that has one, by node key."""
    found: dict[str, dict[str, Any]] = {}
    for key, entry in state.ops.items():
        if isinstance(entry.raw.get(LOOP_MEMBER), dict):
            found[key] = entry.raw[LOOP_MEMBER]
    for spawned in state.spawned:
        if spawned.spawn_id and isinstance(spawned.raw.get(LOOP_MEMBER), dict):
            found[spawned.spawn_id] = spawned.raw[LOOP_MEMBER]
    return found


def _check_context(state: CheckpointState, run_id: str) -> None:
    problem = context_problem(state.flow_context)
    if problem is not None:
        raise FlowResumeError(f"the flow context of run {run_id} cannot be stored again: {problem}")


def _tool_steps(state: CheckpointState, tool_calls: dict[str, str]) -> dict[str, Any]:
    """The seed's tool-loop members, once every unfinished call is decided."""
    check_tool_calls(state, tool_calls)
    return {
        "steps": state.steps,
        "finished_steps": _finished(state),
        "tool_decisions": tool_calls,
    }


def check_tool_calls(state: CheckpointState, decisions: Mapping[str, str]) -> None:
    """Refuse a resume that would have to guess about an unfinished tool call.

    Every ``--tool-call`` must name a call left unfinished; every unfinished call that
    was not idempotent when it started must be decided.
    """
    from steerflow.tools._loop import ToolCallUndecidedError, undecided_calls, undecided_message

    unfinished = {
        str(step["call_id"])
        for step in state.steps
        if step["type"] == "tool" and step["status"] == "in_flight"
    }
    bad = {call: how for call, how in decisions.items() if how not in ("retry", "skip")}
    if bad:
        call, how = next(iter(bad.items()))
        raise UsageError(f"--tool-call {call}={how}: the decision is retry or skip")
    unknown = sorted(set(decisions) - unfinished)
    if unknown:
        raise UsageError(
            f"--tool-call names {', '.join(map(repr, unknown))}, which is not a tool call "
            f"left unfinished in this run (unfinished: {', '.join(sorted(unfinished)) or 'none'})"
        )
    undecided = undecided_calls(state.steps, decisions)
    if undecided:
        more = f" ({len(undecided) - 1} more undecided)" if len(undecided) > 1 else ""
        raise ToolCallUndecidedError(undecided_message(undecided[0]) + more)


def open_steps_usage(steps: Sequence[Mapping[str, Any]], finished: set[tuple[str, str]]) -> Usage:
    """What the model steps of nodes with no final outcome cost (paid, in no entry)."""
    total = Usage()
    for step in steps:
        if step["type"] == "model" and (step["record"], step["key"]) not in finished:
            total = total + (Usage.from_json(step["data"].get("usage")) or Usage())
    return total


def _finished(state: CheckpointState) -> set[tuple[str, str]]:
    done = {("op", key) for key, e in state.ops.items() if e.raw.get("status") in _FINAL}
    return done | {("spawn", e.node_id) for e in state.spawned if e.raw.get("status") in _FINAL}


#: An outcome that ends a node (a spawned ``pending`` entry is its intent, not an end).
_FINAL = frozenset({"completed", "failed"})

#: The checkpoint ``config`` member with what the chain spent that no entry of the
#: checkpoint records (planner calls, attempts a resume ran again); absent when nothing.
SPENT_KEY = "spent_before"


def chain_spent(state: CheckpointState) -> Usage:
    """What the resume chain up to this checkpoint spent: ``spent_before`` + every entry."""
    total = Usage.from_json(state.config.get(SPENT_KEY)) or Usage()
    entries = [e.raw for e in state.ops.values()] + [e.raw for e in state.spawned]
    for raw in entries:
        total = total + (Usage.from_json(raw.get("usage")) or Usage())
    # A tool node's steps were paid as they ran: until its outcome holds them, its
    # steps' own records do (decision 256).
    return total + open_steps_usage(state.steps, _finished(state))


#: The session ``node_metadata`` member holding the planner call in flight (decision 219).
PLANNER_CALL_KEY = "planner_call"

#: The checkpoint ``config`` member with the chain's calls that may have been paid and
#: have no outcome (decision 217): counted as spent; absent when there are none.
IN_FLIGHT_KEY = "in_flight_before"


def chain_doubt(state: CheckpointState) -> InFlightDoubt:
    """Every call of the chain up to this checkpoint that left and has no outcome."""
    doubt = InFlightDoubt.from_json(state.config.get(IN_FLIGHT_KEY))
    for call in state.in_flight:
        sized = call.reserved_cost_usd is not None or call.reserved_tokens is not None
        doubt = doubt + InFlightDoubt(
            calls=1,
            cost_usd=call.reserved_cost_usd or 0.0,
            tokens=call.reserved_tokens or 0,
            unsized=0 if sized else 1,
        )
    return doubt


def in_flight_line(costs: Sequence[float | None]) -> str:
    """``3 calls were in flight when the run died and may have been paid: about $0.0060``.

    ``costs``: each call's reservation (None where its size was not known yet).
    """
    calls = len(costs)
    noun = "call was" if calls == 1 else "calls were"
    known = [c for c in costs if c is not None]
    about = f": about ${sum(known):.4f}" if len(known) == calls else " (their cost is not known)"
    return f"{calls} {noun} in flight when the run died and may have been paid{about}"


def in_flight_notes(state: CheckpointState, doubt: InFlightDoubt) -> list[str]:
    """The resume's notes on calls that may have been paid (the source's, then the chain's)."""
    notes: list[str] = []
    calls = state.in_flight
    if calls:
        nodes = ", ".join(sorted({c.node for c in calls}))
        notes.append(
            f"{in_flight_line([c.reserved_cost_usd for c in calls])} (node(s) {nodes}); they "
            "count as spent against the chain's cap, and their nodes run again"
        )
    earlier = doubt.calls - len(calls)
    if earlier > 0:
        notes.append(
            f"{earlier} more call(s) of earlier runs of this chain may have been paid: "
            "counted as spent too"
        )
    return notes


def spent_before(seed: ResumeSeed | None, planner: list[Usage]) -> Usage:
    """A new checkpoint's ``spent_before``: the chain's spend its entries will not hold.

    The source chain's total, less what the replayed entries (copied with their usage)
    record, plus this run's planner calls.
    """
    total = Usage()
    for usage in planner:
        total = total + usage
    if seed is None or seed.spent is None:
        return total
    kept = Usage()
    for recorded in seed.replay.usage.values():
        kept = kept + (Usage.from_json(recorded) or Usage())
    # The resumed run's checkpoint holds the seeded steps again, and a node that ends
    # there records them in its outcome's usage: not in spent_before as well.
    kept = kept + open_steps_usage(seed.steps, seed.finished_steps)
    return total + _less(seed.spent, kept)


def _less(total: Usage, part: Usage) -> Usage:
    def minus(a: Any, b: Any) -> Any:
        return a if a is None or b is None else max(a - b, 0)

    unpriced = total.counted().unpriced_calls - part.counted().unpriced_calls
    return Usage(**{name: minus(getattr(total, name), getattr(part, name))
                    for name in USAGE_MEMBERS}, unpriced_calls=max(unpriced, 0))  # fmt: skip


def _published_spawn_id(home: Path, session_id: str, node_id: str) -> str | None:
    """The spawn id the source run published for ``node_id`` (its ``session_nodes`` row).

    Asked only while a refusal names a spawned child whose checkpoint entry is lost; a
    missing or unreadable state DB leaves the child named by its node id.
    """
    if not db_exists(home):
        return None
    try:
        with StateDB.open(home, create=False) as db:
            nodes = db.list_nodes(session_id)
    except SteerflowError:
        return None
    return next((n.node_key for n in nodes if n.node_id == node_id and n.kind == "spawned"), None)


def _stranded(home: Path, session_id: str, state: CheckpointState) -> list[StrandedMessage]:
    """The chain's messages a dead process left behind (see ``orchestrate._stranded``).

    A claimed message counts as delivered when the checkpoint shows a recorded operation
    rendered it (its outcome, and so its call, came before the stamp that was lost).
    """
    taken = rendered_into(state.flow_context)
    recorded = set(state.ops) | {
        e.spawn_id for e in state.spawned if e.status != "pending" and e.spawn_id
    }
    delivered = {control for control, node in taken.items() if node in recorded}
    # A tool node's model step records the messages its request carried (decision 257).
    delivered |= {
        control
        for step in state.steps
        if step["type"] == "model"
        for message in step["data"].get("steered", ())
        for control in str(message.get("control_id", "")).split(",")
    }
    chain = read_chain(home, session_id)
    return chain.stranded(
        delivered,
        lambda session, row: taken.get(row.id) or chain.published_taker(session.id, row.id),
    )


def _no_checkpoint(home: Path, run: RunTarget, checkpoint: Path) -> FlowResumeError:
    """The refusal for a run without a checkpoint, naming why it has none if it said so."""
    why = None
    planner: object = None
    if run.session_id is not None and db_exists(home):
        with StateDB.open(home, create=False) as db:
            session = db.get_session(run.session_id)
        recorded = session.node_metadata.get("nothing_to_resume") if session else None
        why = recorded if isinstance(recorded, str) else None
        planner = session.node_metadata.get(PLANNER_CALL_KEY) if session else None
    if isinstance(planner, dict):
        model = planner.get("model")
        return FlowResumeError(
            f"run {run.run_id} has nothing to resume: it died while planning, so no plan was "
            f"saved; its planner call ({model if isinstance(model, str) else 'model unknown'}) "
            "was in flight and may have been paid; start the flow again instead"
        )
    if why is None:
        return FlowResumeError(f"run {run.run_id} has no checkpoint.json ({str(checkpoint)!r})")
    # A run stopped while planning before a plan existed (decision 101).
    return FlowResumeError(
        f"run {run.run_id} has nothing to resume: {why}, so no plan was saved; "
        "start the flow again instead"
    )


def _artifact_root(
    contract: ArtifactContract | None, config: Mapping[str, Any], run_dir: Path
) -> Path:
    """The source run's artifact root: its contract's, else its ``--save``, else the default."""
    if contract is not None:
        return contract.root
    saved = config.get("save_dir")
    return Path(saved).absolute() if isinstance(saved, str) and saved else run_dir / "artifacts"


def _same_dir(given: Path, root: Path) -> bool:
    """``given`` names ``root`` (symlinks and ``..`` resolved where they exist)."""
    return os.path.realpath(given) == os.path.realpath(root)


def apply_replay(replay: ReplayPlan, graph: Graph) -> None:
    """Pre-mark a freshly built graph: replayed outcomes, and every spawn rebuilt.

    Replayed nodes keep their settled artifact records (so the resumed checkpoint still
    records them), and every leg, planned or rebuilt, declares what the source's
    contract says it declared: the resumed plan carries no roles to re-derive it from.
    """
    branches = replay.branches
    for key, response in replay.completed.items():
        op = graph.by_key[key]
        op.status, op.response, op.replayed = "completed", response, True
        op.branch = list(branches.get(key, []))
        op.spawned_ids = list(replay.witnesses[key])
        op.artifact_records = list(replay.artifacts.get(key, ()))
    for key, response in replay.superseded.items():
        _replay_failed(graph.by_key[key], response)
    retries: list[tuple[ReplaySpawn, Operation]] = []
    for entry in replay.spawned:
        child = Operation(
            key=entry.spawn_id,
            instruction=entry.instruction,
            kind="spawned",
            assignee=entry.assignee,
            edges=[Edge(source=graph.by_key[d].node_id) for d in entry.depends_on],
            # The recorded node id is kept, so the emitter's spawned_ids still name
            # this child in the resumed run's checkpoint.
            node_id=entry.node_id,
        )
        if entry.parent_id is not None:
            parent = graph.by_key.get(entry.parent_key) if entry.parent_key else None
            child.parent_id = parent.node_id if parent else None
            if parent is not None and entry.status != "completed":
                child.branch = list(branches.get(parent.key, []))
        if entry.escalated_from_key is not None:
            # Remapped to the rebuilt graph: a planned root has a new node id.
            root = graph.by_key[entry.escalated_from_key]
            child.escalated_from = root.node_id
            child.escalation, child.pinned_model = entry.escalation, entry.model
            # An attempt of a typed node is typed too (its schema is the plan entry's).
            child.output_schema, child.output_reasks = root.output_schema, root.output_reasks
            # The rung runs with its op's retries and call limit, as when spliced.
            child.retry_attempts, child.retry_backoff_s = root.retry_attempts, root.retry_backoff_s
            child.timeout_s = root.timeout_s
            child.branch = list(root.branch) if root.kind == "spawned" else []
            retries.append((entry, child))
        if entry.status == "completed":
            child.status, child.response, child.replayed = "completed", entry.response, True
            child.branch = list(branches.get(entry.spawn_id, []))
            child.spawned_ids = list(entry.spawned_ids)
            child.artifact_records = list(replay.artifacts.get(entry.spawn_id, ()))
        elif entry.superseded:
            _replay_failed(child, entry.response)
        graph.add(child)
    # The replacement chains, first attempts first, once every node they may move an
    # edge of exists and before anything runs (Amendment 3 item 4).
    for entry, child in sorted(retries, key=lambda pair: pair[0].escalation):
        anchor = graph.by_key[str(entry.parent_key)]
        child.edges = [Edge(source=anchor.node_id, when="failed")]
        graph.splice_after(anchor.node_id, child)
    if replay.contract is not None:
        for op in graph:
            op.declared_artifacts = replay.contract.declared(op.key)
    for op in graph:
        # Carried into the resumed checkpoint's copy of the entry; never this run's spend.
        if op.replayed and op.key in replay.usage:
            op.extra[RECORDED_USAGE] = replay.usage[op.key]
        # The edit a node ran (or runs) with: its entry carries it, covered by the digest.
        if op.kind == "planned" and op.key in replay.edited:
            op.extra[EDITED_MEMBER] = dict(replay.edited[op.key])
        if op.replayed and op.status == "completed" and op.key in replay.outputs:
            op.output, op.extra[RECORDED_OUTPUT] = replay.outputs[op.key], True


def _replay_failed(op: Operation, response: object) -> None:
    """A failed attempt an escalation retry replaced: kept failed, as recorded."""
    op.status, op.response, op.replayed = "failed", response, True
    error = response.get("error") if isinstance(response, dict) else None
    op.error = str(error) if error is not None else "failed in the recorded run"


def rerun_report(replay: ReplayPlan) -> list[dict[str, Any]]:
    """``--rerun-unsettled``: each node that runs again, and the artifacts that made it."""
    return [
        {
            "id": key,
            "unsettled": [u.to_json() for u in replay.unsettled if u.node == key],
        }
        for key in replay.rerun_unsettled
    ]


def rerun_from_json(seed: ResumeSeed | None) -> dict[str, Any] | None:
    """``resume --from``: the result's ``rerun_from`` member; None for any other run."""
    rerun = seed.replay.rerun_from if seed is not None else None
    return rerun.to_json() if rerun is not None else None
