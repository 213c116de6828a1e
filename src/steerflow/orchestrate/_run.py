"""One flow run, start to finish: plan, session, executor, checkpoint, live control, result."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from steerflow import _faults
from steerflow._live import LiveWriter
from steerflow.artifacts import ContractError
from steerflow.checkpoint import CheckpointWriter
from steerflow.control import ControlPoller
from steerflow.control._queue import UNENFORCEABLE_KEY
from steerflow.errors import (
    DatabaseBusyError,
    ExitCode,
    FlowResumeError,
    LeaseLostError,
    PlanValidationError,
    ProviderError,
    StateDBLostError,
    SteerflowError,
    UsageError,
)
from steerflow.executor import (
    BUDGET_REASON,
    FLAG_NAMES,
    PARAMETER_NAMES,
    CallScope,
    CapNames,
    EventBus,
    FlowEvent,
    FlowExecutor,
    Graph,
    LoopRunner,
    Meter,
    Operation,
    SharedContext,
    Steering,
    build_graph,
    enforceable,
    unenforceable,
)
from steerflow.home import RunDir, allocate_run_dir
from steerflow.orchestrate._claim import RUN_ID_KEY, create_session, lineage, run_name
from steerflow.orchestrate._consent import (
    check_agent_worker_consent,
    check_loop_consent,
    check_python_consent,
    check_tool_consent,
)
from steerflow.orchestrate._contract import ContractKeeper, resolve_contract, role_artifacts
from steerflow.orchestrate._graphview import graph_text, mermaid
from steerflow.orchestrate._kept import ResponseKeeper
from steerflow.orchestrate._lease import LeaseKeeper, LeaseLoss, loss_error
from steerflow.orchestrate._options import (
    EndStatus,
    FlowOptions,
    FlowResult,
    ResumeSeed,
    exit_code_for,
    node_summaries,
    usage_total,
)
from steerflow.orchestrate._outcome import node_outcomes
from steerflow.orchestrate._plan_codec import plan_to_checkpoint
from steerflow.orchestrate._publish import NodePublisher
from steerflow.orchestrate._recorder import (
    CheckpointOutcome,
    CheckpointRecorder,
    replay_entries,
    write_private,
)
from steerflow.orchestrate._resume import (
    EDITED_KEY,
    IN_FLIGHT_KEY,
    PLANNER_CALL_KEY,
    SPENT_KEY,
    apply_replay,
    rerun_from_json,
    rerun_report,
    spent_before,
)
from steerflow.orchestrate._settings import RunSettings
from steerflow.orchestrate._stranded import redeliver_stranded
from steerflow.orchestrate._tracing import close_trace, open_trace
from steerflow.orchestrate._tries import TRIES_KEY, chain_tries, tries_member
from steerflow.plan import (
    CODE_SOURCE,
    SYNTHESIS_KEY,
    PlanFile,
    find_playbook,
    load_plan_file,
    parse_plan,
)
from steerflow.providers import PlanRequest, ProviderCache, Usage
from steerflow.providers._plugins import planning_failure
from steerflow.providers._pricing import PriceTable
from steerflow.state import SessionRow, StateDB, connect_timeout_s

if TYPE_CHECKING:
    from steerflow.cluster import RayCluster
    from steerflow.orchestrate._stream import EventStream
    from steerflow.tools import ToolRuntime
    from steerflow.tracing._run import RunTracer

__all__ = ["FlowRun", "run_flow"]

#: The planner's request in a trace (it belongs to no node).
PLANNER = "planner"
#: ``admission_reason`` once an outcome could not be persisted (decision 35).
CHECKPOINT_LOST = "checkpoint-failed"
#: The canceller a ``ctl stop`` records on admission and on the calls it cancels.
STOP_REASON = "stop"
#: Bound on waiting for the poller to take re-queued messages before the first operation.
_CATCH_UP_S = 10.0
_FINISH_RETRY_S = 0.25  # the end-of-run writes, while a PostgreSQL server is away
_FINISH_RETRY_MAX_S = 2.0


@dataclass(frozen=True)
class _Session:
    """What the steps of a run share once its session row exists."""

    db: StateDB
    session_id: str
    run_dir: RunDir
    tasks: asyncio.TaskGroup  # the run's services: poller, heartbeat, publisher
    poller: ControlPoller
    lease: LeaseKeeper  # the heartbeat: the session's lease, renewed and checked


class FlowRun:
    """A single run; :meth:`run` never raises for run outcomes, only for refusals before start.

    The run is a pipeline of steps, each with one concern: plan, build the graph, open
    the checkpoint, execute, conclude (see :meth:`_plan_and_execute`).
    """

    def __init__(self, options: FlowOptions, *, home: Path, events: EventBus | None = None) -> None:
        options.check()  # again: a field may have been set after the options were built
        self.options = options
        self.home = home
        #: The executor's event bus (what the CLI's progress subscribes to).
        self.bus = events or EventBus()
        #: Readers opened with :meth:`events`; closed when :meth:`run` returns or raises.
        self._streams: list[EventStream] = []
        self._begun = False
        self.bus.subscribe(self._to_streams)
        seed = options.resume
        # The steering state exists before the plan, so controls sent while planning count.
        self.steering = Steering(SharedContext(dict(seed.flow_context) if seed else {}))
        self.gate = self.steering.gate
        self.context = self.steering.context
        # The source run's leftover messages were stamped (or left applying) by that run.
        self.context.drop_unrendered("source-run-ended")
        self.executor: FlowExecutor | None = None
        #: The flow's loops (issue 40 item 4); None when its plan has none.
        self.loops: LoopRunner | None = None
        self.stop_signal: int | None = None
        self.deadline_hit = False
        #: ``ctl stop``: ``{"control_id", "reason", "now"}`` of the first stop applied.
        self.stopped_by: dict[str, Any] | None = None
        self.steering.on_stop = self.request_operator_stop
        self.steering.on_applied.append(self._control_applied)
        self.steering.on_budget = self.change_budget
        self.warnings: list[str] = list(seed.notes) if seed else []
        self._providers = ProviderCache()
        #: The run's tools (toolsets, MCP sessions), built when some node has tools.
        self.tool_runtime: ToolRuntime | None = None
        self._planning: CallScope | None = None  # the planner call, while it runs
        self._connecting: CallScope | None = None  # joining the Ray cluster, while it runs
        #: What the planner calls cost: paid work of this run, counted in its usage.
        self.planner_usage: list[Usage] = []
        #: Why the run has no plan, once planning ended without one (decision 101).
        self._no_plan: str | None = None
        #: Set once the run's lease was taken over or its state DB lost (decision 121).
        self.lease_loss: LeaseLoss | None = None
        self._lease: LeaseKeeper | None = None
        #: The run's spend and caps (built once the settings are known).
        self.meter = Meter()
        #: Set once the budget left no room for the planner's retry.
        self.budget_hit = False
        #: Cap -> why this run's models cannot enforce it (``ctl budget`` is refused then).
        self._unenforceable: dict[str, str] = {}
        #: The run's OpenTelemetry spans (issue 45), while it runs with tracing on.
        self._trace: RunTracer | None = None
        #: The run's session and run id, once its session row exists (for the ctl writers).
        self.session_id: str | None = None
        self.run_id: str | None = None

    # -- typed events --------------------------------------------------------------------

    def events(self, *, max_pending: int | None = None) -> EventStream:
        """The run's typed events from now on, as an async iterator that ends with the run.

        Open it before awaiting :meth:`run`: its events are what the run emits from then
        on. The run never waits for the reader: with ``max_pending`` None nothing is
        dropped; with a number the oldest events make room and one ``EventsDropped``
        marks the gap (decision 160).

        Raises:
            UsageError: :meth:`run` has already begun (or ended): the events before now
                are gone, so a stream opened now would silently miss them.
        """
        from steerflow.orchestrate._stream import EventStream

        if self._begun:
            raise UsageError(
                "FlowRun.events() was called after run() began: open the stream first "
                "(stream = run.events(); then await run.run()), so it sees every event"
            )
        stream = EventStream(max_pending=max_pending)
        self._streams.append(stream)
        return stream

    def _to_streams(self, event: FlowEvent) -> None:
        self._streams = [s for s in self._streams if not s.closed]
        if not self._streams:
            return  # no reader: no conversion
        # Imported with the first reader: ~20 frozen dataclasses cost ~16 ms a process,
        # and most runs (every CLI flow) have no reader.
        from steerflow.orchestrate._stream import typed_event

        error, completed = None, None
        op = self.executor.graph.ops.get(event.node_id or "") if self.executor else None
        if event.type == "node_failed":
            error = op.error if op is not None else None
        elif event.type == "node_completed" and op is not None:
            usage = op.usage.to_json() if op.usage is not None else None
            completed = {"response": op.response, "output": op.output, "usage": usage}
        typed = typed_event(event, error=error, completed=completed)
        for stream in self._streams:
            stream.push(typed)

    def _control_applied(self, verb: str, control_id: str | None) -> None:
        # Not on the bus: its subscribers (the CLI's progress) know message deliveries only.
        if not self._streams:
            return
        from steerflow.orchestrate._stream import ControlApplied

        applied = ControlApplied(ts=time.time(), verb=verb, control_id=control_id)
        for stream in self._streams:
            stream.push(applied)

    def _end_streams(self) -> None:
        for stream in self._streams:
            stream.close()
        self._streams = []

    # -- signals and deadlines ---------------------------------------------------------

    def request_stop(self, signum: int) -> None:
        """SIGINT/SIGTERM: admit nothing new, cancel in-flight calls, persist, exit 130/143.

        While planning, SIGTERM lets the planner call finish, so the run keeps its plan
        and can be resumed; SIGINT (interrupt now), or a second signal, cancels it
        (decision 101).
        """
        repeated = self.stop_signal is not None
        if self.stop_signal is None:
            self.stop_signal = signum
        reason = signal.Signals(signum).name
        if self.executor is not None:
            self.executor.close_admission(reason, cancel_inflight=True)
        if self._planning is not None and (repeated or signum == signal.SIGINT):
            self._planning.cancel(reason)
        if self._connecting is not None:  # nothing started yet: nothing to persist
            self._connecting.cancel(reason)

    def request_operator_stop(self, now: bool, reason: str | None, control_id: str) -> None:
        """``ctl stop``: admit nothing new; with ``now`` cancel in-flight calls; exit 75.

        A graceful stop lets a planner call finish (its plan is kept); ``--now`` cancels it.
        """
        if self.stopped_by is None:
            self.stopped_by = {"control_id": control_id, "reason": reason, "now": now}
        elif now:
            self.stopped_by["now"] = True  # a later --now escalates a graceful stop
        if self.executor is not None:
            self.executor.close_admission(STOP_REASON, cancel_inflight=now)
        if self._planning is not None and now:
            self._planning.cancel(STOP_REASON)

    def change_budget(self, max_cost: float | None, max_tokens: int | None) -> str:
        """``ctl budget``: new caps for the chain; below the spend, admission closes now.

        Nothing reopens a closed admission: once the budget closed it, a higher cap is
        for a resume (``rejected:admission-closed``).
        """
        executor = self.executor
        if self._admission_closed() or (executor is not None and not executor.admission_open):
            return "rejected:admission-closed"
        given = {"max_cost": max_cost, "max_tokens": max_tokens}
        for name, why in self._unenforceable.items():
            if given[name] is not None:
                return f"rejected:unenforceable:{why}"[:500]
        self.meter.recap(max_cost, max_tokens)
        if self.meter.reached():
            if executor is not None:
                executor.close_admission(BUDGET_REASON)
            else:
                self.budget_hit = True
        return "applied"

    def _lease_lost(self, loss: LeaseLoss) -> None:
        """Admit nothing more; after a takeover also cancel what is in flight (decision 121)."""
        self.lease_loss = loss
        if self.executor is not None:
            self.executor.close_admission(loss.reason, cancel_inflight=loss.taken_over)
        if self._planning is not None:
            self._planning.cancel(loss.reason)

    async def _lease_held(self) -> bool:
        """The planner call's admission check (the executor has its own: ``fence``)."""
        lease = self._lease
        return lease is None or lease.fresh() or await lease.hold()

    def _deadline(self) -> None:
        # A planner call already made is paid for: it finishes, and its plan is kept.
        self.deadline_hit = True
        if self.executor is not None:
            self.executor.close_admission("deadline", cancel_long_running=True)

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> FlowResult:
        """Plan (unless given), run, persist; return the result."""
        self._begun = True
        seed = self.options.resume
        self._trace = await open_trace(
            self.options.otel,
            home=self.home,
            kind=self.options.kind if seed is None else "resume",
            resumed_from=seed.resumed_from if seed is not None else None,
            source_run_id=seed.source_run_id if seed is not None else None,
        )
        if self._trace is not None:
            self.bus.subscribe(self._trace.on_event)
        result: FlowResult | None = None
        failure: BaseException | None = None
        try:
            result = await self._run()
            return result
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self._end_streams()
            if self._trace is not None:
                await close_trace(
                    self._trace,
                    status=result.status if result is not None else "error",
                    exit_code=int(result.exit_code) if result is not None else None,
                    usage=result.usage if result is not None else None,
                    error=failure,
                )

    async def _run(self) -> FlowResult:
        opts = self.options
        # plan files and playbooks are read from disk: off the loop
        plan, prompt, source = await asyncio.to_thread(self._static_plan)
        settings = self._settings(plan)
        if plan is not None and opts.resume is None:
            check_agent_worker_consent(
                plan,
                source,
                model=settings.model,
                given_model=opts.model,
                allowed=opts.allow_agent_workers,
            )
            check_python_consent(
                plan,
                source,
                model=settings.model,
                given_model=opts.model,
                allowed=opts.allow_python,
            )
            check_tool_consent(
                plan, source, allow_python=opts.allow_python, allow_mcp=opts.allow_mcp
            )
            check_loop_consent(plan, source, allowed=opts.allow_python)
        cluster = await self._join_cluster(settings)
        try:
            return await self._run_checked(plan, prompt, source, settings)
        finally:
            if cluster is not None:
                await asyncio.to_thread(cluster.close)

    async def _join_cluster(self, settings: RunSettings) -> RayCluster | None:
        """``--executor ray``: join the cluster and route node calls to it; None when local.

        Before any provider exists, so a refused cluster or placement is refused before
        anything is allocated or paid for; bounded, and ended at once by a signal, with
        nothing started (decision 243).
        """
        opts = self.options
        if opts.executor == "local" or opts.dry_run:
            return None
        from steerflow.cluster import connect_stopped, join_ray

        joined: RayCluster | None = None
        self._connecting = scope = CallScope()
        try:
            with scope:
                joined = await join_ray(opts.ray_address)
        finally:
            self._connecting = None
        if joined is None:  # the scope caught a signal's cancellation
            raise connect_stopped(scope.cancelled_by or "SIGINT", opts.ray_address)
        cluster = joined
        try:
            roles = settings.role_resources
            asked: dict[str | None, Mapping[str, float] | None] = {None: None}
            asked.update(roles)
            await asyncio.to_thread(cluster.check_roles, asked)
        except BaseException:
            cluster.close()
            raise
        self._providers = ProviderCache(wrap=cluster.wrap(lambda role: roles.get(role or "")))
        return cluster

    async def _run_checked(
        self, plan: PlanFile | None, prompt: str, source: str, settings: RunSettings
    ) -> FlowResult:
        opts = self.options
        models = {settings.model, *settings.role_models.values(), *settings.escalation_models}
        models.add(settings.synthesis_model)
        # Each entry's own model (issue 40): refused, priced and metered as a role's.
        models.update(entry.model for entry in (plan.plan if plan else ()) if entry.model)
        for spec in models:
            # refuses a bad model spec before anything starts; in a thread, because
            # building a provider may read a file (script:PATH)
            await asyncio.to_thread(self._providers.get, spec)
        # Also off the loop: the price table's first look-up imports it (half a second).
        self.meter = await asyncio.to_thread(self._meter, settings, models)
        if opts.dry_run and plan is not None:
            return self._dry_result(plan, settings)
        db = await asyncio.to_thread(StateDB.open, self.home)
        try:
            return await self._run_with_db(db, plan, prompt, source, settings)
        finally:
            await self._providers.aclose()
            await asyncio.to_thread(db.close)

    @property
    def _cap_names(self) -> CapNames:
        """How a budget refusal spells the caps: the flags typed, or the parameters."""
        return FLAG_NAMES if self.options.names_flags else PARAMETER_NAMES

    def _meter(self, settings: RunSettings, models: set[str]) -> Meter:
        """The run's meter; a cap that cannot be enforced is refused (exit 2) here."""
        prices = PriceTable(settings.prices)
        caps = settings.caps
        providers = {spec: self._providers.get(spec) for spec in models}
        enforceable(caps, prices, providers, self._cap_names)
        prices.prepare(models)  # the table's import, here in a thread, not on the loop
        # What a later ``ctl budget`` could not enforce either (checked here, off the loop);
        # recorded in the session row, so the ``ctl`` writers refuse it (decision 246).
        self._unenforceable = unenforceable(prices, providers)
        seed = self.options.resume
        meter = Meter(
            prices,
            caps,
            base=seed.spent if seed is not None else None,
            doubt=seed.doubt if seed is not None else None,
        )
        if seed is not None:
            # The chain's recorded calls size the reservation from the first admission on.
            for recorded in seed.replay.usage.values():
                meter.observe(Usage.from_json(recorded))
        if seed is not None and caps.any and not meter.room():
            # Said before anything runs; the first admission then closes (exit 76).
            self.warnings.append(
                f"the resume chain has already reached its budget ({meter.exhausted_line()}): "
                f"nothing will be admitted; give a higher {self._cap_names.caps}"
            )
        return meter

    def _static_plan(self) -> tuple[PlanFile | None, str, str]:
        opts = self.options
        if opts.resume is not None:
            return opts.resume.plan, opts.resume.prompt, "checkpoint"
        if opts.plan is not None:
            # The entry limit of a run applies as to a file; the rest was checked when
            # the Plan was built.
            plan = parse_plan(
                opts.plan.to_data(), source=CODE_SOURCE, max_entries=opts.max_plan_entries
            )
            return plan, opts.prompt or "", CODE_SOURCE
        if opts.plan_path is not None:
            plan = load_plan_file(opts.plan_path, max_entries=opts.max_plan_entries)
            return plan, opts.prompt or "", str(opts.plan_path)
        if opts.playbook is not None:
            plan, where = find_playbook(
                opts.playbook, home=self.home, max_entries=opts.max_plan_entries
            )
            return plan, opts.prompt or "", where
        if not opts.prompt:
            raise UsageError("give a PROMPT, --plan FILE or --playbook NAME")
        return None, opts.prompt, "planner"

    def _settings(self, plan: PlanFile | None) -> RunSettings:
        # A resume runs with the settings its source recorded, not today's options,
        # except for the compaction limits it was explicitly given.
        opts = self.options
        if opts.checkpoint_version == 2:
            # Version 2 rewrites one file per outcome: it has nothing to compact
            # (docs/decisions.md: "Compaction limits").
            if opts.compact_records is not None or opts.compact_bytes is not None:
                raise UsageError(
                    "--compact-records/--compact-bytes apply to version 3 checkpoints only: "
                    "drop them or --checkpoint-version 2"
                )
            if plan is not None and (plan.compact_records or plan.compact_bytes):
                self.warnings.append(
                    "the plan's compact_records/compact_bytes are ignored: version 2 "
                    "checkpoints are not compacted"
                )
        if opts.resume is not None:
            settings = RunSettings.from_checkpoint_config(opts.resume.config)
            settings = replace(settings, resumed_from=lineage(opts.resume))
            settings = settings.with_budget(opts.max_cost, opts.max_tokens, opts.price_overrides)
            settings = settings.with_approval_timeout(opts.approval_timeout_s)
            return settings.with_compaction(opts.compact_records, opts.compact_bytes)
        return RunSettings.from_options(opts, plan)

    def _graph_of(self, plan: PlanFile, settings: RunSettings) -> Graph:
        """The plan's graph, its synthesis node (if requested), a resume's replay applied."""
        graph = build_graph(plan)
        if settings.synthesis is not None:
            graph.add_synthesis(
                Operation(key=SYNTHESIS_KEY, instruction=str(settings.synthesis["instruction"])),
                when_all_failed=settings.synthesis.get("when_all_failed") == "run",
            )
        if self.options.resume is not None:
            apply_replay(self.options.resume.replay, graph)
        if plan.loops:
            self.loops = LoopRunner(graph, plan.loops)
            if self.options.resume is not None:
                self.loops.restore(self.options.resume.loop_records)
        return graph

    def _dry_result(self, plan: PlanFile, settings: RunSettings) -> FlowResult:
        graph = self._graph_of(plan, settings)
        return FlowResult(
            session_id=None,
            run_id=None,
            status="planned",
            exit_code=ExitCode.OK,
            checkpoint={"path": None, "version": None, "persisted": False, "error": None},
            checkpoint_recovery=self.options.resume.checkpoint_recovery
            if self.options.resume
            else None,
            nodes=node_summaries(graph),
            warnings=self.warnings,
            graph_text=graph_text(graph),
            degraded_context=self.options.resume.degraded if self.options.resume else [],
            rerun_unsettled=rerun_report(self.options.resume.replay) if self.options.resume else [],
            rerun_from=rerun_from_json(self.options.resume),
            stranded_messages=_stranded_json(self.options.resume),
            in_flight_calls=_in_flight_json(self.options.resume),
            outcomes=node_outcomes(graph),
            output_classes=self._output_classes(),
        )

    def _admission_closed(self) -> bool:
        """True once a signal, a deadline, a ``ctl stop`` or a lost lease ended admission."""
        closed = self.stop_signal is not None or self.deadline_hit or self.stopped_by is not None
        return closed or self.lease_loss is not None

    async def _plan_with_model(
        self,
        prompt: str,
        model: str,
        before_call: Callable[[int], Awaitable[None]] | None = None,
    ) -> PlanFile | None:
        """The planner's plan; None if admission closed before a retry could be made.

        ``before_call(attempt)`` runs right before each planner call leaves (its intent).
        """
        provider = self._providers.get(model)
        schema = PlanFile.model_json_schema()
        feedback: str | None = None
        for attempt in range(2):
            # A retry is a new assignment: none after a deadline or stop, even when the
            # provider swallowed the cancellation and answered anyway.
            if attempt and self._admission_closed():
                self._no_plan = (
                    f"the planner's reply was not a valid plan ({feedback}), and no retry "
                    "is asked for once the run is stopping"
                )
                return None
            if attempt and not self.meter.room():
                self._no_plan = (
                    f"the planner's reply was not a valid plan ({feedback}), and the budget "
                    "leaves no room for a retry"
                )
                self.budget_hit = True
                return None
            if not await self._lease_held():
                return None
            if before_call is not None:
                await before_call(attempt + 1)
            try:
                reply = await provider.plan_with_usage(
                    PlanRequest(
                        prompt=prompt,
                        schema=schema,
                        max_entries=self.options.max_plan_entries,
                        feedback=feedback,
                    )
                )
                priced = self.meter.charge(model, reply.usage)
                if priced is not None:
                    self.planner_usage.append(priced)
                raw = reply.data
            except ProviderError as exc:
                if exc.retryable:
                    raise  # transport failures were already retried by the provider
                feedback = f"your reply could not be read as a plan: {exc}"
                continue
            except SteerflowError:
                raise  # said as the provider meant it (a function's "cannot plan": exit 2)
            except (Exception, SystemExit) as exc:
                # A bug in a plugin's plan(), not a bad reply to retry: the run fails in
                # one line naming the plugin (decision 240).
                raise planning_failure(provider, exc) from None
            try:
                # Over the limit is an invalid reply like any other: one retry, then refuse.
                planned = parse_plan(
                    raw, source=f"plan from {model}", max_entries=self.options.max_plan_entries
                )
            except PlanValidationError as exc:
                feedback = str(exc)
                continue
            chosen = [entry.agent_id for entry in planned.plan if entry.model is not None]
            if not chosen:
                return planned
            # A model must not pick the code that runs a node (an agent worker, a
            # python: function): that is the operator's consent to give (decision 277).
            feedback = (
                f"plan from {model}: a generated plan cannot choose a node's model "
                f"({', '.join(chosen)}): leave model out"
            )
        raise ProviderError(f"the planner returned an invalid plan twice; last error: {feedback}")

    async def _run_with_db(
        self,
        db: StateDB,
        plan: PlanFile | None,
        prompt: str,
        source: str,
        settings: RunSettings,
    ) -> FlowResult:
        """Open the session, then run the pipeline inside the run's one task group.

        The group owns the control poller, the heartbeat and (once there is a graph)
        the node publisher; each ends on its own stop signal when the pipeline returns.
        """
        # A resume writes its legs under the source run's artifact root (Amendment 1 row 9).
        seed = self.options.resume
        root = seed.artifact_root if seed is not None and seed.artifact_root else settings.save
        run_dir = await asyncio.to_thread(allocate_run_dir, self.home, save=root)
        plan_name = plan.name if plan is not None and plan.name else settings.plan_name
        name = run_name(plan_name, settings.playbook, prompt)
        row = await self._open_session(db, run_dir, prompt, source, settings, name)
        session_id = self.session_id = row.id
        self.run_id = run_dir.run_id
        lease = self._lease = LeaseKeeper(db, session_id, row.lease_epoch)
        lease.on_lost.append(self._lease_lost)
        poller = ControlPoller(self.home, session_id, self.steering)
        if self._trace is not None:
            trace = self._trace
            await asyncio.to_thread(
                lambda: trace.session(
                    run_id=run_dir.run_id, session_id=session_id, name=name, run_dir=run_dir.path
                )
            )
            poller.on_stamped.append(trace.on_control)
        self.context.on_delivered.append(
            lambda messages: poller.messages_delivered([m.get("control_id") for m in messages])
        )
        self.context.on_delivered.append(self._announce_steers)
        await self._open_desk(db, poller)
        stop_heartbeat = asyncio.Event()
        result: FlowResult | None = None
        error: Exception | None = None
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(poller.run(), name="control-poller")
            tasks.create_task(lease.run(stop_heartbeat), name="heartbeat")
            try:
                session = _Session(db, session_id, run_dir, tasks, poller, lease)
                result = await self._under_deadline(session, plan, prompt, settings)
            except Exception as exc:  # re-raised below as itself, not inside an ExceptionGroup
                error = exc
            finally:
                self.steering.finish()
                await poller.stop()
                stop_heartbeat.set()
        if error is not None:
            raise error
        assert result is not None
        if self.lease_loss is not None:
            graph = self.executor.graph if self.executor is not None else Graph()
            raise loss_error(
                self.lease_loss,
                run_id=run_dir.run_id,
                session_id=session_id,
                cancelled=sum(1 for op in graph if op.cancelled == self.lease_loss.reason),
                withheld=lease.withheld,
                completed=sum(1 for op in graph if op.status == "completed"),
                checkpoint=str(run_dir.checkpoint_path),
            )
        return result

    async def _open_desk(self, db: StateDB, poller: ControlPoller) -> None:
        """Wire the approval desk to the session; a resume's requests and chain decisions."""
        from steerflow.orchestrate._approvals import (
            adopt_chain_decisions,
            know_requests,
            publisher,
        )

        desk = self.steering.approvals
        desk.on_journaled.append(poller.decision_journaled)
        desk.publish = publisher(db, poller.session_id)
        seed = self.options.resume
        if seed is not None:
            know_requests(desk, seed.steps)
            if desk.pending:
                await desk.sync()
                await adopt_chain_decisions(db, desk, seed.resumed_from)

    def _announce_steers(self, messages: list[dict[str, Any]]) -> None:
        """One event per call that carried operator messages, so progress shows each delivery."""
        per_node: dict[str, int] = {}
        for message in messages:
            key = str(message.get("rendered_into_op"))
            per_node[key] = per_node.get(key, 0) + 1
        for key, count in per_node.items():
            self.bus.emit(
                FlowEvent(
                    type="control_applied",
                    node_key=key,
                    data={"verb": "message", "messages": count},
                )
            )

    async def _open_session(
        self,
        db: StateDB,
        run_dir: RunDir,
        prompt: str,
        source: str,
        settings: RunSettings,
        name: str | None,
    ) -> SessionRow:
        """Insert the session row (and its invocation and play); the row."""
        seed = self.options.resume
        metadata: dict[str, Any] = {
            "run_id": run_dir.run_id,
            "poller": "pending",
            "source": source,
            "budget": settings.caps.to_json(),
        }
        if self._unenforceable:
            metadata[UNENFORCEABLE_KEY] = dict(self._unenforceable)
        if seed is not None and seed.spent is not None:
            metadata["spent_before"] = seed.spent.to_json()  # ``ctl status``: the chain's
        if seed is not None and seed.degraded:
            metadata["degraded_context"] = seed.degraded
        session, claimed = await create_session(
            db,
            self.home,
            run_dir,
            kind=settings.kind,
            prompt=prompt,
            metadata=metadata,
            seed=seed,
            name=name,
        )
        if claimed:
            _faults.seam("resume-claim", "after")
        invocation = await asyncio.to_thread(
            lambda: db.create_invocation(session_id=session.id, kind=settings.kind)
        )
        if settings.playbook:
            playbook = settings.playbook
            await asyncio.to_thread(
                lambda: db.create_play(
                    session_id=session.id, invocation_id=invocation.id, playbook=playbook
                )
            )
        return session

    async def _under_deadline(
        self, s: _Session, plan: PlanFile | None, prompt: str, settings: RunSettings
    ) -> FlowResult:
        timeout_s = self.options.timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.call_later(timeout_s, self._deadline) if timeout_s is not None else None
        try:
            return await self._plan_and_execute(s, plan, prompt, settings)
        finally:
            if deadline is not None:
                deadline.cancel()

    async def _plan_and_execute(
        self, s: _Session, plan: PlanFile | None, prompt: str, settings: RunSettings
    ) -> FlowResult:
        """The pipeline: plan → build graph → open checkpoint → execute → result."""
        if plan is None:
            plan = await self._plan(s, prompt, settings.model)
            if plan is None:
                return await self._stopped_while_planning(s)
        graph, max_spawn = await self._prepare_graph(s.run_dir, plan, settings)
        self._open_tools(s.run_dir, graph, settings)
        keeper, settings = await self._persist_contract(s, graph, settings)
        writer = await self._open_writer(s, graph, plan, prompt, settings, max_spawn)
        publisher = self._start_publisher(s, graph)
        # Chunks of calls in flight, beside the run and never in its checkpoint (decision 190).
        live = LiveWriter(s.run_dir.path)
        try:
            recorder = CheckpointRecorder(writer, graph, s.run_dir, self.context, self.bus)
            await recorder.flush()
            await self._redeliver_stranded(s)
            executor = self._build_executor(s.run_dir, graph, settings, max_spawn, recorder)
            executor.live = live
            # Before the checkpoint's pending intent: a spawned leg's declaration is on
            # record before anything of it runs.
            executor.spawn_observers.insert(0, keeper.add_spawned)
            await self._execute(s, executor, recorder)
            checkpoint = await recorder.close()
        finally:
            await publisher.close()
            await asyncio.to_thread(live.close)
            if self.tool_runtime is not None:  # ends the MCP servers the run started
                await self.tool_runtime.aclose()
        return await self._conclude(s, graph, executor, checkpoint)

    def _open_tools(self, run_dir: RunDir, graph: Graph, settings: RunSettings) -> None:
        """The run's tool runtime, if a node has tools; a model that cannot call them is refused."""
        with_tools = [op for op in graph if op.tools]
        if not with_tools:
            return
        for op in with_tools:
            spec = op.pinned_model or settings.model_for(op.assignee)
            if not self._providers.get(spec).supports_tools:
                raise UsageError(
                    f"node {op.key!r} has tools, and its model {spec!r} cannot call tools: "
                    "give it a model that can (openai/..., anthropic/..., script:...)"
                )
        from steerflow.tools._runtime import open_runtime

        self.tool_runtime = open_runtime(
            mcp_servers=settings.mcp_servers,
            tool_options=settings.tool_options,
            stderr_dir=run_dir.path / "mcp",
        )

    async def _redeliver_stranded(self, s: _Session) -> None:
        """Re-queue the source chain's stranded messages, once this run is the one to resume.

        They are in the shared context before the first operation can be admitted, so
        the operation that starts first renders them, as it would have in the source.
        """
        seed = self.options.resume
        if seed is None:
            return
        await redeliver_stranded(s.db, seed.stranded, s.session_id, claimed=seed.redeliver_claimed)
        if any(m.redelivered_as for m in seed.stranded):
            with contextlib.suppress(TimeoutError):  # a stuck listing: the next tick takes them
                async with asyncio.timeout(_CATCH_UP_S):
                    await s.poller.catch_up()

    async def _plan(self, s: _Session, prompt: str, model: str) -> PlanFile | None:
        """The planner's plan, also when a stop came meanwhile; None if it was cancelled.

        A graceful stop, SIGTERM or the deadline lets the call finish: the plan is then
        saved (a checkpoint with no outcomes) and the run ends resumable (decision 101).
        """
        if self._admission_closed():
            self._no_plan = "the run was stopped before its planner was called"
            return None
        self._planning = scope = CallScope()

        trace = self._trace

        async def intent(attempt: int) -> None:
            await self._planner_intent(s, model, attempt)
            if trace is not None:  # the planner's request: a span under the run's
                started = time.time()
                trace.model_request(
                    PLANNER, key=PLANNER, model=model, call_id=PLANNER, attempt=attempt,
                    started_at=started, prompt=prompt,
                )  # fmt: skip

        outcome = "cancelled"
        try:
            with scope:
                plan = await self._plan_with_model(prompt, model, intent)
                outcome = "completed"
                return plan
        except SteerflowError as exc:
            outcome = "failed"
            await self._finish_session(s, "failed", {"error": str(exc)})
            raise
        finally:
            self._planning = None
            if trace is not None:
                used = self.planner_usage[-1].to_json() if self.planner_usage else None
                trace.end_request(PLANNER, outcome, usage=used)
            with contextlib.suppress(SteerflowError):  # a lost lease or DB: nothing to clear
                await self._planner_intent(s, None, 0)
        # The scope caught the cancellation of request_stop or request_operator_stop.
        how = "ctl stop --now" if scope.cancelled_by == STOP_REASON else scope.cancelled_by
        self._no_plan = f"the planner call was cancelled ({how}) before it returned a plan"
        return None

    async def _planner_intent(self, s: _Session, model: str | None, attempt: int) -> None:
        """The planner call's write-ahead intent, kept on the session (decision 219).

        The run has no checkpoint yet, so the state DB holds it: committed before the call
        leaves (``model`` given), removed once it returned (``model`` None). A run that
        died with it there has nothing to resume, and ``resume`` says the call may have
        been paid.
        """
        value: dict[str, Any] | None = None
        if model is not None:
            value = {"model": model, "attempt": attempt, "started_at": time.time()}
        epoch = s.lease.epoch
        await asyncio.to_thread(
            s.db.update_node_metadata, s.session_id, {PLANNER_CALL_KEY: value}, epoch=epoch
        )

    async def _stopped_while_planning(self, s: _Session) -> FlowResult:
        status: EndStatus
        if self.stop_signal is not None:
            status = "interrupted"
        elif self.stopped_by is not None:
            status = "stopped"  # an operator's stop outranks a deadline that came with it
        elif self.budget_hit:
            status = "budget_exhausted"
        else:
            status = "timed_out" if self.deadline_hit else "interrupted"
        why = self._no_plan or "planning ended without a plan"
        # Said plainly, and kept on the session, where ``resume`` reads it (no checkpoint).
        self.warnings.append(f"nothing to resume: {why}; no plan was saved")
        await self._finish_session(
            s,
            status,
            {
                "nothing_to_resume": why,
                "usage": usage_total(Graph(), *self.planner_usage),
                **self._budget_extra(status),
                **self._stop_extra(),
            },
        )
        checkpoint = CheckpointOutcome(
            path=str(s.run_dir.checkpoint_path), version=self.options.checkpoint_version
        )
        return self._result(s, Graph(), status, checkpoint)

    def _spawn_budget(self, plan: PlanFile, settings: RunSettings) -> int:
        seed = self.options.resume
        if seed is not None and seed.max_spawn is not None:
            return seed.max_spawn
        if settings.max_ops > 0:
            return max(0, settings.max_ops - len(plan.plan))
        return self.options.default_max_spawn

    async def _prepare_graph(
        self, run_dir: RunDir, plan: PlanFile, settings: RunSettings
    ) -> tuple[Graph, int]:
        """The graph to run (a resume's replay applied) and its spawn budget, announced."""
        opts = self.options
        max_spawn = self._spawn_budget(plan, settings)
        graph = self._graph_of(plan, settings)
        for warning in self.warnings:
            self.bus.emit(FlowEvent(type="plan_truncated", data={"message": warning}))
        self.bus.emit(
            FlowEvent(
                type="plan_ready",
                data={
                    "nodes": len(graph),
                    "max_spawn": max_spawn,
                    **({"graph": graph_text(graph)} if opts.show_graph else {}),
                },
            )
        )
        if opts.show_graph:
            await asyncio.to_thread(write_private, run_dir.path / "graph.mmd", mermaid(graph))
        return graph, max_spawn

    async def _persist_contract(
        self, s: _Session, graph: Graph, settings: RunSettings
    ) -> tuple[ContractKeeper, RunSettings]:
        """Resolve the artifact contract and store it before any operation starts.

        Returns the keeper (which adds spawned legs later) and the settings carrying the
        contract, so the checkpoint's ``config`` holds the same copy (Amendment 1 row 2).
        """
        try:
            seed = self.options.resume
            recorded = seed.replay.contract if seed is not None else None
            contract = resolve_contract(graph, settings, s.run_dir.artifact_root, recorded)
        except ContractError as exc:
            await self._finish_session(s, "failed", {"error": str(exc)})
            raise FlowResumeError(f"the source run's artifact contract: {exc}") from None
        keeper = ContractKeeper(s.db, s.session_id, contract)
        await keeper.persist()
        _faults.seam("artifact-contract", "after")
        return keeper, replace(settings, artifact_contract=contract.to_json())

    async def _open_writer(
        self,
        s: _Session,
        graph: Graph,
        plan: PlanFile,
        prompt: str,
        settings: RunSettings,
        max_spawn: int,
    ) -> CheckpointWriter:
        """The run's checkpoint writer; a resume whose replay it cannot hold is refused."""
        opts = self.options
        # A resume's first publication holds everything it replays (decision 43).
        replayed_ops, replayed_spawned = replay_entries(graph)
        kept = ResponseKeeper(graph)

        def saved(what: str, key: str) -> None:
            self.bus.emit(FlowEvent(type="checkpoint_saved", data={"what": what, "key": key}))
            kept.saved(what, key)

        try:
            writer = CheckpointWriter(
                s.run_dir.checkpoint_path,
                session_id=s.session_id,
                prompt=prompt,
                plan=plan_to_checkpoint(plan, {op.key: op.node_id for op in graph.planned}),
                config=self._config(settings, s.run_dir.run_id, graph),
                max_spawn=max_spawn,
                flow_context=self.context.content,
                version=opts.checkpoint_version,
                max_records=settings.compact_records,
                max_bytes=settings.compact_bytes,
                on_saved=saved,
                ops=replayed_ops,
                spawned=replayed_spawned,
                steps=opts.resume.steps if opts.resume is not None else None,
            )
            kept.writer = writer
            return writer
        except ValueError as exc:
            if opts.resume is None:
                raise
            # A replayed value the new checkpoint cannot hold (a legacy v2 NaN without a
            # digest): refuse before anything runs rather than replay what cannot be kept.
            await self._finish_session(s, "failed", {"error": str(exc)})
            raise FlowResumeError(
                f"a replayed entry cannot be stored in the resumed run's checkpoint: {exc}"
            ) from None

    def _config(self, settings: RunSettings, run_id: str, graph: Graph) -> dict[str, Any]:
        """The checkpoint ``config``, with the chain's spend its entries will not hold.

        Last, the run's own id: a copy of the run directory under another name is then
        told from the run (``db rebuild``, decision 247).
        """
        config = settings.to_checkpoint_config()
        before = spent_before(self.options.resume, self.planner_usage)
        if before.tokens or before.cost_usd:  # only when some: older bytes unchanged
            config[SPENT_KEY] = before.to_json()
        seed = self.options.resume
        if seed is not None and seed.doubt.calls:  # likewise only when some
            config[IN_FLIGHT_KEY] = seed.doubt.to_json()
        if seed is not None and seed.replay.edited:  # ``resume --from``: edits of the chain
            config[EDITED_KEY] = {k: dict(v) for k, v in seed.replay.edited.items()}
        if seed is not None:
            tries = tries_member(chain_tries(seed.config, seed.in_flight), graph)
            if tries:  # likewise: the calls of retrying nodes earlier runs made
                config[TRIES_KEY] = tries
        config[RUN_ID_KEY] = run_id
        return config

    def _start_publisher(self, s: _Session, graph: Graph) -> NodePublisher:
        publisher = NodePublisher(
            s.db, s.session_id, graph, epoch=s.lease.epoch, on_fenced=s.lease.fenced
        )
        self.gate.on_change.append(publisher.on_gate)
        self.bus.subscribe(publisher.on_event)
        publisher.snapshot_all()
        s.tasks.create_task(publisher.run(), name="node-publisher")
        return publisher

    def _build_executor(
        self,
        run_dir: RunDir,
        graph: Graph,
        settings: RunSettings,
        max_spawn: int,
        recorder: CheckpointRecorder,
    ) -> FlowExecutor:
        executor = FlowExecutor(
            graph,
            # An escalation retry runs at its ladder model, on a resume too.
            provider_for=lambda op: self._providers.get(
                op.pinned_model
                or (settings.synthesis_model if op is graph.synthesis else None)
                or settings.model_for(op.assignee)
            ),
            run_id=run_dir.run_id,
            home=self.home,
            artifact_dir=run_dir.leg_artifact_dir,
            system_prompt=lambda op: settings.system_for(op.assignee),
            role_artifacts=role_artifacts(settings),
            escalation=settings.escalation_for,
            concurrency=settings.concurrency,
            reactive=settings.reactive,
            max_spawn=max_spawn,
            gate=self.gate,
            context=self.context,
            events=self.bus,
        )
        executor.spawned_count = sum(1 for op in graph if op.kind == "spawned")
        executor.meter = self.meter
        executor.before_call = recorder.record_call
        if self._trace is not None:
            executor.before_call = self._trace.wrap_intent(recorder.record_call)
            self._trace.watch_graph(graph.ops.get)
        executor.on_step = recorder.record_step
        executor.tool_runtime = self.tool_runtime
        executor.approvals = self.steering.approvals
        executor.approvals.timeout_s = settings.approval_timeout_s
        seed = self.options.resume
        for call in seed.in_flight if seed is not None else ():
            executor.prior_calls[call.node] = executor.prior_calls.get(call.node, 0) + 1
        if seed is not None:
            # A retrying node counts every call of its chain, not only the source's
            # (decision 278): its attempt numbers go on from there.
            tries = chain_tries(seed.config, seed.in_flight)
            for node, made in tries_member(tries, graph).items():
                executor.prior_calls[node] = max(executor.prior_calls.get(node, 0), made)
        if seed is not None:
            for step in seed.steps:
                key = (str(step["record"]), str(step["key"]))
                executor.prior_steps[key] = (*executor.prior_steps.get(key, ()), step)
            executor.tool_decisions = dict(seed.tool_decisions)
        executor.observers.append(recorder.record_outcome)
        executor.spawn_observers.append(recorder.record_intent)
        executor.loops = self.loops
        return executor

    async def _execute(
        self, s: _Session, executor: FlowExecutor, recorder: CheckpointRecorder
    ) -> None:
        """Run the graph; a stop that came before the executor existed applies first."""
        self.executor = executor
        if self.stop_signal is not None:
            executor.close_admission(signal.Signals(self.stop_signal).name, cancel_inflight=True)
        elif self.stopped_by is not None:
            executor.close_admission(STOP_REASON, cancel_inflight=bool(self.stopped_by["now"]))
        elif self.deadline_hit:
            executor.close_admission("deadline", cancel_long_running=True)
        elif self.budget_hit:  # a ctl budget below the spend came while planning
            executor.close_admission(BUDGET_REASON)
        # Every call and every record checks the lease first (decision 121).
        executor.fence = recorder.fence = s.lease
        if self.lease_loss is not None:
            executor.close_admission(self.lease_loss.reason)
        # Nothing more can be saved: admit nothing, let the calls already paid for finish.
        recorder.on_lost = lambda: executor.close_admission(CHECKPOINT_LOST)
        if recorder.lost:
            executor.close_admission(CHECKPOINT_LOST)
        self.steering.attach(executor.has_pending)
        await s.poller.start_executing()  # the poller alone writes sessions.phase
        await executor.run()

    async def _conclude(
        self, s: _Session, graph: Graph, executor: FlowExecutor, checkpoint: CheckpointOutcome
    ) -> FlowResult:
        self.warnings += [
            f"checkpoint write failed, recovered from the durable prefix: {error}"
            for error in checkpoint.recovered
        ]
        status = self._final_status(graph, checkpoint)
        if status == "completed" and self.stopped_by is not None:
            # Nothing was lost, so nothing is owed: exit 0, not 75 (decision 104).
            self.warnings.append(
                f"ctl stop (control {self.stopped_by['control_id']}) came after every node "
                "had started: nothing was withheld, and the run completed"
            )
        extra = {
            "checkpoint": checkpoint.to_json(),
            "spawn_rejections": len(executor.spawn_rejections),
            "usage": usage_total(graph, *self.planner_usage),
            **self._budget_extra(status),
            **self._stop_extra(),
        }
        if self.loops is not None:
            extra["loops"] = self.loops.to_json()
        await self._finish_session(s, status, extra)
        return self._result(s, graph, status, checkpoint)

    def _final_status(self, graph: Graph, checkpoint: CheckpointOutcome) -> EndStatus:
        if self.stop_signal is not None:
            return "interrupted"
        # A failed attempt an escalation retry replaced is not the run's failure.
        failed = any(op.status == "failed" and not graph.superseded(op) for op in graph)
        # A loop that reached max_rounds with on_max_rounds: fail fails the run.
        failed = failed or bool(self.loops is not None and self.loops.failed_loops())
        if failed or checkpoint.error:
            return "failed"  # a lost checkpoint withholds nodes: failed, not interrupted
        if any(op.status == "pending" for op in graph):
            if self.stopped_by is not None:
                return "stopped"
            if self.executor is not None and self.executor.admission_reason == BUDGET_REASON:
                return "budget_exhausted"
            return "timed_out" if self.deadline_hit else "interrupted"
        return "completed"

    def _budget_extra(self, status: str) -> dict[str, Any]:
        """The session's ``budget`` (caps) and, once it ended the run, what was spent."""
        extra: dict[str, Any] = {"budget": self.meter.caps.to_json()}
        if status == "budget_exhausted":
            extra["budget_exhausted"] = self._exhausted()
        return extra

    def _exhausted(self) -> dict[str, Any]:
        return {"spent": self.meter.total.to_json(), "line": self.meter.exhausted_line()}

    def _stop_extra(self) -> dict[str, Any]:
        return {"stopped_by": dict(self.stopped_by)} if self.stopped_by is not None else {}

    async def _finish_session(self, s: _Session, status: EndStatus, extra: dict[str, Any]) -> None:
        if self.lease_loss is not None:
            return  # the session row is its new owner's (or gone with its database)
        epoch = s.lease.epoch

        def finish() -> None:
            s.db.check_file()  # a database deleted under the run: say so, not exit 0 unlisted
            meta = {**extra, "finished_at": time.time()}
            s.db.update_node_metadata(s.session_id, meta, epoch=epoch)
            s.db.set_session_status(s.session_id, status, epoch=epoch)

        # A PostgreSQL server away at the end (issue 44): the run's work is in its
        # checkpoint; its row is written once the connection is back, waiting as long as
        # a new process would wait to be admitted (decision 362).
        deadline = time.monotonic() + (connect_timeout_s() if s.db.path is None else 0.0)
        delay = _FINISH_RETRY_S
        while True:
            try:
                await asyncio.to_thread(finish)
                return
            except (LeaseLostError, StateDBLostError) as exc:
                s.lease.fenced(exc)
                return
            except DatabaseBusyError:
                raise  # a lock held too long: as before, not a server away
            except SteerflowError:
                if self.lease_loss is not None:
                    return  # the keeper gave up on the server meanwhile: its error is the run's
                if time.monotonic() + delay > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, _FINISH_RETRY_MAX_S)

    def _result(
        self, s: _Session, graph: Graph, status: EndStatus, checkpoint: CheckpointOutcome
    ) -> FlowResult:
        seed = self.options.resume
        executor = self.executor
        return FlowResult(
            session_id=s.session_id,
            run_id=s.run_dir.run_id,
            status=status,
            exit_code=exit_code_for(status, self.stop_signal),
            checkpoint=checkpoint.to_json(),
            checkpoint_recovery=seed.checkpoint_recovery if seed else None,
            nodes=node_summaries(graph),
            run_dir=str(s.run_dir.path),
            warnings=self.warnings,
            spawn_rejections=[
                {
                    "emitter": r.emitter,
                    "agent_id": r.agent_id,
                    "reason": r.reason,
                    "detail": r.detail,
                }
                for r in (executor.spawn_rejections if executor else [])
            ],
            resumed_from=seed.resumed_from if seed else None,
            degraded_context=seed.degraded if seed else [],
            usage=usage_total(graph, *self.planner_usage),
            rerun_unsettled=rerun_report(seed.replay) if seed else [],
            rerun_from=rerun_from_json(seed),
            stopped_by=dict(self.stopped_by) if self.stopped_by is not None else None,
            stranded_messages=_stranded_json(seed),
            in_flight_calls=_in_flight_json(seed),
            budget=self.meter.caps.to_json(),
            budget_exhausted=self._exhausted() if status == "budget_exhausted" else None,
            loops=self.loops.to_json() if self.loops is not None else [],
            outcomes=node_outcomes(graph),
            output_classes=self._output_classes(),
        )

    def _output_classes(self) -> dict[str, type]:
        """``Op(output_schema=cls)``'s classes by op id: ``FlowResult.output``'s defaults."""
        plan = self.options.plan
        if plan is None:
            return {}
        from steerflow.plan import Loop

        classes: dict[str, type] = {}
        for item in plan.ops:
            if isinstance(item, Loop):  # round N of body op X is the node X.rN
                for op in item.body:
                    if isinstance(op.output_schema, type):
                        for n in range(1, item.max_rounds + 1):
                            classes[f"{op.agent_id}.r{n}"] = op.output_schema
            elif isinstance(item.output_schema, type):
                classes[item.agent_id] = item.output_schema
        return classes


def _in_flight_json(seed: ResumeSeed | None) -> list[dict[str, Any]]:
    return [call.to_json() for call in seed.in_flight] if seed is not None else []


def _stranded_json(seed: ResumeSeed | None) -> list[dict[str, Any]]:
    return [m.to_json() for m in seed.stranded] if seed is not None else []


async def run_flow(
    options: FlowOptions, *, home: Path, events: EventBus | None = None
) -> FlowResult:
    """Run one flow with the given options (library entry point)."""
    return await FlowRun(options, home=home, events=events).run()
