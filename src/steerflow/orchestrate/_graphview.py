"""Readable views of a flow graph: an indented terminal tree and a Mermaid file."""

from __future__ import annotations

import re

from steerflow.executor import Graph

__all__ = ["graph_text", "mermaid"]

# Assignees come from plan files and planner replies: the terminal tree and graph.mmd
# (which gets `cat`) show their control characters, newlines included, as ``\xNN``,
# like the CLI's ``printable`` (which this layer may not import).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")


def _visible(text: str) -> str:
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def graph_text(graph: Graph) -> str:
    """One line per node, in plan order, naming its dependencies and edge conditions."""
    lines = []
    for op in graph:
        deps = []
        for edge in op.edges:
            source = graph.ops[edge.source].key
            cond = "" if edge.when == "completed" else f" [{edge.when}]"
            if edge.if_contains:
                cond += f" [contains {edge.if_contains!r}]"
            deps.append(source + cond)
        who = f" ({_visible(op.assignee)})" if op.assignee else ""
        after = f"  <- {', '.join(deps)}" if deps else "  (root)"
        if op is graph.synthesis:
            after = "  <- every worker's result (runs last)"
        status = "" if op.status == "pending" else f" [{op.status}]"
        lines.append(f"  {_visible(op.key)}{who}{status}{after}")
    return "\n".join(lines)


def _mid(key: str) -> str:
    return "n_" + re.sub(r"[^A-Za-z0-9_]", "_", key)


def mermaid(graph: Graph) -> str:
    """The graph as a Mermaid flowchart (``graph.mmd``)."""
    lines = ["flowchart TD"]
    for op in graph:
        label = _visible(op.key) + (f"<br/>{_visible(op.assignee)}" if op.assignee else "")
        label = label.replace('"', "'")
        lines.append(f'    {_mid(op.key)}["{label}"]')
    for op in graph:
        for edge in op.edges:
            source = graph.ops[edge.source].key
            arrow = "-->" if edge.when == "completed" and not edge.if_contains else "-.->"
            text = "" if arrow == "-->" else f"|{edge.when}|"
            lines.append(f"    {_mid(source)} {arrow}{text} {_mid(op.key)}")
    return "\n".join(lines) + "\n"
