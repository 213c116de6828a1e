"""End to end: a paid call is recorded before it leaves (write-ahead intent, decision 217).

The issue's repro (issue 38 item 1): 14 independent nodes at concurrency 3 under
``--max-cost 0.013`` against a loopback OpenAI-compatible server whose every call costs
$0.002 (100 input tokens at $10/M plus 50 output tokens at $20/M). The flow is SIGKILLed
while calls are at the server, resumed, killed again the same way, and resumed once
more. The server counts every request it received: that is what was paid. Before the
intents, each resume paid again for calls nobody had counted ($0.020-0.024 against the
$0.013 cap); now the calls in flight at each kill count as spent, so the server's total
stays within the cap, and each resume says which calls may have been paid.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flow_support import CliResult, finish, run_cli, start_cli, stop, write_yaml
from test_budget_e2e import _env  # the same loopback vendor environment

from steerflow.checkpoint import load_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
from llm_fakes import FakeLLMServer, Reply

CALL_USD = 0.002
PRICE = "test-model=10,20"
CAP = "0.013"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    fake = FakeLLMServer("openai").start()
    try:
        yield fake
    finally:
        fake.close()


def _plan(path: Path) -> Path:
    return write_yaml(
        path,
        {
            "concurrency": 3,
            "plan": [{"agent_id": f"n{i}", "instruction": f"Task NODE-{i}."} for i in range(14)],
        },
    )


def _paid(server: FakeLLMServer) -> float:
    """What the server was paid: every request that reached it."""
    return len(server.requests) * CALL_USD


def _kill_with_calls_at_the_server(
    server: FakeLLMServer, home: Path, args: list[object], held: int
) -> None:
    """Run ``args``; once ``held`` more requests reached the server, SIGKILL it.

    Replies already queued (``push``) are answered; every other one is held.
    """
    gate = threading.Event()
    server.forever(Reply(text="done", input_tokens=100, output_tokens=50, gate=gate))
    target = len(server.requests) + held
    proc = start_cli(home, *args, env=_env(server))
    try:
        assert server.wait_for(target, 60), f"{len(server.requests)} requests, not {target}"
        proc.send_signal(signal.SIGKILL)
        finish(proc, timeout=30)
    finally:
        gate.set()  # the held calls are answered to nobody: paid, never recorded
        stop(proc)


def _newest_run(home: Path) -> str:
    runs = sorted((home / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    return runs[-1].name


def _dry(server: FakeLLMServer, home: Path, run_id: str) -> CliResult:
    return run_cli(home, "resume", run_id, "--dry-run", "--json", env=_env(server))


def test_two_sigkills_mid_call_never_pay_past_the_cap(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    plan = _plan(tmp_path / "plan.yaml")
    # The first call runs alone and sizes the reservations ($0.002); then three at once.
    server.push(Reply(text="done", input_tokens=100, output_tokens=50))
    flow = ["flow", "--plan", plan, "--model", "openai/test-model", "--json",
            "--max-cost", CAP, "--price", PRICE]  # fmt: skip
    _kill_with_calls_at_the_server(server, home, flow, held=1 + 3)
    assert len(server.requests) == 4  # one answered and saved, three in flight
    first = _newest_run(home)

    state, _ = load_checkpoint(home / "runs" / first)
    flying = state["in_flight"]
    assert len(flying) == 3
    assert [c["reserved_cost_usd"] for c in flying] == [pytest.approx(CALL_USD)] * 3
    assert all(c["model"] == "openai/test-model" and c["attempt"] == 1 for c in flying)

    dry = _dry(server, home, first)
    assert dry.returncode == 0, dry.explain()
    calls = dry.json["in_flight_calls"]
    assert sorted(c["node"] for c in calls) == sorted(c["node"] for c in flying)
    assert [c["reserved_cost_usd"] for c in calls] == [pytest.approx(CALL_USD)] * 3
    assert "3 calls were in flight when the run died and may have been paid: about $0.0060" in (
        dry.stderr + json.dumps(dry.json)
    )
    assert len(server.requests) == 4  # a dry run pays nothing

    # Spent $0.002 + $0.006 in doubt: two more calls fit under $0.013, a third would not.
    _kill_with_calls_at_the_server(server, home, ["resume", first, "--json"], held=2)
    assert len(server.requests) == 6
    second = _newest_run(home)
    dry = _dry(server, home, second)
    assert len(dry.json["in_flight_calls"]) == 2

    # $0.002 spent, $0.010 in doubt: no call fits; the chain's cap held at the server.
    last = run_cli(home, "resume", second, "--json", env=_env(server), timeout=120)
    assert last.returncode == 76, last.explain()
    assert len(server.requests) == 6
    assert _paid(server) <= float(CAP)
    assert "5 calls that may have been paid" in last.stderr
    out = last.json
    assert out["status"] == "budget_exhausted"
    assert len(out["in_flight_calls"]) == 2

    # A higher cap finishes the work: the calls in doubt run again, nothing else twice.
    done = run_cli(home, "resume", out["run_id"], "--json", "--max-cost", "1",
                   env=_env(server), timeout=120)  # fmt: skip
    assert done.returncode == 0, done.explain()
    asked = [server.user_text(b).split("NODE-", 1)[1].split(".", 1)[0] for b in server.bodies()]
    assert sorted(set(asked), key=int) == [str(i) for i in range(14)]
    # Paid twice: only the five calls a kill left in flight, never an acknowledged one.
    assert len(asked) == 14 + 5


def test_a_completed_run_leaves_no_intent_open(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    server.forever(Reply(text="done", input_tokens=100, output_tokens=50))
    plan = _plan(tmp_path / "plan.yaml")
    run = run_cli(home, "flow", "--plan", plan, "--model", "openai/test-model", "--json",
                  env=_env(server), timeout=120)  # fmt: skip
    assert run.returncode == 0, run.explain()
    state, report = load_checkpoint(home / "runs" / run.json["run_id"])
    assert report["status"] == "clean"
    assert "in_flight" not in state
    journal = (home / "runs" / run.json["run_id"] / "checkpoint.json.journal").read_text()
    kinds = [json.loads(line)["kind"] for line in journal.splitlines()]
    # Every call was an intent before it was an outcome.
    assert kinds.count("intent") == 14 and kinds.count("op") == 14
    assert run.json["in_flight_calls"] == []


def _intent_lines(run_dir: Path) -> list[dict[str, Any]]:
    journal = (run_dir / "checkpoint.json.journal").read_text()
    return [r for r in map(json.loads, journal.splitlines()) if r["kind"] == "intent"]


def test_a_run_killed_during_its_planner_call_says_the_call_may_have_been_paid(
    home: Path, server: FakeLLMServer
) -> None:
    """The planner runs before the run has a checkpoint: its intent is on the session
    (decision 219), so the refused resume says that the call may have been paid."""
    flow = ["flow", "plan three steps", "--model", "openai/test-model", "--json"]
    _kill_with_calls_at_the_server(server, home, flow, held=1)
    run_id = _newest_run(home)
    refused = run_cli(home, "resume", run_id, "--json", env=_env(server))
    assert refused.returncode == 3, refused.explain()
    message = refused.json["error"]["message"]
    assert "died while planning" in message
    assert "planner call (openai/test-model) was in flight and may have been paid" in message
    assert len(server.requests) == 1  # nothing was called again


def test_a_returned_call_no_longer_holds_its_reservation_while_it_is_saved(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    """Issue 38 item 2: ``--max-cost 0.011`` with $0.002 calls at concurrency 3 admits a
    fifth call ($0.010). Three calls are answered at once; before, each returned call was
    charged and still reserved until its outcome was saved, so it counted twice and
    admission closed at $0.008."""
    gate = threading.Event()
    server.push(Reply(text="done", input_tokens=100, output_tokens=50))  # sizes the meter
    for _ in range(3):
        server.push(Reply(text="done", input_tokens=100, output_tokens=50, gate=gate))
    server.forever(Reply(text="done", input_tokens=100, output_tokens=50))
    opener = threading.Thread(target=lambda: server.wait_for(4, 60) and gate.set())
    opener.start()
    try:
        run = run_cli(home, "flow", "--plan", _plan(tmp_path / "plan.yaml"), "--model",
                      "openai/test-model", "--json", "--max-cost", "0.011", "--price", PRICE,
                      env=_env(server), timeout=120)  # fmt: skip
    finally:
        gate.set()
        opener.join(10)
    assert run.returncode == 76, run.explain()
    assert len(server.requests) == 5
    assert run.json["usage"]["cost_usd"] == pytest.approx(5 * CALL_USD)
