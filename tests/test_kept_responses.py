"""A version 4 run keeps large responses in its checkpoint only (issue 43 item 2).

Real flows (state DB, ``echo``): once a completed node's record is durable, its response of
``KEEP_IN_MEMORY_BELOW`` characters or more leaves the operation and is read back from the
checkpoint by whoever asks (a dependent's prompt, an ``if_contains`` condition, the
result), giving what a version 3 run, which holds everything, gives. Decision 393.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from steerflow.errors import PersistenceError
from steerflow.orchestrate import FlowOptions, FlowResult, FlowRun
from steerflow.orchestrate._kept import KEEP_IN_MEMORY_BELOW
from steerflow.plan import Edge, Op, Plan

HOLD_S = 60.0
LONG = "y" * KEEP_IN_MEMORY_BELOW


def _plan() -> Plan:
    return Plan(
        [
            Op("a", "MARK " + LONG),
            Op("b", "after a " + LONG, depends_on=["a"]),
            Op("c", "after b", depends_on=["b"]),  # long too: its prompt holds b's reply
            Op("when", "a said MARK", depends_on=[Edge("a", if_contains="MARK")]),  # long
            Op("unless", "a said NOPE", depends_on=[Edge("a", if_contains="NOPE")]),
            Op("small", "short"),
        ]
    )


async def _run(home: Path, version: int) -> tuple[FlowRun, FlowResult]:
    run = FlowRun(
        FlowOptions(plan=_plan(), model="echo", checkpoint_version=version, compact_records=2),
        home=home,
    )
    async with asyncio.timeout(HOLD_S):
        return run, await run.run()


async def test_large_responses_are_read_back_and_answer_as_version_3(tmp_path: Path) -> None:
    run4, result4 = await _run(tmp_path / "h4", 4)
    run3, result3 = await _run(tmp_path / "h3", 3)
    assert result4.status == result3.status == "completed"
    assert run4.executor is not None and run3.executor is not None
    graph4, graph3 = run4.executor.graph.by_key, run3.executor.graph.by_key
    kept = {k for k, op in graph4.items() if op.response_read_back is not None}
    # The large ones (an echo holds its dependencies' replies); "small" stays.
    assert kept == {"a", "b", "c", "when"}
    assert all(graph4[k].response_in_memory is None for k in kept)
    assert all(op.response_read_back is None for op in graph3.values())  # v3 holds all
    for key in graph3:
        assert result4.response(key) == result3.response(key), key
        assert graph4[key].response == graph3[key].response, key
    # Read back for a condition and a prompt rendered again (decision 65): as written.
    assert result4.outcomes["when"].status == "completed"
    assert result4.outcomes["unless"].status == "skipped"
    b = graph4["b"].rendered_instruction
    assert b is not None and str(result4.response("a")) in b
    assert list(graph4["a"].branch)[-1].content == result4.response("a")


async def test_a_kept_response_whose_run_directory_is_gone_is_a_clear_error(
    tmp_path: Path,
) -> None:
    _, result = await _run(tmp_path / "home", 4)
    assert result.run_dir is not None
    shutil.rmtree(result.run_dir)
    with pytest.raises(PersistenceError, match=r"cannot read node 'a' back from .*seg\."):
        result.response("a")
    assert str(result.response("small")).endswith("short")  # held: still answers


def test_a_later_round_takes_settings_from_round_one_not_its_kept_response() -> None:
    """A loop's round N copies round 1's settings field by field; never its outcome."""
    from steerflow.executor import Operation
    from steerflow.executor._loops import _copy_settings

    first = Operation("x.r1", "do", timeout_s=5.0)
    first.status = "completed"
    first.keep_response_elsewhere(lambda: "round one's reply")
    later = Operation("x.r2", "do")
    _copy_settings(first, later)
    assert later.timeout_s == 5.0  # a setting is copied
    assert later.response is None and later.response_read_back is None
