"""Traces over real OTLP/HTTP on loopback, from the real CLI in a subprocess (issue 45).

The receiver decodes with the official protobuf classes; the exporter is configured only
by the standard ``OTEL_*`` variables. Also: an unreachable endpoint (a closed loopback
port) changes nothing but one warning line, and a run without the switch, or without the
SDK, imports nothing of OpenTelemetry.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from otlp_receiver import otlp_receiver

PLAN = {"name": "traced", "plan": [
    {"agent_id": "a", "instruction": "first"},
    {"agent_id": "b", "instruction": "second", "depends_on": ["a"]},
]}  # fmt: skip


def _files(tmp_path: Path) -> tuple[Path, str]:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(PLAN), encoding="utf-8")
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({
        "a": {"response": "A", "usage": {"input_tokens": 7, "output_tokens": 2}},
        "b": {"fail_once": "flaky"},
    }), encoding="utf-8")  # fmt: skip
    return plan, f"script:{script}"


def _cli(
    tmp_path: Path, *args: str, env: dict[str, str], home: str = "home"
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "STEERFLOW_OTEL"))}
    full |= {"STEERFLOW_HOME": str(tmp_path / home)} | env
    return subprocess.run(
        [sys.executable, "-m", "steerflow", *args, "--json"],
        env=full, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_resumed_chain_reaches_a_real_otlp_receiver_as_one_linked_trace(
    tmp_path: Path,
) -> None:
    plan, model = _files(tmp_path)
    with otlp_receiver() as (endpoint, received):
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_SERVICE_NAME": "steerflow-test",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci",
        }
        first = _cli(tmp_path, "flow", "--plan", str(plan), "--model", model, "--otel", env=env)
        assert first.returncode == 1, first.stderr
        run_id = json.loads(first.stdout)["run_id"]
        second = _cli(tmp_path, "resume", run_id, "--retry-failed",
                      env=env | {"STEERFLOW_OTEL": "1"})  # fmt: skip
        assert second.returncode == 0, second.stderr
        spans = list(received.spans)
    resumed_id = json.loads(second.stdout)["run_id"]
    roots = {s["attributes"]["steerflow.run.id"]: s for s in spans if s["name"].startswith("run ")}
    assert set(roots) == {run_id, resumed_id}
    first_root, resume_root = roots[run_id], roots[resumed_id]
    assert first_root["name"] == "run traced" and first_root["parent"] is None
    assert first_root["attributes"]["steerflow.run.status"] == "failed"
    assert resume_root["attributes"]["steerflow.run.status"] == "completed"
    # one story: the resume's root is in the first run's trace, linked to its root
    assert resume_root["links"] == [(first_root["trace_id"], first_root["span_id"])]
    assert {s["trace_id"] for s in spans} == {first_root["trace_id"]}
    assert {s["service"] for s in spans} == {"steerflow-test"}
    assert all(r.get("deployment.environment") == "ci" for r in received.resources)
    by_parent: dict[str | None, list[str]] = {}
    for s in spans:
        by_parent.setdefault(s["parent"], []).append(s["name"])
    # the first run's nodes, and the resume's root (its child in the chain's trace)
    assert sorted(by_parent[first_root["span_id"]]) == ["node a", "node b", "run traced"]
    node_a = next(
        s for s in spans if s["name"] == "node a" and s["parent"] == first_root["span_id"]
    )
    [request] = [s for s in spans if s["parent"] == node_a["span_id"]]
    attrs: dict[str, Any] = request["attributes"]
    assert (attrs["gen_ai.operation.name"], attrs["gen_ai.provider.name"],
            attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (
        "chat", "script", 7, 2)  # fmt: skip
    assert "checkpoint saved" in first_root["events"]
    assert {s["scope"] for s in spans} == {"steerflow"}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed when the block ends: nothing listens


def test_an_unreachable_endpoint_changes_nothing_but_one_warning(tmp_path: Path) -> None:
    plan, model = _files(tmp_path)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{_closed_port()}"}
    traced = _cli(tmp_path, "flow", "--plan", str(plan), "--model", model, "--otel", env=env)
    plain = _cli(tmp_path, "flow", "--plan", str(plan), "--model", model, env={}, home="h2")
    assert traced.returncode == plain.returncode == 1

    def outcome(out: subprocess.CompletedProcess[str]) -> tuple[Any, ...]:
        result = json.loads(out.stdout)
        nodes = sorted((n.get("agent_id") or n.get("id"), n["status"]) for n in result["nodes"])
        return result["status"], result["exit_code"], nodes, result["usage"]

    assert outcome(traced) == outcome(plain)
    extra = [line for line in traced.stderr.splitlines() if line not in plain.stderr.splitlines()]
    # exactly one line more than the same run untraced: the warning
    assert extra == [
        f"steerflow: traces: the OTLP endpoint {env['OTEL_EXPORTER_OTLP_ENDPOINT']}/v1/traces "
        "cannot be reached (ConnectionError); this process's spans are dropped (the run goes on)"
    ], traced.stderr


PROBE = """
import asyncio, os, sys
from pathlib import Path
from steerflow import UsageError, run_flow
from steerflow.orchestrate import FlowOptions
from steerflow.plan import Op, Plan
options = FlowOptions(plan=Plan([Op("a", "x")]), model="echo")
result = asyncio.run(run_flow(options, home=Path({home!r})))
print(result.status, sorted(m for m in sys.modules if m.startswith("opentelemetry")))
# Then as in an install without the extra: the SDK unimportable, the switch on.
sys.modules["opentelemetry"] = None
os.environ["STEERFLOW_OTEL"] = "1"
try:
    asyncio.run(run_flow(options, home=Path({home!r})))
except UsageError as exc:
    print("refused:", exc)
"""


def test_off_nothing_is_imported_and_on_without_the_sdk_is_refused(tmp_path: Path) -> None:
    code = PROBE.format(home=str(tmp_path / "home"))
    env = {k: v for k, v in os.environ.items() if k != "STEERFLOW_OTEL"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True)  # fmt: skip
    first, refused = out.stdout.splitlines()
    assert first.split() == ["completed", "[]"], out.stderr  # off: no opentelemetry module
    assert refused.startswith("refused: traces (--otel or STEERFLOW_OTEL=1) need")
    assert "pip install 'steerflow[otel]'" in refused
    assert len(list((tmp_path / "home" / "runs").iterdir())) == 1  # refused before its run dir
