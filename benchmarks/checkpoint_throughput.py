"""Acknowledged checkpoint records per second, with and without group commit.

Workload: ``W`` asyncio tasks (1, 10, 100) share one version 3 ``CheckpointWriter``
(default compaction limits) and call ``record`` in a loop with a 1 KiB response and no
context change, until ``RECORDS`` records are acknowledged.  Every acknowledgement waits
for the fsync that covers its record.

* group commit on: the writer as shipped; whoever holds the writer lock persists every
  queued record with one write and one fsync.
* group commit off: the backend is wrapped so each record gets its own write + fsync
  (same order, same files); this is the one-fsync-per-record baseline.

fsyncs are counted by wrapping ``os.fsync`` (journal, base and directory syncs, so
compactions are included).  The physical ceiling is the fsync rate of the same
filesystem measured in the same run: a plain 1 KiB ``write`` + ``fsync`` loop on a
temporary file.  Prints a table; nothing is asserted.

Usage: ``python benchmarks/checkpoint_throughput.py [--dir DIR] [--records N]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from steerflow.checkpoint import CheckpointWriter, load_checkpoint

PAYLOAD = ("0123456789abcdef" * 64)[:1024]


class FsyncCounter:
    """Wraps ``os.fsync`` process-wide and counts the calls."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()
        self._orig: Callable[[int], None] = os.fsync

    def __enter__(self) -> FsyncCounter:
        orig = self._orig

        def counting(fd: int) -> None:
            orig(fd)
            with self._lock:
                self.count += 1

        os.fsync = counting
        return self

    def __exit__(self, *exc: object) -> None:
        os.fsync = self._orig


def ceiling(directory: Path, seconds: float = 1.5) -> float:
    """fsyncs per second of a plain write+fsync loop on this filesystem."""
    fd, name = tempfile.mkstemp(dir=directory)
    try:
        data = PAYLOAD.encode()
        n = 0
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            os.write(fd, data)
            os.fsync(fd)
            n += 1
        return n / elapsed
    finally:
        os.close(fd)
        os.unlink(name)


def ungrouped(writer: CheckpointWriter) -> None:
    """Make the writer's backend persist one record per write + fsync."""
    backend: Any = writer._backend
    persist = backend.persist

    def one_by_one(batch: list[Any]) -> None:
        for ticket in batch:
            persist([ticket])

    backend.persist = one_by_one


async def run(directory: Path, writers: int, records: int, group: bool) -> tuple[float, int]:
    w = CheckpointWriter(
        directory / "checkpoint.json",
        session_id="b" * 32,
        prompt="benchmark",
        plan=[],
        config={},
        flow_context={},
        version=3,
    )
    if not group:
        ungrouped(w)
    await w.flush()
    per_task = records // writers

    async def task(t: int) -> None:
        for i in range(per_task):
            await w.record(f"op-{t}-{i % 50}", status="completed", response=PAYLOAD)

    with FsyncCounter() as counter:
        start = time.perf_counter()
        await asyncio.gather(*(task(t) for t in range(writers)))
        elapsed = time.perf_counter() - start
        fsyncs = counter.count
    await w.close()
    state, report = load_checkpoint(directory)
    assert report["status"] == "clean" and len(state["ops"]) == writers * min(per_task, 50)
    return elapsed, fsyncs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="filesystem to measure")
    parser.add_argument("--records", type=int, default=3_000, help="records per configuration")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="sf-throughput-", dir=args.dir))
    rows = []
    try:
        fs_rate = ceiling(base)
        for writers in (1, 10, 100):
            for group in (True, False):
                run_dir = base / f"w{writers}-{'group' if group else 'single'}"
                run_dir.mkdir()
                records = args.records // writers * writers
                elapsed, fsyncs = asyncio.run(run(run_dir, writers, records, group))
                rows.append((writers, group, records, elapsed, fsyncs))
    finally:
        shutil.rmtree(base)
    print(f"checkpoint throughput: {platform.system()} {platform.release()}, {base}")
    print(f"physical ceiling: {fs_rate:,.0f} fsync/s (1 KiB write + fsync loop, same fs)")
    head = ("writers", "group", "records", "seconds", "acked rec/s", "fsyncs",
            "rec/fsync", "fsync/s", "% of ceiling")  # fmt: skip
    print("{:>7} {:>5} {:>7} {:>8} {:>11} {:>7} {:>9} {:>8} {:>12}".format(*head))
    for writers, group, records, elapsed, fsyncs in rows:
        rate = records / elapsed
        print(
            f"{writers:>7} {'on' if group else 'off':>5} {records:>7} {elapsed:>8.2f} "
            f"{rate:>11,.0f} {fsyncs:>7} {records / fsyncs:>9.2f} {fsyncs / elapsed:>8,.0f} "
            f"{100 * fsyncs / elapsed / fs_rate:>11.0f}%"
        )
    print("fsyncs include journal, base and directory syncs (compactions every 128 records).")


if __name__ == "__main__":
    main()
