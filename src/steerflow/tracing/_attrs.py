"""Attribute names: the GenAI semantic conventions where they have one, else ``steerflow.*``.

Content (prompts, replies, tool arguments) only with
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``, as the conventions say.
"""

from __future__ import annotations

import json
import os

__all__ = ["capture_content", "content_json", "provider_of"]

CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

# GenAI semantic conventions (gen_ai.*)
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_ARGS = "gen_ai.tool.call.arguments"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION_ID = "gen_ai.conversation.id"
# Phoenix (OpenInference) draws a span by its kind; other tools ignore the attribute.
OPENINFERENCE_KIND = "openinference.span.kind"

# steerflow's own
RUN_ID = "steerflow.run.id"
RUN_NAME = "steerflow.run.name"
RUN_KIND = "steerflow.run.kind"
SESSION_ID = "steerflow.session.id"
RUN_STATUS = "steerflow.run.status"
EXIT_CODE = "steerflow.run.exit_code"
RESUMED_FROM = "steerflow.run.resumed_from"
COST = "steerflow.usage.cost_usd"
NODE_ID = "steerflow.node.id"
NODE_KEY = "steerflow.node.key"
NODE_KIND = "steerflow.node.kind"
NODE_ASSIGNEE = "steerflow.node.assignee"
NODE_ATTEMPT = "steerflow.node.attempt"
NODE_STATUS = "steerflow.node.status"
NODE_ERROR = "steerflow.node.error"
CALL_ID = "steerflow.call.id"
CALL_ATTEMPT = "steerflow.call.attempt"
CALL_OUTCOME = "steerflow.call.outcome"
TOOL_OUTCOME = "steerflow.tool.outcome"
TOOL_DURATION = "steerflow.tool.duration_s"
LINK_KIND = "steerflow.link"


def capture_content() -> bool:
    """Whether prompts, replies and tool arguments go on spans (off unless ``true``)."""
    return os.environ.get(CAPTURE_ENV, "").strip().lower() == "true"


def _split(model: str) -> tuple[str, str]:
    """``(vendor, rest)`` at the first ``/`` or ``:`` (``openai/gpt-4o``, ``script:PATH``)."""
    cut = min((i for i in (model.find("/"), model.find(":")) if i > 0), default=-1)
    return (model[:cut], model[cut + 1 :]) if cut > 0 else (model, "")


def provider_of(model: str | None) -> str:
    """``gen_ai.provider.name`` of a ``--model`` spec: its vendor prefix (``openai``...)."""
    return _split(model)[0] if model else "unknown"


def model_of(model: str | None) -> str:
    """``gen_ai.request.model``: the spec without its vendor prefix (``echo`` as it is)."""
    if not model:
        return "unknown"
    return _split(model)[1] or model


def content_json(role: str, text: object) -> str:
    """One message in the conventions' ``gen_ai.*.messages`` JSON form."""
    content = text if isinstance(text, str) else json.dumps(text, default=str)
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": content}]}])
