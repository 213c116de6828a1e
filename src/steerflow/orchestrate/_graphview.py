"""Readable views of a flow graph: an indented terminal tree and a Mermaid file."""

from __future__ import annotations

import re

from steerflow.executor import Graph

__all__ = ["graph_text", "mermaid"]


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
        who = f" ({op.assignee})" if op.assignee else ""
        after = f"  <- {', '.join(deps)}" if deps else "  (root)"
        status = "" if op.status == "pending" else f" [{op.status}]"
        lines.append(f"  {op.key}{who}{status}{after}")
    return "\n".join(lines)


def _mid(key: str) -> str:
    return "n_" + re.sub(r"[^A-Za-z0-9_]", "_", key)


def mermaid(graph: Graph) -> str:
    """The graph as a Mermaid flowchart (``graph.mmd``)."""
    lines = ["flowchart TD"]
    for op in graph:
        label = op.key + (f"<br/>{op.assignee}" if op.assignee else "")
        label = label.replace('"', "'")
        lines.append(f'    {_mid(op.key)}["{label}"]')
    for op in graph:
        for edge in op.edges:
            source = graph.ops[edge.source].key
            arrow = "-->" if edge.when == "completed" and not edge.if_contains else "-.->"
            text = "" if arrow == "-->" else f"|{edge.when}|"
            lines.append(f"    {_mid(source)} {arrow}{text} {_mid(op.key)}")
    return "\n".join(lines) + "\n"
