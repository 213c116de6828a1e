"""A 10,000-entry plan file run to completion through the CLI with the ``echo`` model.

Issue 11 item 4 and issue 17 item 4. Workload: ``steerflow flow --plan big.json
--max-plan-entries N --json`` in a child process with a fresh temporary home. Entries
``n0000``.. are independent except that every hundredth entry depends on the one before
it, and the first entry depends on the last (an edge to a late entry, the kind the old
200-entry cut dropped). Concurrency 64, checkpoint version 3 with default compaction limits.

Measured per run: wall and CPU time of the child, its peak RSS (``ru_maxrss`` from
``os.wait4`` on that child), the lines of progress it wrote on stderr, and the latency of
``steerflow show RUN NODE`` on the finished run (a fresh child each time, interpreter
start-up included: what an operator waits for; median and worst of ``--show-repeats``),
beside a baseline of one tenth the entries (at least 100) run the same way first.
Checked (the run is worthless otherwise): exit 0, status ``completed``, every node
``completed``, and ``show`` printing the asked node. Prints figures only; the last line is
``PLAN10K entries=<n> wall_s=<s> cpu_s=<s> peak_rss_mib=<MiB> progress_lines=<n>
show_s=<median> show_cpu_s=<median>``; on a busy machine the CPU seconds of ``show`` say
more than its wall time.

Run it against another tree with ``PYTHONPATH=/that/tree/src python benchmarks/plan_10k.py``
(the children inherit the environment). ``--quick`` runs 2,000 entries.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENTRIES = 10_000


@dataclass
class Child:
    """A finished child process and what it cost."""

    code: int
    stdout: str
    stderr: str
    wall_s: float
    cpu_s: float
    peak_rss_mib: float


@dataclass
class Row:
    """The figures of one plan size."""

    entries: int
    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    progress_lines: int
    show_s: list[float]
    show_cpu_s: list[float]


def plan_entries(n: int) -> list[dict[str, Any]]:
    """The benchmark's plan: independent entries, a chain every hundredth, one late edge."""
    width = max(4, len(str(n - 1)))
    name = [f"n{i:0{width}d}" for i in range(n)]
    entries: list[dict[str, Any]] = [
        {"agent_id": name[i], "instruction": f"task {i}"} for i in range(n)
    ]
    for i in range(100, n, 100):
        entries[i]["depends_on"] = [name[i - 1]]
    entries[0]["depends_on"] = [name[n - 1]]
    return entries


def run_child(argv: list[str], scratch: Path) -> Child:
    """Run ``argv``; its output, wall and CPU seconds and peak RSS (this child alone)."""
    out_path, err_path = scratch / "stdout", scratch / "stderr"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    return Child(
        code=proc.returncode,
        stdout=out_path.read_text(encoding="utf-8", errors="replace"),
        stderr=err_path.read_text(encoding="utf-8", errors="replace"),
        wall_s=wall,
        cpu_s=usage.ru_utime + usage.ru_stime,
        peak_rss_mib=usage.ru_maxrss / 1024,
    )


def steerflow(home: Path, *args: str) -> list[str]:
    """The command line of ``steerflow --home HOME ARGS`` with this interpreter."""
    return [sys.executable, "-m", "steerflow", "--home", str(home), *args]


def measure(entries: int, show_repeats: int) -> Row | None:
    """Run an ``entries``-node plan and time ``show`` on it; None (reported) on failure."""
    with tempfile.TemporaryDirectory(prefix="steerflow-plan10k-") as tmp:
        root = Path(tmp)
        plan = root / "big.json"  # JSON: the point is the run, not YAML parsing speed
        nodes = plan_entries(entries)
        plan.write_text(json.dumps({"concurrency": 64, "plan": nodes}))
        home = root / "home"
        argv = steerflow(
            home, "flow", "--plan", str(plan), "--max-plan-entries", str(entries), "--json"
        )
        run = run_child(argv, root)
        if run.code != 0:
            print(run.stderr[-2000:], file=sys.stderr)
            print(f"FAILED: {entries} entries, exit {run.code}")
            return None
        out = json.loads(run.stdout)
        statuses = {node["status"] for node in out["nodes"]}
        if (
            out["status"] != "completed"
            or len(out["nodes"]) != entries
            or statuses != {"completed"}
        ):
            print(f"FAILED: status {out['status']}, {len(out['nodes'])} nodes, {statuses}")
            return None
        asked = nodes[entries // 2]["agent_id"]
        show_s, show_cpu_s = [], []
        for _ in range(show_repeats):
            shown = run_child(steerflow(home, "show", out["run_id"], asked), root)
            if shown.code != 0 or f"node: {asked}" not in shown.stdout:
                print(shown.stdout[-1000:] + shown.stderr[-1000:], file=sys.stderr)
                print(f"FAILED: show {asked} exit {shown.code}")
                return None
            show_s.append(shown.wall_s)
            show_cpu_s.append(shown.cpu_s)
    return Row(
        entries=entries,
        wall_s=run.wall_s,
        cpu_s=run.cpu_s,
        peak_rss_mib=run.peak_rss_mib,
        progress_lines=len(run.stderr.splitlines()),
        show_s=show_s,
        show_cpu_s=show_cpu_s,
    )


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table and the summary line; 1 if a run failed its checks."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=ENTRIES, help="entries of the big plan")
    parser.add_argument("--quick", action="store_true", help="2,000 entries instead")
    parser.add_argument("--show-repeats", type=int, default=5, metavar="N")
    args = parser.parse_args(argv)
    big = 2_000 if args.quick else args.nodes
    rows = []
    # Baseline in the same run: a tenth of the entries, same shape and settings.
    for entries in (max(100, big // 10), big):
        row = measure(entries, args.show_repeats)
        if row is None:
            return 1
        rows.append(row)
    print(
        f"{'entries':>8} {'wall s':>8} {'ms/node':>8} {'cpu s':>7} {'peak RSS MiB':>13} "
        f"{'progress lines':>15} {'show s (median/max)':>20} {'show cpu s':>11}  (all completed)"
    )
    for r in rows:
        show = f"{statistics.median(r.show_s):.2f}/{max(r.show_s):.2f}"
        print(
            f"{r.entries:>8} {r.wall_s:>8.2f} {r.wall_s / r.entries * 1000:>8.2f} "
            f"{r.cpu_s:>7.2f} {r.peak_rss_mib:>13.1f} {r.progress_lines:>15} {show:>20} "
            f"{statistics.median(r.show_cpu_s):>11.2f}"
        )
    last = rows[-1]
    print(
        f"PLAN10K entries={last.entries} wall_s={last.wall_s:.2f} cpu_s={last.cpu_s:.2f} "
        f"peak_rss_mib={last.peak_rss_mib:.1f} progress_lines={last.progress_lines} "
        f"show_s={statistics.median(last.show_s):.2f} "
        f"show_cpu_s={statistics.median(last.show_cpu_s):.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
