"""A model's reply is untrusted input: JSON nested past the decoder's stack in a spawn block
or a planner reply is read as "no spawn block" / "not a plan", never a RecursionError."""

from __future__ import annotations

import pytest

from steerflow.errors import ProviderError
from steerflow.providers._conventions import extract_spawns, parse_plan_reply

DEEP = "[" * 100_000 + "]" * 100_000


def test_a_spawn_block_nested_too_deeply_is_not_a_spawn_block() -> None:
    good = '```json\n{"spawn": [{"agent_id": "fix", "instruction": "x"}]}\n```'
    text = f'answer\n{good}\n```json\n{{"spawn": {DEEP}}}\n```\n'
    rest, spawns = extract_spawns(text)
    assert spawns == [{"agent_id": "fix", "instruction": "x"}]
    assert DEEP in rest


def test_a_planner_reply_nested_too_deeply_is_not_a_json_object() -> None:
    with pytest.raises(ProviderError, match=r"^m: planner reply is not a JSON object"):
        parse_plan_reply('{"plan": ' + DEEP + "}", "m")
