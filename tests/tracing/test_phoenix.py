"""End to end into Arize Phoenix (issue 45's receiver): a resumed chain is one trace there.

``slow``: Phoenix is ~860 MB and ~90 s to install, so it is not in the ``dev`` extra. Install
it (``pip install -e '.[otel-e2e]'``, or into its own venv and point ``STEERFLOW_PHOENIX`` at
its ``phoenix`` script) and run ``pytest -m slow tests/tracing/test_phoenix.py``. The
default run keeps ``test_otlp.py``: the same chain over the same OTLP/HTTP exporter to a
receiver that decodes it with the official protobuf classes.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_otlp import _cli, _files

from waiting import wait_until

START_S = 120.0  # Phoenix's first start migrates its database: slow on a loaded machine


def _phoenix() -> str:
    found = os.environ.get("STEERFLOW_PHOENIX") or shutil.which(
        "phoenix", path=str(Path(sys.executable).parent)
    )
    # Fails rather than skips: this test is run on purpose (-m slow) with Phoenix installed.
    assert found, "no Phoenix: pip install -e '.[otel-e2e]', or set STEERFLOW_PHOENIX"
    return found


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.loads(reply.read())


@pytest.fixture
def phoenix(tmp_path: Path) -> Iterator[str]:
    port = _port()
    env = dict(os.environ) | {
        "PHOENIX_WORKING_DIR": str(tmp_path / "phoenix"),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(_port()),
    }
    log = (tmp_path / "phoenix.log").open("w")
    proc = subprocess.Popen([_phoenix(), "serve"], env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool | None:
        assert proc.poll() is None, (tmp_path / "phoenix.log").read_text()
        try:
            return "data" in _get(f"{base}/v1/projects") or None
        except OSError:
            return None

    try:
        wait_until(up, timeout=START_S, what="Phoenix answering", interval=0.5)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.mark.slow
def test_a_resumed_chain_is_one_trace_in_phoenix(tmp_path: Path, phoenix: str) -> None:
    plan, model = _files(tmp_path)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": phoenix, "STEERFLOW_OTEL": "1"}
    first = _cli(tmp_path, "flow", "--plan", str(plan), "--model", model, env=env)
    assert first.returncode == 1, first.stderr
    run_id = json.loads(first.stdout)["run_id"]
    second = _cli(tmp_path, "resume", run_id, "--retry-failed", env=env)
    assert second.returncode == 0, second.stderr

    def all_spans() -> list[dict[str, Any]] | None:
        spans: list[dict[str, Any]] = _get(f"{phoenix}/v1/projects/default/spans?limit=100")["data"]
        return spans if len(spans) >= 9 else None  # 2 roots, 4 nodes, 3 requests

    spans = wait_until(all_spans, timeout=30, what="the chain's spans in Phoenix", interval=0.2)
    roots = {s["attributes"]["steerflow.run.id"]: s for s in spans if s["name"] == "run traced"}
    first_root, resume_root = roots[run_id], roots[json.loads(second.stdout)["run_id"]]
    assert {s["context"]["trace_id"] for s in spans} == {first_root["context"]["trace_id"]}
    assert first_root["parent_id"] is None
    assert resume_root["parent_id"] == first_root["context"]["span_id"]
    assert (first_root["status_code"], resume_root["status_code"]) == ("ERROR", "UNSET")
    kinds = sorted(s["span_kind"] for s in spans)
    assert kinds == ["AGENT"] * 4 + ["CHAIN"] * 2 + ["LLM"] * 3
    llm = [s for s in spans if s["span_kind"] == "LLM" and s["status_code"] == "UNSET"]
    assert {s["attributes"]["gen_ai.provider.name"] for s in llm} == {"script"}
    assert 7 in {s["attributes"].get("gen_ai.usage.input_tokens") for s in llm}
