"""One flow run, start to finish: plan, session, executor, checkpoint, live control, result."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path
from typing import Any

from steerflow import _faults
from steerflow.checkpoint import CheckpointWriter
from steerflow.control import ControlPoller, SteeringTarget
from steerflow.errors import (
    ExitCode,
    FlowResumeError,
    PersistenceError,
    PlanValidationError,
    ProviderError,
    SteerflowError,
    UsageError,
)
from steerflow.executor import (
    EventBus,
    FlowEvent,
    FlowExecutor,
    Graph,
    PauseGate,
    SharedContext,
    build_graph,
)
from steerflow.home import RunDir, allocate_run_dir
from steerflow.orchestrate._claim import discard_run_dir, resume_claim
from steerflow.orchestrate._consent import check_agent_worker_consent
from steerflow.orchestrate._graphview import graph_text, mermaid
from steerflow.orchestrate._options import (
    FlowOptions,
    FlowResult,
    node_summaries,
    usage_total,
)
from steerflow.orchestrate._plan_codec import plan_to_checkpoint
from steerflow.orchestrate._publish import NodePublisher, heartbeat_loop
from steerflow.orchestrate._recorder import CheckpointRecorder, replay_entries, write_private
from steerflow.plan import (
    PlanFile,
    find_playbook,
    load_plan_file,
    parse_plan,
    parse_reactive,
)
from steerflow.providers import PlanRequest, ProviderCache
from steerflow.state import Owner, StateDB

__all__ = ["FlowRun", "run_flow"]

_SIGNAL_EXIT = {signal.SIGINT: ExitCode.SIGINT, signal.SIGTERM: ExitCode.SIGTERM}
#: ``admission_reason`` once an outcome could not be persisted (decision 35).
CHECKPOINT_LOST = "checkpoint-failed"


class _Target(SteeringTarget):
    """What the control poller may touch: the gate and the shared context."""

    def __init__(self, run: FlowRun) -> None:
        self._run = run

    def pause(self) -> None:
        self._run.gate.pause()

    def resume(self) -> None:
        self._run.gate.resume()

    def has_pending_operation(self) -> bool:
        executor = self._run.executor
        # While planning, the first operation is still to come.
        return executor.has_pending() if executor is not None else not self._run.finished

    def add_operator_message(self, text: str, *, ts: float, control_id: str) -> None:
        self._run.context.add_operator_message(text, ts=ts, control_id=control_id)

    def is_paused(self) -> bool:
        return self._run.gate.paused

    def defers_message_stamp(self) -> bool:
        return True  # ``applied`` once an operation is invoked with it (decision 36)


class FlowRun:
    """A single run; :meth:`run` never raises for run outcomes, only for refusals before start."""

    def __init__(self, options: FlowOptions, *, home: Path, events: EventBus | None = None) -> None:
        self.options = options
        self.home = home
        self.events = events or EventBus()
        self.gate = PauseGate()
        seed = options.resume
        self.context = SharedContext(dict(seed.flow_context) if seed else {})
        # The source run's leftover messages were stamped (or left applying) by that run.
        self.context.drop_unrendered("source-run-ended")
        self.executor: FlowExecutor | None = None
        self.finished = False
        self.stop_signal: int | None = None
        self.deadline_hit = False
        self.warnings: list[str] = list(seed.notes) if seed else []
        self._providers = ProviderCache()
        self._planning: asyncio.Task[PlanFile] | None = None

    # -- signals and deadlines ---------------------------------------------------------

    def request_stop(self, signum: int) -> None:
        """SIGINT/SIGTERM: admit nothing new, cancel in-flight calls, persist, exit 130/143."""
        if self.stop_signal is None:
            self.stop_signal = signum
        if self.executor is not None:
            self.executor.close_admission(signal.Signals(signum).name, cancel_inflight=True)
        if self._planning is not None:
            self._planning.cancel()

    def _deadline(self) -> None:
        self.deadline_hit = True
        if self.executor is not None:
            self.executor.close_admission("deadline", cancel_long_running=True)
        if self._planning is not None:
            self._planning.cancel()

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> FlowResult:
        """Plan (unless given), run, persist; return the result."""
        opts = self.options
        plan, prompt, source = self._static_plan()
        settings = self._settings(plan)
        if plan is not None and opts.resume is None:
            check_agent_worker_consent(
                plan,
                source,
                model=settings["model"],
                given_model=opts.model,
                allowed=opts.allow_agent_workers,
            )
        for spec in {settings["model"], *settings["role_models"].values()}:
            self._providers.get(spec)  # refuses a bad model spec before anything starts
        if opts.dry_run and plan is not None:
            return self._dry_result(plan, settings)
        db = await asyncio.to_thread(StateDB.open, self.home)
        try:
            return await self._run_with_db(db, plan, prompt, source, settings)
        finally:
            await self._providers.aclose()
            await asyncio.to_thread(db.close)

    def _static_plan(self) -> tuple[PlanFile | None, str, str]:
        opts = self.options
        if opts.resume is not None:
            return opts.resume.plan, opts.resume.prompt, "checkpoint"
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

    def _settings(self, plan: PlanFile | None) -> dict[str, Any]:
        opts, seed = self.options, self.options.resume
        if seed is not None:
            cfg = seed.config
            return {
                "model": cfg.get("model_spec") or "echo",
                "reactive": parse_reactive(cfg.get("reactive_spec") or "off"),
                "max_ops": int(cfg.get("max_ops") or 0),
                "concurrency": int(cfg.get("concurrency") or 4),
                "save": Path(cfg["save_dir"]) if cfg.get("save_dir") else None,
                "roles": dict(cfg.get("roles") or {}),
                "role_models": {
                    k: v["model"] for k, v in (cfg.get("roles") or {}).items() if v.get("model")
                },
                "playbook": cfg.get("playbook"),
            }
        roles = {k: v.model_dump() for k, v in (plan.roles if plan else {}).items()}
        reactive = opts.reactive if opts.reactive is not None else (plan.reactive if plan else None)
        return {
            "model": opts.model or (plan.model if plan else None) or "echo",
            "reactive": parse_reactive(reactive),
            "max_ops": opts.max_ops
            if opts.max_ops is not None
            else (plan.max_ops or 0 if plan else 0),
            "concurrency": opts.concurrency or (plan.concurrency if plan else None) or 4,
            "save": opts.save,
            "roles": roles,
            "role_models": {k: v["model"] for k, v in roles.items() if v.get("model")},
            "playbook": opts.playbook,
        }

    def _dry_result(self, plan: PlanFile, settings: dict[str, Any]) -> FlowResult:
        graph = build_graph(plan)
        if self.options.resume is not None:
            self.options.resume.apply(graph)
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
        )

    async def _plan_with_model(self, prompt: str, model: str) -> PlanFile:
        provider = self._providers.get(model)
        schema = PlanFile.model_json_schema()
        feedback: str | None = None
        for _ in range(2):
            try:
                raw = await provider.plan(
                    PlanRequest(
                        prompt=prompt,
                        schema=schema,
                        max_entries=self.options.max_plan_entries,
                        feedback=feedback,
                    )
                )
            except ProviderError as exc:
                if exc.retryable:
                    raise  # transport failures were already retried by the provider
                feedback = f"your reply could not be read as a plan: {exc}"
                continue
            try:
                # Over the limit is an invalid reply like any other: one retry, then refuse.
                return parse_plan(
                    raw, source=f"plan from {model}", max_entries=self.options.max_plan_entries
                )
            except PlanValidationError as exc:
                feedback = str(exc)
        raise ProviderError(f"the planner returned an invalid plan twice; last error: {feedback}")

    async def _run_with_db(
        self,
        db: StateDB,
        plan: PlanFile | None,
        prompt: str,
        source: str,
        settings: dict[str, Any],
    ) -> FlowResult:
        opts, seed = self.options, self.options.resume
        kind = opts.kind if seed is None else seed.config.get("kind", "flow")
        run_dir = await asyncio.to_thread(allocate_run_dir, self.home, save=settings["save"])
        metadata: dict[str, Any] = {"run_id": run_dir.run_id, "poller": "pending", "source": source}
        if seed is not None:
            metadata["resumed_from"] = seed.resumed_from
            metadata["resumed_from_run"] = seed.source_run_id
            metadata["checkpoint_recovery"] = seed.checkpoint_recovery
            if seed.degraded:
                metadata["degraded_context"] = seed.degraded
            if seed.fork:
                metadata["fork"] = True
        # One resume per source (docs/decisions.md): the claim is checked and taken with the insert.
        claim = resume_claim(self.home, seed.source_run_id, fork=seed.fork) if seed else None
        try:
            session = await asyncio.to_thread(
                lambda: db.create_session(
                    kind=kind,
                    prompt=prompt,
                    run_id=run_dir.run_id,
                    node_metadata=metadata,
                    owner=Owner.current(),
                    resume=claim,
                )
            )
        except SteerflowError:
            # A refused start (claimed source, busy or read-only state DB) leaves no empty
            # run directory behind to make short run-id prefixes ambiguous.
            await asyncio.to_thread(discard_run_dir, run_dir)
            raise
        if claim is not None:
            _faults.seam("resume-claim", "after")
        invocation = await asyncio.to_thread(
            lambda: db.create_invocation(session_id=session.id, kind=kind)
        )
        if settings["playbook"]:
            await asyncio.to_thread(
                lambda: db.create_play(
                    session_id=session.id,
                    invocation_id=invocation.id,
                    playbook=settings["playbook"],
                )
            )
        loop = asyncio.get_running_loop()
        deadline = (
            loop.call_later(opts.timeout_s, self._deadline) if opts.timeout_s is not None else None
        )
        poller = ControlPoller(self.home, session.id, _Target(self))
        self.context.on_delivered.append(
            lambda messages: poller.messages_delivered([m.get("control_id") for m in messages])
        )
        poller_task = asyncio.ensure_future(poller.run())
        heartbeat = asyncio.ensure_future(heartbeat_loop(db, session.id))
        try:
            return await self._plan_and_execute(
                db, session.id, run_dir, plan, prompt, settings, poller
            )
        finally:
            self.finished = True
            if deadline is not None:
                deadline.cancel()
            await poller.stop()
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            with contextlib.suppress(asyncio.CancelledError):
                await poller_task

    async def _plan_and_execute(
        self,
        db: StateDB,
        session_id: str,
        run_dir: RunDir,
        plan: PlanFile | None,
        prompt: str,
        settings: dict[str, Any],
        poller: ControlPoller,
    ) -> FlowResult:
        opts, seed = self.options, self.options.resume
        checkpoint_info: dict[str, Any] = {
            "path": str(run_dir.checkpoint_path),
            "version": opts.checkpoint_version,
            "persisted": False,
            "error": None,
            "reconciled": 0,
        }
        interrupted_planning = False
        if plan is None:
            self._planning = asyncio.ensure_future(self._plan_with_model(prompt, settings["model"]))
            try:
                plan = await self._planning
            except asyncio.CancelledError:
                interrupted_planning = True
            except SteerflowError as exc:
                await self._finish_session(db, session_id, "failed", {"error": str(exc)})
                raise
            finally:
                self._planning = None
        if plan is None or interrupted_planning:
            status = (
                "timed_out" if self.deadline_hit and self.stop_signal is None else "interrupted"
            )
            await self._finish_session(db, session_id, status, {})
            return self._result(session_id, run_dir, Graph(), status, checkpoint_info)
        max_ops = settings["max_ops"]
        if seed is not None and seed.max_spawn is not None:
            max_spawn = seed.max_spawn
        elif max_ops > 0:
            max_spawn = max(0, max_ops - len(plan.plan))
        else:
            max_spawn = opts.default_max_spawn
        graph = build_graph(plan)
        if seed is not None:
            seed.apply(graph)
        for warning in self.warnings:
            self.events.emit(FlowEvent(type="plan_truncated", data={"message": warning}))
        self.events.emit(
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
        publisher = NodePublisher(db, session_id, graph)
        self.gate.on_change.append(publisher.on_gate)
        self.events.subscribe(publisher.on_event)
        publisher.snapshot_all()
        publisher_task = asyncio.ensure_future(publisher.run())
        config = {
            "model_spec": settings["model"],
            "reactive_spec": settings["reactive"].spec,
            "max_ops": max_ops,
            "concurrency": settings["concurrency"],
            "save_dir": str(settings["save"]) if settings["save"] else None,
            "playbook": settings["playbook"],
            "roles": settings["roles"],
            "kind": opts.kind if seed is None else seed.config.get("kind", "flow"),
        }
        # A resume's first publication holds everything it replays (decision 43).
        replayed_ops, replayed_spawned = replay_entries(graph)
        try:
            writer = CheckpointWriter(
                run_dir.checkpoint_path,
                session_id=session_id,
                prompt=prompt,
                plan=plan_to_checkpoint(plan, {op.key: op.node_id for op in graph.planned}),
                config=config,
                max_spawn=max_spawn,
                flow_context=self.context.content,
                version=opts.checkpoint_version,
                max_records=opts.checkpoint_max_records,
                max_bytes=opts.checkpoint_max_bytes,
                on_saved=lambda *_: self.events.emit(FlowEvent(type="checkpoint_saved")),
                ops=replayed_ops,
                spawned=replayed_spawned,
            )
        except ValueError as exc:
            if seed is None:
                raise
            # A replayed value the new checkpoint cannot hold (a legacy v2 NaN without a
            # digest): refuse before anything runs rather than replay what cannot be kept.
            publisher_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publisher_task
            await self._finish_session(db, session_id, "failed", {"error": str(exc)})
            raise FlowResumeError(
                f"a replayed entry cannot be stored in the resumed run's checkpoint: {exc}"
            ) from None
        recorder = CheckpointRecorder(
            writer, graph, run_dir, self.context, self.events, checkpoint_info
        )
        await recorder.flush()
        executor = FlowExecutor(
            graph,
            provider_for=lambda op: self._providers.get(
                settings["role_models"].get(op.assignee or "", settings["model"])
            ),
            run_id=run_dir.run_id,
            home=self.home,
            artifact_dir=run_dir.leg_artifact_dir,
            system_prompt=lambda op: (settings["roles"].get(op.assignee or "") or {}).get("system"),
            concurrency=settings["concurrency"],
            reactive=settings["reactive"],
            max_spawn=max_spawn,
            gate=self.gate,
            context=self.context,
            events=self.events,
        )
        executor.spawned_count = sum(1 for op in graph if op.kind == "spawned")
        executor.observers.append(recorder.record_outcome)
        executor.spawn_observers.append(recorder.record_intent)
        self.executor = executor
        if self.stop_signal is not None:
            executor.close_admission(signal.Signals(self.stop_signal).name, cancel_inflight=True)
        elif self.deadline_hit:
            executor.close_admission("deadline", cancel_long_running=True)
        # Nothing more can be saved: admit nothing, let the calls already paid for finish.
        recorder.on_lost = lambda: executor.close_admission(CHECKPOINT_LOST)
        if recorder.lost:
            executor.close_admission(CHECKPOINT_LOST)
        await asyncio.to_thread(
            db.set_session_phase, session_id, "paused" if self.gate.paused else "executing"
        )
        poller.executing = True
        await executor.run()
        try:
            await writer.close()
        except PersistenceError as exc:
            checkpoint_info["error"] = checkpoint_info["error"] or str(exc)
        # ``writer.persisted`` remembers every failure; one the recorder recovered from
        # by reconciling is a warning, not a loss (decision 27).
        healthy = writer.persisted or (bool(recorder.recovered) and not writer.stopped)
        checkpoint_info["persisted"] = healthy and checkpoint_info["error"] is None
        if not healthy and checkpoint_info["error"] is None:
            checkpoint_info["error"] = writer.error
        checkpoint_info["reconciled"] = recorder.reconciles
        self.warnings += [
            f"checkpoint write failed, recovered from the durable prefix: {error}"
            for error in recorder.recovered
        ]
        await publisher.close()
        publisher_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await publisher_task
        status = self._final_status(graph, checkpoint_info)
        extra = {
            "checkpoint": checkpoint_info,
            "spawn_rejections": len(executor.spawn_rejections),
            "usage": usage_total(graph),
        }
        await self._finish_session(db, session_id, status, extra)
        return self._result(session_id, run_dir, graph, status, checkpoint_info)

    def _final_status(self, graph: Graph, checkpoint: dict[str, Any]) -> str:
        if self.stop_signal is not None:
            return "interrupted"
        if any(op.status == "failed" for op in graph) or checkpoint["error"]:
            return "failed"  # a lost checkpoint withholds nodes: failed, not interrupted
        if any(op.status == "pending" for op in graph):
            return "timed_out" if self.deadline_hit else "interrupted"
        return "completed"

    async def _finish_session(
        self, db: StateDB, session_id: str, status: str, extra: dict[str, Any]
    ) -> None:
        def finish() -> None:
            db.update_node_metadata(session_id, {**extra, "finished_at": time.time()})
            db.set_session_status(session_id, status)  # type: ignore[arg-type]

        await asyncio.to_thread(finish)

    def _result(
        self,
        session_id: str,
        run_dir: RunDir,
        graph: Graph,
        status: str,
        checkpoint: dict[str, Any],
    ) -> FlowResult:
        exit_code = {
            "completed": ExitCode.OK,
            "failed": ExitCode.FAILED,
            "timed_out": ExitCode.DEADLINE,
        }.get(status)
        if exit_code is None:
            exit_code = (
                _SIGNAL_EXIT.get(signal.Signals(self.stop_signal), ExitCode.FAILED)
                if self.stop_signal
                else ExitCode.FAILED
            )
        seed = self.options.resume
        executor = self.executor
        return FlowResult(
            session_id=session_id,
            run_id=run_dir.run_id,
            status=status,
            exit_code=exit_code,
            checkpoint=checkpoint,
            checkpoint_recovery=seed.checkpoint_recovery if seed else None,
            nodes=node_summaries(graph),
            run_dir=str(run_dir.path),
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
            usage=usage_total(graph),
        )


async def run_flow(
    options: FlowOptions, *, home: Path, events: EventBus | None = None
) -> FlowResult:
    """Run one flow with the given options (library entry point)."""
    return await FlowRun(options, home=home, events=events).run()
