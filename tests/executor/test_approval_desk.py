"""The run's approval desk (issue 41): the first decision of a request is taken, a later
one is rejected naming it, an unknown request is rejected, a decision that came before the
loop asked is kept for it, the timeout denies, and admission closing ends every wait."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from steerflow.executor import ApprovalDesk
from steerflow.executor._approvals import TIMEOUT_SENDER, ApprovalHeld
from waiting import wait_until_async

REQUEST: dict[str, Any] = {"request_id": "apr_1", "tool": "post", "args": {"m": "hi"}}


async def test_the_first_decision_is_taken_and_a_second_is_rejected_naming_it() -> None:
    desk, published = ApprovalDesk(), []

    async def publish(pending: dict[str, Any]) -> None:
        published.append(sorted(pending))

    desk.publish = publish
    await desk.register({**REQUEST, "requested_at": 0.0}, "a")
    assert published == [["apr_1"]]  # published before anyone is told it waits
    waiting = asyncio.create_task(desk.wait(REQUEST, "a"))
    await wait_until_async(lambda: desk.waiting("apr_1"), timeout=5, what="the wait to start")
    first = desk.decide("approve", "apr_1", {"args": {"m": "edited"}}, control_id="c1",
                        sender="cli:op@h:1")  # fmt: skip
    assert first is None  # taken: stamped applied once journaled
    second = desk.decide("deny", "apr_1", {"reason": "no"}, control_id="c2", sender="x")
    assert second == "rejected:already-decided:approved:c1"
    decision = await waiting
    assert (decision.verdict, decision.edited_args, decision.control_id) == (
        "approved", {"m": "edited"}, "c1",
    )  # fmt: skip
    stamped: list[str] = []
    desk.on_journaled.append(stamped.append)
    await desk.journaled("apr_1", "c1")
    assert stamped == ["c1"] and published[-1] == [] and desk.pending == {}


def test_an_unknown_request_and_edited_args_that_are_not_an_object_are_rejected() -> None:
    desk = ApprovalDesk()
    assert desk.decide("approve", "apr_x", {}, control_id="c", sender=None) == (
        "rejected:unknown-request"
    )
    desk.know(REQUEST, "a")
    bad = desk.decide("approve", "apr_1", {"args": [1]}, control_id="c", sender=None)
    assert bad == "rejected:invalid-args"


async def test_a_decision_before_the_wait_is_kept_for_it() -> None:
    desk = ApprovalDesk()
    desk.know(REQUEST, "a")  # a resume's request, not yet reached by the replay
    assert desk.decide("deny", "apr_1", {"reason": "late"}, control_id="c", sender="s") is None
    decision = await asyncio.wait_for(desk.wait(REQUEST, "a"), 5)
    assert (decision.verdict, decision.reason) == ("denied", "late")


async def test_the_timeout_denies_from_the_recorded_time() -> None:
    import time

    desk = ApprovalDesk(timeout_s=30.0)
    request = {**REQUEST, "requested_at": time.time() - 60}  # recorded a minute ago
    await desk.register(request, "a")
    decision = await asyncio.wait_for(desk.wait(request, "a"), 5)  # due already: no wait
    assert (decision.verdict, decision.sender) == ("denied", TIMEOUT_SENDER)
    assert decision.reason == "no decision within 30 s (approval timeout)"
    late = desk.decide("approve", "apr_1", {}, control_id="c9", sender="s")
    assert late == "rejected:already-decided:denied:timeout"


async def test_closing_admission_ends_every_wait_held() -> None:
    desk = ApprovalDesk()
    await desk.register(REQUEST, "a")
    waiting = asyncio.create_task(desk.wait(REQUEST, "a"))
    await wait_until_async(lambda: desk.waiting("apr_1"), timeout=5, what="the wait to start")
    desk.close("stopped by operator")
    with pytest.raises(ApprovalHeld, match="stopped by operator"):
        await waiting
    with pytest.raises(ApprovalHeld):  # a wait that starts after the close ends at once
        await desk.wait(REQUEST, "a")
