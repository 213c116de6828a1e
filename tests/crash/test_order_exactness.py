"""Order and exactness under concurrency (ADR-0069 Am. 2, verification 4).

Many ``record`` / ``record_spawned`` callers run at once (``asyncio.gather``), reusing
stable ids (upserts), mutating one shared nested context between admissions (type
changes 1 / 1.0 / True, deletions, ``{}``, JSON null, "no update"), some cancelled
before they start and some cancelled after admission while waiting for persistence,
with compactions every few records and a loader thread reading the checkpoint
throughout.  The interleaving is driven, not left to the scheduler: after each wave of
callers the test waits until the loader has finished a load showing everything admitted
before the previous wave, so loads land between persistence batches on any machine.
Asserted:

* every state the loader sees is exactly the fold of the first ``k`` *admitted*
  transitions (context included), ``k`` never decreases, and ``k`` is at least the
  number of transitions acknowledged before that load started;
* without compaction, the journal holds the transitions in admission order;
* the final state is the fold of every admitted transition: no missing distinct
  outcome, no duplicate logical entry, cancelled-after-admission ones included.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from crash_support import CTX_MARK, RESP_MARK, canonical, load_here, project, writer_for

from waiting import wait_until_async

CALLERS = 150
WAVE = 10  # callers admitted between two of the test's yields to the loop


class Script:
    """The admitted transitions, in admission order, and the expected prefix states."""

    def __init__(self) -> None:
        self.ctx: dict[str, Any] = {"log": [], "nested": {"a": {"b": []}}}
        self.ops: dict[str, Any] = {}
        self.spawned: list[dict[str, Any]] = []
        self.order: list[tuple[str, str]] = []
        self.expected = [self._text(self.ctx)]
        self.live: dict[str, Any] = copy.deepcopy(self.ctx)
        self.acked = 0  # highest admission position known acknowledged

    def _text(self, ctx: Any) -> str:
        return canonical({"flow_context": ctx, "ops": self.ops, "spawned": self.spawned})

    def admit(self, i: int) -> tuple[str, str, Any, dict[str, Any] | None, dict[str, Any]]:
        """Mutate the live context for caller ``i``; return what it records."""
        live = self.live
        live.setdefault("log", []).append(i)
        live["t"] = [1, 1.0, True, None, "1"][i % 5]
        if i % 3:
            live.setdefault("nested", {}).setdefault("a", {"b": []})["a"] = {"b": [i, None]}
        if i % 4 == 0:
            live.pop("nested", None)
        passed: dict[str, Any] | None = live
        if i % 9 == 4:
            passed = None
        elif i % 13 == 12:
            passed, self.live = {}, {}
        kind = "spawn" if i % 3 == 1 else "op"
        key = f"n{i % 5}" if kind == "spawn" else f"op{i % 7}"
        response = {"i": i, "m": RESP_MARK, "ctx": CTX_MARK} if i % 2 else f"{RESP_MARK}{i}"
        extra = {"spawn_id": f"s{i}", "parent_id": "op0", "emitter_workload": "team"}
        if kind == "op":
            entry = {"agent_id": key, "status": "completed", "response": response}
            self.ops[key] = entry
        else:
            entry = {"node_id": key, "status": "completed", "response": response}
            for name in ("operation", "assignee", "instruction", "parent_id", "spawn_id"):
                entry[name] = extra.get(name)
            entry["context"] = None
            entry["emitter_workload"] = "team"
            ids = [e["node_id"] for e in self.spawned]
            if key in ids:
                self.spawned[ids.index(key)] = entry
            else:
                self.spawned.append(entry)
        if passed is not None:
            self.ctx = copy.deepcopy(passed)
        self.order.append((kind, key))
        self.expected.append(self._text(self.ctx))
        return kind, key, response, passed, extra


def loader(
    run: Path, script: Script, stop: threading.Event, seen: list[int], errors: list[str]
) -> None:
    last = 0
    while not stop.is_set():
        floor = script.acked
        state, report = load_here(run)
        if state is None:
            if (report.get("refusal") or {}).get("reason") != "missing-checkpoint" or floor:
                errors.append(f"refused: {report}")
            continue
        got = project(state)
        matches = [k for k, text in enumerate(list(script.expected)) if text == got]
        ok = [k for k in matches if k >= max(last, floor)]
        if not ok:
            errors.append(f"state is prefix {matches}, expected >= {max(last, floor)}")
            return
        last = ok[0]
        seen.append(last)


def loaded_past(seen: list[int], errors: list[str], floor: int) -> Callable[[], bool]:
    """A probe: the loader failed, or finished a new load showing at least ``floor``."""
    loads = len(seen)
    return lambda: bool(errors) or (len(seen) > loads and seen[-1] >= floor)


@pytest.mark.parametrize("compact", [True, False], ids=["compacting", "one-generation"])
async def test_concurrent_callers_cancellation_and_loader(tmp_path: Path, compact: bool) -> None:
    limits = {"max_records": 5, "max_bytes": 4_000} if compact else {"max_records": 10_000}
    w = writer_for(tmp_path, **limits)
    script = Script()
    await w.flush()
    stop = threading.Event()
    seen: list[int] = []
    errors: list[str] = []
    thread = threading.Thread(target=loader, args=(tmp_path, script, stop, seen, errors))
    thread.start()

    async def caller(i: int) -> None:
        kind, key, response, ctx, extra = script.admit(i)
        position = len(script.order)
        # No await between admit() and the call: admission happens synchronously inside.
        if kind == "op":
            await w.record(key, status="completed", response=response, flow_context=ctx)
        else:
            await w.record_spawned(
                key, status="completed", response=response, flow_context=ctx, **extra
            )
        script.acked = max(script.acked, position)

    tasks: list[asyncio.Future[None]] = []
    cancelled_early = cancelled_late = 0
    try:
        previous_wave = 0  # callers admitted when the previous wave ended
        for i in range(CALLERS):
            tasks.append(asyncio.ensure_future(caller(i)))
            if i % 17 == 16:
                tasks[-1].cancel()  # before it runs: never admitted
                cancelled_early += 1
            if i % WAVE == WAVE - 1:
                # Let this wave admit (each caller admits at its first step) and persist.
                admitted = i + 1 - cancelled_early
                await wait_until_async(
                    lambda n=admitted: len(script.order) >= n, timeout=10, what="admission"
                )
                for t in tasks[-10:-7]:
                    if not t.done() and t.cancel():
                        cancelled_late += 1  # admitted, now waiting on persistence
                # A load finished after this wave was admitted that shows the previous
                # wave persisted (cancelled-late items included): this wave is still in
                # flight, and the loads of waves j and j + 2 see different prefixes.
                await wait_until_async(
                    loaded_past(seen, errors, previous_wave),
                    timeout=60,
                    what=f"a load showing the first {previous_wave} admitted transitions",
                )
                previous_wave = len(script.order)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await w.close()
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert errors == []
    assert all(r is None or isinstance(r, asyncio.CancelledError) for r in results), results
    admitted = len(script.order)
    assert admitted == CALLERS - cancelled_early
    assert cancelled_late > 0
    assert len(set(seen)) >= (CALLERS // WAVE + 1) // 2, seen  # loads between the writes
    state, report = load_here(tmp_path)
    assert state is not None and report["status"] == "clean"
    assert project(state) == script.expected[admitted]
    assert len(state["spawned"]) == len({k for kind, k in script.order if kind == "spawn"})
    if not compact:
        lines = (tmp_path / "checkpoint.json.journal").read_bytes().splitlines()
        recs = [json.loads(line) for line in lines]
        keys = [(r["kind"], r["entry"].get("agent_id") or r["entry"]["node_id"]) for r in recs]
        assert keys == script.order  # persistence order is admission order
        assert [r["seq"] for r in recs] == list(range(1, admitted + 1))
    assert w.records_acknowledged == sum(r is None for r in results)
