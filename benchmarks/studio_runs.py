"""Studio runs list at scale (issue 32): the Runs page over a state DB of many sessions.

Workload: ``--runs`` sessions (default 10,000) written into a real ``state.db`` in one
transaction with the schema's own columns: a name each (``nightly <i>`` or ``adhoc <i>``),
statuses mixed (70 % completed, 20 % failed, 10 % interrupted-by-status), created one
second apart, and ``--nodes`` published node rows per session (default 5), so the page's
per-row progress read has rows to count.

Timed: a ``steerflow studio --port 0`` subprocess; each URL below ``--repeat`` times
(default 50) after one warm-up, over loopback HTTP with the token exchanged for the cookie
first; median and p99 wall time per request (server work plus one loopback round trip):

* ``/runs`` (newest 50), ``/runs?status=failed``, ``/runs?q=nightly 99`` (text filter),
  ``/runs?page=100`` (offset 5,000), ``/api/runs`` (the live poll, cached under its tag:
  the first read after a commit is what the page pays).

Baselines in the same run: ``GET /favicon.ico`` (204, no read: the round trip and the
access gate alone), ``GET /static/studio.css`` (a constant 4.6 KB body, no read: on this
loopback a response with a body costs ~40 ms of TCP delayed-ACK wait between uvicorn and
httpx, whatever the page does) and ``steerflow.views.list_runs(limit=50)`` in this
process (the list read without HTTP or rendering). Target: every page under 300 ms at
10,000 runs.

The last line is ``STUDIO_RUNS runs=<n> runs_p50_ms=.. runs_p99_ms=.. worst_p99_ms=..``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

from steerflow import views
from steerflow.state import StateDB

URLS = ("/runs", "/runs?status=failed", "/runs?q=nightly+99", "/runs?page=100", "/api/runs")


def fill(home: Path, runs: int, nodes: int) -> None:
    """``runs`` sessions and their node rows, written in one transaction."""
    start = time.time() - runs
    statuses = ["completed"] * 7 + ["failed"] * 2 + ["interrupted"]
    with StateDB.open(home) as db, db.backend.transaction(write=True) as tx:
        for i in range(runs):
            sid = uuid.uuid4().hex
            at = start + i
            name = f"nightly {i}" if i % 2 else f"adhoc {i}"
            tx.execute(
                "INSERT INTO sessions (id, kind, status, phase, created_at, updated_at,"
                " node_metadata, run_id, heartbeat_at, name) VALUES (?, 'flow', ?,"
                " 'executing', ?, ?, '{}', ?, ?, ?)",
                (sid, statuses[i % 10], at, at + 0.5,
                 time.strftime("%Y%m%dT%H%M%S", time.gmtime(at)) + f"-{i % 16**6:06x}",
                 at + 0.5, name),
            )  # fmt: skip
            for n in range(nodes):
                detail = json.dumps({"model": "echo", "started_at": at, "ended_at": at + 0.1})
                tx.execute(
                    "INSERT INTO session_nodes (session_id, node_key, kind, status, updated_at,"
                    " detail) VALUES (?, ?, 'planned', 'completed', ?, ?)",
                    (sid, f"n{n}", at, detail),
                )


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]


def studio(home: Path, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    out = work / "studio.out"
    with open(out, "w") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "steerflow", "--home", str(home), "studio", "--port", "0"],
            stdout=stdout,
            stderr=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + 30
    while not (m := re.search(r"(http://\S+)", out.read_text())):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("the studio did not start")
        time.sleep(0.05)
    return proc, m.group(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="2,000 runs, 10 repeats")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.repeat = 2000, 10
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        home = work / "home"
        home.mkdir(mode=0o700)
        t0 = time.perf_counter()
        fill(home, args.runs, args.nodes)
        print(
            f"wrote {args.runs} sessions x {args.nodes} nodes in {time.perf_counter() - t0:.1f} s"
        )
        proc, url = studio(home, work)
        results: dict[str, list[float]] = {}
        try:
            base = url.split("/?", 1)[0]
            with httpx.Client(base_url=base, timeout=60) as client:
                client.get(url.removeprefix(base))
                results["GET /favicon.ico (baseline)"] = timed(
                    lambda: client.get("/favicon.ico").raise_for_status(), args.repeat
                )
                results["GET /static/studio.css (baseline)"] = timed(
                    lambda: client.get("/static/studio.css").raise_for_status(), args.repeat
                )
                for path in URLS:
                    results[f"GET {path}"] = timed(
                        lambda p=path: client.get(p).raise_for_status(),
                        args.repeat,  # type: ignore[misc]
                    )
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        results["views.list_runs(limit=50) (baseline)"] = timed(
            lambda: views.list_runs(home, limit=50), args.repeat
        )
        for label, xs in results.items():
            print(f"{label:<42} median {1000 * statistics.median(xs):7.1f} ms   "
                  f"p99 {1000 * p99(xs):7.1f} ms")  # fmt: skip
        pages = {k: v for k, v in results.items() if k.startswith("GET /runs")}
        worst = max(p99(xs) for xs in pages.values())
        main_page = results["GET /runs"]
        print(
            f"STUDIO_RUNS runs={args.runs} runs_p50_ms={1000 * statistics.median(main_page):.1f} "
            f"runs_p99_ms={1000 * p99(main_page):.1f} worst_p99_ms={1000 * worst:.1f} "
            f"(target < 300)"
        )


if __name__ == "__main__":
    main()
