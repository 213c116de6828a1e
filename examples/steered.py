"""A flow steered from a second process: one program, two modes.

    python examples/steered.py flow  [--home DIR] [--slow-s S]     # terminal 1
    python examples/steered.py steer [--home DIR] [TARGET] [--message TEXT]   # terminal 2

``flow`` runs a plan whose first step is slow (a ``script:`` stand-in with a delay, so
the example runs offline) and prints every event ``FlowRun.events()`` yields. ``steer``
finds the running flow (or takes a run id or session id), pauses it, sends a message and
resumes it with the library's control writers, printing each control id; the drafts
that start after the pause carry the message in their instruction.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import steerflow
import steerflow.views
from steerflow import Op, Plan, Role, Synthesis

WAIT_S = 60.0  # how long ``steer`` waits for a flow to steer
T = TypeVar("T")


def steered_plan(script: Path) -> Plan:
    """A slow ``gather`` step, three drafts after it, and a synthesis."""
    drafts = [
        Op(f"draft-{i}", f"Draft section {i} from the notes.", depends_on=["gather"])
        for i in range(3)
    ]
    return Plan(
        name="steered",
        ops=[Op("gather", "Gather the notes.", assignee="slow"), *drafts],
        roles={"slow": Role(model=f"script:{script}")},
        synthesis=Synthesis("Merge the drafts."),
    )


def describe(event: steerflow.RunEvent) -> str:
    """One line per event: its type and its fields (timestamps and replies left out)."""
    left_out = ("ts", "response", "output", "usage")  # a reply may span lines
    fields = {
        f.name: getattr(event, f.name) for f in dataclasses.fields(event) if f.name not in left_out
    }
    return " ".join([event.type, *(f"{k}={v}" for k, v in fields.items() if v not in (None, ""))])


async def run_flow(home: Path, slow_s: float) -> int:
    """``flow``: run the plan, printing its ids first, then every event as it comes."""
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "slow.yaml"
        script.write_text(f"gather: {{delay: {slow_s}}}\n", encoding="utf-8")
        options = steerflow.FlowOptions(plan=steered_plan(script), model="echo")
        run = steerflow.FlowRun(options, home=home)
        events = run.events()  # opened before the run starts: nothing is missed
        async with asyncio.TaskGroup() as tasks:
            finished = tasks.create_task(run.run())
            async for event in events:
                if isinstance(event, steerflow.PlanReady):
                    print(f"run {run.run_id} session {run.session_id}", flush=True)
                print(describe(event), flush=True)
        result = finished.result()
    print(f"status {result.status}", flush=True)
    return int(result.exit_code)


def wait_for(probe: Callable[[], T | None], what: str) -> T:
    """``probe()``'s first value that is not None, polled for at most ``WAIT_S``."""
    deadline = time.monotonic() + WAIT_S
    while (value := probe()) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.05)
    return value


def steer(home: Path, target: str | None, text: str) -> int:
    """``steer``: once ``gather`` runs, pause, wait for the pause to apply, message, resume."""

    def running_run() -> str | None:
        runs = steerflow.views.list_runs(home, status="running") if home.exists() else []
        return next((r.run_id for r in runs if r.run_id), None)

    run_id = target or wait_for(running_run, "a running flow")

    def gathering() -> bool | None:
        # show_run resolves a run id or a session id, as the writers do.
        nodes = {n.id: n.status for n in steerflow.views.show_run(home, run_id).nodes}
        return True if nodes.get("gather") == "running" else None

    wait_for(gathering, "the gather step")
    paused = steerflow.pause(home, run_id)
    print(f"pause {paused}", flush=True)

    def applied() -> bool | None:
        rows = steerflow.views.control_status(home, run_id).controls
        return True if any(c.id == paused and c.result == "applied" for c in rows) else None

    wait_for(applied, "the pause to apply")
    print(f"message {steerflow.message(home, run_id, text)}", flush=True)
    print(f"resume {steerflow.resume(home, run_id)}", flush=True)
    return 0


def main() -> int:
    """Parse the mode and run it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["flow", "steer"])
    parser.add_argument(
        "target", nargs="?", help="steer: a run id or session id (default: the running flow)"
    )
    parser.add_argument("--home", help="steerflow home (default: STEERFLOW_HOME or ~/.steerflow)")
    parser.add_argument("--slow-s", type=float, default=5.0, help="flow: how long gather takes")
    parser.add_argument("--message", default="Keep every section under 100 words.")
    args = parser.parse_args()
    home = steerflow.resolve_home(args.home)
    if args.mode == "flow":
        return asyncio.run(run_flow(home, args.slow_s))
    return steer(home, args.target, args.message)


if __name__ == "__main__":
    sys.exit(main())
