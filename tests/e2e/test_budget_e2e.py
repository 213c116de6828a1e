"""End to end: spend budgets (CONTRACT §11) through the real CLI and loopback LLM servers.

Each test runs ``steerflow`` as a subprocess against the fake OpenAI- or Anthropic-shaped
server of the provider tests (``tests/providers/llm_fakes.py``), which returns ``usage``
and counts every request: a cap that closes admission must show up there as calls that
never arrived, and a resume as exactly the calls that were missing.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import genai_prices
import pytest
from ctl_support import ctl, ctl_ok, live_flow, wait_stamped
from flow_support import (
    CliResult,
    child_env,
    cli_in_process,
    run_cli,
    show_in_process,
    write_yaml,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
from llm_fakes import FakeLLMServer, Flavour, Reply

#: Every call of these tests costs this much at ``--price test-model=10,20``:
#: 1000 input tokens at $10/M plus 500 output tokens at $20/M.
CALL_USD = 0.02
CALL_TOKENS = 1500
PRICE = "test-model=10,20"

_VENDOR_ENV = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
)


def _env(server: FakeLLMServer) -> dict[str, str]:
    env = {
        k: v
        for k, v in child_env().items()
        if k not in _VENDOR_ENV and not k.startswith("STEERFLOW_")
    }
    url, key = (
        ("OPENAI_BASE_URL", "OPENAI_API_KEY")
        if server.flavour == "openai"
        else ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY")
    )
    env.update({url: server.base_url, key: "sk-budget", "NO_PROXY": "127.0.0.1,localhost"})
    env.update({"STEERFLOW_PROVIDER_MAX_ATTEMPTS": "1", "STEERFLOW_PROVIDER_TIMEOUT_S": "60"})
    return env


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def _serve(flavour: Flavour) -> Iterator[FakeLLMServer]:
    fake = FakeLLMServer(flavour).start()
    fake.forever(Reply(text="done", input_tokens=1000, output_tokens=500))
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def openai_server() -> Iterator[FakeLLMServer]:
    yield from _serve("openai")


@pytest.fixture
def anthropic_server() -> Iterator[FakeLLMServer]:
    yield from _serve("anthropic")


def fan_out(path: Path, count: int, concurrency: int) -> Path:
    """``count`` independent nodes ``n0..``, each asking for ``Task NODE-<i>``."""
    return write_yaml(
        path,
        {
            "concurrency": concurrency,
            "plan": [{"agent_id": f"n{i}", "instruction": f"Task NODE-{i}."} for i in range(count)],
        },
    )


def _flow(server: FakeLLMServer, home: Path, plan: Path, *args: object) -> CliResult:
    model = f"{server.flavour}/test-model"
    return run_cli(home, "flow", "--plan", plan, "--model", model, "--json", *args,
                   env=_env(server), timeout=120)  # fmt: skip


def _resume(server: FakeLLMServer, home: Path, run_id: str, *args: object) -> CliResult:
    return run_cli(home, "resume", run_id, "--json", *args, env=_env(server), timeout=120)


def _asked(server: FakeLLMServer) -> list[str]:
    """The node each request was for (``NODE-<i>`` of its instruction), in arrival order."""
    found = []
    for body in server.bodies():
        text = server.user_text(body)
        found.append(text.split("NODE-", 1)[1].split(".", 1)[0])
    return found


def runs_json(home: Path) -> dict[str, Any]:
    code, text = cli_in_process(home, "runs", "--json")
    assert code == 0, text
    return dict(json.loads(text))


def result_json(home: Path, run_id: str) -> dict[str, Any]:
    code, text = cli_in_process(home, "result", run_id, "--json")
    assert code == 1, text  # the run did not complete
    return dict(json.loads(text))


def _statuses(out: dict[str, Any]) -> dict[str, str]:
    return {n["id"]: n["status"] for n in out["nodes"]}


def test_a_cost_cap_closes_admission_and_a_higher_cap_resumes_exactly_the_rest(
    home: Path, tmp_path: Path, openai_server: FakeLLMServer
) -> None:
    plan = fan_out(tmp_path / "plan.yaml", 10, concurrency=1)
    first = _flow(openai_server, home, plan, "--max-cost", "0.05", "--price", PRICE)
    assert first.returncode == 76, first.explain()
    out = first.json
    assert out["status"] == "budget_exhausted" and out["exit_code"] == 76
    # One call at a time, each $0.02: after two ($0.04) a third would pass $0.05.
    done = [k for k, v in _statuses(out).items() if v == "completed"]
    assert done == ["n0", "n1"], out["nodes"]
    assert _asked(openai_server) == ["0", "1"]  # nothing started after admission closed
    assert out["usage"]["cost_usd"] == pytest.approx(2 * CALL_USD)
    assert out["usage"]["input_tokens"] == 2000 and out["usage"]["output_tokens"] == 1000
    assert out["budget"] == {"max_cost": 0.05, "max_tokens": None}
    line = [ln for ln in first.stderr.splitlines() if ln.startswith("budget reached")]
    assert line == [
        f"budget reached: spent $0.0400 of the $0.05 cap; resume with: steerflow resume "
        f"{out['run_id']} --max-cost MORE"
    ], first.stderr
    for listed in [runs_json(home)["runs"][0], result_json(home, out["run_id"]), out]:
        assert listed["usage"]["cost_usd"] == pytest.approx(2 * CALL_USD), listed
        assert listed["budget"] == {"max_cost": 0.05, "max_tokens": None}
    shown = show_in_process(home, out["run_id"])
    assert shown["status"] == "budget_exhausted"
    assert shown["budget"] == {"max_cost": 0.05, "max_tokens": None}
    assert shown["nodes"][0]["usage"] == {
        "input_tokens": 1000,
        "output_tokens": 500,
        "cache_read_tokens": None,
        "cache_write_tokens": None,
        "cost_usd": pytest.approx(CALL_USD),
    }

    # The cap is the chain's: $0.13 in all leaves room for 4 more calls ($0.12).
    second = _resume(openai_server, home, out["run_id"], "--max-cost", "0.13")
    assert second.returncode == 76, second.explain()
    assert _asked(openai_server) == ["0", "1", "2", "3", "4", "5"]
    assert second.json["usage"]["cost_usd"] == pytest.approx(4 * CALL_USD)  # replays are free
    assert second.json["budget_exhausted"]["spent"]["cost_usd"] == pytest.approx(0.12)

    third = _resume(openai_server, home, second.json["run_id"], "--max-cost", "1")
    assert third.returncode == 0, third.explain()
    assert set(_statuses(third.json).values()) == {"completed"}
    # Every node was paid for exactly once across the chain.
    assert sorted(_asked(openai_server), key=int) == [str(i) for i in range(10)]


def test_a_resume_of_an_exhausted_run_without_a_new_cap_admits_nothing(
    home: Path, tmp_path: Path, openai_server: FakeLLMServer
) -> None:
    plan = fan_out(tmp_path / "plan.yaml", 4, concurrency=1)
    first = _flow(openai_server, home, plan, "--max-cost", "0.03", "--price", PRICE)
    assert first.returncode == 76, first.explain()
    asked = len(openai_server.requests)
    again = _resume(openai_server, home, first.json["run_id"])
    assert again.returncode == 76, again.explain()
    assert "has already reached its budget" in again.stderr
    assert len(openai_server.requests) == asked
    assert again.json["budget"] == {"max_cost": 0.03, "max_tokens": None}  # the chain's cap


def test_a_token_cap_on_the_messages_api(
    home: Path, tmp_path: Path, anthropic_server: FakeLLMServer
) -> None:
    plan = fan_out(tmp_path / "plan.yaml", 10, concurrency=1)
    # 1500 tokens a call: four fit in 6000 exactly, and a cap is never passed.
    first = _flow(anthropic_server, home, plan, "--max-tokens", "6000")
    assert first.returncode == 76, first.explain()
    out = first.json
    assert len(anthropic_server.requests) == 4
    assert out["usage"]["input_tokens"] + out["usage"]["output_tokens"] == 4 * CALL_TOKENS
    assert out["budget"] == {"max_cost": None, "max_tokens": 6000}
    assert "spent 6000 of the 6000 token cap" in first.stderr
    second = _resume(anthropic_server, home, out["run_id"], "--max-tokens", "100000")
    assert second.returncode == 0, second.explain()
    assert sorted(_asked(anthropic_server), key=int) == [str(i) for i in range(10)]


def test_overshoot_is_bounded_by_the_calls_already_in_flight(
    home: Path, tmp_path: Path, openai_server: FakeLLMServer
) -> None:
    """The first call runs alone and is cheap ($0.002), so four calls ten times its size
    are admitted at once (held until all four arrived): they finish and are recorded, the
    overshoot is at most those calls, and nothing more starts (decision 180)."""
    gate = threading.Event()
    openai_server.push(Reply(text="done", input_tokens=100, output_tokens=50))
    openai_server.forever(Reply(text="done", input_tokens=1000, output_tokens=500, gate=gate))
    plan = fan_out(tmp_path / "plan.yaml", 12, concurrency=4)
    opener = threading.Thread(target=lambda: openai_server.wait_for(5, 60) and gate.set())
    opener.start()
    try:
        first = _flow(openai_server, home, plan, "--max-cost", "0.05", "--price", PRICE)
    finally:
        gate.set()
        opener.join(10)
    assert first.returncode == 76, first.explain()
    out = first.json
    spent = out["usage"]["cost_usd"]
    assert len(openai_server.requests) == 5
    assert sum(v == "completed" for v in _statuses(out).values()) == 5
    assert spent == pytest.approx(0.002 + 4 * CALL_USD)
    assert 0.05 < spent <= 0.05 + 4 * CALL_USD


def test_without_a_known_call_size_the_first_call_runs_alone(
    home: Path, tmp_path: Path, openai_server: FakeLLMServer
) -> None:
    """At concurrency 4 and calls of one size, the cap is not passed: the first call sizes
    the reservations of the ones after it."""
    plan = fan_out(tmp_path / "plan.yaml", 20, concurrency=4)
    first = _flow(openai_server, home, plan, "--max-cost", "0.05", "--price", PRICE)
    assert first.returncode == 76, first.explain()
    assert len(openai_server.requests) == 2
    assert first.json["usage"]["cost_usd"] == pytest.approx(2 * CALL_USD)


def _priced(server: FakeLLMServer, home: Path, plan: Path, model: str, *args: str) -> float:
    run = run_cli(home, "flow", "--plan", plan, "--model", model, "--json", *args,
                  env=_env(server), timeout=120)  # fmt: skip
    assert run.returncode == 0, run.explain()
    shown = show_in_process(home, run.json["run_id"])
    (node,) = shown["nodes"]
    assert node["usage"]["cost_usd"] == pytest.approx(run.json["usage"]["cost_usd"])
    return float(node["usage"]["cost_usd"])


def test_costs_come_from_genai_prices_and_price_overrides_them(
    home: Path, tmp_path: Path, openai_server: FakeLLMServer, anthropic_server: FakeLLMServer
) -> None:
    plan = fan_out(tmp_path / "plan.yaml", 1, concurrency=1)
    cached = {"prompt_tokens_details": {"cached_tokens": 200}}
    openai_server.forever(Reply(input_tokens=1000, output_tokens=500, usage_extra=cached))
    cache = {"cache_read_input_tokens": 100, "cache_creation_input_tokens": 50}
    anthropic_server.forever(Reply(input_tokens=1000, output_tokens=500, usage_extra=cache))
    gpt = _priced(openai_server, home, plan, "openai/gpt-4o")
    expected = genai_prices.calc_price(
        genai_prices.Usage(input_tokens=1000, output_tokens=500, cache_read_tokens=200),
        "gpt-4o",
        provider_id="openai",
    )
    assert gpt == pytest.approx(float(expected.total_price))
    haiku = _priced(anthropic_server, home, plan, "anthropic/claude-3-5-haiku-latest")
    expected = genai_prices.calc_price(
        genai_prices.Usage(
            input_tokens=1150, output_tokens=500, cache_read_tokens=100, cache_write_tokens=50
        ),
        "claude-3-5-haiku-latest",
        provider_id="anthropic",
    )
    assert haiku == pytest.approx(float(expected.total_price))
    assert gpt != haiku
    # --price wins over the table (by model name here): 1000 in at $1/M, 500 out at $2/M.
    overridden = _priced(openai_server, home, plan, "openai/gpt-4o", "--price", "gpt-4o=1,2")
    assert overridden == pytest.approx(0.002)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--max-cost", "0"], "--max-cost"),
        (["--max-cost", "-1"], "--max-cost"),
        (["--max-cost", "nan"], "--max-cost"),
        (["--max-cost", "cheap"], "--max-cost"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--max-tokens", "many"], "--max-tokens"),
        (["--price", "test-model=1"], "--price"),
        (["--price", "test-model=-1,2"], "--price"),
        (["--price", "test-model=nan,2"], "--price"),
        (["--price", "test-model=a,b"], "--price"),
        (["--price", "=1,2"], "--price"),
        # no known price and no --price: refused before anything runs, never free
        (["--max-cost", "1"], "openai/test-model"),
    ],
)
def test_bad_caps_and_prices_are_usage_errors(
    home: Path, tmp_path: Path, openai_server: FakeLLMServer, args: list[str], named: str
) -> None:
    plan = fan_out(tmp_path / "plan.yaml", 2, concurrency=1)
    run = _flow(openai_server, home, plan, *args)
    assert run.returncode == 2, run.explain()
    assert named in run.stderr + run.stdout
    assert openai_server.requests == []


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"max_cost": -1}, "max_cost"),
        ({"max_cost": 0}, "max_cost"),
        ({"max_cost": "lots"}, "max_cost"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"prices": {"test-model": {"input": -1, "output": 1}}}, "prices"),
        ({"prices": {"test-model": {"input": "x", "output": 1}}}, "prices"),
    ],
)
def test_bad_plan_keys_are_usage_errors(
    home: Path, tmp_path: Path, openai_server: FakeLLMServer, keys: dict[str, Any], named: str
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({"plan": [{"agent_id": "a", "instruction": "x"}], **keys}))
    run = _flow(openai_server, home, plan)
    assert run.returncode == 2, run.explain()
    assert named in run.stderr + run.stdout
    assert openai_server.requests == []


def test_a_token_cap_on_a_model_that_reports_no_usage_is_refused(
    home: Path, tmp_path: Path
) -> None:
    plan = fan_out(tmp_path / "plan.yaml", 2, concurrency=1)
    run = run_cli(home, "flow", "--plan", plan, "--model", "echo", "--max-tokens", "10")
    assert run.returncode == 2, run.explain()
    assert "'echo' reports no token usage" in run.stderr


def test_ctl_budget_raising_the_cap_mid_run_lets_waiting_nodes_start(
    home: Path, tmp_path: Path, openai_server: FakeLLMServer
) -> None:
    gate = threading.Event()
    openai_server.push(Reply(text="done", input_tokens=1000, output_tokens=500, gate=gate))
    plan = fan_out(tmp_path / "plan.yaml", 6, concurrency=1)
    args = ["--plan", str(plan), "--model", "openai/test-model", "--max-cost", "0.05",
            "--price", PRICE]  # fmt: skip
    try:
        with live_flow(home, args, env=_env(openai_server)) as flow:
            assert openai_server.wait_for(1, 60)  # n0 is in flight, held
            status = ctl(home, "status", flow.session_id, "--json")
            assert json.loads(status.stdout)["budget"] == {"max_cost": 0.05, "max_tokens": None}
            raised = ctl_ok(home, "budget", flow.session_id, "--max-cost", "0.2")
            assert wait_stamped(home, raised, alive=flow.proc).result == "applied"
            gate.set()
            assert flow.finish(timeout=120) == 0, flow.stderr()
            out = flow.result()
    finally:
        gate.set()
    # Without the raise two calls fitted (the first test): now every node ran, once each.
    assert set(_statuses(out).values()) == {"completed"}
    assert sorted(_asked(openai_server)) == [str(i) for i in range(6)]
    assert out["budget"] == {"max_cost": 0.2, "max_tokens": None}
    view = json.loads(ctl(home, "status", out["session_id"], "--json").stdout)
    assert view["budget"]["max_cost"] == 0.2
    assert view["spent"]["cost_usd"] == pytest.approx(6 * CALL_USD)


def test_ctl_budget_below_the_spend_closes_admission(
    home: Path, tmp_path: Path, openai_server: FakeLLMServer
) -> None:
    gate = threading.Event()
    openai_server.push(
        Reply(text="done", input_tokens=1000, output_tokens=500),
        Reply(text="done", input_tokens=1000, output_tokens=500, gate=gate),
    )
    plan = fan_out(tmp_path / "plan.yaml", 6, concurrency=1)
    args = ["--plan", str(plan), "--model", "openai/test-model", "--max-cost", "1",
            "--price", PRICE]  # fmt: skip
    try:
        with live_flow(home, args, env=_env(openai_server)) as flow:
            assert openai_server.wait_for(2, 60)  # n0 paid ($0.02), n1 in flight
            lowered = ctl_ok(home, "budget", flow.session_id, "--max-cost", "0.01")
            assert wait_stamped(home, lowered, alive=flow.proc).result == "applied"
            gate.set()  # the call in flight finishes and is recorded
            assert flow.finish(timeout=120) == 76, flow.stderr()
            out = flow.result()
    finally:
        gate.set()
    assert len(openai_server.requests) == 2
    done = [k for k, v in _statuses(out).items() if v == "completed"]
    assert done == ["n0", "n1"]
    assert out["budget"] == {"max_cost": 0.01, "max_tokens": None}
    # Once the budget closed admission, a higher cap is for a resume.
    assert out["status"] == "budget_exhausted"


@pytest.mark.parametrize(
    "args", [[], ["--max-cost", "0"], ["--max-cost", "nan"], ["--max-tokens", "-3"]]
)
def test_bad_ctl_budget_is_a_usage_error(home: Path, args: list[str]) -> None:
    proc = ctl(home, "budget", "a" * 32, *args)
    assert proc.returncode == 2, proc.stderr
