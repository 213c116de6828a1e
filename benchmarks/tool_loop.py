"""Per-step overhead of a tool loop: Pydantic AI (alone, on DBOS), LangGraph, steerflow (issue 39).

Workload: one agent run of ``--steps`` model requests (default 30) against an
OpenAI-compatible chat-completions server on loopback, run in its own process (so its CPU is
never the client's). The server answers every request, not streamed, after ``--delay-ms``
(default 50 ms), with ``usage``; while the request holds fewer than ``steps - 1`` tool
results (and offers tools) it asks for one call of ``lookup`` (``benchmarks/tool_loop_tools``),
otherwise it answers with text. So a run is ``steps - 1`` tool calls and one final answer.

Rows, each in a fresh child process (all run by ONE invocation of this script):

- ``pydantic-ai``: ``Agent`` with the ``lookup`` tool, ``OpenAIChatModel`` at the loopback
  ``base_url``;
- ``pydantic-ai+dbos``: the same agent wrapped in ``DBOSAgent``
  (``pydantic_ai.durable_exec.dbos``), DBOS with a SQLite system database in a temporary
  directory: every model request and tool call a DBOS step;
- ``langgraph``: the prebuilt ReAct agent (``create_react_agent``) over ``ChatOpenAI``
  with a ``SqliteSaver`` checkpointer in a temporary directory;
- ``steerflow``: ``steerflow flow --plan PLAN --allow-python --json`` in a subprocess, the
  plan one node with ``tools: [python:benchmarks.tool_loop_tools:lookup]``; its per-step
  figures are (loop run - baseline run) / (steps - 1), the baseline the same command on a
  plan of one tool-less node (one model request; process start-up, plan, run directory and
  state DB are in both and cancel out). The baseline is printed too.

Each peer child runs the loop once to warm up (imports, schemas, clients, connection pools;
its CPU is printed as ``cold CPU``), then ``--repeat`` times (default 3), each run a new
conversation; the steerflow row runs baseline and loop ``--repeat`` times, interleaved.
Every figure printed is the median over those runs. Figures:

- ``CPU ms/step``: the child's CPU (``time.process_time``: every thread, user + system)
  over the measured run / steps; for steerflow, ``RUSAGE_CHILDREN`` deltas around the
  subprocess (the whole process: interpreter start-up included, then subtracted);
- ``wall-delay ms/step``: wall time / steps minus the server's delay;
- ``state bytes``: growth of the durable state's files (SQLite DB + its WAL, steerflow's
  home: run directory with journal and artifacts, plus the state DB); ``-shm`` files are
  not durable and not counted. DBOS leaves SQLite in rollback-journal mode, so its figure is
  the DB's net growth only (the journal file is deleted after each transaction);
  LangGraph's ``SqliteSaver`` uses WAL, whose file keeps growing until a checkpoint: read
  ``written`` beside it;
- ``written``: bytes the child passed to ``write``/``pwrite`` (``/proc/self/io`` wchar:
  files, pipes and terminal; not sockets' ``send``) during the run; peer rows only;
- ``fsyncs``: calls of ``fsync``/``fdatasync`` in the process, counted by a tiny
  ``LD_PRELOAD`` shim compiled with ``cc`` at start (it sees SQLite's syncs as well as
  Python's ``os.fsync``); without a C compiler, only ``os.fsync``/``os.fdatasync`` are
  counted (peer rows) and the column says so.

Also printed: the import cost of ``pydantic_ai`` (and of what an OpenAI agent imports)
beside ``import steerflow`` and the bare interpreter: median wall of fresh
``python -c "import ..."`` processes and ``-X importtime``'s cumulative figure.

Then, unless ``--no-kills``, the kill section of ``benchmarks/tool_kills.py`` (its docstring
has the details): a shorter loop (``--kill-steps``, default 10) whose tool is ``charge``, a
side effect, SIGKILLed ``--kills`` times per row (default 10) while its ``--kill-at``-th call
(default 5) is in flight, and recovered in a fresh process the row's documented way (DBOS:
``DBOS.launch()``; LangGraph: ``invoke(None)`` on the thread; steerflow: ``resume``, refused,
then ``--tool-call ID=skip``; Pydantic AI alone: from the start). It counts the kills after
which the in-flight side effect ran again, the calls that had returned and ran again, the
recoveries that finished, and steerflow's refusals.

A row whose package is missing prints ``not installed (pip install ...)``; a row that fails
prints its error. Figures only; nothing is asserted; exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``benchmarks.tool_loop_tools`` from any working directory
    sys.path.insert(0, str(ROOT))

from benchmarks.tool_loop_tools import lookup  # noqa: E402

ROWS = ("pydantic-ai", "pydantic-ai+dbos", "langgraph", "steerflow")
HINTS = {
    "pydantic-ai": "pip install 'pydantic-ai-slim[openai]'",
    "pydantic-ai+dbos": "pip install 'pydantic-ai-slim[openai]' dbos",
    "langgraph": "pip install langgraph langgraph-prebuilt langgraph-checkpoint-sqlite "
    "langchain-openai",
}
NEEDS = {
    "pydantic-ai": ("pydantic_ai", "openai"),
    "pydantic-ai+dbos": ("pydantic_ai", "openai", "dbos"),
    "langgraph": (
        "langgraph",
        "langgraph.prebuilt",
        "langgraph.checkpoint.sqlite",
        "langchain_openai",
    ),
}
PROMPT = "Look up keys with the lookup tool until you are told to stop, then answer."
MODEL = "gpt-4o-mini"
COUNTER_ENV = "TOOL_LOOP_FSYNC_COUNTER"


# -- the loopback server (its own process: ``--serve``) -------------------------------------


def reply(request: dict[str, Any], steps: int) -> dict[str, Any]:
    """The chat completion answering ``request``: one call of its tool, or the final text."""
    done = sum(1 for m in request.get("messages", ()) if m.get("role") == "tool")
    tools = request.get("tools") or ()
    message: dict[str, Any]
    if tools and done < steps - 1:
        arguments = json.dumps({"key": f"k{done}"})
        call: dict[str, Any] = {"id": f"call_{done}", "type": "function"}
        # The first tool offered: ``lookup`` here, ``charge`` in benchmarks/tool_kills.py.
        name = tools[0].get("function", {}).get("name", "lookup")
        call["function"] = {"name": name, "arguments": arguments}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish = "tool_calls"
    else:
        message = {"role": "assistant", "content": f"done after {done} lookups"}
        finish = "stop"
    return {
        "id": f"chatcmpl-{done}",
        "object": "chat.completion",
        "created": 0,
        "model": request.get("model") or MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": 100 + 20 * done,
            "completion_tokens": 10,
            "total_tokens": 110 + 20 * done,
        },
    }


def serve(steps: int, delay_s: float) -> None:
    """Serve on 127.0.0.1 until stdin closes; print the port first."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body are two writes: no delayed ACK

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", 0))
            request = json.loads(self.rfile.read(length) or b"{}")
            time.sleep(delay_s)
            body = json.dumps(reply(request, steps)).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    import threading

    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    print(httpd.server_address[1], flush=True)
    sys.stdin.read()  # the parent closes it (or dies)
    httpd.shutdown()


@contextlib.contextmanager
def server(steps: int, delay_s: float) -> Iterator[str]:
    """The server process; yields its base URL (``.../v1``)."""
    argv = [sys.executable, __file__, "--serve", str(steps), str(delay_s)]
    # The ``with`` closes both pipes when it is over.
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        try:
            port = int(proc.stdout.readline())  # type: ignore[union-attr]
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            proc.stdin.close()  # type: ignore[union-attr]
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- measuring -----------------------------------------------------------------------------

SHIM = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
/* [0]: fsync + fdatasync calls, [1]: bytes written to regular files (every process that
   maps the counter file adds to it) */
static volatile long *counter;
__attribute__((constructor)) static void init(void) {
    const char *path = getenv("TOOL_LOOP_FSYNC_COUNTER");
    if (!path) return;
    int fd = open(path, O_RDWR);
    if (fd < 0) return;
    void *m = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m != MAP_FAILED) counter = m;
}
static void add(int i, long n) {
    if (counter) __atomic_fetch_add(&counter[i], n, __ATOMIC_RELAXED);
}
static long wrote(int fd, long r) {
    struct stat st;
    if (r > 0 && counter && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) add(1, r);
    return r;
}
int fsync(int fd) { add(0, 1); return syscall(SYS_fsync, fd); }
int fdatasync(int fd) { add(0, 1); return syscall(SYS_fdatasync, fd); }
ssize_t write(int fd, const void *b, size_t n) { return wrote(fd, syscall(SYS_write, fd, b, n)); }
ssize_t pwrite(int fd, const void *b, size_t n, off_t o) {
    return wrote(fd, syscall(SYS_pwrite64, fd, b, n, o));
}
ssize_t pwrite64(int fd, const void *b, size_t n, off_t o) {
    return wrote(fd, syscall(SYS_pwrite64, fd, b, n, o));
}
ssize_t writev(int fd, const struct iovec *v, int c) {
    return wrote(fd, syscall(SYS_writev, fd, v, c));
}
"""


def build_shim(tmp: Path) -> Path | None:
    """Compile the fsync-counting ``LD_PRELOAD`` shim; None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not sys.platform.startswith("linux"):
        return None
    (tmp / "shim.c").write_text(SHIM)
    out = tmp / "fsync_count.so"
    argv = [cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(tmp / "shim.c")]
    done = subprocess.run(argv, capture_output=True, check=False)
    return out if done.returncode == 0 else None


def read_counter(path: Path) -> tuple[int, int]:
    """(fsync calls, bytes written to regular files) the shim counted in ``path``."""
    data = path.read_bytes()
    return int.from_bytes(data[:8], sys.byteorder), int.from_bytes(data[8:16], sys.byteorder)


class Counters:
    """fsyncs and bytes written: the shim's shared counters, else ``os.fsync`` and wchar."""

    def __init__(self) -> None:
        path = os.environ.get(COUNTER_ENV)
        self.path = Path(path) if path else None
        self.calls = 0
        if self.path is None:  # no shim: count what Python itself syncs
            for name in ("fsync", "fdatasync"):
                original = getattr(os, name, None)
                if original is not None:
                    setattr(os, name, self._wrap(original))

    def _wrap(self, original: Callable[[int], None]) -> Callable[[Any], None]:
        def counted(fd: Any) -> None:
            self.calls += 1
            original(fd)

        return counted

    def read(self) -> tuple[int, int | None]:
        """(fsyncs, bytes written) so far."""
        if self.path is None:
            return self.calls, wchar()
        return read_counter(self.path)


def counter_file(tmp: Path) -> Path:
    path = tmp / f"counters-{uuid.uuid4().hex}"
    path.write_bytes(bytes(4096))
    return path


def state_bytes(*roots: Path) -> int:
    """Total size of the files under ``roots`` (a file root counts itself), ``-shm`` aside."""
    total = 0
    for root in roots:
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        total += sum(p.stat().st_size for p in files if not p.name.endswith("-shm"))
    return total


def wchar() -> int | None:
    try:
        with open("/proc/self/io", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


# -- the peer rows (each in a child: ``--child ROW``) ---------------------------------------


def pydantic_agent(
    base_url: str, steps: int, name: str, tool: Callable[..., str] = lookup
) -> tuple[Any, Callable[[Any], Any]]:
    """A Pydantic AI agent with ``tool`` and a runner returning its final text."""
    from pydantic_ai import Agent
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    try:
        from pydantic_ai.models.openai import OpenAIChatModel as ChatModel
    except ImportError:  # an older pydantic-ai
        from pydantic_ai.models.openai import OpenAIModel as ChatModel  # type: ignore[no-redef,attr-defined]

    model = ChatModel(MODEL, provider=OpenAIProvider(base_url=base_url, api_key="x"))
    agent = Agent(model, tools=[tool], name=name)
    limits = UsageLimits(request_limit=steps + 5)

    async def run(runner: Any) -> str:
        result = await runner.run(PROMPT, usage_limits=limits)
        return str(result.output)

    return agent, run


def prepare_pydantic_ai(
    base_url: str, steps: int, tmp: Path
) -> tuple[Callable[[], str], list[Path]]:
    agent, run = pydantic_agent(base_url, steps, "bench")
    return lambda: asyncio.run(run(agent)), []


def prepare_dbos(base_url: str, steps: int, tmp: Path) -> tuple[Callable[[], str], list[Path]]:
    from dbos import DBOS

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from pydantic_ai.durable_exec.dbos import DBOSAgent

    db = tmp / "dbos.sqlite"
    config: Any = {"name": "tool_loop_bench", "system_database_url": f"sqlite:///{db}"}
    config["log_level"] = "WARNING"
    DBOS(config=config)
    agent, run = pydantic_agent(base_url, steps, "bench")
    durable = DBOSAgent(agent)
    DBOS.launch()
    loop = asyncio.new_event_loop()  # one loop for both runs: DBOS keeps per-loop state
    return lambda: loop.run_until_complete(run(durable)), [tmp]


def langgraph_graph(base_url: str, db: Path, tool: Callable[..., str] = lookup) -> Any:
    """LangGraph's prebuilt ReAct agent with ``tool``, checkpointed by ``SqliteSaver`` in ``db``."""
    import sqlite3

    from langchain_core.tools import tool as as_tool
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.sqlite import SqliteSaver

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    try:
        from langgraph.prebuilt import create_react_agent
    finally:
        warnings.resetwarnings()
    model = ChatOpenAI(model=MODEL, base_url=base_url, api_key="x", max_retries=0)  # type: ignore[arg-type]
    saver = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_react_agent(model, [as_tool(tool)], checkpointer=saver)


def langgraph_config(thread_id: str, steps: int) -> Any:
    return {"configurable": {"thread_id": thread_id}, "recursion_limit": 2 * steps + 10}


def prepare_langgraph(base_url: str, steps: int, tmp: Path) -> tuple[Callable[[], str], list[Path]]:
    graph = langgraph_graph(base_url, tmp / "langgraph.sqlite")

    def run() -> str:
        config = langgraph_config(uuid.uuid4().hex, steps)
        out = graph.invoke({"messages": [("user", PROMPT)]}, config)
        return str(out["messages"][-1].content)

    return run, [tmp]


PREPARE = {
    "pydantic-ai": prepare_pydantic_ai,
    "pydantic-ai+dbos": prepare_dbos,
    "langgraph": prepare_langgraph,
}


def child(row: str, base_url: str, steps: int, repeat: int) -> None:
    """Run one peer row 1 + ``repeat`` times; print the measured runs' medians as JSON."""
    os.environ["NO_PROXY"] = "127.0.0.1"
    counters = Counters()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tool-loop-") as tmp:
        run, roots = PREPARE[row](base_url, steps, Path(tmp))
        cpu0 = time.process_time()
        run()  # warm-up: imports, schemas, clients, the DB's tables
        cold = time.process_time() - cpu0
        for _ in range(repeat):
            size0, (synced0, written0) = state_bytes(*roots), counters.read()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            text = run()
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            synced1, written1 = counters.read()
            runs.append(
                {
                    "cpu": cpu,
                    "wall": wall,
                    "bytes": state_bytes(*roots) - size0 if roots else None,
                    "fsyncs": synced1 - synced0,
                    "written": written1 - written0 if written0 is not None and written1 else None,
                    "text": text,
                }
            )
        if row == "pydantic-ai+dbos":
            from dbos import DBOS

            DBOS.destroy()
    out = medians(runs)
    out["cold_cpu"] = cold
    print(json.dumps(out), flush=True)


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each numeric figure's median over ``runs``; other values from the last run."""
    out = dict(runs[-1])
    for key, value in out.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in runs)
    out["cpu_all"] = [r["cpu"] for r in runs]
    return out


def measure_peer(
    row: str, base_url: str, steps: int, repeat: int, env: dict[str, str]
) -> dict[str, Any]:
    missing = [m for m in NEEDS[row] if not module_found(m)]
    if missing:
        return {"skipped": f"not installed ({HINTS[row]})"}
    argv = [sys.executable, __file__, "--child", row, base_url, str(steps), str(repeat)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=300)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"skipped": f"failed (exit {done.returncode}): {tail[:200]}"}
    out: dict[str, Any] = json.loads(lines[-1])
    if out["text"] != f"done after {steps - 1} lookups":
        return {"skipped": f"wrong final answer {out['text'][:80]!r}"}
    return out


def module_found(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


# -- the steerflow row (the CLI in a subprocess) ---------------------------------------------


def plan_yaml(tools: bool, steps: int) -> str:
    if tools:
        return (
            "plan:\n"
            "  - agent_id: loop\n"
            f"    instruction: {json.dumps(PROMPT)}\n"
            "    tools: ['python:benchmarks.tool_loop_tools:lookup']\n"
            f"    max_steps: {steps + 10}\n"
        )
    return f"plan:\n  - agent_id: once\n    instruction: {json.dumps(PROMPT)}\n"


def cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def steerflow_env(base_url: str) -> dict[str, str]:
    """The environment of a ``steerflow`` child: the loopback server, this tree importable."""
    env = dict(os.environ)
    # The caller's PYTHONPATH first: PYTHONPATH=/other/src measures another tree's steerflow.
    paths = [env.get("PYTHONPATH", ""), str(ROOT), str(ROOT / "src")]
    env |= {
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "x",
        "NO_PROXY": "127.0.0.1",
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
    }
    env.pop("STEERFLOW_STATE_DB_URL", None)
    return env


def steerflow_once(
    plan: Path, home: Path, base_url: str, tmp: Path, shim: Path | None, expect_steps: int
) -> dict[str, Any]:
    """One ``steerflow flow`` process: CPU, wall, home growth, bytes written, fsyncs.

    The run must complete with the server's last answer, which names the tool calls made.
    """
    expect = f"done after {expect_steps - 1 if expect_steps > 1 else 0} lookups"
    env = steerflow_env(base_url)
    counter = None
    if shim is not None:
        counter = counter_file(tmp)
        env |= {"LD_PRELOAD": str(shim), COUNTER_ENV: str(counter)}
    argv = [sys.executable, "-m", "steerflow", "--home", str(home), "flow", "--plan", str(plan)]
    argv += ["--model", f"openai/{MODEL}", "--json", "--allow-python"]
    size0 = state_bytes(home) if home.exists() else 0
    cpu0, wall0 = cpu_children(), time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=300)
    wall, cpu = time.perf_counter() - wall0, cpu_children() - cpu0
    out: dict[str, Any] = {"cpu": cpu, "wall": wall, "bytes": state_bytes(home) - size0}
    out["fsyncs"], out["written"] = read_counter(counter) if counter else (None, None)
    try:
        result = json.loads(done.stdout)
    except ValueError:
        result = None
    status = result.get("status") if isinstance(result, dict) else None
    if done.returncode != 0 or status != "completed":
        errors = [
            f"node {n.get('id')}: {n['error']}"
            for n in (result or {}).get("nodes", ())
            if isinstance(n, dict) and n.get("error")
        ]
        tail = (done.stderr.strip().splitlines() or [done.stdout.strip()[:200] or "?"])[-1]
        out["error"] = f"exit {done.returncode}, status {status}: {(errors or [tail])[0][:300]}"
    elif expect not in json.dumps(result):
        out["error"] = (
            f"completed, but {expect!r} is not in its result (not {expect_steps} requests?)"
        )
    return out


def measure_steerflow(base_url: str, steps: int, repeat: int, shim: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tool-loop-sf-") as name:
        tmp = Path(name)
        home = tmp / "home"
        loop_plan, base_plan = tmp / "loop.yaml", tmp / "baseline.yaml"
        loop_plan.write_text(plan_yaml(True, steps))
        base_plan.write_text(plan_yaml(False, steps))
        warm = steerflow_once(base_plan, home, base_url, tmp, shim, 1)  # creates the state DB
        if "error" in warm:
            return {"skipped": f"baseline failed: {warm['error']}"}
        bases, loops = [], []
        for _ in range(repeat):  # interleaved: both see the same machine load
            bases.append(steerflow_once(base_plan, home, base_url, tmp, shim, 1))
            loops.append(steerflow_once(loop_plan, home, base_url, tmp, shim, steps))
            if "error" in loops[-1]:
                return {"baseline": medians(bases), "loop": loops[-1]}
        return {"baseline": medians(bases), "loop": medians(loops)}


# -- import cost -----------------------------------------------------------------------------


def import_cost(statement: str, runs: int) -> tuple[float, float | None] | None:
    """(median wall ms of a fresh process running ``statement``, -X importtime total ms)."""
    argv = [sys.executable, "-c", statement]
    if subprocess.run(argv, capture_output=True, check=False).returncode != 0:  # and warm-up
        return None
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=False)
        walls.append((time.perf_counter() - start) * 1000)
    timed = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        capture_output=True,
        text=True,
        check=False,
    )
    total = 0
    for line in timed.stderr.splitlines():  # top-level imports: "| name" with no indent
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", line)
        if match:
            total += int(match.group(1))
    return statistics.median(walls), (total / 1000 if total else None)


# -- the parent ----------------------------------------------------------------------------


def per_step(value: float, steps: int) -> float:
    return value / steps * 1000


def fmt_bytes(n: object) -> str:
    if not isinstance(n, int | float):
        return "-"
    return f"{n / 1e6:.2f} MB" if abs(n) >= 1e5 else f"{n / 1e3:.1f} kB"


def fmt_count(n: object) -> str:
    return f"{n:.0f}" if isinstance(n, int | float) else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="model requests per run (>= 2)")
    parser.add_argument("--delay-ms", type=float, default=50.0, help="server delay per request")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"subset of {','.join(ROWS)}")
    parser.add_argument("--import-runs", type=int, default=5, help="processes per import row")
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument(
        "--repeat", type=int, default=3, help="measured runs per row (medians are printed)"
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-kills", action="store_true", help="skip the kill section (benchmarks/tool_kills.py)"
    )
    from benchmarks import tool_kills

    tool_kills.add_arguments(parser, 10)
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), float(args.serve[1]))
        return 0
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), int(args.child[3]))
        return 0
    if args.steps < 2 or args.repeat < 1:
        parser.error("--steps must be at least 2 and --repeat at least 1")
    rows = [r for r in args.rows.split(",") if r]
    if set(rows) - set(ROWS):
        parser.error(f"unknown rows {sorted(set(rows) - set(ROWS))}")
    kill_rows = [] if args.no_kills else tool_kills.check_arguments(parser, args)
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "-"

    steps, delay = args.steps, args.delay_ms / 1000
    names = ("pydantic-ai-slim", "dbos", "langgraph", "langgraph-checkpoint-sqlite", "openai")
    print(
        f"workload: {steps} model requests per run ({steps - 1} tool calls, then text), "
        f"loopback server in its own process, {args.delay_ms:g} ms delay, not streamed; "
        f"medians of {args.repeat} runs per row"
    )
    print(
        f"platform: {platform.platform()} python {sys.version.split()[0]} cpus={os.cpu_count()} "
        + " ".join(f"{n}={ver(n)}" for n in (*names, "steerflow"))
    )
    results: dict[str, dict[str, Any]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="tool-loop-main-") as name,
        server(steps, delay) as base_url,
    ):
        tmp = Path(name)
        shim = build_shim(tmp)
        # Bytecode now, as tests/conftest.py does: no run below pays (or writes) a compile.
        compileall.compile_dir(ROOT / "src" / "steerflow", quiet=1)
        compileall.compile_dir(ROOT / "benchmarks", quiet=1, maxlevels=0)
        print(
            "fsyncs: "
            + (
                "fsync/fdatasync calls counted by an LD_PRELOAD shim (SQLite's too)"
                if shim
                else "no C compiler: only Python's os.fsync/os.fdatasync counted"
            )
        )
        header = (
            f"{'row':<18} {'CPU ms/step':>11} {'wall-delay ms/step':>18} {'state bytes':>11} "
            f"{'written':>10} {'fsyncs':>7} {'cold CPU ms/step':>16}"
        )
        print(header)
        print("-" * len(header))
        for row in rows:
            if row == "steerflow":
                show_steerflow(measure_steerflow(base_url, steps, args.repeat, shim), steps, delay)
                continue
            env = dict(os.environ)
            if shim is not None:
                env |= {"LD_PRELOAD": str(shim), COUNTER_ENV: str(counter_file(tmp))}
            out = results[row] = measure_peer(row, base_url, steps, args.repeat, env)
            if "skipped" in out:
                print(f"{row:<18} {out['skipped']}", flush=True)
                continue
            print(
                f"{row:<18} {per_step(out['cpu'], steps):>11.2f} "
                f"{per_step(out['wall'], steps) - delay * 1000:>18.2f} "
                f"{fmt_bytes(out['bytes']):>11} {fmt_bytes(out['written']):>10} "
                f"{out['fsyncs']:>7.0f} {per_step(out['cold_cpu'], steps):>16.2f}",
                flush=True,
            )
    print(
        "medians of --repeat runs. CPU: the client process's user+system time / steps (server: "
        "its own process); wall-delay: wall / steps - delay; state bytes: growth of the "
        "durable files (DB + WAL; steerflow: its home, run dir + state DB); written: bytes "
        "written to regular files (shim; without it wchar); cold: the first run in the process"
    )
    print()
    print("import cost (fresh process each; median wall; -X importtime cumulative of top level)")
    statements = {
        "python -c pass": "pass",
        "import steerflow": "import steerflow",
        "import pydantic_ai": "import pydantic_ai",
        "pydantic_ai Agent+OpenAI": "from pydantic_ai import Agent\n"
        "from pydantic_ai.models.openai import OpenAIChatModel",
        "import langgraph.prebuilt": "import langgraph.prebuilt",
    }
    for label, statement in statements.items():
        cost = import_cost(statement, args.import_runs)
        if cost is None:
            print(f"  {label:<26} not installed")
            continue
        wall, cumulative = cost
        extra = f"  importtime {cumulative:7.1f} ms" if cumulative is not None else ""
        print(f"  {label:<26} wall {wall:7.1f} ms{extra}", flush=True)
    if kill_rows:
        print()
        tool_kills.kill_section(kill_rows, args.kills, args.kill_steps, args.kill_at, args.delay_ms)
    return 0


def show_steerflow(out: dict[str, Any], steps: int, delay: float) -> None:
    if "skipped" in out:
        print(f"{'steerflow':<18} {out['skipped']}", flush=True)
        return
    base, loop = out["baseline"], out["loop"]
    fsyncs = base["fsyncs"]
    print(
        f"{'  (baseline, 1 req)':<18} {base['cpu'] * 1000:>11.1f} "
        f"{(base['wall'] - delay) * 1000:>18.1f} {fmt_bytes(base['bytes']):>11} "
        f"{fmt_bytes(base['written']):>10} {fmt_count(fsyncs):>7}"
        "   (whole process, ms: not per step)",
        flush=True,
    )
    if "error" in loop:
        print(f"{'steerflow':<18} failed: {loop['error']}", flush=True)
        return
    extra = steps - 1
    fs = loop["fsyncs"]
    print(
        f"{'steerflow':<18} {(loop['cpu'] - base['cpu']) / extra * 1000:>11.2f} "
        f"{(loop['wall'] - base['wall']) / extra * 1000 - delay * 1000:>18.2f} "
        f"{fmt_bytes(loop['bytes']):>11} {fmt_bytes(loop['written']):>10} "
        f"{fmt_count(fs):>7} "
        f"{'-':>16}",
        flush=True,
    )
    print(
        f"  steerflow: (loop - baseline) / {extra}; loop process {loop['cpu'] * 1000:.0f} ms CPU, "
        f"{loop['wall'] * 1000:.0f} ms wall; state bytes, written, fsyncs: the loop run's whole"
    )


if __name__ == "__main__":
    raise SystemExit(main())
