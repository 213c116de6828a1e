"""The steerflow home: where it is, run ids, and run directories (CONTRACT §2)."""

from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from steerflow.errors import HomeRefusedError, RefusedError, UsageError

__all__ = [
    "ALLOW_SHARED_HOME_ENV",
    "RUN_ID_PATTERN",
    "RunDir",
    "allocate_run_dir",
    "check_home",
    "ensure_private_dir",
    "is_run_id",
    "list_run_dirs",
    "make_private_dirs",
    "new_run_id",
    "resolve_home",
]

ALLOW_SHARED_HOME_ENV = "STEERFLOW_ALLOW_SHARED_HOME"
"""Set to ``1`` to accept a home owned by someone else or writable by group/others."""

RUN_ID_PATTERN = re.compile(r"^\d{8}T\d{6}-[0-9a-f]{6}$")


def resolve_home(explicit: str | os.PathLike[str] | None = None, *, create: bool = True) -> Path:
    """The home: ``--home``, else ``STEERFLOW_HOME``, else ``~/.steerflow``; created 0700.

    With ``create`` False a missing home is returned as a path and not made (a reader
    such as the MCP server must not leave a home behind where none was).

    An existing home may be a symlink to a directory. It must be ours, not writable by
    group or others, and writable by us (see :func:`check_home`); its mode is not changed.

    Raises:
        HomeRefusedError: The home is shared or cannot be written.
        UsageError: The home exists and is not a directory, or cannot be created.
    """
    raw = explicit or os.environ.get("STEERFLOW_HOME") or "~/.steerflow"
    home = Path(raw).expanduser().absolute()
    if not os.path.lexists(home):
        return ensure_private_dir(home) if create else home
    check_home(home)  # an existing home keeps its mode: refused if unsafe, never re-moded
    return home


def check_home(home: Path) -> None:
    """Refuse a home others could plant files in, or one we cannot write.

    Others must not be able to plant runs, checkpoints or playbooks in it (like ssh's
    StrictModes), and every command opens the state DB for writing.

    ``STEERFLOW_ALLOW_SHARED_HOME=1`` lifts the owner and mode rules, not the write check.
    """
    try:
        st = home.stat()  # follows a symlinked home to its directory
    except OSError as exc:
        raise UsageError(f"home {str(home)!r} cannot be read: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"home {str(home)!r} exists and is not a directory")
    if os.environ.get(ALLOW_SHARED_HOME_ENV) != "1":
        hint = f"; set {ALLOW_SHARED_HOME_ENV}=1 to use it anyway"
        if st.st_uid != os.geteuid():
            raise HomeRefusedError(
                f"home {str(home)!r} is owned by uid {st.st_uid}, not by you "
                f"(uid {os.geteuid()}){hint}"
            )
        if st.st_mode & 0o022:
            raise HomeRefusedError(
                f"home {str(home)!r} is writable by group or others "
                f"(mode {stat.S_IMODE(st.st_mode):04o}): run `chmod go-w` on it{hint}"
            )
    if not os.access(home, os.W_OK | os.X_OK):
        raise HomeRefusedError(f"home {str(home)!r} is not writable by you (uid {os.geteuid()})")


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) with mode 0700; tighten it if we own it and it is looser."""
    # Not mkdir(parents=True): that gives the parents it creates the umask's mode (0777
    # under umask 0), and whoever can write a home's parent can swap the home itself.
    make_private_dirs(path)
    if path.is_symlink() or not path.is_dir():
        raise UsageError(f"{str(path)!r} is not a directory")
    st = path.stat()
    if st.st_uid == os.geteuid() and st.st_mode & 0o077:
        path.chmod(0o700)
    return path


def make_private_dirs(path: Path) -> Path:
    """Create ``path`` and any missing parents, each new one 0700; never re-mode existing ones.

    For directories the user names (``--save DIR``): a shared ``/tmp`` (1777) or a team's
    0755 directory is theirs to keep as it is; only what steerflow creates is private.
    """
    missing: list[Path] = []
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs, left as it is
        except OSError as exc:
            raise UsageError(
                f"cannot create directory {str(directory)!r}: {exc.strerror}"
            ) from None
    if not path.is_dir():
        raise UsageError(f"{str(path)!r} exists and is not a directory")
    return path


def _check_writable_dir(path: Path) -> None:
    """Refuse an artifact folder (``--save DIR``) in which no leg directory can be made.

    The check is the act itself: a probe directory is made and removed again, so a
    read-only filesystem, missing permission, an immutable folder or an ACL all refuse
    the same way, naming the folder and the cause (``os.access`` misjudges root and ACLs).

    Raises:
        RefusedError: the folder cannot be written.
    """
    probe = path / f".steerflow-write-check-{os.urandom(6).hex()}"
    try:
        probe.mkdir(mode=0o700)
    except OSError as exc:
        raise RefusedError(
            f"the artifact folder {str(path)!r} (--save) cannot be written: "
            f"{exc.strerror or exc}; nothing was run"
        ) from None
    probe.rmdir()


def new_run_id(now: float | None = None) -> str:
    """A run id ``YYYYMMDDTHHMMSS-<6 hex>`` from the UTC start time."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    # os.urandom is what secrets.token_hex reads; importing secrets (hmac, hashlib, random)
    # would cost every CLI start, `ctl` included, a few milliseconds.
    return f"{stamp}-{os.urandom(3).hex()}"


def is_run_id(value: str) -> bool:
    """True if ``value`` is a complete, well-formed run id."""
    return bool(RUN_ID_PATTERN.match(value))


@dataclass(frozen=True)
class RunDir:
    """A run directory and its conventional children."""

    run_id: str
    path: Path
    artifact_root: Path

    @property
    def checkpoint_path(self) -> Path:
        """``checkpoint.json`` inside the run directory."""
        return self.path / "checkpoint.json"

    def leg_artifact_dir(self, leg_key: str) -> Path:
        """The artifact directory of one leg (planned agent_id or spawned spawn_id)."""
        return self.artifact_root / leg_key


def allocate_run_dir(home: Path, *, save: Path | None = None, now: float | None = None) -> RunDir:
    """Create ``<home>/runs/<run_id>/`` (0700) with its artifact root."""
    runs = ensure_private_dir(home / "runs")
    # --save first: a DIR that cannot be used refuses the start before a run dir exists,
    # and before any model call (the planner's included) is paid for.
    saved = make_private_dirs(save.absolute()) if save is not None else None
    if saved is not None:
        _check_writable_dir(saved)
    for _ in range(16):
        run_id = new_run_id(now)
        path = runs / run_id
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        artifact_root = saved or ensure_private_dir(path / "artifacts")
        return RunDir(run_id=run_id, path=path, artifact_root=artifact_root)
    raise UsageError(f"could not allocate a fresh run directory under {str(runs)!r}")


def list_run_dirs(home: Path) -> list[Path]:
    """Every well-formed run directory under the home, oldest first."""
    runs = home / "runs"
    if runs.is_symlink():
        raise HomeRefusedError(f"{str(runs)!r} is a symlink; run ids resolve only inside the home")
    if not runs.is_dir():
        return []
    # A symlink named like a run id would lead a run id out of the home: never followed.
    return sorted(
        p for p in runs.iterdir() if is_run_id(p.name) and not p.is_symlink() and p.is_dir()
    )
