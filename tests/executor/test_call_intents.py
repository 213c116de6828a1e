"""The executor's write-ahead hook and the meter's reservations (issue 38 items 1, 2).

``before_call`` is awaited after the lease check and before the provider is invoked
(decision 217); a False answer means the call is never sent. A returned call's
reservation ends when it is charged, not when its outcome is saved.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from test_scheduler import executor, graph_of

from steerflow.executor import BUDGET_REASON, CallIntent, Caps, InFlightDoubt, Meter, Operation
from steerflow.providers import PlanRequest, Provider, ProviderRequest, ProviderResponse, Usage
from steerflow.providers._pricing import Price, PriceTable

pytestmark = pytest.mark.timeout(30)

SPEC = "test"
#: $0.002 at $10/$20 per million tokens.
CALL = Usage(input_tokens=100, output_tokens=50)


class Billed(Provider):
    """Answers every call with :data:`CALL`'s usage; ``release`` lets held calls return."""

    spec = SPEC
    reports_usage = True

    def __init__(self, hold: int = 0) -> None:
        self.calls: list[str] = []
        self.hold = hold
        self.release = asyncio.Event()
        self.held = asyncio.Event()

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        self.calls.append(request.node_key)
        if 1 < len(self.calls) <= 1 + self.hold:
            if len(self.calls) == 1 + self.hold:
                self.held.set()
            await self.release.wait()
        return ProviderResponse(text="ok", usage=CALL)

    async def plan(self, request: PlanRequest) -> object:
        raise NotImplementedError


async def test_every_call_is_announced_before_it_is_sent_and_a_refusal_sends_nothing(
    tmp_path: Path,
) -> None:
    provider = Billed()
    graph = graph_of([{"agent_id": "a", "instruction": "x"}, {"agent_id": "b", "instruction": "y"}])
    ex = executor(graph, provider, tmp_path, concurrency=1)
    seen: list[tuple[str, CallIntent, int]] = []

    async def before(op: Operation, intent: CallIntent) -> bool:
        seen.append((op.key, intent, len(provider.calls)))
        return op.key == "a"

    ex.before_call = before
    ex.prior_calls = {"a": 2}
    await ex.run()
    assert provider.calls == ["a"]  # b's intent was refused: b was never sent
    (a, intent_a, sent_a), (b, _, _) = seen
    assert (a, b, sent_a) == ("a", "b", 0)  # announced before it was sent
    assert (intent_a.record, intent_a.key, intent_a.node) == ("op", "a", "a")
    assert intent_a.attempt == 3  # two calls an earlier run left in flight, then this one
    assert len(intent_a.call_id) == 32
    assert graph.ops[graph.planned[1].node_id].status == "pending"


async def test_a_returned_call_stops_reserving_once_charged_not_once_saved(
    tmp_path: Path,
) -> None:
    """$0.002 calls, $0.011 cap, concurrency 3: the first runs alone, three are held and
    return together, and the first outcome's save waits until all three were charged.
    Room is then $0.008 spent plus the asker: a fifth call fits ($0.010). Counting each
    charged call's reservation until its save (the old rule) closed admission at $0.008."""
    provider = Billed(hold=3)
    graph = graph_of([{"agent_id": f"n{i}", "instruction": "x"} for i in range(8)])
    ex = executor(graph, provider, tmp_path, concurrency=3)
    charged = asyncio.Event()

    class Watched(Meter):
        def charge(self, spec: str | None, usage: Usage | None, key: str | None = None) -> Any:
            priced = super().charge(spec, usage, key)
            if (self.spent.cost_usd or 0) >= 0.008 - 1e-9:  # the first call and the three
                charged.set()
            return priced

    ex.meter = Watched(PriceTable({SPEC: Price(10, 20)}), Caps(max_cost=0.011))
    saved: list[str] = []

    async def slow_save(op: Operation) -> None:
        if len(saved) == 1:  # the first of the held three: saved once all were charged
            await charged.wait()
        saved.append(op.key)

    ex.observers.append(slow_save)

    async def opener() -> None:
        await provider.held.wait()
        provider.release.set()

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(opener())
        await ex.run()
    assert len(provider.calls) == 5
    assert ex.meter.spent.cost_usd == pytest.approx(0.010)
    assert ex.admission_reason == BUDGET_REASON


def test_calls_in_doubt_count_as_spent_and_are_said() -> None:
    meter = Meter(PriceTable({SPEC: Price(10, 20)}), Caps(max_cost=0.013),
                  base=Usage(cost_usd=0.002), doubt=InFlightDoubt(3, 0.006, 450, 0))  # fmt: skip
    meter.observe(Usage(cost_usd=0.002, input_tokens=100, output_tokens=50))
    assert meter.room()  # 0.002 + 0.006 + one call = 0.010
    meter.reserve("a")
    meter.reserve("b")
    assert not meter.room()  # 0.008 + three calls = 0.014 > 0.013
    assert meter.reservation() == (pytest.approx(0.002), 150)
    assert meter.exhausted_line() == (
        "spent $0.0020 of the $0.013 cap, counting 3 calls that may have been paid (about $0.0060)"
    )


def test_an_unsized_call_in_doubt_is_sized_by_the_largest_call_seen() -> None:
    meter = Meter(PriceTable({SPEC: Price(10, 20)}), Caps(max_cost=0.005),
                  doubt=InFlightDoubt(calls=1, unsized=1))  # fmt: skip
    assert meter.room() and meter.reservation() == (None, None)
    meter.charge(SPEC, CALL)  # $0.002: the call in doubt is now taken as $0.002 too
    assert not meter.room()  # 0.002 + 0.002 + 0.002 > 0.005
    assert meter.reached() is False


def test_doubt_round_trips_through_the_checkpoint_config() -> None:
    doubt = InFlightDoubt(2, 0.004, 300, 1)
    assert InFlightDoubt.from_json(doubt.to_json()) == doubt
    assert InFlightDoubt.from_json({"calls": -1, "cost_usd": float("nan")}) == InFlightDoubt()
    assert InFlightDoubt.from_json("junk") == InFlightDoubt()
    assert doubt + doubt == InFlightDoubt(4, 0.008, 600, 2)


def test_an_unpriced_models_reservation_has_no_cost_only_tokens() -> None:
    meter = Meter()  # no price known: costs stay None
    meter.charge("script:/x.yaml", CALL)
    assert meter.reservation() == (None, 150)
