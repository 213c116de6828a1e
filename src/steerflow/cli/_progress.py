"""Live progress on stderr: node outcomes and checkpoint saves are separate lines."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape

from steerflow.cli._output import printable
from steerflow.executor import FlowEvent

__all__ = ["Progress"]

_STYLE = {
    "node_started": ("start", "cyan"),
    "node_completed": ("node completed", "green"),
    "node_failed": ("node FAILED", "red"),
    "node_skipped": ("node skipped", "yellow"),
    "node_replayed": ("node replayed", "blue"),
    "node_withheld": ("node withheld", "yellow"),
    "node_spawned": ("node spawned", "magenta"),
    "node_paused": ("paused before", "yellow"),
    "spawn_rejected": ("spawn rejected", "yellow"),
    "checkpoint_failed": ("CHECKPOINT FAILED", "red"),
    "checkpoint_reconciled": (
        "checkpoint write failed, recovered from the durable prefix",
        "yellow",
    ),
    "plan_truncated": ("warning", "yellow"),
    "admission_closed": ("admission closed", "yellow"),
}


class Progress:
    """Prints one line per event; ``quiet`` keeps only warnings and failures."""

    def __init__(self, *, quiet: bool = False) -> None:
        self.console = Console(file=sys.stderr, highlight=False, soft_wrap=True)
        self.quiet = quiet
        self.saved = 0

    def __call__(self, event: FlowEvent) -> None:
        """Event-bus subscriber."""
        if event.type == "checkpoint_saved":
            self.saved += 1
            if not self.quiet:
                self.console.print(f"[dim]  checkpoint saved (#{self.saved})[/dim]")
            return
        if event.type == "plan_ready" and not self.quiet:
            self.console.print(
                f"[bold]plan ready[/bold]: {event.data.get('nodes')} nodes, "
                f"spawn budget {event.data.get('max_spawn')}"
            )
            if event.data.get("graph"):
                graph = printable(event.data["graph"], keep_newlines=True)
                self.console.print(escape(graph))
            return
        label, colour = _STYLE.get(event.type, ("", ""))
        if not label:
            return
        important = event.type in {
            "node_failed",
            "checkpoint_failed",
            "checkpoint_reconciled",
            "plan_truncated",
            "spawn_rejected",
        }
        if self.quiet and not important:
            return
        detail = ""
        if event.data.get("reason"):
            detail = f" ({event.data['reason']}"
            detail += f": {event.data['detail']})" if event.data.get("detail") else ")"
        elif event.data.get("message"):
            detail = f": {event.data['message']}"
        elif event.data.get("error"):
            detail = f": {event.data['error']}"
        name = event.node_key or ""
        # Rich markup escaping does not touch ESC/OSC bytes: those are escaped first.
        self.console.print(f"[{colour}]{label}[/{colour}] {escape(printable(name + detail))}")
