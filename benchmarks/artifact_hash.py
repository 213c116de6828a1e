"""Artifact hashing (Amendment 1 row 8): throughput against ``b2sum``, and loop lag.

Workload: one file of ``--size`` MiB (default 1024) of incompressible bytes in a fresh
temporary directory, laid out as a leg directory ``<root>/build/big.bin``. Both hashers
read it from the page cache (one warm-up read first).

Throughput: ``steerflow.artifacts.hash_file`` (streamed BLAKE2b, 32-byte digest, 1 MiB
chunks) against ``b2sum`` (coreutils, BLAKE2b-512) on the same file in the same run;
``--repeat`` alternating runs of each, best and median MB/s reported. BLAKE2b's cost does
not depend on the output length, so the two compute the same compression rounds; the
digests themselves are checked equal with ``b2sum -l 256``. Target: ours >= 0.8x b2sum.

Loop lag: the run's real live check, ``await check_leg(leg, ["big.bin"])``, while a
sampler task on the same loop sleeps 1 ms at a time and records how late each wake-up
was. Baseline: the same sampler on an idle loop for the same length of time. Positive
control: the same sampler while the file is hashed *on* the loop (what the check would
cost without a worker thread), so a sampler blind to stalls would show here. p50, p99
and max lag and the sample count are printed; target p99 < 25 ms. Nothing is asserted.

The last line is ``ARTIFACT_HASH size_mib=<n> ours_mbps=<best> b2sum_mbps=<best>
ratio=<ours/b2sum> lag_p99_ms=<p99>``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from steerflow.artifacts import check_leg, hash_file

MIB = 1 << 20
BLOCK = 16 * MIB


def make_file(path: Path, size_mib: int) -> None:
    """``size_mib`` MiB of random bytes (one random block, repeated: hashing cost is the same)."""
    block = os.urandom(BLOCK)
    remaining = size_mib * MIB
    with path.open("wb") as handle:
        while remaining:
            n = min(remaining, BLOCK)
            handle.write(block[:n])
            remaining -= n


def time_ours(path: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    _, digest = hash_file(path)
    return time.perf_counter() - t0, digest


def time_b2sum(path: Path, length: int | None = None) -> tuple[float, str]:
    args = ["b2sum", *(["-l", str(length)] if length else []), str(path)]
    t0 = time.perf_counter()
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, out.stdout.split()[0]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _sample(lags: list[float], stop: asyncio.Event) -> None:
    period = 0.001
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(period)
        lags.append(max(0.0, time.perf_counter() - t0 - period))


async def lag_while(work: str, leg: Path, seconds: float) -> tuple[list[float], float]:
    """Sampler lags while ``work`` runs: ``thread`` (check_leg), ``loop`` or ``idle``."""
    lags: list[float] = []
    stop = asyncio.Event()
    sampler = asyncio.get_running_loop().create_task(_sample(lags, stop))
    await asyncio.sleep(0.05)  # the sampler is running before the work starts
    lags.clear()
    t0 = time.perf_counter()
    if work == "thread":
        check = await check_leg(leg, ["big.bin"])
        assert check.ok, check.error()
    elif work == "loop":
        hash_file(leg / "big.bin")  # blocking on purpose: the positive control
    else:
        await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - t0
    stop.set()
    await sampler
    return lags, elapsed


def show_lag(name: str, lags: list[float], elapsed: float) -> float:
    if not lags:
        print(f"  {name:<22} no samples in {elapsed:.2f} s")
        return float("nan")
    p99 = pct(lags, 0.99) * 1000
    print(
        f"  {name:<22} samples={len(lags):>6}  p50={pct(lags, 0.5) * 1000:7.2f} ms  "
        f"p99={p99:7.2f} ms  max={max(lags) * 1000:8.2f} ms  ({elapsed:.2f} s)"
    )
    return p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024, help="file size in MiB (1024)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per hasher (3)")
    parser.add_argument("--quick", action="store_true", help="--size 256 --repeat 2")
    parser.add_argument("--dir", type=Path, default=None, help="where the file is made")
    args = parser.parse_args()
    if args.quick:
        args.size, args.repeat = 256, 2
    if shutil.which("b2sum") is None:
        sys.exit("b2sum (coreutils) is needed for the baseline")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        leg = Path(tmp) / "artifacts" / "build"
        leg.mkdir(parents=True)
        path = leg / "big.bin"
        cpus = os.cpu_count()
        print(f"artifact hashing: {args.size} MiB file, {args.repeat} runs each, {cpus} CPUs")
        make_file(path, args.size)
        time_b2sum(path)  # warm the page cache
        megabytes = args.size * MIB / 1e6
        ours: list[float] = []
        theirs: list[float] = []
        digest = ""
        for _ in range(args.repeat):
            seconds, digest = time_ours(path)
            ours.append(megabytes / seconds)
            seconds, _ = time_b2sum(path)
            theirs.append(megabytes / seconds)
        _, reference = time_b2sum(path, 256)
        same = digest == "blake2b:" + reference
        print("throughput (MB/s, best / median):")
        print(f"  steerflow hash_file      {max(ours):8.1f} / {statistics.median(ours):8.1f}")
        print(f"  b2sum (baseline)         {max(theirs):8.1f} / {statistics.median(theirs):8.1f}")
        ratio = max(ours) / max(theirs)
        print(f"  ratio best ours/b2sum    {ratio:8.2f}   (target >= 0.80)")
        print(f"  digest equals b2sum -l 256: {same}")
        print("event-loop lag, 1 ms sampler on the run's loop:")
        lags, elapsed = asyncio.run(lag_while("thread", leg, 0))
        p99 = show_lag("check_leg (thread)", lags, elapsed)
        show_lag("idle (baseline)", *asyncio.run(lag_while("idle", leg, elapsed)))
        show_lag("on the loop (control)", *asyncio.run(lag_while("loop", leg, 0)))
        print("  target: check_leg p99 < 25 ms")
        print(
            f"ARTIFACT_HASH size_mib={args.size} ours_mbps={max(ours):.1f} "
            f"b2sum_mbps={max(theirs):.1f} ratio={ratio:.2f} lag_p99_ms={p99:.2f}"
        )


if __name__ == "__main__":
    main()
