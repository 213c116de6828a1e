"""What an agent turn or an escalation retry *is* is covered by its ``result_digest``.

Known answers, pinned by hand as for ``spawned_ids`` (``test_spawned_ids.py``): a turn entry
(``turn``, ``controls``, ``next``, ``conversation``; its label ``agent_id`` and its
``instruction``) and a retry entry (``escalation``; its ``escalated_from``, ``parent_id``,
``spawn_id``, ``model`` and ``instruction``) are digested over exactly those members, while
entries written before the markers existed keep the digests they were written with: a turn
entry without ``turn`` is digested over its response alone, a retry without ``escalation``
over its response (and ``artifacts``) alone, whatever identity members it carries.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from steerflow.checkpoint import _digest, entry_digest, result_digest

TURN: dict[str, Any] = {
    "agent_id": "turn-2",
    "status": "completed",
    "response": "done",
    "turn": 2,
    "controls": ["c1"],
    "instruction": "go",
    "conversation": "sess-A",
    "next": {"turn": 3, "instruction": "again", "controls": ["c2"]},
    "result_digest": "ignored: never part of what it digests",
}
TURN_BYTES = (
    b'{"agent_id":"turn-2","controls":["c1"],"conversation":"sess-A","instruction":"go",'
    b'"next":{"controls":["c2"],"instruction":"again","turn":3},"response":"done","turn":2}'
)
TURN_DIGEST = "blake2b:9d3bb98bd8102fea002107f4a1d544332a696e6ec6785db75036074c1a92a23c"

RETRY: dict[str, Any] = {
    "node_id": "n9",
    "status": "failed",
    "response": {"error": "boom"},
    "operation": "w",
    "assignee": "worker",
    "instruction": "w",
    "parent_id": "p1",
    "spawn_id": "a.esc1",
    "context": None,
    "depends_on": ["a"],
    "escalated_from": "p1",
    "model": "echo",
    "escalation": 1,
}
RETRY_BYTES = (
    b'{"escalated_from":"p1","escalation":1,"instruction":"w","model":"echo",'
    b'"parent_id":"p1","response":{"error":"boom"},"spawn_id":"a.esc1"}'
)
RETRY_DIGEST = "blake2b:69e2aed3dd62911f92ee5004468f00272458274885cdf83eec56b6a2ff062720"


def test_a_turn_entry_is_digested_over_its_identity() -> None:
    assert hashlib.blake2b(TURN_BYTES, digest_size=32).hexdigest() == TURN_DIGEST[8:]
    assert entry_digest(TURN) == TURN_DIGEST


def test_a_retry_entry_is_digested_over_its_identity() -> None:
    assert hashlib.blake2b(RETRY_BYTES, digest_size=32).hexdigest() == RETRY_DIGEST[8:]
    assert entry_digest(RETRY) == RETRY_DIGEST


@pytest.mark.parametrize(
    "change",
    [
        {"agent_id": "turn-1"},  # swapped label
        {"turn": 1},  # swapped index
        {"controls": []},
        {"controls": ["c1", "c9"]},
        {"instruction": "something else"},
        {"conversation": "sess-B"},
        {"next": {"turn": 3, "instruction": "again", "controls": []}},
        {"response": "DONE"},
    ],
)
def test_changing_what_a_turn_is_breaks_its_digest(change: dict[str, Any]) -> None:
    assert entry_digest({**TURN, **change}) != TURN_DIGEST


@pytest.mark.parametrize(
    "member", ["turn", "controls", "next", "conversation", "instruction", "agent_id"]
)
def test_dropping_a_member_of_a_turn_breaks_its_digest(member: str) -> None:
    assert entry_digest({k: v for k, v in TURN.items() if k != member}) != TURN_DIGEST


@pytest.mark.parametrize(
    "change",
    [
        {"escalation": 2},  # the attempt number
        {"escalated_from": "p2"},
        {"parent_id": "p2"},
        {"spawn_id": "a.esc2"},
        {"model": "other"},
        {"instruction": "x"},
    ],
)
def test_changing_what_a_retry_is_breaks_its_digest(change: dict[str, Any]) -> None:
    assert entry_digest({**RETRY, **change}) != RETRY_DIGEST


@pytest.mark.parametrize("member", ["escalated_from", "escalation", "parent_id", "model"])
def test_dropping_a_member_of_a_retry_breaks_its_digest(member: str) -> None:
    assert entry_digest({k: v for k, v in RETRY.items() if k != member}) != RETRY_DIGEST


def test_members_that_do_not_decide_identity_stay_outside() -> None:
    # The node id, assignee, operation text, dependencies and status of a retry are
    # checked by the resume rules, not by its digest (as before the markers).
    for change in ({"node_id": "n8"}, {"assignee": "x"}, {"depends_on": []}, {"status": "x"}):
        assert entry_digest({**RETRY, **change}) == RETRY_DIGEST, change


def test_entries_from_before_the_markers_keep_their_digests() -> None:
    old_turn = {"agent_id": "turn-1", "status": "completed", "response": "notes"}
    assert entry_digest(old_turn) == result_digest("notes")
    old_retry = {k: v for k, v in RETRY.items() if k != "escalation"}
    assert entry_digest(old_retry) == result_digest({"error": "boom"})
    # Another covered member alone does not make the identity covered.
    found = [{"path": "a.txt", "bytes": 1, "digest": "blake2b:" + "0" * 64}]
    witnessed = {**old_retry, "status": "completed", "response": "R", "artifacts": found}
    assert entry_digest(witnessed) == result_digest({"response": "R", "artifacts": found})


def test_either_marker_alone_covers_the_identity() -> None:
    bare = {"agent_id": "turn-1", "response": "r", "instruction": "i"}
    assert entry_digest({**bare, "turn": 1}) == result_digest(
        {"response": "r", "turn": 1, "agent_id": "turn-1", "instruction": "i"}
    )
    assert entry_digest({**bare, "escalation": 1}) == result_digest(
        {"response": "r", "escalation": 1, "agent_id": "turn-1", "instruction": "i"}
    )
    # A marker makes only the identity members it finds covered: no null for the others.
    assert entry_digest({"response": "r", "turn": 1}) == result_digest({"response": "r", "turn": 1})


def test_plain_members_are_normalized_without_a_call_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast path for ``str``/``int``/``None`` members and ``str`` keys (admission
    normalizes every entry on the event loop): neither ``normalize`` nor ``_key`` is
    called again for them, and every other value still is."""
    calls = {"normalize": 0, "key": 0}
    real_normalize, real_key = _digest.normalize, _digest._key

    def counting_normalize(value: object) -> object:
        calls["normalize"] += 1
        return real_normalize(value)

    def counting_key(key: object) -> str:
        calls["key"] += 1
        return real_key(key)

    monkeypatch.setattr(_digest, "normalize", counting_normalize)
    monkeypatch.setattr(_digest, "_key", counting_key)
    entry = {"agent_id": "a", "status": "completed", "n": 3, "response": None}
    assert _digest.normalize(entry) == entry
    assert calls == {"normalize": 1, "key": 0}
    calls.update(normalize=0)
    assert _digest.normalize({"a": True, "b": 1.5, "c": ("x",), 7: "seven"}) == {
        "a": True,
        "b": 1.5,
        "c": ["x"],
        "7": "seven",
    }
    # The top call, one each for the bool, the float and the tuple, and one for the
    # tuple's item (a list's items take no fast path); one key call, for the int key.
    assert calls == {"normalize": 5, "key": 1}
