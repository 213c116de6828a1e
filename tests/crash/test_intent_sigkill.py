"""Death right after a call's write-ahead intent is durable (issue 38 item 1, decision 217).

``STEERFLOW_FAULT=exit:after:intent-ack:N`` ends the process (``os._exit``) once the Nth
intent is acknowledged and before its call is sent. A new process then resumes: the
call is listed as in flight (it may have been paid, as far as anybody can know), its
node runs once, and no acknowledged node runs again. Calls are counted by the ``script:``
model's invocation log.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from flow_support import child_env, read_invocations, run_cli, write_yaml

pytestmark = pytest.mark.timeout(120)


def _nodes(home: Path) -> list[str]:
    return [str(i.get("node") or i.get("node_key")) for i in read_invocations(home)]


@pytest.mark.parametrize("version", ["3", "4"])
def test_a_flow_killed_after_an_intent_resumes_listing_that_call_and_runs_it_once(
    tmp_path: Path, version: str
) -> None:
    home = tmp_path / "home"
    script = write_yaml(tmp_path / "s.yaml", {n: {"response": n.upper()} for n in "abc"})
    plan = write_yaml(tmp_path / "p.yaml", {"concurrency": 1, "plan": [
        {"agent_id": n, "instruction": f"do {n}"} for n in "abc"]})  # fmt: skip
    env = child_env(STEERFLOW_FAULT="exit:after:intent-ack:2")
    killed = run_cli(home, "flow", "--plan", plan, "--model", f"script:{script}", "--json",
                     "--checkpoint-version", version, env=env)  # fmt: skip
    assert killed.returncode == 137, killed.explain()
    assert len(read_invocations(home)) == 1  # a ran; b's intent is durable, b never sent
    run_id = sorted(p.name for p in (home / "runs").iterdir())[-1]

    dry = run_cli(home, "resume", run_id, "--dry-run", "--json")
    assert dry.returncode == 0, dry.explain()
    (call,) = dry.json["in_flight_calls"]
    assert (call["node"], call["attempt"], call["model"]) == ("b", 1, f"script:{script}")
    assert "1 call was in flight when the run died and may have been paid" in dry.stderr

    done = run_cli(home, "resume", run_id, "--json")
    assert done.returncode == 0, done.explain()
    assert [n["status"] for n in done.json["nodes"]] == ["completed"] * 3
    assert len(read_invocations(home)) == 3  # b and c once each, a never again
    assert [c["node"] for c in done.json["in_flight_calls"]] == ["b"]


def test_an_agent_killed_after_its_turns_intent_lists_the_turn(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = write_yaml(tmp_path / "s.yaml", {"turn-1": {"response": "one"}})
    env = child_env(STEERFLOW_FAULT="exit:after:intent-ack:1")
    killed = run_cli(home, "agent", "task", "--model", f"script:{script}", "--json", env=env)
    assert killed.returncode == 137, killed.explain()
    assert read_invocations(home) == []
    run_id = sorted(p.name for p in (home / "runs").iterdir())[-1]
    dry = run_cli(home, "resume", run_id, "--dry-run", "--json")
    assert dry.returncode == 0, dry.explain()
    assert [c["node"] for c in dry.json["in_flight_calls"]] == ["turn-1"]
    done = run_cli(home, "resume", run_id, "--json")
    assert done.returncode == 0, done.explain()
    assert len(read_invocations(home)) == 1
