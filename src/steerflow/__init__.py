"""steerflow: steerable, resumable LLM-agent flows.

What a library user needs, in one place::

    import asyncio
    from pathlib import Path

    import steerflow

    home = steerflow.resolve_home()  # --home, else STEERFLOW_HOME, else the default
    options = steerflow.FlowOptions(plan_path=Path("plan.yaml"), model="echo")
    result = asyncio.run(steerflow.run_flow(options, home=home))
    state, report = steerflow.load_checkpoint(result.run_dir)  # the run dir or its file

    seed = steerflow.prepare_resume(home, result.run_id)  # or FlowResumeError
    again = steerflow.FlowOptions(resume=seed)

Every error steerflow raises on purpose is a :class:`SteerflowError`; its
``exit_code`` is the CLI's (CONTRACT §3).

Only the error tree is imported eagerly. The run and checkpoint names are
imported on first access, so ``import steerflow.state`` (what ``steerflow ctl``
and the crash-test children load) does not pull in the whole orchestrator, and
no package below may import from this one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from steerflow.errors import (
    AmbiguousIdError,
    ArtifactContractError,
    ArtifactsUnsettledError,
    CheckpointRecoveryError,
    ControlNotApplyingError,
    DatabaseBusyError,
    ExitCode,
    FlowResumeError,
    FunctionNodeError,
    HomeRefusedError,
    KindNotAllowedError,
    LeaseLostError,
    NoResponseError,
    NotRunningError,
    PersistenceError,
    PlanValidationError,
    ProviderError,
    RefusedError,
    ResumeClaimedError,
    StateDBLostError,
    SteerflowError,
    UnknownIdError,
    UnsafePathError,
    UsageError,
)

if TYPE_CHECKING:
    from steerflow.checkpoint import CheckpointWriter, load_checkpoint
    from steerflow.executor import EventBus, FlowEvent
    from steerflow.home import resolve_home
    from steerflow.orchestrate import (
        FlowOptions,
        FlowResult,
        FlowRun,
        ResumeSeed,
        prepare_resume,
        run_flow,
    )
    from steerflow.providers import DependencyResult, NodeCall

__all__ = [
    "AmbiguousIdError",
    "ArtifactContractError",
    "ArtifactsUnsettledError",
    "CheckpointRecoveryError",
    "CheckpointWriter",
    "ControlNotApplyingError",
    "DatabaseBusyError",
    "DependencyResult",
    "EventBus",
    "ExitCode",
    "FlowEvent",
    "FlowOptions",
    "FlowResult",
    "FlowResumeError",
    "FlowRun",
    "FunctionNodeError",
    "HomeRefusedError",
    "KindNotAllowedError",
    "LeaseLostError",
    "NoResponseError",
    "NodeCall",
    "NotRunningError",
    "PersistenceError",
    "PlanValidationError",
    "ProviderError",
    "RefusedError",
    "ResumeClaimedError",
    "ResumeSeed",
    "StateDBLostError",
    "SteerflowError",
    "UnknownIdError",
    "UnsafePathError",
    "UsageError",
    "__version__",
    "load_checkpoint",
    "prepare_resume",
    "resolve_home",
    "run_flow",
]

__version__ = "0.1.0"

# Where each lazily imported name lives (its public package, never a private module).
_LAZY = {
    "CheckpointWriter": "steerflow.checkpoint",
    "load_checkpoint": "steerflow.checkpoint",
    "EventBus": "steerflow.executor",
    "FlowEvent": "steerflow.executor",
    "resolve_home": "steerflow.home",
    "FlowOptions": "steerflow.orchestrate",
    "FlowResult": "steerflow.orchestrate",
    "FlowRun": "steerflow.orchestrate",
    "ResumeSeed": "steerflow.orchestrate",
    "prepare_resume": "steerflow.orchestrate",
    "run_flow": "steerflow.orchestrate",
    "DependencyResult": "steerflow.providers",
    "NodeCall": "steerflow.providers",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'steerflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
