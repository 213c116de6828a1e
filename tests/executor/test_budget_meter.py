"""``executor.Meter``: the admission check of a budget (decision 180), without a run."""

from __future__ import annotations

import pytest

from steerflow.executor import Caps, Meter
from steerflow.providers import Usage
from steerflow.providers._pricing import Price, PriceTable

SPEC = "script:/x.yaml"
CALL = Usage(input_tokens=1000, output_tokens=500)  # $0.02 at $10/$20 per million


def _meter(**caps: float | int) -> Meter:
    return Meter(PriceTable({SPEC: Price(10, 20)}), Caps(**caps))  # type: ignore[arg-type]


def test_a_call_is_priced_and_counted() -> None:
    meter = _meter(max_cost=1.0)
    priced = meter.charge(SPEC, CALL)
    assert priced is not None and priced.cost_usd == pytest.approx(0.02)
    assert meter.spent.to_json() == {
        "input_tokens": 1000,
        "output_tokens": 500,
        "cache_read_tokens": None,
        "cache_write_tokens": None,
        "cost_usd": pytest.approx(0.02),
    }
    assert meter.charge(SPEC, None) is None and meter.spent.tokens == 1500


def test_room_reserves_the_largest_call_for_each_one_in_flight() -> None:
    meter = _meter(max_cost=0.07)
    assert meter.room()  # nothing known yet
    meter.reserve("a")
    assert meter.unsized()  # the first call runs alone
    meter.charge(SPEC, CALL)
    meter.release("a")
    assert not meter.unsized()
    meter.reserve("b")  # 0.02 spent + b + the asker = 0.06
    assert meter.room()
    meter.reserve("c")  # 0.02 + b + c + the asker = 0.08 > 0.07
    assert not meter.room()
    meter.release("c")
    assert meter.room()


def test_a_token_cap_fits_exactly() -> None:
    meter = _meter(max_tokens=3000)
    meter.charge(SPEC, CALL)
    assert meter.room()  # 1500 + 1500 = 3000
    meter.charge(SPEC, CALL)
    assert not meter.room() and meter.reached()
    assert meter.exhausted_line() == "spent 3000 of the 3000 token cap"


def test_the_chain_before_counts_and_recap_changes_the_caps() -> None:
    meter = Meter(PriceTable({SPEC: Price(10, 20)}), Caps(max_cost=0.05),
                  base=Usage(cost_usd=0.04))  # fmt: skip
    meter.observe(Usage(cost_usd=0.02))
    assert not meter.room()  # 0.04 + 0.02 > 0.05
    assert meter.recap(0.1, None) == Caps(0.1, None)
    assert meter.room() and not meter.reached()
    meter.recap(0.03, 10)
    assert meter.reached() and meter.caps == Caps(0.03, 10)


def test_no_caps_always_has_room() -> None:
    meter = Meter()
    meter.reserve("a")
    assert meter.room() and not meter.unsized()


def test_price_overrides_the_reported_cost_and_table_names_the_vendor() -> None:
    prices = PriceTable({"gpt-x": Price(1, 2)})
    assert prices.cost("openai/gpt-x", Usage(input_tokens=10**6, cost_usd=9.0)) == 1.0
    assert prices.cost("echo", Usage(input_tokens=5, cost_usd=0.5)) == 0.5
    assert prices.cost("echo", Usage(input_tokens=5)) is None
    assert not prices.known("script:/y.yaml")
