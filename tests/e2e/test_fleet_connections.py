"""A team's flows on one PostgreSQL server (issue 44): one connection each, and a full
server or a dropped connection is a wait, not a failure.

Real ``steerflow flow`` processes (``gated_cli.py``: a node held on a release file, so
no test waits on a delay) on real servers: the suite's shared one for the per-process
count, and one started here with ``max_connections=20`` whose flows log in as an
ordinary role (the server keeps 3 slots for superusers, so 17 are theirs).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from ctl_support import (
    HERE,
    LiveFlow,
    clean_env,
    control,
    live_flow,
    steer_lines,
    wait_for,
    write_yaml,
)
from flow_support import cli_in_process

from pg_support import PgServer, pg_server
from steerflow.cli import main as cli_main
from steerflow.cli._reading import flow_result_text
from steerflow.state import DB_CONNECT_TIMEOUT_ENV, STATE_DB_URL_ENV, StateDB

# One server for the module: its tests run on one xdist worker (``--dist loadgroup``).
pytestmark = pytest.mark.xdist_group("fleet_small_pg")

GATED = HERE / "gated_cli.py"
FLOWS = 10
ROLE = "fleet"


@dataclass
class SmallServer:
    """A server at ``max_connections=20`` and the URLs of its ordinary role and superuser."""

    server: PgServer
    url: str  # as the role the flows log in with
    admin_url: str  # as the superuser (reserved slots): the test's own view


@pytest.fixture(scope="module")
def small_pg() -> Iterator[SmallServer]:
    with pg_server(max_connections=20) as server:
        server.psql(f"CREATE ROLE {ROLE} LOGIN")
        server.psql(f"CREATE DATABASE {ROLE} OWNER {ROLE} TEMPLATE template0")
        url = f"postgresql://{ROLE}@127.0.0.1:{server.port}/{ROLE}"
        yield SmallServer(server, url, server.url(ROLE))


def _plan(tmp: Path) -> list[str]:
    """a (held on its gate) -> b: a message sent while a runs reaches b's instruction."""
    plan = write_yaml(tmp / "plan.yaml", {"plan": [
        {"agent_id": "a", "instruction": "first"},
        {"agent_id": "b", "instruction": "second", "depends_on": ["a"]},
    ]})  # fmt: skip
    script = write_yaml(tmp / "script.yaml", {"*": {"delay": 0.0}})
    return ["--plan", str(plan), "--model", f"script:{script}"]


def _argv(home: Path, args: list[str]) -> list[str]:
    return [sys.executable, str(GATED), "--home", str(home), "flow", *args, "--json"]


def _start(home: Path, args: list[str], url: str, **env: str) -> LiveFlow:
    home.mkdir(parents=True, mode=0o700)
    (home / "gate-a").touch()
    flows = live_flow(home, args, env={STATE_DB_URL_ENV: url, **env},
                      argv=_argv(home, args), wait_session=False)  # fmt: skip
    flow = flows.__enter__()
    flow.extra["cm"] = flows
    return flow


def _end(flow: LiveFlow) -> None:
    flow.extra["cm"].__exit__(None, None, None)


def _run_id(flow: LiveFlow) -> str:
    runs = sorted((flow.home / "runs").glob("2*"))
    flow.run_id = runs[0].name if runs else ""
    return flow.run_id


def _steered(flow: LiveFlow) -> list[str]:
    """The operator messages in b's steer block (without their timestamps)."""
    return [line.split(": ", 1)[1] for line in steer_lines(flow.responses()["b"])]


def _connections(admin_url: str) -> dict[str, int]:
    """Open client connections by ``application_name`` (the test's own left out)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, COUNT(*) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            " GROUP BY application_name"
        ).fetchall()
    return {str(name): int(count) for name, count in rows}


def _ctl_many(url: str, commands: list[tuple[Path, list[str]]]) -> list[str]:
    """Run ``ctl`` processes side by side; the control ids they printed."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "steerflow", "--home", str(home), "ctl", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env({STATE_DB_URL_ENV: url}),
        )
        for home, args in commands
    ]
    ids = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        ids.append(out.splitlines()[0].strip())
    return ids


def _kill_connection(admin: psycopg.Connection[Any], flow: LiveFlow) -> None:
    """Keep the flows' role out, then end the flow's connection (as a server restart would)."""
    admin.execute(f"ALTER ROLE {ROLE} NOLOGIN")
    killed = admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
        (f"steerflow:{flow.proc.pid}",),
    ).fetchall()
    assert killed == [(True,)]


@pytest.mark.timeout(150)
def test_a_flow_holds_one_connection_and_runs_on_through_two_outages(
    tmp_path: Path, small_pg: SmallServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STATE_DB_URL_ENV, small_pg.admin_url)  # the test's own reads
    flow = _start(tmp_path / "home", _plan(tmp_path), small_pg.url)
    admin = psycopg.connect(small_pg.admin_url, autocommit=True)
    lost = "lost the connection to the state database"
    try:
        wait_for((flow.home / "started-a").exists, timeout=60, what="a in flight", alive=flow.proc)
        run_id, mine = _run_id(flow), f"steerflow:{flow.proc.pid}"
        # The runner, its poller, the LISTEN, the lease keeper, the node publisher: one.
        assert _connections(small_pg.admin_url)[mine] == 1
        # runs and show (here in this process) open one and close it.
        assert cli_in_process(flow.home, "runs", "--json")[0] == 0
        assert cli_in_process(flow.home, "show", run_id, "--json")[0] == 0
        # Closed: the server drops its backend a moment after the client's Terminate.
        wait_for(lambda: f"steerflow:{os.getpid()}" not in _connections(small_pg.admin_url),
                 timeout=10, what="the readers' connection to be gone")  # fmt: skip

        # Outage 1, while a runs: a control queued meanwhile is applied once it is back.
        _kill_connection(admin, flow)
        wait_for(lambda: lost in flow.stderr(), timeout=30, what="the flow to say so",
                 alive=flow.proc)  # fmt: skip
        (control_id,) = _ctl_many(small_pg.admin_url, [(flow.home, ["msg", run_id, "meanwhile"])])
        assert control(flow.home, control_id).result is None  # nobody could take it
        admin.execute(f"ALTER ROLE {ROLE} LOGIN")
        # Claimed once it is back (a message is stamped when b takes it, after a ends).
        wait_for(lambda: control(flow.home, control_id).result, timeout=60,
                 what="the control claimed after the reconnect", alive=flow.proc)  # fmt: skip
        assert _connections(small_pg.admin_url)[mine] == 1

        # Outage 2, through the end: a and b finish on the checkpoint, the end is written
        # once the server lets it back in.
        _kill_connection(admin, flow)
        (flow.home / "release-a").touch()
        wait_for(lambda: "node completed b" in flow.stderr(), timeout=60,
                 what="b completed during the outage", alive=flow.proc)  # fmt: skip
        assert flow.proc.poll() is None  # waiting to write its end, not failed
        admin.execute(f"ALTER ROLE {ROLE} LOGIN")
        assert flow.finish(timeout=60) == 0, flow.stderr()
        err = flow.stderr()
        assert err.count(lost) == 2, err  # once per outage, not once per try
        assert err.count("reconnected to the state database") == 2, err
        assert control(flow.home, control_id).result == "applied"
        assert _steered(flow) == ["meanwhile"]  # once, not twice
        with StateDB.open(flow.home, create=False) as db:
            row = db.get_session(flow.result()["session_id"])
        assert row is not None and row.status == "completed"
    finally:
        admin.execute(f"ALTER ROLE {ROLE} LOGIN")
        admin.close()
        _end(flow)


@pytest.mark.timeout(120)
def test_a_full_server_is_waited_for_and_a_refusal_names_the_reason(
    tmp_path: Path,
    small_pg: SmallServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    args = _plan(tmp_path)
    monkeypatch.setenv(STATE_DB_URL_ENV, small_pg.url)
    done = tmp_path / "done"  # a flow that finished before the server filled up
    code, out = cli_in_process(done, "flow", *args, "--json")
    assert code == 0, out
    finished = json.loads(out)
    fillers: list[psycopg.Connection[Any]] = []
    try:
        while True:  # take every slot an ordinary role may have
            try:
                fillers.append(psycopg.connect(small_pg.url, autocommit=True))
            except psycopg.OperationalError:
                break
        # Its result is read back from the checkpoint: no wait, no "cannot be read".
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            text = flow_result_text(done, finished["run_dir"])
        assert text == finished["result"] and err.getvalue() == ""
        # Never admitted (here in this process): it exits 1 before anything is paid,
        # naming the server's reason.
        home = tmp_path / "refused"
        monkeypatch.setenv(DB_CONNECT_TIMEOUT_ENV, "0.5")
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(["--home", str(home), "flow", *args])
        assert code == 1, err.getvalue()
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        assert len(lines) == 1, lines
        assert "did not admit this process within 0.5 s" in lines[0], lines
        assert "remaining connection slots are reserved" in lines[0], lines
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(said) == 1, said  # one progress line, not one per try
        assert "does not admit this process yet" in said[0], said
        assert not (home / "script-invocations.jsonl").exists()
        # Admitted late (a real flow process): one progress line, then the run as usual.
        monkeypatch.delenv(DB_CONNECT_TIMEOUT_ENV)
        waiting = _start(tmp_path / "waiting", args, small_pg.url, **{DB_CONNECT_TIMEOUT_ENV: "60"})
        try:
            wait_for(lambda: "does not admit this process yet" in waiting.stderr(), timeout=60,
                     what="the progress line", alive=waiting.proc)  # fmt: skip
            fillers.pop().close()
            wait_for((waiting.home / "started-a").exists, timeout=60, what="a in flight",
                     alive=waiting.proc)  # fmt: skip
            (waiting.home / "release-a").touch()
            assert waiting.finish(timeout=60) == 0, waiting.stderr()
            assert waiting.stderr().count("does not admit this process yet") == 1
        finally:
            _end(waiting)
    finally:
        for conn in fillers:
            conn.close()


# 10 flow processes and 10 ctl on 2 cores: ~11 s idle, 25-40 s under load. In the default
# run: issue 44 asks for it in .ci/run (decision 363).
@pytest.mark.timeout(180)
def test_ten_flows_on_a_twenty_connection_server_all_complete_and_steer(
    tmp_path: Path, small_pg: SmallServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STATE_DB_URL_ENV, small_pg.admin_url)  # the test's own reads
    args = _plan(tmp_path)
    flows = [_start(tmp_path / f"h{i}", args, small_pg.url) for i in range(FLOWS)]
    try:
        for flow in flows:
            wait_for((flow.home / "started-a").exists, timeout=90, what="a in flight",
                     alive=flow.proc)  # fmt: skip
        counts = _connections(small_pg.admin_url)
        assert {f"steerflow:{f.proc.pid}" for f in flows} <= set(counts)
        assert all(counts[f"steerflow:{f.proc.pid}"] == 1 for f in flows), counts
        texts = [f"steer flow {i}" for i in range(FLOWS)]
        ids = _ctl_many(
            small_pg.url,
            [(f.home, ["msg", _run_id(f), t]) for f, t in zip(flows, texts, strict=True)],
        )
        # A message reaches the operation that starts after its flow took it: each flow's
        # poller has claimed its message ("applying:...") before a is let go. Under load the
        # claim can trail the ctl by a tick, and b would then start without it.
        for flow, control_id in zip(flows, ids, strict=True):
            wait_for(lambda h=flow.home, c=control_id: control(h, c).result, timeout=60,
                     what="the message claimed by its flow", alive=flow.proc)  # fmt: skip
        for flow in flows:
            (flow.home / "release-a").touch()
        for flow, text in zip(flows, texts, strict=True):
            assert flow.finish(timeout=90) == 0, flow.stderr()
            # Applied once, to this flow only; and no line about retrying or polling.
            assert _steered(flow) == [text], flow.responses()
            assert "retrying" not in flow.stderr() and "polling" not in flow.stderr()
    finally:
        for flow in flows:
            _end(flow)
