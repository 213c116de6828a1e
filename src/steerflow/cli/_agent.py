"""``steerflow agent``: run one steerable agent, print its turns (issue 19)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from steerflow.cli._output import emit_json, emit_text, printable, run_with_signals, warn

if TYPE_CHECKING:
    from steerflow.orchestrate._agent_options import AgentOptions, AgentResult, AgentSeed

__all__ = ["execute_agent", "print_agent_dry_run", "print_agent_result"]

#: How much of the last response the human summary shows.
_RESULT_TAIL = 4000


def execute_agent(home: Path, options: AgentOptions, *, as_json: bool) -> int:
    """Run an agent with signal handling and print its result; returns the exit code."""
    from steerflow.orchestrate._agent import AgentRun

    run = AgentRun(options, home=home, progress=lambda line: warn(printable(line)))

    result: AgentResult = run_with_signals(run.run, run.request_stop)
    print_agent_result(result, as_json=as_json)
    return int(result.exit_code)


def print_agent_result(result: AgentResult, *, as_json: bool) -> None:
    """One JSON object, or a short summary: status, turns, how to resume, the last reply."""
    for warning in result.warnings:
        warn(f"warning: {printable(warning)}")
    if result.spent_line is not None:
        flags = " ".join(f"--{k.replace('_', '-')} MORE" for k, v in result.budget.items() if v)
        warn(f"budget reached: {result.spent_line}; resume with: "
             f"steerflow resume {result.run_id} {flags}")  # fmt: skip
    if as_json:
        emit_json(result.to_json())
        return
    lines = [
        f"status: {result.status}",
        f"run: {result.run_id}  session: {result.session_id}",
        f"checkpoint: {result.checkpoint['path']} (v3, "
        + ("saved" if result.checkpoint.get("persisted") else "NOT persisted")
        + ")",
    ]
    if result.checkpoint.get("error"):
        lines.append(f"checkpoint error: {printable(result.checkpoint['error'])}")
    if result.resumed_from:
        lines.append(f"resumed from session: {result.resumed_from}")
    if result.stopped_by is not None:
        how = "ctl stop --now" if result.stopped_by.get("now") else "ctl stop"
        lines.append(f"stopped by an operator ({how}, control {result.stopped_by['control_id']})")
    lines.append("turns:")
    for turn in result.turns:
        how = " (replayed)" if turn.replayed else ""
        steer = f", {len(turn.controls)} operator message(s)" if turn.controls else ""
        lines.append(f"  turn-{turn.number}  {turn.status}{how}{steer}")
        if turn.error:
            lines.append(f"    error: {printable(turn.error)}")
    for rejected in result.rejected:
        lines.append(f"  control {rejected['control_id']}: {rejected['result']}")
    if result.status in ("timed_out", "interrupted", "stopped", "budget_exhausted"):
        lines.append(f"resume with: steerflow resume {result.run_id}")
    text = result.result_text
    if text is not None:
        shown = text if len(text) <= _RESULT_TAIL else "..." + text[-_RESULT_TAIL:]
        lines += ["result:", printable(shown, keep_newlines=True)]
    emit_text("\n".join(lines))


def print_agent_dry_run(seed: AgentSeed, *, as_json: bool) -> int:
    """``resume --dry-run`` of an agent run: what it would replay and run; nothing runs."""
    from steerflow.orchestrate._agent_resume import agent_replay_nodes

    for warning in seed.notes:
        warn(f"warning: {printable(warning)}")
    nodes = agent_replay_nodes(seed)
    if as_json:
        emit_json(
            {
                "session_id": None,
                "run_id": None,
                "kind": "agent",
                "status": "planned",
                "exit_code": 0,
                "resumed_from": seed.resumed_from,
                "checkpoint": {"path": None, "version": None, "persisted": False, "error": None},
                "checkpoint_recovery": seed.checkpoint_recovery,
                "nodes": nodes,
                "turns": [t.to_json() for t in seed.turns],
                "warnings": list(seed.notes),
                "stranded_messages": [m.to_json() for m in seed.stranded],
                "in_flight_calls": [call.to_json() for call in seed.in_flight],
            }
        )
        return 0
    replayed = [n["id"] for n in nodes if n["status"] != "pending"]
    to_run = [n["id"] for n in nodes if n["status"] == "pending"]
    lines = [
        "status: planned (dry run: nothing runs)",
        f"resumes session: {seed.resumed_from}",
        "would replay: " + (", ".join(replayed) or "nothing"),
        "would run: " + (", ".join(to_run) or "no turn in flight (then waits for queued messages)"),
    ]
    for message in seed.stranded:
        by = f", delivered by {message.delivered_in}" if message.delivered_in else ""
        lines.append(
            f"stranded message {message.control_id} ({message.state}{by}): "
            + printable(message.text[:80])
        )
    emit_text("\n".join(lines))
    return 0
