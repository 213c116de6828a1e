"""``resolve_target``: exact ids, prefixes, ambiguity and table order (ADR-0069 D1)."""

from __future__ import annotations

import sqlite3

import pytest
from state_support import insert_invocation, insert_play, insert_session

from steerflow.errors import AmbiguousIdError, UnknownIdError
from steerflow.state import ResolvedTarget, StateDB

S1 = "ab12" + "0" * 28
S2 = "ab13" + "0" * 28
S3 = "cd00" + "0" * 28
I1 = "ef01" + "0" * 28
I2 = "ef02" + "0" * 28
I3 = "ab99" + "0" * 28  # shares the 'ab' prefix with two sessions
P1 = "7700" + "0" * 28
P2 = "ab77" + "0" * 28


@pytest.fixture
def seeded(db: StateDB, raw: sqlite3.Connection) -> StateDB:
    insert_session(raw, S1, kind="flow")
    insert_session(raw, S2, kind="play")
    insert_session(raw, S3, kind="agent")
    insert_invocation(raw, I1, S1, kind="agent")
    insert_invocation(raw, I2, S3, kind="flow")
    insert_invocation(raw, I3, S3, kind="play")
    insert_play(raw, P1, S2, I1)
    insert_play(raw, P2, S2)
    return db


def test_exact_session_invocation_and_play(seeded: StateDB) -> None:
    assert seeded.resolve_target(S1) == ResolvedTarget(S1, "session", "flow", S1)
    assert seeded.resolve_target(I1) == ResolvedTarget(S1, "invocation", "agent", I1)
    # a play match reports the kind of its session
    assert seeded.resolve_target(P1) == ResolvedTarget(S2, "play", "play", P1)


def test_unique_prefix(seeded: StateDB) -> None:
    assert seeded.resolve_target("cd").session_id == S3
    assert seeded.resolve_target("ab12").session_id == S1
    assert seeded.resolve_target("ef01").via == "invocation"
    assert seeded.resolve_target("77") == ResolvedTarget(S2, "play", "play", P1)


def test_ambiguous_prefix_in_sessions_lists_candidates(seeded: StateDB) -> None:
    with pytest.raises(AmbiguousIdError) as info:
        seeded.resolve_target("ab")
    assert S1 in str(info.value) and S2 in str(info.value) and "'ab'" in str(info.value)


def test_full_length_id_skips_ambiguity(seeded: StateDB) -> None:
    with pytest.raises(AmbiguousIdError):
        seeded.resolve_target("ab1")
    assert seeded.resolve_target(S2).session_id == S2


def test_sessions_searched_before_invocations_and_plays(seeded: StateDB) -> None:
    # 'ab9' matches only invocation I3; 'ab' would match sessions first
    assert seeded.resolve_target("ab9") == ResolvedTarget(S3, "invocation", "play", I3)
    # 'ab7' matches only play P2
    assert seeded.resolve_target("ab7") == ResolvedTarget(S2, "play", "play", P2)
    # 'ab12' matches one session and nothing else would be consulted
    assert seeded.resolve_target("ab12").via == "session"


def test_ambiguity_only_in_first_table_with_a_match(db: StateDB, raw: sqlite3.Connection) -> None:
    insert_session(raw, "12" + "0" * 30)
    insert_session(raw, "99" + "0" * 30)
    insert_invocation(raw, "12" + "1" * 30, "99" + "0" * 30)
    insert_invocation(raw, "12" + "2" * 30, "99" + "0" * 30)
    insert_invocation(raw, "7a" + "1" * 30, "99" + "0" * 30)
    insert_invocation(raw, "7a" + "2" * 30, "99" + "0" * 30)
    # one session matches '12': the two invocations are never looked at
    assert db.resolve_target("12").via == "session"
    # no session matches '7a', so the invocations table decides, and it is ambiguous
    with pytest.raises(AmbiguousIdError, match="invocations"):
        db.resolve_target("7a")


@pytest.mark.parametrize("target", ["", "XYZ", "AB12", "ab-12", "g0", " ab12", "a" * 33, "ab12\n"])
def test_non_hex_target_is_refused(seeded: StateDB, target: str) -> None:
    with pytest.raises(UnknownIdError) as info:
        seeded.resolve_target(target)
    assert repr(target) in str(info.value)


def test_unknown_target(seeded: StateDB) -> None:
    with pytest.raises(UnknownIdError, match="'0123'"):
        seeded.resolve_target("0123")
    with pytest.raises(UnknownIdError):
        seeded.resolve_target("f" * 32)


def test_real_ids_resolve(db: StateDB) -> None:
    session = db.create_session(kind="play")
    inv = db.create_invocation(session_id=session.id, kind="play")
    play = db.create_play(session_id=session.id, invocation_id=inv.id, playbook="demo")
    assert db.resolve_target(inv.id) == ResolvedTarget(session.id, "invocation", "play", inv.id)
    assert db.resolve_target(play.id).session_id == session.id
    assert db.resolve_target(session.id[:12]).session_id == session.id
