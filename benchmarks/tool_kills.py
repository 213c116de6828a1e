"""A side effect in flight at a kill: who runs it again on recovery (issue 39's goal).

Workload: the loop of ``benchmarks/tool_loop.py`` (the same loopback OpenAI-compatible server
in its own process, the same agent builders), shorter, to keep 10 kills per row in minutes:
``--kill-steps`` model requests (default 10: 9 tool calls, then text), the tool ``charge``
(``benchmarks/tool_loop_tools``), a side effect: each call appends ``KEY PID`` to a ledger
file (one ``write`` on an ``O_APPEND`` descriptor). The ``--kill-at``-th call (default 5:
key ``k4``, asked for by the 5th model request, mid-loop) writes its line, then blocks. The
parent polls the ledger (bounded: 60 s) until that line is there and SIGKILLs the child's
process group (it runs in a session of its own): the call is in flight, its side effect
done, its result recorded nowhere. Then it recovers the run in a FRESH process, each row's
documented way, and reads the ledger again. ``--kills`` times per row (default 10), each kill
in a temporary directory of its own (state, ledger); one server for all.

Rows and their recovery:

- ``pydantic-ai``: ``Agent`` alone has no durable state, so recovery is running the agent
  again from the start;
- ``pydantic-ai+dbos``: ``DBOSAgent`` (SQLite system database) started under a known
  workflow id (``SetWorkflowID``); the fresh process builds the same agent and calls
  ``DBOS.launch()``, which recovers the executor's pending workflows, and waits on
  ``DBOS.retrieve_workflow(ID).get_result()``. ``charge`` is a DBOS step
  (``DBOS.step()(charge)``), as DBOS's docs ask of any function doing I/O: ``DBOSAgent``
  makes each model request a step but runs function tools inline in the workflow;
- ``pydantic-ai+dbos-inline``: the same with ``charge`` a plain function tool (what
  ``DBOSAgent`` does with a tool it is given as is, and what ``tool_loop.py`` measures);
- ``langgraph``: ``create_react_agent`` with ``SqliteSaver``; the fresh process invokes the
  graph again with the same ``thread_id`` and input ``None`` (it continues from the last
  checkpoint);
- ``steerflow``: ``steerflow flow`` (one node, ``tools: [python:...:charge]``); the fresh
  process is ``steerflow resume RUN_DIR``, which refuses (exit 3) naming the unfinished
  call, then ``resume RUN_DIR --tool-call CALL_ID=skip`` (the model is told the call's outcome
  is unknown), which finishes the loop without running it again;
- ``steerflow+idempotent``: the same plan with ``tool_options: {charge: {idempotent: true}}``:
  ``steerflow resume RUN_DIR`` runs the call again without asking, as declared.

Columns, per row over its kills:

- ``killed in flight``: kills that landed while ``charge(k4)`` was blocked (its line written);
- ``in-flight ran again``: kills after which the recovery wrote another ``k4`` line;
- ``done calls ran again``: lines the recovery wrote for keys whose calls had returned before
  the kill (summed over the kills): those results were durable, or not;
- ``recovered``: recoveries that finished the loop with the server's final answer
  (``done after 9 lookups``: the server counts tool results, so a skipped call counts too);
- ``refused first``: steerflow's resumes that refused (exit 3) naming ``charge`` and ``k4``
  before the operator's decision;
- ``recovery s``: median wall time of the recovery (steerflow: refusal plus decision).

A row whose package is missing prints ``not installed (pip install ...)``; a kill that goes
wrong (the child exits before the call, a recovery fails) is counted as not recovered and
its first error is printed under the table. Figures only; nothing is asserted; exit 0.
``--kill-rows`` picks rows. ``benchmarks/tool_loop.py`` runs this section after its own
tables, with the same options (``--no-kills`` skips it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``benchmarks.*`` from any working directory
    sys.path.insert(0, str(ROOT))

from benchmarks.tool_loop import (  # noqa: E402
    HINTS,
    MODEL,
    NEEDS,
    langgraph_config,
    langgraph_graph,
    module_found,
    pydantic_agent,
    server,
    steerflow_env,
)
from benchmarks.tool_loop_tools import HANG_ENV, LEDGER_ENV, charge  # noqa: E402

ROWS = (
    "pydantic-ai",
    "pydantic-ai+dbos",
    "pydantic-ai+dbos-inline",
    "langgraph",
    "steerflow",
    "steerflow+idempotent",
)
RECOVERY = {
    "pydantic-ai": "no durable state: the agent runs again from the start",
    "pydantic-ai+dbos": "DBOS.launch() recovers the pending workflow (tool a DBOS step)",
    "pydantic-ai+dbos-inline": "the same, the tool a plain function (run inline)",
    "langgraph": "invoke(None) on the same thread_id",
    "steerflow": "resume: refused (exit 3), then --tool-call ID=skip",
    "steerflow+idempotent": "resume (declared idempotent: runs it again)",
}
PROMPT = "Charge keys with the charge tool until you are told to stop, then answer."
#: Bounds: a child importing its framework and reaching the kill point; one recovery.
REACH_S, RECOVER_S = 60.0, 120.0


# -- the peer rows (each phase a child: ``--child ROW PHASE URL STEPS DIR ID``) -------------


def run_pydantic_ai(phase: str, base_url: str, steps: int, tmp: Path, run_id: str) -> str:
    """Both phases the same: without durable state, recovering is running it again."""
    agent, run = pydantic_agent(base_url, steps, "kills", charge)
    return str(asyncio.run(run(agent)))


def run_dbos(phase: str, base_url: str, steps: int, tmp: Path, run_id: str) -> str:
    """``charge`` a DBOS step, as DBOS's docs say of any function with I/O."""
    return dbos_agent(phase, base_url, steps, tmp, run_id, step=True)


def run_dbos_inline(phase: str, base_url: str, steps: int, tmp: Path, run_id: str) -> str:
    """``charge`` a plain function: ``DBOSAgent`` runs function tools inline in the workflow."""
    return dbos_agent(phase, base_url, steps, tmp, run_id, step=False)


def dbos_agent(phase: str, base_url: str, steps: int, tmp: Path, run_id: str, step: bool) -> str:
    """``run``: the workflow under ``run_id``; ``recover``: ``DBOS.launch()`` recovers it."""
    from dbos import DBOS, SetWorkflowID

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from pydantic_ai.durable_exec.dbos import DBOSAgent

    config: Any = {"name": "tool_kills", "system_database_url": f"sqlite:///{tmp / 'dbos.db'}"}
    config["log_level"] = "WARNING"
    DBOS(config=config)
    tool = DBOS.step(name="charge")(charge) if step else charge
    agent, run = pydantic_agent(base_url, steps, "kills", tool)
    durable = DBOSAgent(agent)
    DBOS.launch()  # in the fresh process, this starts the recovery of the pending workflow
    try:
        if phase == "run":
            with SetWorkflowID(run_id):
                return str(asyncio.run(run(durable)))
        return str(DBOS.retrieve_workflow(run_id).get_result().output)
    finally:
        DBOS.destroy()


def run_langgraph(phase: str, base_url: str, steps: int, tmp: Path, run_id: str) -> str:
    """``run``: a new thread; ``recover``: input ``None`` continues its last checkpoint."""
    graph = langgraph_graph(base_url, tmp / "langgraph.sqlite", charge)
    start = {"messages": [("user", PROMPT)]} if phase == "run" else None
    out = graph.invoke(start, langgraph_config(run_id, steps))
    return str(out["messages"][-1].content)


PEERS: dict[str, Callable[[str, str, int, Path, str], str]] = {
    "pydantic-ai": run_pydantic_ai,
    "pydantic-ai+dbos": run_dbos,
    "pydantic-ai+dbos-inline": run_dbos_inline,
    "langgraph": run_langgraph,
}


def child(row: str, phase: str, base_url: str, steps: int, tmp: str, run_id: str) -> None:
    """One phase of a peer row; prints its final text as JSON."""
    os.environ["NO_PROXY"] = "127.0.0.1"
    text = PEERS[row](phase, base_url, steps, Path(tmp), run_id)
    print(json.dumps({"text": text}), flush=True)


# -- killing and counting --------------------------------------------------------------------


@dataclass
class Kill:
    """What one kill and its recovery did."""

    killed: bool = False
    ran_again: bool = False
    done_again: int = 0
    recovered: bool = False
    refused: bool = False
    recover_s: float | None = None
    error: str | None = None


def ledger(path: Path) -> list[str]:
    """The keys ``charge`` was called with, in order."""
    if not path.exists():
        return []
    return [line.split()[0] for line in path.read_text().splitlines() if line.strip()]


def start_child(argv: list[str], env: dict[str, str], tmp: Path) -> subprocess.Popen[bytes]:
    """A child in a session of its own (its group is what the kill ends); output to files."""
    out, err = (tmp / "run.out").open("wb"), (tmp / "run.err").open("wb")
    with out, err:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=err, start_new_session=True)


def kill_in_flight(proc: subprocess.Popen[bytes], path: Path, key: str, tmp: Path) -> str | None:
    """SIGKILL ``proc``'s group once ``charge(key)`` has written its line; None, or the error.

    Polls the ledger against a deadline; a child that ends first is an error, not a kill.
    """
    deadline = time.monotonic() + REACH_S
    while key not in ledger(path):
        if proc.poll() is not None:
            tail = (tmp / "run.err").read_text(errors="replace").strip().splitlines() or ["?"]
            return f"exited {proc.returncode} before charge({key!r}): {tail[-1][:200]}"
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return f"charge({key!r}) not reached in {REACH_S:g} s"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return None


def bounded(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a recovery to its end, within ``RECOVER_S`` (past it: exit 124, said in stderr)."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=RECOVER_S)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"still running after {RECOVER_S:g} s")


def count(kill: Kill, keys: list[str], before: int, key: str) -> None:
    """Fill ``kill`` from the ledger: what the recovery (lines after ``before``) ran."""
    done = set(keys[: keys.index(key)])  # returned before the kill
    after = Counter(keys[before:])
    kill.ran_again = after[key] > 0
    kill.done_again = sum(n for k, n in after.items() if k in done)


def peer_kill(row: str, base_url: str, steps: int, key: str, tmp: Path) -> Kill:
    """Run the peer row's agent, kill it with ``charge(key)`` in flight, recover, count."""
    kill, path, run_id = Kill(), tmp / "ledger", uuid.uuid4().hex
    env = dict(os.environ) | {LEDGER_ENV: str(path), "NO_PROXY": "127.0.0.1"}

    def argv(phase: str) -> list[str]:
        return [sys.executable, __file__, "--child", row, phase, base_url, str(steps), str(tmp)]

    proc = start_child([*argv("run"), run_id], env | {HANG_ENV: key}, tmp)
    kill.error = kill_in_flight(proc, path, key, tmp)
    if kill.error:
        return kill
    kill.killed, before = True, len(ledger(path))
    wall0 = time.perf_counter()
    done = bounded([*argv("recover"), run_id], env)
    kill.recover_s = time.perf_counter() - wall0
    count(kill, ledger(path), before, key)
    lines = done.stdout.strip().splitlines()
    text = json.loads(lines[-1])["text"] if done.returncode == 0 and lines else None
    kill.recovered = text == f"done after {steps - 1} lookups"
    if not kill.recovered:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        kill.error = f"recovery exit {done.returncode}, answer {text!r}: {tail[:200]}"
    return kill


def plan_yaml(idempotent: bool, steps: int) -> str:
    plan = (
        "plan:\n"
        "  - agent_id: loop\n"
        f"    instruction: {json.dumps(PROMPT)}\n"
        "    tools: ['python:benchmarks.tool_loop_tools:charge']\n"
        f"    max_steps: {steps + 10}\n"
    )
    return plan + ("tool_options: {charge: {idempotent: true}}\n" if idempotent else "")


def steerflow_cli(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "steerflow", "--home", str(home), *args]


def completed(done: subprocess.CompletedProcess[str], steps: int) -> bool:
    """A CLI that completed its run with the server's final answer."""
    try:
        result = json.loads(done.stdout)
    except ValueError:
        return False
    return (
        done.returncode == 0
        and result.get("status") == "completed"
        and f"done after {steps - 1} lookups" in done.stdout
    )


def steerflow_kill(idempotent: bool, base_url: str, steps: int, key: str, tmp: Path) -> Kill:
    """``steerflow flow`` killed with ``charge(key)`` in flight; ``steerflow resume``; count."""
    kill, path, home = Kill(), tmp / "ledger", tmp / "home"
    (tmp / "plan.yaml").write_text(plan_yaml(idempotent, steps))
    env = steerflow_env(base_url) | {LEDGER_ENV: str(path)}
    flow = steerflow_cli(home, "flow", "--plan", str(tmp / "plan.yaml"), "--allow-python")
    flow += ["--model", f"openai/{MODEL}", "--json"]
    proc = start_child(flow, env | {HANG_ENV: key}, tmp)
    kill.error = kill_in_flight(proc, path, key, tmp)
    if kill.error:
        return kill
    kill.killed, before = True, len(ledger(path))
    (run_dir,) = (home / "runs").iterdir()  # a home of its own: the killed run is its only one

    def resume(*more: str) -> subprocess.CompletedProcess[str]:
        return bounded(steerflow_cli(home, "resume", str(run_dir), *more, "--json"), env)

    wall0 = time.perf_counter()
    done = resume()
    if not idempotent:
        call = re.search(r"--tool-call (\S+)=retry", done.stderr)
        named = "'charge'" in done.stderr and f'"{key}"' in done.stderr
        kill.refused = done.returncode == 3 and call is not None and named
        if call is not None:
            done = resume("--tool-call", f"{call.group(1)}=skip")
    kill.recover_s = time.perf_counter() - wall0
    count(kill, ledger(path), before, key)
    kill.recovered = completed(done, steps)
    if not kill.recovered:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        kill.error = f"resume exit {done.returncode}: {tail[:200]}"
    return kill


# -- the section ---------------------------------------------------------------------------


@dataclass
class Row:
    """A row's kills, or why it has none."""

    name: str
    kills: list[Kill] = field(default_factory=list)
    skipped: str | None = None


def measure(row: str, base_url: str, steps: int, key: str, kills: int) -> Row:
    """``kills`` kills of ``row``, each in a temporary directory of its own."""
    peer = row.removesuffix("-inline")
    if peer in NEEDS:
        missing = [m for m in NEEDS[peer] if not module_found(m)]
        if missing:
            return Row(row, skipped=f"not installed ({HINTS[peer]})")
    out = Row(row)
    for _ in range(kills):
        with tempfile.TemporaryDirectory(prefix="tool-kills-") as name:
            if row.startswith("steerflow"):
                kill = steerflow_kill(row != "steerflow", base_url, steps, key, Path(name))
            else:
                kill = peer_kill(row, base_url, steps, key, Path(name))
        out.kills.append(kill)
    return out


#: The table's columns and their widths (the row name's, then right-aligned figures).
COLUMNS = (
    ("row", 23),
    ("kills", 5),
    ("killed in flight", 16),
    ("in-flight ran again", 19),
    ("done calls ran again", 20),
    ("recovered", 9),
    ("refused first", 13),
    ("recovery s", 10),
)


def table_line(cells: list[str], how: str) -> str:
    (_, width), *rest = COLUMNS
    figures = zip(cells[1:], rest, strict=True)
    line = f"{cells[0]:<{width}}" + "".join(f" {c:>{w}}" for c, (_, w) in figures)
    return f"{line}  {how}"


def show(row: Row) -> None:
    if row.skipped:
        print(f"{row.name:<{COLUMNS[0][1]}} {row.skipped}", flush=True)
        return
    ks, n = row.kills, len(row.kills)
    times = [k.recover_s for k in ks if k.recover_s is not None]
    cells = [
        row.name,
        str(n),
        f"{sum(k.killed for k in ks)} of {n}",
        f"{sum(k.ran_again for k in ks)} of {n}",
        str(sum(k.done_again for k in ks)),
        f"{sum(k.recovered for k in ks)} of {n}",
        f"{sum(k.refused for k in ks)} of {n}" if row.name == "steerflow" else "-",
        f"{statistics.median(times):.2f}" if times else "-",
    ]
    print(table_line(cells, RECOVERY[row.name]), flush=True)


def kill_section(rows: list[str], kills: int, steps: int, kill_at: int, delay_ms: float) -> None:
    """Print the kill table for ``rows`` (one server for all, its own ``steps``)."""
    key = f"k{kill_at - 1}"
    print(
        f"kills: {steps} model requests per run ({steps - 1} charge calls, then text), "
        f"{delay_ms:g} ms delay; SIGKILL of the process group while charge({key!r}) "
        f"(tool call {kill_at}) is in flight, its ledger line written; recovery in a fresh "
        f"process; {kills} kills per row"
    )
    header = table_line([name for name, _ in COLUMNS], "how it recovers")
    print(header)
    print("-" * len(header))
    measured: list[Row] = []
    with server(steps, delay_ms / 1000) as base_url:
        for name in rows:
            measured.append(measure(name, base_url, steps, key, kills))
            show(measured[-1])
    print(
        "in-flight ran again: recoveries that called charge again for the key in flight at the "
        "kill; done calls ran again: calls (summed) for keys that had returned before it; "
        "recovered: finished with the final answer; recovery s: median wall"
    )
    for row in measured:
        errors = [k.error for k in row.kills if k.error]
        if errors:
            print(f"  {row.name}: {len(errors)} kill(s) went wrong; first: {errors[0]}")


def add_arguments(parser: argparse.ArgumentParser, kills_default: int) -> None:
    """The kill section's options (shared with ``benchmarks/tool_loop.py``)."""
    parser.add_argument(
        "--kills", type=int, default=kills_default, help="kills per row (default 10)"
    )
    parser.add_argument(
        "--kill-steps", type=int, default=10, help="model requests per killed run (default 10)"
    )
    parser.add_argument(
        "--kill-at", type=int, default=5, help="the tool call in flight at the kill (default 5)"
    )
    parser.add_argument("--kill-rows", default=",".join(ROWS), help=f"subset of {','.join(ROWS)}")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The kill rows to run; a bad combination is a usage error."""
    rows = [r for r in args.kill_rows.split(",") if r]
    if set(rows) - set(ROWS):
        parser.error(f"unknown kill rows {sorted(set(rows) - set(ROWS))}")
    if args.kills < 1 or not 1 <= args.kill_at < args.kill_steps:
        parser.error("--kills must be at least 1 and --kill-at between 1 and --kill-steps - 1")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_arguments(parser, 10)
    parser.add_argument("--delay-ms", type=float, default=50.0, help="server delay per request")
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        row, phase, url, steps, tmp, run_id = args.child
        child(row, phase, url, int(steps), tmp, run_id)
        return 0
    rows = check_arguments(parser, args)
    kill_section(rows, args.kills, args.kill_steps, args.kill_at, args.delay_ms)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
