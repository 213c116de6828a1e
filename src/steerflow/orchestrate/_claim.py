"""The claim a resume takes on its source run (docs/decisions.md: one resume per source)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, Protocol

from steerflow.errors import SteerflowError
from steerflow.home import RunDir, is_run_id
from steerflow.state import InvocationKind, Owner, ResumeClaim, SessionRow, StateDB, db_exists

__all__ = [
    "LINEAGE_KEY",
    "RUN_ID_KEY",
    "create_session",
    "discard_run_dir",
    "lineage",
    "preflight_claim",
    "resume_claim",
    "run_name",
]

#: The longest name a run is listed under (CONTRACT §11).
NAME_CHARS = 80


def run_name(plan_name: str | None, playbook: str | None, prompt: str | None) -> str | None:
    """A run's name: the plan's ``name``, else the playbook's, else the prompt's first line.

    At most :data:`NAME_CHARS` characters, surrounding blanks dropped; None when all are
    empty.
    """
    for candidate in (plan_name, playbook, prompt):
        if isinstance(candidate, str):
            line = next((x.strip() for x in candidate.splitlines() if x.strip()), "")
            if line:
                return line[:NAME_CHARS]
    return None


#: The checkpoint ``config`` key where a resumed run records the run it resumed, so the
#: claim it holds can be registered again from files (``db rebuild``).
LINEAGE_KEY = "resumed_from"
#: The checkpoint ``config`` key holding the run's own id (its directory's name), so
#: ``db rebuild`` tells a run from a copy of its directory (decision 247).
RUN_ID_KEY = "run_id"


class Seed(Protocol):
    """What a resumed run (flow or agent) knows of its source."""

    @property
    def resumed_from(self) -> str: ...
    @property
    def source_run_id(self) -> str | None: ...
    @property
    def checkpoint_recovery(self) -> dict[str, Any] | None: ...
    @property
    def fork(self) -> bool: ...


def lineage(seed: Seed | None) -> dict[str, Any] | None:
    """``{"session_id", "run_id", "fork"}`` of the source ``seed`` resumes (None: no seed)."""
    if seed is None:
        return None
    return {"session_id": seed.resumed_from, "run_id": seed.source_run_id, "fork": seed.fork}


def resume_claim(home: Path, source_run_id: str | None, *, fork: bool) -> ResumeClaim | None:
    """The claim a resume of ``source_run_id`` takes, or ``None`` when it names no run."""
    if not source_run_id:
        return None

    def has_checkpoint(run_id: str) -> bool:
        # The holder's first publication is what makes it the run to resume: before it,
        # a dead holder had invoked nothing, so it holds nothing a later resume could lose.
        return is_run_id(run_id) and (home / "runs" / run_id / "checkpoint.json").is_file()

    return ResumeClaim(source_run_id, fork=fork, has_checkpoint=has_checkpoint)


def preflight_claim(home: Path, source_run_id: str, *, fork: bool) -> None:
    """Refuse early (also for ``--dry-run``) a resume that its claim would refuse.

    Only a hint: the check that counts runs again, atomically, when the resumed
    run creates its session. A fork is checked too: it is refused only while the
    source run itself still runs.

    Raises:
        ResumeClaimedError: The source still runs, or (not a fork) another resume
            holds or continued it.
    """
    claim = resume_claim(home, source_run_id, fork=fork)
    if claim is None:
        return
    if not db_exists(home):
        return  # no state DB yet: nobody can have claimed anything
    with StateDB.open(home, create=False) as db:
        db.check_resume(claim)


def discard_run_dir(run_dir: RunDir) -> None:
    """Remove the still-empty run directory of a resume its claim refused.

    Only empty directories are removed (``rmdir``), so nothing anyone wrote is lost;
    an artifact root outside the run directory (``--save``) is left alone.
    """
    for path in (run_dir.path / "artifacts", run_dir.path):
        with contextlib.suppress(OSError):
            path.rmdir()


async def create_session(
    db: StateDB,
    home: Path,
    run_dir: RunDir,
    *,
    kind: InvocationKind,
    prompt: str | None,
    metadata: dict[str, Any],
    seed: Seed | None,
    name: str | None = None,
) -> tuple[SessionRow, bool]:
    """Insert a run's session row, taking its resume claim in the same insert.

    ``metadata`` gains the ``resumed_from*`` members of ``seed``. Returns the row and
    whether a claim was taken.

    Raises:
        SteerflowError: the insert was refused (claimed source, busy or read-only state
            DB); the still-empty run directory is removed first, so it cannot make short
            run-id prefixes ambiguous.
    """
    if seed is not None:
        metadata["resumed_from"] = seed.resumed_from
        metadata["resumed_from_run"] = seed.source_run_id
        metadata["checkpoint_recovery"] = seed.checkpoint_recovery
        if seed.fork:
            metadata["fork"] = True
    # One resume per source (docs/decisions.md): the claim is checked and taken with the insert.
    claim = resume_claim(home, seed.source_run_id, fork=seed.fork) if seed else None
    try:
        session = await asyncio.to_thread(
            lambda: db.create_session(
                kind=kind,
                prompt=prompt,
                run_id=run_dir.run_id,
                node_metadata=metadata,
                owner=Owner.current(),
                resume=claim,
                name=name,
            )
        )
    except SteerflowError:
        await asyncio.to_thread(discard_run_dir, run_dir)
        raise
    return session, claim is not None
