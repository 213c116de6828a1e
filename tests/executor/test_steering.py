"""The run's one owner of steering state, as the control poller sees it (issue 16, item 6)."""

from __future__ import annotations

from steerflow.control import SteeringTarget
from steerflow.executor import SharedContext, Steering


def test_steering_is_the_control_target() -> None:
    steering = Steering()
    assert isinstance(steering, SteeringTarget)
    assert steering.defers_message_stamp()  # decision 36: applied once delivered


def test_pause_and_resume_drive_the_gate() -> None:
    steering = Steering()
    assert steering.is_paused() is False
    steering.pause()
    steering.pause()  # idempotent
    assert steering.is_paused() is True and steering.gate.paused
    steering.resume()
    assert steering.is_paused() is False and not steering.gate.paused


def test_pending_while_planning_then_the_executor_answers() -> None:
    steering = Steering()
    assert steering.has_pending_operation()  # the first operation is still to come
    answers = [True, False]
    steering.attach(lambda: answers.pop(0))
    assert steering.has_pending_operation()
    assert not steering.has_pending_operation()


def test_nothing_pending_once_a_run_finished_before_executing() -> None:
    steering = Steering()
    steering.finish()
    assert not steering.has_pending_operation()


def test_messages_go_to_the_shared_context() -> None:
    context = SharedContext({"operator_messages": []})
    steering = Steering(context)
    steering.add_operator_message("left, not right", ts=1.0, control_id="c1")
    assert steering.context is context
    assert context.operator_messages == [
        {"ts": 1.0, "text": "left, not right", "control_id": "c1", "rendered_into_op": None}
    ]
