"""Cumulative checkpoint bytes written for the 200-operation nested-append workload.

Workload (ADR-0069 Amendment 2, verification 1): operation ``i`` records an 8,192-byte
ASCII response and appends an 8,192-byte ASCII item to ``context["nested"]["entries"]``.

Counting: every ``os.write``, ``os.writev`` and ``os.copy_file_range`` in the process is
wrapped and the byte counts they *return* are summed (short writes and retries included;
temporary files, bases, journals and compactions all go through them).  Positive control: the sum is
compared with the process's ``wchar`` delta from ``/proc/self/io``, which the kernel
increments for every write system call.  Nothing is printed while a variant is measured.

Variants: v3 with default limits; v3 as a run writes it since issue 38, each operation's
write-ahead call intent (decision 217) recorded before its outcome (``v3_intents``); v3
with limits high enough that nothing compacts before operation 200; v2 full rewrite;
v4 (segments under a manifest, decision 340) with default limits, without and with
intents; and the ideal structural delta, defined as the initial v3 base plus, per operation, the
compact JSON of the complete entry, of the added item and of its JSON pointer (no
framing, no compaction, no intent).

Prints figures only; targets (v3 and v3_intents < 10,000,000 and <= 1.7x ideal;
no-compaction <= 1.05x ideal) are reported, never asserted.  The last line is
``W200 v3=<bytes> v3_intents=<bytes> v3_nocompact=<bytes> v2=<bytes> v4=<bytes>
v4_intents=<bytes> ideal=<bytes>``.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from steerflow.checkpoint import CheckpointWriter, load_checkpoint, result_digest

OPS = 200
SIZE = 8_192
MARKS = (25, 50, 100, 200)
PLAN = [{"agent_id": f"op-{i}", "dep_indices": [], "assignee": "worker"} for i in range(OPS)]
CONFIG = {"model_spec": "echo", "reactive_spec": "off", "max_ops": 0}


def payload(kind: str, i: int) -> str:
    head = f"{kind}-{i:05d}:"
    return (head + "abcdefghijklmnopqrstuvwxyz" * (SIZE // 26 + 1))[:SIZE]


class WriteCounter:
    """Wraps ``os.write``, ``os.writev`` and ``os.copy_file_range`` process-wide and sums
    the returned byte counts (a base copies its unchanged entries from the previous one
    with ``copy_file_range``; the kernel counts those bytes in ``wchar`` too)."""

    def __init__(self) -> None:
        self.total = 0
        self._lock = threading.Lock()
        self._orig: Callable[[int, Any], int] = os.write
        self._origv: Callable[[int, Any], int] = os.writev
        self._origc: Callable[..., int] = os.copy_file_range

    def __enter__(self) -> WriteCounter:
        orig, origv, origc = self._orig, self._origv, self._origc

        def counting(fd: int, data: Any) -> int:
            n = orig(fd, data)
            with self._lock:
                self.total += n
            return n

        def counting_v(fd: int, buffers: Any) -> int:
            n = origv(fd, buffers)
            with self._lock:
                self.total += n
            return n

        def counting_c(src: int, dst: int, count: int, *args: Any) -> int:
            n = origc(src, dst, count, *args)
            with self._lock:
                self.total += n
            return n

        os.write = counting
        os.writev = counting_v
        os.copy_file_range = counting_c
        return self

    def __exit__(self, *exc: object) -> None:
        os.write = self._orig
        os.writev = self._origv
        os.copy_file_range = self._origc


def wchar() -> int:
    with open("/proc/self/io") as fh:
        for row in fh:
            if row.startswith("wchar:"):
                return int(row.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


def expected_state() -> dict[str, Any]:
    ops = {
        f"op-{i}": {
            "agent_id": f"op-{i}",
            "status": "completed",
            "response": payload("response", i),
            "result_digest": result_digest(payload("response", i)),
        }
        for i in range(OPS)
    }
    context = {"nested": {"entries": [payload("item", i) for i in range(OPS)]}}
    return {"ops": ops, "spawned": [], "flow_context": context}


async def run_variant(
    run_dir: str, counter: WriteCounter, *, intents: bool = False, **kwargs: Any
) -> dict[int, int]:
    marks: dict[int, int] = {}
    ctx: dict[str, Any] = {"nested": {"entries": []}}
    writer = CheckpointWriter(
        os.path.join(run_dir, "checkpoint.json"),
        session_id="0" * 32,
        prompt="benchmark",
        plan=PLAN,
        config=CONFIG,
        max_spawn=None,
        flow_context=ctx,
        **kwargs,
    )
    start = counter.total
    await writer.flush()
    for i in range(OPS):
        if intents:  # what a run records before each call leaves (a sized reservation)
            await writer.record_call(
                uuid.uuid4().hex, node=f"op-{i}", record="op", key=f"op-{i}", attempt=1,
                model="openai/gpt-4o-mini", started_at=time.time(),
                reserved_cost_usd=0.0021, reserved_tokens=4100,
            )  # fmt: skip
        ctx["nested"]["entries"].append(payload("item", i))
        await writer.record(
            f"op-{i}", status="completed", response=payload("response", i), flow_context=ctx
        )
        if i + 1 in MARKS:
            marks[i + 1] = counter.total - start
    await writer.close()
    assert writer.persisted, writer.error
    return marks


def ideal_marks() -> dict[int, int]:
    """Initial base + per-op entry, added item and pointer, compact JSON, no framing."""
    base = {
        "version": 3,
        "generation": "0" * 32,
        "journal_seq": 0,
        "session_id": "0" * 32,
        "prompt": "benchmark",
        "plan": PLAN,
        "flow_context": {"nested": {"entries": []}},
        "ops": {},
        "spawned": [],
        "config": CONFIG,
    }
    total = len(json.dumps(base, separators=(",", ":")))
    state = expected_state()
    marks = {}
    for i in range(OPS):
        entry = state["ops"][f"op-{i}"]
        total += len(json.dumps(entry, separators=(",", ":")))
        total += len(json.dumps(payload("item", i)))
        total += len(json.dumps("/nested/entries/-"))
        if i + 1 in MARKS:
            marks[i + 1] = total
    return marks


def main() -> None:
    variants: dict[str, dict[str, Any]] = {
        "v3": {"version": 3},
        "v3_intents": {"version": 3, "intents": True},
        "v3_nocompact": {"version": 3, "max_records": 1_000_000, "max_bytes": 1 << 40},
        "v2": {"version": 2},
        "v4": {"version": 4},
        "v4_intents": {"version": 4, "intents": True},
    }
    expected = expected_state()
    results: dict[str, dict[int, int]] = {}
    controls: dict[str, tuple[int, int]] = {}
    recovered: dict[str, bool] = {}
    for name, kwargs in variants.items():
        with tempfile.TemporaryDirectory() as run_dir, WriteCounter() as counter:
            before = wchar()
            results[name] = asyncio.run(run_variant(run_dir, counter, **kwargs))
            controls[name] = (counter.total, wchar() - before)
            state, report = load_checkpoint(run_dir)
            recovered[name] = (
                report["status"] == "clean"
                and "in_flight" not in state  # every intent closed by its outcome
                and all(state[key] == expected[key] for key in ("ops", "spawned", "flow_context"))
            )
    results["ideal"] = ideal_marks()

    print(f"workload: {OPS} ops, {SIZE}-byte response + {SIZE}-byte nested item each")
    print("positive control (counted os.write/os.writev bytes vs /proc/self/io wchar delta):")
    for name, (counted, kernel) in controls.items():
        print(
            f"  {name:13s} counted={counted:>12,d} wchar={kernel:>12,d} diff={kernel - counted:+d}"
        )
    with tempfile.NamedTemporaryFile() as probe, WriteCounter() as counter:
        before = wchar()
        os.write(probe.fileno(), b"x" * 4096)
        print(f"  probe         counted={counter.total} wchar={wchar() - before} (4096 written)")
    print("cumulative bytes written:")
    print("  ops  " + "".join(f"{name:>15s}" for name in results))
    for mark in MARKS:
        print(f"  {mark:3d}  " + "".join(f"{results[n][mark]:>15,d}" for n in results))
    ideal = results["ideal"][OPS]
    for name in ("v3", "v3_intents", "v3_nocompact", "v2", "v4", "v4_intents"):
        total = results[name][OPS]
        print(f"  {name:13s} {total / ideal:8.3f}x ideal  recovered_state_ok={recovered[name]}")
    print(
        f"targets: v3 < 10,000,000: {results['v3'][OPS] < 10_000_000}; "
        f"v3 <= 1.7x ideal: {results['v3'][OPS] <= 1.7 * ideal}; "
        f"v3_intents <= 1.7x ideal: {results['v3_intents'][OPS] <= 1.7 * ideal}; "
        f"v3_nocompact <= 1.05x ideal: {results['v3_nocompact'][OPS] <= 1.05 * ideal}; "
        f"v4 <= 1.7x ideal: {results['v4'][OPS] <= 1.7 * ideal}; "
        f"v4_intents <= 1.7x ideal: {results['v4_intents'][OPS] <= 1.7 * ideal}"
    )
    print(
        f"W200 v3={results['v3'][OPS]} v3_intents={results['v3_intents'][OPS]} "
        f"v3_nocompact={results['v3_nocompact'][OPS]} "
        f"v2={results['v2'][OPS]} v4={results['v4'][OPS]} "
        f"v4_intents={results['v4_intents'][OPS]} ideal={ideal}"
    )


if __name__ == "__main__":
    main()
