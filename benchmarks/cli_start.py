"""CLI start-up (issue 29 item 6): wall time of the read and control commands, one process each.

Workload: a fresh home (``--home``, default a temporary directory) with one finished run,
made by ``steerflow play demo --home HOME`` (the bundled playbook, offline echo model).
Then, ``--runs`` times each (default 7), round-robin so that a change in the machine's load
touches every row alike, a new ``python -m steerflow`` process for each of:

- ``ctl pause|resume|stop SESSION`` and ``ctl msg SESSION TEXT``: the run has finished, so
  each is refused (exit 3) after resolving the id in the state DB, the same imports and
  reads as a queued control up to its one INSERT;
- ``ctl status SESSION``, ``runs``, ``runs --json``, ``show RUN``, ``show RUN --json``;

beside ``python -c pass`` (the interpreter alone) and ``python -c "import steerflow"`` (the
facade) measured in the same run. Wall time is taken around ``subprocess.run``; CPU is the
child's user + system time (``RUSAGE_CHILDREN``). The table gives median and p90 (nearest
rank) wall time and median CPU in milliseconds, and each command's exit code. The package
is compiled to bytecode first (``compileall``, as ``tests/conftest.py`` does): with
``PYTHONDONTWRITEBYTECODE`` set and no ``__pycache__``, every process would compile
steerflow from source again, which is not start-up but a missing cache. Target:
every ``ctl``, ``runs`` and ``show`` row under 150 ms wall on an idle machine (compare the
``python -c pass`` row: what the machine's load adds shows there too). Nothing is
asserted; exit 0.

``--otel`` (issue 45) adds a ``play demo`` row (a whole run, one process), and after every
row its twin ``ROW [otel]``: the same command with ``STEERFLOW_OTEL=1`` and
``OTEL_EXPORTER_OTLP_ENDPOINT`` at a loopback OTLP/HTTP sink this script runs. The read
and control commands never trace (their twins show the switch costs them nothing);
``play demo [otel]`` imports the SDK and sends its spans.
"""

from __future__ import annotations

import argparse
import compileall
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import steerflow

PY = sys.executable


def _cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """(wall s, CPU s, exit code) of one process."""
    cpu0 = _cpu_children()
    t0 = time.perf_counter()
    proc = subprocess.run(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=env
    )
    wall = time.perf_counter() - t0
    return wall, _cpu_children() - cpu0, proc.returncode


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def make_run(home: Path) -> tuple[str, str]:
    """Run the bundled demo playbook once; (run_id, session_id) of the finished run."""
    out = subprocess.run(
        [PY, "-m", "steerflow", "--home", str(home), "play", "demo", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["status"] == "completed", result
    return result["run_id"], result["session_id"]


def commands(home: Path, run_id: str, session: str) -> list[tuple[str, list[str]]]:
    cli = [PY, "-m", "steerflow", "--home", str(home)]
    return [
        ("python -c pass", [PY, "-c", "pass"]),
        ("python -c 'import steerflow'", [PY, "-c", "import steerflow"]),
        ("ctl pause", [*cli, "ctl", "pause", session]),
        ("ctl resume", [*cli, "ctl", "resume", session]),
        ("ctl msg", [*cli, "ctl", "msg", session, "focus on tests"]),
        ("ctl stop", [*cli, "ctl", "stop", session]),
        ("ctl status", [*cli, "ctl", "status", session]),
        ("ctl status --json", [*cli, "ctl", "status", session, "--json"]),
        ("runs", [*cli, "runs"]),
        ("runs --json", [*cli, "runs", "--json"]),
        ("show RUN", [*cli, "show", run_id]),
        ("show RUN --json", [*cli, "show", run_id, "--json"]),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=7, help="processes per command (default 7)")
    parser.add_argument("--home", type=Path, help="home to create the run in (default: a temp dir)")
    parser.add_argument(
        "--otel", action="store_true", help="also each row traced, and a play demo row"
    )
    args = parser.parse_args()
    if args.otel:
        from executor_scale import _otlp_sink

        with _otlp_sink() as endpoint:
            return _main(args, endpoint)
    return _main(args, None)


def _main(args: argparse.Namespace, endpoint: str | None) -> int:
    compileall.compile_dir(Path(steerflow.__file__).parent, quiet=1)
    with tempfile.TemporaryDirectory(prefix="sf-cli-start-") as tmp:
        home = args.home or Path(tmp) / "home"
        env_home = os.environ.pop("STEERFLOW_HOME", None)  # --home decides, not the caller's env
        try:
            run_id, session = make_run(home)
            rows = commands(home, run_id, session)
            envs: dict[str, dict[str, str] | None] = {}
            if endpoint is not None:
                rows.append(
                    ("play demo", [PY, "-m", "steerflow", "--home", str(home), "play", "demo"])
                )
                traced = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
                traced |= {"STEERFLOW_OTEL": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
                plain = {k: v for k, v in os.environ.items() if k != "STEERFLOW_OTEL"}
                twins = [(f"{name} [otel]", argv) for name, argv in rows]
                rows = [row for pair in zip(rows, twins, strict=True) for row in pair]
                envs = {name: traced if name.endswith("[otel]") else plain for name, _ in rows}
            walls: dict[str, list[float]] = {name: [] for name, _ in rows}
            cpus: dict[str, list[float]] = {name: [] for name, _ in rows}
            codes: dict[str, set[int]] = {name: set() for name, _ in rows}
            for name, argv in rows:  # one warm-up each: the page cache
                timed(argv, envs.get(name))
            for _ in range(args.runs):
                for name, argv in rows:
                    wall, cpu, code = timed(argv, envs.get(name))
                    walls[name].append(wall)
                    cpus[name].append(cpu)
                    codes[name].add(code)
        finally:
            if env_home is not None:
                os.environ["STEERFLOW_HOME"] = env_home
    load = os.getloadavg()
    print(f"steerflow CLI start-up: {args.runs} runs each, python {sys.version.split()[0]}")
    print(f"package: {Path(steerflow.__file__).parent}")
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'command':<30} {'median ms':>10} {'p90 ms':>8} {'cpu ms':>8}  exit")
    for name, _ in rows:
        print(
            f"{name:<30} {statistics.median(walls[name]) * 1000:>10.1f} "
            f"{p90(walls[name]) * 1000:>8.1f} {statistics.median(cpus[name]) * 1000:>8.1f}  "
            + ",".join(str(c) for c in sorted(codes[name]))
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
