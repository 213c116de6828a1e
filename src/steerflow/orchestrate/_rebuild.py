"""``steerflow db rebuild``: register again every run found under ``<home>/runs/``.

For a lost or replaced state DB (deleted, restored from an old backup, a SQLite home
moved to PostgreSQL without ``db copy``): each run directory whose checkpoint loads is
registered with the session id, prompt and kind its checkpoint records, so ``runs``,
``show`` and the Studio list it again and ``resume`` finds it by session id too.

What the files can tell (docs/decisions.md):

* the status is ``completed`` when the checkpoint records every node of the run as
  completed (planned, spawned, and a requested synthesis; for an agent, every turn,
  with none started after them), else ``interrupted``: why a process ended (failed,
  deadline, stop, signal) is not in the checkpoint, and ``interrupted`` is what
  ``runs`` shows for any run that ended without finishing;
* the node statuses are the checkpoint's entries (nothing about the calls themselves);
* a run that was a resume of another one records that in its checkpoint ``config``
  (``resumed_from``), so its claim on the source (one resume per source) comes back;
* the run's name is rebuilt as it was given: the plan's ``name`` its checkpoint
  ``config`` keeps (runs checkpointed before it was kept fall back to the playbook or
  the prompt's first line), else the playbook, else the prompt's first line;
* the artifact contract is *not* copied into the row: the checkpoint's copy is all
  there is, and ``resume``/``verify`` use it only as the lost-DB rule says (without
  ``--accept-checkpoint-contract`` only when it declares no artifacts).

Nothing under ``runs/`` is written, moved or followed: a symbolic link, a name that is
not a run id, a directory without a checkpoint or with one the loader refuses (an
unreadable one too: the loader's reason is given) is reported and skipped. A run the
DB already knows (its session id or run id) is left as it is, so running the command
twice changes nothing.

A copy of a run directory under another name (``cp -a runs/A runs/B``) is not the run
(decision 247): a checkpoint records its run's id (``config.run_id``), and a directory
whose name differs is skipped as a copy of that run. A checkpoint written before run ids
were recorded cannot say which directory is the run, so when several directories hold
one session id none of them is registered: each is reported, naming the others.
"""

from __future__ import annotations

import calendar
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast, get_args

from steerflow.checkpoint import CHECKPOINT_FILENAME, CheckpointState, load_state
from steerflow.errors import CheckpointRecoveryError, HomeRefusedError, SteerflowError
from steerflow.home import is_run_id
from steerflow.orchestrate._agent_state import is_agent_state, read_turns
from steerflow.orchestrate._claim import LINEAGE_KEY, RUN_ID_KEY, run_name
from steerflow.plan import SYNTHESIS_KEY
from steerflow.state import InvocationKind, NodeStatus, NodeUpdate, SessionStatus, StateDB
from steerflow.state._register import RebuiltSession, register_rebuilt

__all__ = ["RebuildReport", "RebuiltRun", "rebuild_state"]

Outcome = Literal["registered", "known", "skipped"]
_SESSION_ID = re.compile(r"[0-9a-f]{32}")
_NODE_STATUSES = frozenset(get_args(NodeStatus))
_KINDS = frozenset(get_args(InvocationKind))


@dataclass(frozen=True)
class RebuiltRun:
    """What happened to one entry of ``<home>/runs/``."""

    name: str
    outcome: Outcome
    session_id: str | None = None
    status: SessionStatus | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """One ``runs`` item of ``db rebuild --json``."""
        return {
            "run_id": self.name,
            "outcome": self.outcome,
            "session_id": self.session_id,
            "status": self.status,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class RebuildReport:
    """Every entry of the runs directory, in name order, and where they were registered."""

    state_db: str
    runs_dir: Path
    runs: tuple[RebuiltRun, ...]

    def count(self, outcome: Outcome) -> int:
        """How many entries had ``outcome``."""
        return sum(1 for run in self.runs if run.outcome == outcome)

    def to_json(self) -> dict[str, Any]:
        """What ``db rebuild --json`` prints."""
        return {
            "state_db": self.state_db,
            "runs_dir": str(self.runs_dir),
            "registered": self.count("registered"),
            "known": self.count("known"),
            "skipped": self.count("skipped"),
            "runs": [run.to_json() for run in self.runs],
        }


def rebuild_state(home: Path) -> RebuildReport:
    """Register every run under ``<home>/runs/`` the state DB does not know (module doc).

    Raises:
        HomeRefusedError: ``<home>/runs`` is a symbolic link.
        DatabaseBusyError, RefusedError: the state DB is busy or read-only.
    """
    runs_dir = home / "runs"
    if runs_dir.is_symlink():
        raise HomeRefusedError(
            f"{str(runs_dir)!r} is a symlink; db rebuild reads run directories only inside the home"
        )
    names = sorted(os.listdir(runs_dir)) if runs_dir.is_dir() else []
    read = _without_copies([_read_run(runs_dir, name) for name in names])
    out: list[RebuiltRun] = []
    with StateDB.open(home) as db:
        for found in read:
            if isinstance(found, RebuiltRun):
                out.append(found)
                continue
            name = found.run_id
            known = register_rebuilt(db, found)
            if known is not None:
                out.append(RebuiltRun(name, "known", found.id, reason=known))
            else:
                out.append(RebuiltRun(name, "registered", found.id, found.status))
        location = db.location
    return RebuildReport(location, runs_dir, tuple(out))


def _skip(name: str, reason: str) -> RebuiltRun:
    return RebuiltRun(name, "skipped", reason=reason)


def _without_copies(
    read: list[tuple[RebuiltSession | RebuiltRun, str | None]],
) -> list[RebuiltSession | RebuiltRun]:
    """Each entry, with copies of run directories turned into skips (decision 247).

    ``read`` holds each entry and the run id its checkpoint records (None: written before
    run ids were recorded). A directory named otherwise is a copy of that run; sessions
    several directories share with no recorded id to tell them apart are all skipped.
    """
    unrecorded: dict[str, list[str]] = {}
    for found, recorded in read:
        if isinstance(found, RebuiltSession) and recorded is None:
            unrecorded.setdefault(found.id, []).append(found.run_id)
    out: list[RebuiltSession | RebuiltRun] = []
    for found, recorded in read:
        if isinstance(found, RebuiltRun):
            out.append(found)
        elif recorded is not None and recorded != found.run_id:
            out.append(
                _skip(
                    found.run_id,
                    f"a copy of run {recorded}: its checkpoint records run id {recorded}, "
                    "not this directory's name",
                )
            )
        elif recorded is None and len(unrecorded[found.id]) > 1:
            others = ", ".join(n for n in unrecorded[found.id] if n != found.run_id)
            out.append(
                _skip(
                    found.run_id,
                    f"session {found.id} is also in {others}: a copied run directory, and "
                    "its checkpoint (written before checkpoints recorded their run id) "
                    "cannot say which is the run; remove the copy and rebuild again",
                )
            )
        else:
            out.append(found)
    return out


def _read_run(runs_dir: Path, name: str) -> tuple[RebuiltSession | RebuiltRun, str | None]:
    """The session one entry describes (or why it is skipped), and its recorded run id."""
    path = runs_dir / name
    if os.path.islink(path):
        return _skip(name, "a symbolic link (never followed)"), None
    if not is_run_id(name):
        return _skip(name, "not a run id"), None
    if not path.is_dir():
        return _skip(name, "not a directory"), None
    try:
        created = float(calendar.timegm(time.strptime(name[:15], "%Y%m%dT%H%M%S")))
    except ValueError:
        return _skip(name, "its run id is not a date"), None
    try:
        # The loader tells a missing checkpoint from an unreadable one (a directory we
        # may not search, an I/O error): only the first saved nothing.
        state, _ = load_state(path / CHECKPOINT_FILENAME, v2_lenient=True)
    except CheckpointRecoveryError as exc:
        if (exc.report.get("refusal") or {}).get("reason") == "missing-checkpoint":
            return _skip(name, "no checkpoint.json (the run saved nothing to resume)"), None
        return _skip(name, f"checkpoint refused: {_first_line(exc)}"), None
    except (SteerflowError, OSError) as exc:
        return _skip(name, f"checkpoint refused: {_first_line(exc)}"), None
    if not _SESSION_ID.fullmatch(state.session_id or ""):
        return _skip(name, "its checkpoint records no session id"), None
    kind = "agent" if is_agent_state(state) else state.config.get("kind", "flow")
    if kind not in _KINDS:
        return _skip(name, f"its checkpoint records an unknown kind {str(kind)[:40]!r}"), None
    meta: dict[str, Any] = {"run_id": name, "rebuilt": {"at": time.time(), "from": "checkpoint"}}
    resumed = _lineage(state)
    if resumed is not None:
        meta["resumed_from"], meta["resumed_from_run"] = resumed[0], resumed[1]
        if resumed[2]:
            meta["fork"] = True
    recorded = state.config.get(RUN_ID_KEY)
    session = RebuiltSession(
        id=state.session_id,
        kind=cast(InvocationKind, kind),
        status=_end_status(state),
        run_id=name,
        prompt=state.prompt,
        created_at=created,
        updated_at=_changed_at(path),
        node_metadata=meta,
        nodes=tuple(_nodes(state)),
        resumed=(resumed[1], resumed[2]) if resumed is not None else None,
        name=_name(state, kind),
    )
    # A hand-edited id that is not a run id is no evidence either way.
    return session, recorded if isinstance(recorded, str) and is_run_id(recorded) else None


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__


def _name(state: CheckpointState, kind: str) -> str | None:
    """The name the run was given, from what its checkpoint records (``_claim.run_name``).

    A flow's config keeps the plan's ``name`` (when it had one) and the playbook; an
    agent is named by its task, its checkpoint's prompt.
    """
    if kind == "agent":
        return run_name(None, None, state.prompt)
    config = state.config
    plan_name, playbook = config.get("name"), config.get("playbook")
    return run_name(
        plan_name if isinstance(plan_name, str) else None,
        playbook if isinstance(playbook, str) else None,
        state.prompt,
    )


def _lineage(state: CheckpointState) -> tuple[str, str, bool] | None:
    """``(source session, source run, fork)`` a resumed run's checkpoint records, if any."""
    found = state.config.get(LINEAGE_KEY)
    if not isinstance(found, dict):
        return None
    session, run, fork = found.get("session_id"), found.get("run_id"), found.get("fork")
    if not isinstance(session, str) or not isinstance(run, str) or not is_run_id(run):
        return None
    return session, run, fork is True


def _changed_at(run_dir: Path) -> float:
    """The newest mtime of the checkpoint files (links are looked at, not followed)."""
    times = []
    for name in (CHECKPOINT_FILENAME, f"{CHECKPOINT_FILENAME}.journal"):
        try:
            times.append(os.lstat(run_dir / name).st_mtime)
        except OSError:
            continue
    return max(times, default=time.time())


def _end_status(state: CheckpointState) -> SessionStatus:
    """``completed`` when every node of the run is recorded completed, else ``interrupted``."""
    if is_agent_state(state):
        # Done when every recorded turn completed and none was started after them: a
        # resume would have no turn to run (messages queued meanwhile were in the lost DB).
        turns = read_turns(state)
        finished = turns.turns and all(t.entry.status == "completed" for t in turns.turns)
        done = finished and turns.next_instruction is None and not turns.problems
        return "completed" if done else "interrupted"
    keys = [item.get("agent_id") for item in state.plan if isinstance(item, dict)]
    if isinstance(state.config.get("synthesis"), dict):
        keys.append(SYNTHESIS_KEY)
    if not keys:
        return "interrupted"
    planned_done = all(k in state.ops and state.ops[k].status == "completed" for k in keys)
    spawned_done = all(entry.status == "completed" for entry in state.spawned)
    return "completed" if planned_done and spawned_done else "interrupted"


def _nodes(state: CheckpointState) -> Iterable[NodeUpdate]:
    """The node statuses the checkpoint records, once per key (plan order, then the rest)."""
    seen: set[str] = set()

    def status_of(value: object) -> NodeStatus:
        known = isinstance(value, str) and value in _NODE_STATUSES
        return cast(NodeStatus, value) if known else "pending"

    for item in state.plan:
        key = item.get("agent_id") if isinstance(item, dict) else None
        if isinstance(key, str) and key not in seen:
            seen.add(key)
            entry = state.ops.get(key)
            yield NodeUpdate(
                key,
                "planned",
                status_of(entry.status if entry else "pending"),
                node_id=item.get("node_id") if isinstance(item.get("node_id"), str) else None,
                assignee=item.get("assignee") if isinstance(item.get("assignee"), str) else None,
            )
    for key, entry in state.ops.items():  # an agent's turns, a recorded synthesis
        if key not in seen:
            seen.add(key)
            yield NodeUpdate(key, "planned", status_of(entry.status))
    for spawned in state.spawned:
        key = spawned.spawn_id or spawned.node_id
        if key not in seen:
            seen.add(key)
            yield NodeUpdate(
                key, "spawned", status_of(spawned.status), spawned.node_id, spawned.assignee
            )
