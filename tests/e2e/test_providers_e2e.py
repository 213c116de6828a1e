"""End to end: ``steerflow flow --model openai/...`` against a loopback server.

The CLI runs as a subprocess with ``OPENAI_BASE_URL`` pointing at the fake
OpenAI-compatible server of the provider tests (``tests/providers/llm_fakes.py``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from flow_support import child_env, node_status, run_cli, write_yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
from llm_fakes import FakeLLMServer, Reply

MODEL = "openai/test-model"


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


def _env(server: FakeLLMServer) -> dict[str, str]:
    return child_env(
        OPENAI_BASE_URL=server.base_url,
        OPENAI_API_KEY="sk-e2e",
        STEERFLOW_PROVIDER_MAX_ATTEMPTS="2",
        STEERFLOW_PROVIDER_BACKOFF_S="0.01",
        STEERFLOW_PROVIDER_MAX_BACKOFF_S="0.05",
    )


def _plan(path: Path) -> Path:
    return write_yaml(
        path,
        {
            "name": "providers-e2e",
            "plan": [
                {"agent_id": "research", "assignee": "r", "instruction": "Research topic ALPHA"},
                {
                    "agent_id": "draft",
                    "assignee": "w",
                    "instruction": "Draft from research BETA",
                    "depends_on": ["research"],
                },
                {"agent_id": "side", "assignee": "r", "instruction": "Side task GAMMA"},
            ],
        },
    )


def _user_turns(server: FakeLLMServer) -> list[str]:
    return [body["messages"][-1]["content"] for body in server.bodies()]


def test_full_run_against_openai_compatible_server(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    server.route("ALPHA", Reply(text="research notes"))
    server.route("BETA", Reply(text="the draft"))
    server.route("GAMMA", Reply(text="side result"))
    result = run_cli(
        home, "flow", "--plan", _plan(tmp_path / "p.yaml"), "--model", MODEL, "--json",
        env=_env(server),
    )  # fmt: skip
    assert result.returncode == 0, result.explain()
    out = result.json
    assert out["status"] == "completed"
    assert node_status(out) == {"research": "completed", "draft": "completed", "side": "completed"}
    turns = _user_turns(server)
    assert len(turns) == 3
    assert all(body["model"] == "test-model" for body in server.bodies())
    draft = next(t for t in turns if "BETA" in t)
    assert "research notes" in draft  # the dependency's result reached the dependent


def test_server_error_fails_only_that_node(
    home: Path, tmp_path: Path, server: FakeLLMServer
) -> None:
    server.route("GAMMA", Reply(status=500))
    result = run_cli(
        home, "flow", "--plan", _plan(tmp_path / "p.yaml"), "--model", MODEL, "--json",
        env=_env(server),
    )  # fmt: skip
    assert result.returncode == 1, result.explain()
    out = result.json
    assert out["exit_code"] == 1
    assert node_status(out) == {"research": "completed", "draft": "completed", "side": "failed"}
    side = next(n for n in out["nodes"] if n["id"] == "side")
    assert "HTTP 500" in side["error"]
    assert sum("GAMMA" in t for t in _user_turns(server)) == 2  # STEERFLOW_PROVIDER_MAX_ATTEMPTS


def test_flow_prompt_plans_with_the_model(home: Path, server: FakeLLMServer) -> None:
    plan = {
        "name": "from-model",
        "plan": [
            {"agent_id": "scope", "assignee": "planner", "instruction": "Scope it"},
            {
                "agent_id": "build",
                "assignee": "coder",
                "instruction": "Build it",
                "depends_on": ["scope"],
            },
        ],
    }
    server.route("JSON Schema", Reply(text=json.dumps(plan)))
    result = run_cli(
        home, "flow", "Make a tiny CLI tool", "--model", MODEL, "--json", env=_env(server)
    )
    assert result.returncode == 0, result.explain()
    assert node_status(result.json) == {"scope": "completed", "build": "completed"}
    planning = server.bodies()[0]
    assert planning["response_format"] == {"type": "json_object"}
    assert "Make a tiny CLI tool" in planning["messages"][-1]["content"]
    assert len(server.requests) == 3
