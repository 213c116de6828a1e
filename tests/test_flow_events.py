"""``FlowRun.events()``: typed events, in the run's order, ending with the run (issue 29 item 4).

The flows are real (state DB, poller, v3 checkpoint, ``script:`` model); the controls are
queued with the public writers and applied by the run's own poller. Where the order
depends on a control landing before a node moves on, the node is held by a fault hook on
the writer's thread (the checkpoint cannot acknowledge it), not by a sleep.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import steerflow
from steerflow import _faults
from steerflow.errors import UsageError
from steerflow.orchestrate import (
    AdmissionClosed,
    CheckpointSaved,
    ControlApplied,
    EventsDropped,
    EventStream,
    FlowOptions,
    FlowRun,
    NodeCompleted,
    NodeFailed,
    NodePaused,
    NodeSkipped,
    NodeStarted,
    NodeWithheld,
    PlanReady,
    RunEvent,
    SpawnAccepted,
    SpawnRejected,
)
from steerflow.plan import Edge, Op, Plan

HOLD_S = 30.0  # bound on any one wait here; the waits end on conditions long before


def _script(tmp_path: Path, nodes: dict[str, Any]) -> str:
    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump(nodes), encoding="utf-8")
    return f"script:{path}"


def _label(event: RunEvent) -> tuple[str, ...]:
    """What the order test compares: the event's type and its identifying fields."""
    match event:
        case NodeStarted() | NodeCompleted() | NodePaused():
            return (event.type, event.key)
        case SpawnAccepted():
            return (event.type, event.key, str(event.emitter))
        case SpawnRejected():
            return (event.type, str(event.agent_id), event.reason)
        case ControlApplied():
            return (event.type, event.verb, str(event.key), str(event.messages))
        case CheckpointSaved():
            return (event.type, str(event.what))
    return (event.type,)


@pytest.fixture
def hold_second_journal_write() -> Iterator[threading.Event]:
    """Hold the checkpoint's second journal fsync (the first is the initial flush).

    A batch of call intents alone is fsync'd as ``intent-fsync`` (decision 217), so this
    counts the batches that carry outcomes.

    Set the returned event to let it go. It blocks the writer's thread, so the record
    waiting on it is not acknowledged, and its node stays in its slot (decision 100).
    """
    release = threading.Event()
    hits = 0

    def hook(step: str, when: str) -> None:
        nonlocal hits
        if (step, when) == ("journal-fsync", "before"):
            hits += 1
            if hits == 2:
                assert release.wait(HOLD_S), "the test never released the journal write"

    previous = _faults.set_fault_hook(hook)
    try:
        yield release
    finally:
        release.set()
        _faults.set_fault_hook(previous)


async def test_the_events_of_a_flow_with_spawns_a_pause_and_a_message_in_order(
    tmp_path: Path, hold_second_journal_write: threading.Event
) -> None:
    home = tmp_path / "home"
    model = _script(
        tmp_path,
        {
            "a": {
                "spawn": [
                    {"agent_id": "s1", "instruction": "the child"},
                    {"agent_id": "../bad", "instruction": "refused"},
                ]
            }
        },
    )
    plan = Plan(ops=[Op("a", "the parent")], reactive="all")
    run = FlowRun(FlowOptions(plan=plan, model=model, concurrency=1), home=home)
    stream = run.events()
    seen: list[RunEvent] = []
    control_ids: dict[str, str] = {}
    async with asyncio.timeout(HOLD_S), asyncio.TaskGroup() as tasks:
        result = tasks.create_task(run.run())
        async for event in stream:
            seen.append(event)
            assert run.session_id is not None and run.run_id is not None
            if isinstance(event, SpawnRejected):
                # a is held on its spawn's checkpoint record: the pause lands first.
                control_ids["pause"] = await asyncio.to_thread(steerflow.pause, home, run.run_id)
            elif isinstance(event, ControlApplied) and event.verb == "pause":
                hold_second_journal_write.set()
            elif isinstance(event, NodePaused):
                control_ids["message"] = await asyncio.to_thread(
                    steerflow.message, home, run.session_id, "mind the tests"
                )
                control_ids["resume"] = await asyncio.to_thread(
                    steerflow.resume, home, run.session_id[:12]
                )
    assert result.result().status == "completed"
    assert [_label(e) for e in seen] == [
        ("plan_ready",),
        ("checkpoint_saved", "flush"),
        ("node_started", "a"),
        ("node_spawned", "s1", "a"),
        ("spawn_rejected", "../bad", "invalid_id"),
        ("control_applied", "pause", "None", "0"),
        ("checkpoint_saved", "spawn"),
        ("node_completed", "a"),
        ("checkpoint_saved", "op"),
        ("node_paused", "s1"),
        ("control_applied", "resume", "None", "0"),
        ("node_started", "s1"),
        ("control_applied", "message", "s1", "1"),  # rendered into s1's call
        ("node_completed", "s1"),
        ("checkpoint_saved", "spawn"),
    ]
    assert [e.ts for e in seen] == sorted(e.ts for e in seen)
    # Each writer returned the id of the row the poller applied.
    status = await asyncio.to_thread(steerflow.views.control_status, home, run.session_id)
    assert {c.verb: (c.id, c.result) for c in status.controls} == {
        verb: (control_ids[verb], "applied") for verb in ("pause", "message", "resume")
    }
    detail = await asyncio.to_thread(steerflow.views.node_detail, home, run.run_id, "s1")
    assert "mind the tests" in str(detail.to_json())


async def test_failures_skips_and_a_stop_are_typed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    model = _script(tmp_path, {"a": {"fail": "boom"}, "slow": {"delay": HOLD_S}})
    plan = Plan(
        ops=[
            Op("a", "fails"),
            Op("b", "after a success", depends_on=["a"]),
            Op("c", "after a failure", depends_on=[Edge("a", when="failed")]),
            Op("slow", "held until stopped", depends_on=["c"]),
            Op("never", "withheld", depends_on=["slow"]),
        ]
    )
    run = FlowRun(FlowOptions(plan=plan, model=model, concurrency=1), home=home)
    seen: list[RunEvent] = []
    stop_id = ""
    async with asyncio.timeout(HOLD_S), asyncio.TaskGroup() as tasks:
        result = tasks.create_task(run.run())
        async for event in run.events():
            seen.append(event)
            if isinstance(event, NodeStarted) and event.key == "slow":
                assert run.session_id is not None
                stop_id = await asyncio.to_thread(
                    steerflow.stop, home, run.session_id, now=True, reason="enough"
                )
    assert result.result().status == "failed"  # a failed; the stop withheld the rest
    failed = [e for e in seen if isinstance(e, NodeFailed)]
    assert [(e.key, e.error) for e in failed] == [("a", "boom")]
    assert [(e.key, e.reason) for e in seen if isinstance(e, NodeSkipped)] == [
        ("b", "edge condition not met")
    ]
    applied = [e for e in seen if isinstance(e, ControlApplied)]
    assert [(e.verb, e.control_id) for e in applied] == [("stop", stop_id)]
    closed = [e for e in seen if isinstance(e, AdmissionClosed)]
    assert [e.reason for e in closed] == ["stop"]
    assert seen.index(applied[0]) < seen.index(closed[0])
    assert [(e.key, e.reason) for e in seen if isinstance(e, NodeWithheld)] == [
        ("slow", "stop"),  # cancelled in flight by --now: not run, so resumable
        ("never", "dependency not run"),
    ]
    assert isinstance(seen[0], PlanReady) and seen[0].nodes == 5


async def test_a_reader_that_never_reads_does_not_hold_the_run(tmp_path: Path) -> None:
    plan = Plan(ops=[Op(f"n{i}", f"task {i}") for i in range(30)])
    run = FlowRun(FlowOptions(plan=plan, model="echo"), home=tmp_path / "home")
    everything, newest = run.events(), run.events(max_pending=5)
    async with asyncio.timeout(HOLD_S):
        result = await run.run()  # nobody reads while it runs
    assert result.status == "completed"
    kept = [e async for e in everything]
    assert sum(isinstance(e, NodeCompleted) for e in kept) == 30
    assert not any(isinstance(e, EventsDropped) for e in kept)
    last = [e async for e in newest]
    assert isinstance(last[0], EventsDropped) and last[0].count == len(kept) - 5
    assert last[1:] == kept[-5:]
    # Opened after the run: refused, saying to open it first (it would see nothing).
    with pytest.raises(UsageError, match=r"after run\(\) began: open the stream first"):
        run.events()


async def test_a_stream_drops_oldest_first_and_says_where() -> None:
    stream = EventStream(max_pending=2)
    for at in range(5):
        stream.push(PlanReady(ts=float(at), nodes=at, max_spawn=0))
    stream.close()
    got = [e async for e in stream]
    assert got == [
        EventsDropped(ts=3.0, count=3),
        PlanReady(ts=3.0, nodes=3, max_spawn=0),
        PlanReady(ts=4.0, nodes=4, max_spawn=0),
    ]
