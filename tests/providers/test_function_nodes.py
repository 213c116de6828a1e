"""Function nodes, ``python:MODULE:FUNCTION``, in process (issue 29 item 2, decision 170).

The functions live in ``tests/fn_nodes.py``. The autouse ``blockbuster`` fixture is active
here: a blocking call on the loop under the executor's frames fails the test.
"""

from __future__ import annotations

import asyncio
import io
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import fn_nodes
from steerflow import DependencyResult, FunctionNodeError, NodeCall, UsageError
from steerflow.executor import FlowExecutor, Graph, SharedContext, build_graph
from steerflow.plan import parse_plan
from steerflow.providers import FunctionProvider, _stdout, make_provider
from waiting import wait_until, wait_until_async

pytestmark = pytest.mark.timeout(60)

RUN_ID = "20260101T000000-abcdef"
CHAIN = [
    {"agent_id": "a", "instruction": "first"},
    {"agent_id": "b", "instruction": "second", "depends_on": ["a"]},
]


@pytest.fixture(autouse=True)
def _fresh_module_state() -> Iterator[None]:
    fn_nodes.reset()
    yield
    fn_nodes.RELEASE.set()  # never leave a test's thread blocked
    fn_nodes.reset()


def _executor(tmp_path: Path, entries: list[dict[str, Any]], spec: str, **kw: Any) -> FlowExecutor:
    provider = make_provider(spec)
    (tmp_path / "home").mkdir(mode=0o700, exist_ok=True)
    (tmp_path / "artifacts").mkdir(mode=0o700, exist_ok=True)
    graph: Graph = build_graph(parse_plan({"plan": entries}, source="test"))
    return FlowExecutor(
        graph,
        provider_for=lambda op: provider,
        run_id=RUN_ID,
        home=tmp_path / "home",
        artifact_dir=lambda key: tmp_path / "artifacts" / key,
        **kw,
    )


# -- the spec --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("python:fn_nodes_nosuch:fn", "module 'fn_nodes_nosuch' (ModuleNotFoundError"),
        ("python:fn_nodes:nosuch", "module 'fn_nodes' has no function 'nosuch'"),
        ("python:fn_nodes:NOT_CALLABLE", "fn_nodes.NOT_CALLABLE is not callable (a int object"),
        ("python:fn_nodes", "use python:MODULE:FUNCTION"),
        ("python::record", "use python:MODULE:FUNCTION"),
        ("python:fn_nodes:", "use python:MODULE:FUNCTION"),
    ],
)
def test_a_spec_that_names_no_function_is_a_one_line_usage_error(spec: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        make_provider(spec)
    text = str(info.value)
    assert text.startswith(f"model spec {spec!r}: ")
    assert message in text
    assert "\n" not in text
    assert info.value.exit_code == 2


def test_the_spec_builds_a_function_provider_that_makes_no_directory_up_front() -> None:
    provider = make_provider("python:fn_nodes:record")
    assert isinstance(provider, FunctionProvider)
    assert provider.function is fn_nodes.record
    assert provider.needs_artifact_dir is False


# -- what the function receives ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["record", "record_async"])
async def test_the_function_gets_one_node_call_and_its_str_is_the_response(
    tmp_path: Path, name: str
) -> None:
    ctx = SharedContext()
    ctx.add_operator_message("mind the parser", ts=time.time(), control_id="ctl-1")
    ex = _executor(tmp_path, CHAIN, f"python:fn_nodes:{name}", context=ctx)
    await asyncio.wait_for(ex.run(), 20)
    a, b = ex.graph.by_key["a"], ex.graph.by_key["b"]
    assert (a.status, b.status) == ("completed", "completed")
    prefix = "async fn" if name == "record_async" else "fn"
    assert (a.response, b.response) == (f"{prefix} a", f"{prefix} b")
    first, second = fn_nodes.SEEN
    assert isinstance(first, NodeCall)
    assert (first.run_id, first.node_id, second.node_id) == (RUN_ID, "a", "b")
    # the instruction is the rendered one: the operator's steer and the dependency results
    assert first.instruction == a.rendered_instruction
    assert "mind the parser" in first.instruction and first.instruction.endswith("first")
    assert second.instruction == b.rendered_instruction
    assert f"### a (completed)\n{prefix} a" in second.instruction
    assert first.dependencies == ()
    assert second.dependencies == (DependencyResult("a", "completed", f"{prefix} a"),)
    assert second.results == {"a": f"{prefix} a"}
    assert second.artifact_path == tmp_path / "artifacts" / "b"
    with pytest.raises(AttributeError):
        second.node_id = "x"  # type: ignore[misc]
    # nobody asked for a directory: none was made
    assert list((tmp_path / "artifacts").iterdir()) == []


async def test_a_failed_dependency_reaches_the_function_as_a_failed_result(tmp_path: Path) -> None:
    entries = [
        {"agent_id": "bad", "instruction": "x", "assignee": "broken"},
        {"agent_id": "after", "instruction": "y", "depends_on": [{"id": "bad", "when": "failed"}]},
    ]
    good, broken = make_provider("python:fn_nodes:record"), make_provider("python:fn_nodes:raises")
    (tmp_path / "artifacts").mkdir()
    ex = FlowExecutor(
        build_graph(parse_plan({"plan": entries}, source="test")),
        provider_for=lambda op: broken if op.assignee == "broken" else good,
        run_id=RUN_ID,
        home=tmp_path,
        artifact_dir=lambda key: tmp_path / "artifacts" / key,
    )
    await asyncio.wait_for(ex.run(), 20)
    assert ex.graph.by_key["after"].status == "completed"
    (call,) = fn_nodes.SEEN
    error = "python:fn_nodes:raises raised ValueError: the function failed on bad"
    assert call.dependencies == (DependencyResult("bad", "failed", error),)
    assert call.results == {}


async def test_the_artifact_directory_is_made_0700_only_for_the_function_that_asks(
    tmp_path: Path,
) -> None:
    ex = _executor(tmp_path, CHAIN, "python:fn_nodes:writes_artifact")
    await asyncio.wait_for(ex.run(), 20)
    assert {op.status for op in ex.graph} == {"completed"}
    root = tmp_path / "artifacts"
    assert sorted(p.name for p in root.iterdir()) == ["a", "b"]
    assert stat.S_IMODE((root / "a").lstat().st_mode) == 0o700
    assert (root / "b" / "out.txt").read_text() == "b"


# -- failures ------------------------------------------------------------------------------------


async def test_a_raise_fails_the_node_with_the_spec_the_type_and_the_text(tmp_path: Path) -> None:
    ex = _executor(tmp_path, CHAIN, "python:fn_nodes:raises")
    await asyncio.wait_for(ex.run(), 20)
    a, b = ex.graph.by_key["a"], ex.graph.by_key["b"]
    assert a.status == "failed"
    assert a.error == "python:fn_nodes:raises raised ValueError: the function failed on a"
    assert b.status == "skipped"


async def test_a_return_that_is_not_a_str_fails_the_node_with_a_typed_error(
    tmp_path: Path,
) -> None:
    provider = make_provider("python:fn_nodes:returns_number")
    ex = _executor(tmp_path, CHAIN[:1], "python:fn_nodes:returns_number")
    await asyncio.wait_for(ex.run(), 20)
    assert ex.graph.by_key["a"].status == "failed"
    assert ex.graph.by_key["a"].error == (
        "python:fn_nodes:returns_number returned int, not str: return the response text"
    )
    request = ex.graph.by_key["a"]
    assert request.response is None
    with pytest.raises(FunctionNodeError) as info:
        await provider.invoke(_request(tmp_path))
    assert info.value.spec == "python:fn_nodes:returns_number"


def _request(tmp_path: Path) -> Any:
    from steerflow.providers import ProviderRequest

    return ProviderRequest(
        run_id=RUN_ID,
        node_key="a",
        node_id="a",
        kind="planned",
        assignee=None,
        instruction="i",
        history=(),
        artifact_dir=tmp_path / "artifacts" / "a",
        home=tmp_path,
    )


# -- the loop ----------------------------------------------------------------------------------


async def test_a_sync_function_that_blocks_does_not_stall_the_loop(tmp_path: Path) -> None:
    """The function blocks its thread until a task on the loop releases it.

    Had it run on the loop, that task could not run: the function would wait out its
    30 s bound and answer ``never released`` (and blockbuster would flag the wait).
    """
    ex = _executor(tmp_path, CHAIN[:1], "python:fn_nodes:blocks_until_released")
    lag_probe_ran = asyncio.Event()

    async def release_once_blocked() -> None:
        # a timer on the loop: it fires only if the loop runs while the function blocks
        await wait_until_async(fn_nodes.STARTED.is_set, timeout=20, what="the call")
        lag_probe_ran.set()
        fn_nodes.RELEASE.set()

    async with asyncio.TaskGroup() as tg:
        tg.create_task(release_once_blocked())
        await asyncio.wait_for(ex.run(), 20)
    assert lag_probe_ran.is_set()
    assert ex.graph.by_key["a"].response == "released"


@pytest.mark.parametrize("name", ["waits_forever", "blocks_until_released"])
async def test_stop_now_cancels_a_function_call_and_the_node_stays_pending(
    tmp_path: Path, name: str
) -> None:
    ex = _executor(tmp_path, CHAIN, f"python:fn_nodes:{name}")
    async with asyncio.TaskGroup() as tg:
        run = tg.create_task(ex.run())
        await asyncio.to_thread(wait_until, fn_nodes.STARTED.is_set, timeout=10, what="call")
        ex.close_admission("stop", cancel_inflight=True)
    await run
    a, b = ex.graph.by_key["a"], ex.graph.by_key["b"]
    assert (a.status, a.cancelled) == ("pending", "stop")
    assert b.status == "pending"
    # a coroutine sees its cancellation; a blocked thread is abandoned (released at teardown)
    assert fn_nodes.CANCELLED.is_set() == (name == "waits_forever")


@pytest.mark.parametrize("name", ["prints", "prints_async"])
async def test_prints_go_to_the_calls_live_sink_and_stdout_is_put_back(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two calls at once, each its own sink; steerflow's own writes meanwhile pass through,
    and the stream the proxy replaced is ``sys.stdout`` again once both returned."""
    before = sys.stdout
    provider = FunctionProvider(f"python:fn_nodes:{name}")
    sinks: dict[str, list[str]] = {"a": [], "b": []}
    requests = [
        replace(_request(tmp_path), node_key=key, node_id=key, live=sinks[key].append)
        for key in sinks
    ]
    print("steerflow's own line")  # before: straight to stdout
    await asyncio.gather(*(provider.invoke(r) for r in requests))
    expected = {key: "".join(f"print {n} from {key}\n" for n in range(3)) for key in sinks}
    # The sinks' callbacks are queued onto the loop from the threads: wait until they ran.
    await wait_until_async(
        lambda: all("".join(sinks[k]) == expected[k] for k in sinks), timeout=5, what="sinks"
    )
    assert sys.stdout is before
    for key, chunks in sinks.items():
        assert "".join(chunks) == "".join(f"print {n} from {key}\n" for n in range(3))
    assert capsys.readouterr().out == "steerflow's own line\n"


def test_prints_are_routed_even_after_stdout_was_replaced_while_a_call_hung() -> None:
    # A call abandoned by a stop still counts as running; stdout replaced since (pytest's
    # capture between two tests, a user's redirect) must not receive the next call's prints.
    original = sys.stdout
    abandoned = _stdout.routed_stdout(lambda text: None)
    abandoned.__enter__()
    try:
        replaced = io.StringIO()
        sys.stdout = replaced
        sink: list[str] = []
        with _stdout.routed_stdout(sink.append):
            print("from the next call")
        assert "".join(sink) == "from the next call\n"
        assert replaced.getvalue() == ""
        assert sys.stdout is replaced  # put back once that call returned
    finally:
        abandoned.__exit__(None, None, None)
        assert sys.stdout is replaced  # the abandoned call's proxy is not ours to undo
        sys.stdout = original
