"""Admission waits for the checkpoint writer (issue 26 item 3; decision 100).

A node keeps its capacity slot until its outcome is acknowledged, so at most
``concurrency`` outcomes are ever completed by their provider and not yet saved. Here the
writer is real (v3 journal, real fsync) and slow: a fault hook holds every journal fsync
for a while on the writer's thread. The end-to-end tests with a failing writer (fault
seams, and a full tmpfs) are in ``tests/e2e/test_writer_backpressure_e2e.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from steerflow import _faults
from steerflow.executor import EventBus, FlowEvent
from steerflow.orchestrate import FlowOptions, FlowRun

NODES = 16
CONCURRENCY = 4
SLOW_FSYNC_S = 0.15


@pytest.fixture
def slow_journal_fsync() -> Iterator[None]:
    def hook(step: str, when: str) -> None:
        if (step, when) == ("journal-fsync", "before"):
            time.sleep(SLOW_FSYNC_S)  # the writer's thread, not the loop

    previous = _faults.set_fault_hook(hook)
    try:
        yield
    finally:
        _faults.set_fault_hook(previous)


class Unsaved:
    """Counts calls started and outcomes acknowledged, from the run's own events."""

    def __init__(self) -> None:
        self.started = 0
        self.saved = -1  # the first acknowledgement is the initial publication
        self.most = 0

    def __call__(self, event: FlowEvent) -> None:
        if event.type == "node_started":
            self.started += 1
            self.most = max(self.most, self.started - self.saved)
        elif event.type == "checkpoint_saved":
            self.saved += 1


async def test_a_slow_writer_holds_admission_at_concurrency_unsaved_outcomes(
    tmp_path: Path, slow_journal_fsync: None
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        yaml.safe_dump(
            {"plan": [{"agent_id": f"n{i:02d}", "instruction": f"task {i}"} for i in range(NODES)]}
        )
    )
    events = EventBus()
    unsaved = Unsaved()
    events.subscribe(unsaved)
    options = FlowOptions(plan_path=plan, model="echo", concurrency=CONCURRENCY)
    result = await FlowRun(options, home=tmp_path / "home", events=events).run()
    assert result.status == "completed", result
    assert {n["status"] for n in result.nodes} == {"completed"}
    assert (unsaved.started, unsaved.saved) == (NODES, NODES)
    # Each call starts while at most CONCURRENCY - 1 others are paid for and unsaved;
    # the bound is reached (the first CONCURRENCY start at once), never passed.
    assert unsaved.most == CONCURRENCY
