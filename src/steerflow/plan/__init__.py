"""Plans and playbooks: parse and validate, nothing else (CONTRACT §5)."""

from __future__ import annotations

from steerflow.plan._code import CODE_SOURCE, Edge, Op, Plan, Role, Synthesis
from steerflow.plan._codec import plan_from_checkpoint, plan_to_checkpoint
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
    SYNTHESIS_KEY,
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
