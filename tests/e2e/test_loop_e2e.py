"""End to end: a loop killed mid-round and resumed in a new process (issue 40 item 4).

The second test kills the flow (``os._exit`` at a journal fsync seam) between the records
of round 2's intents and round 1's closing outcome: the resume runs round 1's last node
again, adds no round twice, and finishes at round 2.

A draft → critique loop against a loopback OpenAI-compatible server that counts every
request it received (what was paid). The flow is SIGKILLed while round 2's critique is
at the server; ``steerflow resume`` in a new process continues at round 2: round 1's
calls and round 2's recorded draft are never sent again, only the call the kill cut
short is, and the loop ends at round 2 when the critique says LGTM.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from flow_support import child_env, finish, read_invocations, run_cli, start_cli, stop, write_yaml
from test_budget_e2e import _env  # the same loopback vendor environment

from steerflow.checkpoint import load_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
from llm_fakes import FakeLLMServer, Reply


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
            "concurrency": 1,
            "plan": [
                {
                    "loop": {
                        "id": "refine",
                        "body": [
                            {"agent_id": "draft", "instruction": "DRAFT-TASK write it."},
                            {
                                "agent_id": "critique",
                                "instruction": "CRITIQUE-TASK judge it.",
                                "depends_on": ["draft"],
                            },
                        ],
                        "until": {"node": "critique", "contains": "LGTM"},
                        "max_rounds": 4,
                    }
                },
                {
                    "agent_id": "publish",
                    "instruction": "PUBLISH-TASK ship it.",
                    "depends_on": ["refine"],
                },
            ],
        },
    )


def _calls(server: FakeLLMServer, needle: str) -> int:
    """Requests whose own instruction (the last turn) carries ``needle``."""
    return sum(needle in server.user_text(body) for body in server.bodies())


def test_a_loop_killed_mid_round_resumes_at_that_round(
    tmp_path: Path, server: FakeLLMServer
) -> None:
    home = tmp_path / "home"
    gate = threading.Event()
    server.route("DRAFT-TASK", Reply(text="draft one"), Reply(text="draft two"))
    server.route("CRITIQUE-TASK", Reply(text="needs work"), Reply(text="LGTM", gate=gate))
    server.route("PUBLISH-TASK", Reply(text="shipped"))
    plan = _plan(tmp_path / "plan.yaml")
    flow = ["flow", "--plan", plan, "--model", "openai/test-model", "--json"]
    proc = start_cli(home, *flow, env=_env(server))
    try:
        # draft.r1, critique.r1, draft.r2, then critique.r2 held at the server.
        assert server.wait_for(4, 60), f"{len(server.requests)} requests, not 4"
        proc.send_signal(signal.SIGKILL)
        finish(proc, timeout=30)
    finally:
        gate.set()  # the held call is answered to nobody: paid, never recorded
        stop(proc)
    assert (_calls(server, "DRAFT-TASK"), _calls(server, "CRITIQUE-TASK")) == (2, 2)
    first = next((home / "runs").iterdir()).name
    state, _ = load_checkpoint(home / "runs" / first)
    assert state["ops"]["critique.r1"]["loop"] == {"id": "refine", "round": 1, "next": 2}
    recorded = {e["spawn_id"]: e["status"] for e in state["spawned"]}
    assert recorded == {"draft.r2": "completed", "critique.r2": "pending"}

    resumed = run_cli(home, "resume", first, "--json", env=_env(server), timeout=120)
    assert resumed.returncode == 0, resumed.explain()
    out = resumed.json
    assert out["status"] == "completed"
    assert out["loops"] == [
        {
            "id": "refine",
            "rounds": 2,
            "ended": "until_met",
            "nodes": [["draft.r1", "critique.r1"], ["draft.r2", "critique.r2"]],
        }
    ]
    # Round 1 and round 2's draft were never sent again; only the call the kill cut short.
    assert _calls(server, "DRAFT-TASK") == 2
    assert _calls(server, "CRITIQUE-TASK") == 3
    assert _calls(server, "PUBLISH-TASK") == 1
    assert len(server.requests) == 6
    # The resumed critique judged round 2's draft, with round 1's replies behind it.
    last = server.bodies()[-2]
    assert "draft two" in server.user_text(last)
    # The publisher got the last round's replies.
    assert "LGTM" in server.user_text(server.bodies()[-1])

    shown = run_cli(home, "show", str(out["run_id"]), "--json")
    assert shown.returncode == 0, shown.explain()
    assert shown.json["loops"][0]["ended"] == "until_met"
    assert {"draft.r2", "critique.r2"} <= {n["id"] for n in shown.json["nodes"]}


ROUNDS = {
    "draft.r1": {"response": "draft one"},
    "critique.r1": {"response": "needs work"},
    "draft.r2": {"response": "draft two"},
    "critique.r2": {"response": "LGTM"},
    "publish": {"response": "shipped"},
}


@pytest.mark.parametrize(
    ("fsync", "intents"),
    [
        (3, [("draft.r2", "pending")]),
        (4, [("draft.r2", "pending"), ("critique.r2", "pending")]),
    ],
    ids=["one-intent-of-round-2", "both-intents-of-round-2"],
)
def test_a_kill_between_round_two_intents_and_round_one_outcome(
    tmp_path: Path, fsync: int, intents: list[tuple[str, str]]
) -> None:
    home = tmp_path / "home"
    plan = _plan(tmp_path / "plan.yaml")
    script = write_yaml(tmp_path / "script.yaml", ROUNDS)
    flow = ["flow", "--plan", plan, "--model", f"script:{script}", "--json"]
    env = child_env(STEERFLOW_FAULT=f"exit:after:journal-fsync:{fsync}")
    died = run_cli(home, *flow, env=env, timeout=120)
    assert died.returncode == 137, died.explain()
    first = next((home / "runs").iterdir()).name
    state, _ = load_checkpoint(home / "runs" / first)
    # The window under test: round 2 (in part) recorded, round 1's closing outcome not.
    assert sorted(state["ops"]) == ["draft.r1"]
    assert [(e["spawn_id"], e["status"]) for e in state["spawned"]] == intents

    resumed = run_cli(home, "resume", first, "--json", timeout=120)
    assert resumed.returncode == 0, resumed.explain()
    out = resumed.json
    assert out["loops"] == [
        {
            "id": "refine",
            "rounds": 2,
            "ended": "until_met",
            "nodes": [["draft.r1", "critique.r1"], ["draft.r2", "critique.r2"]],
        }
    ]
    # critique.r1 was answered but never recorded: it runs again; nothing else does.
    assert [i["node"] for i in read_invocations(home)] == [
        "draft.r1", "critique.r1", "critique.r1", "draft.r2", "critique.r2", "publish",
    ]  # fmt: skip
    assert sorted(n["id"] for n in out["nodes"]) == sorted(
        ["draft.r1", "critique.r1", "draft.r2", "critique.r2", "publish"]
    )
