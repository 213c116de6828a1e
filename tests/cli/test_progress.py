"""Progress on stderr stays readable at 10,000 nodes (issue 17 item 4).

Lines are counted, never timed: the clock is injected, so "fast" and "slow" are
whatever the test says they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import math
import os
import re
from pathlib import Path

import pytest
import yaml

from steerflow.cli import main as cli_main
from steerflow.cli._progress import BURST, INTERVAL, PER_NODE_NODES, Progress
from steerflow.executor import EventBus, FlowEvent
from steerflow.orchestrate import FlowOptions, FlowRun
from waiting import wait_until_async


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _progress() -> tuple[Progress, Clock, io.StringIO]:
    clock, out = Clock(), io.StringIO()
    return Progress(clock=clock, file=out), clock, out


def _node(progress: Progress, clock: Clock, key: str, step: float, *, ok: bool = True) -> None:
    """One node's events as a run emits them: start, outcome, checkpoint saved."""
    for kind in ("node_started", "node_completed" if ok else "node_failed", "checkpoint_saved"):
        key_of = None if kind == "checkpoint_saved" else key
        progress(FlowEvent(type=kind, node_key=key_of))  # type: ignore[arg-type]
        clock.now += step


def _lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_a_fast_10k_run_prints_about_one_summary_per_second() -> None:
    progress, clock, out = _progress()
    nodes, step = 10_000, 0.0005  # 30,000 events over 15 simulated seconds
    progress(FlowEvent(type="plan_ready", data={"nodes": nodes, "max_spawn": 20}))
    for i in range(nodes):
        _node(progress, clock, f"n{i:04d}", step)
    progress.close()
    lines = _lines(out)
    summaries = [line for line in lines if line.startswith("progress: ")]
    seconds = nodes * 3 * step / INTERVAL
    # plan ready, the first interval's per-node lines, then at most one summary a second
    assert len(summaries) <= math.ceil(seconds) + 1
    assert len(lines) == 1 + BURST + len(summaries)
    assert summaries[-1].startswith(
        "progress: 10000/10000 done (10000 completed, 0 failed, 0 skipped), 0 running, "
        "0 pending; 10000 checkpoints saved; 15.0s elapsed"
    )


def test_failures_withheld_nodes_and_steers_are_lines_of_their_own_while_summarising() -> None:
    progress, clock, out = _progress()
    progress(FlowEvent(type="plan_ready", data={"nodes": 3_000, "max_spawn": 0}))
    for i in range(1_000):
        _node(progress, clock, f"n{i}", 0.001, ok=i != 500)
        if i == 600:
            progress(FlowEvent(type="control_applied", node_key="n601", data={"messages": 2}))
    for i in range(1_000, 3_000):
        progress(FlowEvent(type="node_withheld", node_key=f"n{i}", data={"reason": "SIGINT"}))
    progress.close()
    lines = _lines(out)
    assert "node FAILED n500" in lines
    assert "steer delivered into n601 (2 operator messages)" in lines
    assert sum(line.startswith("node withheld n") for line in lines) == 2_000
    assert not any(line == "node completed n700" for line in lines)  # folded
    assert lines[-1].startswith("progress: 1000/3000 done (999 completed, 1 failed, 0 skipped")
    assert "2000 withheld), 0 running, 0 pending" in lines[-1]


def test_a_small_plan_gets_every_line_however_fast() -> None:
    progress, clock, out = _progress()
    progress(FlowEvent(type="plan_ready", data={"nodes": PER_NODE_NODES, "max_spawn": 0}))
    for i in range(PER_NODE_NODES):
        _node(progress, clock, f"n{i}", 0.0001)
    progress.close()
    lines = _lines(out)
    assert len(lines) == 1 + 3 * PER_NODE_NODES
    assert not any(line.startswith("progress: ") for line in lines)
    assert lines[-1] == f"  checkpoint saved (#{PER_NODE_NODES})"


def test_slow_nodes_of_a_large_plan_keep_one_line_per_event() -> None:
    progress, clock, out = _progress()
    progress(FlowEvent(type="plan_ready", data={"nodes": 5_000, "max_spawn": 0}))
    for i in range(50):
        _node(progress, clock, f"n{i}", 0.5)  # three lines per 1.5 s: under the burst
    progress.close()
    lines = _lines(out)
    assert len(lines) == 1 + 3 * 50
    assert "node completed n49" in lines


def test_a_calm_interval_brings_per_node_lines_back() -> None:
    progress, clock, out = _progress()
    progress(FlowEvent(type="plan_ready", data={"nodes": 5_000, "max_spawn": 0}))
    for i in range(1_000):
        _node(progress, clock, f"fast{i}", 0.001)
    clock.now += 2 * INTERVAL  # a slow node: nothing happens for a while
    for i in range(3):
        _node(progress, clock, f"slow{i}", 0.6)
    progress.close()
    lines = _lines(out)
    # The interval after the burst ends it with a summary; once an interval was calm,
    # its events show one by one again.
    assert "node completed slow1" in lines and "node completed slow2" in lines
    assert sum(line.startswith("progress: ") for line in lines) <= math.ceil(3.0 / INTERVAL) + 2


def test_quiet_keeps_only_failures_and_warnings() -> None:
    clock, out = Clock(), io.StringIO()
    progress = Progress(quiet=True, clock=clock, file=out)
    progress(FlowEvent(type="plan_ready", data={"nodes": 2, "max_spawn": 0}))
    _node(progress, clock, "a", 0.1)
    _node(progress, clock, "b", 0.1, ok=False)
    progress(FlowEvent(type="plan_truncated", data={"message": "careful"}))
    progress.close()
    assert _lines(out) == ["node FAILED b", "warning: careful"]


def test_a_real_run_announces_each_steer_delivery(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    entries = [{"agent_id": "a", "instruction": "x"}, {"agent_id": "b", "instruction": "y"}]
    entries[1]["depends_on"] = ["a"]
    plan.write_text(yaml.safe_dump({"plan": entries}), encoding="utf-8")
    out = io.StringIO()
    events = EventBus()
    events.subscribe(Progress(file=out))
    run = FlowRun(FlowOptions(plan_path=plan), home=tmp_path / "home", events=events)
    # Queued before anything runs: the first call to start carries both messages.
    run.context.add_operator_message("focus on tests", ts=1.0, control_id=None)
    run.context.add_operator_message("and docs", ts=2.0, control_id=None)
    result = asyncio.run(run.run())
    assert result.status == "completed"
    assert "steer delivered into a (2 operator messages)" in _lines(out)


def test_each_applied_pause_resume_and_stop_is_a_line_even_while_summarising() -> None:
    progress, clock, out = _progress()
    progress(FlowEvent(type="plan_ready", data={"nodes": 1_000, "max_spawn": 0}))
    for i in range(200):
        _node(progress, clock, f"n{i}", 0.001)
        if i == 100:  # deep in a burst: routine lines are folded by now
            progress.control_applied("pause", None)
            progress.control_applied("resume", None)
            progress.control_applied("stop", "ab" * 16)
    progress.close()
    lines = _lines(out)
    assert "node completed n100" not in lines
    applied = [line for line in lines if line.startswith("operator ")]
    assert applied == [
        "operator pause applied: nodes not yet started wait for a resume",
        "operator resume applied",
        f"operator stop applied (control {'ab' * 16})",
    ]
    # plan ready, the burst's per-node lines, the controls (never folded), the summary
    assert lines[1 + BURST : 4 + BURST] == applied
    assert len(lines) == 5 + BURST and lines[-1].startswith("progress: 200/1000 done")


def test_quiet_leaves_applied_controls_out() -> None:
    out = io.StringIO()
    progress = Progress(quiet=True, file=out)
    progress.control_applied("pause", None)
    progress.control_applied("stop", "cd" * 16)
    assert _lines(out) == []


def test_a_real_run_announces_each_pause_and_resume_the_steering_applies(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"plan": [{"agent_id": "a", "instruction": "x"}]}))
    out = io.StringIO()
    events = EventBus()
    progress = Progress(file=out)
    events.subscribe(progress)
    run = FlowRun(FlowOptions(plan_path=plan), home=tmp_path / "home", events=events)
    run.steering.on_applied.append(progress.control_applied)

    async def steered() -> str:
        run.steering.pause()  # what the poller calls; the run waits at the gate
        async with asyncio.TaskGroup() as tasks:
            finished = tasks.create_task(run.run())
            await wait_until_async(lambda: run._begun, timeout=5, what="run() to begin")
            run.steering.resume()
        return finished.result().status

    assert asyncio.run(steered()) == "completed"
    lines = _lines(out)
    pause = lines.index("operator pause applied: nodes not yet started wait for a resume")
    assert lines.index("operator resume applied") > pause
    assert "node completed a" in lines


def test_the_cli_summarises_a_fast_run_of_many_nodes(tmp_path: Path) -> None:
    nodes = 400
    plan = tmp_path / "plan.json"
    entries = [{"agent_id": f"n{i:03d}", "instruction": f"task {i}"} for i in range(nodes)]
    plan.write_text(json.dumps({"concurrency": 16, "plan": entries}), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["--home", str(tmp_path / "home"), "flow", "--plan", str(plan), "--json"])
    assert code == 0, err.getvalue()
    lines = err.getvalue().splitlines()
    # Echo nodes finish far faster than BURST events a second: one line per event would
    # be 1,200 lines (start, completion, save per node).
    assert len(lines) < nodes, "\n".join(lines[:50])
    assert any(line.startswith(f"progress: {nodes}/{nodes} done") for line in lines) or (
        "node completed n399" in lines
    )


def test_the_end_of_run_summary_of_a_large_run_lists_counts_not_every_node(
    tmp_path: Path,
) -> None:
    nodes = 120
    plan = tmp_path / "plan.json"
    entries = [{"agent_id": f"n{i:03d}", "instruction": f"task {i}"} for i in range(nodes)]
    plan.write_text(json.dumps({"plan": entries}), encoding="utf-8")
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"n007": {"fail": "broken"}}), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    argv = ["--home", str(tmp_path / "home"), "flow", "--plan", str(plan)]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main([*argv, "--model", f"script:{script}"])
    assert code == 1, err.getvalue()
    text = out.getvalue()
    assert f"nodes: {nodes} (119 completed, 1 failed)" in text
    assert "  failed     planned  n007  error: broken" in text
    assert "n008" not in text.split("result:")[0]  # completed nodes are not listed one by one
    assert "every node: steerflow show " in text


def test_a_terminal_gets_colour_and_hostile_text_is_never_markup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A real pseudo-terminal: the rich path (decision 389). A node id that looks like
    # markup or an emoji code is printed as written, and an escape byte is shown escaped.
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w", encoding="utf-8", closefd=True) as tty:
            progress = Progress(file=tty, clock=Clock())
            progress(
                FlowEvent(
                    type="node_failed", node_key="[bold]x:smile:", data={"error": "a\x1b[2Jb"}
                )
            )
        data = b""
        while b"\n" not in data:
            data += os.read(master, 4096)
    finally:
        os.close(master)
    text = data.decode()
    assert "\x1b[31m" in text or "\x1b[1;31m" in text, repr(text)  # red: the label
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert "node FAILED [bold]x:smile:: a" in plain, repr(plain)
    assert "\x1b[2J" not in text


def test_a_pipe_gets_the_same_characters_without_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    progress, _, out = _progress()
    progress(FlowEvent(type="node_failed", node_key="[bold]x:smile:", data={"error": "a\x1b[2Jb"}))
    progress.control_applied("pause", None)
    (failed, paused) = _lines(out)
    assert failed.startswith("node FAILED [bold]x:smile:: a") and "\x1b" not in failed
    assert paused == "operator pause applied: nodes not yet started wait for a resume"
    monkeypatch.setenv("FORCE_COLOR", "1")
    forced, _, out = _progress()
    forced.control_applied("stop", "c1")
    assert out.getvalue() == "\x1b[35moperator stop applied\x1b[0m (control c1)\n"
