"""A run's loops as its checkpoint records them (``show RUN --json`` member ``loops``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from steerflow.checkpoint import CheckpointState
from steerflow.plan._loop import CHECKPOINT_MEMBER, split_round_id

__all__ = ["recorded_loops"]


def recorded_loops(
    state: CheckpointState | None, finished: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """Each loop's ``{id, rounds, ended, nodes}`` from the checkpoint, in plan order.

    ``ended`` is the reason a recorded outcome carries (``until_met``, ``max_rounds``,
    ``failed``); else what the run said when it finished (``finished``: the session's
    ``loops``, ``stopped`` for a loop it left between or inside rounds); else null.
    """
    if state is None:
        return []
    bodies: dict[str, list[str]] = {}
    for item in state.plan:
        mark = item.get(CHECKPOINT_MEMBER) if isinstance(item, dict) else None
        split = split_round_id(str(item.get("agent_id"))) if isinstance(mark, dict) else None
        if isinstance(mark, dict) and split is not None:
            bodies.setdefault(str(mark.get("id")), []).append(split[0])
    if not bodies:
        return []
    keys = [*state.ops, *(str(e.spawn_id) for e in state.spawned if e.spawn_id)]
    records = [e.raw.get(CHECKPOINT_MEMBER) for e in state.ops.values()]
    records += [e.raw.get(CHECKPOINT_MEMBER) for e in state.spawned]
    said = {str(loop.get("id")): loop.get("ended") for loop in finished}
    out = []
    for loop_id, body in bodies.items():
        rounds: dict[int, list[str]] = {}
        for key in keys:
            split = split_round_id(key)
            if split is not None and split[0] in body:
                rounds.setdefault(split[1], []).append(key)
        ended = next(
            (
                r["ended"]
                for r in records
                if isinstance(r, dict) and r.get("id") == loop_id and r.get("ended")
            ),
            said.get(loop_id),
        )
        out.append(
            {
                "id": loop_id,
                "rounds": max(rounds, default=1),
                "ended": ended,
                "nodes": [
                    sorted(set(rounds[n]), key=lambda k: body.index(str(split_round_id(k)[0])))  # type: ignore[index]
                    for n in sorted(rounds)
                ],
            }
        )
    return out
