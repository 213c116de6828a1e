"""The README's "From Python" flows, run as a user would paste them (issue 40 item 7).

Each ```python block of that section is written to a file and run in its own interpreter
with a fresh ``STEERFLOW_HOME``. The typed loop asks ``openai/gpt-4o-mini``: here that is
a loopback OpenAI-compatible server (``OPENAI_BASE_URL``), which answers the structured
review "not ready" in round 1 and "ready" in round 2, so the loop ends by its condition.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"

pytestmark = pytest.mark.timeout(120)


def _blocks() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## From Python", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


class _Server:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.requests.append(body)
            structured = "response_format" in body
            reviews = sum("response_format" in r for r in self.requests)
            n = len(self.requests)
        if structured:
            ready = reviews >= 2
            content = json.dumps({"ready": ready, "notes": "ship it" if ready else "too long"})
        else:
            content = f"draft {n}"
        return {
            "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16},
        }  # fmt: skip


@pytest.fixture
def server() -> Iterator[tuple[str, _Server]]:
    state = _Server()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            out = json.dumps(state.reply(body)).encode()
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


def _run(block: str, tmp_path: Path, base_url: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "flow.py"
    script.write_text(block, encoding="utf-8")
    env = {
        **os.environ,
        "STEERFLOW_HOME": str(tmp_path / "home"),
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "sk-loopback",
    }
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=90, check=False,
    )  # fmt: skip


def test_the_readme_has_three_short_flows() -> None:
    blocks = _blocks()
    assert len(blocks) == 3
    assert all(0 < len(block.splitlines()) < 25 for block in blocks)


def test_the_fan_out_prints_its_events_and_its_synthesis(
    tmp_path: Path, server: tuple[str, _Server]
) -> None:
    done = _run(_blocks()[0], tmp_path, server[0])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "plan_ready " and "node_completed synthesis" in lines
    assert sum(line.startswith("node_completed research-") for line in lines) == 3
    # echo answers with the instruction it received: the synthesis saw every finding
    answer = done.stdout.split("\ncompleted ", 1)[1]
    assert "Write a one-page brief" in answer
    assert all(f"Research {t}." in answer for t in ("prior work", "datasets", "open problems"))
    assert server[1].requests == []  # echo is offline
    assert len(list((tmp_path / "home" / "runs").glob("*/checkpoint.json"))) == 1


def test_the_typed_loop_ends_when_the_review_says_ready(
    tmp_path: Path, server: tuple[str, _Server]
) -> None:
    base_url, state = server
    done = _run(_blocks()[1], tmp_path, base_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2 True draft 3"
    reviews = [r for r in state.requests if "response_format" in r]
    assert len(state.requests) == 4 and len(reviews) == 2
    schema = reviews[0]["response_format"]["json_schema"]["schema"]
    assert set(schema["properties"]) == {"ready", "notes"}
    # round 2's draft request carries round 1's draft and its review
    second_draft = json.dumps(state.requests[2]["messages"])
    assert "draft 1" in second_draft and "too long" in second_draft


def test_the_rerun_from_a_node_pays_only_it_and_what_is_downstream(
    tmp_path: Path, server: tuple[str, _Server]
) -> None:
    done = _run(_blocks()[2], tmp_path, server[0])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("['slides', 'notes'] ")
    assert "Write at most five slides." in done.stdout  # echo: notes saw the edited slides
