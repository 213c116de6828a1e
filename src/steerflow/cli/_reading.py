"""Human and JSON output of ``show RUN NODE`` and ``result RUN``, and the result tail of a flow.

The data comes from :mod:`steerflow.orchestrate._detail`; this module only prints it.
Every text that came from outside goes through ``printable``; ``--raw`` and ``--json``
stay exact.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from steerflow.cli._output import emit_json, emit_raw, emit_text, printable, warn
from steerflow.errors import ExitCode, NoResponseError, SteerflowError

__all__ = [
    "RESULT_TAIL_LINES",
    "flow_result_text",
    "fmt_duration",
    "fmt_usage",
    "result_tail",
    "show_node",
    "show_result",
]

#: Lines of the result that ``flow``/``play``/``resume`` print before pointing at ``result``.
RESULT_TAIL_LINES = 40


def fmt_duration(seconds: object) -> str:
    """``0.42s``, ``12.3s``, ``4m05s``; ``-`` when unknown."""
    if not isinstance(seconds, (int, float)):
        return "-"
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{rest:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def fmt_usage(usage: object) -> str:
    """``120 in / 30 out tokens, $0.0012``; ``not reported`` when the provider gave none."""
    if not isinstance(usage, dict) or all(usage.get(k) in (None, 0) for k in usage):
        return "not reported"
    text = f"{usage.get('input_tokens') or 0} in / {usage.get('output_tokens') or 0} out tokens"
    if usage.get("cost_usd") is not None:
        text += f", ${usage['cost_usd']:.4f}"
    return text


def _when(epoch: object) -> str:
    if not isinstance(epoch, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _block(title: str, text: str | None, missing: str) -> list[str]:
    if text is None:
        return [f"{title}: {missing}"]
    return [f"{title}:", printable(text, keep_newlines=True), ""]


def _node_lines(d: dict[str, Any]) -> list[str]:
    from steerflow.orchestrate._detail import response_text

    status = d["status"]
    if d["replayed"]:
        origin = d.get("replayed_from") or {}
        status += f" (replayed: recorded by run {printable(origin.get('run_id') or '?')})"
    lines = [
        f"node: {printable(d['id'])}  ({d['kind']})  run: {d['run_id']}",
        f"status: {status}",
    ]
    if d.get("note"):
        lines.append(f"note: {printable(d['note'])}")
    if d.get("checkpoint_error"):
        lines.append(f"checkpoint: cannot be read ({printable(d['checkpoint_error'])})")
    lines += [
        f"assignee: {printable(d['assignee'] or '-')}",
        f"model: {printable(d['model'] or '-')}",
    ]
    if d.get("escalation_attempt") is not None:
        lines.append(f"escalation attempt: {printable(d['escalation_attempt'])}")
    lines += [
        f"started: {_when(d['started_at'])}  ended: {_when(d['ended_at'])}  "
        f"duration: {fmt_duration(d['duration_s'])}",
        f"usage: {fmt_usage(d['usage'])}",
    ]
    if d.get("parent"):
        lines.append(f"spawned by: {printable(d['parent'])}")
    if d.get("spawned"):
        lines.append("spawned: " + ", ".join(printable(k) for k in d["spawned"]))
    if d.get("depends_on"):
        lines.append("depends on: " + ", ".join(printable(k) for k in d["depends_on"]))
    if d.get("artifacts"):
        names = [a.get("path") if isinstance(a, dict) else a for a in d["artifacts"]]
        lines.append("artifacts: " + ", ".join(printable(n) for n in names))
    lines.append("")
    not_rendered = (
        "not recorded (the state DB has no row for this call)"
        if d["status"] in ("completed", "failed")
        else "not rendered yet (the node has not run)"
    )
    lines += _block("instruction (as the provider received it)", d["instruction"], not_rendered)
    if d["status"] == "failed":
        lines += _block("error", d["error"], "not recorded")
    else:
        response = None if d["response"] is None else response_text(d["response"])
        lines += _block("response", response, f"none ({d['status']})")
    return lines


def show_node(home: Path, target: str, node: str, *, as_json: bool, raw: bool) -> int:
    """``show TARGET NODE``: one node in full."""
    from steerflow.orchestrate._detail import node_detail, response_text

    detail = node_detail(home, target, node)
    if raw:
        if detail["response"] is None:
            why = f"error: {detail['error']}" if detail["error"] else detail["note"] or ""
            raise NoResponseError(
                f"node {detail['id']!r} of run {detail['run_id']} has no response "
                f"(status {detail['status']}{'; ' + why if why else ''})"
            )
        emit_raw(response_text(detail["response"]))
        return 0
    if as_json:
        emit_json(detail)
        return 0
    emit_text("\n".join(_node_lines(detail)))
    return 0


def show_result(home: Path, target: str, *, as_json: bool) -> int:
    """``result TARGET``: exit 0 for a completed run, 1 otherwise (3 raised when unreadable)."""
    from steerflow.orchestrate._detail import run_result

    result = run_result(home, target)
    code = ExitCode.OK if result["status"] == "completed" else ExitCode.FAILED
    if as_json:
        emit_json({**result, "exit_code": int(code)})
        return int(code)
    if result["status"] != "completed":
        warn(f"run {result['run_id']} is {result['status']}: printing what it recorded")
    emit_text(printable(result["text"], keep_newlines=True) or "(no result)")
    return int(code)


def flow_result_text(home: Path, run_dir: str | None) -> str | None:
    """The result text of a run that just finished, or None when nothing can be read."""
    if not run_dir or not (Path(run_dir) / "checkpoint.json").is_file():
        return None  # a dry run, or a run stopped while planning: nothing ran
    from steerflow.orchestrate._detail import read_run, result_of

    try:
        return str(result_of(read_run(home, run_dir))["text"])
    except SteerflowError as exc:
        warn(f"result: cannot be read: {exc}")
        return None


def result_tail(text: str, run_id: str | None) -> list[str]:
    """The first ``RESULT_TAIL_LINES`` lines of the result, then where the rest is."""
    lines = printable(text, keep_newlines=True).split("\n")
    out = ["result:", *lines[:RESULT_TAIL_LINES]]
    if len(lines) > RESULT_TAIL_LINES:
        rest = len(lines) - RESULT_TAIL_LINES
        out.append(f"... {rest} more lines: steerflow result {run_id or 'RUN'}")
    return out
