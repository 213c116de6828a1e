"""Shared helpers for the crash suite (not a test module); also the child-process workload.

The workload is a deterministic script of transitions (:func:`transitions`): planned and
spawned outcomes with repeated ids (upserts), nested context edits, scalar type changes,
deletions, ``{}`` and "no context update", and an occasional response larger than the
journal byte limit (a compaction that carries the transition in its base).  The parent
computes the expected logical state after every prefix (:func:`expected_states`) from
the same script, so "state == replay of n records" is a string comparison.

Run as a script, this module is the child writer::

    python crash_support.py <run_dir> [--count N] [--version 3] [--max-records R]
        [--max-bytes B] [--big B] [--concurrency K] [--dry] [--recover]

It reports on fd 1 with raw ``os.write`` calls: ``ready`` after imports, ``flushed``
after the initial base, ``ack <n>`` after the record of transition ``n`` (1-based)
*returned*, ``done`` after ``close()``.  With ``--recover`` a write error is followed by
``reconcile <n>``, ``reconcile()`` and the same transition recorded again.  With
``--dry`` a fault hook records every seam hit as ``(phase, when, step)`` and the list is
printed as ``hits <json>`` at the end.
``STEERFLOW_FAULT`` in the environment arms a kill point (read at import).
:func:`run_child` forks the child from a server that imported ``steerflow.checkpoint``
once (``tests/forked.py``: most of an exec'd child's CPU is that import); the campaigns
start hundreds of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PARALLEL = max(1, min(2, os.cpu_count() or 1))  # the machine is shared: bounded parallelism
RESP_MARK = "SFRESPx9q"  # unique byte strings: grep substitutes for leaked payload
CTX_MARK = "SFCTXk7w"
PLAN = [{"agent_id": "op0", "dep_indices": [], "assignee": "worker"}]
CONFIG = {"model_spec": "echo", "reactive_spec": "off", "max_ops": 0}
SPAWN_FIELDS = ("operation", "assignee", "instruction", "parent_id", "spawn_id", "context")


@dataclass(frozen=True)
class Transition:
    """One outcome of the script: what to pass to ``record`` / ``record_spawned``."""

    kind: str  # "op" | "spawn"
    key: str
    response: Any
    flow_context: dict[str, Any] | None  # a private deep copy of what is passed (None: no update)
    spawn: dict[str, Any] = field(default_factory=dict)  # record_spawned keyword fields

    def entry(self) -> dict[str, Any]:
        """The entry exactly as the writer stores it (minus ``result_digest``)."""
        if self.kind == "op":
            return {"agent_id": self.key, "status": "completed", "response": self.response}
        out: dict[str, Any] = {"node_id": self.key, "status": "completed"}
        out["response"] = self.response
        for name in SPAWN_FIELDS:
            out[name] = self.spawn.get(name)
        out.update({k: v for k, v in self.spawn.items() if k not in SPAWN_FIELDS})
        return out


def transitions(count: int, *, big: int = 0) -> Iterator[Transition]:
    """The deterministic transition script; ``big`` > 0 makes every 7th response that long."""
    live: dict[str, Any] = {"log": [], "nested": {"a": {"b": []}}}
    for i in range(count):
        live.setdefault("log", []).append(i)
        live["t"] = [1, 1.0, True, None, "1", 0.5][i % 6]  # type-distinct scalars
        if i % 4 == 0:
            live.pop("tmp", None)
        else:
            live["tmp"] = {"k/~": i, "": [None, {}]}
        live.setdefault("nested", {"a": {"b": []}})["a"]["b"].append({"i": i, "m": CTX_MARK})
        if i % 5 == 4:
            live["nested"]["a"]["b"].pop(0)
        passed: dict[str, Any] | None = live
        if i % 6 == 5:
            passed = None  # no update: the mutation rides on the next record
        elif i % 10 == 9:
            passed = {}  # remove every key
            live = {}
        response: Any = f"{RESP_MARK}-{i}"
        if big and i % 7 == 6:
            response = f"{RESP_MARK}-{i}-" + "z" * big
        elif i % 5 == 1:
            response = {"i": i, "v": [1, 1.0, True, None], "m": RESP_MARK}
        ctx = None if passed is None else copy.deepcopy(passed)
        if i % 3 == 2:
            spawn = {
                "operation": "chat",
                "assignee": "worker" if i % 2 else None,
                "instruction": f"do {i}",
                "parent_id": "op0",
                "spawn_id": f"s{i % 4}",
                "context": {"from": i} if i % 2 else None,
                "emitter_workload": "team",
                "depends_on": ["op0"],
            }
            yield Transition("spawn", f"n{i % 4}", response, ctx, spawn)
        else:
            yield Transition("op", f"op{i % 5}", response, ctx)


def canonical(value: Any) -> str:
    """Type-exact, key-order-free text of a JSON value (1, 1.0 and true all differ)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def project(state: dict[str, Any]) -> str:
    """The logical outcome/context state of a loaded checkpoint, as canonical text."""
    ops = {k: _strip(v) for k, v in state["ops"].items()}
    spawned = [_strip(e) for e in state["spawned"]]
    return canonical({"flow_context": state["flow_context"], "ops": ops, "spawned": spawned})


def _strip(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "result_digest"}


@cache
def expected_states(count: int, big: int = 0) -> tuple[str, ...]:
    """``project`` of the state after 0, 1, ..., count transitions of the script."""
    ctx: Any = {"log": [], "nested": {"a": {"b": []}}}
    ops: dict[str, Any] = {}
    spawned: list[dict[str, Any]] = []
    out = [canonical({"flow_context": ctx, "ops": ops, "spawned": spawned})]
    for t in transitions(count, big=big):
        if t.flow_context is not None:
            ctx = t.flow_context
        if t.kind == "op":
            ops[t.key] = t.entry()
        else:
            ids = [e["node_id"] for e in spawned]
            if t.key in ids:
                spawned[ids.index(t.key)] = t.entry()
            else:
                spawned.append(t.entry())
        out.append(canonical({"flow_context": ctx, "ops": ops, "spawned": spawned}))
    return tuple(out)


def digests_ok(state: dict[str, Any]) -> bool:
    """Every entry's ``result_digest`` is the digest of its response."""
    from steerflow.checkpoint import result_digest

    entries = [*state["ops"].values(), *state["spawned"]]
    return all(e.get("result_digest") == result_digest(e["response"]) for e in entries)


# -- the parent side ---------------------------------------------------------------------


@dataclass
class ChildResult:
    """What a child writer reported before it ended."""

    returncode: int
    flushed: bool
    acks: list[int]
    done: bool
    hits: list[tuple[str, str, str]]
    stderr: str


def child_command(run: Path, **opts: Any) -> list[str]:
    """The argv of a child writer (``opts`` are the script's long options)."""
    argv = [sys.executable, str(HERE / "crash_support.py"), str(run)]
    for name, value in opts.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value not in (None, False):
            argv += [flag, str(value)]
    return argv


def child_env(fault: str | None) -> dict[str, str]:
    """The environment of a child: ``STEERFLOW_FAULT`` set to ``fault`` or removed."""
    env = {k: v for k, v in os.environ.items() if k != "STEERFLOW_FAULT"}
    if fault:
        env["STEERFLOW_FAULT"] = fault
    return env


def parse_report(out: bytes) -> tuple[bool, list[int], bool, list[tuple[str, str, str]]]:
    """Decode a child's stdout (a torn last line is ignored)."""
    flushed, done, acks, hits = False, False, [], []
    for row in out.decode(errors="replace").split("\n"):
        if row == "flushed":
            flushed = True
        elif row == "done":
            done = True
        elif row.startswith("ack "):
            acks.append(int(row[4:]))
        elif row.startswith("hits "):
            hits = [tuple(h) for h in json.loads(row[5:])]
    return flushed, acks, done, hits  # type: ignore[return-value]


def run_child(
    run: Path, fault: str | None = None, *, timeout: float = 60, **opts: Any
) -> ChildResult:
    """Run one child writer to its end (normal exit or an armed ``os._exit``), forked."""
    from forked import run_forked  # tests/ is on the path of pytest, not of this script

    args = child_command(run, **opts)[2:]  # this script's own arguments
    code = "import sys, crash_support; crash_support.main(sys.argv[1:])"
    child = run_forked(code, args, fault=fault, timeout=timeout, scratch=Path(run).parent)
    flushed, acks, done, hits = parse_report(child.stdout)
    return ChildResult(child.returncode, flushed, acks, done, hits, child.stderr.decode()[-3000:])


def load_fresh(run: Path) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """``load_checkpoint`` in a *new* process; returns (state or None, report)."""
    code = (
        "import json,sys\n"
        "from steerflow.checkpoint import load_checkpoint, CheckpointRecoveryError\n"
        "try:\n"
        "    s, r = load_checkpoint(sys.argv[1])\n"
        "except CheckpointRecoveryError as e:\n"
        "    s, r = None, e.report\n"
        "sys.stdout.write(json.dumps({'state': s, 'report': r}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(run)], capture_output=True, timeout=60, check=True
    )
    out = json.loads(proc.stdout)
    return out["state"], out["report"]


def load_here(run: Path) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """``load_checkpoint`` in this process; returns (state or None, report)."""
    from steerflow.checkpoint import CheckpointRecoveryError, load_checkpoint

    try:
        return load_checkpoint(run)
    except CheckpointRecoveryError as exc:
        return None, dict(exc.report)


def check_recovered(
    state: dict[str, Any] | None,
    report: dict[str, Any],
    *,
    flushed: bool,
    acks: list[int],
    in_flight: int,
    count: int,
    big: int = 0,
) -> tuple[str | None, int | None]:
    """(problem or None, n) where the state must be the replay of ``n`` transitions.

    ``max(acks) <= n <= max(acks) + in_flight``.  A refusal is acceptable only as
    ``missing-checkpoint`` before anything (not even the initial base) was acknowledged.
    """
    if state is None:
        reason = (report.get("refusal") or {}).get("reason")
        if not flushed and not acks and reason == "missing-checkpoint":
            return None, None
        return f"refused although acknowledged: {report}", None
    if report["status"] not in ("clean", "recovered_prefix"):
        return f"unexpected report {report}", None
    low = max(acks, default=0)
    high = min(low + in_flight, count)
    expected = expected_states(-(-high // 128) * 128, big)[: high + 1]  # prefix-stable
    got = project(state)
    matches = [n for n, text in enumerate(expected) if text == got]
    if not any(low <= n <= high for n in matches):
        return f"state is replay of {matches or 'no prefix'}, expected {low}..{high}", None
    if not digests_ok(state):
        return "a result_digest does not match its response", None
    return None, next(n for n in matches if low <= n <= high)


def killed_child_problem(run: Path, fault: str, where: str, **opts: Any) -> str | None:
    """Run a child that must die at an armed seam (``where`` names it), then load its
    checkpoint here (this process never wrote it): None, or what went wrong."""
    result = run_child(run, fault, **opts)
    if result.returncode != 137:
        return f"child did not die {where} (rc={result.returncode}): {result.stderr}"
    state, report = load_here(run)
    problem, _ = check_recovered(
        state,
        report,
        flushed=result.flushed,
        acks=result.acks,
        in_flight=1,
        count=opts["count"],
        big=opts.get("big", 0),
    )
    return problem


def snapshot_tree(root: Path) -> dict[str, bytes | str]:
    """Every name under ``root`` with its bytes (symlinks: their target text)."""
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = path.read_bytes()
    return out


def phase_of(default: str) -> str:
    """The protocol phase a seam hook is called from (inspects the calling stack)."""
    frame = sys._getframe(2)
    names: set[str] = set()
    while frame is not None:
        names.add(frame.f_code.co_name)
        frame = frame.f_back  # type: ignore[assignment]
    if "reconcile" in names:
        return "reconcile"
    if "_initialize" in names:
        return "initialization"
    if "_compact" in names:
        return "compaction"
    return default


def writer_for(run: Path | str, **kwargs: Any) -> Any:
    """A ``CheckpointWriter`` for the script (``kwargs``: version, max_records, ...)."""
    from steerflow.checkpoint import CheckpointWriter

    params: dict[str, Any] = {
        "session_id": "s" * 32,
        "prompt": "crash",
        "plan": PLAN,
        "config": CONFIG,
        "max_spawn": 20,
        "flow_context": {"log": [], "nested": {"a": {"b": []}}},
        "version": 3,
    }
    params.update(kwargs)
    return CheckpointWriter(os.path.join(run, "checkpoint.json"), **params)


async def apply(writer: Any, t: Transition) -> None:
    """Record one transition of the script."""
    if t.kind == "op":
        await writer.record(
            t.key, status="completed", response=t.response, flow_context=t.flow_context
        )
    else:
        await writer.record_spawned(
            t.key, status="completed", response=t.response, flow_context=t.flow_context, **t.spawn
        )


# -- the child side ----------------------------------------------------------------------


def _say(text: str) -> None:
    data = (text + "\n").encode()
    while data:
        data = data[os.write(1, data) :]


async def _child(args: argparse.Namespace) -> None:
    from steerflow import _faults
    from steerflow.errors import PersistenceError

    hits: list[list[str]] = []
    phase = ["initialization"]
    if args.segment_fanout:
        # A small fanout makes a short script merge segments (and unlink the merged ones),
        # so the campaign kills the writer inside merges too (decision 340).
        from steerflow.checkpoint import _v4

        _v4.SEGMENT_FANOUT = args.segment_fanout
    if args.dry:

        def hook(step: str, when: str) -> None:
            hits.append([phase_of(phase[0]), when, step])

        _faults.set_fault_hook(hook)
    writer = writer_for(
        args.run, version=args.version, max_records=args.max_records, max_bytes=args.max_bytes
    )
    await writer.flush()
    _say("flushed")
    phase[0] = "append"
    script = transitions(args.count, big=args.big)
    counter = iter(range(1, args.count + 1))

    async def worker() -> None:
        for n, t in zip(counter, script, strict=False):
            # Synchronous from here to admission: the order of ``n`` is the admission order.
            try:
                await apply(writer, t)
            except PersistenceError:
                if not args.recover:
                    raise
                _say(f"reconcile {n}")
                phase[0] = "reconcile"
                await writer.reconcile()
                phase[0] = "append"
                await apply(writer, t)  # the same outcome again: an idempotent upsert
            _say(f"ack {n}")

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    phase[0] = "close"
    await writer.close()
    if args.dry:
        _faults.set_fault_hook(None)
        _say("hits " + json.dumps(hits))
    _say("done")


def main(argv: list[str] | None = None) -> None:
    """Entry point of the child writer."""
    parser = argparse.ArgumentParser()
    parser.add_argument("run")
    parser.add_argument("--count", type=int, default=14)
    parser.add_argument("--version", type=int, default=3)
    parser.add_argument("--max-records", type=int, default=3)
    parser.add_argument("--max-bytes", type=int, default=2_000)
    parser.add_argument("--big", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--dry", action="store_true")
    parser.add_argument("--recover", action="store_true", help="reconcile after a write error")
    parser.add_argument(
        "--segment-fanout", type=int, default=0, help="version 4: merge every N segments"
    )
    args = parser.parse_args(argv)
    import steerflow.checkpoint  # noqa: F401  (imported before "ready": kills land in the run)

    _say("ready")
    with contextlib.suppress(BrokenPipeError):
        asyncio.run(_child(args))


if __name__ == "__main__":
    main()
