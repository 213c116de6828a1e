"""Every control records who queued it (schema migration 7, decision 205).

The four front ends write the row: ``steerflow ctl`` and ``steerflow mcp`` as real
subprocesses, the Studio over real loopback HTTP (a thread of this process), and the
Python writers of ``steerflow.views`` in process. Each row's ``sender`` names its front
end, the user, the host and the pid of the process that queued it; ``ctl status``, the
Studio's control log and history, and MCP's ``resume_preflight`` show it. A row from
before the column reads as null in JSON and "unknown" on the pages. Both backends.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import re
import sqlite3
from pathlib import Path

import pytest
from ctl_support import run_cli
from test_mcp_e2e import _call, _client
from test_run_names import _Tx
from test_studio_e2e import studio

from steerflow import views
from steerflow.control import sender_id
from steerflow.state import SCHEMA_VERSION, StateDB, this_host
from steerflow.state._schema import MIGRATIONS, SCHEMA_VERSION_DDL

RUN = "20260101T000000-5e0de0"
SENDER = re.compile(r"(cli|studio|mcp|api):([^@]+)@(.+):([0-9]+)")


def _running_session(home: Path) -> str:
    """A running session owned by this (live) process, as a flow's row reads."""
    home.mkdir(mode=0o700, exist_ok=True)
    (home / "runs" / RUN).mkdir(mode=0o700, parents=True)  # a run that saved nothing yet
    with StateDB.open(home) as db:
        return db.create_session(kind="flow", run_id=RUN, phase="executing", name="senders").id


def _senders(home: Path, session_id: str) -> dict[str, str | None]:
    """Each message's text -> the sender its row records."""
    with StateDB.open(home, create=False) as db:
        return {
            str((c.payload or {}).get("text")): c.sender
            for c in db.list_controls(session_id)
            if c.verb == "message"
        }


def _parts(sender: str | None) -> tuple[str, str, str, int]:
    match = SENDER.fullmatch(sender or "")
    assert match, sender
    return match[1], match[2], match[3], int(match[4])


async def _mcp_message(home: Path) -> str | None:
    """The sender the MCP ``message`` tool answers with."""
    async with _client(home, "--allow-control") as session:
        answer = await _call(session, "message", target=RUN, text="from mcp")
    sender: str | None = answer["sender"]
    return sender


def test_sender_id_names_front_end_user_host_and_pid() -> None:
    assert _parts(sender_id("cli")) == ("cli", getpass.getuser(), this_host(), os.getpid())
    with pytest.raises(Exception, match="unknown front end"):
        sender_id("web")  # type: ignore[arg-type]


@pytest.mark.usefixtures("state_backend")
def test_each_front_end_records_itself_as_the_sender(tmp_path: Path) -> None:
    home = tmp_path / "home"
    sid = _running_session(home)
    user, host = getpass.getuser(), this_host()

    cli = run_cli(home, "ctl", "msg", sid, "from the cli")
    assert cli.returncode == 0, cli.stderr
    views.message(home, sid, "from python")
    with studio(home) as s, s.client() as client:
        page = client.get("/runs").text
        csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
        assert csrf, page
        sent = client.post(
            f"/sessions/{sid}/control",
            data={"verb": "message", "text": "from the studio", "csrf": csrf[1]},
        )
        assert sent.status_code == 303, sent.text
        answered = asyncio.run(_mcp_message(home))

        senders = _senders(home, sid)
        assert set(senders) == {"from the cli", "from python", "from the studio", "from mcp"}
        cli_front, cli_user, cli_host, cli_pid = _parts(senders["from the cli"])
        assert (cli_front, cli_user, cli_host) == ("cli", user, host) and cli_pid != os.getpid()
        assert _parts(senders["from python"]) == ("api", user, host, os.getpid())
        # The studio here is a thread of this process: its pid is this one.
        assert _parts(senders["from the studio"]) == ("studio", user, host, os.getpid())
        mcp_front, _, _, mcp_pid = _parts(senders["from mcp"])
        assert mcp_front == "mcp" and mcp_pid not in (os.getpid(), cli_pid)
        assert answered == senders["from mcp"]  # the tool's answer names the sender too

        status = json.loads(run_cli(home, "ctl", "status", sid, "--json").stdout)
        by_text = {c["payload"]["text"]: c["sender"] for c in status["controls"]}
        assert by_text == senders
        text = run_cli(home, "ctl", "status", sid).stdout
        assert f"from {senders['from the cli']}" in text

        # The Studio's run page: the control log's "by" column and the history say who.
        run_page = client.get(f"/runs/{RUN}").text
        for who in senders.values():
            assert f'<td class="sender">{who}</td>' in run_page
            assert f"; by {who}</td>" in run_page


def test_migration_7_keeps_old_controls_as_unknown_senders(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    conn = sqlite3.connect(home / "state.db", isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute(SCHEMA_VERSION_DDL)
    for step in MIGRATIONS[:6]:  # a state DB as the release before senders left it
        for statement in step.statements:
            conn.execute(statement)
        if step.apply is not None:
            step.apply(_Tx(conn))  # type: ignore[arg-type]
        conn.execute("INSERT INTO schema_version VALUES (?, 0, 'old')", (step.version,))
    conn.close()
    sid = _running_session(home)  # opening it migrates to 7
    with StateDB.open(home) as db:
        versions = [r["version"] for r in db.backend.query("SELECT version FROM schema_version")]
        assert versions == list(range(1, SCHEMA_VERSION + 1)) and SCHEMA_VERSION >= 7
        db.backend.query("SELECT sender FROM session_controls")  # the column is there
        with db.backend.transaction(write=True) as tx:  # a row as the old release wrote it
            tx.execute(
                "INSERT INTO session_controls (id, session_id, verb, payload, created_at)"
                " VALUES (?, ?, 'message', '{\"text\":\"old\"}', 1.0)",
                ("0" * 32, sid),
            )
    views.message(home, sid, "new")
    assert _senders(home, sid)["old"] is None
    assert _parts(_senders(home, sid)["new"])[0] == "api"
    status = json.loads(run_cli(home, "ctl", "status", sid, "--json").stdout)
    old, new = status["controls"]  # oldest first
    assert old["sender"] is None and _parts(new["sender"])[0] == "api"
    assert "from unknown" in run_cli(home, "ctl", "status", sid).stdout
    with studio(home) as s, s.client() as client:
        page = client.get(f"/runs/{RUN}").text
        assert '<td class="sender">unknown</td>' in page and "; by unknown</td>" in page
