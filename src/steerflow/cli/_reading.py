"""Human and JSON output of ``show RUN NODE`` and ``result RUN``, and the result tail of a flow.

The data comes from :mod:`steerflow.orchestrate._detail`; this module only prints it.
Every text that came from outside goes through ``printable``; ``--raw`` and ``--json``
stay exact.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from steerflow.cli._output import emit_json, emit_raw, emit_text, printable, warn
from steerflow.errors import CheckpointRecoveryError, ExitCode, NoResponseError, SteerflowError

__all__ = [
    "RESULT_TAIL_LINES",
    "artifact_lines",
    "flow_result_text",
    "fmt_bytes",
    "fmt_duration",
    "fmt_usage",
    "node_list",
    "result_tail",
    "show_node",
    "show_result",
    "show_verify",
]

#: Lines of the result that ``flow``/``play``/``resume`` print before pointing at ``result``.
RESULT_TAIL_LINES = 40
#: Nodes a flow's end-of-run summary lists one by one; a larger run lists counts and the
#: nodes that did not complete (at most this many), then points at ``show``.
NODE_LIST_MAX = 50


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


def fmt_bytes(count: object) -> str:
    """``812 B``, ``4.2 KiB``, ``1.29 GiB``; ``-`` when unknown."""
    if isinstance(count, bool) or not isinstance(count, int):
        return "-"
    if count < 1024:
        return f"{count} B"
    size, unit = count / 1024, "KiB"
    for bigger in ("MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{size:.{1 if size >= 10 else 2}f} {unit}"


def fmt_usage(usage: object) -> str:
    """``120 in / 30 out tokens, $0.0012``; ``not reported`` when the provider gave none."""
    from steerflow._usage import USAGE_MEMBERS, cost_text

    if not isinstance(usage, dict) or all(usage.get(k) in (None, 0) for k in USAGE_MEMBERS):
        return "not reported"
    text = f"{usage.get('input_tokens') or 0} in / {usage.get('output_tokens') or 0} out tokens"
    cached = [f"{usage[k]} cache {k.split('_')[1]}" for k in ("cache_read_tokens",
              "cache_write_tokens") if usage.get(k)]  # fmt: skip
    if cached:
        text += f" ({', '.join(cached)})"
    cost = cost_text(usage)  # a total leaving out unpriced calls says so (decision 249)
    if cost is not None:
        text += f", {cost}"
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
    if d.get("placement"):
        lines.append(f"ran on: {placement_text(d['placement'])}")
    edited = d.get("instruction_edited")
    if isinstance(edited, dict):
        source = printable(str(edited.get("run_id") or "?"))
        lines.append(f"instruction: edited (run {source} was rerun from this node with new text)")
        lines.append(f"  original: {printable(str(edited.get('original')))}")
        lines.append(f"  edited:   {printable(str(edited.get('instruction')))}")
    if d.get("parent"):
        lines.append(f"spawned by: {printable(d['parent'])}")
    if d.get("spawned"):
        lines.append("spawned: " + ", ".join(printable(k) for k in d["spawned"]))
    if d.get("depends_on"):
        lines.append("depends on: " + ", ".join(printable(k) for k in d["depends_on"]))
    if d.get("artifacts"):
        lines.append("artifacts:")
        lines += artifact_lines(d["artifacts"], indent="  ")
    if d.get("steps"):
        lines.append(f"steps: {len(d['steps'])}")
        lines += [f"  {step_line(step)}" for step in d["steps"]]
    lines.append("")
    not_rendered = (
        "not recorded (the state DB has no row for this call)"
        if d["status"] in ("completed", "failed")
        else "not rendered yet (the node has not run)"
    )
    lines += _block("instruction (as the provider received it)", d["instruction"], not_rendered)
    if d["status"] == "failed":
        lines += _block("error", d["error"], "not recorded")
    elif d.get("output") is not None:  # the response is this value's compact JSON
        shown = json.dumps(d["output"], indent=2, ensure_ascii=False)
        lines += _block("output (validated against its output_schema)", shown, "")
    else:
        response = None if d["response"] is None else response_text(d["response"])
        lines += _block("response", response, f"none ({d['status']})")
    return lines


def artifact_lines(artifacts: list[Any], *, indent: str) -> list[str]:
    """One line per artifact: path, then size and digest when recorded (else live names)."""
    lines = []
    for item in artifacts:
        if isinstance(item, dict):
            size = item.get("bytes")
            shown = f"{size} bytes" if isinstance(size, int) else "? bytes"
            lines.append(
                f"{indent}{printable(str(item.get('path')))}  {shown}  "
                f"{printable(str(item.get('digest') or '-'))}"
            )
        else:  # listed by a live run before its entry recorded them: a name only
            lines.append(f"{indent}{printable(str(item))}")
    return lines


def show_verify(
    home: Path, target: str, *, as_json: bool, accept_checkpoint_contract: bool = False
) -> int:
    """``verify TARGET``: exit 0 when every recorded artifact is settled, 3 otherwise."""
    from steerflow.artifacts import settle
    from steerflow.checkpoint import load_state
    from steerflow.errors import RefusedError
    from steerflow.resume import resolve_run_target

    run = resolve_run_target(home, target)
    checkpoint = run.run_dir / "checkpoint.json"
    if not os.path.lexists(checkpoint):  # a link, FIFO, ...: the loader names what it is
        raise RefusedError(f"run {run.run_id} has no checkpoint.json: nothing recorded to verify")
    state, _ = load_state(checkpoint, v2_lenient=True)
    settlement = settle(home, state, accept_checkpoint_contract=accept_checkpoint_contract)
    code = ExitCode.OK if settlement.settled else ExitCode.REFUSED
    if as_json:
        emit_json(
            {
                "run_id": run.run_id,
                "session_id": state.session_id or run.session_id,
                "status": "settled" if settlement.settled else "unsettled",
                "exit_code": int(code),
                **settlement.to_json(),
            }
        )
        return int(code)
    root = settlement.contract.root if settlement.contract else None
    lines = [
        f"run: {run.run_id}  session: {state.session_id or run.session_id}",
        f"artifact root: {printable(str(root)) if root else '(no artifact contract recorded)'}",
    ]
    if settlement.note:
        lines.append(f"warning: {printable(settlement.note)}")
    nodes = len(settlement.legs)
    if settlement.settled:
        lines.append(
            f"settled: {settlement.checked} recorded artifacts of {nodes} nodes match byte for byte"
        )
    else:
        lines.append(
            f"unsettled: {len(settlement.unsettled)} of {settlement.checked} recorded artifacts "
            "do not match:"
        )
        lines += [f"  {printable(u.describe())}" for u in settlement.unsettled]
        lines.append(f"resume refuses this run; `steerflow resume {run.run_id} --rerun-unsettled`")
        lines.append("runs those nodes and everything downstream of them again")
    emit_text("\n".join(lines))
    return int(code)


def step_line(step: dict[str, Any]) -> str:
    """One step of a tool node: ``3 tool  read_file {"path": "a.py"} -> completed 0.01s: ...``."""
    took = fmt_duration(step.get("duration_s"))
    if step["kind"] == "model":
        asked = ", ".join(str(c.get("name")) for c in step.get("tool_calls") or ())
        said = f"calls {asked}" if asked else f"replied: {_first_line(step.get('text'))}"
        steered = f" (+{len(step['steered'])} operator message)" if step.get("steered") else ""
        usage = fmt_usage(step.get("usage"))
        # the model's text (and a tool's name) is untrusted: no terminal controls reach stdout
        return printable(f"{step['index']:>3} model {said}{steered}  {took}  usage: {usage}")
    args = json.dumps(step.get("args"), sort_keys=True, ensure_ascii=False)
    if step["kind"] == "approval":  # issue 41: who decided, and why when denied
        what = f"tool {step.get('tool')}" if step.get("tool") else "node call"
        by = f" by {step['sender']}" if step.get("sender") else ""
        why = f": {_first_line(step.get('reason'))}" if step.get("reason") else ""
        return printable(
            f"{step['index']:>3} approval {step.get('request_id')} {what} {_clip(args)} -> "
            f"{step['status']}{by}{why}"
        )
    status = step["status"] + (f" ({step['decision']})" if step.get("decision") else "")
    cut = " [truncated]" if step.get("truncated") else ""
    return printable(
        f"{step['index']:>3} tool  {step.get('tool')} {_clip(args)} -> {status} {took}: "
        f"{_first_line(step.get('result'))}{cut}"
    )


def _first_line(text: object) -> str:
    return _clip("" if text is None else str(text).split("\n", 1)[0])


def _clip(text: str, most: int = 80) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


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
    from steerflow.orchestrate._detail import read_checkpoint_run, read_run, result_of
    from steerflow.state import admission_wait

    try:
        with admission_wait(0):  # a full server: print from the checkpoint, do not wait
            return str(result_of(read_run(home, run_dir))["text"])
    except CheckpointRecoveryError as exc:
        warn(f"result: cannot be read: {exc}")
        return None
    except SteerflowError:
        pass  # the state DB cannot be read now: the checkpoint holds the result (issue 44)
    try:
        return str(result_of(read_checkpoint_run(Path(run_dir)))["text"])
    except SteerflowError as exc:
        warn(f"result: cannot be read: {exc}")
        return None


def _node_line(node: dict[str, Any]) -> str:
    extra = f"  error: {printable(node['error'])}" if node.get("error") else ""
    return f"  {node['status']:<10} {node['kind']:<8} {printable(node['id'])}{extra}"


def node_list(nodes: list[dict[str, Any]], run_id: str | None) -> list[str]:
    """The ``nodes:`` block of a flow's summary: every node, or counts for a large run."""
    if len(nodes) <= NODE_LIST_MAX:
        return ["nodes:", *(_node_line(n) for n in nodes)]
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node["status"]] = counts.get(node["status"], 0) + 1
    by_status = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    lines = [f"nodes: {len(nodes)} ({by_status})"]
    unfinished = [n for n in nodes if n["status"] != "completed"]
    lines += [_node_line(n) for n in unfinished[:NODE_LIST_MAX]]
    if len(unfinished) > NODE_LIST_MAX:
        lines.append(f"  ... {len(unfinished) - NODE_LIST_MAX} more not completed")
    lines.append(f"every node: steerflow show {run_id or 'RUN'}")
    return lines


def result_tail(text: str, run_id: str | None) -> list[str]:
    """The first ``RESULT_TAIL_LINES`` lines of the result, then where the rest is."""
    lines = printable(text, keep_newlines=True).split("\n")
    out = ["result:", *lines[:RESULT_TAIL_LINES]]
    if len(lines) > RESULT_TAIL_LINES:
        rest = len(lines) - RESULT_TAIL_LINES
        out.append(f"... {rest} more lines: steerflow result {run_id or 'RUN'}")
    return out


def placement_text(placement: dict[str, Any]) -> str:
    """Where a call ran (``--executor ray``): ``ray node 6856b74f (127.0.0.3), pid 19670``."""
    node = str(placement.get("node_id") or "?")[:8]
    return (
        f"{printable(str(placement.get('executor') or 'ray'))} node {printable(node)} "
        f"({printable(str(placement.get('node_ip') or '?'))}), pid {placement.get('pid')}"
    )
