"""A 10,000-entry plan file run to completion with the ``echo`` model (issue 11, item 4).

Workload: ``steerflow flow --plan big.yaml --max-plan-entries 10000 --json`` in a child
process with a fresh temporary home. Entries ``n0000``..``n9999`` are independent except
that every hundredth entry depends on the one before it, and the first entry depends on
the last (an edge to a late entry, the kind the old 200-entry cut dropped). Concurrency 64,
checkpoint version 3 with default compaction limits.

Measured: wall time of the child and its peak RSS (``ru_maxrss`` of the waited-for child,
from ``resource.getrusage(RUSAGE_CHILDREN)``), beside a 1,000-entry baseline (the default
limit) run the same way first. Checked (the run is worthless otherwise):
exit 0, status ``completed``, 10,000 nodes all ``completed``. Prints figures only; the last
line is ``PLAN10K entries=<n> wall_s=<s> peak_rss_mib=<MiB>``.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENTRIES = 10_000


def plan_entries(n: int) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = [
        {"agent_id": f"n{i:04d}", "instruction": f"task {i}"} for i in range(n)
    ]
    for i in range(100, n, 100):
        entries[i]["depends_on"] = [f"n{i - 1:04d}"]
    entries[0]["depends_on"] = [f"n{n - 1:04d}"]
    return entries


def run_plan(entries: int) -> tuple[float, float] | None:
    """Run an ``entries``-node plan in a child; (wall seconds, child peak RSS MiB) or None."""
    with tempfile.TemporaryDirectory(prefix="steerflow-plan10k-") as tmp:
        root = Path(tmp)
        plan = root / "big.json"  # JSON: the point is the run, not YAML parsing speed
        plan.write_text(json.dumps({"concurrency": 64, "plan": plan_entries(entries)}))
        argv = [
            sys.executable,
            "-m",
            "steerflow",
            "--home",
            str(root / "home"),
            "flow",
            "--plan",
            str(plan),
            "--max-plan-entries",
            str(entries),
            "--json",
        ]
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        # ru_maxrss of RUSAGE_CHILDREN is the largest child so far: run the small plan first.
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
            print(f"FAILED: {entries} entries, exit {proc.returncode}")
            return None
        out = json.loads(proc.stdout)
        statuses = {node["status"] for node in out["nodes"]}
        if (
            out["status"] != "completed"
            or len(out["nodes"]) != entries
            or statuses != {"completed"}
        ):
            print(f"FAILED: status {out['status']}, {len(out['nodes'])} nodes, {statuses}")
            return None
    return wall, peak_mib


def main() -> int:
    # Baseline in the same run: the default limit (1,000 entries), same shape and settings.
    rows = []
    for entries in (1_000, ENTRIES):
        measured = run_plan(entries)
        if measured is None:
            return 1
        rows.append((entries, *measured))
    print(f"{'entries':>8} {'wall s':>8} {'ms/node':>8} {'peak RSS MiB':>13}  (all completed)")
    for entries, wall, peak in rows:
        print(f"{entries:>8} {wall:>8.2f} {wall / entries * 1000:>8.2f} {peak:>13.1f}")
    _, wall, peak = rows[-1]
    print(f"PLAN10K entries={ENTRIES} wall_s={wall:.2f} peak_rss_mib={peak:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
