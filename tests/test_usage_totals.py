"""A cost total that leaves out unpriced calls says it is partial (issue 38, decision 249)."""

from __future__ import annotations

from steerflow._usage import Usage, cost_text

PRICED = Usage(input_tokens=100, output_tokens=50, cost_usd=0.012)
UNPRICED = Usage(input_tokens=10, output_tokens=5)


def _total(*calls: Usage) -> Usage:
    total = Usage()
    for call in calls:
        total = total + call
    return total


def test_a_total_with_unpriced_calls_beside_priced_ones_is_partial() -> None:
    total = _total(PRICED, UNPRICED, UNPRICED)
    assert total.partial and total.unpriced_calls == 2
    assert total.to_json() == {
        "input_tokens": 120,
        "output_tokens": 60,
        "cache_read_tokens": None,
        "cache_write_tokens": None,
        "cost_usd": 0.012,
        "cost_partial": True,
        "unpriced_calls": 2,
    }
    assert cost_text(total.to_json()) == "$0.0120 (partial: 2 calls unpriced)"
    assert cost_text(_total(PRICED, UNPRICED).to_json()) == "$0.0120 (partial: 1 call unpriced)"


def test_complete_or_cost_free_totals_keep_their_json() -> None:
    """Every priced, or nothing priced (cost null says it): no member is added."""
    for total in (_total(PRICED, PRICED), _total(UNPRICED, UNPRICED), Usage(), PRICED):
        assert not total.partial
        assert "cost_partial" not in total.to_json() and "unpriced_calls" not in total.to_json()
    assert cost_text(_total(PRICED, PRICED).to_json()) == "$0.0240"
    assert cost_text(_total(UNPRICED).to_json()) is None
    assert _total(Usage(), Usage()).unpriced_calls == 0  # nothing reported: not a call


def test_sums_of_sums_count_each_call_once_and_read_back() -> None:
    first, second = _total(PRICED, UNPRICED), _total(UNPRICED, PRICED, UNPRICED)
    chain = first + second
    assert chain.unpriced_calls == 3 and chain == _total(first, second, Usage())
    stored = Usage.from_json(chain.to_json())
    assert stored == chain
    assert (stored + Usage()).unpriced_calls == 3  # a read-back total is not recounted


def test_the_studio_runs_list_says_it_too() -> None:
    from steerflow.studio._pages import spend

    assert spend(_total(PRICED, UNPRICED).to_json()) == "165 tok $0.0120 (partial: 1 call unpriced)"
    assert spend(_total(PRICED).to_json()) == "150 tok $0.0120"
