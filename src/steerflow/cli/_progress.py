"""Live progress on stderr: one line per event while that stays readable, summaries after.

The rule (docs/decisions.md: "Progress at scale"): a plan of at most
:data:`PER_NODE_NODES` nodes gets one line per node event and per checkpoint save, as
always. A larger one does too while its routine lines (starts, completions, skips,
replays, pauses, spawns, saves) stay under :data:`BURST` per :data:`INTERVAL`; past that,
routine events are only counted and a summary line (done/running/failed/pending,
checkpoints saved, elapsed) is printed at most once per interval until a whole interval
passes below the burst. Failures, withheld nodes, steer deliveries, spawn refusals,
checkpoint trouble and warnings are always printed one by one, and so is each pause,
resume and stop the poller applies (:meth:`Progress.control_applied`, fed by
``Steering.on_applied``: those never reach the bus). The same rule holds on a terminal and
in a log: no cursor tricks, so the output stays greppable.

Colour is for people: on a terminal (or with ``FORCE_COLOR`` set) the lines go through
rich; anywhere else (a log, a pipe, a test) they are the same characters written plainly,
and rich is never imported. That keeps about a tenth of a ``flow`` process's start-up off
every scripted run (decision 389). A line is a list of ``(text, style)`` segments, never
markup, so no text from a plan or a model is parsed as markup or emoji codes.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from steerflow.cli._output import printable
from steerflow.executor import FlowEvent

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["BURST", "INTERVAL", "PER_NODE_NODES", "Progress"]

#: One printed line: ``(text, rich style or None)`` segments.
Segments = list[tuple[str, str | None]]

#: Plans up to this many nodes always get one line per event.
PER_NODE_NODES = 100
#: Routine lines allowed per interval before they are folded into summaries.
BURST = 10
#: Seconds per interval: at most one summary line each.
INTERVAL = 1.0

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
    "control_applied": ("steer delivered into", "magenta"),
    "checkpoint_failed": ("CHECKPOINT FAILED", "red"),
    "checkpoint_reconciled": (
        "checkpoint write failed, recovered from the durable prefix",
        "yellow",
    ),
    "plan_truncated": ("warning", "yellow"),
    "admission_closed": ("admission closed", "yellow"),
}
#: What an applied control means for the run, where that is not obvious.
_APPLIED = {"pause": ": nodes not yet started wait for a resume"}
#: Shown even in quiet mode.
_IMPORTANT = frozenset(
    {
        "node_failed",
        "checkpoint_failed",
        "checkpoint_reconciled",
        "plan_truncated",
        "spawn_rejected",
    }
)
#: Folded into summaries when they come fast; every other labelled event is always a line.
_ROUTINE = frozenset(
    {
        "node_started",
        "node_completed",
        "node_skipped",
        "node_replayed",
        "node_spawned",
        "node_paused",
        "checkpoint_saved",
    }
)


class Progress:
    """Event-bus subscriber that prints progress; ``quiet`` keeps only warnings and failures.

    ``clock`` (monotonic seconds) and ``file`` are injectable so tests count lines
    without waiting on real time.
    """

    def __init__(
        self,
        *,
        quiet: bool = False,
        clock: Callable[[], float] = time.monotonic,
        file: TextIO | None = None,
    ) -> None:
        self.file = file or sys.stderr
        self._console: Console | None = None
        self._colour = bool(os.environ.get("FORCE_COLOR")) or _is_terminal(self.file)
        self.quiet = quiet
        self.clock = clock
        self.started_at = clock()
        self.saved = 0
        self.total = 0
        self.counts = dict.fromkeys(("completed", "failed", "skipped", "withheld", "replayed"), 0)
        self.running = 0
        # The burst rule's state: the current interval, its routine events, summary mode.
        self._window_start = self.started_at
        self._in_window = 0
        self._summarising = False
        self._folded = 0  # routine events since the last summary, not printed one by one
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self, event: FlowEvent) -> None:
        """Event-bus subscriber."""
        self._count(event)
        if event.type == "plan_ready":
            if not self.quiet:
                self._plan_ready(event)
            return
        if event.type in _ROUTINE:
            if not self.quiet:
                self._routine(event)
            return
        if event.type in _STYLE and (not self.quiet or event.type in _IMPORTANT):
            self._print(_line(event))

    def control_applied(self, verb: str, control_id: str | None) -> None:
        """A ``Steering.on_applied`` callback: one line per pause, resume or stop applied."""
        if self.quiet:
            return
        # Only a stop has its control id here (the poller gives pause and resume none).
        detail = f" (control {control_id})" if control_id is not None else _APPLIED.get(verb, "")
        self._print([(f"operator {printable(verb)} applied", "magenta"), (printable(detail), None)])

    def close(self) -> None:
        """The run ended: print the last summary if events were folded since the previous one."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._folded:
            self._summary()

    # -- the burst rule ------------------------------------------------------------------------

    def _routine(self, event: FlowEvent) -> None:
        now = self.clock()
        if now - self._window_start >= INTERVAL:
            self._next_window(now)
        self._in_window += 1
        per_node = self.total <= PER_NODE_NODES or (
            not self._summarising and self._in_window <= BURST
        )
        if per_node:
            self._print(_line(event) if event.type != "checkpoint_saved" else self._saved())
            return
        self._summarising = True
        self._folded += 1
        self._arm_timer()

    def _next_window(self, now: float) -> None:
        """Close the interval that ended: summarise it, and leave summary mode if it was calm."""
        if self._folded:
            self._summary()
        self._summarising = self._summarising and self._in_window > BURST
        self._window_start, self._in_window = now, 0

    def _arm_timer(self) -> None:
        # A burst followed by a silence (a slow node) must not hold its summary back until
        # the next event: on a running loop, the summary also comes when the interval ends.
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        delay = max(0.0, self._window_start + INTERVAL - self.clock())
        self._timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = self.clock()
        if now - self._window_start >= INTERVAL:
            self._next_window(now)

    # -- counting and lines --------------------------------------------------------------------

    def _count(self, event: FlowEvent) -> None:
        kind = event.type
        if kind == "plan_ready":
            nodes = event.data.get("nodes")
            self.total = nodes if isinstance(nodes, int) else 0
        elif kind == "node_spawned":
            self.total += 1
        elif kind == "node_started":
            self.running += 1
        elif kind == "checkpoint_saved":
            self.saved += 1
        elif kind in ("node_completed", "node_failed"):
            # A node that failed around its call (an internal error) may never have started.
            self.running = max(0, self.running - 1)
            self.counts[kind.removeprefix("node_")] += 1
        elif kind in ("node_skipped", "node_withheld", "node_replayed"):
            self.counts[kind.removeprefix("node_")] += 1

    def _plan_ready(self, event: FlowEvent) -> None:
        counts = f": {event.data.get('nodes')} nodes, spawn budget {event.data.get('max_spawn')}"
        self._print([("plan ready", "bold"), (counts, None)])
        if event.data.get("graph"):
            self._print([(printable(event.data["graph"], keep_newlines=True), None)])

    def _saved(self) -> Segments:
        return [(f"  checkpoint saved (#{self.saved})", "dim")]

    def _print(self, segments: Segments) -> None:
        if not self._colour:
            self.file.write("".join(text for text, _ in segments) + "\n")
            self.file.flush()
            return
        from rich.text import Text

        if self._console is None:
            from rich.console import Console

            self._console = Console(file=self.file, highlight=False, soft_wrap=True)
        self._console.print(Text.assemble(*((text, style or "") for text, style in segments)))

    def summary_text(self) -> str:
        """The summary line's text (no markup)."""
        c = self.counts
        done = c["completed"] + c["failed"] + c["skipped"] + c["replayed"]
        pending = max(0, self.total - done - c["withheld"] - self.running)
        detail = f"{c['completed']} completed, {c['failed']} failed, {c['skipped']} skipped"
        if c["replayed"]:
            detail += f", {c['replayed']} replayed"
        if c["withheld"]:
            detail += f", {c['withheld']} withheld"
        return (
            f"progress: {done}/{self.total} done ({detail}), {self.running} running, "
            f"{pending} pending; {self.saved} checkpoints saved; "
            f"{self.clock() - self.started_at:.1f}s elapsed"
        )

    def _summary(self) -> None:
        self._folded = 0
        self._print([(self.summary_text(), "bold")])


def _is_terminal(file: TextIO) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _line(event: FlowEvent) -> Segments:
    label, colour = _STYLE[event.type]
    detail = ""
    if event.type == "control_applied":
        count = event.data.get("messages")
        detail = f" ({count} operator message{'s' if count != 1 else ''})"
    elif event.data.get("escalation"):
        # An escalation retry: which attempt of which failed node, at which model.
        detail = (
            f" (escalation {event.data['escalation']} after {event.data.get('emitter')}, "
            f"model {event.data.get('model')})"
        )
    elif event.data.get("model"):
        detail = f" (model {event.data['model']})"
    elif event.data.get("reason"):
        detail = f" ({event.data['reason']}"
        detail += f": {event.data['detail']})" if event.data.get("detail") else ")"
    elif event.data.get("message"):
        detail = f": {event.data['message']}"
    elif event.data.get("error"):
        detail = f": {event.data['error']}"
    # A run-wide event has no node: "warning: text", not "warning : text".
    text = f" {event.node_key}{detail}" if event.node_key else detail
    # ESC/OSC bytes from a model or a plan are escaped before they reach the terminal.
    return [(label, colour), (printable(text), None)]
