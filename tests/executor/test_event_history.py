"""``EventBus.history`` is bounded: a long run's events reach subscribers, not memory."""

from __future__ import annotations

from steerflow.executor import EventBus, FlowEvent
from steerflow.executor._events import HISTORY_LIMIT


def _emit(bus: EventBus, count: int) -> None:
    for i in range(count):
        bus.emit(FlowEvent(type="node_started", node_key=f"n{i}"))


def test_history_keeps_the_most_recent_events_and_subscribers_see_all() -> None:
    bus = EventBus(history_limit=3)
    seen: list[FlowEvent] = []
    bus.subscribe(seen.append)
    _emit(bus, 10)
    assert [e.node_key for e in seen] == [f"n{i}" for i in range(10)]
    assert [e.node_key for e in bus.history] == ["n7", "n8", "n9"]


def test_default_history_is_bounded() -> None:
    bus = EventBus()
    _emit(bus, HISTORY_LIMIT + 5)
    assert len(bus.history) == HISTORY_LIMIT
    assert bus.history[0].node_key == "n5"


def test_history_can_be_switched_off() -> None:
    bus = EventBus(history_limit=0)
    _emit(bus, 4)
    assert bus.history == []
