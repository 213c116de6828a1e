"""Acknowledged checkpoint records per second, with and without group commit.

Workload: ``W`` asyncio tasks (1, 10, 100) share one version 3 ``CheckpointWriter``
(default compaction limits) and call ``record`` in a loop with a 1 KiB response and no
context change, until ``RECORDS`` records are acknowledged.  Every acknowledgement waits
for the fsync that covers its record.

* group commit on: the writer as shipped; one write and one fsync cover every record
  queued when a journal append starts.
* group commit off: the backend is wrapped so each record gets its own write + fsync
  (same order, same files); this is the one-fsync-per-record baseline.

Counted: every ``os.fsync`` (journal, base and directory syncs, so compactions are
included) and every journal append (``V3Backend._commit`` with lines: its write size and
record count).  Ceiling: for each row, a loop on a fresh ``O_APPEND`` file of the same
filesystem doing exactly what one journal append does, ``os.write`` of that row's mean
append size then ``os.fsync`` (the journal's sync call), measured twice right after the
row (the higher rate is kept: the disk is shared and drifts).

Columns: ``ideal rec/s`` = ceiling fsync/s x records per fsync (all fsyncs counted), and
``% ideal`` = acked rec/s over it: the group-commit figure (issue 17 asks >= 50 % at 100
writers).  It equals the run's fsync/s over the ceiling: how busy the run kept the disk
with fsyncs (a base fsync writes more than an append, so it costs more than the ceiling's).
Prints a table; nothing is asserted.  The last line is
``GROUP writers=100 acked=<rec/s> rec_per_fsync=<r> ceiling=<fsync/s> pct_ideal=<%>``.

Usage: ``python benchmarks/checkpoint_throughput.py [--dir DIR] [--records N] [--quick]``
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

from steerflow.checkpoint import CheckpointWriter, _v3, load_checkpoint

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


class AppendCounter:
    """Wraps the version 3 journal append and counts appends, their bytes and records."""

    def __init__(self) -> None:
        self.appends = self.bytes = self.records = 0
        self._orig: Any = _v3.V3Backend._commit

    def __enter__(self) -> AppendCounter:
        orig = self._orig

        def counting(backend: Any, buf: list[bytes], pending: list[Any]) -> None:
            if buf:
                self.appends += 1
                self.bytes += sum(map(len, buf))
                self.records += len(buf)
            orig(backend, buf, pending)

        _v3.V3Backend._commit = counting  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        _v3.V3Backend._commit = self._orig  # type: ignore[method-assign]


def ceiling(directory: Path, size: int, seconds: float) -> float:
    """fsyncs per second of the journal's own append: ``size``-byte write + ``os.fsync``."""
    name = directory / f"ceiling-{size}"
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        data = (PAYLOAD.encode() * (size // len(PAYLOAD) + 1))[: max(size, 1)]
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


async def run(directory: Path, writers: int, records: int, group: bool) -> dict[str, float]:
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

    with FsyncCounter() as counter, AppendCounter() as appends:
        start = time.perf_counter()
        await asyncio.gather(*(task(t) for t in range(writers)))
        elapsed = time.perf_counter() - start
        fsyncs = counter.count
    await w.close()
    state, report = load_checkpoint(directory)
    assert report["status"] == "clean" and len(state["ops"]) == writers * min(per_task, 50)
    return {
        "elapsed": elapsed,
        "fsyncs": fsyncs,
        "appends": appends.appends,
        "append_bytes": appends.bytes / max(appends.appends, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="filesystem to measure")
    parser.add_argument("--records", type=int, default=3_000, help="records per configuration")
    parser.add_argument("--quick", action="store_true", help="100 writers only, group on/off")
    parser.add_argument("--ceiling-seconds", type=float, default=1.5, help="per ceiling loop")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="sf-throughput-", dir=args.dir))
    rows = []
    try:
        for writers in (100,) if args.quick else (1, 10, 100):
            for group in (True, False):
                run_dir = base / f"w{writers}-{'group' if group else 'single'}"
                run_dir.mkdir()
                records = args.records // writers * writers
                r = asyncio.run(run(run_dir, writers, records, group))
                size = round(r["append_bytes"])
                # The disk is shared and its rate drifts: the higher of two loops.
                r["ceiling"] = max(ceiling(base, size, args.ceiling_seconds) for _ in range(2))
                rows.append((writers, group, records, r))
    finally:
        shutil.rmtree(base)
    print(f"checkpoint throughput: {platform.system()} {platform.release()}, {base}")
    print(
        "ceiling: os.write of the row's mean journal append + os.fsync on an O_APPEND file, "
        "same fs, the higher of two loops right after the row"
    )
    head = ("writers", "group", "records", "seconds", "acked rec/s", "fsyncs", "appends",
            "append B", "rec/fsync", "ceiling/s", "fsync/s", "ideal rec/s", "% ideal")  # fmt: skip
    fmt = "{:>7} {:>5} {:>7} {:>7} {:>11} {:>6} {:>7} {:>8} {:>9} {:>9} {:>7} {:>11} {:>7}"
    print(fmt.format(*head))
    for writers, group, records, r in rows:
        rate = records / r["elapsed"]
        per_fsync = records / r["fsyncs"]
        ideal = r["ceiling"] * per_fsync
        cells = (writers, "on" if group else "off", records, f"{r['elapsed']:.2f}",
                 f"{rate:,.0f}", r["fsyncs"], r["appends"], f"{r['append_bytes']:,.0f}",
                 f"{per_fsync:.2f}", f"{r['ceiling']:,.0f}", f"{r['fsyncs'] / r['elapsed']:,.0f}",
                 f"{ideal:,.0f}", f"{100 * rate / ideal:.0f}%")  # fmt: skip
        print(fmt.format(*cells))
    print("fsyncs include journal, base and directory syncs (compactions every 128 records);")
    print("% ideal = acked rec/s / (ceiling x rec/fsync), which is also fsync/s over the ceiling.")
    for writers, group, records, r in rows:
        if writers == 100 and group:
            rate, per_fsync = records / r["elapsed"], records / r["fsyncs"]
            pct = 100 * rate / (r["ceiling"] * per_fsync)
            print(
                f"GROUP writers=100 acked={rate:.0f} rec_per_fsync={per_fsync:.2f} "
                f"ceiling={r['ceiling']:.0f} pct_ideal={pct:.0f}"
            )


if __name__ == "__main__":
    main()
