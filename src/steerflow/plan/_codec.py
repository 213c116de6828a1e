"""Plans in checkpoint form: ``depends_on`` by id becomes ``dep_indices`` (CONTRACT §5)."""

from __future__ import annotations

from typing import Any

from steerflow.plan._load import parse_plan
from steerflow.plan._loop import CHECKPOINT_MEMBER, checkpoint_marks, fold_checkpoint
from steerflow.plan._model import PlanFile

__all__ = ["plan_from_checkpoint", "plan_to_checkpoint"]


def plan_to_checkpoint(
    plan: PlanFile, node_ids: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The ``plan`` list stored in a checkpoint.

    ``node_ids`` maps agent ids to this run's operation ids; stored as ``plan[].node_id`` so a
    spawned entry's ``parent_id`` can be checked against the plan on resume.
    """
    index = {entry.agent_id: i for i, entry in enumerate(plan.plan)}
    marks = checkpoint_marks(plan.loops)
    out = []
    for entry in plan.plan:
        deps = entry.dependencies
        item: dict[str, Any] = {
            "agent_id": entry.agent_id,
            "dep_indices": [index[d.id] for d in deps],
            "assignee": entry.assignee,
            "instruction": entry.instruction,
        }
        if any(d.when != "completed" or d.if_contains is not None for d in deps):
            item["dep_conditions"] = [{"when": d.when, "if_contains": d.if_contains} for d in deps]
        if entry.inherit_context:
            item["inherit_context"] = True
        if entry.artifacts:
            item["artifacts"] = list(entry.artifacts)
        tools = plan.tools_of(entry)
        if tools:  # resolved (plan, role, own): a resume has no roles' or plan's tools
            item["tools"] = tools
        if entry.max_steps is not None:
            item["max_steps"] = entry.max_steps
        if entry.agent_id in marks:
            item[CHECKPOINT_MEMBER] = marks[entry.agent_id]
        if entry.output_schema is not None:  # a resume asks the same structured output
            item["output_schema"] = entry.output_schema
        # Per-node settings, only when set (every other plan keeps its bytes): a resume
        # runs the node at the same model, with the same retries and limit.
        if entry.model is not None:
            item["model"] = entry.model
        if entry.retry is not None:
            item["retry"] = entry.retry.model_dump()
        if entry.timeout_s is not None:
            item["timeout_s"] = entry.timeout_s
        if entry.approval is not None:
            item["approval"] = entry.approval
        approve = plan.approve_of(entry)
        if approve:  # resolved (role, own), as tools are
            item["approve"] = approve
        if node_ids and entry.agent_id in node_ids:
            item["node_id"] = node_ids[entry.agent_id]
        out.append(item)
    return out


def plan_from_checkpoint(items: object, *, source: str) -> PlanFile:
    """Rebuild a validated plan from a checkpoint's ``plan`` list (no planner call)."""
    # No entry limit here: the plan was accepted under the limit in force when its run
    # started, and a resume must not refuse (or cut) the run it continues.
    if not isinstance(items, list):
        return parse_plan({"plan": items}, source=source, max_entries=None)
    entries: list[Any] = []
    for item in items:
        if not isinstance(item, dict):
            entries.append(item)
            continue
        raw = {
            k: v for k, v in item.items() if k not in ("dep_indices", "dep_conditions", "node_id")
        }
        indices = item.get("dep_indices") or []
        conditions = item.get("dep_conditions") or [{} for _ in indices]
        deps: list[Any] = []
        for position, dep_index in enumerate(indices):
            if not isinstance(dep_index, int) or not 0 <= dep_index < len(items):
                deps.append({"id": f"<bad dep_indices entry {dep_index!r}>"})
                continue
            target = items[dep_index]
            dep_id = target.get("agent_id") if isinstance(target, dict) else None
            cond = conditions[position] if position < len(conditions) else {}
            deps.append({"id": dep_id, **{k: v for k, v in (cond or {}).items() if v is not None}})
        raw["depends_on"] = deps
        entries.append(raw)
    return parse_plan({"plan": fold_checkpoint(entries)}, source=source, max_entries=None)
