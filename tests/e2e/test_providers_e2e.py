"""End to end: ``steerflow flow --model openai/...`` against a loopback OpenAI-compatible server.

Every test runs the real CLI as a subprocess (``python -m steerflow``), which talks to
the fake server of the provider tests (``tests/providers/llm_fakes.py``) through the
real ``openai`` SDK, with ``OPENAI_BASE_URL=http://127.0.0.1:PORT/v1``. Each test
asserts what the server saw, not only what the CLI printed.

The scenarios themselves are vendor-neutral (``scenario_*`` below, parameterised by
a :class:`Vendor`); ``test_anthropic_e2e.py`` runs the same ones through the
``anthropic`` SDK.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flow_support import (
    CliResult,
    child_env,
    cli_in_process,
    finish,
    node_status,
    run_cli,
    runs_in_process,
    show_in_process,
    start_cli,
    stop,
    wait_for,
    write_yaml,
)

from steerflow.errors import PlanValidationError
from steerflow.plan import parse_plan
from steerflow.providers._remote import SPAWN_GUIDANCE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
from llm_fakes import FakeLLMServer, Flavour, Reply

#: Attempts per call in these tests: a 500-forever node is asked exactly this often.
ATTEMPTS = 3

_VENDOR_ENV = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_ORG_ID",
    "OPENAI_PROJECT_ID",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
)

_STEER_LINE = re.compile(r"^- \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z: use approach B$", re.M)


@dataclass(frozen=True)
class Vendor:
    """One SDK-backed vendor: its model spec and how a CLI child reaches the fake server."""

    flavour: Flavour
    model: str
    key_env: str
    url_env: str
    api_key: str

    def env(self, server: FakeLLMServer, **extra: str) -> dict[str, str]:
        """The CLI child's environment: this vendor pointed at ``server``, fast retries."""
        env = {
            k: v
            for k, v in child_env().items()
            if k not in _VENDOR_ENV and not k.startswith("STEERFLOW_")
        }
        env.update(
            {
                self.url_env: server.base_url,
                self.key_env: self.api_key,
                "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost",
                "STEERFLOW_PROVIDER_MAX_ATTEMPTS": str(ATTEMPTS),
                "STEERFLOW_PROVIDER_BACKOFF_S": "0.01",
                "STEERFLOW_PROVIDER_MAX_BACKOFF_S": "0.05",
                "STEERFLOW_PROVIDER_TIMEOUT_S": "60",
            }
        )
        env.update(extra)
        return env

    def flow(self, server: FakeLLMServer, home: Path, *args: object, **extra: str) -> CliResult:
        """``steerflow --home HOME flow ARGS --model <vendor>/test-model --json``."""
        return run_cli(
            home, "flow", *args, "--model", self.model, "--json",
            env=self.env(server, **extra),
        )  # fmt: skip


OPENAI = Vendor("openai", "openai/test-model", "OPENAI_API_KEY", "OPENAI_BASE_URL", "sk-e2e")


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


# ----------------------------------------------------------------------------- helpers


def three_node_plan(path: Path) -> Path:
    """``research -> draft`` and an independent ``side``; two roles with system prompts."""
    return write_yaml(
        path,
        {
            "name": "providers-e2e",
            "roles": {
                "researcher": {"system": "You are RESEARCHER-PERSONA."},
                "writer": {"system": "You are WRITER-PERSONA."},
            },
            "plan": [
                {
                    "agent_id": "research",
                    "assignee": "researcher",
                    "instruction": "Research topic ALPHA",
                },
                {
                    "agent_id": "draft",
                    "assignee": "writer",
                    "instruction": "Draft from research BETA",
                    "depends_on": ["research"],
                },
                {"agent_id": "side", "assignee": "helper", "instruction": "Side task GAMMA"},
            ],
        },
    )


def only(server: FakeLLMServer, needle: str) -> dict[str, Any]:
    """The one request whose body contains ``needle``."""
    hits = server.matching(needle)
    assert len(hits) == 1, f"{needle!r} in requests {hits} of {len(server.requests)}"
    body: dict[str, Any] = server.requests[hits[0]].body
    return body


def node(out: dict[str, Any], key: str) -> dict[str, Any]:
    """One node of a ``--json`` result."""
    found: dict[str, Any] = next(n for n in out["nodes"] if n["id"] == key)
    return found


# --------------------------------------------------------------------------- scenarios


def scenario_full_run(
    vendor: Vendor,
    server: FakeLLMServer,
    home: Path,
    tmp_path: Path,
    *,
    draft_usage: dict[str, Any],
    expected_usage: dict[str, Any],
) -> dict[str, Any]:
    """A plan file run to completion; dependency text, system prompts and usage reach
    where they belong. Returns the ``--json`` result."""
    server.route("ALPHA", Reply(text="research notes R-42", input_tokens=100, output_tokens=10))
    server.route(
        "BETA",
        Reply(text="the draft", input_tokens=200, output_tokens=20, usage_extra=draft_usage),
    )
    server.route("GAMMA", Reply(text="side result", input_tokens=300, output_tokens=30))
    result = vendor.flow(server, home, "--plan", three_node_plan(tmp_path / "p.yaml"))
    assert result.returncode == 0, result.explain()
    out = result.json
    assert out["status"] == "completed" and out["exit_code"] == 0
    assert node_status(out) == {"research": "completed", "draft": "completed", "side": "completed"}
    assert {n["kind"] for n in out["nodes"]} == {"planned"}

    assert len(server.requests) == 3
    assert all(body["model"] == "test-model" for body in server.bodies())
    research, draft, side = only(server, "ALPHA"), only(server, "BETA"), only(server, "GAMMA")
    # The dependency's reply reaches the dependent's request; not the other way round.
    assert server.user_text(draft).startswith("Draft from research BETA")
    assert "research notes R-42" in server.user_text(draft)
    assert server.user_text(research) == "Research topic ALPHA"
    assert server.user_text(side) == "Side task GAMMA"
    # Each role's system prompt reaches its node's request; a role without one sends none.
    assert server.system_text(research) == "You are RESEARCHER-PERSONA."
    assert server.system_text(draft) == "You are WRITER-PERSONA."
    assert server.system_text(side) == ""
    assert server.matching("PERSONA") == sorted(server.matching("ALPHA") + server.matching("BETA"))

    # Token usage from the server's `usage` objects is summed, in --json and in `show`.
    assert out["usage"] == expected_usage
    shown = show_in_process(home, out["run_id"])
    assert shown["status"] == "completed"
    assert shown["usage"] == expected_usage
    assert node_status(shown) == node_status(out)
    return out


def scenario_planned_by_model(
    vendor: Vendor, server: FakeLLMServer, home: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``flow PROMPT``: the server's plan (JSON) is run. Returns (result, planning body)."""
    plan = {
        "name": "from-model",
        "plan": [
            {"agent_id": "scope", "assignee": "planner", "instruction": "Scope it SCOPE-STEP"},
            {
                "agent_id": "build",
                "assignee": "coder",
                "instruction": "Build it BUILD-STEP",
                "depends_on": ["scope"],
            },
        ],
    }
    server.route("JSON Schema", Reply(text=json.dumps(plan)))
    server.route("SCOPE-STEP", Reply(text="scope notes S-7"))
    server.route("BUILD-STEP", Reply(text="built"))
    result = vendor.flow(server, home, "Make a tiny CLI tool")
    assert result.returncode == 0, result.explain()
    out = result.json
    assert node_status(out) == {"scope": "completed", "build": "completed"}
    assert len(server.requests) == 3
    planning = server.requests[0].body
    assert "JSON Schema" in server.system_text(planning)
    assert server.user_text(planning) == "Make a tiny CLI tool"
    assert server.matching("JSON Schema") == [0]  # one planning call, then the nodes
    assert server.user_text(only(server, "SCOPE-STEP")) == "Scope it SCOPE-STEP"
    build = server.user_text(only(server, "BUILD-STEP"))
    assert build.startswith("Build it BUILD-STEP") and "scope notes S-7" in build
    assert server.matching("SCOPE-STEP")[0] < server.matching("BUILD-STEP")[0]
    return out, planning


def scenario_spawn(vendor: Vendor, server: FakeLLMServer, home: Path, tmp_path: Path) -> None:
    """``--reactive all``: a reply ending in a fenced ``{"spawn": [...]}`` block adds a node
    that runs, and the server sees its request."""
    plan = write_yaml(
        tmp_path / "spawn.yaml",
        {
            "name": "spawner",
            "plan": [{"agent_id": "lead", "assignee": "lead", "instruction": "Survey LEAD-NODE"}],
        },
    )
    spawn = {
        "spawn": [
            {
                "agent_id": "followup",
                "assignee": "worker",
                "instruction": "Fix the flaky test SPAWNED-NODE",
            }
        ]
    }
    reply = f"Survey done.\n\n```json\n{json.dumps(spawn)}\n```\n"
    # The spawned request carries its emitter's turns, so its route must come first.
    server.route("SPAWNED-NODE", Reply(text="fixed it"))
    server.route("LEAD-NODE", Reply(text=reply))
    result = vendor.flow(server, home, "--plan", plan, "--reactive", "all")
    assert result.returncode == 0, result.explain()
    out = result.json
    assert [(n["id"], n["kind"], n["status"]) for n in out["nodes"]] == [
        ("lead", "planned", "completed"),
        ("followup", "spawned", "completed"),
    ]
    assert out["spawn_rejections"] == []
    assert len(server.requests) == 2
    lead, child = server.requests[0].body, server.requests[1].body
    assert server.user_text(lead) == "Survey LEAD-NODE"
    assert SPAWN_GUIDANCE in server.system_text(lead)  # spawning was offered to the model
    assert server.user_text(child).startswith("Fix the flaky test SPAWNED-NODE")
    assert "Survey done." in server.user_text(child)  # the emitter's result, as a dependency
    # The child continues its emitter's conversation; the spawn block itself is gone.
    turns = [(m["role"], m["content"]) for m in child["messages"]]
    assert ("assistant", "Survey done.") in turns
    assert "SPAWNED-NODE" not in json.dumps(child["messages"][:-1])
    shown = show_in_process(home, out["run_id"])
    assert {(n["id"], n["kind"]) for n in shown["nodes"]} == {
        ("lead", "planned"),
        ("followup", "spawned"),
    }


def scenario_retry_429(
    vendor: Vendor, server: FakeLLMServer, home: Path, tmp_path: Path
) -> dict[str, Any]:
    """429 then 200 on one node: retried, the flow completes; the server saw 2 requests."""
    server.route(
        "GAMMA",
        Reply(status=429, headers={"retry-after-ms": "20"}),
        Reply(text="side after retry", input_tokens=5, output_tokens=1),
    )
    result = vendor.flow(server, home, "--plan", three_node_plan(tmp_path / "p.yaml"))
    assert result.returncode == 0, result.explain()
    out = result.json
    assert node_status(out) == {"research": "completed", "draft": "completed", "side": "completed"}
    side = server.matching("GAMMA")
    assert len(side) == 2
    first, second = (server.requests[i].body for i in side)
    assert first == second  # the same request, sent again
    assert len(server.matching("ALPHA")) == len(server.matching("BETA")) == 1
    # Only the successful attempt's usage counts (defaults: 11 in / 7 out).
    assert out["usage"]["input_tokens"] == 11 + 11 + 5
    assert out["usage"]["output_tokens"] == 7 + 7 + 1
    return out


def scenario_stream_cut_is_retried(
    vendor: Vendor, server: FakeLLMServer, home: Path, tmp_path: Path
) -> dict[str, Any]:
    """A stream cut mid-way on one node (issue 31): retried, and only the whole reply recorded.

    The live file shows the cut attempt's chunks, the restart marker and the whole reply;
    the recorded response and usage are the second attempt's alone.
    """
    server.route(
        "GAMMA",
        Reply(chunks=["HALF-", "SEEN-", "NEVER"], cut_after=2),
        Reply(chunks=["side ", "streamed ", "whole"], input_tokens=5, output_tokens=3),
    )
    result = vendor.flow(server, home, "--plan", three_node_plan(tmp_path / "p.yaml"))
    assert result.returncode == 0, result.explain()
    out = result.json
    assert node_status(out) == {"research": "completed", "draft": "completed", "side": "completed"}
    assert len(server.matching("GAMMA")) == 2
    assert all(server.requests[i].body["stream"] is True for i in server.matching("GAMMA"))
    shown = run_cli(home, "show", out["run_id"], "side", "--json")
    assert json.loads(shown.stdout)["response"] == "side streamed whole"
    assert out["usage"]["input_tokens"] == 11 + 11 + 5  # the cut attempt counts nothing
    live = (Path(out["run_dir"]) / "live" / "side" / "0.txt").read_text()
    assert live.startswith("HALF-SEEN-") and live.endswith("side streamed whole")
    assert "calling again" in live and "NEVER" not in live
    return out


def scenario_server_error_fails_only_that_node(
    vendor: Vendor, server: FakeLLMServer, home: Path, tmp_path: Path
) -> dict[str, Any]:
    """500 forever on ``research``: it fails after every attempt, ``draft`` (its dependent)
    is skipped and never sent, ``side`` completes; exit 1."""
    server.route("ALPHA", Reply(status=500))
    result = vendor.flow(server, home, "--plan", three_node_plan(tmp_path / "p.yaml"))
    assert result.returncode == 1, result.explain()
    out = result.json
    assert out["exit_code"] == 1 and out["status"] == "failed"
    assert node_status(out) == {"research": "failed", "draft": "skipped", "side": "completed"}
    error = node(out, "research")["error"]
    assert "HTTP 500" in error and f"gave up after {ATTEMPTS} attempt(s)" in error
    assert vendor.model in error
    assert len(server.matching("ALPHA")) == ATTEMPTS
    assert server.matching("BETA") == []
    assert len(server.matching("GAMMA")) == 1
    assert len(server.requests) == ATTEMPTS + 1
    shown = show_in_process(home, out["run_id"])
    assert shown["status"] == "failed"
    # show reads the published node table; its final statuses match the flow's own result.
    assert node_status(shown) == node_status(out)
    return out


def scenario_invalid_plan_refused(vendor: Vendor, server: FakeLLMServer, home: Path) -> None:
    """The planner returns an invalid plan twice: one retry with the validation error as
    feedback, then a clear refusal; nothing runs."""
    invalid = {"name": "empty", "plan": []}
    with pytest.raises(PlanValidationError) as caught:
        parse_plan(invalid, source=f"plan from {vendor.model}")
    expected_error = str(caught.value)
    server.route("JSON Schema", Reply(text=json.dumps(invalid)))
    result = vendor.flow(server, home, "Plan something PLAN-PROMPT")
    assert result.returncode == 1, result.explain()
    out = result.json
    assert out["status"] == "error" and out["exit_code"] == 1
    message = out["error"]["message"]
    assert "the planner returned an invalid plan twice" in message
    assert expected_error in message
    assert "invalid plan twice" in result.stderr

    assert len(server.requests) == 2
    assert server.matching("JSON Schema") == [0, 1]
    first, second = (server.user_text(r.body) for r in server.requests)
    assert first == "Plan something PLAN-PROMPT"
    assert second.startswith("Plan something PLAN-PROMPT")
    assert f"Your previous plan was rejected: {expected_error}" in second
    [run] = runs_in_process(home)
    assert run["status"] == "failed"


def scenario_steer_reaches_next_request(
    vendor: Vendor, server: FakeLLMServer, home: Path, tmp_path: Path
) -> None:
    """``ctl msg`` from another process while the first node's reply is held: the next
    request (and only it) starts with the operator steer block."""
    plan = write_yaml(
        tmp_path / "chain.yaml",
        {
            "name": "chain",
            "plan": [
                {"agent_id": "first", "instruction": "Collect facts FIRST-NODE"},
                {
                    "agent_id": "second",
                    "instruction": "Choose an approach SECOND-NODE",
                    "depends_on": ["first"],
                },
                {
                    "agent_id": "third",
                    "instruction": "Write it up THIRD-NODE",
                    "depends_on": ["second"],
                },
            ],
        },
    )
    release = threading.Event()
    server.route("FIRST-NODE", Reply(text="facts F-1", gate=release))
    server.route("SECOND-NODE", Reply(text="approach chosen"))
    server.route("THIRD-NODE", Reply(text="write-up"))
    env = vendor.env(server)
    proc = start_cli(home, "flow", "--plan", plan, "--model", vendor.model, "--json", env=env)
    try:
        # The first node's request is held by the server: the flow is live.
        if not server.wait_for_text("FIRST-NODE", timeout=30):
            proc.kill()
            _out, err = proc.communicate(timeout=10)
            raise AssertionError(f"the first request never came:\n{err}")
        [run] = runs_in_process(home)
        assert run["status"] == "running"
        session_id = run["session_id"]
        sent = run_cli(home, "ctl", "msg", session_id, "use approach B", env=env)
        assert sent.returncode == 0, sent.explain()
        control_id = sent.stdout.splitlines()[0].strip()

        def row_of() -> dict[str, Any] | None:
            code, text = cli_in_process(home, "ctl", "status", session_id, "--json")
            assert code == 0, text
            rows: dict[str, dict[str, Any]] = {c["id"]: c for c in json.loads(text)["controls"]}
            return rows.get(control_id)

        # Queued by the flow; ``applied`` only once a request carries it (decision 36).
        def queued() -> dict[str, Any] | None:
            row = row_of()
            return row if row is not None and str(row["result"]).startswith("applying:") else None

        row = wait_for(queued, timeout=15, what="the steer to be queued")
        assert row["verb"] == "message" and row["applied_at"] is None
        assert len(server.requests) == 1  # nothing else was sent while the reply was held
        release.set()
        result = finish(proc, timeout=60)
    finally:
        release.set()
        stop(proc)
    assert result.returncode == 0, result.explain()
    row = row_of()
    assert row is not None and row["result"] == "applied" and row["applied_at"] is not None
    assert node_status(result.json) == {
        "first": "completed",
        "second": "completed",
        "third": "completed",
    }
    assert len(server.requests) == 3
    bodies = [r.body for r in server.requests]
    assert server.matching("FIRST-NODE") == [0]
    assert server.matching("SECOND-NODE") == [1]
    # The very next request carries the block, before the original instruction ...
    nxt = server.user_text(bodies[1])
    assert nxt.startswith("[OPERATOR STEER]\n"), nxt
    block, closed, rest = nxt.partition("[/OPERATOR STEER]")
    assert closed and len(_STEER_LINE.findall(block)) == 1, nxt
    assert rest.strip().startswith("Choose an approach SECOND-NODE")
    assert "facts F-1" in rest
    # ... and no other request carries it (before or after).
    assert server.matching("[OPERATOR STEER]") == [1]
    assert server.matching("use approach B") == [1]


# ------------------------------------------------------------------------ OpenAI tests


def test_full_run_against_openai_compatible_server(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    scenario_full_run(
        OPENAI,
        server,
        home,
        tmp_path,
        draft_usage={"cost": 0.25},  # a server that reports a price: it is summed too
        expected_usage={
            "input_tokens": 600,
            "output_tokens": 60,
            "cache_read_tokens": None,
            "cache_write_tokens": None,
            "cost_usd": 0.25,
            # ... and the two calls it did not price are left out, which the total says
            # (decision 249).
            "cost_partial": True,
            "unpriced_calls": 2,
        },
    )
    for recorded in server.requests:
        assert recorded.path == "/v1/chat/completions"
        assert recorded.headers["authorization"] == "Bearer sk-e2e"
        assert "response_format" not in recorded.body  # only planning asks for JSON mode


def test_flow_prompt_plans_with_the_model(home: Path, server: FakeLLMServer) -> None:
    _out, planning = scenario_planned_by_model(OPENAI, server, home)
    assert planning["response_format"] == {"type": "json_object"}


def test_spawn_request_in_reply_runs_the_spawned_node(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    scenario_spawn(OPENAI, server, home, tmp_path)


def test_429_then_200_is_retried(home: Path, tmp_path: Path, server: FakeLLMServer) -> None:
    scenario_retry_429(OPENAI, server, home, tmp_path)


def test_stream_cut_mid_way_is_retried_without_a_partial_response(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    scenario_stream_cut_is_retried(OPENAI, server, home, tmp_path)


def test_server_error_fails_only_that_node(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    scenario_server_error_fails_only_that_node(OPENAI, server, home, tmp_path)


def test_invalid_plan_is_retried_with_feedback_then_refused(
    home: Path, server: FakeLLMServer
) -> None:
    scenario_invalid_plan_refused(OPENAI, server, home)


def test_operator_steer_reaches_the_next_request(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    scenario_steer_reaches_next_request(OPENAI, server, home, tmp_path)


def test_unreadable_plan_reply_is_retried_once(home: Path, server: FakeLLMServer) -> None:
    plan = {"plan": [{"agent_id": "only", "instruction": "Do ONLY-STEP"}]}
    server.route(
        "JSON Schema", Reply(text="Sure! Here is my plan: step one."), Reply(text=json.dumps(plan))
    )
    result = OPENAI.flow(server, home, "Plan something")
    assert result.returncode == 0, result.explain()
    assert node_status(result.json) == {"only": "completed"}
    assert server.matching("JSON Schema") == [0, 1]
    retry = server.user_text(server.requests[1].body)
    assert "Your previous plan was rejected: your reply could not be read as a plan" in retry
    assert server.user_text(only(server, "ONLY-STEP")) == "Do ONLY-STEP"


def test_missing_credentials_is_a_usage_error(home: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in child_env().items() if k not in _VENDOR_ENV}
    result = run_cli(
        home, "flow", "--plan", three_node_plan(tmp_path / "p.yaml"), "--model", OPENAI.model,
        "--json", env=env,
    )  # fmt: skip
    assert result.returncode == 2, result.explain()
    assert "OPENAI_API_KEY" in result.json["error"]["message"]
    assert not (home / "runs").exists() or not os.listdir(home / "runs")
