"""Fixtures for the provider tests: loopback LLM servers, fake agent CLIs, requests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from llm_fakes import FakeAgent, FakeLLMServer, write_fake_agent

from steerflow.providers._base import Message, ProviderRequest

_PROVIDER_ENV = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_ORG_ID",
    "OPENAI_PROJECT_ID",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "STEERFLOW_PROVIDER_MAX_ATTEMPTS",
    "STEERFLOW_PROVIDER_BACKOFF_S",
    "STEERFLOW_PROVIDER_MAX_BACKOFF_S",
    "STEERFLOW_PROVIDER_TOTAL_S",
    "STEERFLOW_PROVIDER_TIMEOUT_S",
    "STEERFLOW_ANTHROPIC_MAX_TOKENS",
    "STEERFLOW_CLAUDE_BIN",
    "STEERFLOW_CODEX_BIN",
    "STEERFLOW_CLAUDE_ARGS",
    "STEERFLOW_CODEX_ARGS",
    "STEERFLOW_AGENT_TIMEOUT_S",
    "STEERFLOW_AGENT_KILL_GRACE_S",
)


@pytest.fixture(autouse=True)
def clean_provider_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No real credentials or endpoints leak in; retries are fast."""
    for name in _PROVIDER_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STEERFLOW_PROVIDER_BACKOFF_S", "0.01")
    monkeypatch.setenv("STEERFLOW_PROVIDER_MAX_BACKOFF_S", "0.05")


@pytest.fixture
def openai_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLMServer]:
    """A fake OpenAI-compatible server, with ``OPENAI_BASE_URL``/key pointing at it."""
    server = FakeLLMServer("openai").start()
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def anthropic_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLMServer]:
    """A fake Anthropic Messages server, with ``ANTHROPIC_BASE_URL``/key pointing at it."""
    server = FakeLLMServer("anthropic").start()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    """A directory for fake executables."""
    path = tmp_path / "bin"
    path.mkdir()
    return path


@pytest.fixture
def fake_claude(fake_bin: Path, monkeypatch: pytest.MonkeyPatch) -> FakeAgent:
    """A fake ``claude`` named by ``STEERFLOW_CLAUDE_BIN``."""
    agent = write_fake_agent(fake_bin, "claude")
    monkeypatch.setenv("STEERFLOW_CLAUDE_BIN", str(agent.path))
    return agent


@pytest.fixture
def fake_codex(fake_bin: Path, monkeypatch: pytest.MonkeyPatch) -> FakeAgent:
    """A fake ``codex`` named by ``STEERFLOW_CODEX_BIN``."""
    agent = write_fake_agent(fake_bin, "codex")
    monkeypatch.setenv("STEERFLOW_CODEX_BIN", str(agent.path))
    return agent


@pytest.fixture
def make_request(tmp_path: Path) -> Callable[..., ProviderRequest]:
    """Build a :class:`ProviderRequest` with test defaults; keywords override."""

    def build(**overrides: Any) -> ProviderRequest:
        fields: dict[str, Any] = {
            "run_id": "20250101T000000-abcdef",
            "node_key": "draft",
            "node_id": "0" * 32,
            "kind": "planned",
            "assignee": "coder",
            "instruction": "Write the patch for issue 42.",
            "history": (Message(role="system", content="You are a careful coder."),),
            "artifact_dir": tmp_path / "home" / "runs" / "r" / "artifacts" / "draft",
            "home": tmp_path / "home",
        }
        fields.update(overrides)
        return ProviderRequest(**fields)

    return build
