"""Studio (issue 14): server time to render a large run page, and idle CPU under live pages.

Workload: one finished run of ``--nodes`` nodes (default 1000) made by the real CLI with
the offline ``echo`` model: ``--layers`` layers (default 10), each node depending on one
node of the layer before, so the page draws every edge.

Render: a ``steerflow studio --port 0`` subprocess; ``GET /runs/<run>`` over loopback
HTTP (token exchanged for the cookie first), ``--repeat`` times after one warm-up; median
and best wall time per page (server render plus one loopback round trip). Baseline, in
the same run: ``steerflow.views.show_run`` in this process (what ``show --json`` reads,
the page's largest read), and ``GET /api/runs/<run>`` (the JSON a live page polls).
Target: the page under 1 s.

Idle CPU: the studio's CPU time (``/proc/<pid>/stat`` user + system) over ``--window``
seconds with 10 live pages open on the finished run, each polling ``/api/runs/<run>``
every 500 ms with the last ``ETag`` as ``studio.js`` does (the Studio's live updates are
polling, not event streams: 304 while nothing changed), against the same window with no
client. Printed as a percentage of one core. Nothing asserted.

Server time (issue 42 item 3): the ``Server-Timing`` header the run page and the runs
page answer with (the server's own render time, no transfer), median over the repeats,
the runs page as the baseline beside it, and the first (cold) load's. Target: the
300-node run page under 300 ms (``--nodes 300``).

The last line is ``STUDIO nodes=<n> page_ms=<median> page_server_ms=<median>
first_server_ms=<first load> runs_server_ms=<median> show_ms=<median> api_ms=<median>
idle_cpu_pct=<no clients> live_cpu_pct=<10 clients>``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

from steerflow import views

CLIENTS = 10
POLL_S = 0.5


def make_run(home: Path, work: Path, nodes: int, layers: int) -> str:
    width = max(1, nodes // layers)
    plan = []
    for i in range(nodes):
        layer, slot = divmod(i, width)
        entry: dict[str, object] = {"agent_id": f"n{i:05d}", "instruction": f"step {i}"}
        if layer:
            entry["depends_on"] = [f"n{(layer - 1) * width + slot % width:05d}"]
        plan.append(entry)
    path = work / "plan.yaml"
    path.write_text(yaml.safe_dump({"name": "studio-bench", "plan": plan}), encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "steerflow", "--home", str(home), "flow", "--plan", str(path),
         "--model", "echo", "--concurrency", "64", "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return str(json.loads(out.stdout)["run_id"])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(fn: object, repeat: int) -> list[float]:
    assert callable(fn)
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def cpu_over(
    pid: int, window: float, clients: int, base: str, cookies: httpx.Cookies, run: str
) -> float:
    stop = threading.Event()

    def poll() -> None:
        tag = None  # sent back as studio.js does: 304 while nothing changed
        with httpx.Client(base_url=base, cookies=cookies, timeout=30) as client:
            while not stop.is_set():
                reply = client.get(
                    f"/api/runs/{run}", headers={"if-none-match": tag} if tag else {}
                )
                tag = reply.headers.get("etag") or tag
                stop.wait(POLL_S)

    threads = [threading.Thread(target=poll, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(POLL_S)  # let every client make its first request
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(window)
    used, wall = cpu_seconds(pid) - c0, time.monotonic() - t0
    stop.set()
    for t in threads:
        t.join(timeout=30)
    return 100.0 * used / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--window", type=float, default=10.0, help="seconds per CPU window")
    parser.add_argument("--quick", action="store_true", help="200 nodes, 3 repeats, 3 s windows")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.repeat, args.window = 200, 3, 3.0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        home = work / "home"
        t0 = time.perf_counter()
        run = make_run(home, work, args.nodes, args.layers)
        print(f"made run {run}: {args.nodes} nodes in {time.perf_counter() - t0:.1f} s")
        out = work / "studio.out"
        with open(out, "w") as stdout:
            proc = subprocess.Popen(
                [sys.executable, "-m", "steerflow", "--home", str(home), "studio", "--port", "0"],
                stdout=stdout,
                stderr=subprocess.DEVNULL,
            )
        try:
            deadline = time.monotonic() + 30
            while not (m := re.search(r"(http://\S+)", out.read_text())):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the studio did not start")
                time.sleep(0.05)
            url = m.group(1)
            base = url.split("/?", 1)[0]
            with httpx.Client(base_url=base, timeout=60) as client:
                client.get(url.removeprefix(base))
                served: dict[str, list[float]] = {"run": [], "runs": []}

                def get(path: str, key: str) -> None:
                    reply = client.get(path).raise_for_status()
                    # The server's own time (Server-Timing), without the transfer.
                    found = re.search(r"dur=([0-9.]+)", reply.headers.get("server-timing", ""))
                    served[key].append(float(found.group(1)) if found else float("nan"))

                page = timed(lambda: get(f"/runs/{run}", "run"), args.repeat)
                runs = timed(lambda: get("/runs", "runs"), args.repeat)
                api = timed(lambda: client.get(f"/api/runs/{run}").raise_for_status(), args.repeat)
                cookies = client.cookies
            show = timed(lambda: views.show_run(home, run), args.repeat)
            ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
            print(f"baseline views.show_run (show --json read): median {ms(show):.0f} ms, "
                  f"best {1000 * min(show):.0f} ms")  # fmt: skip
            print(f"GET /api/runs/<run> (live poll):          median {ms(api):.0f} ms, "
                  f"best {1000 * min(api):.0f} ms")  # fmt: skip
            print(f"GET /runs/<run> (run page, {args.nodes} nodes):    median {ms(page):.0f} ms, "
                  f"best {1000 * min(page):.0f} ms  (target < 1000 ms)")  # fmt: skip
            # The first answer of each list is the warm-up: left out, as timed() does.
            run_server = statistics.median(served["run"][1:])
            runs_server = statistics.median(served["runs"][1:])
            print(f"GET /runs (runs page, baseline):       median {ms(runs):.0f} ms, "
                  f"server {runs_server:.0f} ms")  # fmt: skip
            print(f"server time, run page of {args.nodes} nodes:  median {run_server:.0f} ms "
                  f"(target < 300 ms for 300 nodes); runs page {runs_server:.0f} ms")  # fmt: skip
            # The first load lays the graph out and reads the result: no cache helps it.
            print(f"server time, first load of the run page:  {served['run'][0]:.0f} ms")
            idle = cpu_over(proc.pid, args.window, 0, base, cookies, run)
            live = cpu_over(proc.pid, args.window, CLIENTS, base, cookies, run)
            print(f"studio CPU, no client:               {idle:.1f} % of a core")
            print(f"studio CPU, {CLIENTS} live pages polling:  {live:.1f} % of a core")
            print(
                f"STUDIO nodes={args.nodes} page_ms={ms(page):.0f} "
                f"page_server_ms={run_server:.0f} first_server_ms={served['run'][0]:.0f} "
                f"runs_server_ms={runs_server:.0f} "
                f"show_ms={ms(show):.0f} "
                f"api_ms={ms(api):.0f} idle_cpu_pct={idle:.1f} live_cpu_pct={live:.1f}"
            )
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
