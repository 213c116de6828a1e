"""Typed outputs against the loopback OpenAI- and Anthropic-shaped servers (issue 40 item 2).

Each test runs a real flow (state DB, v3 checkpoint) whose node has an ``output_schema``,
served by ``openai/`` or ``anthropic/`` over HTTP on 127.0.0.1. The assertions read what
the server received (the structured-output request, the re-ask's messages), how many
requests it got, what the checkpoint recorded (the ``output`` member, one write-ahead
intent per call) and what ``FlowResult`` hands back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from llm_fakes import FakeLLMServer, Reply
from pydantic import BaseModel, ConfigDict

from steerflow.checkpoint import load_checkpoint
from steerflow.orchestrate import FlowOptions, FlowResult, FlowRun
from steerflow.plan import Op, Plan


class Rating(BaseModel):
    """Closed, every field required: OpenAI strict mode can take it."""

    model_config = ConfigDict(extra="forbid")
    title: str
    score: int


OPEN_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "score": {"type": "integer", "minimum": 0}},
    "required": ["title"],
}
GOOD = {"title": "déjà vu", "score": 7}


@pytest.fixture(autouse=True)
def _transports_imported() -> None:
    """Import the SDKs' HTTP transports before the loop runs.

    Their first client imports ``httpcore2``, which reads its package metadata from disk:
    done once per process, on the loop of whichever call is first, which the blocking
    detector reports against the node. Not what these tests are about.
    """
    import anthropic
    import openai

    openai.AsyncOpenAI(api_key="x", base_url="http://127.0.0.1:9")
    anthropic.AsyncAnthropic(api_key="x", base_url="http://127.0.0.1:9")


async def _run(home: Path, model: str, *ops: Op) -> FlowResult:
    run = FlowRun(FlowOptions(plan=Plan(list(ops)), model=model), home=home)
    return await run.run()


def _journal(result: FlowResult) -> list[dict[str, Any]]:
    assert result.run_dir is not None
    text = (Path(result.run_dir) / "checkpoint.json.journal").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _intents(result: FlowResult, node: str) -> list[int]:
    """The attempt numbers of ``node``'s write-ahead intents, in journal order."""
    records = _journal(result)
    return [
        r["entry"]["attempt"]
        for r in records
        if r["kind"] == "intent" and r["entry"]["node"] == node
    ]


def _entry(result: FlowResult, node: str) -> dict[str, Any]:
    assert result.run_dir is not None
    state, _ = load_checkpoint(Path(result.run_dir) / "checkpoint.json")
    entry: dict[str, Any] = state["ops"][node]
    return entry


# ----------------------------------------------------------------------------- OpenAI


async def test_openai_valid_first_time(tmp_path: Path, openai_server: FakeLLMServer) -> None:
    openai_server.push(Reply(text=json.dumps(GOOD)))
    result = await _run(
        tmp_path / "h", "openai/test-model", Op("rate", "Rate it", output_schema=Rating)
    )
    assert result.status == "completed"
    (body,) = openai_server.bodies()
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == "Rating" and fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["schema"] == Rating.model_json_schema()
    assert "stream" not in body  # a structured reply is asked whole
    rating = result.output("rate")  # the Op's class is the default
    assert rating == Rating(title="déjà vu", score=7)
    assert result.output("rate", dict) == GOOD
    assert json.loads(str(result.response("rate"))) == GOOD
    assert _entry(result, "rate")["output"] == GOOD
    assert _intents(result, "rate") == [1]


async def test_openai_open_schema_is_asked_non_strict(
    tmp_path: Path, openai_server: FakeLLMServer
) -> None:
    openai_server.push(Reply(text=json.dumps(GOOD)))
    result = await _run(
        tmp_path / "h", "openai/m", Op("rate", "Rate it", output_schema=OPEN_SCHEMA)
    )
    assert result.status == "completed"
    (body,) = openai_server.bodies()
    assert "strict" not in body["response_format"]["json_schema"]
    assert body["response_format"]["json_schema"]["name"] == "output"


async def test_openai_invalid_then_valid_asks_again_with_the_error(
    tmp_path: Path, openai_server: FakeLLMServer
) -> None:
    bad = json.dumps({"title": "x", "score": -3})
    openai_server.push(Reply(text=bad), Reply(text=json.dumps(GOOD), input_tokens=20))
    result = await _run(
        tmp_path / "h", "openai/m", Op("rate", "Rate it", output_schema=OPEN_SCHEMA)
    )
    assert result.status == "completed"
    first, second = openai_server.bodies()
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][0] == first["messages"][-1]
    assert second["messages"][1]["content"] == bad
    feedback = second["messages"][2]["content"]
    assert "does not match the required JSON Schema" in feedback
    assert "$.score" in feedback and "minimum" in feedback
    assert second["response_format"] == first["response_format"]
    assert result.output("rate") == GOOD
    assert _entry(result, "rate")["output"] == GOOD
    # two paid calls: two intents, and the node's usage is both replies'
    assert _intents(result, "rate") == [1, 2]
    usage = result.outcomes["rate"].usage
    assert usage is not None and usage["input_tokens"] == 11 + 20
    assert usage["output_tokens"] == 7 + 7


async def test_openai_not_json_past_the_retries_fails_the_node(
    tmp_path: Path, openai_server: FakeLLMServer
) -> None:
    openai_server.forever(Reply(text="Sure! Here it is: title=x"))
    op = Op("rate", "Rate it", output_schema=OPEN_SCHEMA, retry={"attempts": 2})
    result = await _run(tmp_path / "h", "openai/m", op, Op("after", "next", depends_on=["rate"]))
    assert result.status == "failed"
    assert len(openai_server.requests) == 3  # 1 + attempts
    outcome = result.outcomes["rate"]
    assert outcome.status == "failed" and outcome.output is None
    assert outcome.error is not None
    assert "does not match its output_schema after 3 calls" in outcome.error
    assert "the reply is not JSON" in outcome.error
    assert result.outcomes["after"].status == "skipped"
    assert _intents(result, "rate") == [1, 2, 3]
    assert outcome.usage is not None and outcome.usage["input_tokens"] == 33
    assert "output" not in _entry(result, "rate")


async def test_a_non_object_schema_is_sent_wrapped_and_unwrapped(
    tmp_path: Path, openai_server: FakeLLMServer
) -> None:
    schema = {"type": "array", "items": {"type": "integer"}}
    openai_server.push(Reply(text=json.dumps({"value": [3, 1, 2]})))
    result = await _run(tmp_path / "h", "openai/m", Op("nums", "Numbers", output_schema=schema))
    assert result.status == "completed"
    (body,) = openai_server.bodies()
    sent = body["response_format"]["json_schema"]
    assert sent["schema"]["properties"]["value"] == schema and sent["strict"] is True
    assert result.output("nums") == [3, 1, 2]
    assert result.response("nums") == "[3,1,2]"


# -------------------------------------------------------------------------- Anthropic


def _tool_use(value: object, *, name: str = "Rating", text: str = "") -> Reply:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content.append({"type": "tool_use", "id": "toolu_1", "name": name, "input": value})
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "test-model",
        "content": content,
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 30, "output_tokens": 5},
    }
    return Reply(body=body)


async def test_anthropic_valid_first_time_is_a_forced_tool(
    tmp_path: Path, anthropic_server: FakeLLMServer
) -> None:
    anthropic_server.push(_tool_use(GOOD))
    op = Op("rate", "Rate it", output_schema=Rating)
    result = await _run(tmp_path / "h", "anthropic/test-model", op)
    assert result.status == "completed"
    (body,) = anthropic_server.bodies()
    assert body["tools"] == [
        {
            "name": "Rating",
            "description": "Give your answer as this tool's input.",
            "input_schema": Rating.model_json_schema(),
        }
    ]
    assert body["tool_choice"] == {"type": "tool", "name": "Rating"}
    assert result.output("rate") == Rating(title="déjà vu", score=7)
    assert _entry(result, "rate")["output"] == GOOD
    assert _intents(result, "rate") == [1]


async def test_anthropic_invalid_then_valid(
    tmp_path: Path, anthropic_server: FakeLLMServer
) -> None:
    anthropic_server.push(_tool_use({"title": "x"}), _tool_use(GOOD))
    op = Op("rate", "Rate it", output_schema=Rating)
    result = await _run(tmp_path / "h", "anthropic/test-model", op)
    assert result.status == "completed"
    assert len(anthropic_server.requests) == 2
    second = anthropic_server.bodies()[1]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert json.loads(second["messages"][1]["content"]) == {"title": "x"}
    assert "'score' is a required property" in second["messages"][2]["content"]
    assert second["tool_choice"] == {"type": "tool", "name": "Rating"}
    assert result.output("rate") == Rating(title="déjà vu", score=7)
    assert _entry(result, "rate")["output"] == GOOD
    assert _intents(result, "rate") == [1, 2]
    assert result.outcomes["rate"].usage is not None
    assert result.outcomes["rate"].usage["input_tokens"] == 60


async def test_anthropic_invalid_past_the_default_retry(
    tmp_path: Path, anthropic_server: FakeLLMServer
) -> None:
    anthropic_server.forever(_tool_use({"title": 5, "score": 1}))
    op = Op("rate", "Rate it", output_schema=Rating)  # no retry: one re-ask (decision 284)
    result = await _run(tmp_path / "h", "anthropic/test-model", op)
    assert result.status == "failed"
    assert len(anthropic_server.requests) == 2
    error = result.outcomes["rate"].error
    assert error is not None and "after 2 calls" in error
    assert "$.title" in error and "is not of type 'string'" in error
    assert _intents(result, "rate") == [1, 2]
