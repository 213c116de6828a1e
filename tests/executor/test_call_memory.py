"""What a finished call keeps (issue 17, decision 65).

A rendered instruction that embeds its dependencies' results is not kept as text once
the call is over: it is rendered again, identically, from the sources' results (which
their operations keep anyway), the steer block included; the branch's instruction turn
reads it back, so an ``inherit_context`` dependent still starts from exactly what its
source's provider received and answered.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from steerflow.executor import STEER_OPEN, FlowExecutor, Operation, SharedContext, build_graph
from steerflow.plan import parse_plan
from steerflow.providers import EchoProvider, Message, ProviderRequest, ProviderResponse

pytestmark = pytest.mark.timeout(30)


class Recording(EchoProvider):
    """The echo model, remembering each request it served."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: dict[str, ProviderRequest] = {}

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        self.requests[request.node_key] = request
        return await super().invoke(request)


async def _run(tmp_path: Path, entries: list[dict[str, Any]]) -> tuple[FlowExecutor, Recording]:
    provider = Recording()
    ctx = SharedContext()
    ex = FlowExecutor(
        build_graph(parse_plan({"plan": entries}, source="test")),
        provider_for=lambda op: provider,
        run_id="20260101T000000-abcdef",
        home=tmp_path,
        artifact_dir=lambda key: tmp_path / "a" / key,
        system_prompt=lambda op: "be brief",
        concurrency=1,
        context=ctx,
    )

    async def steer_b(op: Operation) -> None:
        # b is released only after a's observers ran, so b claims this message.
        if op.key == "a":
            ctx.add_operator_message("mind the parser", ts=1_780_000_000.0, control_id="c-1")

    ex.observers.append(steer_b)
    await asyncio.wait_for(ex.run(), 10)
    return ex, provider


ENTRIES: list[dict[str, Any]] = [
    {"agent_id": "a", "instruction": "first"},
    {"agent_id": "b", "instruction": "second", "depends_on": ["a"]},
    {"agent_id": "c", "instruction": "third", "depends_on": ["b"], "inherit_context": True},
]


async def test_rendered_instruction_with_results_is_rendered_again_not_kept(
    tmp_path: Path,
) -> None:
    ex, provider = await _run(tmp_path, ENTRIES)
    a, b = ex.graph.by_key["a"], ex.graph.by_key["b"]
    sent = provider.requests["b"].instruction
    assert sent.startswith(STEER_OPEN) and "mind the parser" in sent
    assert "### a (completed)\n" + str(a.response) in sent
    # the text the provider received is not held by the operation...
    assert not isinstance(b._rendered, str)
    # ...yet reading it gives that text exactly, every time, steer block included
    assert b.rendered_instruction == sent
    assert b.rendered_instruction == sent
    assert b.extra["steers"] == ["c-1"]
    # an instruction without dependency results is the one kept as it is
    assert a._rendered == provider.requests["a"].instruction == "first"


async def test_branch_reads_the_instruction_back_and_a_dependent_inherits_it(
    tmp_path: Path,
) -> None:
    ex, provider = await _run(tmp_path, ENTRIES)
    b, c = ex.graph.by_key["b"], ex.graph.by_key["c"]
    b_branch = [
        Message("system", "be brief"),
        Message("user", provider.requests["b"].instruction),
        Message("assistant", str(b.response)),
    ]
    assert b.branch == b_branch and b_branch == b.branch
    assert list(b.branch) == b_branch and len(b.branch) == 3
    assert b.branch[1:] == b_branch[1:] and b.branch[-1] == b_branch[-1]
    # c inherits b's conversation: exactly what b's provider received and answered
    assert list(provider.requests["c"].history) == b_branch
    assert c.branch == [
        *b_branch,
        Message("user", provider.requests["c"].instruction),
        Message("assistant", str(c.response)),
    ]
