"""Budgets from Python name the parameters, not the flags (issue 40 item 5).

A ``FlowOptions`` built in code never had ``--max-cost`` typed: a cap it cannot enforce is
refused naming ``max_cost`` and the ``prices=`` fix; the same refusal from the CLI names
the flags (``tests/e2e/test_budget_script_e2e.py``). ``prices`` takes ``steerflow.Price``,
an ``(IN, OUT)`` pair or a mapping, and anything else is a clear ``InvalidValueError``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import steerflow
from steerflow.errors import InvalidValueError, UsageError


def _options(tmp_path: Path, **budget: object) -> steerflow.FlowOptions:
    script = tmp_path / "script.yaml"
    script.write_text("a: {response: hi, usage: {input_tokens: 10, output_tokens: 5}}\n")
    plan = steerflow.Plan([steerflow.Op("a", "say hi")])
    return steerflow.FlowOptions(plan=plan, model=f"script:{script}", **budget)  # type: ignore[arg-type]


def test_an_unpriced_cap_from_python_names_the_parameter_and_the_fix(tmp_path: Path) -> None:
    options = _options(tmp_path, max_cost=1.0)
    with pytest.raises(UsageError) as refused:
        asyncio.run(steerflow.run_flow(options, home=tmp_path / "home"))
    message = str(refused.value)
    assert message.startswith("max_cost: no price is known for model 'script:")
    assert f"give prices={{'script:{tmp_path / 'script.yaml'}': steerflow.Price(IN, OUT)}}" in (
        message
    )
    assert "--" not in message


def test_the_cli_spelling_is_kept_for_options_built_from_flags(tmp_path: Path) -> None:
    options = _options(tmp_path, max_cost=1.0, names_flags=True)
    with pytest.raises(UsageError, match=r"^--max-cost: .*give --price script:"):
        asyncio.run(steerflow.run_flow(options, home=tmp_path / "home"))


@pytest.mark.parametrize(
    "price", [steerflow.Price(1.0, 2.0), (1, 2), {"input": 1, "output": 2}], ids=str
)
def test_a_price_is_taken_in_each_documented_form_and_runs(tmp_path: Path, price: object) -> None:
    script = f"script:{tmp_path / 'script.yaml'}"
    options = _options(tmp_path, max_cost=1.0, prices={script: price})
    assert options.price_overrides == {script: steerflow.Price(1.0, 2.0)}
    result = asyncio.run(steerflow.run_flow(options, home=tmp_path / "home"))
    assert result.status == "completed"


@pytest.mark.parametrize(
    ("price", "says"),
    [
        ("cheap", "prices['m']: 'cheap' is not a price: give steerflow.Price(IN, OUT)"),
        ((1, 2, 3), "prices['m']: (1, 2, 3) is not a price"),
        ((1, "x"), "prices['m'][1]"),
        ({"in": 1, "out": 2}, "needs exactly the keys 'input' and 'output'"),
    ],
)
def test_a_wrong_price_is_a_clear_error_naming_the_parameter(price: object, says: str) -> None:
    with pytest.raises(InvalidValueError) as refused:
        steerflow.FlowOptions(prompt="x", prices={"m": price})  # type: ignore[dict-item]
    assert says in str(refused.value)
    assert refused.value.parameter.startswith("prices")
