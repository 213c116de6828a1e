"""The Python API refuses exactly what the CLI refuses, each naming its own spelling (issue 38).

For every bad value: ``steerflow flow|agent ... --flag VALUE`` (a real process) exits 2
with an error naming the flag, and ``FlowOptions``/``AgentOptions`` with the matching
parameter raises the same class of refusal (a ``UsageError``, exit code 2) naming the
parameter and no flag (decision 245). Nothing runs, so nothing is paid for.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from flow_support import run_cli, write_yaml

import steerflow
from steerflow.errors import ExitCode, InvalidValueError, UsageError
from steerflow.orchestrate._agent_options import AgentOptions

PLAN = {"plan": [{"agent_id": "a", "instruction": "x"}]}

# (command, flag arguments, the flag named, options class, keyword arguments, parameter)
CASES: list[tuple[str, list[str], str, str, dict[str, Any], str]] = [
    ("flow", ["--timeout", "nan"], "--timeout", "flow", {"timeout_s": math.nan}, "timeout_s"),
    ("flow", ["--timeout", "0"], "--timeout", "flow", {"timeout_s": 0}, "timeout_s"),
    ("flow", ["--timeout", "-1"], "--timeout", "flow", {"timeout_s": -1}, "timeout_s"),
    ("flow", ["--timeout", "inf"], "--timeout", "flow", {"timeout_s": math.inf}, "timeout_s"),
    ("flow", ["--concurrency", "0"], "--concurrency", "flow", {"concurrency": 0}, "concurrency"),
    ("flow", ["--concurrency", "257"], "--concurrency", "flow", {"concurrency": 257},
     "concurrency"),
    ("flow", ["--max-ops", "-1"], "--max-ops", "flow", {"max_ops": -1}, "max_ops"),
    ("flow", ["--max-cost", "0"], "--max-cost", "flow", {"max_cost": 0}, "max_cost"),
    ("flow", ["--max-cost", "nan"], "--max-cost", "flow", {"max_cost": math.nan}, "max_cost"),
    ("flow", ["--max-tokens", "0"], "--max-tokens", "flow", {"max_tokens": 0}, "max_tokens"),
    ("flow", ["--max-plan-entries", "0"], "--max-plan-entries", "flow",
     {"max_plan_entries": 0}, "max_plan_entries"),
    ("flow", ["--compact-records", "0"], "--compact-records", "flow", {"compact_records": 0},
     "compact_records"),
    ("flow", ["--compact-bytes", "10"], "--compact-bytes", "flow", {"compact_bytes": 10},
     "compact_bytes"),
    ("flow", ["--checkpoint-version", "5"], "--checkpoint-version", "flow",
     {"checkpoint_version": 5}, "checkpoint_version"),
    ("flow", ["--executor", "dask"], "--executor", "flow", {"executor": "dask"}, "executor"),
    ("flow", ["--reactive", "a,,b"], "--reactive", "flow", {"reactive": "a,,b"}, "reactive"),
    ("flow", ["--synthesize", " "], "--synthesize", "flow", {"synthesize": " "}, "synthesize"),
    ("flow", ["--ray-address", " "], "--ray-address", "flow", {"ray_address": " "},
     "ray_address"),
    ("flow", ["--price", "m=-1,2"], "--price", "flow", {"prices": {"m": (-1, 2)}}, "prices"),
    ("flow", ["--price", "m=1"], "--price", "flow", {"prices": {"m": (1,)}}, "prices"),
    ("agent", ["--max-turns", "0"], "--max-turns", "agent", {"max_turns": 0}, "max_turns"),
    ("agent", ["--timeout", "0"], "--timeout", "agent", {"timeout_s": 0}, "timeout_s"),
    ("agent", ["--max-cost", "-2"], "--max-cost", "agent", {"max_cost": -2}, "max_cost"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "args", "flag", "options", "kwargs", "parameter"),
    CASES,
    ids=[f"{c[0]}{''.join(c[1])}" for c in CASES],
)
def test_the_api_refuses_what_the_cli_refuses_naming_the_parameter(
    tmp_path: Path,
    command: str,
    args: list[str],
    flag: str,
    options: str,
    kwargs: dict[str, Any],
    parameter: str,
) -> None:
    home = tmp_path / "home"
    head = (
        ["flow", "--plan", write_yaml(tmp_path / "p.yaml", PLAN)]
        if command == "flow"
        else ["agent", "task"]
    )
    done = run_cli(home, *head, *args, "--json")
    assert done.returncode == ExitCode.USAGE, done.explain()
    message = done.json["error"]["message"]
    assert flag in message, message
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())

    cls = steerflow.FlowOptions if options == "flow" else AgentOptions
    base: dict[str, Any] = {} if options == "flow" else {"task": "task"}
    with pytest.raises(UsageError) as refused:
        cls(**base, **kwargs)
    error = refused.value
    assert error.exit_code == ExitCode.USAGE
    assert isinstance(error, InvalidValueError), repr(error)
    assert error.parameter.split("[")[0] == parameter, str(error)
    assert str(error).startswith(f"invalid value for {parameter}"), str(error)
    assert "--" not in str(error), f"the API's error names a flag: {error}"


def test_prices_take_price_objects_pairs_and_mappings() -> None:
    options = steerflow.FlowOptions(
        prices={
            "openai/gpt-4o": steerflow.Price(2.5, 10),
            "m2": (1, 2),
            "m3": {"input": 0.5, "output": 1.5},
        }
    )
    assert options.prices == {
        "openai/gpt-4o": steerflow.Price(2.5, 10.0),
        "m2": steerflow.Price(1.0, 2.0),
        "m3": steerflow.Price(0.5, 1.5),
    }
    with pytest.raises(InvalidValueError, match=r"prices\['m'\]\['output'\]: -1"):
        steerflow.FlowOptions(prices={"m": {"input": 1, "output": -1}})
    with pytest.raises(InvalidValueError, match="exactly the keys 'input' and 'output'"):
        steerflow.FlowOptions(prices={"m": {"in": 1, "out": 2}})
    with pytest.raises(InvalidValueError, match=r"Price\.input: nan"):
        steerflow.Price(math.nan, 1)


async def test_a_price_pair_from_python_prices_the_run(tmp_path: Path) -> None:
    """The pair reaches the price table: the run's cost is that price's."""
    script = write_yaml(
        tmp_path / "s.yaml",
        {"*": {"usage": {"input_tokens": 1_000_000, "output_tokens": 1_000_000}}},
    )
    spec = f"script:{script}"
    plan = steerflow.Plan(ops=[steerflow.Op("a", "x")], model=spec)
    result = await steerflow.run_flow(
        steerflow.FlowOptions(plan=plan, prices={spec: (1.5, 2.0)}, max_cost=100),
        home=tmp_path / "home",
    )
    assert result.status == "completed", result
    assert result.usage["cost_usd"] == pytest.approx(3.5)


def test_a_budget_from_python_names_the_parameter(tmp_path: Path) -> None:
    """``steerflow.budget`` names ``max_cost``; ``ctl budget`` names ``--max-cost``."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with pytest.raises(InvalidValueError) as refused:
        steerflow.budget(home, "0" * 32, max_cost=-1)
    assert str(refused.value) == (
        "invalid value for max_cost: -1 is not a positive, finite number of USD"
    )
    with pytest.raises(UsageError, match="needs max_cost"):
        steerflow.budget(home, "0" * 32)
    done = run_cli(home, "ctl", "budget", "0" * 32, "--max-cost", "-1")
    assert done.returncode == ExitCode.USAGE and "'--max-cost'" in done.stderr, done.explain()
