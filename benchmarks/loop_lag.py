"""Event-loop callback lag while 100 concurrent completions are checkpointed (version 3).

Workload (ADR-0069 Amendment 2, verification 2): 100 tasks finish at nearly the same
time (0-20 ms jitter); each appends a 65,536-byte ASCII item to the shared
``context["nested"]["entries"]`` and awaits ``record()`` with a 65,536-byte response.
Persistence is real (journal appends, fsync, one byte-limit compaction).  The measured
path includes admission (entry normalization, digest, context capture), the
acknowledgement wait and ``close()``.

Sampling: a sampler task sleeps for a fixed cadence and records how late it woke;
only samples taken between the first completion and the end of ``close()`` count.
Prints per repetition and pooled sample count, cadence, p50, p99 and max lag, plus
acknowledgement latency.  Target p99 < 25 ms is reported, never asserted.
"""

from __future__ import annotations

import asyncio
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from typing import Any

from steerflow.checkpoint import CheckpointWriter

COMPLETIONS = 100
SIZE = 65_536
CADENCE = 0.001  # seconds between sampler wake-ups
REPETITIONS = 10


def text(kind: str, i: int) -> str:
    head = f"{kind}-{i:04d}:"
    return (head + "0123456789abcdef" * (SIZE // 16 + 1))[:SIZE]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_repetition(run_dir: str, seed: int) -> tuple[list[float], list[float], float]:
    loop = asyncio.get_running_loop()
    ctx: dict[str, Any] = {"nested": {"entries": []}}
    writer = CheckpointWriter(
        os.path.join(run_dir, "checkpoint.json"),
        session_id="0" * 32,
        prompt="lag",
        plan=[{"agent_id": f"op-{i}", "dep_indices": [], "assignee": "w"} for i in range(100)],
        config={"max_ops": 0},
        flow_context=ctx,
        version=3,
    )
    await writer.flush()
    rng = random.Random(seed)
    lags: list[float] = []
    acks: list[float] = []
    active = asyncio.Event()
    done = asyncio.Event()

    async def sampler() -> None:
        while not done.is_set():
            expected = loop.time() + CADENCE
            await asyncio.sleep(CADENCE)
            if active.is_set():
                lags.append(max(0.0, loop.time() - expected))

    async def completion(i: int) -> None:
        await asyncio.sleep(0.05 + rng.uniform(0, 0.02))  # the "provider" finishes
        active.set()
        started = time.perf_counter()
        ctx["nested"]["entries"].append(text("item", i))
        await writer.record(
            f"op-{i}", status="completed", response=text("resp", i), flow_context=ctx
        )
        acks.append(time.perf_counter() - started)

    sampling = asyncio.ensure_future(sampler())
    t0 = time.perf_counter()
    await asyncio.gather(*(completion(i) for i in range(COMPLETIONS)))
    await writer.close()
    elapsed = time.perf_counter() - t0
    done.set()
    await sampling
    assert writer.persisted and writer.records_acknowledged == COMPLETIONS, writer.error
    return lags, acks, elapsed


def main() -> None:
    pooled: list[float] = []
    print(
        f"workload: {COMPLETIONS} concurrent completions, {SIZE}-byte response + {SIZE}-byte "
        f"context item each, version 3, real fsync; cadence {CADENCE * 1000:.1f} ms; "
        f"{REPETITIONS} repetitions"
    )
    print(f"platform: {platform.platform()} python {sys.version.split()[0]} cpus={os.cpu_count()}")
    for rep in range(REPETITIONS):
        with tempfile.TemporaryDirectory(dir=os.environ.get("LAG_DIR")) as run_dir:
            lags, acks, elapsed = asyncio.run(one_repetition(run_dir, rep))
        pooled += lags
        print(
            f"rep {rep}: samples={len(lags)} p50={pct(lags, 0.5) * 1e3:.2f}ms "
            f"p99={pct(lags, 0.99) * 1e3:.2f}ms max={max(lags) * 1e3:.2f}ms "
            f"ack p50={statistics.median(acks) * 1e3:.1f}ms max={max(acks) * 1e3:.1f}ms "
            f"active={elapsed * 1e3:.0f}ms"
        )
    p99 = pct(pooled, 0.99)
    print(
        f"pooled: samples={len(pooled)} cadence={CADENCE * 1000:.1f}ms "
        f"p50={pct(pooled, 0.5) * 1e3:.2f}ms p99={p99 * 1e3:.2f}ms "
        f"max={max(pooled) * 1e3:.2f}ms target_p99<25ms={p99 < 0.025}"
    )


if __name__ == "__main__":
    main()
