"""End to end: a server that does not stream as the SDK expects (issue 38 item 3).

``steerflow flow --plan ... --model <vendor>/test-model`` (the real CLI, the real SDKs)
against a loopback server on which each node meets another way of not streaming: one
node's server ignores ``stream: true`` and answers the whole completion as JSON, one's
stream stops at its final chunk (no ``[DONE]`` / ``message_stop``), one's stops there
and drops the connection. Each is a complete reply: the run completes with the right
responses and usage, after exactly one request per node (decision 230).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from flow_support import cli_in_process, node_status, show_in_process
from test_anthropic_e2e import ANTHROPIC
from test_providers_e2e import OPENAI, Vendor, three_node_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
from llm_fakes import FakeLLMServer, Reply

VENDORS = {"openai": OPENAI, "anthropic": ANTHROPIC}


@pytest.fixture(params=sorted(VENDORS))
def server(request: pytest.FixtureRequest) -> Iterator[FakeLLMServer]:
    fake = FakeLLMServer(request.param).start()
    try:
        yield fake
    finally:
        fake.close()


def test_a_server_that_does_not_stream_completes_the_run_with_one_request_a_node(
    tmp_path: Path, server: FakeLLMServer
) -> None:
    vendor: Vendor = VENDORS[server.flavour]
    home = tmp_path / "home"
    server.route(
        "ALPHA",
        Reply(text="research as JSON", input_tokens=100, output_tokens=10, stream_as="json"),
    )
    server.route(
        "BETA",
        Reply(chunks=["draft ", "ends at ", "its final chunk"], input_tokens=200,
              output_tokens=20, stream_as="final"),
    )  # fmt: skip
    server.route(
        "GAMMA",
        Reply(chunks=["side ", "then ", "dropped"], input_tokens=300, output_tokens=30,
              stream_as="final", cut_at_end=True),
    )  # fmt: skip
    result = vendor.flow(server, home, "--plan", three_node_plan(tmp_path / "p.yaml"))
    assert result.returncode == 0, result.explain()
    out = result.json
    assert out["status"] == "completed"
    assert node_status(out) == {"research": "completed", "draft": "completed", "side": "completed"}

    # Each node was asked once, streamed, and never again.
    assert [len(server.matching(n)) for n in ("ALPHA", "BETA", "GAMMA")] == [1, 1, 1]
    assert len(server.requests) == 3
    assert all(body["stream"] is True for body in server.bodies())

    responses = {}
    for key in ("research", "draft", "side"):
        code, text = cli_in_process(home, "show", out["run_id"], key, "--json")
        assert code == 0, text
        responses[key] = json.loads(text)["response"]
    assert responses == {
        "research": "research as JSON",
        "draft": "draft ends at its final chunk",
        "side": "side then dropped",
    }
    assert "research as JSON" in server.user_text(server.requests[server.matching("BETA")[0]].body)

    expected = {
        "input_tokens": 600,
        "output_tokens": 60,
        "cache_read_tokens": None,
        "cache_write_tokens": None,
        "cost_usd": None,
    }
    assert out["usage"] == expected
    shown = show_in_process(home, out["run_id"])
    assert shown["usage"] == expected
    per_node = {n["id"]: (n["usage"]["input_tokens"], n["usage"]["output_tokens"])
                for n in shown["nodes"]}  # fmt: skip
    assert per_node == {"research": (100, 10), "draft": (200, 20), "side": (300, 30)}

    # The live view shows the whole JSON reply, and no restart.
    live = (Path(out["run_dir"]) / "live" / "research" / "0.txt").read_text()
    assert live == "research as JSON"
