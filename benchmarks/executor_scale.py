"""The executor at 1,000 and 10,000 nodes beside ``asyncio.gather`` and LangGraph (issue 17).

Workload: one DAG of 100 layers; node ``(layer, i)`` depends on node ``(layer - 1, i)``, so a
10,000-node DAG is 100 columns 100 layers deep. Every node runs the offline ``echo`` model:
its response is its id and its rendered instruction, which holds its dependency's result
(``### dep (completed)`` + response), exactly as the executor renders it. The baselines
compute the same strings:

- ``asyncio.gather``: one task per node awaiting its dependency's event (the floor);
- ``langgraph``: a ``StateGraph`` with one async node per DAG node, its edges the DAG's,
  the results merged into one dict channel (LangGraph 1.2, the optional ``bench`` extra);
- ``steerflow``: ``FlowExecutor`` over the graph ``build_graph`` makes of the plan, the
  ``echo`` provider, concurrency 64, no checkpoint;
- ``steerflow+v3``: the same, plus the run's real checkpoint path: a version 3
  ``CheckpointWriter`` (default limits) behind the ``CheckpointRecorder`` completion
  observer, branch files and all, in a temporary run directory;
- ``steerflow+v4``: the same with a version 4 checkpoint (segments under a manifest,
  decision 340); skipped with a note on a tree without it;
- ``langgraph+sqlite``: the ``langgraph`` row compiled with LangGraph's ``AsyncSqliteSaver``
  (``langgraph-checkpoint-sqlite``, a real SQLite file in a temporary directory), the
  checkpointer a LangGraph user would reach for (issue 43);
- ``steerflow+lease``, ``steerflow+v3+lease``: the same, plus the run's lease (issue 27):
  a session in a real SQLite state DB, its ``LeaseKeeper`` renewing it, and the keeper as
  the executor's (and the recorder's) fence: every provider call and every record checks it.
- ``steerflow+python``, ``steerflow+python-async``: ``steerflow`` with every node a function
  node (``python:__main__:echo_node``, a plain function run in its own thread, and
  ``python:__main__:echo_node_async``) computing the echo text (issue 29);
- ``steerflow+plugin``: a provider plugin found through the ``steerflow.providers`` entry
  point group (a distribution written to a temporary directory on ``sys.path``), answering
  the echo text and setting ``needs_artifact_dir = False``;
- ``steerflow+custom``: the same provider class keeping the ``Provider`` default
  ``needs_artifact_dir = True``: one ``mkdir`` per node, what a custom provider paid before.
- ``run_flow``, ``run_flow+v4``: the public path a user's batch takes, and the one issue 43
  measured: ``run_flow(FlowOptions(plan=Plan([Op(...), ...]), model="echo"))`` with its
  state DB, lease, progress events, version 3 (default) or version 4 checkpoint and its
  ``FlowResult``; everything but the ``Plan`` built inside the timed run.
- ``resume+v4``: what a crashed batch's resume costs: the ``run_flow+v4`` batch is run
  first by a process of its own, then the child loads its checkpoint (``prepare_resume``)
  and resumes it with ``run_flow``, every node replayed; its peak RSS, bytes and time are
  the load and the resume's (the ``ckpt`` column: the resumed run's checkpoint).

Each row runs in a fresh child process, so its peak RSS (``VmHWM`` of that child, read by
the child at its end; ``ru_maxrss`` from ``os.wait4`` off Linux) is its own. Wall and CPU
(``time.process_time``: every thread of the child) cover the run alone, not imports or graph
building. ``bytes`` is what the child wrote during the run (``wchar`` of ``/proc/self/io``:
base, journal, compactions, branch files). ``resp`` is the bytes of every node's response
(computed the same way in the parent) and ``ratio`` is ``ckpt / resp`` (``written / resp``
for a row without a checkpoint counter), the issue-43 figure (goal: at most 3x at 10,000
and 100,000 nodes). ``--nodes 1000,10000,100000`` adds
the 100,000-node size; ``--timeout`` bounds each child (a row that does not finish says so).
The last column is the log-log slope of CPU against nodes between the smallest and largest
size (1.0 = linear). Figures only; nothing is asserted.

``--otel`` adds a ``ROW+otel`` line after each steerflow row: the same run traced (issue 45),
its tracer subscribed to the executor's events as a run's is, every call's intent opening a
model-request span (the row also pays for the intent object, which a real run always does),
exported over OTLP/HTTP to a loopback sink the parent runs (or ``OTEL_EXPORTER_OTLP_ENDPOINT``)
and flushed inside the timed run.

Run ``PYTHONPATH=/path/to/other/src python benchmarks/executor_scale.py`` to measure
another tree with the same script; a row whose API that tree lacks is skipped with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

LAYERS = 100
CONCURRENCY = 64
ROWS = (
    "asyncio.gather",
    "langgraph",
    "langgraph+sqlite",
    "steerflow",
    "steerflow+lease",
    "steerflow+v3",
    "steerflow+v4",
    "steerflow+v3+lease",
    "steerflow+python",
    "steerflow+python-async",
    "steerflow+plugin",
    "steerflow+custom",
    "run_flow",
    "run_flow+v4",
    "resume+v4",
)
LANGGRAPH_HINT = "pip install -e '.[bench]'  (LangGraph 1.2, the optional bench extra)"


# -- the DAG -------------------------------------------------------------------------------


def key(layer: int, i: int) -> str:
    return f"n{layer:03d}-{i:04d}"


def dag(nodes: int) -> list[tuple[str, str, str | None]]:
    """``(key, instruction, dependency key or None)`` in layer order."""
    width = max(1, nodes // LAYERS)
    return [
        (key(layer, i), f"task {layer}.{i}", key(layer - 1, i) if layer else None)
        for layer in range(nodes // width)
        for i in range(width)
    ]


def echo(node: str, instruction: str, dep: str | None, dep_text: str | None) -> str:
    """The echo model's response, with the dependency block the executor renders."""
    if dep is not None:
        instruction += f"\n\n[RESULTS OF DEPENDENCIES]\n### {dep} (completed)\n{dep_text}"
    return f"[echo {node}]\n{instruction}"


# -- rows (each runs in a child) -------------------------------------------------------------


def merge(a: dict[str, str], b: dict[str, str]) -> dict[str, str]:
    # In place: a copying reducer would charge LangGraph O(n) per write, O(n²) per run.
    a.update(b)
    return a


class State(TypedDict):
    """LangGraph's state: every node's result, merged (module level: its hints resolve)."""

    results: Annotated[dict[str, str], merge]


async def run_gather(nodes: list[tuple[str, str, str | None]]) -> dict[str, Any]:
    done = {k: asyncio.Event() for k, _, _ in nodes}
    results: dict[str, str] = {}

    async def node(k: str, instruction: str, dep: str | None) -> None:
        if dep is not None:
            await done[dep].wait()
        results[k] = echo(k, instruction, dep, results.get(dep) if dep else None)
        done[k].set()

    await asyncio.gather(*(node(*n) for n in nodes))
    return {"completed": len(results)}


def response_bytes(nodes: list[tuple[str, str, str | None]]) -> int:
    """The bytes of every node's response (what the checkpoint must keep at the least)."""
    texts: dict[str, str] = {}
    total = 0
    for k, instruction, dep in nodes:
        texts[k] = echo(k, instruction, dep, texts[dep] if dep else None)
        total += len(texts[k].encode())
    return total


def prepare_langgraph(
    nodes: list[tuple[str, str, str | None]], sqlite: Path | None = None
) -> Callable[[], Any]:
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(State)

    def make(k: str, instruction: str, dep: str | None) -> Callable[[State], Any]:
        async def node(state: State) -> dict[str, dict[str, str]]:
            dep_text = state["results"].get(dep) if dep else None
            return {"results": {k: echo(k, instruction, dep, dep_text)}}

        return node

    for k, instruction, dep in nodes:
        builder.add_node(k, make(k, instruction, dep))
        builder.add_edge(dep or START, k)
    has_child = {dep for _, _, dep in nodes if dep}
    for k, _, _ in nodes:
        if k not in has_child:
            builder.add_edge(k, END)
    if sqlite is None:
        graph = builder.compile()

        async def run() -> dict[str, Any]:
            out = await graph.ainvoke({"results": {}}, {"recursion_limit": LAYERS * 2 + 10})
            return {"completed": len(out["results"])}

        return run

    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async def run_sqlite() -> dict[str, Any]:
        async with AsyncSqliteSaver.from_conn_string(str(sqlite)) as saver:
            graph = builder.compile(checkpointer=saver)
            config = {"recursion_limit": LAYERS * 2 + 10, "configurable": {"thread_id": "1"}}
            out = await graph.ainvoke({"results": {}}, config)
        return {"completed": len(out["results"])}

    return run_sqlite


def echo_node(call: Any) -> str:
    """The function node of the ``steerflow+python`` row: the echo model's text."""
    return f"[echo {call.node_id}]\n{call.instruction}"


async def echo_node_async(call: Any) -> str:
    return f"[echo {call.node_id}]\n{call.instruction}"


PLUGIN_MODULE = """
from steerflow.providers import Provider, ProviderResponse, echo_text

class Plugin(Provider):
    needs_artifact_dir = False

    def __init__(self, spec):
        self.spec = spec

    async def invoke(self, request):
        return ProviderResponse(text=echo_text(request))

    async def plan(self, request):
        raise NotImplementedError

class Custom(Plugin):
    needs_artifact_dir = True  # the Provider default

def plugin(spec):
    return Plugin(spec)

def custom(spec):
    return Custom(spec)
"""


def row_provider(row: str, tmp: Path) -> Any:
    """The provider a row's nodes run: echo, a function node, or a plugin's."""
    from steerflow.providers import EchoProvider, make_provider

    if row.endswith("+python"):
        return make_provider("python:__main__:echo_node")
    if row.endswith("+python-async"):
        return make_provider("python:__main__:echo_node_async")
    if row.endswith(("+plugin", "+custom")):
        site = tmp / "site"
        info = site / "bench_plugin-0.1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bench-plugin\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(
            "[steerflow.providers]\nbenchplug = bench_plugin:plugin\n"
            "benchcustom = bench_plugin:custom\n"
        )
        (site / "bench_plugin.py").write_text(PLUGIN_MODULE)
        sys.path.insert(0, str(site))
        return make_provider("benchplug/x" if row.endswith("+plugin") else "benchcustom/x")
    return EchoProvider()


def prepare_steerflow(
    nodes: list[tuple[str, str, str | None]],
    tmp: Path,
    *,
    checkpoint: int | None,
    lease: bool = False,
    provider: Any = None,
) -> Callable[[], Any]:
    from steerflow.executor import FlowExecutor, SharedContext, build_graph
    from steerflow.plan import parse_plan
    from steerflow.providers import EchoProvider

    entries = [
        {"agent_id": k, "instruction": instruction, **({"depends_on": [dep]} if dep else {})}
        for k, instruction, dep in nodes
    ]
    plan = parse_plan({"plan": entries}, source="bench", max_entries=None)
    graph = build_graph(plan)
    provider = provider or EchoProvider()
    home = tmp / "home"
    home.mkdir(mode=0o700)
    context = SharedContext()
    artifacts = tmp / "artifacts"
    artifacts.mkdir(mode=0o700)
    executor = FlowExecutor(
        graph,
        provider_for=lambda op: provider,
        run_id="bench",
        home=home,
        artifact_dir=lambda leg: artifacts / leg,
        concurrency=CONCURRENCY,
        context=context,
    )
    traced = _trace(executor, graph) if os.environ.get("STEERFLOW_BENCH_OTEL") else None
    if checkpoint is None:
        fence = _lease_keeper(home) if lease else None
        executor.fence = fence

        async def run_plain() -> dict[str, Any]:
            stop = asyncio.Event()
            async with asyncio.TaskGroup() as tasks:
                if fence is not None:
                    tasks.create_task(fence.run(stop))
                    # Confirmed before the first node, as a run's is long before its first
                    # call; a first call that waits for it would change how every task
                    # after it is scheduled, not what the fence costs.
                    await fence.hold()
                await executor.run()
                stop.set()
            if traced is not None:
                await _end_trace(traced)
            return {"completed": sum(op.status == "completed" for op in graph)}

        return run_plain

    from steerflow.checkpoint import CheckpointWriter
    from steerflow.home import allocate_run_dir
    from steerflow.orchestrate._recorder import CheckpointRecorder
    from steerflow.plan import plan_to_checkpoint

    run_dir = allocate_run_dir(home)
    writer = CheckpointWriter(
        run_dir.checkpoint_path,
        session_id="0" * 32,
        prompt="executor scale",
        plan=plan_to_checkpoint(plan, {op.key: op.node_id for op in graph.planned}),
        config={"model_spec": "echo", "concurrency": CONCURRENCY, "kind": "flow"},
        flow_context=context.content,
        version=checkpoint,
    )
    recorder = CheckpointRecorder(writer, graph, run_dir, context, executor.events)
    executor.observers.append(recorder.record_outcome)
    executor.spawn_observers.append(recorder.record_intent)
    keeper = _lease_keeper(home) if lease else None
    if keeper is not None:
        executor.fence = recorder.fence = keeper

    async def run_v3() -> dict[str, Any]:
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            if keeper is not None:
                tasks.create_task(keeper.run(stop))
                await keeper.hold()  # as above
            await recorder.flush()
            await executor.run()
            outcome = await recorder.close()
            stop.set()
        if traced is not None:
            await _end_trace(traced)
        if not outcome.persisted:
            raise RuntimeError(f"checkpoint not persisted: {outcome.error}")
        counted = getattr(writer, "bytes_written", None)
        return {
            "completed": sum(op.status == "completed" for op in graph),
            "writer_bytes": counted if isinstance(counted, int) else None,
        }

    return run_v3


def prepare_run_flow(
    nodes: list[tuple[str, str, str | None]], tmp: Path, *, version: int
) -> Callable[[], Any]:
    from steerflow.orchestrate import FlowOptions, run_flow
    from steerflow.plan import Op, Plan

    plan = Plan([Op(k, text, depends_on=[dep] if dep else ()) for k, text, dep in nodes])
    options = FlowOptions(
        plan=plan,
        model="echo",
        concurrency=CONCURRENCY,
        checkpoint_version=version,
        max_plan_entries=len(nodes),
    )

    async def run() -> dict[str, Any]:
        return _figures(await run_flow(options, home=tmp / "home"))

    return run


def _figures(result: Any) -> dict[str, Any]:
    """A ``FlowResult``'s nodes completed and checkpoint bytes (a run that failed raises)."""
    if result.status != "completed":
        raise RuntimeError(f"run ended {result.status}: {result.error}")
    return {
        "completed": sum(n.get("status") == "completed" for n in result.nodes),
        "writer_bytes": (result.checkpoint or {}).get("bytes_written"),
    }


def prepare_resume_v4(nodes: list[tuple[str, str, str | None]], tmp: Path) -> Callable[[], Any]:
    """``resume+v4``: the batch run by another process first, then its resume (timed)."""
    from steerflow.orchestrate import FlowOptions, run_flow
    from steerflow.orchestrate._resume import prepare_resume

    argv = [sys.executable, os.path.abspath(__file__), "--first-run", str(len(nodes)), str(tmp)]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    home = tmp / "home"

    async def run() -> dict[str, Any]:
        (source,) = (home / "runs").iterdir()
        seed = prepare_resume(home, source.name)
        options = FlowOptions(
            resume=seed, model="echo", checkpoint_version=4, max_plan_entries=len(nodes)
        )
        return _figures(await run_flow(options, home=home))

    return run


def _trace(executor: Any, graph: Any) -> Any:
    """The run's tracer wired as ``FlowRun`` wires it (``--otel`` rows)."""
    from steerflow.tracing._run import RunTracer

    tracer = RunTracer.begin(kind="flow")
    executor.events.subscribe(tracer.on_event)
    tracer.watch_graph(graph.ops.get)

    async def allow(op: Any, intent: Any) -> bool:
        return True

    executor.before_call = tracer.wrap_intent(allow)
    return tracer


async def _end_trace(tracer: Any) -> None:
    tracer.end(status="completed")
    await asyncio.to_thread(tracer.flush)


@contextlib.contextmanager
def _otlp_sink() -> Any:
    """A loopback OTLP/HTTP endpoint that takes every request (what a collector costs us)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _lease_keeper(home: Path) -> Any:
    from steerflow.home import new_run_id
    from steerflow.orchestrate._lease import LeaseKeeper
    from steerflow.state import StateDB

    os.environ.pop("STEERFLOW_STATE_DB_URL", None)
    db = StateDB.open(home)
    row = db.create_session(kind="flow", run_id=new_run_id(time.time()))
    return LeaseKeeper(db, row.id, row.lease_epoch)


def wchar() -> int | None:
    try:
        with open("/proc/self/io", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def own_peak_mib() -> float | None:
    """This process's peak RSS since its ``exec`` (``VmHWM``), in MiB; None off Linux."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def child(row: str, count: int) -> None:
    """Run one row and print its figures as one JSON line (RSS is read by the parent)."""
    nodes = dag(count)
    with tempfile.TemporaryDirectory(prefix="steerflow-scale-") as tmp:
        try:
            if row == "asyncio.gather":
                run: Callable[[], Any] = lambda: run_gather(nodes)  # noqa: E731
            elif row == "langgraph":
                run = prepare_langgraph(nodes)
            elif row == "langgraph+sqlite":
                run = prepare_langgraph(nodes, Path(tmp) / "checkpoints.sqlite")
            elif row == "resume+v4":
                run = prepare_resume_v4(nodes, Path(tmp))
            elif row.startswith("run_flow"):
                run = prepare_run_flow(nodes, Path(tmp), version=4 if "+v4" in row else 3)
            else:
                run = prepare_steerflow(
                    nodes,
                    Path(tmp),
                    checkpoint=4 if "+v4" in row else 3 if "+v3" in row else None,
                    lease=row.endswith("+lease"),
                    provider=row_provider(row, Path(tmp)),
                )
        except Exception as exc:  # an older tree lacks the row's API (or its spec)
            print(json.dumps({"skipped": f"{type(exc).__name__}: {exc}"}))
            return
        written, cpu, wall = wchar(), time.process_time(), time.perf_counter()
        out = asyncio.run(run())
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        after = wchar()
        out |= {"wall": wall, "cpu": cpu, "nodes": len(nodes), "hwm_mib": own_peak_mib()}
        out["bytes"] = after - written if after is not None and written is not None else None
        print(json.dumps(out), flush=True)


# -- the parent ----------------------------------------------------------------------------


def measure(row: str, count: int, timeout: float) -> dict[str, Any]:
    traced = row.endswith("+otel")
    row = row.removesuffix("+otel")
    argv = [sys.executable, os.path.abspath(__file__), "--child", row, str(count)]
    env = {k: v for k, v in os.environ.items() if k != "STEERFLOW_BENCH_OTEL"}
    if traced:
        env["STEERFLOW_BENCH_OTEL"] = "1"
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    # Killed (this script's own child, by its pid) if it runs past the timeout; wait4
    # below still reaps it, so its RSS is read by us and not by Popen.
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        stdout, stderr = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    if status == signal.SIGKILL:  # a plain kill's wait status is the signal number
        return {"skipped": f"did not finish in {timeout:.0f} s"}
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = stderr.strip().splitlines()[-1:] or ["?"]
        return {"skipped": f"child exited {proc.returncode}: {tail[0]}"}
    out: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    # The child's own high-water mark; ru_maxrss (KiB) where /proc has none. ru_maxrss of a
    # child started by vfork+exec also counts the parent's pages before the exec, so every
    # small row read the parent's size (66.7 MiB at 1,000 nodes for every row).
    out["rss_mib"] = out.pop("hwm_mib", None) or usage.ru_maxrss / 1024
    if "skipped" not in out and out["completed"] != out["nodes"]:
        out = {"skipped": f"only {out['completed']} of {out['nodes']} nodes completed"}
    return out


def ratio(written: object, resp: int) -> str:
    return f"{written / resp:.2f}x" if isinstance(written, int) and resp else "-"


def fmt_bytes(n: object) -> str:
    return f"{n / 1e6:.1f} MB" if isinstance(n, int) else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,10000", help="comma-separated sizes")
    parser.add_argument("--quick", action="store_true", help="1,000 nodes only")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"subset of {','.join(ROWS)}")
    parser.add_argument(
        "--otel",
        action="store_true",
        help="after each steerflow row, the same run traced (extra otel): ROW+otel",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per child")
    parser.add_argument("--child", nargs=2, metavar=("ROW", "NODES"), help=argparse.SUPPRESS)
    parser.add_argument("--first-run", nargs=2, metavar=("NODES", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first_run:  # the batch a ``resume+v4`` child resumes, in a process of its own
        asyncio.run(
            prepare_run_flow(dag(int(args.first_run[0])), Path(args.first_run[1]), version=4)()
        )
        return 0
    if args.child:
        child(args.child[0], int(args.child[1]))
        return 0
    if args.otel and not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        with _otlp_sink() as endpoint:
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
            return _main(args, parser)
    return _main(args, parser)


def _main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    sizes = [1000] if args.quick else [int(n) for n in args.nodes.split(",")]
    rows = [r for r in args.rows.split(",") if r]
    unknown = set(rows) - set(ROWS)
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}")
    if args.otel:
        rows = [r for row in rows for r in ((row, f"{row}+otel") if "steerflow" in row else (row,))]
    import platform

    try:
        from importlib.metadata import version

        lg = version("langgraph")
    except Exception:
        lg = None
    print(
        f"DAG: {LAYERS} layers, each node depends on one node of the previous layer; echo "
        f"model; steerflow concurrency {CONCURRENCY}; each row in a fresh child process"
    )
    print(
        f"platform: {platform.platform()} python {sys.version.split()[0]} "
        f"cpus={os.cpu_count()} langgraph={lg or 'not installed'}"
    )
    for lg_row in ("langgraph", "langgraph+sqlite"):
        if lg is None and lg_row in rows:
            print(f"{lg_row} row skipped: not installed; {LANGGRAPH_HINT}")
            rows.remove(lg_row)
    header = (
        f"{'row':<22} {'nodes':>6} {'wall s':>8} {'CPU s':>8} {'µs/node':>9} "
        f"{'CPU µs/node':>12} {'peak RSS MiB':>13} {'written':>10} {'ckpt':>10} "
        f"{'resp':>10} {'ratio':>7} {'CPU slope':>10}"
    )
    print(header)
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    resp = {count: response_bytes(dag(count)) for count in sizes}
    for row in rows:
        cpu_at: dict[int, float] = {}
        for count in sizes:
            out = measure(row, count, args.timeout)
            if "skipped" in out:
                print(f"{row:<22} {count:>6}  skipped: {out['skipped']}")
                continue
            n = out["nodes"]
            cpu_at[n] = out["cpu"]
            seen[row, n] = out
            slope = "-"
            if len(cpu_at) > 1:
                lo, hi = min(cpu_at), max(cpu_at)
                slope = f"{math.log(cpu_at[hi] / cpu_at[lo]) / math.log(hi / lo):.2f}"
            print(
                f"{row:<22} {n:>6} {out['wall']:>8.2f} {out['cpu']:>8.2f} "
                f"{out['wall'] / n * 1e6:>9.0f} {out['cpu'] / n * 1e6:>12.0f} "
                f"{out['rss_mib']:>13.1f} {fmt_bytes(out['bytes']):>10} "
                f"{fmt_bytes(out.get('writer_bytes')):>10} {fmt_bytes(resp[count]):>10} "
                f"{ratio(out.get('writer_bytes') or out['bytes'], resp[count]):>7} {slope:>10}",
                flush=True,
            )
    print(
        "written: every byte the child wrote during the run (/proc/self/io wchar: base, "
        "journal, compactions, branch files); ckpt: checkpoint bytes the writer counts "
        "(- where the tree has no counter; run_flow rows: FlowResult.checkpoint's bytes_written, "
        "the state DB is in written only); resp: the responses' bytes; ratio: ckpt / resp, "
        "written / resp without a counter (issue 43 goal: <= 3x at 10k and 100k); "
        "CPU slope: log-log slope of CPU vs nodes (1.0 = linear)"
    )
    for n in sorted({n for _, n in seen}):
        ours, theirs = seen.get(("steerflow", n)), seen.get(("langgraph", n))
        if ours and theirs:
            print(
                f"steerflow / langgraph at {n} nodes: wall {ours['wall'] / theirs['wall']:.2f}x, "
                f"CPU {ours['cpu'] / theirs['cpu']:.2f}x (target <= 1)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
