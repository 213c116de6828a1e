"""The Amendment 1 artifact rule of :func:`~steerflow.resume.plan_replay`: settle, or re-run.

Every completed node the resume would replay and that recorded artifacts is settled
against the contract its run persisted.  Any mismatch refuses the whole resume, naming
node, path, expected and found; with ``--rerun-unsettled`` the unsettled nodes and every
node downstream of them (planned dependents, spawned nodes waiting on them, transitively)
run again instead, each with a note saying why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from steerflow.artifacts import (
    ArtifactContract,
    ArtifactRecord,
    Unsettled,
    recorded_legs,
    settle_legs,
)
from steerflow.checkpoint import CheckpointState
from steerflow.errors import ArtifactsUnsettledError
from steerflow.plan import PlanFile

__all__ = ["SettledReplay", "settle_replay"]


@dataclass(frozen=True)
class SettledReplay:
    """What settling decided: the settled records, and what re-runs and why."""

    artifacts: dict[str, tuple[ArtifactRecord, ...]]
    unsettled: tuple[Unsettled, ...]
    rerun: tuple[str, ...]
    notes: list[str]


def settle_replay(
    state: CheckpointState,
    plan: PlanFile,
    contract: ArtifactContract | None,
    replayed: Sequence[str],
    spawn_deps: Mapping[str, Sequence[str]],
    *,
    rerun: bool,
) -> SettledReplay:
    """Settle the replayed nodes' recorded artifacts (see the module docstring).

    ``replayed`` are the leg keys the resume would replay; ``spawn_deps`` maps each
    rebuilt spawned leg to the leg keys it waits for, in dependency order.

    Raises:
        ArtifactContractError: a node recorded artifacts the contract cannot vouch for.
        ArtifactsUnsettledError: something does not match and not ``rerun``.
    """
    legs = recorded_legs(contract, state)
    artifacts = {leg.key: leg.records for leg in legs}
    unsettled = settle_legs(contract, legs) if contract is not None else []
    if not unsettled:
        return SettledReplay(artifacts, (), (), [])
    if not rerun:
        listed = "\n".join(f"  {u.describe()}" for u in unsettled)
        raise ArtifactsUnsettledError(
            "recorded artifacts no longer match what their nodes produced, so replaying "
            f"those nodes would not be faithful:\n{listed}\nPass --rerun-unsettled to run "
            "them, and everything downstream of them, again",
            unsettled=[u.to_json() for u in unsettled],
        )
    _refuse_unwritable(unsettled)
    why = _downstream(plan, spawn_deps, unsettled)
    order = [*(e.agent_id for e in plan.plan), *spawn_deps]
    again = tuple(key for key in order if key in why and key in replayed)
    return SettledReplay(
        artifacts={k: v for k, v in artifacts.items() if k not in again},
        unsettled=tuple(unsettled),
        rerun=again,
        notes=[f"node {key!r} runs again (--rerun-unsettled): {why[key]}" for key in again],
    )


#: What a re-run leg cannot write over: it never follows a symlink or replaces what is not
#: a regular file (decision 58), and a file it cannot read it cannot rewrite either.
_UNWRITABLE = frozenset({"not_regular", "unreadable"})


def _refuse_unwritable(unsettled: Sequence[Unsettled]) -> None:
    """Refuse, before any call is paid for, a re-run whose leg would fail writing its file."""
    blocked = [u for u in unsettled if u.reason in _UNWRITABLE]
    if not blocked:
        return
    listed = "\n".join(f"  {u.describe()}" for u in blocked)
    raise ArtifactsUnsettledError(
        "--rerun-unsettled cannot re-run these nodes: a re-run leg never writes through a "
        "symbolic link or over what is not a regular file, so each would fail after its "
        f"model call:\n{listed}\nRemove or restore them, then resume again",
        unsettled=[u.to_json() for u in unsettled],
    )


def _downstream(
    plan: PlanFile, spawn_deps: Mapping[str, Sequence[str]], unsettled: Sequence[Unsettled]
) -> Mapping[str, str]:
    """Every unsettled node and everything downstream of it, each with why it re-runs."""
    dependents: dict[str, list[str]] = {}
    for entry in plan.plan:
        for dep in entry.dependencies:
            dependents.setdefault(dep.id, []).append(entry.agent_id)
    for child, waits_for in spawn_deps.items():
        for key in waits_for:
            dependents.setdefault(key, []).append(child)
    why: dict[str, str] = {}
    for problem in unsettled:
        found = f"artifact {problem.path!r} is {problem.found_text()}"
        why[problem.node] = f"{why[problem.node]}; {found}" if problem.node in why else found
    queue = list(why)
    while queue:
        source = queue.pop(0)
        for dependent in dependents.get(source, []):
            if dependent not in why:
                why[dependent] = f"it depends on {source!r}, which runs again"
                queue.append(dependent)
    return why
