"""Agent workers' JSON events rendered as readable live lines (issue 31, decision 193).

``claude -p --output-format stream-json`` and ``codex exec --json`` print one JSON
event per line as they work. The live view shows what an operator wants to see
(what the agent said, the command it ran, the file it edited, a tool's outcome), one
short line each, never the raw JSON. Unknown events render as nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["render_claude_event", "render_codex_event"]

_SHORT = 200
_EDITS = {"Edit": "edited", "MultiEdit": "edited", "Write": "wrote", "NotebookEdit": "edited"}


def _short(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= _SHORT else text[: _SHORT - 1] + "…"


def _tool_use(name: str, args: Mapping[str, Any]) -> str:
    if name == "Bash" and "command" in args:
        return f"$ {_short(args['command'])}\n"
    path = args.get("file_path") or args.get("notebook_path") or args.get("path")
    if name in _EDITS and path:
        return f"✎ {_EDITS[name]} {_short(path)}\n"
    if name == "Read" and path:
        return f"• read {_short(path)}\n"
    return f"• {name} {_short(dict(args))}\n" if args else f"• {name}\n"


def _tool_result(block: Mapping[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        content = " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    first = str(content or "").strip().splitlines()[:1]
    label = "error: " if block.get("is_error") else ""
    return f"  ↳ {label}{_short(first[0]) if first else '(no output)'}\n"


def render_claude_event(event: Mapping[str, Any]) -> str:
    """One ``stream-json`` event of the claude CLI as live text ("" for the uninteresting)."""
    kind = event.get("type")
    message = event.get("message")
    blocks = message.get("content") if isinstance(message, dict) else None
    if kind == "system" and event.get("subtype") == "init":
        return f"[claude session {_short(event.get('session_id', '?'))}]\n"
    if kind == "result":
        cost = event.get("total_cost_usd")
        spent = f", ${cost:.4f}" if isinstance(cost, int | float) else ""
        return f"[done: {_short(event.get('subtype', 'result'))}{spent}]\n"
    if not isinstance(blocks, list):
        return ""
    out = []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and kind == "assistant":
            out.append(str(block.get("text", "")).rstrip("\n") + "\n")
        elif block.get("type") == "tool_use":
            args = block.get("input")
            out.append(
                _tool_use(str(block.get("name", "tool")), args if isinstance(args, dict) else {})
            )
        elif block.get("type") == "tool_result":
            out.append(_tool_result(block))
    return "".join(out)


def render_codex_event(event: Mapping[str, Any]) -> str:
    """One ``codex exec --json`` event as live text ("" for the uninteresting)."""
    kind = event.get("type")
    item = event.get("item")
    if kind in ("turn.failed", "error"):
        error = event.get("error")
        detail = error.get("message") if isinstance(error, dict) else event.get("message")
        return f"[error: {_short(detail or kind)}]\n"
    if not isinstance(item, dict) or kind not in ("item.started", "item.completed"):
        return ""
    what = item.get("type")
    if what == "command_execution":
        if kind == "item.started":
            return f"$ {_short(item.get('command', ''))}\n"
        code = item.get("exit_code")
        return f"  ↳ exit {code}\n" if code is not None else ""
    if kind != "item.completed":
        return ""
    if what in ("agent_message", "reasoning") and isinstance(item.get("text"), str):
        prefix = "" if what == "agent_message" else "(thinking) "
        return f"{prefix}{item['text'].rstrip()}\n"
    if what == "file_change" and isinstance(item.get("changes"), list):
        return "".join(
            f"✎ {_short(c.get('kind', 'changed'))} {_short(c.get('path', '?'))}\n"
            for c in item["changes"]
            if isinstance(c, dict)
        )
    if what == "mcp_tool_call":
        return f"• {_short(item.get('server', '?'))}.{_short(item.get('tool', '?'))}\n"
    if what == "web_search":
        return f"• search {_short(item.get('query', ''))}\n"
    return ""
