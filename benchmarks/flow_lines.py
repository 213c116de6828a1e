"""The three audit flows in steerflow and in LangGraph: lines of code, and each one run.

    python benchmarks/flow_lines.py [--no-run]

Issue 40's audit wrote three flows as a LangGraph user would, durability included (a
LangGraph graph with its SQLite checkpointer; a steerflow run checkpoints by itself):

- ``fanout``: three research nodes in parallel, then a synthesis over every finding;
- ``loop``: draft, critique, revise until the critique says LGTM (at most 3 rounds);
- ``model_fn_model``: a model writes, a Python function counts the words, a model titles.

Each program is in ``benchmarks/flows/`` (a steerflow function node's module,
``flow_steps.py``, is counted with the flow that uses it). A line is counted when it is
not blank and not only a comment. Then each program runs against one loopback
OpenAI-compatible server (127.0.0.1, a canned reply per request; the critique says LGTM
the second time it is asked), in its own temporary directory and steerflow home, and the
table shows whether it finished and how many model requests it made. LangGraph's rows
need ``pip install -e '.[bench]'``; without it they print "not installed".
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FLOWS = Path(__file__).resolve().parent / "flows"
NAMES = ("fanout", "loop", "model_fn_model")
#: Modules a steerflow flow imports from beside it (counted with the flow).
HELPERS = {"model_fn_model": ("flow_steps.py",)}
RUN_TIMEOUT_S = 120


def code_lines(path: Path) -> int:
    """Lines that are neither blank nor only a comment."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def count(kind: str, name: str) -> int:
    files = [FLOWS / f"{kind}_{name}.py"]
    if kind == "steerflow":
        files += [FLOWS / helper for helper in HELPERS.get(name, ())]
    return sum(code_lines(f) for f in files)


class _Server:
    """An OpenAI-compatible chat server that answers every request at once, never streaming."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.critiques = 0

    def reply(self, body: dict[str, Any]) -> str:
        prompt = str(body["messages"][-1].get("content") or "")
        with self.lock:
            self.requests += 1
            if prompt.lstrip().startswith("Critique") or "\nCritique the draft" in prompt:
                self.critiques += 1
                return "LGTM" if self.critiques >= 2 else "Needs a clearer first line."
            return f"Reply {self.requests}: " + " ".join(prompt.split()[:12])


@contextlib.contextmanager
def serve() -> Iterator[tuple[str, _Server]]:
    state = _Server()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            text = state.reply(body)
            out = json.dumps({
                "id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                "model": body.get("model", "m"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }).encode()  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", state
    finally:
        httpd.shutdown()
        httpd.server_close()


def run_one(kind: str, name: str) -> str:
    """Run one program; its outcome and the model requests it made."""
    if kind == "langgraph" and not all(
        importlib.util.find_spec(m) for m in ("langgraph", "langchain_openai")
    ):
        return "not installed"
    with serve() as (base_url, server), tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        env = {
            **os.environ,
            "OPENAI_BASE_URL": base_url,
            "OPENAI_API_KEY": "sk-loopback",
            "STEERFLOW_HOME": str(home),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(FLOWS), os.environ.get("PYTHONPATH")) if p
            ),
        }
        done = subprocess.run(
            [sys.executable, str(FLOWS / f"{kind}_{name}.py")],
            cwd=tmp, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["?"])[-1]
            return f"exit {done.returncode}: {last[:80]}"
        answer = (done.stdout.strip().splitlines() or [""])[-1]
        return f"ok, {server.requests} model requests, printed {answer[:24]!r}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-run", action="store_true", help="only count the lines")
    args = parser.parse_args()
    print(f"{'flow':<16}{'steerflow':>10}{'LangGraph':>11}  runs (steerflow | LangGraph)")
    for name in NAMES:
        lines = f"{count('steerflow', name):>10}{count('langgraph', name):>11}"
        if not args.no_run:
            lines += f"  {run_one('steerflow', name)} | {run_one('langgraph', name)}"
        print(f"{name:<16}{lines}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
