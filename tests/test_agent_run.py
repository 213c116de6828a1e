"""``AgentRun`` in process (issue 19): real SQLite, real poller, a provider gated by events.

The CLI-level behaviour is covered by ``tests/e2e/test_agent_kind_e2e.py`` and
``tests/crash/test_agent_sigkill.py`` (subprocesses); here each turn boundary is driven
exactly, and the readers (``show``/``result``/``ctl status``/resume preparation) are
checked on the checkpoint the run wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from steerflow.checkpoint import CheckpointWriter, load_state
from steerflow.cli import main
from steerflow.cli._agent import print_agent_result
from steerflow.control import enqueue_control
from steerflow.errors import (
    ExitCode,
    FlowResumeError,
    ProviderError,
    RefusedError,
    SteerflowError,
)
from steerflow.orchestrate import read_run, result_of
from steerflow.orchestrate._agent import AgentRun, AgentTarget
from steerflow.orchestrate._agent_options import AgentOptions, AgentResult
from steerflow.orchestrate._agent_resume import agent_resume_source, prepare_agent_resume
from steerflow.orchestrate._agent_state import ordered_keys, read_turns
from steerflow.providers import PlanRequest, Provider, ProviderRequest, ProviderResponse, Usage
from steerflow.state import StateDB
from steerflow.views import control_status
from waiting import wait_until_async

WAIT_S = 30.0


class Gated(Provider):
    """Turn n waits for ``release(n)``; it fails when told to, and reports a session id."""

    spec = "gated"

    def __init__(self, *, conversation: str | None = None, cancel: bool = False) -> None:
        self.requests: list[ProviderRequest] = []
        self.conversation = conversation
        self.fail: set[int] = set()
        self._release: dict[int, asyncio.Event] = {}
        self.cancel = cancel

    @property
    def cancel_at_deadline(self) -> bool:  # type: ignore[override]
        return self.cancel

    def _event(self, n: int) -> asyncio.Event:
        return self._release.setdefault(n, asyncio.Event())

    def release(self, *numbers: int) -> None:
        for n in numbers:
            self._event(n).set()

    async def started(self, n: int) -> None:
        await wait_until_async(lambda: len(self.requests) >= n, timeout=WAIT_S, what=f"turn {n}")

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        self.requests.append(request)
        n = len(self.requests)
        await self._event(n).wait()
        if n in self.fail:
            raise ProviderError(f"turn {n} broke")
        return ProviderResponse(
            text=f"reply {n}",
            usage=Usage(input_tokens=2, output_tokens=3, cost_usd=0.5),
            conversation=self.conversation,
        )

    async def plan(self, request: PlanRequest) -> object:
        raise NotImplementedError


def _start(home: Path, provider: Gated, **opts: Any) -> tuple[AgentRun, asyncio.Task[AgentResult]]:
    run = AgentRun(AgentOptions(task="THE-TASK", model="echo", **opts), home=home,
                   provider=provider)  # fmt: skip
    return run, asyncio.get_running_loop().create_task(run.run())


async def _session(home: Path) -> str:
    def probe() -> str | None:
        if not (home / "state.db").exists():
            return None
        with StateDB.open(home, create=False) as db:
            rows = db.list_sessions(limit=1)
            return rows[0].id if rows else None

    return await wait_until_async(probe, timeout=WAIT_S, what="the session")


async def _listed(home: Path, session: str) -> None:
    """Return once the agent's poller has listed every row committed before this call.

    A ``pause`` row inserted by another writer (``ctl pause`` refuses agents) is stamped
    ``rejected:error:...`` as soon as the poller lists it, so once it is stamped the
    poller has looked at every earlier row too.
    """

    def insert() -> str:
        with StateDB.open(home, create=False) as db:
            return db.insert_control(session_id=session, verb="pause", payload=None).id

    probe = await asyncio.to_thread(insert)
    await wait_until_async(
        lambda: (_result_of(home, probe) or "").startswith("rejected:error:"),
        timeout=WAIT_S,
        what="the poller to list the rows",
    )


async def _msg(home: Path, session: str, text: str) -> str:
    """Queue a message during a turn; the poller sees it and leaves it pending (issue 26).

    The agent claims it only when the turn that renders it starts.
    """
    queued = await asyncio.to_thread(enqueue_control, home, session, "message", text)
    await _listed(home, session)
    assert _result_of(home, queued.control_id) is None  # not claimed while the turn runs
    return queued.control_id


def _result_of(home: Path, control_id: str) -> str | None:
    with StateDB.open(home, create=False) as db:
        row = db.get_control(control_id)
    return None if row is None else row.result


async def test_messages_start_one_turn_with_the_history(home: Path, capsys: Any) -> None:
    provider = Gated()
    _, task = _start(home, provider)
    await provider.started(1)
    session = await _session(home)
    first = await _msg(home, session, "ALPHA")
    second = await _msg(home, session, "BETA")
    assert (await asyncio.to_thread(control_status, home, session)).turns == 0
    provider.release(1)
    await provider.started(2)
    # Stamped by the poller's next tick, once the turn's prompt is durable.
    await wait_until_async(
        lambda: {_result_of(home, first), _result_of(home, second)} == {"applied"},
        timeout=WAIT_S,
        what="both messages to be stamped applied",
    )
    provider.release(2)
    result = await task
    assert result.status == "completed" and result.exit_code == ExitCode.OK
    assert [t.response for t in result.turns] == ["reply 1", "reply 2"]
    assert "reply 1" not in repr(result)  # decision 388: no copy of every reply at the end
    turn2 = provider.requests[1]
    assert [(m.role, m.content) for m in turn2.history] == [
        ("user", "THE-TASK"),
        ("assistant", "reply 1"),
    ]
    assert turn2.instruction.index("ALPHA") < turn2.instruction.index("BETA")
    assert turn2.conversation is None
    assert provider.requests[0].artifact_dir == turn2.artifact_dir
    assert turn2.artifact_dir.name == "agent"
    assert result.usage == {
        "input_tokens": 4,
        "output_tokens": 6,
        "cache_read_tokens": None,
        "cache_write_tokens": None,
        "cost_usd": 1.0,
    }
    assert (await asyncio.to_thread(control_status, home, session)).to_json()["turns"] == 2

    record = await asyncio.to_thread(read_run, home, result.run_id)
    assert [n.key for n in record.nodes] == ["turn-1", "turn-2"]
    assert record.nodes[1].instruction == turn2.instruction
    out = result_of(record)
    assert [n["id"] for n in out["nodes"]] == ["turn-2"] and out["text"].endswith("reply 2")

    print_agent_result(result, as_json=False)
    text = capsys.readouterr().out
    assert "status: completed" in text and "turn-2  completed, 2 operator message(s)" in text
    print_agent_result(result, as_json=True)
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "agent" and data["result"] == "reply 2"
    assert data["turns"][1]["controls"] == [first, second]


async def test_max_turns_rejects_what_is_left(home: Path) -> None:
    provider = Gated()
    _, task = _start(home, provider, max_turns=1)
    await provider.started(1)
    msg = await _msg(home, await _session(home), "more")
    provider.release(1)
    result = await task
    assert result.status == "completed" and len(result.turns) == 1
    assert result.rejected == [{"control_id": msg, "result": "rejected:max-turns"}]
    assert _result_of(home, msg) == "rejected:max-turns"


async def test_stop_after_the_turn_and_now(home: Path) -> None:
    provider = Gated()
    run, task = _start(home, provider)
    await provider.started(1)
    session = await _session(home)
    await asyncio.to_thread(enqueue_control, home, session, "stop", "enough")
    await wait_until_async(lambda: run.stopped_by is not None, timeout=WAIT_S, what="the stop")
    late = await asyncio.to_thread(enqueue_control, home, session, "message", "too late")
    await wait_until_async(
        lambda: _result_of(home, late.control_id) == "rejected:no-pending-ops",
        timeout=WAIT_S,
        what="the late message to be refused",
    )
    provider.release(1)
    result = await task
    assert result.status == "stopped" and result.exit_code == ExitCode.STOPPED
    assert result.stopped_by == {"control_id": result.stopped_by["control_id"],  # type: ignore[index]
                                 "reason": "enough", "now": False}  # fmt: skip
    assert len(result.turns) == 1 and len(provider.requests) == 1

    provider2 = Gated()
    _, task2 = _start(home / "two", provider2)
    await provider2.started(1)
    session2 = await _session(home / "two")
    await asyncio.to_thread(enqueue_control, home / "two", session2, "stop", None, now=True)
    result2 = await task2
    assert result2.status == "stopped" and result2.turns == []


async def test_sigint_mid_turn_then_resume_continues_the_conversation(home: Path) -> None:
    provider = Gated(conversation="conv-1")
    run, task = _start(home, provider)
    await provider.started(1)
    session = await _session(home)
    msg = await _msg(home, session, "CHANGE-IT")
    provider.release(1)
    await provider.started(2)
    run.request_stop(signal.SIGINT)
    result = await task
    assert result.status == "interrupted" and result.exit_code == ExitCode.SIGINT
    assert [t.status for t in result.turns] == ["completed"]
    assert provider.requests[1].conversation == "conv-1"
    assert provider.requests[1].history == ()

    source = await asyncio.to_thread(agent_resume_source, home, result.run_id)
    assert source is not None
    seed = await asyncio.to_thread(prepare_agent_resume, home, source)
    assert seed.next_controls == (msg,) and seed.conversation == "conv-1"
    assert seed.next_instruction == provider.requests[1].instruction
    again = Gated(conversation="conv-1")
    again.release(1)
    resumed = await AgentRun(AgentOptions(resume=seed), home=home, provider=again).run()
    assert resumed.status == "completed"
    assert [(t.number, t.replayed) for t in resumed.turns] == [(1, True), (2, False)]
    assert len(again.requests) == 1  # turn 1 was replayed, not run
    assert again.requests[0].instruction == provider.requests[1].instruction
    assert again.requests[0].conversation == "conv-1"
    assert again.requests[0].artifact_dir == provider.requests[0].artifact_dir
    assert _result_of(home, msg) == "applied"


async def test_failed_turn_needs_retry_failed(home: Path) -> None:
    provider = Gated()
    provider.fail.add(1)
    provider.release(1)
    result = await AgentRun(AgentOptions(task="T"), home=home, provider=provider).run()
    assert result.status == "failed" and result.exit_code == ExitCode.FAILED
    assert result.turns[0].error == "turn 1 broke"
    source = await asyncio.to_thread(agent_resume_source, home, result.run_id)
    assert source is not None
    with pytest.raises(FlowResumeError, match="turn-1 failed; --retry-failed"):
        await asyncio.to_thread(prepare_agent_resume, home, source)
    seed = await asyncio.to_thread(lambda: prepare_agent_resume(home, source, retry_failed=True))
    assert seed.turns == [] and seed.next_instruction == "T"
    retry = Gated()
    retry.release(1)
    again = await AgentRun(AgentOptions(resume=seed), home=home, provider=retry).run()
    assert again.status == "completed" and [t.response for t in again.turns] == ["reply 1"]


async def test_deadline_cancels_a_worker_turn(home: Path) -> None:
    provider = Gated(cancel=True)
    result = await AgentRun(
        AgentOptions(task="T", timeout_s=0.2), home=home, provider=provider
    ).run()
    assert result.status == "timed_out" and result.exit_code == ExitCode.DEADLINE
    assert result.turns == []


def test_target_refuses_pause_and_knows_when_it_is_done() -> None:
    target = AgentTarget()
    with pytest.raises(SteerflowError):
        target.pause()
    with pytest.raises(SteerflowError):
        target.resume()
    with pytest.raises(NotImplementedError):
        target.stop(now=False, reason=None, control_id="x")
    assert target.has_pending_operation() and not target.is_paused()
    target.add_operator_message("a", ts=1.0, control_id="c1")
    assert target.take() == [{"text": "a", "ts": 1.0, "control_id": "c1"}]
    assert target.take() == []


async def _checkpoint(path: Path, ops: dict[str, Any], context: dict[str, Any]) -> None:
    writer = CheckpointWriter(path, session_id="s" * 32, prompt="P", plan=[],
                              config={"kind": "agent", "model": "echo", "max_turns": 5},
                              flow_context=context, version=3, ops=ops)  # fmt: skip
    await writer.flush()
    await writer.close()


@pytest.mark.parametrize(
    ("ops", "context", "problem"),
    [
        ({"turn-2": "x"}, {"turns": [{"turn": 1, "instruction": "P"}]}, "turn-1 is missing"),
        ({"turn-1": "x"}, {}, "the prompt of turn-1 is not recorded"),
        ({"other": "x"}, {}, "entry 'other' is not a turn"),
        (
            {"turn-1": "x"},
            {"turns": [{"turn": 1, "instruction": "P"}], "next": {"turn": 5}},
            "does not follow",
        ),
        (
            {"turn-1": "x"},
            {"turns": [{"turn": 1, "instruction": "P"}], "next": {"turn": 2}},
            "in flight) is not recorded",
        ),
    ],
)
async def test_unfaithful_checkpoints_are_refused(
    tmp_path: Path, ops: dict[str, str], context: dict[str, Any], problem: str
) -> None:
    path = tmp_path / "checkpoint.json"
    entries = {k: {"status": "completed", "response": v} for k, v in ops.items()}
    await _checkpoint(path, entries, {"agent": context})
    state, _ = await asyncio.to_thread(load_state, path)
    turns = read_turns(state)
    with pytest.raises(FlowResumeError, match="cannot be resumed"):
        turns.refuse_if_unfaithful("RUN", retry_failed=False)
    assert any(problem in p for p in turns.problems), turns.problems


async def test_a_failed_turn_before_a_later_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    ops = {"turn-1": {"status": "failed", "response": {"error": "e"}},
           "turn-2": {"status": "completed", "response": "r"}}  # fmt: skip
    recorded = [{"turn": 1, "instruction": "P"}, {"turn": 2, "instruction": "Q"}]
    await _checkpoint(path, ops, {"agent": {"turns": recorded}})
    state, _ = await asyncio.to_thread(load_state, path)
    with pytest.raises(FlowResumeError, match="later turns ran after it"):
        read_turns(state).refuse_if_unfaithful("RUN", retry_failed=True)


def test_turn_keys_sort_by_number() -> None:
    assert ordered_keys(["turn-10", "x", "turn-2", "turn-1"]) == [
        "turn-1",
        "turn-2",
        "turn-10",
        "x",
    ]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def _cli(home: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--home", str(home), *args])
    return code, out.getvalue(), err.getvalue()


def test_cli_agent_and_its_resume_in_process(home: Path) -> None:
    code, out, err = _cli(home, "agent", "SAY-HI", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["status"] == "completed" and "SAY-HI" in data["result"]
    assert "turn 1 completed" in err
    code, out, _ = _cli(home, "agent", "SAY-HI")
    assert code == 0 and "turns:\n  turn-1  completed" in out and "result:" in out
    # A dry run of an agent says what it would replay and run (issue 26), and runs nothing.
    code, out, err = _cli(home, "resume", data["run_id"], "--dry-run", "--json")
    assert code == 0, err
    dry = json.loads(out)
    assert (dry["kind"], dry["status"], dry["run_id"]) == ("agent", "planned", None)
    assert dry["nodes"] == [{"id": "turn-1", "kind": "planned", "status": "completed"}]
    assert dry["stranded_messages"] == [] and dry["resumed_from"] == data["session_id"]
    code, out, _ = _cli(home, "resume", data["run_id"], "--dry-run")
    assert code == 0 and "would replay: turn-1" in out and "would run: no turn" in out
    code, _, err = _cli(home, "resume", data["run_id"], "--rerun-unsettled")
    assert code == 2 and "--rerun-unsettled does not apply to an agent run" in err
    # Nothing was in flight and nothing is queued: the resumed agent replays and completes.
    code, out, err = _cli(home, "resume", data["run_id"], "--json")
    assert code == 0, err
    again = json.loads(out)
    assert [(t["id"], t["replayed"]) for t in again["turns"]] == [("turn-1", True)]
    code, _, err = _cli(home, "agent", "   ")
    assert code == 2 and "non-empty TASK" in err


async def test_a_token_cap_ends_the_agent_before_the_next_turn(home: Path) -> None:
    """Each turn reports 5 tokens: under ``max_tokens=5`` the turn a message asks for is
    recorded as the next prompt but never started; the run ends budget_exhausted (76)."""
    provider = Gated()
    _, task = _start(home, provider, max_tokens=5)
    await provider.started(1)
    session = await _session(home)
    await _msg(home, session, "ALPHA")
    provider.release(1, 2)
    result = await task
    assert result.status == "budget_exhausted" and result.exit_code == ExitCode.BUDGET
    assert len(provider.requests) == 1
    assert result.budget == {"max_cost": None, "max_tokens": 5}
    assert result.usage["input_tokens"] == 2 and result.usage["output_tokens"] == 3
    assert result.spent_line == "spent 5 of the 5 token cap"
    source = await asyncio.to_thread(agent_resume_source, home, result.run_id)
    assert source is not None
    seed = await asyncio.to_thread(prepare_agent_resume, home, source)
    assert seed.next_instruction is not None and "ALPHA" in seed.next_instruction


async def test_an_agent_cap_is_the_chains_across_resumes(home: Path) -> None:
    provider = Gated()
    _, task = _start(home, provider, max_tokens=5)
    await provider.started(1)
    session = await _session(home)
    await _msg(home, session, "ALPHA")
    provider.release(1, 2)
    first = await task
    assert first.status == "budget_exhausted"

    async def resume(run_id: str, **opts: Any) -> tuple[AgentResult, Gated]:
        source = await asyncio.to_thread(agent_resume_source, home, run_id)
        assert source is not None
        seed = await asyncio.to_thread(prepare_agent_resume, home, source)
        gated = Gated()
        gated.release(1)
        run = AgentRun(AgentOptions(resume=seed, **opts), home=home, provider=gated)
        return await run.run(), gated

    # The chain's cap (checkpoint config.budget) and its turn's 5 tokens carry over.
    again, idle = await resume(first.run_id)
    assert again.status == "budget_exhausted" and idle.requests == []
    assert again.budget == {"max_cost": None, "max_tokens": 5}
    raised, ran = await resume(again.run_id, max_tokens=100)
    assert raised.status == "completed" and len(ran.requests) == 1
    assert "ALPHA" in ran.requests[0].instruction
    assert raised.usage["input_tokens"] == 2  # the replayed turn cost this run nothing


async def test_a_cost_cap_the_agent_cannot_enforce_is_refused_when_sent(home: Path) -> None:
    """No price is known for the agent's model: the session says so, ``ctl budget
    --max-cost`` is refused before a row is queued, and a row written past the writer is
    rejected with the same reason (decision 246); a token cap still applies."""
    provider = Gated()
    _, task = _start(home, provider)
    await provider.started(1)
    session = await _session(home)
    with StateDB.open(home, create=False) as db:
        row = db.get_session(session)
        assert row is not None
        why = row.node_metadata["unenforceable"]["max_cost"]
    assert "no price is known for model 'echo'" in why
    with pytest.raises(RefusedError, match=r"unenforceable: .*no price is known"):
        await asyncio.to_thread(enqueue_control, home, session, "budget", budget={"max_cost": 1.0})

    def insert(payload: dict[str, Any]) -> str:
        with StateDB.open(home, create=False) as db:
            return db.insert_control(session_id=session, verb="budget", payload=payload).id

    past = await asyncio.to_thread(insert, {"max_cost": 1.0, "max_tokens": None})
    tokens = await asyncio.to_thread(insert, {"max_cost": None, "max_tokens": 1000})
    await wait_until_async(
        lambda: _result_of(home, tokens) is not None, timeout=WAIT_S, what="the budget rows"
    )
    assert _result_of(home, past) == f"rejected:unenforceable:{why}"[:500]
    assert _result_of(home, tokens) == "applied"
    provider.release(1)
    result = await task
    assert result.status == "completed" and result.budget["max_tokens"] == 1000
