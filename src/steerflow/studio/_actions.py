"""Actions with care: every recovery and a stop go through a confirmation page first.

Resume, retry failed (``--retry-failed``), fork (``--fork``) and rerun unsettled
(``--rerun-unsettled``) each show ``resume --dry-run``'s verdict for exactly those flags
(``views.resume_preflight``): which nodes are replayed from the checkpoint (free), which
run (paid), which completed nodes run again (paid again). Stop shows which calls are in
flight: with "now" they are cancelled, and a resume runs them again. A budget change
shows the new caps against what the resume chain has spent and says what follows (more
room, or admission closing at once). Only the page's POST (with the CSRF token) acts. A
second start while the first still runs, or a second stop or budget change while one is
queued, is answered with what is already under way, never "started" twice.
"""

from __future__ import annotations

import html
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from steerflow.control._queue import UNENFORCEABLE_KEY
from steerflow.studio._pages import duration, esc, in_flight_table, page, run_href, when
from steerflow.views import ControlEntry, ControlStatus, ResumePreflight, RunView

__all__ = [
    "MODES",
    "Started",
    "Starter",
    "already_page",
    "already_queued_page",
    "budget_confirm_page",
    "pending_control",
    "rerun_confirm_page",
    "rerun_flags",
    "resume_confirm_page",
    "stop_confirm_page",
    "unenforceable",
]

#: Recovery modes: the ``resume`` flags each adds, and the button's words.
MODES: dict[str, tuple[tuple[str, ...], str]] = {
    "resume": ((), "Resume"),
    "retry_failed": (("--retry-failed",), "Retry failed"),
    "fork": (("--fork",), "Fork"),
    "rerun_unsettled": (("--rerun-unsettled",), "Rerun unsettled"),
    # Started from a node page only (``/runs/RUN/rerun``): its flags name the node.
    "rerun_from": ((), "Rerun from here"),
}


@dataclass
class Started:
    """A ``steerflow resume`` the studio started and has not seen end."""

    pid: int
    mode: str
    started_at: float
    proc: subprocess.Popen[bytes]


class Starter:
    """Starts ``steerflow resume`` detached, at most one at a time per run."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._lock = threading.Lock()
        self._running: dict[str, Started] = {}

    def running(self, run_id: str) -> Started | None:
        """The resume of ``run_id`` this studio started that is still running, if any."""
        with self._lock:
            found = self._running.get(run_id)
            if found is not None and found.proc.poll() is not None:
                del self._running[run_id]
                found = None
            return found

    def start(self, run_id: str, mode: str, extra: Sequence[str] = ()) -> tuple[Started, bool]:
        """``(the resume, whether this call started it)``: a running one is returned as is.

        ``extra``: flags after the mode's (``--from NODE --instruction TEXT``), each one
        argument of the child's argv, never a shell word. Its output goes to
        ``<home>/studio/resume-<run>.log``; a thread reaps it.
        """
        with self._lock:
            found = self._running.get(run_id)
            if found is not None and found.proc.poll() is None:
                return found, False
            logs = self.home / "studio"
            logs.mkdir(mode=0o700, exist_ok=True)
            log = logs / f"resume-{run_id}.log"
            flags = MODES[mode][0]
            with open(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "steerflow", "--home", str(self.home), "resume",
                     run_id, *flags, *extra],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    start_new_session=True,  # a Ctrl-C in the studio's terminal stays there
                    close_fds=True,
                )  # fmt: skip
            started = self._running[run_id] = Started(proc.pid, mode, time.time(), proc)
        threading.Thread(target=proc.wait, name=f"reap-resume-{proc.pid}", daemon=True).start()
        return started, True


def _names(keys: list[str] | tuple[str, ...]) -> str:
    return esc(", ".join(keys) or "none")


def _verdict(preflight: ResumePreflight, ran: Sequence[str]) -> list[str]:
    """What the resume would do and what it may pay again, as ``resume --dry-run`` says."""
    lines = [
        f"<p>replayed from the checkpoint, not paid again ({len(preflight.replayed)}): "
        f"{_names(preflight.replayed)}</p>",
        f'<p id="confirm-runs"><strong>runs, paid ({len(preflight.to_run)})</strong>: '
        f"{_names(preflight.to_run)}</p>",
    ]
    again = [str(item.get("id")) for item in preflight.rerun_unsettled]
    repaid = [k for k in preflight.to_run if k in ran] + again
    if repaid:
        lines.append(
            f'<p class="error" id="confirm-repaid"><strong>paid again</strong> (ran before '
            f"and their side effects may repeat): {_names(repaid)}</p>"
        )
    if preflight.degraded_context:
        lines.append(f"<p>degraded context: {_names(preflight.degraded_context)}</p>")
    lines += [f'<p class="notice">{esc(w)}</p>' for w in preflight.warnings]
    lines += in_flight_table(preflight.in_flight_calls, preflight.in_flight_line)
    return lines


def resume_confirm_page(
    run_id: str,
    mode: str,
    preflight: ResumePreflight,
    running: Started | None,
    *,
    csrf: str,
    ran: Sequence[str] = (),
    caps: Sequence[str] = (),
) -> str:
    """The confirmation of one recovery mode: the dry run's verdict, then Start.

    ``ran``: the nodes whose calls were made before (failed, interrupted): running them
    again pays again. ``caps``: ``--max-cost``/``--max-tokens`` flags of a raised cap
    (the raise-cap-and-resume form), carried to the POST.
    """
    flags, label = MODES[mode]
    command = " ".join(["steerflow resume", run_id, *flags, *caps])
    body = [
        f'<h2>{esc(label)}: run <a href="{esc(run_href(run_id))}">{esc(run_id)}</a></h2>',
        f"<p>this runs <code>{esc(command)}</code> in the background. What "
        f"<code>{esc(command)} --dry-run</code> says:</p>",
    ]
    if preflight.refusal is not None:
        body.append(
            f'<p class="error" id="preflight-refusal"><strong>refused: '
            f"{esc(preflight.refusal.code)}</strong>: {esc(preflight.refusal.message)}</p>"
        )
    else:
        body += _verdict(preflight, ran)
    if running is not None:
        body.append(_already(running))
    elif preflight.refusal is None:
        action = esc(run_href(run_id) + "/resume")
        body.append(
            f'<form method="post" action="{action}">'
            f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
            f'<input type="hidden" name="mode" value="{esc(mode)}">{_cap_fields(caps)}'
            f"<button>Start {esc(label.lower())}</button></form>"
        )
    body.append(f'<p><a href="{esc(run_href(run_id))}">back to the run</a></p>')
    return page(f"steerflow studio: {label.lower()} {run_id}", "\n".join(body))


def _cap_fields(caps: Sequence[str]) -> str:
    """The raised caps as hidden fields (``--max-cost 2.0`` -> ``max_cost=2.0``)."""
    pairs = zip(caps[::2], caps[1::2], strict=False)
    return "".join(
        f'<input type="hidden" name="{esc(flag[2:].replace("-", "_"))}" value="{esc(value)}">'
        for flag, value in pairs
    )


def rerun_flags(node: str, instruction: str | None) -> list[str]:
    """``--from NODE [--instruction TEXT]``: the rerun's flags (no edit, no flag)."""
    return ["--from", node, *(["--instruction", instruction] if instruction is not None else [])]


def rerun_confirm_page(
    run_id: str,
    node: str,
    instruction: str | None,
    preflight: ResumePreflight,
    running: Started | None,
    *,
    csrf: str,
) -> str:
    """The confirmation of "Rerun from here": the fork's dry run, what it pays, then Start.

    ``instruction``: the edited text (None: the node runs with its own).
    """
    command = "steerflow resume " + run_id + " --from " + node
    if instruction is not None:
        command += " --instruction TEXT"
    body = [
        f'<h2>rerun run <a href="{esc(run_href(run_id))}">{esc(run_id)}</a> from {esc(node)}</h2>',
        f"<p>this starts <code>{esc(command)}</code> in the background: a fork (a new run; "
        "this one is unchanged). What its <code>--dry-run</code> says:</p>",
    ]
    if instruction is not None:
        body.append(
            f'<h3>edited instruction</h3><pre id="rerun-instruction">{esc(instruction)}</pre>'
        )
    if preflight.refusal is not None:
        body.append(
            f'<p class="error" id="preflight-refusal"><strong>refused: '
            f"{esc(preflight.refusal.code)}</strong>: {esc(preflight.refusal.message)}</p>"
        )
    else:
        paid = [str(k) for k in (preflight.rerun_from or {}).get("rerun", [])]
        body += [
            f"<p>replayed from the checkpoint, not paid again ({len(preflight.replayed)}): "
            f"{_names(preflight.replayed)}</p>",
            f'<p class="error" id="confirm-rerun"><strong>runs again, paid ({len(paid)})'
            f"</strong>: {_names(paid)}</p>",
        ]
        body += [f'<p class="notice">{esc(w)}</p>' for w in preflight.warnings]
        body += in_flight_table(preflight.in_flight_calls, preflight.in_flight_line)
    if running is not None:
        body.append(_already(running))
    elif preflight.refusal is None:
        edited = (
            # Exactly the text given (bidi controls kept): a hidden value is never shown.
            f'<input type="hidden" name="instruction" value="{html.escape(instruction)}">'
            if instruction is not None
            else ""
        )
        body.append(
            f'<form method="post" action="{esc(run_href(run_id) + "/rerun")}">'
            f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
            f'<input type="hidden" name="node" value="{esc(node)}">{edited}'
            "<button>Start the rerun</button></form>"
        )
    body.append(f'<p><a href="{esc(run_href(run_id))}">back to the run</a></p>')
    return page(f"steerflow studio: rerun {run_id} from {node}", "\n".join(body))


def _already(running: Started) -> str:
    return (
        f'<p class="notice" id="already-running">a {esc(MODES[running.mode][1].lower())} of '
        f"this run is already running (pid {running.pid}, started {esc(when(running.started_at))}"
        "): it is not started twice; its new run is listed under resumes once it has a "
        "session</p>"
    )


def already_page(run_id: str, running: Started) -> str:
    """What a second Start says while the first still runs."""
    return page(
        f"steerflow studio: {run_id}",
        _already(running) + f'<p><a href="{esc(run_href(run_id))}">back to the run</a></p>',
    )


def stop_confirm_page(
    view: RunView, control: ControlStatus | None, *, now: bool, reason: str, csrf: str
) -> str:
    """The confirmation of a stop: what is in flight and what a resume would run again."""
    run = view.run_id
    flying = [n for n in view.nodes if n.status == "running"]
    body = [f'<h2>stop run <a href="{esc(run_href(run))}">{esc(run)}</a></h2>']
    listed = ", ".join(f"{n.id} ({duration(n.duration_s)})" for n in flying) or "none"
    if now:
        body.append(
            f'<p class="error" id="confirm-repaid"><strong>stop now</strong> cancels the calls '
            f"in flight: {esc(listed)}. They were paid for and a resume runs them again.</p>"
        )
    else:
        body.append(
            f"<p>stop when idle: nothing new starts; the calls in flight finish and are kept "
            f"({esc(listed)}).</p>"
        )
    body.append("<p>the run exits 75 (resumable); the checkpoint keeps what completed.</p>")
    pending = pending_control(control, "stop")
    if view.status != "running" or not view.session_id:
        body.append(f'<p class="notice">the run is {esc(view.status or "-")}: nothing to stop</p>')
    elif pending is not None:
        body.append(_queued_notice(pending))
    else:
        action = esc("/sessions/" + quote(view.session_id, safe="") + "/control")
        body.append(
            f'<form method="post" action="{action}">'
            f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
            f'<input type="hidden" name="back" value="{esc(run_href(run))}">'
            '<input type="hidden" name="verb" value="stop">'
            f'<input type="hidden" name="now" value="{"1" if now else ""}">'
            f'<input type="hidden" name="reason" value="{esc(reason)}">'
            f"<button>{'Stop now' if now else 'Stop'}</button></form>"
        )
    body.append(f'<p><a href="{esc(run_href(run))}">back to the run</a></p>')
    return page(f"steerflow studio: stop {run}", "\n".join(body))


def pending_control(control: ControlStatus | None, verb: str) -> ControlEntry | None:
    """The oldest control of ``verb`` that is queued and not yet claimed or applied."""
    for c in control.controls if control is not None else ():
        if c.verb == verb and not c.result:
            return c
    return None


def _queued_notice(entry: ControlEntry) -> str:
    what = "a stop" if entry.verb == "stop" else f"a {entry.verb} change"
    return (
        f'<p class="notice" id="already-queued">{esc(what)} is already queued (control '
        f"{esc(entry.id)} by {esc(entry.sender or 'unknown')}, sent {esc(when(entry.created_at))}"
        ", not yet applied): it is not sent twice; once the flow has applied it, the control "
        "log says so</p>"
    )


def already_queued_page(back: str, entry: ControlEntry) -> str:
    """What a second Stop or Set cap says while the first is still queued."""
    return page(
        "steerflow studio: already queued",
        _queued_notice(entry) + f'<p><a href="{esc(back)}">back</a></p>',
    )


def _cap_words(value: float | int | None, *, usd: bool) -> str:
    if value is None:
        return "none"
    return f"${float(value):.4f}" if usd else f"{int(value):,} tokens"


def _spent_tokens(spent: dict[str, Any]) -> int:
    return int(spent.get("input_tokens") or 0) + int(spent.get("output_tokens") or 0)


def _budget_effect(caps: dict[str, float | int | None], spent: dict[str, Any]) -> str:
    """What the new caps do, against what the chain has spent (``Meter``'s rule)."""
    cost = spent.get("cost_usd")
    tokens = _spent_tokens(spent)
    reached: list[str] = []
    room: list[str] = []
    new_cost, new_tokens = caps.get("max_cost"), caps.get("max_tokens")
    if new_cost is not None:
        left = float(new_cost) - float(cost or 0)
        (reached if left <= 0 else room).append(f"${max(left, 0):.4f} more")
    if new_tokens is not None:
        left_tokens = int(new_tokens) - tokens
        (reached if left_tokens <= 0 else room).append(f"{max(left_tokens, 0):,} more tokens")
    if reached:
        return (
            '<p class="error" id="confirm-effect">the new cap is at or below what the chain '
            "has spent: admission closes at the run's next admission, nothing new starts, the "
            "calls in flight finish, and the run ends <code>budget_exhausted</code> (exit 76, "
            "resumable with a higher <code>--max-cost</code>/<code>--max-tokens</code>)</p>"
        )
    return (
        f'<p id="confirm-effect">from its next admission on, the run may spend '
        f"{esc(' and '.join(room))} (the whole resume chain counts) before admission "
        "closes; a cap left empty keeps the one in force</p>"
    )


def unenforceable(view: RunView, caps: Mapping[str, object]) -> str | None:
    """Why the run cannot enforce one of ``caps`` (its models have no price...), else None.

    The run records it on its session (``control.UNENFORCEABLE_KEY``); the ``ctl``
    writer refuses such a cap with the same words.
    """
    recorded = view.metadata.get(UNENFORCEABLE_KEY)
    if not isinstance(recorded, dict):
        return None
    for name in ("max_cost", "max_tokens"):
        why = recorded.get(name)
        if caps.get(name) is not None and isinstance(why, str):
            return f"unenforceable: {why}"
    return None


def budget_confirm_page(
    view: RunView,
    control: ControlStatus | None,
    caps: dict[str, float | int | None],
    *,
    csrf: str,
) -> str:
    """The confirmation of ``ctl budget``: new caps against the caps in force and the spend."""
    run = view.run_id
    body = [f'<h2>change the budget of run <a href="{esc(run_href(run))}">{esc(run)}</a></h2>']
    current = (control.budget if control is not None else None) or {}
    spent = (control.spent if control is not None else None) or {}
    tokens = _spent_tokens(spent)
    cost = spent.get("cost_usd")
    body.append(
        '<table id="confirm-budget"><thead><tr><th></th><th>max cost</th><th>max tokens</th>'
        "</tr></thead><tbody>"
        f"<tr><th>in force</th><td>{esc(_cap_words(current.get('max_cost'), usd=True))}</td>"
        f"<td>{esc(_cap_words(current.get('max_tokens'), usd=False))}</td></tr>"
        f"<tr><th>new</th><td>{esc(_cap_words(caps.get('max_cost'), usd=True))}</td>"
        f"<td>{esc(_cap_words(caps.get('max_tokens'), usd=False))}</td></tr>"
        f"<tr><th>spent</th><td>{esc('-' if cost is None else f'${float(cost):.4f}')}</td>"
        f"<td>{tokens:,} tokens</td></tr></tbody></table>"
    )
    refused = unenforceable(view, caps)
    if refused is None:
        body.append(_budget_effect(caps, spent))
    pending = pending_control(control, "budget")
    if refused is not None:
        # Said here, not after "Set the new cap": the writer would refuse it (decision 246).
        body.append(f'<p class="error" id="budget-refused">refused: {esc(refused)}</p>')
    elif view.status != "running" or not view.session_id:
        body.append(
            f'<p class="notice">the run is {esc(view.status or "-")}: no flow would apply a new '
            "cap; <code>steerflow resume RUN --max-cost USD</code> resumes it with one</p>"
        )
    elif pending is not None:
        body.append(_queued_notice(pending))
    else:
        action = esc("/sessions/" + quote(view.session_id, safe="") + "/control")
        hidden = "".join(
            f'<input type="hidden" name="{name}" value="{esc("" if v is None else str(v))}">'
            for name, v in (("max_cost", caps.get("max_cost")),
                            ("max_tokens", caps.get("max_tokens")))
        )  # fmt: skip
        body.append(
            f'<form method="post" action="{action}">'
            f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
            f'<input type="hidden" name="back" value="{esc(run_href(run))}">'
            f'<input type="hidden" name="verb" value="budget">{hidden}'
            "<button>Set the new cap</button></form>"
        )
    body.append(f'<p><a href="{esc(run_href(run))}">back to the run</a></p>')
    return page(f"steerflow studio: budget {run}", "\n".join(body))
