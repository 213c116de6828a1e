"""Every public package's ``__init__`` declares an ordered ``__all__`` of names that exist."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import steerflow

SRC = Path(steerflow.__file__).parent


def _public_packages() -> list[str]:
    names = ["steerflow"]
    for info in pkgutil.walk_packages(steerflow.__path__, prefix="steerflow."):
        if info.ispkg and not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


PACKAGES = _public_packages()


def _ruff_key(name: str) -> tuple[int, str]:
    """RUF022's isort-style order: SCREAMING_CASE, then CamelCase, then the rest."""
    if len(name) > 1 and re.fullmatch(r"[A-Z0-9_]+", name):
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


def _declared_all(package: str) -> list[str]:
    """``__all__`` as written in the source (a literal list or tuple of strings)."""
    init = SRC.joinpath(*package.split(".")[1:], "__init__.py")
    tree = ast.parse(init.read_text(encoding="utf-8"))
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else ([node.target] if isinstance(node, ast.AnnAssign) else [])
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            value = ast.literal_eval(node.value)  # type: ignore[arg-type]
            assert isinstance(value, list | tuple), f"{package}.__all__ is not a literal list"
            return list(value)
    raise AssertionError(f"{package}/__init__.py declares no __all__")


def test_the_expected_packages_are_found() -> None:
    expected = {
        "steerflow",
        "steerflow.artifacts",
        "steerflow.checkpoint",
        "steerflow.cli",
        "steerflow.cluster",
        "steerflow.control",
        "steerflow.executor",
        "steerflow.orchestrate",
        "steerflow.plan",
        "steerflow.providers",
        "steerflow.resume",
        "steerflow.state",
        "steerflow.tools",
        "steerflow.views",
    }
    assert expected <= set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_declared_ordered_and_resolves(package: str) -> None:
    names = _declared_all(package)
    assert names, f"{package}.__all__ is empty"
    assert all(isinstance(n, str) for n in names)
    assert len(names) == len(set(names)), f"{package}.__all__ repeats a name"
    assert names in (sorted(names), sorted(names, key=_ruff_key)), (
        f"{package}.__all__ is neither sorted nor in ruff (RUF022) order: {names}"
    )
    module = importlib.import_module(package)
    assert list(module.__all__) == names
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing, f"{package}.__all__ names missing attributes: {missing}"


@pytest.mark.parametrize("package", PACKAGES)
def test_star_import_works(package: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {package} import *", namespace)
    assert set(_declared_all(package)) <= set(namespace)


# The public surface, pinned: adding or removing a name is a decision, made here on purpose
# (httpx tests/test_exported_members.py, temporal tests/test_client_exports.py).
EXPECTED: dict[str, set[str]] = {
    "steerflow": {
        "AdmissionClosed",
        "AmbiguousIdError",
        "ApprovalRequested",
        "ArtifactContractError",
        "ArtifactsUnsettledError",
        "CheckpointFailed",
        "CheckpointReconciled",
        "CheckpointRecoveryError",
        "CheckpointSaved",
        "CheckpointWriter",
        "ControlApplied",
        "ControlNotApplyingError",
        "DatabaseBusyError",
        "DependencyResult",
        "Edge",
        "EventBus",
        "EventStream",
        "EventsDropped",
        "ExitCode",
        "FlowEvent",
        "FlowOptions",
        "FlowResult",
        "FlowResumeError",
        "FlowRun",
        "FunctionNodeError",
        "HomeRefusedError",
        "InvalidValueError",
        "KindNotAllowedError",
        "LeaseLostError",
        "Loop",
        "NodeCall",
        "NoResponseError",
        "NodeCompleted",
        "NodeFailed",
        "NodeOutcome",
        "NodePaused",
        "ModelStep",
        "ToolCallEnded",
        "ToolCallStarted",
        "NodeReplayed",
        "NodeSkipped",
        "NodeStarted",
        "NodeWithheld",
        "NotRunningError",
        "Op",
        "PersistenceError",
        "Plan",
        "PlanReady",
        "PlanValidationError",
        "PlanWarning",
        "Price",
        "ProviderError",
        "RefusedError",
        "ResumeClaimedError",
        "ResumeSeed",
        "Role",
        "RunEvent",
        "SpawnAccepted",
        "SpawnRejected",
        "StateDBLostError",
        "SteerflowError",
        "Synthesis",
        "UnknownIdError",
        "UnsafePathError",
        "UsageError",
        "__version__",
        "approve",
        "deny",
        "budget",
        "load_checkpoint",
        "message",
        "pause",
        "prepare_resume",
        "resolve_home",
        "resume",
        "resume_run",
        "run_flow",
        "stop",
    },
    "steerflow.artifacts": {
        "CHUNK",
        "CONFIG_KEY",
        "CONTRACT_VERSION",
        "DECLARED_MEMBER",
        "DIGEST_PREFIX",
        "ArtifactContract",
        "ArtifactProblem",
        "ArtifactRecord",
        "ContractError",
        "ContractOrigin",
        "LegCheck",
        "ProblemKind",
        "RecordedLeg",
        "Settlement",
        "SourceContract",
        "Unsettled",
        "UnsettledReason",
        "check_leg",
        "checkpoint_contract",
        "hash_fd",
        "hash_file",
        "inspect_artifact",
        "merge_declared",
        "read_source_contract",
        "recorded_legs",
        "records_from_json",
        "settle",
        "settle_legs",
        "source_contract",
    },
    "steerflow.checkpoint": {
        "BRANCHES_DIR",
        "CHECKPOINT_FILENAME",
        "CheckpointRecoveryError",
        "CheckpointState",
        "CheckpointWriter",
        "InFlightCall",
        "JOURNAL_FILENAME",
        "LoadedCheckpoint",
        "PlannedEntry",
        "SavedHook",
        "SpawnedEntry",
        "context_problem",
        "entry_digest",
        "load_branch",
        "load_checkpoint",
        "load_state",
        "result_digest",
        "save_branch",
    },
    "steerflow.cli": {
        "app",
        "cli_exit",
        "main",
    },
    "steerflow.tracing": {"OTEL_ENV", "tracing_requested"},
    "steerflow.tools": {
        "DEFAULT_TOOL_TIMEOUT_S",
        "Tool",
        "ToolOptions",
        "ToolOutput",
        "ToolRuntime",
        "Toolset",
    },
    "steerflow.cluster": {
        "CONNECT_BOUND_S",
        "EXECUTORS",
        "Executor",
        "RayCluster",
        "RayConnectStoppedError",
        "connect_ray",
        "connect_stopped",
        "join_ray",
        "ray_options",
        "request_of",
        "unplaceable",
    },
    "steerflow.control": {
        "CONTROL_LOG_MAX",
        "CliVerb",
        "ControlPoller",
        "DB_BUSY_TIMEOUT_S",
        "DEFAULT_POLL_S",
        "FrontEnd",
        "MAX_MESSAGE_BYTES",
        "POLL_ENV",
        "PollerState",
        "Queued",
        "SteeringTarget",
        "check_budget",
        "enqueue_control",
        "open_existing_db",
        "poll_interval",
        "resolve_control",
        "send_control",
        "sender_id",
        "session_target",
    },
    "steerflow.executor": {
        "BUDGET_REASON",
        "CapNames",
        "Caps",
        "FLAG_NAMES",
        "PARAMETER_NAMES",
        "Meter",
        "enforceable",
        "CLI_DEFAULT_MAX_SPAWN",
        "AdmissionFence",
        "ApprovalDesk",
        "Decision",
        "CallIntent",
        "CallScope",
        "Edge",
        "EventBus",
        "EventType",
        "FlowEvent",
        "FlowExecutor",
        "Graph",
        "InFlightDoubt",
        "IntentHook",
        "LIBRARY_DEFAULT_MAX_SPAWN",
        "LOOP_MEMBER",
        "LoopRunner",
        "import_until",
        "NodeKind",
        "NodeStatus",
        "Operation",
        "PauseGate",
        "STEER_CLOSE",
        "STEER_OPEN",
        "SharedContext",
        "SpawnRejection",
        "Steering",
        "TERMINAL",
        "build_graph",
        "render_steer",
        "step_event",
        "unenforceable",
    },
    "steerflow.mcp": {
        "CONTROL_TOOLS",
        "READ_TOOLS",
        "build_server",
        "serve",
    },
    "steerflow.orchestrate": {
        "AdmissionClosed",
        "ApprovalRequested",
        "CheckpointFailed",
        "CheckpointReconciled",
        "CheckpointSaved",
        "ControlApplied",
        "EventStream",
        "EventsDropped",
        "FlowOptions",
        "FlowResult",
        "FlowRun",
        "NodeCompleted",
        "NodeFailed",
        "NodeOutcome",
        "NodePaused",
        "ModelStep",
        "ToolCallEnded",
        "ToolCallStarted",
        "NodeReplayed",
        "NodeSkipped",
        "NodeStarted",
        "NodeWithheld",
        "PlanReady",
        "PlanWarning",
        "ResumeSeed",
        "RunEvent",
        "SpawnAccepted",
        "SpawnRejected",
        "graph_text",
        "load_branch",
        "node_detail",
        "prepare_resume",
        "read_run",
        "resume_run",
        "result_of",
        "run_flow",
        "run_result",
    },
    "steerflow.plan": {
        "AGENT_ID_PATTERN",
        "CODE_SOURCE",
        "COMPACT_BYTES",
        "COMPACT_RECORDS",
        "CompactBound",
        "Dependency",
        "Edge",
        "EdgeWhen",
        "Loop",
        "MAX_ARTIFACT_PATH",
        "MAX_PLAN_ENTRIES",
        "Op",
        "Plan",
        "PlanEntry",
        "PlanFile",
        "ReactivePolicy",
        "Role",
        "RoleSpec",
        "SYNTHESIS_KEY",
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
    },
    "steerflow.providers": {
        "BUILTIN_NAMES",
        "ConversationItem",
        "DependencyResult",
        "ENTRY_POINT_GROUP",
        "EchoProvider",
        "FunctionProvider",
        "INVOCATION_LOG",
        "USAGE_MEMBERS",
        "Message",
        "ModelTurn",
        "NodeCall",
        "PlanReply",
        "PlanRequest",
        "Price",
        "Provider",
        "ProviderCache",
        "ProviderRequest",
        "ProviderResponse",
        "ScriptProvider",
        "StepReply",
        "StepRequest",
        "ToolCall",
        "ToolResult",
        "ToolSpec",
        "Usage",
        "echo_text",
        "ensure_leg_dir",
        "is_leg_key",
        "load_script",
        "make_provider",
        "write_leg_file",
    },
    "steerflow.resume": {
        "ReplayPlan",
        "ReplaySpawn",
        "RerunFrom",
        "RunTarget",
        "paid_nodes",
        "plan_replay",
        "rerun_cut",
        "resolve_run_target",
    },
    "steerflow.state": {
        "BUSY_TIMEOUT_S",
        "DB_CONNECT_TIMEOUT_ENV",
        "admission_wait",
        "connect_timeout_s",
        "ControlRow",
        "ControlVerb",
        "CopyReport",
        "DEFAULT_LEASE_S",
        "HEARTBEAT_STALE_S",
        "HOST_ID_ENV",
        "LEASE_ENV",
        "InvocationKind",
        "InvocationRow",
        "NodeKind",
        "NodeRow",
        "NodeStatus",
        "NodeUpdate",
        "Owner",
        "Phase",
        "PlayRow",
        "ResolvedTarget",
        "ResumeClaim",
        "ResumedBy",
        "SCHEMA_VERSION",
        "STATE_DB_URL_ENV",
        "SessionRow",
        "SessionStatus",
        "StateBackend",
        "StateDB",
        "StateTransaction",
        "copy_state",
        "db_exists",
        "effective_status",
        "normalize_state_db_url",
        "open_copy_target",
        "holds_lease",
        "lease_seconds",
        "owner_alive",
        "process_start_time",
        "this_host",
    },
    "steerflow.studio": {
        "INSTALL_HINT",
        "Listening",
        "check_bind_host",
        "create_app",
        "csrf_token",
        "is_loopback",
        "listen",
        "serve",
    },
    "steerflow.views": {
        "CheckpointReport",
        "ControlEntry",
        "ControlStatus",
        "GraphNode",
        "NodeDetail",
        "NodeState",
        "OpenedArtifact",
        "PreflightRefusal",
        "Queued",
        "ResumePreflight",
        "RunGraph",
        "RunListing",
        "RunProgress",
        "RunResult",
        "RunView",
        "budget",
        "ApprovalRequest",
        "approve",
        "deny",
        "list_approvals",
        "checkpoint_report",
        "control_status",
        "list_runs",
        "message",
        "node_detail",
        "open_artifact",
        "pause",
        "resume",
        "resume_preflight",
        "run_graph",
        "run_progress",
        "run_result",
        "show_run",
        "stop",
    },
}


def test_expected_packages_are_pinned() -> None:
    assert set(EXPECTED) == set(PACKAGES), "pin the __all__ of a new public package in EXPECTED"


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_pinned(package: str) -> None:
    declared = set(_declared_all(package))
    expected = EXPECTED.get(package, set())
    assert declared == expected, (
        f"{package}.__all__ changed: added {sorted(declared - expected)}, "
        f"removed {sorted(expected - declared)}; update EXPECTED if that is intended"
    )


def test_the_root_exports_the_whole_error_tree() -> None:
    errors = importlib.import_module("steerflow.errors")
    tree = {
        name
        for name in errors.__all__
        if isinstance(getattr(errors, name), type)
        and issubclass(getattr(errors, name), steerflow.SteerflowError)
    }
    assert tree | {"ExitCode"} <= set(steerflow.__all__)
    assert all(getattr(steerflow, name) is getattr(errors, name) for name in tree)


def test_root_names_are_the_packages_objects() -> None:
    """A lazy root name is the very object of its public package, resolved on first use."""
    for name, module in steerflow._LAZY.items():
        assert not module.rpartition(".")[2].startswith("_"), f"{name} from a private module"
        if name == "resume" and isinstance(steerflow.resume, ModuleType):
            continue  # the subpackage's name: it forwards the call (test_resume_writer_names)
        assert getattr(steerflow, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = steerflow.nope  # type: ignore[attr-defined]


def test_importing_a_lower_package_does_not_load_the_orchestrator() -> None:
    code = "import sys, steerflow.state; print('steerflow.orchestrate' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"


async def test_a_library_user_runs_and_loads_a_flow_from_the_root(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("plan:\n  - agent_id: a\n    instruction: say a\n", encoding="utf-8")
    home = steerflow.resolve_home(tmp_path / "home")
    options = steerflow.FlowOptions(plan_path=plan, model="echo")
    result = await steerflow.run_flow(options, home=home)
    assert isinstance(result, steerflow.FlowResult)
    assert result.status == "completed" and result.run_dir is not None
    state, report = steerflow.load_checkpoint(result.run_dir)
    assert [entry["agent_id"] for entry in state["plan"]] == ["a"]
    assert report["status"] == "clean"
