"""One ``agent`` invocation: a single long-running agent steered between turns (issue 19).

Turn 1 runs the task. When a turn ends, the pending operator messages (``ctl msg``)
become the next turn's prompt, rendered with the operator steer block; with none
pending the agent is done. ``--max-turns`` bounds the turns; messages still pending
when it is reached are ``rejected:max-turns``.

A message is claimed (at most once, by the same :class:`~steerflow.control.ControlPoller`
a flow uses) only when the turn that renders it starts: while a turn runs, rows stay
pending (:meth:`AgentTarget.defers_message_claim`), so a process that dies mid-turn
leaves them for a resume to deliver (issue 26). A claimed row is stamped ``applied``
only once the turn it starts has been made durable: the prompt is first recorded in
the checkpoint (``next`` on the last turn's entry, see :mod:`._agent_state`), so a
crash after the stamp loses nothing a resume cannot run again. Each finished turn is
the checkpoint entry ``turn-<n>``.

Continuation: a worker that reports its own session (``claude-code``) is resumed
with it (``--resume <id>``); every other provider gets the earlier turns as
``history`` (the ``codex`` worker turns that into a transcript in its prompt). All
turns run in one leg directory, ``<artifact_root>/agent``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from steerflow import _faults
from steerflow._live import LiveWriter
from steerflow.checkpoint import CheckpointWriter
from steerflow.control import ControlPoller, SteeringTarget
from steerflow.control._queue import UNENFORCEABLE_KEY
from steerflow.errors import (
    LeaseLostError,
    PersistenceError,
    StateDBLostError,
    SteerflowError,
    UsageError,
)
from steerflow.executor import (
    FLAG_NAMES,
    PARAMETER_NAMES,
    CallScope,
    Caps,
    EventType,
    FlowEvent,
    Meter,
    enforceable,
    render_steer,
    step_event,
    unenforceable,
)
from steerflow.home import RunDir, allocate_run_dir, make_private_dirs
from steerflow.orchestrate._agent_options import (
    CONTINUE_INSTRUCTION,
    AgentOptions,
    AgentResult,
    TurnOutcome,
    checked_mcp_servers,
)
from steerflow.orchestrate._agent_state import AGENT_KIND, LEG_KEY, turn_key, turn_members
from steerflow.orchestrate._claim import LINEAGE_KEY, RUN_ID_KEY, create_session, lineage, run_name
from steerflow.orchestrate._lease import LeaseKeeper, LeaseLoss, loss_error
from steerflow.orchestrate._options import EndStatus, exit_code_for
from steerflow.orchestrate._resume import IN_FLIGHT_KEY
from steerflow.orchestrate._stranded import redeliver_stranded
from steerflow.orchestrate._tracing import close_trace, open_trace
from steerflow.providers import (
    Message,
    Provider,
    ProviderRequest,
    ProviderResponse,
    Usage,
    make_provider,
)
from steerflow.providers._plugins import checked_response
from steerflow.providers._pricing import PriceTable, as_prices
from steerflow.state import NodeStatus, NodeUpdate, SessionRow, StateDB, this_host
from steerflow.tools._loop import LoopHeld

if TYPE_CHECKING:
    from steerflow.tools import ToolRuntime
    from steerflow.tracing._run import RunTracer

__all__ = ["MAX_TURNS_RESULT", "AgentRun", "AgentTarget", "run_agent"]

#: The stored result of a message still pending when the turn budget ran out.
MAX_TURNS_RESULT = "rejected:max-turns"
#: Bound on waiting for the poller to list rows committed before a turn ended.
_CATCH_UP_S = 10.0

Progress = Callable[[str], None]


class AgentTarget(SteeringTarget):
    """What the control poller may do to a running agent: queue messages, stop it.

    There is no pause gate: ``ctl pause|resume`` are refused before a row is
    inserted; a row inserted by another writer is stamped ``rejected:error:...``.
    """

    def __init__(self) -> None:
        self.inbox: list[dict[str, Any]] = []
        #: No further turn will start: later messages are ``rejected:no-pending-ops``.
        self.finished = False
        #: A turn boundary is deciding what the next turn takes: claim messages now.
        self.claiming = False
        self.on_stop: Callable[[bool, str | None, str], None] | None = None
        #: The run's meter, which ``ctl budget`` re-caps (set once the run starts).
        self.meter: Meter | None = None
        #: Cap -> why the agent's model cannot enforce it (``executor.unenforceable``).
        self.unenforceable: dict[str, str] = {}

    def pause(self) -> None:
        raise SteerflowError("an agent has no pause gate (pause is flow-only)")

    def resume(self) -> None:
        raise SteerflowError("an agent has no pause gate (resume is flow-only)")

    def has_pending_operation(self) -> bool:
        return not self.finished

    def add_operator_message(self, text: str, *, ts: float, control_id: str) -> None:
        self.inbox.append({"text": text, "ts": ts, "control_id": control_id})

    def defers_message_stamp(self) -> bool:
        """Always: ``applied`` once the turn the message starts is durable."""
        return True

    def defers_message_claim(self) -> bool:
        """While a turn runs: its messages are claimed when the next turn starts."""
        return not self.claiming and not self.finished

    def stop(self, *, now: bool, reason: str | None, control_id: str) -> None:
        if self.on_stop is None:
            raise NotImplementedError
        self.on_stop(now, reason, control_id)

    def set_budget(self, *, max_cost: float | None, max_tokens: int | None) -> str:
        if self.meter is None:
            raise NotImplementedError
        given = {"max_cost": max_cost, "max_tokens": max_tokens}
        for name, why in self.unenforceable.items():
            if given[name] is not None:  # as a flow's (normally refused by the writer)
                return f"rejected:unenforceable:{why}"[:500]
        # Checked before the next turn starts; a turn in flight finishes either way.
        self.meter.recap(max_cost, max_tokens)
        return "applied"

    def is_paused(self) -> bool:
        return False

    def take(self) -> list[dict[str, Any]]:
        """Every message delivered so far, oldest first; the inbox is then empty."""
        messages, self.inbox = self.inbox, []
        return messages


@dataclass
class _Live:
    db: StateDB
    session_id: str
    invocation_id: str
    run_dir: RunDir
    poller: ControlPoller
    writer: CheckpointWriter
    lease: LeaseKeeper
    #: Each turn's output as it comes, beside the run (decision 190).
    output: LiveWriter = field(init=False)

    def __post_init__(self) -> None:
        self.output = LiveWriter(self.run_dir.path)


class AgentRun:
    """A single agent invocation; :meth:`run` raises only for refusals before it starts."""

    def __init__(
        self,
        options: AgentOptions,
        *,
        home: Path,
        progress: Progress | None = None,
        provider: Provider | None = None,
    ) -> None:
        self.options = options
        self.home = home
        self.progress = progress or (lambda _line: None)
        seed = options.resume
        self.task = seed.task if seed else options.task
        self.model = seed.model if seed else options.model
        self.max_turns = seed.max_turns if seed else options.max_turns
        self.tools: tuple[str, ...] = seed.tools if seed else tuple(options.tools)
        self.mcp_servers: dict[str, dict[str, Any]] = (
            seed.mcp_servers if seed else checked_mcp_servers(options.mcp_servers)
        )
        self.tool_runtime: ToolRuntime | None = None
        self.target = AgentTarget()
        self.target.on_stop = self.request_operator_stop
        self.turns: list[TurnOutcome] = list(seed.turns) if seed else []
        self.conversation = seed.conversation if seed else None
        self.context: dict[str, Any] = dict(seed.flow_context) if seed else {}
        #: ``{"turn", "instruction", "controls"}`` of a turn started after the last
        #: recorded one (``next`` on that turn's entry), None when there is none.
        self.in_flight: dict[str, Any] | None = None
        if seed is not None and seed.next_instruction is not None and self.turns:
            self.in_flight = {"turn": len(self.turns) + 1,
                              "instruction": seed.next_instruction,
                              "controls": list(seed.next_controls)}  # fmt: skip
        self.stop_signal: int | None = None
        self.stopped_by: dict[str, Any] | None = None
        self.deadline_hit = False
        self.cut_short = False  # a turn was cancelled: its prompt is still to run
        self.rejected: list[dict[str, str]] = []
        #: Spend and caps of this run's turns (checked before each turn).
        self.meter = Meter()
        self.budget_hit = False
        self.checkpoint_error: str | None = None
        #: Set once the session's lease was taken over or its state DB lost (decision 121).
        self.lease_loss: LeaseLoss | None = None
        self._scope: CallScope | None = None
        #: The model; built from the spec by :meth:`run` unless given (library use, tests).
        self._provider: Provider | None = provider
        #: What a tool turn's steps cost, replayed ones included (its recorded usage).
        self.loop_usage: Usage | None = None
        #: The run's OpenTelemetry spans (issue 45), while it runs with tracing on.
        self._trace: RunTracer | None = None
        self._turn_prompt: str | None = None  # the turn in flight's prompt (traced content)

    # -- stopping --------------------------------------------------------------------------

    def request_stop(self, signum: int) -> None:
        """SIGINT/SIGTERM: cancel the turn in flight, persist, exit 130/143."""
        if self.stop_signal is None:
            self.stop_signal = signum
        self.target.finished = True
        if self._scope is not None:
            self._scope.cancel(signal.Signals(signum).name)

    def request_operator_stop(self, now: bool, reason: str | None, control_id: str) -> None:
        """``ctl stop``: end after the current turn (``now``: cancel it); exit 75."""
        if self.stopped_by is None:
            self.stopped_by = {"control_id": control_id, "reason": reason, "now": now}
        elif now:
            self.stopped_by["now"] = True
        self.target.finished = True
        if now and self._scope is not None:
            self._scope.cancel("stop")

    def _lease_lost(self, loss: LeaseLoss) -> None:
        """No turn starts any more; a takeover also cancels the turn in flight."""
        self.lease_loss = loss
        self.target.finished = True
        if loss.taken_over and self._scope is not None:
            self._scope.cancel(loss.reason)

    def _deadline(self) -> None:
        self.deadline_hit = True
        self.target.finished = True
        # As in a flow (decision 23): a worker is stopped, a chat call may finish, a
        # function gets its grace (decision 241).
        provider, scope = self._provider, self._scope
        if scope is None or provider is None:
            return
        grace = getattr(provider, "deadline_grace_s", None)
        if provider.cancel_at_deadline:
            scope.cancel("deadline")
        elif grace is not None:
            asyncio.get_running_loop().call_later(grace, scope.cancel, "deadline")

    def _ending(self) -> bool:
        stopping = self.stop_signal is not None or self.stopped_by is not None
        return stopping or self.deadline_hit or self.lease_loss is not None

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> AgentResult:
        """Open the session, run the turns, persist; return the result."""
        seed = self.options.resume
        self._trace = await open_trace(
            self.options.otel,
            home=self.home,
            kind="agent",
            resumed_from=seed.resumed_from if seed is not None else None,
            source_run_id=seed.source_run_id if seed is not None else None,
        )
        if self._trace is None:
            return await self._run_untraced()
        result: AgentResult | None = None
        failure: BaseException | None = None
        try:
            result = await self._run_untraced()
            return result
        except BaseException as exc:
            failure = exc
            raise
        finally:
            await close_trace(
                self._trace,
                status=result.status if result is not None else "error",
                exit_code=int(result.exit_code) if result is not None else None,
                usage=result.usage if result is not None else None,
                error=failure,
            )

    async def _run_untraced(self) -> AgentResult:
        cluster = None
        if self.options.executor == "ray":
            from steerflow.cluster import connect_stopped, join_ray

            # Before anything exists; a signal ends the wait (see FlowRun._join_cluster).
            self._scope = scope = CallScope()
            try:
                with scope:
                    cluster = await join_ray(self.options.ray_address)
            finally:
                self._scope = None
            if cluster is None:
                raise connect_stopped(scope.cancelled_by or "SIGINT", self.options.ray_address)
        try:
            if self._provider is None:
                built = await asyncio.to_thread(make_provider, self.model)  # a bad spec: exit 2
                self._provider = cluster.wrap(lambda role: None)(built) if cluster else built
            return await self._run_with_provider(self._provider)
        finally:
            if cluster is not None:
                await asyncio.to_thread(cluster.close)

    async def _run_with_provider(self, provider: Provider) -> AgentResult:
        opts, seed = self.options, self.options.resume
        chain = seed.caps if seed is not None else Caps()
        caps = Caps(
            chain.max_cost if opts.max_cost is None else opts.max_cost,
            chain.max_tokens if opts.max_tokens is None else opts.max_tokens,
        )
        prices = PriceTable(as_prices(opts.prices))
        if self.tools and not provider.supports_tools:
            raise UsageError(
                f"--tool needs a model that can call tools; {self.model!r} cannot "
                "(openai/..., anthropic/..., script:... can)"
            )
        names = FLAG_NAMES if opts.names_flags else PARAMETER_NAMES
        await asyncio.to_thread(enforceable, caps, prices, {self.model: provider}, names)
        await asyncio.to_thread(prices.prepare, [self.model])
        models = {self.model: provider}
        self.target.unenforceable = await asyncio.to_thread(unenforceable, prices, models)
        # A cap is the chain's: a resume counts what the replayed turns spent.
        self.meter = Meter(
            prices,
            caps,
            base=seed.spent if seed is not None else None,
            doubt=seed.doubt if seed is not None else None,
        )
        for turn in self.turns:
            self.meter.observe(Usage.from_json(turn.usage))
        self.target.meter = self.meter
        db = await asyncio.to_thread(StateDB.open, self.home)
        try:
            return await self._run_with_db(db, provider)
        finally:
            if self.tool_runtime is not None:
                await self.tool_runtime.aclose()
            await provider.aclose()
            await asyncio.to_thread(db.close)

    async def _run_with_db(self, db: StateDB, provider: Provider) -> AgentResult:
        seed = self.options.resume
        root = seed.artifact_root if seed is not None else self.options.save
        run_dir = await asyncio.to_thread(allocate_run_dir, self.home, save=root)
        if self.tools:
            from steerflow.tools._runtime import open_runtime

            # Closed by run()'s finally; an MCP server's stderr is kept in the run directory.
            self.tool_runtime = open_runtime(
                mcp_servers=self.mcp_servers, tool_options={}, stderr_dir=run_dir.path / "mcp"
            )
        session, invocation_id = await self._open_session(db, run_dir)
        session_id = session.id
        lease = LeaseKeeper(db, session_id, session.lease_epoch)
        lease.on_lost.append(self._lease_lost)
        poller = ControlPoller(self.home, session_id, self.target)
        # ``applying:<claimant>`` names the executor that holds a message.
        poller.claimant = f"{this_host()}:{os.getpid()}:agent-executor:{session_id[:12]}"
        if self._trace is not None:
            trace = self._trace
            await asyncio.to_thread(
                lambda: trace.session(
                    run_id=run_dir.run_id, session_id=session_id, name=self.task[:80],
                    run_dir=run_dir.path,
                )
            )  # fmt: skip
            poller.on_stamped.append(trace.on_control)
        stop_heartbeat = asyncio.Event()
        result: AgentResult | None = None
        error: Exception | None = None
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(poller.run(), name="control-poller")
            tasks.create_task(lease.run(stop_heartbeat), name="heartbeat")
            try:
                writer = await self._open_writer(session_id, run_dir)
                if seed is not None:  # once this run is the one a later resume continues
                    await redeliver_stranded(
                        db, seed.stranded, session_id, claimed=seed.redeliver_claimed
                    )
                live = _Live(db, session_id, invocation_id, run_dir, poller, writer, lease)
                try:
                    result = await self._under_deadline(live, provider)
                finally:
                    await asyncio.to_thread(live.output.close)
            except Exception as exc:  # re-raised below as itself, not in an ExceptionGroup
                error = exc
            finally:
                self.target.finished = True
                await poller.stop()
                stop_heartbeat.set()
        if error is not None:
            raise error
        assert result is not None
        if self.lease_loss is not None:
            raise loss_error(
                self.lease_loss,
                run_id=run_dir.run_id,
                session_id=session_id,
                cancelled=int(self.cut_short and self.lease_loss.taken_over),
                withheld=lease.withheld,
                completed=sum(1 for t in self.turns if t.status == "completed"),
                checkpoint=str(run_dir.checkpoint_path),
            )
        return result

    async def _open_session(self, db: StateDB, run_dir: RunDir) -> tuple[SessionRow, str]:
        seed = self.options.resume
        metadata: dict[str, Any] = {
            "run_id": run_dir.run_id,
            "poller": "pending",
            "source": "agent",
            "agent": self._meta(turn=None),
        }
        if self.target.unenforceable:  # ``ctl budget`` refuses these caps (decision 246)
            metadata[UNENFORCEABLE_KEY] = dict(self.target.unenforceable)
        session, _ = await create_session(
            db,
            self.home,
            run_dir,
            kind=AGENT_KIND,
            prompt=self.task,
            metadata=metadata,
            seed=seed,
            name=run_name(None, None, self.task),
        )
        invocation = await asyncio.to_thread(
            lambda: db.create_invocation(session_id=session.id, kind=AGENT_KIND)
        )
        self.progress(f"agent session {session.id} (run {run_dir.run_id}, model {self.model})")
        return session, invocation.id

    def _meta(self, *, turn: int | None) -> dict[str, Any]:
        """``node_metadata["agent"]``: what ``ctl status`` shows."""
        done = sum(1 for t in self.turns if t.status == "completed")
        return {"turns": done, "turn": turn, "max_turns": self.max_turns, "model": self.model}

    async def _open_writer(self, session_id: str, run_dir: RunDir) -> CheckpointWriter:
        last = self.turns[-1].number if self.turns else None
        seed = self.options.resume
        seed_ops = {
            turn_key(t.number): {
                "status": t.status,
                "response": _stored_response(t),
                **_members(t, self.in_flight if t.number == last else None),
            }
            for t in self.turns
        }
        writer = CheckpointWriter(
            run_dir.checkpoint_path,
            session_id=session_id,
            prompt=self.task,
            plan=[],
            config={
                "kind": AGENT_KIND,
                "model": self.model,
                "max_turns": self.max_turns,
                "artifact_root": str(run_dir.artifact_root),
                "leg": LEG_KEY,
                **({"tools": list(self.tools)} if self.tools else {}),
                **({"mcp_servers": self.mcp_servers} if self.mcp_servers else {}),
                **({"budget": self.meter.caps.to_json()} if self.meter.caps.any else {}),
                # The chain's calls that may have been paid (decision 217), as a flow's.
                **({IN_FLIGHT_KEY: seed.doubt.to_json()} if seed and seed.doubt.calls else {}),
                # The run it resumed, for `db rebuild` (its claim on that source).
                **({LINEAGE_KEY: lineage(self.options.resume)} if self.options.resume else {}),
                # Its own id: `db rebuild` tells it from a copy of its directory.
                RUN_ID_KEY: run_dir.run_id,
            },
            flow_context=self.context,
            version=3,
            ops=seed_ops,
            steps=seed.steps if seed is not None else None,
        )
        await writer.flush()
        return writer

    async def _under_deadline(self, s: _Live, provider: Provider) -> AgentResult:
        timeout_s = self.options.timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.call_later(timeout_s, self._deadline) if timeout_s is not None else None
        try:
            await s.poller.start_executing()
            await self._publish_replayed(s)
            try:
                await self._turns(s, provider)
            except PersistenceError as exc:
                self.checkpoint_error = str(exc)
        finally:
            if deadline is not None:
                deadline.cancel()
        return await self._conclude(s)

    # -- the turns -------------------------------------------------------------------------

    async def _turns(self, s: _Live, provider: Provider) -> None:
        seed = self.options.resume
        prompt: str | None
        if seed is not None:
            prompt, controls = seed.next_instruction, seed.next_controls
        else:
            prompt, controls = self.task, ()
        while True:
            if prompt is None:
                if self._ending():
                    return
                messages = await self._pending_messages(s)
                if not messages:
                    return
                prompt = render_steer(messages, CONTINUE_INSTRUCTION)
                controls = tuple(str(m["control_id"]) for m in messages)
                await self._record_next(s, prompt, controls)
                _faults.seam("agent-next", "after")  # durable, not yet stamped
                s.poller.messages_delivered(list(controls))
                self.progress(
                    f"steer: {len(controls)} operator message(s) start turn {self._next_number()}"
                )
                # Said, not yet stamped: the poller writes the stamps on its next tick.
                _faults.seam("agent-steered", "after")
            if self._ending():
                return
            if not self.meter.room():
                # The turn's prompt is recorded (the task, or ``next``): a resume runs it.
                self.budget_hit = True
                return
            outcome = await self._run_turn(s, provider, prompt, controls)
            if outcome is None or outcome.status == "failed":
                return
            prompt, controls = None, ()

    def _next_number(self) -> int:
        return len(self.turns) + 1

    async def _pending_messages(self, s: _Live) -> list[dict[str, Any]]:
        """The messages the next turn takes; none: the agent is done (or out of turns)."""
        # The rows left pending while the turn ran are claimed by this listing.
        self.target.claiming = True
        try:
            async with asyncio.timeout(_CATCH_UP_S):
                await s.poller.catch_up()
        except TimeoutError:
            pass  # a stuck listing: what was claimed so far is all this turn boundary sees
        if self._ending():
            self.target.claiming = False
            return []
        # From here to the decision nothing awaits, so no claim can slip in between;
        # from the decision on, rows wait for the next boundary again.
        messages = self.target.take()
        self.target.claiming = False
        if not messages:
            self.target.finished = True
            return []
        if len(self.turns) >= self.max_turns:
            self.target.finished = True
            ids = [str(m["control_id"]) for m in messages]
            s.poller.messages_rejected(list(ids), MAX_TURNS_RESULT)
            self.rejected += [{"control_id": i, "result": MAX_TURNS_RESULT} for i in ids]
            self.progress(
                f"turn budget reached ({self.max_turns}): {len(ids)} message(s) {MAX_TURNS_RESULT}"
            )
            return []
        return messages

    async def _record_next(self, s: _Live, prompt: str, controls: tuple[str, ...]) -> None:
        """Make the next turn's prompt durable before its messages are stamped ``applied``.

        The last turn's entry is recorded again, unchanged but for its ``next`` member.
        """
        self.in_flight = {"turn": self._next_number(), "instruction": prompt,
                          "controls": list(controls)}  # fmt: skip
        last = self.turns[-1]
        if not await self._may_record(s):
            return
        await s.writer.record(
            turn_key(last.number),
            status=last.status,
            response=_stored_response(last),
            **_members(last, self.in_flight),
        )

    def _request(self, s: _Live, provider: Provider, number: int, prompt: str) -> ProviderRequest:
        if self.conversation is not None:
            history: tuple[Message, ...] = ()  # the worker holds the conversation itself
        else:
            history = tuple(
                message
                for t in self.turns
                if t.status == "completed"
                for message in (
                    Message(role="user", content=t.instruction),
                    Message(role="assistant", content=t.response or ""),
                )
            )
        return ProviderRequest(
            run_id=s.run_dir.run_id,
            node_key=turn_key(number),
            node_id=uuid.uuid4().hex,
            kind="planned",
            assignee="agent",
            instruction=prompt,
            history=history,
            artifact_dir=s.run_dir.leg_artifact_dir(LEG_KEY),
            home=self.home,
            conversation=self.conversation,
            live=s.output.sink(turn_key(number)),
        )

    async def _run_turn(
        self, s: _Live, provider: Provider, prompt: str, controls: tuple[str, ...]
    ) -> TurnOutcome | None:
        """Run one turn and record it; ``None`` when it was cancelled (not recorded)."""
        number = self._next_number()
        key = turn_key(number)
        self._turn_prompt = prompt
        request = self._request(s, provider, number, prompt)
        if provider.needs_artifact_dir:
            await asyncio.to_thread(make_private_dirs, request.artifact_dir)
        detail: dict[str, Any] = {"instruction": prompt, "model": self.model,
                                  "started_at": time.time()}  # fmt: skip
        if controls:
            detail["steers"] = list(controls)  # the control ids, as a flow node's
        await self._publish(s, key, "running", detail)
        await self._set_meta(s, turn=number)
        self._turn_event("node_started", key)
        self.progress(f"turn {number} started")
        # The turn's admission, after every await above: past the lease's local deadline
        # it asks the state DB (decision 121).
        if not (s.lease.fresh() or await s.lease.hold()):
            reason = s.lease.lost.reason if s.lease.lost is not None else "lease"
            await self._cut_short(s, key, number, detail, reason)
            return None
        scope = CallScope()
        self._scope = scope
        error: str | None = None
        text = ""
        used: dict[str, Any] | None = None
        try:
            with scope:
                # Write-ahead (decision 217): durable before the turn's call leaves. A
                # checkpoint that cannot hold it ends the run before anything is paid.
                response = await self._call(s, provider, request, key, number)
                text = response.text
                if response.conversation:
                    self.conversation = response.conversation
                priced = self.meter.charge(self.model, response.usage)
                if self.tool_runtime is not None:
                    priced = self.loop_usage
                used = priced.to_json() if priced is not None else None
        except PersistenceError:
            raise  # the intent could not be recorded: the call never left
        except LoopHeld as held:  # stopped between steps: the turn reruns from its steps
            scope.cancelled_by = scope.cancelled_by or held.reason
        except Exception as exc:  # the turn fails; the run reports it
            error = str(exc) or type(exc).__name__
        finally:
            self._scope = None
            if s.output.end(key):
                detail["streamed"] = True  # its live file gets an end mark (decision 235)
        detail["ended_at"] = time.time()
        if scope.cancelled_by is not None:
            await self._cut_short(s, key, number, detail, scope.cancelled_by)
            return None
        outcome = TurnOutcome(
            number=number,
            status="failed" if error is not None else "completed",
            instruction=prompt,
            response=None if error is not None else text,
            controls=controls,
            error=error,
            conversation=self.conversation,
            usage=used,
        )
        self.turns.append(outcome)
        self.in_flight = None
        self._trace_turn(key, outcome)
        if not await self._may_record(s):
            return None  # the run is another session's now: not recorded as its turn
        await s.writer.record(
            key, status=outcome.status, response=_stored_response(outcome), **_members(outcome)
        )
        if error is not None:
            detail["error"] = error
        await self._publish(s, key, outcome.status, detail)  # type: ignore[arg-type]
        await self._set_meta(s, turn=None)
        self.progress(f"turn {number} {outcome.status}" + (f": {error}" if error else ""))
        return outcome

    async def _call(
        self, s: _Live, provider: Provider, request: ProviderRequest, key: str, number: int
    ) -> ProviderResponse:
        """The turn's call: one request, or with ``--tool`` a tool loop (issue 39)."""
        if self.tool_runtime is None:
            await self._record_call(s, key, number)
            return checked_response(provider, await provider.invoke(request))
        from steerflow.orchestrate._agent_steps import AgentSteps
        from steerflow.tools._loop import ToolLoop

        seed = self.options.resume
        loop = ToolLoop(
            provider,
            await self.tool_runtime.toolset(self.tools),
            AgentSteps(self, s.writer, key),
            node=key,
            record="op",
            key=key,
            prior=[st for st in seed.steps if st["key"] == key] if seed is not None else (),
            decisions=seed.tool_decisions if seed is not None else None,
        )
        response = await loop.run(request)
        # Every step was charged as it returned: the turn records what they cost.
        response.usage = None
        self.loop_usage = loop.total
        return response

    async def _record_call(self, s: _Live, key: str, number: int) -> None:
        """The turn call's write-ahead intent, closed by the turn's entry."""
        cost, tokens = self.meter.reservation()
        prior = self.options.resume.in_flight if self.options.resume is not None else ()
        call_id, attempt, started = (
            uuid.uuid4().hex,
            1 + sum(c.node == key for c in prior),
            time.time(),
        )
        await s.writer.record_call(
            call_id,
            node=key,
            record="op",
            key=key,
            attempt=attempt,
            model=self.model,
            started_at=started,
            reserved_cost_usd=cost,
            reserved_tokens=tokens,
        )
        if self._trace is not None:
            self._trace.model_request(
                key, key=key, model=self.model, call_id=call_id, attempt=attempt,
                started_at=started, prompt=self._turn_prompt,
            )  # fmt: skip

    def trace_request(self, key: str, call_id: str, step: int, started_at: float) -> None:
        """A model request of a ``--tool`` turn's loop leaves: its span (issue 45)."""
        if self._trace is not None:
            self._trace.model_request(
                key, key=key, model=self.model, call_id=call_id, attempt=step,
                started_at=started_at, prompt=None, node_attempt=False,
            )  # fmt: skip

    def trace_step(self, key: str, entry: Mapping[str, Any]) -> None:
        """A journaled step of a ``--tool`` turn, said as a flow's tool node says it."""
        said = step_event(entry)
        if said is not None:
            self._turn_event(said[0], key, **said[1])

    def _trace_turn(self, key: str, turn: TurnOutcome) -> None:
        kind: EventType = "node_failed" if turn.error is not None else "node_completed"
        self._turn_event(kind, key, usage=turn.usage, error=turn.error, response=turn.response)

    def _turn_event(self, kind: EventType, key: str, **data: object) -> None:
        """A turn as the tracer reads a node (the agent kind has no event bus)."""
        if self._trace is not None:
            self._trace.on_event(FlowEvent(kind, node_key=key, node_id=key,
                                           data={"kind": "turn", **data}))  # fmt: skip

    async def _cut_short(
        self, s: _Live, key: str, number: int, detail: dict[str, Any], reason: str
    ) -> None:
        """A turn cancelled, or never started: not recorded; it reruns on resume."""
        self.cut_short = True
        detail["cancelled"] = reason
        self._turn_event("node_withheld", key, reason=reason)
        await self._publish(s, key, "pending", detail)
        self.progress(f"turn {number} cancelled ({reason}); it reruns on resume")

    @property
    def usage(self) -> dict[str, Any]:
        """What this run's turns spent (CONTRACT §11 members)."""
        return self.meter.spent.to_json()

    async def _may_record(self, s: _Live) -> bool:
        return s.lease.fresh() or await s.lease.may_record()

    # -- publication -----------------------------------------------------------------------

    async def _publish(
        self, s: _Live, key: str, status: NodeStatus, detail: dict[str, Any]
    ) -> None:
        update = NodeUpdate(node_key=key, kind="planned", status=status, assignee="agent",
                            detail=dict(detail))  # fmt: skip
        if s.lease.lost is not None:
            return
        try:
            await asyncio.to_thread(
                lambda: s.db.upsert_nodes(s.session_id, [update], epoch=s.lease.epoch)
            )
        except (LeaseLostError, StateDBLostError) as exc:
            s.lease.fenced(exc)
        except SteerflowError:
            pass  # a live view; the checkpoint is the record

    async def _publish_replayed(self, s: _Live) -> None:
        for turn in self.turns:
            await self._publish(
                s, turn_key(turn.number), turn.status,  # type: ignore[arg-type]
                {"replayed": True, "model": self.model},
            )  # fmt: skip

    async def _set_meta(self, s: _Live, *, turn: int | None) -> None:
        if s.lease.lost is not None:
            return
        patch = {"agent": self._meta(turn=turn)}
        try:
            await asyncio.to_thread(
                lambda: s.db.update_node_metadata(s.session_id, patch, epoch=s.lease.epoch)
            )
        except (LeaseLostError, StateDBLostError) as exc:
            s.lease.fenced(exc)
        except SteerflowError:
            pass  # ``ctl status`` shows a stale count at worst

    # -- the end ---------------------------------------------------------------------------

    def _status(self) -> EndStatus:
        if self.stop_signal is not None:
            return "interrupted"
        if self.checkpoint_error is not None or any(t.status == "failed" for t in self.turns):
            return "failed"
        if self.stopped_by is not None:
            return "stopped"
        if self.deadline_hit:
            return "timed_out"
        return "budget_exhausted" if self.budget_hit else "completed"

    async def _conclude(self, s: _Live) -> AgentResult:
        try:
            await s.writer.close()
        except PersistenceError as exc:
            self.checkpoint_error = self.checkpoint_error or str(exc)
        status = self._status()
        checkpoint = {
            "path": str(s.run_dir.checkpoint_path),
            "version": 3,
            "persisted": self.checkpoint_error is None and s.writer.persisted,
            "error": self.checkpoint_error or s.writer.error,
            "bytes_written": s.writer.bytes_written,
        }
        extra: dict[str, Any] = {
            "checkpoint": checkpoint,
            "usage": self.usage,
            "budget": self.meter.caps.to_json(),
            "agent": self._meta(turn=None),
            "finished_at": time.time(),
        }
        if self.stopped_by is not None:
            extra["stopped_by"] = dict(self.stopped_by)

        epoch = s.lease.epoch

        def finish() -> None:
            s.db.check_file()  # a database deleted under the run: say so, not exit 0 unlisted
            s.db.update_node_metadata(s.session_id, extra, epoch=epoch)
            s.db.set_session_status(s.session_id, status, epoch=epoch)
            s.db.set_invocation_status(s.invocation_id, status)

        if self.lease_loss is None:
            try:
                await asyncio.to_thread(finish)
            except (LeaseLostError, StateDBLostError) as exc:
                s.lease.fenced(exc)
        seed = self.options.resume
        return AgentResult(
            session_id=s.session_id,
            invocation_id=s.invocation_id,
            run_id=s.run_dir.run_id,
            run_dir=str(s.run_dir.path),
            status=status,
            exit_code=exit_code_for(status, self.stop_signal),
            checkpoint=checkpoint,
            turns=list(self.turns),
            checkpoint_recovery=seed.checkpoint_recovery if seed else None,
            resumed_from=seed.resumed_from if seed else None,
            stopped_by=dict(self.stopped_by) if self.stopped_by is not None else None,
            rejected=list(self.rejected),
            usage=self.usage,
            budget=self.meter.caps.to_json(),
            spent_line=self.meter.exhausted_line() if status == "budget_exhausted" else None,
            warnings=list(seed.notes) if seed else [],
            stranded_messages=[m.to_json() for m in seed.stranded] if seed else [],
            in_flight_calls=[call.to_json() for call in seed.in_flight] if seed else [],
        )


def _members(turn: TurnOutcome, in_flight: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the entry of ``turn`` records beside its status and response."""
    return turn_members(
        turn.number,
        turn.instruction,
        turn.controls,
        turn.conversation,
        in_flight=in_flight,
        usage=turn.usage,
    )


def _stored_response(turn: TurnOutcome) -> object:
    """A completed turn stores its text; a failed one ``{"error": ...}`` (as a flow node)."""
    if turn.status == "failed":
        return {"error": turn.error}
    return turn.response


async def run_agent(
    options: AgentOptions, *, home: Path, progress: Progress | None = None
) -> AgentResult:
    """Run one agent invocation (library entry point)."""
    return await AgentRun(options, home=home, progress=progress).run()
