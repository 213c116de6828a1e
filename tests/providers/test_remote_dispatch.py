"""Vendor dispatch, the missing-SDK message, and the shared spawn/plan conventions."""

from __future__ import annotations

import sys

import pytest

from steerflow.errors import ProviderError, UsageError
from steerflow.providers._base import Message
from steerflow.providers._registry import make_provider
from steerflow.providers._remote import (
    extract_spawns,
    make_remote_provider,
    missing_sdk_error,
    parse_plan_reply,
    split_history,
)


@pytest.mark.parametrize("package", ["openai", "anthropic"])
def test_missing_sdk_message_names_the_extra(package: str) -> None:
    error = missing_sdk_error(f"{package}/some-model", package)
    assert isinstance(error, UsageError)
    assert f"pip install 'steerflow[{package}]'" in str(error)
    assert f"{package}/some-model" in str(error)


@pytest.mark.parametrize(
    ("package", "module"),
    [("openai", "steerflow.providers.openai"), ("anthropic", "steerflow.providers.anthropic")],
)
def test_missing_sdk_is_reported_by_dispatch(
    package: str, module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # makes `import <package>` fail
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(UsageError, match=rf"steerflow\[{package}\]"):
        make_remote_provider(package, "m", f"{package}/m")


def test_unknown_vendor_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown provider 'mistral'"):
        make_provider("mistral/large")


def test_split_history() -> None:
    system, turns = split_history(
        (
            Message(role="system", content="a"),
            Message(role="user", content="u"),
            Message(role="system", content="b"),
        )
    )
    assert system == "a\n\nb"
    assert [t.content for t in turns] == ["u"]
    assert split_history(()) == (None, [])


def test_extract_spawns_takes_the_last_spawn_block() -> None:
    text = (
        'Intro\n```json\n{"other": 1}\n```\nMiddle\n'
        '```json\n{"spawn": [{"agent_id": "a", "instruction": "b"}]}\n```\nTail'
    )
    rest, spawns = extract_spawns(text)
    assert spawns == [{"agent_id": "a", "instruction": "b"}]
    assert rest == 'Intro\n```json\n{"other": 1}\n```\nMiddle\n\nTail'


def test_extract_spawns_passes_odd_items_through_for_the_executor() -> None:
    assert extract_spawns('```\n{"spawn": {"agent_id": "x"}}\n```')[1] == [{"agent_id": "x"}]
    assert extract_spawns('```json\n{"spawn": [null, 3]}\n```')[1] == [None, 3]
    assert extract_spawns('```json\n{"spawn": [}\n```') == ('```json\n{"spawn": [}\n```', [])
    assert extract_spawns("no block at all") == ("no block at all", [])


@pytest.mark.parametrize(
    "reply",
    [
        '{"plan": []}',
        '```json\n{"plan": []}\n```',
        'Here you go:\n{"plan": []}\nThanks.',
        "[]",
    ],
)
def test_parse_plan_reply_accepts_common_shapes(reply: str) -> None:
    assert parse_plan_reply(reply, "m") == {"plan": []}


@pytest.mark.parametrize("reply", ["", "no json here", '"just a string"', "{broken"])
def test_parse_plan_reply_rejects_non_objects(reply: str) -> None:
    with pytest.raises(ProviderError, match=r"^m: planner reply is not a JSON object"):
        parse_plan_reply(reply, "m")
