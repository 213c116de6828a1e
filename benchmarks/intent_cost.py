"""What the write-ahead call intent costs per call, beside the call itself (issue 38 item 1).

Since decision 217 every paid call is recorded (one journal line, written and fsync'd)
before it leaves the process. This measures that fsync where it is paid: inside a real
run, against a real HTTP call.

Workload: ``--nodes`` independent nodes (default 120) at ``--concurrency`` (default 4),
each one ``openai/bench-model`` call to an OpenAI-compatible server on loopback that
streams a short reply after ``--delay-ms`` (default 50 ms, a fast model), through the
library (``run_flow``), with the default version 3 checkpoint in a temporary home.

Rows, interleaved ``--rounds`` times (default 3) so both see the same machine load,
after one warm-up round of each that is not counted:

- ``intents``: the run as it ships;
- ``no-intents``: the same run with the recorder's ``record_call`` replaced by one that
  records nothing (the baseline: what a run cost before decision 217).

Printed per row: wall time per node, and for ``intents`` the intent's acknowledgement
time per call (p50, p99, max: from ``record_call`` entered to acknowledged, the journal
write and its fsync, shared with other records by group commit) beside the HTTP call's
own time (p50, p99). Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from steerflow import FlowOptions, Op, Plan, run_flow
from steerflow.checkpoint import CheckpointWriter
from steerflow.orchestrate._recorder import CheckpointRecorder


class _Server:
    """An OpenAI-compatible chat-completions server on 127.0.0.1 that streams its reply."""

    def __init__(self, delay_s: float) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                json.loads(self.rfile.read(length))
                time.sleep(server.delay_s)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for event in _events():
                    self._chunk(f"data: {json.dumps(event)}\n\n".encode())
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.delay_s = delay_s
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> _Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _events() -> Iterator[dict[str, Any]]:
    base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "bench-model"}
    for text in ("the ", "answer"):
        yield {**base, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    yield {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    usage = {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}
    yield {**base, "choices": [], "usage": usage}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _run(home: Path, nodes: int, concurrency: int) -> float:
    plan = Plan(
        [Op(f"n{i}", f"task {i}") for i in range(nodes)], model="openai/bench-model",
        concurrency=concurrency,
    )  # fmt: skip
    start = time.perf_counter()
    result = await run_flow(FlowOptions(plan=plan), home=home)
    wall = time.perf_counter() - start
    assert result.status == "completed", result.status
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=120)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    acks: list[float] = []
    calls: list[float] = []
    original_record_call = CheckpointWriter.record_call
    original_invoke_hook = CheckpointRecorder.record_call

    async def timed_record_call(self: CheckpointWriter, *a: Any, **k: Any) -> bool:
        start = time.perf_counter()
        done = await original_record_call(self, *a, **k)
        acks.append(time.perf_counter() - start)
        return done

    async def no_intent(self: CheckpointRecorder, op: Any, intent: Any) -> bool:
        return True

    import steerflow.providers._sdk as sdk

    original_invoke = sdk.SDKProvider.invoke

    async def timed_invoke(self: Any, request: Any) -> Any:
        start = time.perf_counter()
        try:
            return await original_invoke(self, request)
        finally:
            calls.append(time.perf_counter() - start)

    sdk.SDKProvider.invoke = timed_invoke  # type: ignore[method-assign]
    CheckpointWriter.record_call = timed_record_call  # type: ignore[method-assign]
    walls: dict[str, list[float]] = {"intents": [], "no-intents": []}
    with _Server(args.delay_ms / 1000) as server:
        os.environ.update({"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "sk-bench"})
        os.environ["NO_PROXY"] = "127.0.0.1"
        for round_ in range(args.rounds + 1):  # round 0 warms imports and caches up
            if round_ == 1:
                acks.clear()
                calls.clear()
                walls = {"intents": [], "no-intents": []}
            for row in ("intents", "no-intents"):
                CheckpointRecorder.record_call = (  # type: ignore[method-assign]
                    original_invoke_hook if row == "intents" else no_intent
                )
                with tempfile.TemporaryDirectory() as tmp:
                    walls[row].append(
                        asyncio.run(_run(Path(tmp) / "home", args.nodes, args.concurrency))
                    )
    print(
        f"workload: {args.nodes} nodes at concurrency {args.concurrency}, each one streamed "
        f"loopback call answered after {args.delay_ms:g} ms; {args.rounds} interleaved rounds"
    )
    for row, values in walls.items():
        per_node = statistics.median(values) / args.nodes * 1000
        print(f"  {row:11s} wall per node {per_node:7.3f} ms (median of rounds: "
              f"{', '.join(f'{v:.2f}' for v in values)} s)")  # fmt: skip
    ms = [a * 1000 for a in acks]
    http = [c * 1000 for c in calls]
    print(
        f"  intent ack  p50 {_pct(ms, 0.5):7.3f} ms  p99 {_pct(ms, 0.99):7.3f} ms  "
        f"max {max(ms):7.3f} ms  ({len(ms)} intents)"
    )
    print(
        f"  http call   p50 {_pct(http, 0.5):7.3f} ms  p99 {_pct(http, 0.99):7.3f} ms  "
        f"({len(http)} calls, both rows)"
    )
    extra = statistics.median(walls["intents"]) - statistics.median(walls["no-intents"])
    print(f"  intents add {extra / args.nodes * 1000:+.3f} ms of wall per node")


if __name__ == "__main__":
    main()
