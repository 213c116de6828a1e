"""A fleet of flows on one PostgreSQL: control latency, DB writes per flow, server CPU (issue 27).

Workload: N simulated flows, spread over ``--procs`` worker processes (asyncio tasks in
each), against one throw-away PostgreSQL server on this machine (started as
tests/pg_support.py does: initdb + pg_ctl, as the ``postgres`` user when root; or
``--postgres URL``). Each flow is the real run machinery minus the model and the
checkpoint file:

- a real session row (``StateDB.create_session``, lease and all);
- the real heartbeat: ``orchestrate.LeaseKeeper`` renewing the lease every quarter lease
  (``lease`` rows), or the old ``db.heartbeat`` every 2 s (``baseline`` rows: the code
  before issue 27, whose poller also re-listed every 2 s under LISTEN);
- the real ``control.ControlPoller`` acting on a real ``executor.Steering`` (pause gate),
  woken by LISTEN/NOTIFY;
- a real ``executor.FlowExecutor`` running a 60-node plan at concurrency 2 whose provider
  sleeps 5-15 s per call (an LLM call), with the lease as its fence in ``lease`` rows;
- the real ``orchestrate.NodePublisher`` writing node status (fenced by the lease epoch in
  ``lease`` rows).

A real flow process holds three connections (its own, its poller's, the poller's LISTEN);
1,000 of them would be 3,000 server backends, more than this machine has memory for. So
each worker process shares a few: its flows' heartbeats and publishers go through
``--conns`` ``StateDB`` objects (round robin), their pollers through ``--poll-conns``
more, each with one LISTEN connection that dispatches to its pollers by session id, and
the process's thread pool is widened to 32 threads. The statements, their number and the
server's work per statement are a real fleet's; what differs is how many idle backends
the server keeps, and that a shared connection serializes its flows' statements.

Control latency: a real ``python -m steerflow ctl pause|resume SESSION`` subprocess per
sample, on a random flow, one at a time with a random pause; latency is the row's
``applied_at`` (stamped by the worker's poller) minus the moment this process saw the ctl
process exit (``time.time()``, one host, one clock). DB writes: every write transaction
the flows committed, counted in the workers by kind (heartbeat/lease renewal, node status,
poller: phase, stamps, metadata), per flow per second over the measurement window; the
server's row writes (``pg_stat_user_tables``: inserts + updates + deletes) over the same
window. Server CPU: utime + stime of the postmaster and all its children
(``/proc/<pid>/stat``) over the window, as a share of one core. Goal: 1,000 flows with
control p99 < 200 ms on this 2-core machine; reported, never asserted.

Real processes (issue 44, ``--real 90``): a row of real ``steerflow flow`` processes, one
server connection each, on a server of its own at ``max_connections=100``; see
benchmarks/_fleet_real.py. ``--flows ''`` leaves the simulated rows out.

Usage: ``python benchmarks/fleet_pg.py [--flows 100,1000] [--procs 4] [--samples 40]
[--window 40] [--no-baseline] [--postgres URL] [--real 90] [--real-samples 40]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NODES = 60  # at concurrency 2 and 10 s a call, 300 s of work: longer than a row
CONCURRENCY = 2
CALL_S = (5.0, 15.0)
FORCED_LIST_S = float(os.environ.get("FLEET_FORCED_LIST_S", "0"))  # 0: the poller default
THREADS = 32  # worker threads per worker process (asyncio.to_thread)
LEGACY_HEARTBEAT_S = 2.0  # what the heartbeat did before leases
LEGACY_FORCED_LIST_S = 2.0  # the poller's safety-net listing before decision 124
GOAL_P99_S = 0.2


# -- the worker: N/P simulated flows in one process -----------------------------------------


def _worker_main(args: argparse.Namespace) -> None:
    asyncio.run(_worker(args))


async def _worker(args: argparse.Namespace) -> None:
    from steerflow.state import StateDB

    url, mode = args.url, args.mode
    # A real flow has a thread pool and connections of its own; here a few hundred flows
    # share them, so the pool is widened to keep that sharing from queueing their calls.
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=THREADS))
    dbs = [StateDB.open_url(url) for _ in range(int(args.conns))]
    poll_dbs = [StateDB.open_url(url) for _ in range(int(args.poll_conns))]
    counts: Counter[str] = Counter()
    for db in [*dbs, *poll_dbs]:
        _count_writes(db, counts)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    home = Path(args.home)
    sessions: list[str] = []
    flows = [
        _Flow(dbs[i % len(dbs)], poll_dbs[i % len(poll_dbs)], home, mode) for i in range(args.count)
    ]
    ready = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        for flow in flows:
            tg.create_task(flow.run(stop, sessions, ready, len(flows)))
        await ready.wait()
        text = "\n".join(sessions) + "\n"
        await asyncio.to_thread(Path(args.sessions).write_text, text)
        marks: dict[str, Any] = {}
        lags: list[float] = []
        reader = tg.create_task(_commands(marks, counts, flows, lags))
        ticker = tg.create_task(_loop_lag(lags))
        await stop.wait()
        reader.cancel()
        ticker.cancel()
    print(json.dumps(marks), flush=True)
    for db in [*dbs, *poll_dbs]:
        db.close()


async def _loop_lag(lags: list[float]) -> None:
    """How late a 50 ms timer fires: the worker's event loop is saturated when it grows."""
    while True:
        due = time.monotonic() + 0.05
        await asyncio.sleep(0.05)
        lags.append(time.monotonic() - due)


async def _commands(
    marks: dict[str, Any], counts: Counter[str], flows: list[_Flow], lags: list[float]
) -> None:
    """``mark NAME`` on stdin: snapshot the write counters (the window's two ends)."""
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    while line := await reader.readline():
        name = line.decode().strip()
        fence_waits = sum(f.keeper.waited for f in flows if f.keeper is not None)
        if name == "start":
            lags.clear()
        window = sorted(lags) or [0.0]
        marks[name] = {
            "t": time.time(),
            "counts": dict(counts),
            "fence_waits": fence_waits,
            "lag_p99": window[int(0.99 * (len(window) - 1))],
            "cpu": time.process_time(),
        }


def _count_writes(db: Any, counts: Counter[str]) -> None:
    """Count every write transaction this StateDB commits, by what the flow was doing."""
    kinds = {
        "renew_lease": "heartbeat",
        "heartbeat": "heartbeat",
        "upsert_nodes": "node_status",
        "set_session_phase": "poller",
        "claim_control": "poller",
        "finalize_control": "poller",
        "update_node_metadata": "poller",
    }
    for name, kind in kinds.items():
        original = getattr(db, name)

        def counted(*a: Any, _original: Any = original, _kind: str = kind, **kw: Any) -> Any:
            result = _original(*a, **kw)
            counts[_kind] += 1
            return result

        setattr(db, name, counted)


class _Sleeper:
    """The model: each call takes 5-15 s and answers a short text."""

    spec = "sleep"
    cancel_at_deadline = False
    needs_artifact_dir = False

    async def invoke(self, request: Any) -> Any:
        from steerflow.providers import ProviderResponse

        await asyncio.sleep(random.uniform(*CALL_S))
        return ProviderResponse(text=f"done {request.node_key}")


@dataclass
class _Flow:
    db: Any
    poll_db: Any
    home: Path
    mode: str
    keeper: Any = None

    async def run(
        self, stop: asyncio.Event, sessions: list[str], ready: asyncio.Event, count: int
    ) -> None:
        from steerflow.executor import EventBus, FlowExecutor, SharedContext, Steering, build_graph
        from steerflow.home import new_run_id
        from steerflow.orchestrate._lease import LeaseKeeper
        from steerflow.orchestrate._publish import NodePublisher
        from steerflow.plan import parse_plan

        await asyncio.sleep(random.uniform(0, 3))  # flows do not start in lockstep
        row = await asyncio.to_thread(
            lambda: self.db.create_session(kind="flow", run_id=new_run_id(time.time()))
        )
        sessions.append(row.id)
        if len(sessions) == count:
            ready.set()
        plan = parse_plan(
            {"plan": [{"agent_id": f"n{i:03d}", "instruction": "x"} for i in range(NODES)]},
            source="fleet",
        )
        graph = build_graph(plan)
        steering, events = Steering(SharedContext({})), EventBus()
        executor = FlowExecutor(
            graph, provider_for=lambda op: _Sleeper(),  # type: ignore[arg-type,return-value]
            run_id=row.run_id, home=self.home, artifact_dir=lambda key: self.home / key,
            concurrency=CONCURRENCY, gate=steering.gate, context=steering.context, events=events,
        )  # fmt: skip
        lease = self.mode == "lease"
        from steerflow.control import ControlPoller

        # The baseline is the code before issue 27: a 2 s heartbeat, no fence, and the
        # poller's 2 s safety-net listing (decision 124 made it 20 s under LISTEN).
        forced = FORCED_LIST_S or (LEGACY_FORCED_LIST_S if self.mode == "baseline" else 0)
        extra = {"forced_list": forced} if forced else {}
        poller = ControlPoller(self.home, row.id, steering, db=self.poll_db, **extra)
        publisher = NodePublisher(self.db, row.id, graph, epoch=row.lease_epoch if lease else None)
        events.subscribe(publisher.on_event)
        steering.gate.on_change.append(publisher.on_gate)
        steering.attach(executor.has_pending)
        done = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(poller.run())
            if lease:
                self.keeper = LeaseKeeper(self.db, row.id, row.lease_epoch)
                executor.fence = self.keeper
                tg.create_task(self.keeper.run(done))
            else:
                tg.create_task(_legacy_heartbeat(self.db, row.id, done))
            tg.create_task(publisher.run())
            publisher.snapshot_all()
            await poller.start_executing()
            runner = tg.create_task(executor.run())
            await stop.wait()
            executor.close_admission("SIGTERM", cancel_inflight=True)
            await runner
            steering.finish()
            await poller.stop()
            await publisher.close()
            done.set()


async def _legacy_heartbeat(db: Any, session_id: str, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await asyncio.to_thread(db.heartbeat, session_id)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LEGACY_HEARTBEAT_S):
                await stop.wait()


# -- the parent: server, workers, ctl samples, figures --------------------------------------


def _pg_cpu_ticks(data_dir: Path) -> int:
    """utime + stime (clock ticks) of the postmaster and every process it forked.

    Backends that exited (a ``ctl`` connection's) count through the postmaster's
    ``cutime``/``cstime``; those still running through their own.
    """
    master = int((data_dir / "postmaster.pid").read_text().split()[0])
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()
        pid, ppid = int(entry), int(fields[1])
        if pid == master:  # its own time and that of every child it reaped (cutime, cstime)
            total += sum(int(f) for f in fields[11:15])
        elif ppid == master:
            total += int(fields[11]) + int(fields[12])
    return total


def _row_writes(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COALESCE(SUM(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"
        ).fetchone()
    return int(row[0]) if row else 0


def _applied_at(url: str, control_id: str) -> float | None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT applied_at FROM session_controls WHERE id = %s", (control_id,)
        ).fetchone()
    return float(row[0]) if row and row[0] is not None else None


def _ctl_sample(home: Path, env: dict[str, str], url: str, session: str, verb: str) -> float:
    """A real ``steerflow ctl`` process: its exit (as this process saw it) -> ``applied_at``."""
    proc = subprocess.run(
        [sys.executable, "-m", "steerflow", "--home", str(home), "ctl", verb, session],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    exited = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"ctl {verb} {session}: exit {proc.returncode}: {proc.stderr}")
    return _wait_applied(url, proc.stdout.split()[0]) - exited


def _lib_sample(home: Path, url: str, session: str, verb: str) -> float:
    """The same writer as a library call (``steerflow.views``), timed from its start."""
    from steerflow import views

    started = time.time()
    writer = views.pause if verb == "pause" else views.resume
    return _wait_applied(url, writer(home, session, state_db=url)) - started


def _wait_applied(url: str, control_id: str) -> float:
    deadline = time.monotonic() + 30
    while (applied := _applied_at(url, control_id)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"control {control_id} was not applied within 30 s")
        time.sleep(0.005)
    return applied


def _percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered) * 1000, p99 * 1000


@dataclass
class Row:
    mode: str
    flows: int
    latencies: list[float]  # ctl process exit -> applied
    lib_latencies: list[float]  # library call start -> applied
    writes: Counter[str]
    window_s: float
    row_writes: int
    cpu_share: float
    fence_waits: int
    loop_lag_p99: float  # the worst worker's event-loop lag p99, seconds
    worker_cpu: float  # all workers' CPU, share of one core

    def line(self) -> str:
        p50, p99 = _percentiles(self.latencies)
        lib50, lib99 = _percentiles(self.lib_latencies)
        total = sum(self.writes.values())
        per_flow = total / self.flows / self.window_s
        share = self.writes["heartbeat"] / total if total else 0.0
        rows = self.row_writes / self.flows / self.window_s
        return (
            f"{self.mode:<8} {self.flows:>6} {len(self.latencies):>5} {p50:>8.1f} {p99:>8.1f}"
            f" {lib50:>8.1f} {lib99:>8.1f} {per_flow:>10.3f} {share:>8.0%} {rows:>9.3f}"
            f" {self.cpu_share:>7.0%} {self.worker_cpu:>7.0%} {self.loop_lag_p99 * 1000:>7.0f}"
            f" {self.fence_waits:>6} {self.window_s:>6.0f}"
        )


HEADER = (
    f"{'mode':<8} {'flows':>6} {'n':>5} {'ctl p50':>8} {'ctl p99':>8} {'lib p50':>8}"
    f" {'lib p99':>8} {'writes/f/s':>10} {'heartbt':>8} {'rows/f/s':>9} {'pg cpu':>7}"
    f" {'wrk cpu':>7} {'lag ms':>7} {'fence':>6} {'win s':>6}"
)
LEGEND = (
    "ctl: `steerflow ctl pause` process exit -> applied_at (ms; below 0: stamped before the"
    " ctl process finished exiting); lib: `steerflow.views.resume` call start -> applied_at;"
    " writes/f/s: write transactions per flow per second (heartbt: the heartbeat's share);"
    " rows/f/s: the server's row inserts+updates+deletes per flow per second; pg cpu: all"
    " server processes, share of one core; wrk cpu: the worker processes' CPU, same unit;"
    " lag: the worst worker's event-loop lag p99 (a 50 ms timer); fence: admissions that"
    " waited for a DB check; win: the measurement window"
)


def _run_row(args: argparse.Namespace, url: str, data_dir: Path | None, mode: str, n: int) -> Row:
    with tempfile.TemporaryDirectory(prefix="steerflow-fleet-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEERFLOW_")}
        env.update({"STEERFLOW_STATE_DB_URL": url, "PYTHONPATH": str(ROOT / "src")})
        _reset(url)
        procs = []
        share = [n // args.procs + (1 if i < n % args.procs else 0) for i in range(args.procs)]
        for i, count in enumerate(share):
            sessions = Path(tmp) / f"sessions-{i}"
            argv = [sys.executable, __file__, "--worker", "--url", url, "--mode", mode,
                    "--count", str(count), "--home", str(home), "--sessions", str(sessions),
                    "--conns", str(args.conns), "--poll-conns", str(args.poll_conns)]  # fmt: skip
            procs.append((subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           text=True, env=env), sessions))  # fmt: skip
        try:
            return _measure(args, url, data_dir, mode, n, home, env, procs)
        finally:
            for proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)


def _measure(
    args: argparse.Namespace,
    url: str,
    data_dir: Path | None,
    mode: str,
    n: int,
    home: Path,
    env: dict[str, str],
    procs: list[tuple[subprocess.Popen[str], Path]],
) -> Row:
    deadline = time.monotonic() + 300
    while not all(path.exists() for _, path in procs):
        if time.monotonic() > deadline or any(p.poll() is not None for p, _ in procs):
            raise RuntimeError("the workers did not start their flows")
        time.sleep(0.2)
    sessions = [s for _, path in procs for s in path.read_text().split()]
    time.sleep(args.warmup)  # every flow's calls, renewals and listings under way

    def mark(name: str) -> None:
        for proc, _ in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{name}\n")
            proc.stdin.flush()

    mark("start")
    t0, rows0 = time.time(), _row_writes(url)
    ticks0 = _pg_cpu_ticks(data_dir) if data_dir else 0
    latencies, lib = [], []
    for _ in range(args.samples):
        time.sleep(random.uniform(0.0, args.window / args.samples))
        session = random.choice(sessions)
        latencies.append(_ctl_sample(home, env, url, session, "pause"))
        lib.append(_lib_sample(home, url, session, "resume"))
    while time.time() - t0 < args.window:
        time.sleep(0.1)
    mark("end")
    window = time.time() - t0
    rows = _row_writes(url) - rows0
    ticks = (_pg_cpu_ticks(data_dir) - ticks0) if data_dir else 0
    cpu = ticks / os.sysconf("SC_CLK_TCK") / window if data_dir else float("nan")
    writes: Counter[str] = Counter()
    fence, lag, worker_cpu = 0, 0.0, 0.0
    for proc, _ in procs:
        proc.send_signal(signal.SIGTERM)
    for proc, _ in procs:
        out, _ = proc.communicate(timeout=120)
        marks = json.loads(out.strip().splitlines()[-1])
        writes.update(Counter(marks["end"]["counts"]) - Counter(marks["start"]["counts"]))
        fence += marks["end"]["fence_waits"] - marks["start"]["fence_waits"]
        lag = max(lag, marks["end"]["lag_p99"])
        worker_cpu += marks["end"]["cpu"] - marks["start"]["cpu"]
    return Row(mode, n, latencies, lib, writes, window, rows, cpu, fence, lag, worker_cpu / window)


def _reset(url: str) -> None:
    """An empty schema for the row: the state tables as a new fleet would create them."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for table in ("resume_claims", "session_nodes", "session_controls", "plays",
                      "invocations", "sessions"):  # fmt: skip
            with contextlib.suppress(psycopg.Error):
                conn.execute(f"DELETE FROM {table}")  # type: ignore[arg-type]
    from steerflow.state import StateDB

    StateDB.open_url(url).close()  # migrates an empty database


@contextlib.contextmanager
def _server(given: str | None) -> Iterator[tuple[str, Path | None]]:
    if given:
        yield given, None
        return
    sys.path.insert(0, str(ROOT / "tests"))
    from pg_support import pg_server

    with pg_server() as server:
        server.psql('CREATE DATABASE "fleet" TEMPLATE template0')
        yield server.url("fleet"), server.data_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flows", default="100,1000")
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--conns", type=int, default=8, help="flows' StateDBs per worker")
    parser.add_argument("--poll-conns", type=int, default=2, help="pollers' StateDBs per worker")
    parser.add_argument("--samples", type=int, default=40, help="pause+resume pairs per row")
    parser.add_argument("--window", type=float, default=40.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--postgres")
    parser.add_argument(
        "--real",
        type=int,
        default=0,
        help="also a row of this many real `steerflow flow` processes (90)",
    )
    parser.add_argument(
        "--real-samples", type=int, default=40, help="ctl pause+resume pairs in the real row"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("--url", "--mode", "--count", "--home", "--sessions"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.count = int(args.count)
        _worker_main(args)
        return
    sys.path.insert(0, str(ROOT / "src"))
    modes = ["lease"] if args.no_baseline else ["baseline", "lease"]
    print(f"fleet_pg: {os.cpu_count()} CPUs, {args.procs} worker processes x {args.conns}+"
          f"{args.poll_conns}x2 connections, {NODES}-node plans at concurrency {CONCURRENCY}, calls"
          f" {CALL_S[0]:g}-{CALL_S[1]:g} s, window {args.window:g} s after {args.warmup:g} s;"
          f" latency = real `steerflow ctl` exit -> applied_at")  # fmt: skip
    print(HEADER)
    flows = [int(x) for x in args.flows.split(",") if x.strip() and int(x) > 0]
    with _server(args.postgres) as (url, data_dir):
        os.environ["STEERFLOW_STATE_DB_URL"] = url  # the library samples' writer
        for n in flows:
            for mode in modes:
                load = os.getloadavg()[0]
                row = _run_row(args, url, data_dir, mode, n)
                print(row.line(), flush=True)
                print(f"         machine load average before the row: {load:.1f}", flush=True)
                print(f"         writes by kind: {dict(row.writes)}", flush=True)
    os.environ.pop("STEERFLOW_STATE_DB_URL", None)
    if args.real:
        sys.path.insert(0, str(ROOT / "tests"))
        from _fleet_real import REAL_CALL_S, REAL_NODES, real_row

        from pg_support import pg_server

        print(f"real: {args.real} `steerflow flow` processes at once, {REAL_NODES} nodes each at"
              f" concurrency 2, script calls {REAL_CALL_S[0]:g}-{REAL_CALL_S[1]:g} s; ctl p50/p99:"
              " real `steerflow ctl pause|resume` exit -> applied_at (ms)")  # fmt: skip
        for line in real_row(args.real, args.real_samples, pg_server, ROOT):
            print(line, flush=True)
    print(LEGEND)
    print(f"goal: 1,000 flows, control p99 < {GOAL_P99_S * 1000:.0f} ms (reported, not asserted)")


if __name__ == "__main__":
    main()
