"""Plans and playbooks: parse and validate, nothing else (CONTRACT §5)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from steerflow._lazy import lazy_exports

if TYPE_CHECKING:
    from steerflow.plan._code import CODE_SOURCE, Edge, Loop, Op, Plan, Role, Synthesis
    from steerflow.plan._codec import plan_from_checkpoint, plan_to_checkpoint
    from steerflow.plan._keys import SYNTHESIS_KEY
    from steerflow.plan._load import (
        ReactivePolicy,
        bundled_playbooks,
        find_playbook,
        load_plan_file,
        parse_plan,
        parse_plan_text,
        parse_reactive,
    )
    from steerflow.plan._model import (
        AGENT_ID_PATTERN,
        COMPACT_BYTES,
        COMPACT_RECORDS,
        MAX_ARTIFACT_PATH,
        MAX_PLAN_ENTRIES,
        CompactBound,
        Dependency,
        EdgeWhen,
        PlanEntry,
        PlanFile,
        RoleSpec,
        SpawnSpec,
        SynthesisSpec,
        artifact_path_problem,
        is_agent_id,
    )

__all__ = [
    "AGENT_ID_PATTERN",
    "CODE_SOURCE",
    "COMPACT_BYTES",
    "COMPACT_RECORDS",
    "MAX_ARTIFACT_PATH",
    "MAX_PLAN_ENTRIES",
    "SYNTHESIS_KEY",
    "CompactBound",
    "Dependency",
    "Edge",
    "EdgeWhen",
    "Loop",
    "Op",
    "Plan",
    "PlanEntry",
    "PlanFile",
    "ReactivePolicy",
    "Role",
    "RoleSpec",
    "SpawnSpec",
    "Synthesis",
    "SynthesisSpec",
    "artifact_path_problem",
    "bundled_playbooks",
    "find_playbook",
    "is_agent_id",
    "load_plan_file",
    "parse_plan",
    "parse_plan_text",
    "parse_reactive",
    "plan_from_checkpoint",
    "plan_to_checkpoint",
]


# Where each name lives (a submodule of this package), imported on first access.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CODE_SOURCE": "_code",
        "Edge": "_code",
        "Loop": "_code",
        "Op": "_code",
        "Plan": "_code",
        "Role": "_code",
        "Synthesis": "_code",
        "AGENT_ID_PATTERN": "_model",
        "COMPACT_BYTES": "_model",
        "COMPACT_RECORDS": "_model",
        "CompactBound": "_model",
        "Dependency": "_model",
        "EdgeWhen": "_model",
        "MAX_ARTIFACT_PATH": "_model",
        "MAX_PLAN_ENTRIES": "_model",
        "PlanEntry": "_model",
        "PlanFile": "_model",
        "ReactivePolicy": "_load",
        "RoleSpec": "_model",
        "SYNTHESIS_KEY": "_keys",
        "SpawnSpec": "_model",
        "SynthesisSpec": "_model",
        "artifact_path_problem": "_model",
        "bundled_playbooks": "_load",
        "find_playbook": "_load",
        "is_agent_id": "_model",
        "load_plan_file": "_load",
        "parse_plan": "_load",
        "parse_plan_text": "_load",
        "parse_reactive": "_load",
        "plan_from_checkpoint": "_codec",
        "plan_to_checkpoint": "_codec",
    },
)
