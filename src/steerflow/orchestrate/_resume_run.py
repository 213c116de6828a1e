"""``steerflow.resume_run``: prepare a resume and run it, in one call (issue 40 item 6)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from steerflow.executor import EventBus
from steerflow.orchestrate._options import FlowOptions, FlowResult
from steerflow.orchestrate._resume import prepare_resume
from steerflow.orchestrate._run import run_flow

__all__ = ["resume_run"]


async def resume_run(
    home: Path | str,
    target: str,
    *,
    from_node: str | None = None,
    instruction: str | None = None,
    retry_failed: bool = False,
    fork: bool = False,
    allow_degraded_context: bool = False,
    rerun_unsettled: bool = False,
    timeout_s: float | None = None,
    max_cost: float | None = None,
    max_tokens: int | None = None,
    events: EventBus | None = None,
) -> FlowResult:
    """``steerflow resume TARGET [--from NODE [--instruction TEXT]]`` from Python.

    :func:`prepare_resume` (every check, before anything is paid for), then the run, as
    the command line does (a version 3 checkpoint). ``from_node``: a fork that replays
    what is not downstream of NODE and runs NODE (with ``instruction`` instead of its
    own, recorded as edited) and everything downstream of it again; the result's
    ``rerun_from`` names what it paid for. Caps are the whole chain's, as for any resume.

    Raises:
        UsageError: ``instruction`` without ``from_node``, an unknown or spawned node,
            or an option the command line would refuse (named as the parameter).
        FlowResumeError: a resume rule refuses the source (see :func:`prepare_resume`).
    """
    # Files and the state DB are read off the loop: a caller's other tasks keep running.
    seed = await asyncio.to_thread(
        prepare_resume,
        Path(home),
        target,
        retry_failed=retry_failed,
        fork=fork,
        allow_degraded_context=allow_degraded_context,
        rerun_unsettled=rerun_unsettled,
        from_node=from_node,
        instruction=instruction,
    )
    options = FlowOptions(
        resume=seed,
        checkpoint_version=3,
        timeout_s=timeout_s,
        max_cost=max_cost,
        max_tokens=max_tokens,
    )
    return await run_flow(options, home=Path(home), events=events)
