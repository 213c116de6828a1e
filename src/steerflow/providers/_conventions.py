"""The conventions every remote provider shares (SDK vendors and agent workers alike).

* **Spawn requests.** When a node may spawn, the system prompt asks the model
  to end its reply with one fenced ``json`` block holding
  ``{"spawn": [...]}``. :func:`extract_spawns` takes the last such block out of
  the reply and returns its raw items; the executor validates each.
* **Planning.** :func:`plan_system_prompt` and :func:`plan_user_prompt` ask for
  one JSON object matching the plan schema (with the previous validation error
  when there is one); :func:`parse_plan_reply` turns the reply into a dict.

Vendor modules import this module and nothing imports them back except the
registry's dispatch, so ``providers`` has no import cycle.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from steerflow.errors import ProviderError
from steerflow.providers._base import Message, PlanRequest

__all__ = [
    "SPAWN_GUIDANCE",
    "extract_spawns",
    "parse_plan_reply",
    "plan_system_prompt",
    "plan_user_prompt",
    "split_history",
    "system_with_spawn",
]

SPAWN_GUIDANCE = (
    "You may hand follow-up work to new agents. To do so, end your reply with exactly one "
    'fenced code block tagged json that holds an object {"spawn": [...]}. Each item is an '
    'object with "agent_id" (1-64 characters from letters, digits, "_", "." and "-"), '
    '"instruction" (a self-contained task), and optionally "assignee" (a role name), '
    '"depends_on" (a list of agent ids) and "artifacts" (relative paths of the files the new '
    "agent must leave in its own directory; it fails if it does not). Leave the block out "
    "when no follow-up work is needed."
)

_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\r?\n(.*?)```", re.DOTALL)


def split_history(history: Sequence[Message]) -> tuple[str | None, list[Message]]:
    """Separate system messages from the conversation turns.

    Args:
        history: The branch before this turn.

    Returns:
        The system messages joined by blank lines (None if there are none), and
        the remaining user/assistant turns in order.
    """
    system = [m.content for m in history if m.role == "system"]
    turns = [m for m in history if m.role != "system"]
    return ("\n\n".join(system) if system else None), turns


def system_with_spawn(system: str | None, allow_spawn: bool) -> str | None:
    """Append the spawn guidance to a system prompt when spawning is allowed."""
    if not allow_spawn:
        return system
    return SPAWN_GUIDANCE if not system else f"{system}\n\n{SPAWN_GUIDANCE}"


def extract_spawns(text: str) -> tuple[str, list[object]]:
    """Take the spawn block out of a reply.

    The last fenced block whose content is a JSON object with a ``spawn`` key
    is the spawn block. It is removed from the text; its ``spawn`` value is
    returned as a list of raw items (a non-list value becomes a one-item list,
    so the executor can reject it with a reason).

    Args:
        text: The model's reply.

    Returns:
        The reply without the spawn block, and the raw spawn items (empty when
        the reply carries no spawn block).
    """
    for match in reversed(list(_FENCE.finditer(text))):
        try:
            data = json.loads(match.group(1))
        except (ValueError, RecursionError):  # a model's reply is untrusted: never a crash
            continue
        if not isinstance(data, dict) or "spawn" not in data:
            continue
        value = data["spawn"]
        items: list[object] = list(value) if isinstance(value, list) else [value]
        rest = (text[: match.start()] + text[match.end() :]).strip()
        return rest, items
    return text, []


def plan_system_prompt(request: PlanRequest) -> str:
    """The system prompt of a planning call: reply with JSON matching the schema."""
    schema = json.dumps(request.schema, sort_keys=True, separators=(",", ":"))
    return (
        "You are the planner of a workflow engine that runs a graph of agents. Break the "
        "user's task into operations and reply with a single JSON object and nothing else "
        "(no prose, no code fences). The object must validate against this JSON Schema:\n"
        f"{schema}\n"
        f'Use at most {request.max_entries} entries in "plan". Give every entry a unique '
        '"agent_id", an "assignee" role, a self-contained "instruction", and "depends_on" '
        "listing the agent ids whose results it needs. The dependencies must not form a cycle."
    )


def plan_user_prompt(request: PlanRequest) -> str:
    """The user turn of a planning call, with the previous rejection when there is one."""
    if not request.feedback:
        return request.prompt
    return (
        f"{request.prompt}\n\nYour previous plan was rejected: {request.feedback}\n"
        "Reply again with a corrected JSON object."
    )


def parse_plan_reply(text: str, label: str) -> dict[str, object]:
    """Parse a planner reply into plan data.

    Accepts a bare JSON object, one wrapped in a code fence, or one surrounded
    by prose (the outermost ``{...}``). A bare JSON list is taken as the
    ``plan`` entries.

    Args:
        text: The model's reply.
        label: Prefix of error messages (the model spec).

    Returns:
        The decoded object (validated later by the caller).

    Raises:
        ProviderError: The reply holds no JSON object.
    """
    candidates = [text.strip()]
    candidates += [m.group(1).strip() for m in _FENCE.finditer(text)]
    first, last = text.find("{"), text.rfind("}")
    if 0 <= first < last:
        candidates.append(text[first : last + 1])
    error = "empty reply"
    for candidate in candidates:
        if not candidate:
            continue
        try:
            data = json.loads(candidate)
        except (ValueError, RecursionError) as exc:  # nested past the stack: not a plan
            error = str(exc)
            continue
        if isinstance(data, dict):
            return {str(k): v for k, v in data.items()}
        if isinstance(data, list):
            return {"plan": data}
        error = f"expected a JSON object, got {type(data).__name__}"
    head = " ".join(text.split())[:200]
    raise ProviderError(f"{label}: planner reply is not a JSON object ({error}): {head!r}")
