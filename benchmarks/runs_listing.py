"""``runs --json`` over a state DB of 10,000 sessions, on SQLite and on PostgreSQL (issue 15).

Target: the listing costs under 0.5 s of server time on both backends.

Seeding: one home's state DB is built through the public ``StateDB`` API, one call per
row as a flow makes them (``create_session`` with its owner, ``create_invocation``, status
and ``update_node_metadata`` with ``finished_at``/``usage``, ``upsert_nodes``), on SQLite;
the API has no bulk insert, so PostgreSQL gets the same rows through ``copy_state`` (what
``steerflow db copy --to URL`` runs). Per session: one invocation; statuses mixed
(completed, failed, timed_out, stopped, interrupted, and running: half owned by this live
benchmark process, half by a dead pid, so ``effective_status`` reads them interrupted);
every 10th session has 5 ``session_nodes`` with call detail; every 20th resumes an
earlier run (``resume_claims``; one in two a ``--fork``). PostgreSQL is a throw-away
server from the machine's binaries (tests/pg_support.py), or ``--postgres URL`` (an
empty database).

Measured per backend, the benchmark process already started and imported:

* ``list_runs(home, limit=None)``, the library call behind ``runs --all --json``
  (``steerflow.views``), repeated ``--repeats`` times: median and max of its whole wall
  time (open, queries, effective status, row objects), and of the time spent inside the
  state queries it issues ("DB queries": every ``StateDB`` opened meanwhile has its
  backend wrapped in a timer at the ``StateBackend`` protocol: execute plus fetch);
* on PostgreSQL, each of those queries again under ``EXPLAIN (ANALYZE, FORMAT JSON)``:
  the server's own planning + execution time, summed over the queries (median);
* the CLI a user runs: ``steerflow runs --all --json`` in a fresh child (interpreter
  start-up and JSON output included), median of 3, checked to list every session; and
  beside it the default ``runs --json`` (20 newest) as the baseline.

The verdict line compares the median DB-query time with the 0.5 s target, per backend.

Usage: ``python benchmarks/runs_listing.py [--sessions 10000 | --quick]
[--repeats 5] [--postgres URL | --no-postgres]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steerflow.home import new_run_id
from steerflow.state import (
    STATE_DB_URL_ENV,
    NodeUpdate,
    Owner,
    ResumeClaim,
    SessionStatus,
    StateDB,
    copy_state,
    this_host,
)
from steerflow.views import list_runs

SESSIONS = 10_000
QUICK_SESSIONS = 1_000
TARGET_S = 0.5
CLI_REPEATS = 3
# Finished statuses, by weight; the rest of each hundred is running (live or dead owner).
_FINISHED: tuple[tuple[SessionStatus, int], ...] = (
    ("completed", 60), ("failed", 10), ("timed_out", 3), ("stopped", 5), ("interrupted", 10),
)  # fmt: skip
_STATUS_CYCLE: list[SessionStatus] = [s for s, n in _FINISHED for _ in range(n)]
_STATUS_CYCLE += ["running"] * (100 - len(_STATUS_CYCLE))


@dataclass
class Figures:
    """What one backend measured."""

    label: str
    listed: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    listing_s: list[float] = field(default_factory=list)
    queries_s: list[float] = field(default_factory=list)
    query_count: int = 0
    explain_s: list[float] = field(default_factory=list)
    explain_detail: list[str] = field(default_factory=list)
    cli_all_s: list[float] = field(default_factory=list)
    cli_default_s: list[float] = field(default_factory=list)


def dead_pid() -> int:
    """The pid of a child that has exited (so no live process owns it, barring reuse)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def seed(db: StateDB, sessions: int) -> None:
    """Write ``sessions`` realistic sessions through the StateDB API (see the module doc)."""
    live = Owner.current()
    dead = Owner(host=this_host(), pid=dead_pid(), started_at=live.started_at)
    hosts = [live.host, "build-2", "build-3"]
    run_ids: list[str] = []
    statuses: list[SessionStatus] = []
    start = time.time() - sessions * 60.0  # one run a minute, oldest first
    for i in range(sessions):
        status = _STATUS_CYCLE[(i * 37) % 100]  # spread, not runs of one status
        run_id = new_run_id(start + i * 60.0)
        kind = "play" if i % 7 == 0 else "agent" if i % 11 == 0 else "flow"
        meta: dict[str, Any] = {"run_id": run_id, "poller": "stopped", "source": "plan"}
        resume = None
        if i >= 20 and i % 20 == 0:
            source = i - 10
            while statuses[source] == "running":  # a running source cannot be resumed
                source -= 1
            fork = i % 40 == 0
            meta |= {"resumed_from": run_ids[source], "resumed_from_run": run_ids[source]}
            resume = ResumeClaim(run_ids[source], fork=fork, has_checkpoint=lambda _r: False)
        if status == "running":
            owner = live if i % 2 == 0 else dead
        else:
            owner = Owner(host=hosts[i % 3], pid=10_000 + i, started_at=start + i * 60.0)
        row = db.create_session(
            kind=kind,
            prompt=f"benchmark run {i}: summarise the quarterly reports",
            run_id=run_id,
            node_metadata=meta,
            owner=owner,
            phase="executing",
            resume=resume,
        )
        invocation = db.create_invocation(session_id=row.id, kind=kind)
        if i % 10 == 0:
            db.upsert_nodes(
                row.id,
                [
                    NodeUpdate(
                        node_key=f"n{k}",
                        kind="planned",
                        status="completed" if status != "running" else "running",
                        assignee="analyst",
                        detail={
                            "model": "echo",
                            "started_at": start + i * 60.0,
                            "ended_at": start + i * 60.0 + 5,
                            "instruction": "x" * 200,
                        },
                    )
                    for k in range(5)
                ],
            )
        if status != "running":
            db.update_node_metadata(
                row.id,
                {
                    "finished_at": start + i * 60.0 + 42.0,
                    "usage": {"input_tokens": 1200, "output_tokens": 300, "cost_usd": 0.01},
                },
            )
            db.set_invocation_status(invocation.id, status)
            db.set_session_status(row.id, status)
        run_ids.append(run_id)
        statuses.append(status)


class _TimedTx:
    """A ``StateTransaction`` whose ``query`` calls are timed and recorded."""

    def __init__(self, tx: Any, log: _QueryLog) -> None:
        self._tx = tx
        self._log = log

    def query(self, sql: str, params: Sequence[object] = ()) -> list[dict[str, Any]]:
        return self._log.timed(self._tx.query, sql, params)

    def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        return int(self._tx.execute(sql, params))


class _TimedBackend:
    """A ``StateBackend`` whose reads (``query``, ``transaction``'s queries) are timed."""

    def __init__(self, backend: Any, log: _QueryLog) -> None:
        self._backend = backend
        self._log = log

    def query(self, sql: str, params: Sequence[object] = ()) -> list[dict[str, Any]]:
        return self._log.timed(self._backend.query, sql, params)

    @contextlib.contextmanager
    def transaction(self, *, write: bool) -> Iterator[_TimedTx]:
        with self._backend.transaction(write=write) as tx:
            yield _TimedTx(tx, self._log)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


@dataclass
class _QueryLog:
    seconds: float = 0.0
    statements: list[tuple[str, tuple[object, ...]]] = field(default_factory=list)

    def timed(
        self, run: Callable[..., list[dict[str, Any]]], sql: str, params: Sequence[object]
    ) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        try:
            return run(sql, params)
        finally:
            self.seconds += time.perf_counter() - t0
            self.statements.append((sql, tuple(params)))


@contextlib.contextmanager
def timed_queries() -> Iterator[_QueryLog]:
    """Wrap the backend of every StateDB opened inside the block in a query timer."""
    log = _QueryLog()
    original = StateDB.__init__

    def init(self: StateDB, backend: Any, *, path: Path | None = None) -> None:
        original(self, _TimedBackend(backend, log), path=path)

    StateDB.__init__ = init  # type: ignore[method-assign]
    try:
        yield log
    finally:
        StateDB.__init__ = original  # type: ignore[method-assign]


def _short(sql: str) -> str:
    return sql if len(sql) <= 60 else f"{sql[:57]}..."


def explain(url: str, statements: list[tuple[str, tuple[object, ...]]]) -> tuple[float, list[str]]:
    """Planning + execution time (s) the server reports for ``statements``; a line per text."""
    import psycopg

    total = 0.0
    # statement text -> [times run, ms, top plan node, rows]; the resume lookups repeat
    # one text per chunk of 500 run ids.
    by_text: dict[str, list[Any]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for sql, params in statements:
            portable = sql.replace("%", "%%").replace("?", "%s")
            row = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {portable}", params).fetchone()
            assert row is not None
            doc = json.loads(row[0]) if isinstance(row[0], str) else row[0]
            plan = doc[0]
            ms = float(plan["Planning Time"]) + float(plan["Execution Time"])
            total += ms / 1000
            seen = by_text.setdefault(sql, [0, 0.0, plan["Plan"]["Node Type"], 0])
            seen[0] += 1
            seen[1] += ms
            seen[3] += int(plan["Plan"].get("Actual Rows") or 0)
    lines = [
        f"{n:>3} x {_short(sql):<60} {ms:8.2f} ms  top node {node}, {rows} rows"
        for sql, (n, ms, node, rows) in by_text.items()
    ]
    return total, lines


def sqlite_plan(path: Path, statements: list[tuple[str, tuple[object, ...]]]) -> list[str]:
    """``EXPLAIN QUERY PLAN`` of each distinct statement text, one line each."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        counts: dict[str, int] = {}
        plans: dict[str, str] = {}
        for sql, params in statements:
            counts[sql] = counts.get(sql, 0) + 1
            if sql not in plans:
                steps = conn.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
                plans[sql] = "; ".join(str(s[-1]) for s in steps)
        return [f"{counts[sql]:>3} x {_short(sql):<60} {plan}" for sql, plan in plans.items()]
    finally:
        conn.close()


def cli_env(url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEERFLOW_")}
    if url is not None:
        env[STATE_DB_URL_ENV] = url
    return env


def run_cli(home: Path, url: str | None, *args: str) -> tuple[float, dict[str, Any]]:
    argv = [sys.executable, "-m", "steerflow", "--home", str(home), "runs", *args, "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=cli_env(url), check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"benchmark: {' '.join(argv[3:])} exited {proc.returncode}: {proc.stderr}")
    return wall, json.loads(proc.stdout)


@contextlib.contextmanager
def backend_env(url: str | None) -> Iterator[None]:
    """Point this process's StateDB at ``url`` (None: the home's SQLite file)."""
    saved = os.environ.pop(STATE_DB_URL_ENV, None)
    if url is not None:
        os.environ[STATE_DB_URL_ENV] = url
    try:
        yield
    finally:
        os.environ.pop(STATE_DB_URL_ENV, None)
        if saved is not None:
            os.environ[STATE_DB_URL_ENV] = saved


def measure(label: str, home: Path, url: str | None, sessions: int, repeats: int) -> Figures:
    fig = Figures(label)
    statements: list[tuple[str, tuple[object, ...]]] = []
    with backend_env(url):
        list_runs(home, limit=None)  # warm: imports, first connection, page cache
        for _ in range(repeats):
            with timed_queries() as log:
                t0 = time.perf_counter()
                rows = list_runs(home, limit=None)
                fig.listing_s.append(time.perf_counter() - t0)
            fig.queries_s.append(log.seconds)
            statements = log.statements
        fig.listed = len(rows)
        fig.query_count = len(statements)
        for r in rows:
            fig.statuses[r.status] = fig.statuses.get(r.status, 0) + 1
    if fig.listed != sessions:
        raise SystemExit(f"benchmark: {label}: list_runs listed {fig.listed} of {sessions}")
    if url is not None:
        for _ in range(repeats):
            seconds, fig.explain_detail = explain(url, statements)
            fig.explain_s.append(seconds)
    else:
        fig.explain_detail = sqlite_plan(home / "state.db", statements)
    for _ in range(CLI_REPEATS):
        wall, out = run_cli(home, url, "--all")
        if len(out["runs"]) != sessions:
            raise SystemExit(f"benchmark: {label}: runs --all listed {len(out['runs'])}")
        fig.cli_all_s.append(wall)
        wall, out = run_cli(home, url)
        fig.cli_default_s.append(wall)
    return fig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=SESSIONS)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SESSIONS:,} sessions")
    parser.add_argument("--repeats", type=int, default=5, help="list_runs calls per backend")
    parser.add_argument("--postgres", metavar="URL", help="an empty PostgreSQL database")
    parser.add_argument("--no-postgres", action="store_true", help="leave PostgreSQL out")
    args = parser.parse_args()
    sessions = QUICK_SESSIONS if args.quick else args.sessions
    started = time.monotonic()
    print(f"python {platform.python_version()} on {platform.platform()}, {os.cpu_count()} CPUs")
    figures: list[Figures] = []
    with tempfile.TemporaryDirectory(prefix="steerflow-runs-bench-") as tmp, ExitStack() as stack:
        home = Path(tmp) / "home"
        t0 = time.monotonic()
        with backend_env(None), StateDB.open(home) as db:
            seed(db, sessions)
        seeded = time.monotonic() - t0
        print(f"seeded {sessions:,} sessions through the StateDB API on SQLite in {seeded:.1f} s")
        figures.append(measure("SQLite", home, None, sessions, args.repeats))
        if not args.no_postgres:
            url = args.postgres
            if url is None:
                sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
                from pg_support import pg_server

                url = stack.enter_context(pg_server()).new_database()
            t0 = time.monotonic()
            with (
                backend_env(None),
                StateDB.open(home, create=False) as src,
                StateDB.open_url(url) as dst,
            ):
                report = copy_state(src, dst)
            print(
                f"copied to PostgreSQL with copy_state in {time.monotonic() - t0:.1f} s: "
                + ", ".join(f"{t} {n}" for t, n in report.rows.items())
            )
            figures.append(measure("PostgreSQL", home, url, sessions, args.repeats))
    print_table(figures, sessions, args.repeats)
    print(f"total runtime {time.monotonic() - started:.1f} s")
    return 0


def _ms(values: list[float], how: Callable[[list[float]], float]) -> str:
    return f"{how(values) * 1000:.1f} ms" if values else "-"


def print_table(figures: list[Figures], sessions: int, repeats: int) -> None:
    print()
    print(f"runs listing over {sessions:,} sessions (list_runs x{repeats}, CLI x{CLI_REPEATS})")
    rows: list[tuple[str, list[str]]] = [
        ("sessions listed", [str(f.listed) for f in figures]),
        ("state queries issued", [str(f.query_count) for f in figures]),
        ("DB queries, median", [_ms(f.queries_s, statistics.median) for f in figures]),
        ("DB queries, max", [_ms(f.queries_s, max) for f in figures]),
        ("server EXPLAIN ANALYZE, median", [_ms(f.explain_s, statistics.median) for f in figures]),
        ("list_runs total, median", [_ms(f.listing_s, statistics.median) for f in figures]),
        ("list_runs total, max", [_ms(f.listing_s, max) for f in figures]),
        ("CLI runs --all --json, median", [_ms(f.cli_all_s, statistics.median) for f in figures]),
        ("CLI runs --json (20), median", [_ms(f.cli_default_s, statistics.median)
                                          for f in figures]),
    ]  # fmt: skip
    width = 32
    print(f"{'':<{width}}" + "".join(f"{f.label:>16}" for f in figures))
    for name, cells in rows:
        print(f"{name:<{width}}" + "".join(f"{c:>16}" for c in cells))
    for f in figures:
        mix = ", ".join(f"{k} {v}" for k, v in sorted(f.statuses.items()))
        print(f"{f.label} effective statuses: {mix}")
        for line in f.explain_detail:
            print(f"  {f.label} plan (last pass): {line}")
    print("(DB queries: time inside the state queries list_runs issues, execute + fetch;")
    print(" list_runs total adds opening the DB, effective status and the row objects)")
    for f in figures:
        median = statistics.median(f.queries_s)
        verdict = "meets" if median < TARGET_S else "MISSES"
        extra = (
            f", server-side {statistics.median(f.explain_s) * 1000:.1f} ms" if f.explain_s else ""
        )
        print(
            f"{f.label}: DB time of the runs --all --json queries {median * 1000:.1f} ms"
            f"{extra} {verdict} the < {TARGET_S} s target"
            f" (whole list_runs {statistics.median(f.listing_s) * 1000:.1f} ms)"
        )


if __name__ == "__main__":
    sys.exit(main())
