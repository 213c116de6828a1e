"""What the two SDK providers share when they send one step of a tool node (issue 39).

``openai/`` and ``anthropic/`` shape a step's messages differently (a ``tool`` message per
result against ``tool_result`` blocks in one user message), but they read the step the
same way: the node's system prompt apart, then its inherited turns and the loop's
conversation as one sequence; and a tool call's arguments come back as JSON to be checked.
"""

from __future__ import annotations

import json
from typing import Any

from steerflow.errors import ProviderError
from steerflow.providers._base import ConversationItem, StepRequest
from steerflow.providers._conventions import split_history

__all__ = ["args_json", "step_items", "tool_args"]


def step_items(request: StepRequest) -> tuple[str | None, list[ConversationItem]]:
    """The step's system prompt (None if none) and every item after it, in order.

    No spawn guidance is added, unlike :meth:`SDKProvider.invoke`: a tool node's final
    reply is its response as is (the loop extracts no spawn block from it).
    """
    system, turns = split_history(request.node.history)
    return system, [*turns, *request.conversation]


def tool_args(spec: str, name: str, raw: object) -> dict[str, Any]:
    """A tool call's arguments as the model sent them, checked to be a JSON object.

    ``raw`` is the JSON text of an OpenAI call (``""`` from servers that send nothing for
    a call without arguments) or the decoded ``input`` of an Anthropic one. Anything that
    is not an object fails the step naming the tool: the loop cannot call a tool with it,
    and journaling it as is would replay a call that never could run.
    """
    if isinstance(raw, str):
        text = raw
        if not text.strip():
            return {}
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ProviderError(
                f"{spec}: the arguments of tool call {name!r} are not JSON ({exc}): {_clip(text)}"
            ) from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ProviderError(
            f"{spec}: the arguments of tool call {name!r} are not a JSON object: "
            f"{_clip(json.dumps(raw))}"
        )
    return raw


def args_json(args: dict[str, Any]) -> str:
    """A recorded call's arguments as the JSON text sent back to the model.

    Keys keep the order the model gave them, and non-ASCII stays as is, so the text sent
    back reads like the text the model wrote.
    """
    return json.dumps(args, ensure_ascii=False)


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
