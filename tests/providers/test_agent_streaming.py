"""Agent workers' live output (issue 31): a fake ``claude`` printing stream-json, a fake
``codex`` printing its JSON events, each line rendered readably as it arrives."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path

from llm_fakes import FakeAgent

from steerflow.providers._base import ProviderRequest
from steerflow.providers.agent_cli import ClaudeCodeProvider, CodexProvider

CLAUDE_EVENTS = [
    {"type": "system", "subtype": "init", "session_id": "sess-1", "model": "m"},
    {"type": "assistant", "message": {"content": [{"type": "text", "text": "Looking."}]}},
    {
        "type": "assistant",
        "message": {
            "content": [
                {"type": "tool_use", "name": "Bash", "input": {"command": "ls -la"}},
                {"type": "tool_use", "name": "Edit", "input": {"file_path": "src/app.py"}},
            ]
        },
    },
    {
        "type": "user",
        "message": {
            "content": [{"type": "tool_result", "content": "total 8\nfoo", "is_error": False}]
        },
    },
    {
        "type": "result",
        "subtype": "success",
        "result": "All done.",
        "session_id": "sess-1",
        "total_cost_usd": 0.25,
        "usage": {"input_tokens": 10, "output_tokens": 3},
    },
]


async def test_claude_stream_json_is_rendered_line_by_line_and_the_result_recorded(
    fake_claude: FakeAgent, make_request: Callable[..., ProviderRequest], tmp_path: Path
) -> None:
    release = tmp_path / "release"
    fake_claude.configure(
        lines=[json.dumps(e) for e in CLAUDE_EVENTS], hold_file=str(release), hold_after=2
    )
    seen: list[str] = []
    two = threading.Event()

    def sink(text: str) -> None:
        seen.append(text)
        if len(seen) >= 2:
            two.set()

    provider = ClaudeCodeProvider("sonnet")
    task = asyncio.create_task(provider.invoke(make_request(live=sink)))
    # The first two events arrive while the worker is still held: live, not at the end.
    assert await asyncio.to_thread(two.wait, 30)
    assert not task.done()
    assert seen == ["[claude session sess-1]\n", "Looking.\n"]
    release.touch()
    response = await asyncio.wait_for(task, 30)
    assert response.text == "All done."
    assert response.usage is not None and response.usage.cost_usd == 0.25
    assert response.conversation == "sess-1"
    live = "".join(seen)
    assert "$ ls -la\n" in live and "✎ edited src/app.py\n" in live
    assert "  ↳ total 8\n" in live and "[done: success, $0.2500]\n" in live
    assert "{" not in live  # no raw JSON reaches the view
    argv = fake_claude.runs()[0]["argv"]
    assert argv[argv.index("--output-format") + 1] == "stream-json" and "--verbose" in argv


async def test_claude_without_a_sink_keeps_the_json_output_format(
    fake_claude: FakeAgent, make_request: Callable[..., ProviderRequest]
) -> None:
    fake_claude.configure(stdout=json.dumps(CLAUDE_EVENTS[-1]))
    response = await ClaudeCodeProvider("sonnet").invoke(make_request())
    assert response.text == "All done."
    argv = fake_claude.runs()[0]["argv"]
    assert argv[argv.index("--output-format") + 1] == "json"


async def test_codex_events_are_rendered_readably(
    fake_codex: FakeAgent, make_request: Callable[..., ProviderRequest]
) -> None:
    events = [
        {"type": "item.started", "item": {"type": "command_execution", "command": "pytest -q"}},
        {"type": "item.completed", "item": {"type": "command_execution", "exit_code": 0}},
        {
            "type": "item.completed",
            "item": {"type": "file_change", "changes": [{"path": "a.py", "kind": "update"}]},
        },
        {"type": "item.completed", "item": {"type": "agent_message", "text": "Fixed."}},
        {"type": "turn.completed", "usage": {"input_tokens": 4, "output_tokens": 2}},
    ]
    fake_codex.configure(lines=[json.dumps(e) for e in events])
    seen: list[str] = []
    response = await CodexProvider("gpt-5").invoke(make_request(live=seen.append))
    assert response.text == "Fixed."
    assert "".join(seen) == "$ pytest -q\n  ↳ exit 0\n✎ update a.py\nFixed.\n"


def test_unknown_or_odd_events_render_as_nothing_and_long_values_are_cut() -> None:
    from steerflow.providers._agent_events import render_claude_event, render_codex_event

    assert render_claude_event({"type": "stream_event", "event": {}}) == ""
    assert render_claude_event({"type": "assistant", "message": "not a mapping"}) == ""
    assert render_codex_event({"type": "thread.started", "thread_id": "t"}) == ""
    assert render_codex_event({"type": "item.started", "item": {"type": "agent_message"}}) == ""
    line = render_claude_event(
        {
            "type": "assistant",
            "message": {
                "content": [{"type": "tool_use", "name": "Bash", "input": {"command": "x" * 500}}]
            },
        }
    )
    assert line.startswith("$ x") and len(line) <= 205 and line.endswith("…\n")
    failed = render_claude_event(
        {
            "type": "user",
            "message": {
                "content": [{"type": "tool_result", "content": "boom\nmore", "is_error": True}]
            },
        }
    )
    assert failed == "  ↳ error: boom\n"
    assert (
        render_codex_event({"type": "turn.failed", "error": {"message": "quota"}})
        == "[error: quota]\n"
    )
