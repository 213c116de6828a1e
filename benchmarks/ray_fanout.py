"""A 200-node fan-out run locally and on a two-node Ray cluster on this machine (issue 33).

Each node is a ``python:`` function (``benchmarks/_fanout_fn.py``) that sleeps 0.5 s and then
burns 0.2 s of CPU, so a run is 100 s of waiting and 40 s of CPU. Both rows are real
``steerflow flow`` processes on the same plan at the same ``--concurrency``:

- ``local``: every call on the flow process's daemon threads, so the CPU parts share one
  GIL (the baseline, measured in the same run);
- ``ray``: ``--executor ray`` against ``ray start --head`` plus a second ``ray start``
  node (one CPU each, as ``tests/e2e/ray_support.py`` starts them), each call asking for
  ``--num-cpus`` (default 0.25: four calls per node at once).

Printed per row: wall time of the flow process, and per call the dispatch overhead (the
executor's call time, ``started_at``..``ended_at`` from the state DB, minus the time the
function itself measured between entry and return: serialization, scheduling, transport,
worker hand-off), p50/p99/max; for Ray, where each call ran (node address: calls, worker
processes). Nothing is asserted.

    python benchmarks/ray_fanout.py [--nodes 200] [--concurrency 8] [--num-cpus 0.25]
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
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "e2e"), str(HERE.parent / "tests")]

from ray_support import start_cluster  # noqa: E402  (the tests' cluster, reused as is)

from steerflow.checkpoint import load_checkpoint  # noqa: E402
from steerflow.state import StateDB  # noqa: E402


def _plan(path: Path, nodes: int, num_cpus: float) -> Path:
    plan = {
        "name": "ray-fanout",
        "roles": {"work": {"model": "python:_fanout_fn:call", "resources": {"num_cpus": num_cpus}}},
        "plan": [
            {"agent_id": f"n{i:03d}", "assignee": "work", "instruction": f"call {i}"}
            for i in range(nodes)
        ],
    }
    path.write_text(yaml.safe_dump(plan), encoding="utf-8")
    return path


def _run(
    home: Path, plan: Path, concurrency: int, extra: list[str], env: dict[str, str]
) -> dict[str, Any]:
    argv = [sys.executable, "-m", "steerflow", "--home", str(home), "flow", "--plan", str(plan),
            "--allow-python", "--concurrency", str(concurrency), "--json", *extra]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"flow exited {done.returncode}:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    result["wall_s"] = wall
    return result


def _calls(home: Path, result: dict[str, Any]) -> list[dict[str, Any]]:
    state, _ = load_checkpoint(Path(result["run_dir"]) / "checkpoint.json")
    with StateDB.open(home, create=False) as db:
        rows = {n.node_key: n.detail or {} for n in db.list_nodes(result["session_id"])}
    calls = []
    for key, entry in state["ops"].items():
        said = json.loads(entry["response"])
        detail = rows[key]
        call_s = float(detail["ended_at"]) - float(detail["started_at"])
        own_s = said["t_out"] - said["t_in"]
        calls.append(
            {**said, "overhead_ms": (call_s - own_s) * 1000, "placement": detail.get("placement")}
        )
    return calls


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _stats(values: list[float]) -> str:
    return (
        f"p50 {statistics.median(values):7.2f} ms  p99 {_pct(values, 0.99):7.2f} ms  "
        f"max {max(values):7.2f} ms"
    )


def _row(name: str, result: dict[str, Any], calls: list[dict[str, Any]]) -> None:
    over = [c["overhead_ms"] for c in calls]
    print(f"{name:<6} wall {result['wall_s']:7.2f} s  {len(calls)} calls, overhead {_stats(over)}")
    # A process's first call also pays for starting it (a Ray worker, a thread): apart.
    firsts: set[int] = set()
    warm = []
    for call in sorted(calls, key=lambda c: c["t_in"]):
        if call["pid"] in firsts:
            warm.append(call["overhead_ms"])
        firsts.add(call["pid"])
    if warm and len(firsts) > 1:
        print(f"{'':<6} {'':>12}  {len(warm)} warm calls (not a process's first), {_stats(warm)}")
    where: dict[str, set[int]] = defaultdict(set)
    count: Counter[str] = Counter()
    for call in calls:
        place = call["placement"] or {}
        at = str(place.get("node_ip") or "the flow process")
        where[at].add(int(call["pid"]))
        count[at] += 1
    for at, n in sorted(count.items()):
        print(f"{'':<6} ran on {at}: {n} calls in {len(where[at])} process(es)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--num-cpus", type=float, default=0.25, help="per Ray call")
    args = parser.parse_args()
    print(f"{args.nodes} nodes, each: sleep 0.5 s + 0.2 s CPU; --concurrency {args.concurrency}; "
          f"{os.cpu_count()} CPUs; Ray calls ask for num_cpus {args.num_cpus}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="ray-fanout-") as tmp:
        root = Path(tmp)
        plan = _plan(root / "plan.yaml", args.nodes, args.num_cpus)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("STEERFLOW_", "RAY_"))}
        env["PYTHONPATH"] = str(HERE)
        local = _run(root / "local", plan, args.concurrency, [], env)
        _row("local", local, _calls(root / "local", local))
        started = time.perf_counter()
        cluster = start_cluster(str(HERE))
        took = time.perf_counter() - started
        print(f"{'':<6} (a 2-node cluster started in {took:.1f} s at {cluster.address})")
        try:
            on_ray = _run(root / "ray", plan, args.concurrency, ["--executor", "ray"],
                          {**env, "RAY_ADDRESS": cluster.address})  # fmt: skip
            _row("ray", on_ray, _calls(root / "ray", on_ray))
        finally:
            cluster.close()


if __name__ == "__main__":
    main()
