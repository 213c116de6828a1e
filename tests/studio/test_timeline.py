"""The run timeline's axis and bars (``studio/_timeline.py``), drawn from a run view."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest

from steerflow.studio._timeline import timeline_svg
from steerflow.views import NodeState

NOW = 1_000.0


def _node(key: str, status: str, duration: float | None, **detail: float) -> NodeState:
    return NodeState(id=key, kind="planned", status=status, assignee=None,
                     duration_s=duration, detail=dict(detail))  # fmt: skip


def _axis_end(svg: str) -> str:
    found = re.search(r'id="timeline-end"[^>]*>([^<]*)<', svg)
    assert found, svg
    return found.group(1)


def _svg(*nodes: NodeState) -> str:
    view: Any = SimpleNamespace(nodes=nodes)
    return timeline_svg(view, base="/runs/r/", now=NOW)


@pytest.mark.parametrize("duration", [0.0, None])
def test_a_node_that_died_just_after_starting_ends_at_its_start_not_now(
    duration: float | None,
) -> None:
    # Seen on a loaded machine: killed 30 ms into b's call, the run's last sign of life
    # was recorded before b's start, so b's duration is 0. The axis is the run's 0.53 s,
    # not the time from a's start to whenever the page is drawn.
    a = _node("a", "completed", 0.5, started_at=100.0, ended_at=100.5)
    b = _node("b", "interrupted", duration, started_at=100.53)
    svg = _svg(a, b)
    assert _axis_end(svg) == "0.5s"
    assert 'data-bar="b" data-start="100.530" data-end="100.530"' in svg


def test_a_running_node_still_ends_now() -> None:
    a = _node("a", "completed", 0.5, started_at=100.0, ended_at=100.5)
    b = _node("b", "running", 3.0, started_at=100.5)
    assert _axis_end(_svg(a, b)) == "15m00s"


def test_an_interrupted_node_ends_at_its_start_plus_its_duration() -> None:
    b = _node("b", "interrupted", 2.25, started_at=100.0)
    assert _axis_end(_svg(b)) == "2.2s"
