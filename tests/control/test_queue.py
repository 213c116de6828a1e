"""The ``ctl`` writers at library level, on each real state backend (ADR-0069 D1)."""

from __future__ import annotations

import getpass
import itertools
import math
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pg_support import PgRaw
from steerflow.control import (
    MAX_MESSAGE_BYTES,
    FrontEnd,
    check_budget,
    enqueue_control,
    open_existing_db,
    resolve_control,
    send_control,
    sender_id,
    session_target,
)
from steerflow.control._queue import (
    DB_BUSY_TIMEOUT_S,
    UNENFORCEABLE_KEY,
    CliVerb,
    Queued,
    check_message_text,
)
from steerflow.errors import (
    ControlNotApplyingError,
    DatabaseBusyError,
    ExitCode,
    KindNotAllowedError,
    NotRunningError,
    RefusedError,
    UnknownIdError,
    UsageError,
)
from steerflow.state import STATE_DB_URL_ENV, ResolvedTarget, StateDB, this_host
from steerflow.state._postgres import _key


@pytest.fixture
def home(tmp_path: Path, state_backend: str) -> Path:
    return tmp_path / "home"


@pytest.fixture
def sid(home: Path) -> str:
    with StateDB.open(home) as db:
        return db.create_session(kind="flow").id


def test_rows_are_stored_in_commit_order_even_with_a_stuck_clock(
    home: Path, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("time.time", lambda: 1000.0)  # a clock that never advances
    made = [enqueue_control(home, sid, "message", f"m{i}") for i in range(20)]
    with StateDB.open(home) as db:
        rows = db.list_controls(sid)
    assert [r.id for r in rows] == [q.control_id for q in made]
    stamps = [r.created_at for r in rows]
    assert all(a < b for a, b in itertools.pairwise(stamps))
    assert [r.payload for r in rows] == [{"text": f"m{i}"} for i in range(20)]
    assert all(r.is_pending for r in rows)


def test_session_finishing_after_resolution_is_refused_without_a_row(
    home: Path, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = StateDB.resolve_target

    def resolve_then_finish(self: StateDB, target: str) -> ResolvedTarget:
        resolved = original(self, target)
        with StateDB.open(home) as other:  # the flow ends right after we looked
            other.set_session_status(sid, "completed")
        return resolved

    monkeypatch.setattr(StateDB, "resolve_target", resolve_then_finish)
    with pytest.raises(NotRunningError, match="completed, not running"):
        enqueue_control(home, sid, "pause")
    with StateDB.open(home) as db:
        assert db.count_controls() == 0


def test_payloads_and_usage(home: Path, sid: str) -> None:
    paused = enqueue_control(home, sid[:6], "pause")
    said = enqueue_control(home, sid, "message", "line one\n  line two")
    with StateDB.open(home) as db:
        assert db.get_control(paused.control_id).payload is None  # type: ignore[union-attr]
        assert db.get_control(said.control_id).payload == {  # type: ignore[union-attr]
            "text": "line one\n  line two"
        }
    for blank in (None, "", " \n\t "):  # a blank message is refused, not queued
        with pytest.raises(
            UsageError,
            match=r"^ctl msg needs a non-empty TEXT \(it is empty or only whitespace\)$",
        ):
            enqueue_control(home, sid, "message", blank)
    with pytest.raises(UsageError, match="65536 bytes"):
        enqueue_control(home, sid, "message", "x" * (MAX_MESSAGE_BYTES + 1))
    stopped = enqueue_control(home, sid, "stop", "maintenance window", now=True)
    with StateDB.open(home) as db:
        assert db.get_control(stopped.control_id).payload == {  # type: ignore[union-attr]
            "now": True,
            "reason": "maintenance window",
        }
    bad: Any = "halt"
    with pytest.raises(UsageError, match="unknown control verb 'halt'"):
        enqueue_control(home, sid, bad)
    with StateDB.open(home) as db:
        assert db.count_controls() == 3


def test_resolve_only_applying_rows(home: Path, sid: str) -> None:
    queued = enqueue_control(home, sid, "message", "x")
    with pytest.raises(
        ControlNotApplyingError, match=r"is not applying \(pending\); nothing changed"
    ):
        resolve_control(home, queued.control_id, "abandoned", "me")
    with StateDB.open(home) as db:
        assert db.claim_control(queued.control_id, "h:1:flow-executor:s")
    row = resolve_control(home, queued.control_id, "abandoned", "me")
    assert row.result == "abandoned:me" and row.applied_at is not None
    with pytest.raises(
        ControlNotApplyingError, match=r"is not applying \(result 'abandoned:me'\); nothing changed"
    ):
        resolve_control(home, queued.control_id, "applied", None)


# -- the invocation-kind x verb matrix (ADR-0069 D1, message widened to agent by ADR-0108) ------

_ACCEPTS = {
    ("flow", "pause"): True,
    ("flow", "resume"): True,
    ("flow", "message"): True,
    ("play", "pause"): True,
    ("play", "resume"): True,
    ("play", "message"): True,
    ("agent", "pause"): False,
    ("agent", "resume"): False,
    ("agent", "message"): True,
    ("flow", "stop"): True,
    ("play", "stop"): True,
    ("agent", "stop"): True,  # the agent stops after its current turn (issue 19)
}
_ACCEPTED_BY = {
    "pause": "flow, play",
    "resume": "flow, play",
    "message": "agent, flow, play",
    "stop": "agent, flow, play",
}


def _target(home: Path, session_kind: str, via: str, kind: str) -> tuple[str, str]:
    """A running session and the id ``ctl`` is aimed at; the invocation kind decides."""
    with StateDB.open(home) as db:
        session = db.create_session(kind=session_kind)  # type: ignore[arg-type]
        if via == "session":
            return session.id, session.id
        # an invocation of another kind inside the session: its own kind must decide
        invocation = db.create_invocation(session_id=session.id, kind=kind)  # type: ignore[arg-type]
        return session.id, invocation.id


@pytest.mark.parametrize("via", ["session", "invocation"])
@pytest.mark.parametrize(("kind", "verb"), sorted(_ACCEPTS))
def test_kind_verb_matrix(home: Path, kind: str, verb: CliVerb, via: str) -> None:
    other = "agent" if kind != "agent" else "flow"
    session_kind = kind if via == "session" else other
    session_id, target = _target(home, session_kind, via, kind)
    text = "steer" if verb == "message" else None
    if _ACCEPTS[(kind, verb)]:
        queued = enqueue_control(home, target, verb, text)
        assert queued == Queued(
            control_id=queued.control_id, session_id=session_id, verb=verb, sender=sender_id("api")
        )
        with StateDB.open(home) as db:
            (row,) = db.list_controls(session_id)
        assert (row.id, row.session_id, row.verb, row.is_pending) == (
            queued.control_id,
            session_id,
            verb,
            True,
        )
        expected = {"message": {"text": "steer"}, "stop": {"now": False, "reason": None}}
        assert row.payload == expected.get(verb)
    else:
        with pytest.raises(KindNotAllowedError) as info:
            enqueue_control(home, target, verb, text)
        assert str(info.value) == (
            f"kind not allowed: {verb} is not accepted by an invocation of kind {kind!r} "
            f"(accepted: {_ACCEPTED_BY[verb]})"
        )
        assert info.value.exit_code == ExitCode.REFUSED
        with StateDB.open(home) as db:
            assert db.count_controls() == 0


def test_a_play_target_uses_its_session_kind(home: Path) -> None:
    with StateDB.open(home) as db:
        agent_session = db.create_session(kind="agent")
        agent_play = db.create_play(session_id=agent_session.id, invocation_id=None, playbook="p")
        play_session = db.create_session(kind="play")
        play = db.create_play(session_id=play_session.id, invocation_id=None, playbook="p")
    refusal = "pause is not accepted by an invocation of kind 'agent'"
    with pytest.raises(KindNotAllowedError, match=refusal):
        enqueue_control(home, agent_play.id, "pause")
    queued = enqueue_control(home, play.id, "pause")
    assert (queued.session_id, queued.verb) == (play_session.id, "pause")


def test_unknown_verb_is_refused_before_the_database_is_opened(home: Path) -> None:
    bad: Any = "halt"
    with pytest.raises(
        UsageError,
        match="unknown control verb 'halt': expected pause, resume, message, stop or budget",
    ):
        enqueue_control(home / "missing", "0" * 32, bad)


def test_message_size_limit_is_exact(home: Path, sid: str) -> None:
    assert MAX_MESSAGE_BYTES == 65536
    at_limit = "é" * (MAX_MESSAGE_BYTES // 2)  # two UTF-8 bytes each: bytes count, not chars
    assert enqueue_control(home, sid, "message", at_limit).verb == "message"
    with pytest.raises(
        UsageError, match=r"ctl msg TEXT is 65537 bytes; the limit is 65536 bytes \(64 KiB\)"
    ):
        enqueue_control(home, sid, "message", at_limit + "x")
    assert check_message_text(" x ") == " x "


def test_stop_reason_size_limit_is_exact(home: Path, sid: str) -> None:
    at_limit = "é" * (MAX_MESSAGE_BYTES // 2)
    with pytest.raises(
        UsageError, match=r"ctl stop --reason is 65537 bytes; the limit is 65536 bytes \(64 KiB\)"
    ):
        enqueue_control(home, sid, "stop", at_limit + "x")
    assert enqueue_control(home, sid, "stop", at_limit).verb == "stop"
    assert enqueue_control(home, sid, "stop", None).verb == "stop"


def test_missing_state_db_is_refused_without_creating_it(home: Path) -> None:
    with pytest.raises(RefusedError, match="no state database at"):
        enqueue_control(home, "0" * 32, "pause")
    assert not home.exists()


# -- every lock wait is bounded by the caller's timeout ----------------------------------------


def _raw(db: StateDB) -> Any:
    if db.path is None:
        return PgRaw(os.environ[STATE_DB_URL_ENV])
    return sqlite3.connect(db.path, isolation_level=None)


@contextmanager
def _write_lock_held(db: StateDB, sid: str, control_id: str) -> Iterator[None]:
    """From another connection, until the block ends, hold what a writer of ``sid`` and of
    ``control_id`` waits for: SQLite's write lock; PostgreSQL's session lock and row lock."""
    conn = _raw(db)
    try:
        if db.path is None:
            conn.execute("BEGIN")
            conn.execute("SELECT pg_advisory_xact_lock(?, ?)", (_key("session"), _key(sid)))
            conn.execute("SELECT 1 FROM session_controls WHERE id = ? FOR UPDATE", (control_id,))
        else:
            conn.execute("BEGIN IMMEDIATE")
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def test_enqueue_and_resolve_wait_only_as_long_as_asked(home: Path, sid: str) -> None:
    queued = enqueue_control(home, sid, "message", "x")
    with StateDB.open(home) as db:
        assert db.claim_control(queued.control_id, "h:1:flow-executor:s")
    with StateDB.open(home) as db, _write_lock_held(db, sid, queued.control_id):
        for call in (
            lambda: enqueue_control(home, sid, "pause", busy_timeout_s=0.2),
            lambda: resolve_control(home, queued.control_id, "applied", None, busy_timeout_s=0.2),
        ):
            started = time.monotonic()
            with pytest.raises(DatabaseBusyError, match="database busy"):
                call()
            assert time.monotonic() - started < 5.0  # the default bound is 10 s
    row = resolve_control(home, queued.control_id, "applied", None)
    assert (row.id, row.result) == (queued.control_id, "applied")
    assert DB_BUSY_TIMEOUT_S == 10.0


def test_a_target_whose_session_row_is_gone_is_refused(home: Path) -> None:
    with StateDB.open(home) as db:
        conn = _raw(db)
    orphan = "ab" * 16
    if db.path is None:  # foreign keys are triggers there: skip them, for an orphan row
        conn.execute("SET session_replication_role = replica")
    try:  # (sqlite3: foreign keys are off on a plain connection)
        conn.execute(
            "INSERT INTO invocations (id, session_id, kind, status, created_at, updated_at)"
            " VALUES (?, ?, 'flow', 'running', 0, 0)",
            (orphan, "cd" * 16),
        )
    finally:
        conn.close()
    with pytest.raises(RefusedError, match=f"^target '{orphan[:6]}' points at a missing session$"):
        enqueue_control(home, orphan[:6], "pause")
    with StateDB.open(home) as db:
        assert db.count_controls() == 0


@pytest.mark.parametrize("via", ["cli", "studio", "mcp", "api"])
def test_every_row_records_its_sender(home: Path, sid: str, via: FrontEnd) -> None:
    queued = enqueue_control(home, sid, "pause", via=via)
    with StateDB.open(home) as db:
        (row,) = db.list_controls(sid)
    assert row.id == queued.control_id and queued.sender == row.sender
    assert row.sender == f"{via}:{getpass.getuser()}@{this_host()}:{os.getpid()}"
    assert row.sender == sender_id(via)


def test_the_python_writers_are_the_api_front_end(home: Path, sid: str) -> None:
    control_id = send_control(home, sid, "message", "hi")
    with StateDB.open(home) as db:
        assert (db.get_control(control_id) or pytest.fail("no row")).sender == sender_id("api")


def test_an_unknown_front_end_is_refused_without_a_row(home: Path, sid: str) -> None:
    with pytest.raises(UsageError, match="unknown front end 'web'"):
        enqueue_control(home, sid, "pause", via="web")  # type: ignore[arg-type]
    with StateDB.open(home) as db:
        assert db.count_controls() == 0


def test_sender_parts_are_bounded_and_a_nameless_user_is_its_uid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STEERFLOW_HOST_ID", "h" * 100)
    monkeypatch.setattr(getpass, "getuser", lambda: "u" * 100)
    assert sender_id("cli") == f"cli:{'u' * 64}@{'h' * 64}:{os.getpid()}"

    def nameless() -> str:
        raise OSError("no user name")  # what getuser raises without LOGNAME and passwd entry

    monkeypatch.setattr(getpass, "getuser", nameless)
    assert sender_id("mcp") == f"mcp:uid{os.getuid()}@{'h' * 64}:{os.getpid()}"
    monkeypatch.setattr(getpass, "getuser", lambda: "")
    assert sender_id("api") == f"api:uid{os.getuid()}@{'h' * 64}:{os.getpid()}"


# -- budgets, run-id targets and an explicit state DB (the library's writers) ------------------

RUN_ID = "20260101T000000-c0ffee"
NEEDS_A_CAP = {
    "cli": "ctl budget needs --max-cost USD and/or --max-tokens N",
    "api": "budget needs max_cost (USD) and/or max_tokens",
}
NAMES = {"cli": ("--max-cost", "--max-tokens"), "api": ("max_cost", "max_tokens")}


@pytest.mark.parametrize(
    ("given", "checked"),
    [
        ({"max_cost": 0.5}, {"max_cost": 0.5, "max_tokens": None}),
        ({"max_cost": 2}, {"max_cost": 2.0, "max_tokens": None}),
        ({"max_tokens": 1}, {"max_cost": None, "max_tokens": 1}),
        ({"max_cost": 1e-9, "max_tokens": 7}, {"max_cost": 1e-9, "max_tokens": 7}),
    ],
)
def test_check_budget_keeps_positive_finite_caps(
    given: dict[str, float | int | None], checked: dict[str, float | int | None]
) -> None:
    out = check_budget(given)
    assert out == checked and list(out) == ["max_cost", "max_tokens"]
    assert isinstance(out["max_cost"], float | None)


def _budget_refusals() -> list[tuple[dict[str, Any] | None, int, str]]:
    """(caps, which name the refusal gives: -1 none, 0 the cost's, 1 the tokens', problem)."""
    out: list[tuple[dict[str, Any] | None, int, str]] = [
        (None, -1, ""),
        ({}, -1, ""),
        ({"max_cost": None, "max_tokens": None}, -1, ""),
    ]
    out += [
        ({"max_cost": bad}, 0, f"{shown} is not a positive, finite number of USD")
        for bad, shown in ((0, "0"), (0.0, "0.0"), (-1.0, "-1.0"), (math.inf, "inf"),
                           (math.nan, "nan"), (True, "True"), ("1", "'1'"))
    ]  # fmt: skip
    out += [
        ({"max_tokens": 0}, 1, "0 is out of range: give 1 or more"),
        ({"max_tokens": -3}, 1, "-3 is out of range: give 1 or more"),
        ({"max_tokens": 1.5}, 1, "1.5 is not an integer"),
        ({"max_tokens": True}, 1, "True is not an integer"),
        ({"max_tokens": "3"}, 1, "'3' is not an integer"),
    ]
    return out


@pytest.mark.parametrize("via", ["cli", "api"])
@pytest.mark.parametrize(("given", "which", "problem"), _budget_refusals())
def test_check_budget_refuses_what_ctl_budget_refuses(
    given: dict[str, Any] | None, which: int, problem: str, via: str
) -> None:
    """The same refusals for ``ctl budget`` and ``steerflow.budget``, each naming its own."""
    with pytest.raises(UsageError) as refused:
        check_budget(given, via=via)  # type: ignore[arg-type]
    named = f"invalid value for {NAMES[via][which]}: {problem}"
    expected = NEEDS_A_CAP[via] if which < 0 else named
    assert str(refused.value) == expected


def test_check_budget_names_flags_for_ctl_and_the_studio_only(home: Path, sid: str) -> None:
    for via, name in (("cli", "--max-cost"), ("studio", "--max-cost"), ("mcp", "max_cost"),
                      ("api", "max_cost"), (None, "max_cost")):  # fmt: skip
        kw = {} if via is None else {"via": via}
        with pytest.raises(UsageError) as refused:
            check_budget({"max_cost": 0}, **kw)  # type: ignore[arg-type]
        assert str(refused.value).startswith(f"invalid value for {name}: "), (via, refused)
    # enqueue_control hands its front end on: ctl's refusal names the flag.
    with pytest.raises(UsageError, match=r"^invalid value for --max-tokens: 0 is out of range"):
        enqueue_control(home, sid, "budget", budget={"max_tokens": 0}, via="cli")
    with pytest.raises(UsageError, match=r"^invalid value for max_tokens: 0 is out of range"):
        enqueue_control(home, sid, "budget", budget={"max_tokens": 0}, via="mcp")


def test_a_budget_row_holds_the_checked_caps(home: Path, sid: str) -> None:
    enqueue_control(home, sid, "budget", budget={"max_cost": 3, "max_tokens": None})
    with pytest.raises(UsageError, match="invalid value for max_tokens: 0 is out of range"):
        enqueue_control(home, sid, "budget", budget={"max_tokens": 0})
    with StateDB.open(home) as db:
        (row,) = db.list_controls(sid)
    assert (row.verb, row.payload) == ("budget", {"max_cost": 3.0, "max_tokens": None})


def test_enqueue_control_takes_a_run_id_as_ctl_does(home: Path) -> None:
    """``ctl pause RUN_ID`` (the CLI's writer, not only the library's): CONTRACT §12."""
    with StateDB.open(home) as db:
        sid = db.create_session(kind="flow", run_id=RUN_ID).id
    queued = enqueue_control(home, RUN_ID, "pause", via="cli")
    assert queued.session_id == sid
    with pytest.raises(UnknownIdError, match="unknown run id '20260101T000000-000000'"):
        enqueue_control(home, "20260101T000000-000000", "pause", via="cli")
    with StateDB.open(home) as db:
        assert [c.id for c in db.list_controls(sid)] == [queued.control_id]


@pytest.mark.parametrize(
    ("recorded", "caps", "refused"),
    [
        ({"max_cost": "COST-WHY"}, {"max_cost": 1.0}, "unenforceable: COST-WHY"),
        ({"max_cost": "COST-WHY"}, {"max_cost": 1.0, "max_tokens": 5}, "unenforceable: COST-WHY"),
        ({"max_cost": "COST-WHY"}, {"max_tokens": 5}, None),
        ({"max_tokens": "TOKENS-WHY"}, {"max_tokens": 5}, "unenforceable: TOKENS-WHY"),
        ({"max_tokens": "TOKENS-WHY"}, {"max_cost": 1.0}, None),
        ({"max_cost": 7}, {"max_cost": 1.0}, None),  # not a reason: nothing to refuse for
        ("COST-WHY", {"max_cost": 1.0}, None),
        (None, {"max_cost": 1.0}, None),
    ],
)
def test_a_cap_the_session_recorded_it_cannot_enforce_is_refused_without_a_row(
    home: Path, recorded: object, caps: dict[str, float | int | None], refused: str | None
) -> None:
    with StateDB.open(home) as db:
        sid = db.create_session(kind="flow").id
        if recorded is not None:
            db.update_node_metadata(sid, {UNENFORCEABLE_KEY: recorded})
    if refused is None:
        enqueue_control(home, sid, "budget", budget=caps)
    else:
        with pytest.raises(RefusedError) as error:
            enqueue_control(home, sid, "budget", budget=caps)
        assert str(error.value) == refused
        assert type(error.value) is RefusedError and error.value.exit_code == 3
    with StateDB.open(home) as db:
        assert len(db.list_controls(sid)) == (0 if refused else 1)


def test_a_session_that_no_longer_runs_is_refused_for_that_first(home: Path) -> None:
    """A finished run's recorded reasons do not matter: it is not running (exit 3)."""
    with StateDB.open(home) as db:
        sid = db.create_session(kind="flow").id
        db.update_node_metadata(sid, {UNENFORCEABLE_KEY: {"max_cost": "COST-WHY"}})
        db.set_session_status(sid, "completed")
    with pytest.raises(NotRunningError, match="completed, not running"):
        enqueue_control(home, sid, "budget", budget={"max_cost": 1.0})


def _state_db_url(home: Path) -> str:
    """The URL of the backend ``home`` uses: PostgreSQL's from the environment, else its file."""
    return os.environ.get(STATE_DB_URL_ENV) or f"sqlite:///{home / 'state.db'}"


def test_send_control_takes_a_run_id_every_option_and_an_explicit_state_db(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with StateDB.open(home) as db:
        sid = db.create_session(kind="flow", run_id=RUN_ID).id
    first = send_control(home, RUN_ID, "pause")  # the run id looked up in the home's DB
    url = _state_db_url(home)
    # Another home, no environment: only the explicit URL leads to the session's database.
    monkeypatch.delenv(STATE_DB_URL_ENV, raising=False)
    other = tmp_path / "other-home"
    stop = send_control(other, RUN_ID, "stop", "why", now=True, state_db=url, via="cli")
    calm = send_control(other, RUN_ID, "stop", "later", state_db=url)
    cap = send_control(other, RUN_ID, "budget", state_db=url, budget={"max_tokens": 9})
    msg = send_control(other, sid, "message", "by session id", state_db=url)
    with pytest.raises(UnknownIdError, match="unknown run id '20260101T000000-000000'"):
        send_control(other, "20260101T000000-000000", "pause", state_db=url)
    assert not other.exists()
    with StateDB.open_url(url, create=False) as db:
        rows = {c.id: c for c in db.list_controls(sid)}
    assert list(rows) == [first, stop, calm, cap, msg]
    assert rows[first].verb == "pause"
    assert rows[stop].payload == {"now": True, "reason": "why"}
    assert rows[stop].sender == sender_id("cli")
    assert rows[calm].payload == {"now": False, "reason": "later"}
    assert rows[calm].sender == sender_id("api")
    assert rows[cap].payload == {"max_cost": None, "max_tokens": 9}
    assert rows[msg].payload == {"text": "by session id"}


def test_session_target_maps_a_run_id_and_leaves_other_targets(home: Path) -> None:
    with StateDB.open(home) as db:
        sid = db.create_session(kind="flow", run_id=RUN_ID).id
        assert session_target(db, RUN_ID) == sid
        assert session_target(db, sid[:8]) == sid[:8]  # a prefix is resolve_target's job
        with pytest.raises(UnknownIdError) as unknown:
            session_target(db, "20260101T000000-000000")
    assert str(unknown.value) == "unknown run id '20260101T000000-000000': no session ran it"


def test_an_explicit_state_db_that_is_missing_is_refused_not_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(STATE_DB_URL_ENV, raising=False)
    missing = tmp_path / "nowhere" / "state.db"
    with pytest.raises(RefusedError, match="no state database"):
        open_existing_db(tmp_path / "home", state_db=f"sqlite:///{missing}")
    assert not missing.parent.exists() and not (tmp_path / "home").exists()


def test_an_explicit_state_db_waits_only_as_long_as_asked(
    home: Path, sid: str, tmp_path: Path
) -> None:
    url = _state_db_url(home)
    queued = enqueue_control(home, sid, "message", "x")
    with StateDB.open(home) as db, _write_lock_held(db, sid, queued.control_id):
        started = time.monotonic()
        with pytest.raises(DatabaseBusyError, match="database busy"):
            enqueue_control(tmp_path / "x", sid, "pause", busy_timeout_s=0.2, state_db=url)
        assert time.monotonic() - started < 5.0  # the default bound is 10 s


@pytest.mark.parametrize("taken", ["pending", "applying"])
def test_a_decision_after_the_run_took_another_names_the_one_taken(home: Path, taken: str) -> None:
    """The run drops a request from its list before it stamps the decision it took.

    A second decision sent in that gap is refused naming the first, not called unknown
    (seen as 1 failure in 7 runs of the two-decisions e2e test on PostgreSQL).
    """
    from steerflow.control._decide import send_decision

    with StateDB.open(home) as db:
        session = db.create_session(
            kind="flow", run_id="20261206T000000-aaaaaa",
            node_metadata={"approvals": {"req-1": {"node": "a"}}},
        )  # fmt: skip
    first = send_decision(home, session.id, "approve", "req-1")
    with StateDB.open(home) as db:
        if taken == "applying":
            assert db.claim_control(first.control_id, "runner")
        db.update_node_metadata(session.id, {"approvals": None})
    with pytest.raises(RefusedError, match=first.control_id):
        send_decision(home, session.id, "deny", "req-1", reason="no")
    with StateDB.open(home) as db:
        assert [c.verb for c in db.list_controls(session.id)] == ["approve"]
