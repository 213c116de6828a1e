"""The dependency-aware executor: one asyncio task per operation inside one TaskGroup.

Each node waits for its dependencies, evaluates its edge conditions, renders its
instruction, waits at the pause gate, takes capacity, claims the operator steers
not yet claimed, invokes its provider and reports to completion observers. Admission can
be closed (signals, deadlines): nodes not yet invoked then stay ``pending``.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from steerflow._live import LiveWriter
from steerflow.artifacts import check_leg, merge_declared
from steerflow.errors import ProviderError, UnsafePathError
from steerflow.executor._approvals import ApprovalDesk
from steerflow.executor._budget import BUDGET_REASON, Meter
from steerflow.executor._events import EventBus, EventType, FlowEvent, step_event
from steerflow.executor._fence import AdmissionFence
from steerflow.executor._graph import CallBranch, Edge, Graph, NodeStatus, Operation
from steerflow.executor._intent import CallIntent, IntentHook, StepRecorder
from steerflow.executor._output import CHARGED, ask_structured
from steerflow.executor._retry import NodeTries, limited
from steerflow.executor._scope import CallScope
from steerflow.executor._steer import PauseGate, SharedContext, render_steer
from steerflow.plan import AGENT_ID_PATTERN, ReactivePolicy, SpawnSpec, is_agent_id
from steerflow.providers import (
    DependencyResult,
    Message,
    Provider,
    ProviderRequest,
    ProviderResponse,
    ensure_leg_dir,
    is_leg_key,
)
from steerflow.providers._plugins import checked_response

if TYPE_CHECKING:
    from steerflow.tools import ToolRuntime

__all__ = ["CLI_DEFAULT_MAX_SPAWN", "LIBRARY_DEFAULT_MAX_SPAWN", "FlowExecutor", "SpawnRejection"]

LIBRARY_DEFAULT_MAX_SPAWN = 50
#: Why a synthesis was skipped when none of its workers completed (decision 103).
NO_WORKER_COMPLETED = (
    "no worker completed, so there is nothing to synthesize "
    "(plan key synthesis.when_all_failed: run asks for it anyway)"
)
CLI_DEFAULT_MAX_SPAWN = 20

Observer = Callable[[Operation], Awaitable[None]]


class LoopHook(Protocol):
    """What the executor asks about loops (``executor._loops.LoopRunner``)."""

    async def settle(self, op: Operation, executor: FlowExecutor) -> None:
        """``op`` became terminal: decide its loop's round, maybe add the next."""


@dataclass
class _Call:
    """A provider call in flight: its cancel scope, and what a deadline does to it.

    ``stops_at_deadline``: cancelled at the deadline; else ``deadline_grace_s`` seconds
    after it (``timer``) when not None; else it finishes (decision 241).
    """

    scope: CallScope
    stops_at_deadline: bool
    deadline_grace_s: float | None = None
    timer: asyncio.TimerHandle | None = None
    #: Waiting out its node's ``retry.backoff_s``: any close of admission ends the wait.
    backing_off: bool = False

    @classmethod
    def of(cls, provider: Provider) -> _Call:
        """A new call to ``provider``, with what its class says a deadline does to it."""
        grace = getattr(provider, "deadline_grace_s", None)  # a registered ABC may lack it
        return cls(CallScope(), provider.cancel_at_deadline, grace)


@dataclass(frozen=True)
class SpawnRejection:
    """A spawn request the executor refused, and why."""

    emitter: str
    agent_id: str | None
    reason: str
    detail: str


class FlowExecutor:
    """Runs a graph to completion (or until admission closes)."""

    def __init__(
        self,
        graph: Graph,
        *,
        provider_for: Callable[[Operation], Provider],
        run_id: str,
        home: Path,
        artifact_dir: Callable[[str], Path],
        system_prompt: Callable[[Operation], str | None] = lambda op: None,
        concurrency: int = 4,
        reactive: ReactivePolicy | None = None,
        max_spawn: int = LIBRARY_DEFAULT_MAX_SPAWN,
        gate: PauseGate | None = None,
        context: SharedContext | None = None,
        events: EventBus | None = None,
        observers: list[Observer] | None = None,
        call_timeout_s: float | None = None,
        role_artifacts: Callable[[str | None], Sequence[str]] = lambda assignee: (),
        escalation: Callable[[str | None], Sequence[str]] = lambda assignee: (),
        live: LiveWriter | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.graph = graph
        self._provider_for = provider_for
        self._run_id = run_id
        self._home = home
        self._artifact_dir = artifact_dir
        self._system_prompt = system_prompt
        self._limiter = asyncio.Semaphore(concurrency)
        self.concurrency = concurrency
        self.reactive = reactive or ReactivePolicy(enabled=False)
        self.max_spawn = max(0, max_spawn)
        self.gate = gate or PauseGate()
        self.context = context or SharedContext()
        self.events = events or EventBus()
        self.observers: list[Observer] = list(observers or [])
        self.spawn_observers: list[Callable[[list[Operation]], Awaitable[None]]] = []
        self._call_timeout_s = call_timeout_s
        self._role_artifacts = role_artifacts
        self._escalation = escalation
        #: Where calls' output goes while they run (decision 190); None: nowhere.
        self.live = live
        # One future per node, resolved when it stops: lighter than an Event (no waiter
        # deque), which at 10,000 nodes was ~7 MB (decision 65).
        self._done: dict[str, asyncio.Future[None]] = {}
        self._tg: asyncio.TaskGroup | None = None
        self._inflight: dict[str, _Call] = {}
        self._claims: dict[str, list[dict[str, Any]]] = {}  # messages claimed, not yet sent
        self.admission_open = True
        self.admission_reason: str | None = None
        self.running = 0
        self.max_running = 0
        self.spawned_count = 0
        self.spawn_rejections: list[SpawnRejection] = []
        #: The run's lease, checked right before every provider call (decision 121).
        self.fence: AdmissionFence | None = None
        #: The run's spend and caps: prices every call, and is asked before each admission.
        self.meter: Meter | None = None
        #: Makes each call's write-ahead intent durable before the call is sent (decision
        #: 217); None: calls are sent unrecorded (a version 2 checkpoint, a bare executor).
        self.before_call: IntentHook | None = None
        #: Calls made per node key, beyond those earlier runs of the chain left in flight
        #: (``prior_calls``, set by a resume): the next intent's attempt number.
        self.prior_calls: dict[str, int] = {}
        self._calls: dict[str, int] = {}
        #: Builds a tool node's toolset (``tools.ToolRuntime``); None: no node has tools.
        self.tool_runtime: ToolRuntime | None = None
        #: Journals each step of a tool node's loop (the recorder's); None: unrecorded.
        self.on_step: StepRecorder | None = None
        #: Steps earlier runs of the chain recorded, by ``(record, key)``, and the
        #: operator's ``--tool-call`` decisions, for loops a resume continues.
        self.prior_steps: dict[tuple[str, str], tuple[dict[str, Any], ...]] = {}
        self.tool_decisions: dict[str, str] = {}
        #: Requests that wait for an operator's approval, and their decisions (issue 41).
        self.approvals = ApprovalDesk()
        #: The flow's loops (issue 40 item 4): adds each round as the last one ends.
        self.loops: LoopHook | None = None

    # -- control surface -------------------------------------------------------------------

    def pause(self) -> None:
        """Close the pause gate (idempotent)."""
        self.gate.pause()

    def resume(self) -> None:
        """Open the pause gate (idempotent)."""
        self.gate.resume()

    def has_pending(self) -> bool:
        """True if a message can still reach an operation.

        One not started yet, or a running tool node: its next model request takes it
        (decision 257).
        """
        return any(
            op.status == "pending" or (op.tools and op.status == "running") for op in self.graph
        )

    def close_admission(
        self, reason: str, *, cancel_inflight: bool = False, cancel_long_running: bool = False
    ) -> None:
        """Admit no new operation; optionally cancel provider calls already running.

        ``cancel_inflight`` cancels every call in flight (signals);
        ``cancel_long_running`` only those whose provider sets ``cancel_at_deadline``
        (a deadline: agent workers stop, model calls already invoked finish), and those
        whose provider sets ``deadline_grace_s`` once that grace has passed (function
        nodes, which nothing else bounds: decision 241). A cancelled call's node records
        ``reason`` as its canceller (``Operation.cancelled``).
        """
        if self.admission_open:
            self.admission_open = False
            self.admission_reason = reason
            self._emit("admission_closed", data={"reason": reason})
        # A node waiting for an approval stops waiting: it stays pending, its request
        # recorded, and a resume waits again (issue 41).
        self.approvals.close(self.admission_reason or reason)
        # Waiters at the gate must re-check admission, so open it for them.
        self.gate.resume()
        for call in list(self._inflight.values()):
            if call.backing_off:
                # No call is out: a retry not yet sent is one admission no longer allows.
                call.scope.cancel(reason)
            elif cancel_inflight or (cancel_long_running and call.stops_at_deadline):
                call.scope.cancel(reason)
            elif cancel_long_running and call.deadline_grace_s is not None and not call.timer:
                loop = asyncio.get_running_loop()
                call.timer = loop.call_later(call.deadline_grace_s, call.scope.cancel, reason)

    # -- running ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Run every node; returns when all are terminal or withheld."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            for op in self.graph:
                self._launch(op)
        self._tg = None

    def launch(self, op: Operation) -> None:
        """Start a node added to the graph while the flow runs (a loop's next round)."""
        self._launch(op)

    def emit_spawned(self, op: Operation, emitter: Operation, **data: object) -> None:
        """Say that ``op`` was added to the graph because ``emitter`` ended (a loop round)."""
        self._emit("node_spawned", op, data={"emitter": emitter.key, **data})

    def _launch(self, op: Operation) -> None:
        assert self._tg is not None
        # An escalation retry's future exists from its splice on (see _escalate).
        if op.node_id not in self._done:
            self._done[op.node_id] = asyncio.get_running_loop().create_future()
        self._tg.create_task(self._run_node(op), name=f"node:{op.key}")

    async def _run_node(self, op: Operation) -> None:
        try:
            await self._drive(op)
        except Exception as exc:  # a bug around one node fails that node, not the whole flow
            if not op.terminal:
                op.status, op.error = "failed", f"internal error: {type(exc).__name__}: {exc}"
                self._emit("node_failed", op)
        finally:
            done = self._done[op.node_id]
            if not done.done():
                done.set_result(None)

    async def _drive(self, op: Operation) -> None:
        # A replayed failure is an attempt an escalation retry replaced (never re-run).
        if op.replayed and op.status in ("completed", "failed"):
            self._emit("node_replayed", op)
            await self._notify(op)
            return
        if op is self.graph.synthesis and not await self._synthesis_due(op):
            return
        # Edges are read again after each wait: a splice may have moved one onto an
        # escalation retry while this node waited for the attempt it replaced.
        while (waiting := self._unfinished_source(op)) is not None:
            await asyncio.shield(waiting)
        verdict = self._edge_verdict(op)
        if verdict == "withheld":
            self._emit("node_withheld", op, data={"reason": "dependency not run"})
            return
        if verdict == "skipped":
            self._skip(op, "edge condition not met")
            if self.loops is not None:
                await self.loops.settle(op, self)
            return
        base = self._render_dependencies(op)
        if not await self._admit(op):
            return
        try:
            outcome = await self._call_admitted(op, base)
            # Not held across the observers' awaits (checkpoint durability): 64 such
            # texts, growing layer by layer, left holes the responses could not reuse
            # (~35 MiB of a 10,000-node v3 run's peak RSS, decision 82).
            del base
            retry = await self._after_call(op, outcome)
        finally:
            # The slot is held until the outcome's observers returned, i.e. until the
            # checkpoint acknowledged it: at most ``concurrency`` calls are paid for and
            # not yet saved, and a save that fails closes admission (on_lost) before
            # its slot can admit another call (decision 100).
            self._limiter.release()
            if self.meter is not None:
                self.meter.release(op.node_id)
        if retry is not None:
            self._launch(retry)

    async def _call_admitted(self, op: Operation, base: str) -> NodeStatus:
        """Claim the steers, run the provider call; the node's new status."""
        try:
            # Messages are claimed only now, with capacity in hand, so they go to the
            # operation that actually starts next, not to one still queued (decision 36).
            steers = self.context.take_unrendered(op.key)
            self._claims[op.node_id] = steers
            op.rendered_instruction = render_steer(steers, base)
            if steers:
                op.extra["steers"] = [m.get("control_id") for m in steers]
            op.status = "running"
            op.model = self._model_of(op)
            op.started_at = time.time()
            chain = op.escalation or self._escalation(op.assignee)
            self._emit("node_started", op, data={"model": op.model} if chain else None)
            try:
                outcome = await self._invoke(op)
            finally:
                self._release_claim(op, base)
                _render_later(op, base, self.graph)
            op.ended_at = time.time()
        finally:
            self.running -= 1
        return outcome

    async def _after_call(self, op: Operation, outcome: NodeStatus) -> Operation | None:
        """Record spawns, splice an escalation retry, tell the observers; the retry."""
        if outcome == "completed":
            children = self._spawn_children(op)
            op.spawned_ids = [child.node_id for child in children]
            # Children are recorded (as pending) before they can run and before their
            # emitter's outcome, so no kill point loses an accepted spawn.
            if children:
                for spawn_observer in self.spawn_observers:
                    await spawn_observer(children)
            for child in children:
                self._launch(child)
        retry = await self._escalate(op) if outcome == "failed" else None
        if outcome != "pending":
            if self.loops is not None:  # decided before the outcome that records it
                await self.loops.settle(op, self)
                outcome = op.status  # an until that cannot decide fails its round
            self._emit("node_completed" if outcome == "completed" else "node_failed", op)
            await self._notify(op)
        return retry

    def _skip(self, op: Operation, reason: str) -> None:
        op.status = "skipped"
        op.extra["skipped"] = reason  # for show and the result: why it never ran
        self._emit("node_skipped", op, data={"reason": reason})

    async def _synthesis_due(self, op: Operation) -> bool:
        """True if the synthesis runs now: its workers finished and one has a result.

        Over zero completed workers there is nothing to synthesize, so nothing is paid
        for unless the plan asks (``synthesis.when_all_failed: run``, decision 103).
        """
        if not await self._workers_finished(op):
            return False
        if self.graph.synthesis_when_all_failed or any(
            worker.status == "completed" for worker in self.graph.workers()
        ):
            return True
        self._skip(op, NO_WORKER_COMPLETED)
        return False

    async def _workers_finished(self, op: Operation) -> bool:
        """Wait until every other node stopped; False (withheld) if a worker did not finish.

        A node's spawns and escalation retries are launched before its own future
        resolves, so once every known future is done no worker can appear any more.
        """
        while waiting := [
            done for key, done in self._done.items() if key != op.node_id and not done.done()
        ]:
            await asyncio.wait(waiting)  # never cancels them: other nodes wait on them too
        if any(worker.status == "pending" for worker in self.graph.workers()):
            # Required work withheld: the run ends interrupted, and a resume computes it.
            self._emit("node_withheld", op, data={"reason": "workers not finished"})
            return False
        return True

    def _unfinished_source(self, op: Operation) -> asyncio.Future[None] | None:
        for edge in op.edges:
            done = self._done[edge.source]
            if not done.done():
                return done
        return None

    def _model_of(self, op: Operation) -> str | None:
        """The spec of the provider that will serve ``op`` (None if it cannot be built)."""
        try:
            return self._provider_for(op).spec
        except Exception:  # _invoke builds it again and fails the node with the reason
            return None

    def _edge_verdict(self, op: Operation) -> str:
        sources = [self.graph.ops[e.source] for e in op.edges]
        if any(s.status == "pending" for s in sources):
            return "withheld"
        if all(edge.satisfied_by(s) for edge, s in zip(op.edges, sources, strict=True)):
            return "run"
        return "skipped"

    async def _admit(self, op: Operation) -> bool:
        """Pass the pause gate and take capacity; False if admission closed meanwhile."""
        while True:
            if not self.admission_open:
                self._withhold(op)
                return False
            await self.gate.wait_open(lambda: self._emit("node_paused", op))
            if not self.admission_open:
                self._withhold(op)
                return False
            await self._limiter.acquire()
            # A pause that arrived while we waited for capacity still holds this node:
            # it has not started, so it must not start now.
            if self.gate.paused or not self.admission_open:
                self._limiter.release()
                continue
            meter = self.meter
            if meter is not None:
                if meter.unsized():
                    self._limiter.release()
                    await meter.wait_release()
                    continue
                # Checked and reserved with no await between: no two calls take one room.
                if not meter.room():
                    self._limiter.release()
                    self.close_admission(BUDGET_REASON)
                    continue
                meter.reserve(op.node_id)
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            return True

    def _withhold(self, op: Operation) -> None:
        self._emit(
            "node_withheld", op, data={"reason": self.admission_reason or "admission closed"}
        )

    def _request(self, op: Operation, history: list[Message]) -> ProviderRequest:
        """What ``op``'s provider is called with."""
        return ProviderRequest(
            run_id=self._run_id,
            node_key=op.key,
            node_id=op.node_id,
            kind=op.kind,
            assignee=op.assignee,
            instruction=op.rendered_instruction or op.instruction,
            history=tuple(history),
            artifact_dir=self._artifact_dir(op.key),
            home=self._home,
            allow_spawn=self.reactive.allows(op.assignee) and op is not self.graph.synthesis,
            timeout_s=self._call_timeout_s,
            dependencies=_dependency_results(op, self.graph),
            live=self.live.sink(op.key) if self.live is not None else None,
            output_schema=op.output_schema,
        )

    async def _invoke(self, op: Operation) -> NodeStatus:
        """Call the provider; returns the node's new status (completed, failed, or pending)."""
        history = self._history(op)
        request = self._request(op, history)
        try:
            if not is_leg_key(op.key):
                raise UnsafePathError(f"node id {op.key!r} cannot name an artifact directory")
            provider = self._provider_for(op)
            # In flight from here on: admission was checked without a pause since, so a
            # signal or deadline either withheld this node or reaches its scope.
            call = _Call.of(provider)
            self._inflight[op.node_id] = call
            response: ProviderResponse | None = None
            try:
                with call.scope:
                    if provider.needs_artifact_dir:
                        # Only for providers that expect it: a mkdir per node was most of
                        # a 10,000-node run's cost (decision 62); never on the loop.
                        leg = request.artifact_dir
                        await asyncio.to_thread(ensure_leg_dir, leg.parent, leg.name)
                    response = await self._call(op, provider, request)
            finally:
                self._inflight.pop(op.node_id, None)
                if call.timer is not None:
                    call.timer.cancel()
                if self.live is not None and self.live.end(op.key):
                    # Published with the outcome: a follower waits for the end mark of a
                    # call that streamed, whatever the order of the two (decision 235).
                    op.extra["streamed"] = True
            if response is None:
                # Cancelled by close_admission, or never started (the fence): the node
                # stays pending (it reruns on resume); keep a note of what a cancelled
                # worker had already produced.
                op.status = "pending"
                # walked in a thread: a worker's tree can be large, and the loop is shared
                op.artifacts = await asyncio.to_thread(_files_under, request.artifact_dir)
                op.cancelled = call.scope.cancelled_by or op.cancelled  # a held loop's
                self._withhold(op)
                return op.status
        except ProviderError as exc:  # UnsafePathError included: the node fails, not the run
            op.status, op.error = "failed", str(exc)
            return op.status
        # a provider bug fails its node, never the whole flow; nor does its sys.exit()
        except (Exception, SystemExit) as exc:
            op.status, op.error = "failed", f"{type(exc).__name__}: {exc}"
            return op.status
        if response.placement is not None:
            op.extra["placement"] = response.placement  # shown with the node, not recorded
        # Paid for whatever follows: a node that fails its artifact check still cost this.
        op.usage = (
            self.meter.charge(op.model, response.usage, op.node_id)
            if self.meter and not op.extra.pop(CHARGED, False)
            else response.usage
        )
        if op.declared_artifacts:
            # A node is worth what it produced: its declared files must be there, as
            # non-empty regular files, before it counts as completed (Amendment 1).
            check = await check_leg(request.artifact_dir, op.declared_artifacts)
            if not check.ok:
                op.status, op.error = "failed", check.error()
                return op.status
            op.artifact_records = list(check.records)
        op.response = response.text
        op.output = response.output if op.output_schema is not None else None
        op.artifacts = response.artifacts
        # Its instruction turn is read back from ``op.rendered_instruction``, which is
        # exactly ``request.instruction`` (decision 65).
        op.branch = CallBranch(history, op, response.text)
        op.spawn_requests = list(response.spawns)
        op.status = "completed"
        return op.status

    async def _call(
        self, op: Operation, provider: Provider, request: ProviderRequest
    ) -> ProviderResponse | None:
        """The provider call; its operation's messages count as delivered once it runs.

        ``None`` when the fence could not confirm the run's lease: the call never started.
        """
        fence = self.fence
        # The last check before the call, after every await on the way here: once the
        # lease's local deadline has passed (a stall included) it asks the state DB.
        if fence is not None and not fence.fresh() and not await fence.hold():
            return None
        approved: tuple[dict[str, Any], ...] = ()
        if op.approval:
            decided = await self._approve_op(op)
            if decided is None:
                return None
            approved = decided
        if op.tools:
            # One limit for the whole loop: its steps and tool calls (decision 279).
            return await limited(op, lambda: self._run_tools(op, provider, request, approved))
        if op.output_schema is not None:  # validated, asked again when it does not fit
            return await ask_structured(
                self, op, request, lambda again: self._tries(op, provider, again)
            )
        return await self._tries(op, provider, request)

    async def _tries(
        self, op: Operation, provider: Provider, request: ProviderRequest
    ) -> ProviderResponse | None:
        """``op``'s call with its retries (decision 278): each try is its own intent."""
        return await NodeTries(self, op).run(lambda: self._send(op, provider, request))

    async def _send(
        self, op: Operation, provider: Provider, request: ProviderRequest
    ) -> ProviderResponse | None:
        """One call: its write-ahead intent, then the provider; None if it must not leave."""
        fence = self.fence
        if fence is not None and not fence.fresh() and not await fence.hold():
            return None  # a re-ask's or a retry's own check (the first call's was just made)
        if self.before_call is not None:
            # Write-ahead: the call is durable as "may have been paid" before it leaves,
            # so a crash can neither hide it nor let a resume break the cap (decision 217).
            count = self._calls[op.key] = self._calls.get(op.key, 0) + 1
            attempt = self.prior_calls.get(op.key, 0) + count
            meter = self.meter
            reservation = meter.reservation() if meter is not None else (None, None)
            if not await self.before_call(op, CallIntent.of(op, attempt, reservation)):
                return None
        self.context.mark_delivered(self._claims.pop(op.node_id, []))
        return checked_response(provider, await limited(op, lambda: provider.invoke(request)))

    def inflight_call(self, op: Operation) -> _Call | None:
        """``op``'s call in flight (its cancel scope), if one is."""
        return self._inflight.get(op.node_id)

    async def _approve_op(self, op: Operation) -> tuple[dict[str, Any], ...] | None:
        """Wait for an op's approval (``approval: required``); None if admission closed."""
        from steerflow.executor._steps import NodeSteps
        from steerflow.tools._loop import LoopHeld

        record, key = ("op", op.key) if op.kind == "planned" else ("spawn", op.node_id)
        prior = self.prior_steps.get((record, key), ())
        try:
            return await NodeSteps(self, op).approve_instruction(prior, record, key)
        except LoopHeld as held:
            op.cancelled = op.cancelled or held.reason
            return None

    def _needs_approval(self, op: Operation) -> Callable[[str], bool]:
        """Whether a call of tool NAME waits for the operator: ``tool_options`` first."""
        runtime = self.tool_runtime
        options = runtime.options if runtime is not None else {}

        def needs(name: str) -> bool:
            said = options.get(name)
            if said is not None and said.approval is not None:
                return said.approval == "required"
            return any(fnmatch.fnmatchcase(name, pattern) for pattern in op.approve)

        return needs

    async def _run_tools(
        self,
        op: Operation,
        provider: Provider,
        request: ProviderRequest,
        approved: tuple[dict[str, Any], ...] = (),
    ) -> ProviderResponse | None:
        """A tool node's loop, step by step (issue 39); None if it stopped between steps."""
        from steerflow.executor._steps import NodeSteps
        from steerflow.tools._loop import DEFAULT_MAX_STEPS, LoopHeld, ToolLoop

        if self.tool_runtime is None:
            raise ProviderError(f"node {op.key!r} has tools, and this run has no tool runtime")
        # The node's own messages went into its first instruction; later ones reach the
        # loop's next model request.
        self.context.mark_delivered(self._claims.pop(op.node_id, []))
        toolset = await self.tool_runtime.toolset(op.tools)
        planned = op.kind == "planned"
        record, key = ("op", op.key) if planned else ("spawn", op.node_id)
        loop = ToolLoop(
            provider,
            toolset,
            NodeSteps(self, op),
            node=op.key,
            record=record,
            key=key,
            max_steps=op.max_steps or DEFAULT_MAX_STEPS,
            # The op's own approval, when just decided, holds index 1 before the loop.
            prior=self.prior_steps.get((record, key), ()) or approved,
            decisions=self.tool_decisions,
            needs_approval=self._needs_approval(op),
        )
        try:
            response = await loop.run(request)
        except LoopHeld as held:
            op.cancelled = op.cancelled or held.reason
            return None
        finally:
            # Paid as it ran, failed or not: the outcome records what its steps cost.
            op.usage = loop.total
        op.extra[CHARGED] = True  # its usage is already charged, step by step
        return response

    def emit_paused(self, op: Operation) -> None:
        """Say that ``op`` waits at the pause gate (its loop's next step, too)."""
        self._emit("node_paused", op)

    def emit_approval(self, op: Operation, kind: str, data: Mapping[str, Any]) -> None:
        """Say that ``op`` waits for an approval, or got its decision (issue 41)."""
        out = {k: data.get(k) for k in ("request_id", "tool", "args", "text", "requested_at")}
        if kind == "approval_decided":
            out.update({k: data.get(k) for k in ("verdict", "control_id", "sender", "reason")})
            self._emit("approval_decided", op, data=out)
        else:
            self._emit("approval_requested", op, data=out)

    def emit_step(self, op: Operation, entry: dict[str, Any]) -> None:
        """Say that one step of ``op``'s tool loop is on record (a model reply, a tool call)."""
        said = step_event(entry)  # None for an approval: said by emit_approval
        if said is not None:
            self._emit(said[0], op, data=said[1])

    def _release_claim(self, op: Operation, base: str) -> None:
        """Messages claimed by an operation whose provider call never ran go back to the queue."""
        unsent = self._claims.pop(op.node_id, [])
        if unsent:
            self.context.release(unsent)
            op.extra.pop("steers", None)
            op.rendered_instruction = base

    def _history(self, op: Operation) -> list[Message]:
        if op.branch:  # a spawned node starts from its emitter's cloned branch
            return list(op.branch)
        system = self._system_prompt(op)
        history = [Message("system", system)] if system else []
        inputs = _inputs(op, self.graph)
        if inputs.inherit_context and inputs.edges:
            source = self.graph.ops[inputs.edges[0].source]
            history = list(source.branch) or history
        return history

    def _render_dependencies(self, op: Operation) -> str:
        return _render_dependencies(op, self.graph)

    # -- reactive expansion ----------------------------------------------------------------

    def _spawn_children(self, emitter: Operation) -> list[Operation]:
        requests, emitter.spawn_requests = emitter.spawn_requests, []
        if not requests:
            return []
        # The synthesis runs last: nothing it asked for could still reach it.
        if not self.reactive.allows(emitter.assignee) or emitter is self.graph.synthesis:
            self._emit("spawn_rejected", emitter, data={"reason": "reactive_disabled"})
            return []
        accepted = [self._try_spawn(emitter, raw) for raw in requests]
        return [child for child in accepted if child is not None]

    def _reject(self, emitter: Operation, agent_id: str | None, reason: str, detail: str) -> None:
        self.spawn_rejections.append(SpawnRejection(emitter.key, agent_id, reason, detail))
        self._emit(
            "spawn_rejected",
            emitter,
            data={"agent_id": agent_id, "reason": reason, "detail": detail},
        )

    # -- escalation (Amendment 3 item 4) ---------------------------------------------------

    async def _escalate(self, failed: Operation) -> Operation | None:
        """Splice the next attempt of ``failed``'s escalation ladder after it, or None.

        The retry is recorded (spawn observers) before ``failed``'s outcome and is
        spliced before ``failed``'s future resolves, so a dependent never sees the
        failed attempt as the end of the chain.
        """
        ladder = self._escalation(failed.assignee)
        step = failed.escalation + 1
        if step > len(ladder):
            return None  # the ladder is exhausted: the failure stands
        root = self.graph.ops.get(failed.escalated_from or failed.node_id, failed)
        key = f"{root.key}.esc{step}"
        if not is_agent_id(key):
            self._reject(
                failed, key[:100], "invalid_id", f"escalation id must match {AGENT_ID_PATTERN}"
            )
            return None
        if key in self.graph.by_key:
            self._reject(failed, key, "duplicate", "a node with this id exists")
            return None
        if self.spawned_count >= self.max_spawn:
            self._reject(
                failed, key, "max_spawn_exceeded", f"spawn budget of {self.max_spawn} used up"
            )
            return None
        if not self.admission_open:
            self._reject(failed, key, "admission_closed", "the flow is stopping")
            return None
        retry = Operation(
            key=key,
            instruction=root.instruction,
            kind="spawned",
            assignee=root.assignee,
            edges=[Edge(source=failed.node_id, when="failed")],
            parent_id=failed.node_id,
            branch=list(root.branch) if root.kind == "spawned" else [],
            declared_artifacts=root.declared_artifacts,
            escalated_from=root.node_id,
            escalation=step,
            pinned_model=ladder[step - 1],
            output_schema=root.output_schema,
            output_reasks=root.output_reasks,
            # Each rung is the same op at another model: its retries and limit too.
            retry_attempts=root.retry_attempts,
            retry_backoff_s=root.retry_backoff_s,
            timeout_s=root.timeout_s,
            # What needs an operator's approval needs it at every rung (issue 41).
            approval=root.approval,
            approve=root.approve,
        )
        self.graph.splice_after(failed.node_id, retry)
        self._done[retry.node_id] = asyncio.get_running_loop().create_future()
        self.spawned_count += 1
        self._emit(
            "node_spawned",
            retry,
            data={"emitter": failed.key, "escalation": step, "model": retry.pinned_model},
        )
        for spawn_observer in self.spawn_observers:
            await spawn_observer([retry])
        return retry

    def _try_spawn(self, emitter: Operation, raw: object) -> Operation | None:
        if raw is None or raw == {}:
            self._reject(emitter, None, "null_child", "the spawn request was empty")
            return None
        # A spawn id becomes a directory name: one that could name a path component
        # (``..``, ``.``, a leading dot, a slash) is refused before anything else.
        if isinstance(raw, dict) and raw.get("agent_id") is not None:
            agent = raw["agent_id"]
            if not (isinstance(agent, str) and is_agent_id(agent)):
                shown = agent if isinstance(agent, str) else repr(agent)
                self._reject(
                    emitter,
                    shown[:100],
                    "invalid_id",
                    f"spawn id {shown[:100]!r} must match {AGENT_ID_PATTERN}",
                )
                return None
        try:
            spec = SpawnSpec.model_validate(raw)
        except ValidationError as exc:
            agent = raw.get("agent_id") if isinstance(raw, dict) else None
            detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            self._reject(emitter, str(agent) if agent else None, "builder_error", detail)
            return None
        if spec.agent_id in spec.depends_on:
            self._reject(emitter, spec.agent_id, "cycle", "the spawned node depends on itself")
            return None
        if spec.agent_id in self.graph.by_key:
            self._reject(emitter, spec.agent_id, "duplicate", "a node with this id exists")
            return None
        synthesis = self.graph.synthesis
        unknown = [
            d
            for d in spec.depends_on
            if d not in self.graph.by_key or (synthesis is not None and d == synthesis.key)
        ]
        if unknown:
            self._reject(emitter, spec.agent_id, "builder_error", f"unknown depends_on {unknown}")
            return None
        if self.spawned_count >= self.max_spawn:
            self._reject(
                emitter,
                spec.agent_id,
                "max_spawn_exceeded",
                f"spawn budget of {self.max_spawn} used up",
            )
            return None
        if not self.admission_open:
            self._reject(emitter, spec.agent_id, "admission_closed", "the flow is stopping")
            return None
        edges = [Edge(source=emitter.node_id)] if spec.link_to_emitter else []
        chain_end = self.graph.chain_end
        edges += [Edge(source=chain_end(self.graph.by_key[d].node_id)) for d in spec.depends_on]
        child = Operation(
            key=spec.agent_id,
            instruction=spec.instruction,
            kind="spawned",
            assignee=spec.assignee,
            edges=edges,
            parent_id=emitter.node_id,
            branch=list(emitter.branch),
            declared_artifacts=merge_declared(self._role_artifacts(spec.assignee), spec.artifacts),
        )
        self.graph.add(child)
        self.spawned_count += 1
        self._emit("node_spawned", child, data={"emitter": emitter.key})
        return child

    # -- plumbing --------------------------------------------------------------------------

    async def _notify(self, op: Operation) -> None:
        for observer in self.observers:
            await observer(op)

    def _emit(
        self, kind: EventType, op: Operation | None = None, *, data: dict[str, object] | None = None
    ) -> None:
        self.events.emit(
            FlowEvent(
                type=kind,
                node_key=op.key if op else None,
                node_id=op.node_id if op else None,
                data=data or {},
            )
        )


def _inputs(op: Operation, graph: Graph) -> Operation:
    """The operation whose dependencies ``op`` renders and inherits from.

    An escalation retry reruns its chain's first attempt with that attempt's inputs;
    its own edge (on the attempt it replaces) only orders it.
    """
    if op.escalated_from is None:
        return op
    return graph.ops.get(op.escalated_from, op)


def _render_dependencies(op: Operation, graph: Graph) -> str:
    if op is graph.synthesis:
        return _render_workers(op, graph)
    blocks = []
    for edge in _inputs(op, graph).edges:
        source = graph.ops[edge.source]
        if source.status == "completed":
            blocks.append(f"### {source.key} (completed)\n{source.response}")
        elif source.status == "failed":
            blocks.append(f"### {source.key} (failed)\n{source.error}")
    if not blocks:
        return op.instruction
    return op.instruction + "\n\n[RESULTS OF DEPENDENCIES]\n" + "\n\n".join(blocks)


def _dependency_results(op: Operation, graph: Graph) -> tuple[DependencyResult, ...]:
    """The results ``_render_dependencies`` renders into the instruction, as data."""
    if op is graph.synthesis:
        sources = list(graph.workers())
    else:
        sources = [graph.ops[edge.source] for edge in _inputs(op, graph).edges]
    results = []
    for source in sources:
        if source.status == "completed":
            text = "" if source.response is None else str(source.response)
            results.append(DependencyResult(source.key, "completed", text, source.output))
        elif source.status == "failed":
            results.append(DependencyResult(source.key, "failed", source.error or ""))
    return tuple(results)


def _render_workers(op: Operation, graph: Graph) -> str:
    """The synthesis instruction: its text, then every worker's final result.

    Same blocks as a dependency's, in graph order (planned in plan order, then spawned
    in the order they were accepted); a skipped worker has no result and is left out.
    """
    blocks = []
    for worker in graph.workers():
        if worker.status == "completed":
            blocks.append(f"### {worker.key} (completed)\n{worker.response}")
        elif worker.status == "failed":
            blocks.append(f"### {worker.key} (failed)\n{worker.error}")
    if not blocks:
        return op.instruction
    return op.instruction + "\n\n[RESULTS OF WORKERS]\n" + "\n\n".join(blocks)


def _render_later(op: Operation, base: str, graph: Graph) -> None:
    """Drop ``op``'s rendered text once its call is over when it can be rendered again.

    A rendered instruction that embeds dependency results repeats text its sources
    keep (their responses), and was most of a large run's memory (decision 65). The
    sources were terminal when it was rendered and terminal operations never change,
    so rendering again gives the same text; the steer block before it is kept as is.
    """
    rendered = op.rendered_instruction
    if rendered is None or base is op.instruction or not rendered.endswith(base):
        return
    steer = rendered[: len(rendered) - len(base)]
    op.render_later(lambda: steer + _render_dependencies(op, graph))


def _files_under(root: Path) -> list[str]:
    """Relative paths of the regular files under ``root`` (no symlinks followed).

    Empty when ``root`` was never made (directories are lazy: a node that wrote nothing
    has none) or is not a real directory: a planted symlink is not listed through.
    """
    if not root.is_dir() or root.is_symlink():
        return []
    found = []
    for base, _dirs, files in os.walk(root):
        for name in files:
            path = Path(base, name)
            if path.is_file() and not path.is_symlink():
                found.append(str(path.relative_to(root)))
    return sorted(found)
