"""Resolve a ``resume``/``show`` target to a run directory (D5 resolution rules)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from steerflow.errors import AmbiguousIdError, FlowResumeError, UnknownIdError, quote_input
from steerflow.home import is_run_id, list_run_dirs
from steerflow.state import SessionRow, StateDB, db_exists, this_host

__all__ = ["RunTarget", "resolve_run_target"]

_RUN_PREFIX = re.compile(r"^\d{1,8}(T\d{0,6}(-[0-9a-f]{0,6})?)?$")


@dataclass(frozen=True)
class RunTarget:
    """A resolved run: its directory, run id, and the session that wrote it (if known)."""

    run_dir: Path
    run_id: str
    session_id: str | None
    #: False when the state DB knows the run but its directory is not in this home (the run
    #: ran on another host, or its directory was deleted): only DB facts can be read.
    reachable: bool = True
    #: The host that ran it (the session's ``owner_host``), when it is not reachable.
    owner_host: str | None = None


def _session_for_run(home: Path, run_id: str) -> str | None:
    if not db_exists(home):
        return None
    with StateDB.open(home, create=False) as db:
        row = db.session_for_run(run_id)
    return row.id if row is not None else None


def _unreachable(session: SessionRow, run_id: str, run_dir: Path) -> FlowResumeError:
    """The one line for a run the (shared) state DB knows whose directory is not here."""
    host = session.owner_host or "an unknown host"
    return FlowResumeError(
        f"run {run_id} (session {session.id}, started on {host}) is in the state database, "
        f"but its run directory {str(run_dir)!r} is missing: not reachable from this host "
        f"({this_host()}), and this command needs its checkpoint; put the runs directory on "
        "storage every host shares (README: one state database for a team)"
    )


def _known_elsewhere(home: Path, run_id: str, *, need_dir: bool) -> RunTarget | None:
    """A full run id that only the state DB knows (its run ran on another host).

    Refused when the caller needs the run directory, else its unreachable target.
    """
    if not is_run_id(run_id) or not db_exists(home):
        return None
    with StateDB.open(home, create=False) as db:
        session = db.session_for_run(run_id)
    if session is None:
        return None
    return _elsewhere(session, run_id, home / "runs" / run_id, need_dir=need_dir)


def _elsewhere(session: SessionRow, run_id: str, run_dir: Path, *, need_dir: bool) -> RunTarget:
    if need_dir:
        raise _unreachable(session, run_id, run_dir)
    return RunTarget(run_dir, run_id, session.id, reachable=False, owner_host=session.owner_host)


def _is_dir(path: Path) -> bool:
    """``is_dir`` that answers False for text no path can be (too long, NUL bytes)."""
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def resolve_run_target(home: Path, target: str, *, need_dir: bool = True) -> RunTarget:
    """Resolve ``target`` to one run.

    An exact run directory; else a run id or unambiguous prefix; else a session,
    invocation or play id (or prefix) through the state DB to ``node_metadata.run_id``.

    Only directories under ``<home>/runs`` are accepted, so no target reaches outside the home.
    A run the state DB knows whose directory is not in this home is refused in one line
    (``FlowResumeError``) unless ``need_dir`` is False: then it resolves with
    ``reachable=False`` (``show`` reads it from the state DB alone).
    """
    runs_root = (home / "runs").resolve()
    candidate = Path(target).expanduser()
    if ("/" in target or target.startswith(".")) and _is_dir(candidate):
        resolved = candidate.resolve()
        if resolved.parent != runs_root or not is_run_id(resolved.name):
            raise FlowResumeError(
                f"run directory {quote_input(target)} is not a run of this home "
                f"({str(runs_root)!r})"
            )
        return RunTarget(resolved, resolved.name, _session_for_run(home, resolved.name))
    if _RUN_PREFIX.match(target):
        # Run ids start with a UTC date, session ids are uuid hex: a digits-only prefix
        # may be either, so try runs first and fall through to the state DB.
        matches = [p for p in list_run_dirs(home) if p.name.startswith(target)]
        if len(matches) > 1:
            names = ", ".join(p.name for p in matches[:10])
            raise AmbiguousIdError(
                f"ambiguous run id prefix {quote_input(target)}: matches {len(matches)} runs: "
                f"{names}" + (", ..." if len(matches) > 10 else "")
            )
        if matches:
            run = matches[0]
            return RunTarget(run, run.name, _session_for_run(home, run.name))
        elsewhere = _known_elsewhere(home, target, need_dir=need_dir)
        if elsewhere is not None:
            return elsewhere
    if not db_exists(home):
        raise UnknownIdError(
            f"no run directory or run id matches {quote_input(target)}, and no state DB"
        )
    with StateDB.open(home, create=False) as db:
        try:
            resolved_id = db.resolve_target(target)
        except UnknownIdError:
            raise UnknownIdError(
                "no run directory, run id, session, invocation or play matches "
                f"{quote_input(target)}"
            ) from None
        session = db.get_session(resolved_id.session_id)
    if session is None:
        raise FlowResumeError(f"target {quote_input(target)}: its backing session is missing")
    run_id = session.run_id or session.node_metadata.get("run_id")
    if not run_id or not isinstance(run_id, str) or not is_run_id(run_id):
        raise FlowResumeError(f"session {session.id} records no run id")
    run_dir = home / "runs" / run_id
    if run_dir.is_symlink():
        raise FlowResumeError(
            f"session {session.id}: {str(run_dir)!r} is a symlink; a run id never leads out "
            "of the home"
        )
    if not run_dir.is_dir():
        return _elsewhere(session, run_id, run_dir, need_dir=need_dir)
    return RunTarget(run_dir.resolve(), run_id, session.id)
