"""Models and agent workers behind one interface (CONTRACT §4)."""

from __future__ import annotations

from steerflow.providers._base import (
    USAGE_MEMBERS,
    ConversationItem,
    DependencyResult,
    Message,
    ModelTurn,
    PlanReply,
    PlanRequest,
    Provider,
    ProviderRequest,
    ProviderResponse,
    StepReply,
    StepRequest,
    ToolCall,
    ToolResult,
    ToolSpec,
    Usage,
)
from steerflow.providers._paths import ensure_leg_dir, is_leg_key, write_leg_file
from steerflow.providers._plugins import BUILTIN_NAMES, ENTRY_POINT_GROUP
from steerflow.providers._pricing import Price
from steerflow.providers._registry import ProviderCache, make_provider
from steerflow.providers.echo import EchoProvider, echo_text
from steerflow.providers.function import FunctionProvider, NodeCall
from steerflow.providers.script import INVOCATION_LOG, ScriptProvider, load_script

__all__ = [
    "BUILTIN_NAMES",
    "ENTRY_POINT_GROUP",
    "INVOCATION_LOG",
    "USAGE_MEMBERS",
    "ConversationItem",
    "DependencyResult",
    "EchoProvider",
    "FunctionProvider",
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
]
