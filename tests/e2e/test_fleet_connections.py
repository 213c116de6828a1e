"""A team's flows on one PostgreSQL server (issue 44): one connection each, and a full
server or a dropped connection is a wait, not a failure.

Real ``steerflow flow`` processes (``gated_cli.py``: a node held on a release file, so
no test waits on a delay) on real servers: the suite's shared one for the per-process
count, and one started here with ``max_connections=20`` whose flows log in as an
ordinary role (the server keeps 3 slots for superusers, so 17 are theirs).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from ctl_support import (
    HERE,
    LiveFlow,
    clean_env,
    control,
    live_flow,
    run_cli,
    steer_lines,
    wait_for,
    write_yaml,
)

from pg_support import PgServer, pg_server
from steerflow.state import DB_CONNECT_TIMEOUT_ENV, STATE_DB_URL_ENV, StateDB

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


@pytest.mark.timeout(120)
def test_a_flow_process_holds_one_server_connection(
    tmp_path: Path, pg: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = pg.new_database()
    monkeypatch.setenv(STATE_DB_URL_ENV, url)  # the test's own reads
    flow = _start(tmp_path / "home", _plan(tmp_path), url)
    try:
        wait_for((flow.home / "started-a").exists, timeout=60, what="a in flight", alive=flow.proc)
        wait_for(_run_id(flow).__len__, what="the run directory", alive=flow.proc)
        # The poller is active (it LISTENs) before the executor starts a: a control now
        # is taken on its notification, over the same connection.
        (control_id,) = _ctl_many(url, [(flow.home, ["msg", _run_id(flow), "one connection"])])
        mine = f"steerflow:{flow.proc.pid}"
        # The runner, the poller, its LISTEN, the lease keeper and the node publisher.
        assert _connections(pg.url())[mine] == 1
        status = run_cli(flow.home, "runs", "--json", env={STATE_DB_URL_ENV: url})
        assert status.returncode == 0, status.stderr
        shown = run_cli(flow.home, "show", _run_id(flow), "--json", env={STATE_DB_URL_ENV: url})
        assert shown.returncode == 0, shown.stderr
        # runs, show and ctl closed theirs on exit: only the flow's is left.
        assert {k: v for k, v in _connections(pg.url()).items() if k.startswith("steerflow")} == {
            mine: 1
        }
        (flow.home / "release-a").touch()
        assert flow.finish(timeout=60) == 0, flow.stderr()
        assert _steered(flow) == ["one connection"]
        assert control(flow.home, control_id).result == "applied"
    finally:
        _end(flow)


@pytest.mark.slow  # 10 flow processes and 10 ctl on 2 cores: ~25 s (docs/testing.md)
@pytest.mark.timeout(180)
def test_ten_flows_on_a_twenty_connection_server_all_complete_and_steer(
    tmp_path: Path, small_pg: SmallServer
) -> None:
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
        _ctl_many(
            small_pg.url,
            [(f.home, ["msg", _run_id(f), t]) for f, t in zip(flows, texts, strict=True)],
        )
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


@pytest.mark.timeout(120)
def test_a_full_server_is_waited_for_and_a_refusal_names_the_reason(
    tmp_path: Path, small_pg: SmallServer
) -> None:
    fillers: list[psycopg.Connection[object]] = []
    try:
        while True:  # take every slot an ordinary role may have
            try:
                fillers.append(psycopg.connect(small_pg.url, autocommit=True))
            except psycopg.OperationalError:
                break
        args = _plan(tmp_path)
        # Never admitted: it exits before anything is paid, with the server's reason.
        refused = _start(tmp_path / "refused", args, small_pg.url, **{DB_CONNECT_TIMEOUT_ENV: "1"})
        try:
            assert refused.finish(timeout=60) == 1
            err = refused.stderr()
            assert "did not admit this process within 1 s" in err, err
            assert "remaining connection slots are reserved" in err or "too many clients" in err
            assert not (refused.home / "script-invocations.jsonl").exists()
            assert not (refused.home / "started-a").exists()
        finally:
            _end(refused)
        # Admitted late: one progress line, then the run as usual.
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


@pytest.mark.timeout(120)
def test_a_flow_whose_connection_is_killed_reconnects_and_applies_the_queued_control_once(
    tmp_path: Path, small_pg: SmallServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STATE_DB_URL_ENV, small_pg.admin_url)  # the test's own reads
    flow = _start(tmp_path / "home", _plan(tmp_path), small_pg.url)
    admin = psycopg.connect(small_pg.admin_url, autocommit=True)
    try:
        wait_for((flow.home / "started-a").exists, timeout=60, what="a in flight", alive=flow.proc)
        run_id = _run_id(flow)
        # Its connection goes, and it may not log in again until the control is queued.
        admin.execute(f"ALTER ROLE {ROLE} NOLOGIN")
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (f"steerflow:{flow.proc.pid}",),
        ).fetchall()
        assert killed == [(True,)]
        said = "lost the connection to the state database"
        wait_for(lambda: said in flow.stderr(), timeout=30, what="the flow to say so",
                 alive=flow.proc)  # fmt: skip
        (control_id,) = _ctl_many(small_pg.admin_url, [(flow.home, ["msg", run_id, "meanwhile"])])
        assert flow.proc.poll() is None  # still running, on its checkpoint
        assert control(flow.home, control_id).result is None  # nobody could take it
        admin.execute(f"ALTER ROLE {ROLE} LOGIN")
        # Claimed once it is back (a message is stamped when b takes it, after a ends).
        wait_for(lambda: control(flow.home, control_id).result, timeout=60,
                 what="the control claimed after the reconnect", alive=flow.proc)  # fmt: skip
        assert _connections(small_pg.admin_url)[f"steerflow:{flow.proc.pid}"] == 1
        (flow.home / "release-a").touch()
        assert flow.finish(timeout=60) == 0, flow.stderr()
        err = flow.stderr()
        assert err.count("lost the connection to the state database") == 1, err
        assert err.count("reconnected to the state database") == 1, err
        assert control(flow.home, control_id).result == "applied"
        assert _steered(flow) == ["meanwhile"]  # once, not twice
    finally:
        admin.execute(f"ALTER ROLE {ROLE} LOGIN")
        admin.close()
        _end(flow)


@pytest.mark.timeout(120)
def test_a_flow_runs_on_through_an_outage_and_writes_its_end_once_the_server_is_back(
    tmp_path: Path, small_pg: SmallServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STATE_DB_URL_ENV, small_pg.admin_url)  # the test's own reads
    flow = _start(tmp_path / "home", _plan(tmp_path), small_pg.url)
    admin = psycopg.connect(small_pg.admin_url, autocommit=True)
    try:
        wait_for((flow.home / "started-a").exists, timeout=60, what="a in flight", alive=flow.proc)
        admin.execute(f"ALTER ROLE {ROLE} NOLOGIN")
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (f"steerflow:{flow.proc.pid}",),
        )
        (flow.home / "release-a").touch()
        # Both nodes run and are checkpointed while the server keeps it out.
        wait_for(lambda: "node completed b" in flow.stderr(), timeout=60,
                 what="b completed during the outage", alive=flow.proc)  # fmt: skip
        assert flow.proc.poll() is None  # waiting to write its end, not failed
        admin.execute(f"ALTER ROLE {ROLE} LOGIN")
        assert flow.finish(timeout=60) == 0, flow.stderr()
        assert flow.result()["status"] == "completed"
        with StateDB.open(flow.home, create=False) as db:
            row = db.get_session(flow.result()["session_id"])
        assert row is not None and row.status == "completed"
        assert flow.stderr().count("lost the connection to the state database") == 1
    finally:
        admin.execute(f"ALTER ROLE {ROLE} LOGIN")
        admin.close()
        _end(flow)
