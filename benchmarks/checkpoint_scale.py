"""Version 3 checkpoint cost per recorded outcome at 1,000 and 10,000 nodes (issue 17, item 2).

Workload: a plan of ``N`` entries shaped like the CLI's (``agent_id``, ``dep_indices``,
``assignee``, ``instruction``, ``node_id``); 64 asyncio tasks share one version 3
``CheckpointWriter`` and each ``record`` a distinct planned node (``completed``, a
600-byte ASCII response, the unchanged small flow context passed every time, as the
executor does) until all ``N`` are acknowledged.  Each size runs in a fresh child process
so its peak RSS (``ru_maxrss``, read before the final reload that checks the result)
is its own.

Rows: ``default`` limits (128 records / 8 MiB) and, as the baseline measured in the same
run, ``no-compact`` (limits high enough that nothing compacts: the cost of the journal
alone).  CPU is the child's user+system time around the recording only (interpreter start
and imports excluded); ``slope`` is the log-log slope of CPU against ``N`` between the two
sizes (1.0 = flat per-node cost).  ``bytes`` is every byte the writer wrote (``os.write``/``writev``
wrapped and summed, so an older tree without ``bytes_written`` is measured the same way).
Prints figures only; the last line is
``SCALE slope=<default slope> rss10k_mib=<MiB> bytes10k=<bytes> compactions10k=<n>``.

Usage: ``python benchmarks/checkpoint_scale.py [--nodes 1000,10000] [--dir DIR]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Same directory: the byte counter is the one checkpoint_bytes.py validates (positive control).
from checkpoint_bytes import WriteCounter

TASKS = 64
RESPONSE = ("abcdefghijklmnopqrstuvwxyz0123456789" * 20)[:600]
NO_COMPACT = {"max_records": 10**9, "max_bytes": 1 << 40}


def plan(n: int) -> list[dict[str, Any]]:
    return [
        {
            "agent_id": f"n{i:05d}",
            "dep_indices": [i - 100] if i >= 100 else [],
            "assignee": "worker",
            "instruction": f"task {i}: do the part of the work this node owns",
            "node_id": f"{i:032x}",
        }
        for i in range(n)
    ]


async def record_all(directory: Path, n: int, limits: dict[str, int]) -> dict[str, Any]:
    from steerflow.checkpoint import CheckpointWriter, load_checkpoint

    context = {"topic": "scale", "settings": {"depth": 2, "tags": ["a", "b"]}}
    w = CheckpointWriter(
        directory / "checkpoint.json",
        session_id="c" * 32,
        prompt="scale benchmark",
        plan=plan(n),
        config={"model_spec": "echo", "reactive_spec": "off", "max_ops": 0},
        flow_context=context,
        version=3,
        **limits,
    )
    await w.flush()
    todo = iter(range(n))

    async def task() -> None:
        for i in todo:
            await w.record(
                f"n{i:05d}", status="completed", response=f"{i}:{RESPONSE}", flow_context=context
            )

    with WriteCounter() as counter:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        await asyncio.gather(*(task() for _ in range(TASKS)))
        await w.close()
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
    compactions = getattr(w._backend, "compactions", -1)
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # before the check below
    state, report = load_checkpoint(directory)
    assert report["status"] == "clean" and len(state["ops"]) == n, report
    return {
        "cpu": (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime),
        "wall": wall,
        "bytes": counter.total,
        "compactions": compactions,
        "rss_kib": rss_kib,
    }


def child(n: int, directory: Path, limits: str) -> None:
    result = asyncio.run(record_all(directory, n, NO_COMPACT if limits == "no-compact" else {}))
    print(json.dumps(result))


def measure(n: int, base: Path, limits: str) -> dict[str, Any]:
    run_dir = base / f"{limits}-{n}"
    run_dir.mkdir()
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(n), "--dir", str(run_dir), "--limits", limits],
        check=True,
        capture_output=True,
        text=True,
    )
    shutil.rmtree(run_dir)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", default="1000,10000", help="comma-separated sizes")
    parser.add_argument("--dir", type=Path, default=None, help="filesystem to measure")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--limits", default="default", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.dir, args.limits)
        return
    sizes = [int(x) for x in args.nodes.split(",")]
    base = Path(tempfile.mkdtemp(prefix="sf-scale-", dir=args.dir))
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        for limits in ("no-compact", "default"):
            for n in sizes:
                rows[limits, n] = measure(n, base, limits)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(
        f"checkpoint scale: {platform.system()} {platform.release()}, "
        f"python {sys.version.split()[0]}"
    )
    print(f"workload: {TASKS} tasks record N planned outcomes (600-byte responses), version 3")
    head = ("limits", "nodes", "cpu s", "wall s", "us/node", "slope", "peak RSS MiB",
            "bytes written", "compactions")  # fmt: skip
    print("{:>10} {:>6} {:>7} {:>7} {:>8} {:>6} {:>12} {:>14} {:>11}".format(*head))
    for limits in ("no-compact", "default"):
        first = rows[limits, sizes[0]]
        for n in sizes:
            r = rows[limits, n]
            slope = (
                math.log(r["cpu"] / first["cpu"]) / math.log(n / sizes[0]) if n != sizes[0] else 0
            )
            print(
                f"{limits:>10} {n:>6} {r['cpu']:>7.2f} {r['wall']:>7.2f} "
                f"{1e6 * r['cpu'] / n:>8.0f} {slope if n != sizes[0] else float('nan'):>6.2f} "
                f"{r['rss_kib'] / 1024:>12.1f} {r['bytes']:>14,} {r['compactions']:>11}"
            )
    last, first = rows["default", sizes[-1]], rows["default", sizes[0]]
    slope = (
        math.log(last["cpu"] / first["cpu"]) / math.log(sizes[-1] / sizes[0])
        if len(sizes) > 1
        else float("nan")
    )
    print(
        f"SCALE slope={slope:.2f} rss{sizes[-1] // 1000}k_mib={last['rss_kib'] / 1024:.1f} "
        f"bytes{sizes[-1] // 1000}k={last['bytes']} compactions{sizes[-1] // 1000}k="
        f"{last['compactions']}"
    )


if __name__ == "__main__":
    main()
