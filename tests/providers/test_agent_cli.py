"""``claude-code/MODEL`` and ``codex/MODEL`` against fake agent executables."""

from __future__ import annotations

import asyncio
import json
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from llm_fakes import FakeAgent, wait_gone, write_fake_agent

from steerflow.errors import ProviderError, UsageError
from steerflow.plan._model import PlanFile
from steerflow.providers._base import Message, PlanRequest, ProviderRequest
from steerflow.providers._registry import make_provider
from steerflow.providers._remote import SPAWN_GUIDANCE
from steerflow.providers.agent_cli import ClaudeCodeProvider, CodexProvider, list_artifacts
from waiting import wait_until_async

CLAUDE_RESULT = {
    "type": "result",
    "subtype": "success",
    "is_error": False,
    "result": "All done.",
    "total_cost_usd": 0.0421,
    "usage": {"input_tokens": 5, "cache_read_input_tokens": 100, "output_tokens": 9},
}

CODEX_EVENTS = [
    {"type": "thread.started", "thread_id": "t1"},
    {"type": "item.completed", "item": {"type": "agent_message", "text": "from events"}},
    {
        "type": "turn.completed",
        "usage": {"input_tokens": 40, "cached_input_tokens": 10, "output_tokens": 6},
    },
]


def _jsonl(events: list[dict[str, object]]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


async def test_claude_runs_in_the_artifact_dir_with_json_output(
    fake_claude: FakeAgent, make_request: Callable[..., ProviderRequest]
) -> None:
    fake_claude.configure(stdout=json.dumps(CLAUDE_RESULT), artifacts={"out/report.md": "hi"})
    provider = make_provider("claude-code/sonnet")
    assert isinstance(provider, ClaudeCodeProvider)
    request = make_request()
    response = await provider.invoke(request)

    [run] = fake_claude.runs()
    argv = run["argv"][1:]
    assert argv[0] == "-p"
    assert argv[argv.index("--output-format") + 1] == "json"
    assert argv[argv.index("--model") + 1] == "sonnet"
    assert argv[argv.index("--append-system-prompt") + 1] == "You are a careful coder."
    assert run["stdin"] == "Write the patch for issue 42."
    assert Path(run["cwd"]) == request.artifact_dir
    assert stat.S_IMODE(request.artifact_dir.stat().st_mode) == 0o700

    assert response.text == "All done."
    assert response.artifacts == ["out/report.md"]
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (105, 9)
    assert response.usage.cost_usd == pytest.approx(0.0421)


async def test_claude_is_found_on_path_by_default(
    fake_bin: Path, make_request: Callable[..., ProviderRequest], monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = write_fake_agent(fake_bin, "claude")
    agent.configure(stdout="plain text answer\n")
    monkeypatch.setenv("PATH", f"{fake_bin}:/usr/bin:/bin")
    provider = ClaudeCodeProvider("opus")
    response = await provider.invoke(make_request())
    assert response.text == "plain text answer"
    assert len(agent.runs()) == 1


def test_missing_executable_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UsageError, match="STEERFLOW_CODEX_BIN"):
        make_provider("codex/gpt-test")


async def test_claude_error_result_is_a_provider_error(
    fake_claude: FakeAgent, make_request: Callable[..., ProviderRequest]
) -> None:
    fake_claude.configure(stdout=json.dumps({**CLAUDE_RESULT, "is_error": True, "result": "nope"}))
    with pytest.raises(ProviderError, match="nope"):
        await ClaudeCodeProvider("sonnet").invoke(make_request())


async def test_non_zero_exit_reports_code_and_stderr_tail(
    fake_claude: FakeAgent, make_request: Callable[..., ProviderRequest]
) -> None:
    fake_claude.configure(stderr="x" * 5000 + "rate limited, try later", exit=3)
    with pytest.raises(ProviderError) as caught:
        await ClaudeCodeProvider("sonnet").invoke(make_request())
    message = str(caught.value)
    assert "exited with code 3" in message
    assert message.endswith("rate limited, try later")
    assert len(message) < 2200


async def test_codex_reads_prompt_from_stdin_and_reports_usage(
    fake_codex: FakeAgent, make_request: Callable[..., ProviderRequest]
) -> None:
    fake_codex.configure(
        stdout=_jsonl(CODEX_EVENTS), last_message="final answer", artifacts={"patch.diff": "+1"}
    )
    provider = make_provider("codex/gpt-test")
    assert isinstance(provider, CodexProvider)
    history = (
        Message(role="system", content="Be brief."),
        Message(role="user", content="earlier"),
        Message(role="assistant", content="reply"),
    )
    request = make_request(history=history)
    response = await provider.invoke(request)

    [run] = fake_codex.runs()
    argv = run["argv"][1:]
    assert argv[0] == "exec"
    assert argv[argv.index("--model") + 1] == "gpt-test"
    assert argv[-1] == "-"
    assert "--skip-git-repo-check" in argv
    assert run["stdin"].startswith("Be brief.")
    assert "[assistant]\nreply" in run["stdin"]
    assert run["stdin"].endswith("[user]\nWrite the patch for issue 42.")
    assert Path(run["cwd"]) == request.artifact_dir

    assert response.text == "final answer"
    assert response.artifacts == ["patch.diff"]
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (40, 6)
    assert response.usage.cost_usd is None


async def test_codex_falls_back_to_the_last_agent_message(
    fake_codex: FakeAgent, make_request: Callable[..., ProviderRequest]
) -> None:
    fake_codex.configure(stdout=_jsonl(CODEX_EVENTS))
    response = await CodexProvider("gpt-test").invoke(make_request())
    assert response.text == "from events"


async def test_extra_args_are_appended(
    fake_codex: FakeAgent,
    make_request: Callable[..., ProviderRequest],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STEERFLOW_CODEX_ARGS", "--profile 'my profile'")
    fake_codex.configure(last_message="ok")
    await CodexProvider("gpt-test").invoke(make_request())
    argv = fake_codex.runs()[0]["argv"]
    assert argv[-3:] == ["--profile", "my profile", "-"]


async def test_spawn_block_in_agent_reply(
    fake_claude: FakeAgent, make_request: Callable[..., ProviderRequest]
) -> None:
    text = 'Done.\n```json\n{"spawn": [{"agent_id": "fix-1", "instruction": "fix"}]}\n```'
    fake_claude.configure(stdout=json.dumps({**CLAUDE_RESULT, "result": text}))
    response = await ClaudeCodeProvider("sonnet").invoke(make_request(allow_spawn=True))
    assert response.spawns == [{"agent_id": "fix-1", "instruction": "fix"}]
    assert response.text == "Done."
    argv = fake_claude.runs()[0]["argv"]
    assert SPAWN_GUIDANCE in argv[argv.index("--append-system-prompt") + 1]


async def test_plan_through_an_agent(fake_claude: FakeAgent) -> None:
    plan = {"plan": [{"agent_id": "a", "instruction": "do"}]}
    fake_claude.configure(stdout=json.dumps({**CLAUDE_RESULT, "result": json.dumps(plan)}))
    request = PlanRequest(prompt="Ship it", schema=PlanFile.model_json_schema(), max_entries=3)
    assert await ClaudeCodeProvider("sonnet").plan(request) == plan
    run = fake_claude.runs()[0]
    assert run["stdin"] == "Ship it"
    assert "JSON Schema" in run["argv"][run["argv"].index("--append-system-prompt") + 1]


#: Per-call timeout of the timeout tests. It includes the fake worker's interpreter start-up
#: (tens of ms idle, a few hundred with the cores busy), which must be over before the
#: worker records itself (and, with ``ignore_term``, ignores SIGTERM) for the test to mean
#: anything; the tests check that it was.
WORKER_TIMEOUT_S = 2.0
#: Generous bound on timeout + grace + stopping the worker.
STOP_BOUND_S = 10.0


async def recorded_run(agent: FakeAgent, call: asyncio.Future[Any]) -> dict[str, Any]:
    """The one run the fake recorded for ``call`` (which may still be waiting for it)."""
    try:
        await wait_until_async(
            lambda: agent.runs() or call.done(), timeout=STOP_BOUND_S, what="the fake to start"
        )
        runs = agent.runs()
        assert runs, f"the call ended before the fake worker recorded itself: {call!r}"
    except AssertionError:
        call.cancel()  # cancelling the call stops its worker
        await asyncio.gather(call, return_exceptions=True)
        raise
    [run] = runs
    return run


async def test_timeout_terminates_the_worker(
    fake_claude: FakeAgent, make_request: Callable[..., ProviderRequest]
) -> None:
    fake_claude.configure(hang=True)
    started = time.monotonic()
    call = asyncio.ensure_future(
        ClaudeCodeProvider("sonnet").invoke(make_request(timeout_s=WORKER_TIMEOUT_S))
    )
    run = await recorded_run(fake_claude, call)  # it was running (hung) when timed out
    with pytest.raises(ProviderError, match="timeout") as caught:
        await asyncio.wait_for(call, STOP_BOUND_S)  # bounded: a lost timeout fails, not hangs
    assert caught.value.retryable is True
    assert time.monotonic() - started < STOP_BOUND_S
    assert wait_gone(run["pid"])


async def test_sigterm_ignored_then_killed_after_grace(
    fake_claude: FakeAgent,
    make_request: Callable[..., ProviderRequest],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STEERFLOW_AGENT_KILL_GRACE_S", "0.3")
    fake_claude.configure(hang=True, ignore_term=True)
    started = time.monotonic()
    call = asyncio.ensure_future(
        ClaudeCodeProvider("sonnet").invoke(make_request(timeout_s=WORKER_TIMEOUT_S))
    )
    # The fake records itself only after it set SIGTERM to ignored, and a SIGTERM before
    # that would have killed it: a record means the SIGTERM was ignored and only the
    # SIGKILL after the grace ended the worker.
    run = await recorded_run(fake_claude, call)
    with pytest.raises(ProviderError, match="timeout"):
        await asyncio.wait_for(call, STOP_BOUND_S)  # bounded: a lost timeout fails, not hangs
    assert time.monotonic() - started < STOP_BOUND_S
    assert wait_gone(run["pid"])


async def test_cancellation_terminates_the_worker_and_its_children(
    fake_codex: FakeAgent, make_request: Callable[..., ProviderRequest]
) -> None:
    fake_codex.configure(hang=True, grandchild=True)
    task = asyncio.create_task(CodexProvider("gpt-test").invoke(make_request()))
    # the worker records itself once it runs
    await wait_until_async(fake_codex.runs, timeout=10, what="fake codex to start")
    [run] = fake_codex.runs()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert wait_gone(run["pid"])
    assert wait_gone(run["grandchild"])


def test_list_artifacts_skips_symlinks(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c.txt").write_text("c")
    (tmp_path / "top.txt").write_text("t")
    (tmp_path / "link.txt").symlink_to(tmp_path / "top.txt")
    assert list_artifacts(tmp_path) == ["a/b/c.txt", "top.txt"]
