"""End to end: ``steerflow flow --model anthropic/...`` against a loopback Messages API server.

The same scenarios as ``test_providers_e2e.py`` (which defines them), run through the
real CLI subprocess and the real ``anthropic`` SDK with
``ANTHROPIC_BASE_URL=http://127.0.0.1:PORT``; plus what is particular to the Messages
API (system prompt as a top-level field, ``max_tokens``, ``x-api-key``, cache tokens).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from flow_support import run_cli
from test_providers_e2e import (
    Vendor,
    scenario_full_run,
    scenario_invalid_plan_refused,
    scenario_planned_by_model,
    scenario_retry_429,
    scenario_server_error_fails_only_that_node,
    scenario_spawn,
    scenario_steer_reaches_next_request,
    scenario_stream_cut_is_retried,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
from llm_fakes import FakeLLMServer

ANTHROPIC = Vendor(
    "anthropic", "anthropic/test-model", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "sk-ant-e2e"
)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    fake = FakeLLMServer("anthropic").start()
    try:
        yield fake
    finally:
        fake.close()


def test_full_run_against_messages_api(home: Path, tmp_path: Path, server: FakeLLMServer) -> None:
    scenario_full_run(
        ANTHROPIC,
        server,
        home,
        tmp_path,
        # Cache writes and reads are input tokens; the Messages API reports no price.
        draft_usage={"cache_creation_input_tokens": 4, "cache_read_input_tokens": 1},
        expected_usage={
            "input_tokens": 605,
            "output_tokens": 60,
            "cache_read_tokens": 1,
            "cache_write_tokens": 4,
            "cost_usd": None,
        },
    )
    for recorded in server.requests:
        assert recorded.path == "/v1/messages"
        # The key reaches the server (SDK releases differ in the header they put it in).
        sent = {recorded.headers.get("x-api-key"), recorded.headers.get("authorization")}
        assert sent & {"sk-ant-e2e", "Bearer sk-ant-e2e"}, recorded.headers
        assert "anthropic-version" in recorded.headers
        assert recorded.body["max_tokens"] == 8192
        roles = [m["role"] for m in recorded.body["messages"]]
        assert roles == ["user"]  # no system turn among the messages: it is a top-level field


def test_flow_prompt_plans_with_the_model(home: Path, server: FakeLLMServer) -> None:
    _out, planning = scenario_planned_by_model(ANTHROPIC, server, home)
    assert "response_format" not in planning
    assert [m["role"] for m in planning["messages"]] == ["user"]


def test_spawn_request_in_reply_runs_the_spawned_node(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    scenario_spawn(ANTHROPIC, server, home, tmp_path)
    # The spawned node's conversation alternates roles, as the Messages API requires.
    child = server.requests[1].body
    assert [m["role"] for m in child["messages"]] == ["user", "assistant", "user"]


def test_429_then_200_is_retried(home: Path, tmp_path: Path, server: FakeLLMServer) -> None:
    scenario_retry_429(ANTHROPIC, server, home, tmp_path)


def test_stream_cut_mid_way_is_retried_without_a_partial_response(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    scenario_stream_cut_is_retried(ANTHROPIC, server, home, tmp_path)


def test_server_error_fails_only_that_node(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    scenario_server_error_fails_only_that_node(ANTHROPIC, server, home, tmp_path)


def test_invalid_plan_is_retried_with_feedback_then_refused(
    home: Path, server: FakeLLMServer
) -> None:
    scenario_invalid_plan_refused(ANTHROPIC, server, home)


def test_operator_steer_reaches_the_next_request(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    scenario_steer_reaches_next_request(ANTHROPIC, server, home, tmp_path)


@pytest.mark.parametrize("suffix", ["", "/v1", "/v1/"])
def test_base_url_with_or_without_v1(
    suffix: str, home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    """``ANTHROPIC_BASE_URL`` may be the root or end in ``/v1`` (the OPENAI_BASE_URL form)."""
    plan = tmp_path / "one.yaml"
    plan.write_text("plan:\n  - agent_id: only\n    instruction: say hi\n")
    env = ANTHROPIC.env(server, ANTHROPIC_BASE_URL=server.base_url + suffix)
    result = run_cli(home, "flow", "--plan", plan, "--model", ANTHROPIC.model, "--json", env=env)
    assert result.returncode == 0, result.explain()
    assert result.json["status"] == "completed"
    assert [r.path for r in server.requests] == ["/v1/messages"]
