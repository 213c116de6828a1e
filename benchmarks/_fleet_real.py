"""The real-process row of fleet_pg.py (issue 44): N real ``steerflow flow`` processes.

Each process is a real flow (steerflow's CLI, ``flow``) of ``REAL_NODES`` independent
nodes at concurrency 2 on the ``script:`` model, every call 5-15 s (a delay drawn per
node), on a server started with ``max_connections=100`` (the default) whose flows log in
as an ordinary role, so the 3 superuser slots are not theirs: 97 are. The calls wait for
one start line (``_fleet_flow.py``) until every flow is running, each holding its
connection: on a loaded 2-core machine the first flows would otherwise end before the
last had started, and "N at once" would not be true. Control: a real
``steerflow ctl pause`` then ``ctl resume`` process on a random running flow, one at a
time; latency is the row's ``applied_at`` minus the moment this process saw ``ctl`` exit
(one host, one clock). The server's client connections are sampled every 0.5 s (peak
reported, and per flow process by ``application_name``). Every flow must exit 0.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent

REAL_NODES = 12  # at concurrency 2 and 10 s a call: ~60 s of work per flow
REAL_CALL_S = (5.0, 15.0)
ROLE = "fleet"


def _connections(admin_url: str) -> tuple[int, int, int]:
    """(all client backends, steerflow ones, the most any one steerflow process holds)."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, COUNT(*) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            " GROUP BY application_name"
        ).fetchall()
    ours = [int(n) for name, n in rows if str(name).startswith("steerflow:")]
    return sum(int(n) for _, n in rows), sum(ours), max(ours, default=0)


def _running(admin_url: str) -> list[str]:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute("SELECT id FROM sessions WHERE status = 'running'").fetchall()
    return [str(r[0]) for r in rows]


def _applied_at(admin_url: str, control_id: str) -> float:
    import psycopg

    deadline = time.monotonic() + 30
    while True:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT applied_at FROM session_controls WHERE id = %s", (control_id,)
            ).fetchone()
        if row and row[0] is not None:
            return float(row[0])
        if time.monotonic() > deadline:
            raise RuntimeError(f"control {control_id} was not applied within 30 s")
        time.sleep(0.005)


def _ctl(home: Path, env: dict[str, str], admin_url: str, verb: str, session: str) -> float:
    proc = subprocess.run(
        [sys.executable, "-m", "steerflow", "--home", str(home), "ctl", verb, session],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    exited = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"ctl {verb} {session}: exit {proc.returncode}: {proc.stderr}")
    return _applied_at(admin_url, proc.stdout.split()[0]) - exited


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


def real_row(count: int, samples: int, pg_server: Callable[..., object], root: Path) -> list[str]:
    """Run the row; the lines to print."""
    with pg_server(max_connections=100) as server, tempfile.TemporaryDirectory() as tmp:
        server.psql(f"CREATE ROLE {ROLE} LOGIN")  # type: ignore[attr-defined]
        server.psql(f"CREATE DATABASE {ROLE} OWNER {ROLE} TEMPLATE template0")  # type: ignore[attr-defined]
        port = server.port  # type: ignore[attr-defined]
        url = f"postgresql://{ROLE}@127.0.0.1:{port}/{ROLE}"
        admin_url = server.url(ROLE)  # type: ignore[attr-defined]
        from steerflow.state import StateDB

        StateDB.open_url(url).close()  # the tables, as the flows' role (it owns them)
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEERFLOW_")}
        env.update({"STEERFLOW_STATE_DB_URL": url, "PYTHONPATH": str(root / "src")})
        base = Path(tmp)
        keys = [f"n{i:02d}" for i in range(REAL_NODES)]
        plan = base / "plan.yaml"
        plan.write_text(yaml.safe_dump({"plan": [
            {"agent_id": k, "instruction": f"task {k}"} for k in keys]}))  # fmt: skip
        procs = []
        barrier = base / "go"
        started = time.monotonic()
        for i in range(count):
            home = base / f"h{i:03d}"
            home.mkdir(mode=0o700)
            script = base / f"script{i:03d}.yaml"
            script.write_text(yaml.safe_dump(
                {k: {"delay": round(random.uniform(*REAL_CALL_S), 2)} for k in keys}))  # fmt: skip
            argv = [sys.executable, str(HERE / "_fleet_flow.py"), str(barrier), "--home",
                    str(home), "flow", "--plan",
                    str(plan), "--model", f"script:{script}", "--concurrency", "2"]  # fmt: skip
            err = open(base / f"flow{i:03d}.err", "w")  # noqa: SIM115
            procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env))
        peak = (0, 0, 0)
        seen_running = 0
        latencies: list[float] = []
        try:
            # Every flow running (its session row, its one connection) before any call.
            while len(running := _running(admin_url)) < count:
                peak = max(peak, _connections(admin_url))
                if time.monotonic() - started > 900 or any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"only {len(running)} of {count} flows started")
                time.sleep(0.5)
            all_up = time.monotonic() - started
            at_once = _connections(admin_url)
            peak = max(peak, at_once)
            seen_running = count
            barrier.touch()
            for _ in range(samples):
                running = _running(admin_url)
                seen_running = max(seen_running, len(running))
                peak = max(peak, _connections(admin_url))
                if not running:
                    break
                session = random.choice(running)
                latencies.append(_ctl(base / "h000", env, admin_url, "pause", session))
                latencies.append(_ctl(base / "h000", env, admin_url, "resume", session))
            while any(p.poll() is None for p in procs):
                peak = max(peak, _connections(admin_url))
                seen_running = max(seen_running, len(_running(admin_url)))
                if time.monotonic() - started > 900:
                    raise RuntimeError("the flows did not finish within 900 s")
                time.sleep(0.5)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)
        codes = [p.returncode for p in procs]
        done = sum(1 for c in codes if c == 0)
        waited = sum(
            1 for i in range(count)
            if "does not admit" in (base / f"flow{i:03d}.err").read_text()
        )  # fmt: skip
        lost = sum(
            1 for i in range(count)
            if "lost the connection" in (base / f"flow{i:03d}.err").read_text()
        )  # fmt: skip
        elapsed = time.monotonic() - started
        p50 = statistics.median(latencies) * 1000
        return [
            f"{'real':<8} {count:>6} {len(latencies):>5} {p50:>8.1f}"
            f" {_p(latencies, 0.99):>8.1f}   completed {done}/{count} (exit codes"
            f" {sorted(set(codes))}), {elapsed:.0f} s ({all_up:.0f} s until all were running)",
            f"         with all {count} running: client connections {at_once[0]} (steerflow"
            f" {at_once[1]}, at most {at_once[2]} per flow process)",
            f"         server max_connections=100 (97 for the flows' role): peak client"
            f" connections {peak[0]} (steerflow {peak[1]}, at most {peak[2]} per flow process);"
            f" flows running at once (peak) {seen_running}; waited for admission {waited};"
            f" lost a connection {lost}",
        ]
