"""The steerflow home: where it is, run ids, and run directories (CONTRACT §2)."""

from __future__ import annotations

import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from steerflow.errors import UsageError

__all__ = [
    "RUN_ID_PATTERN",
    "RunDir",
    "allocate_run_dir",
    "ensure_private_dir",
    "is_run_id",
    "list_run_dirs",
    "new_run_id",
    "resolve_home",
]

RUN_ID_PATTERN = re.compile(r"^\d{8}T\d{6}-[0-9a-f]{6}$")


def resolve_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The home: ``--home``, else ``STEERFLOW_HOME``, else ``~/.steerflow``; created 0700."""
    raw = explicit or os.environ.get("STEERFLOW_HOME") or "~/.steerflow"
    home = Path(raw).expanduser().absolute()
    ensure_private_dir(home)
    return home


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) with mode 0700; tighten it if we own it and it is looser."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{str(path)!r} exists and is not a directory") from None
    except OSError as exc:
        raise UsageError(f"cannot create directory {str(path)!r}: {exc.strerror}") from None
    if path.is_symlink() or not path.is_dir():
        raise UsageError(f"{str(path)!r} is not a directory")
    st = path.stat()
    if st.st_uid == os.geteuid() and st.st_mode & 0o077:
        path.chmod(0o700)
    return path


def new_run_id(now: float | None = None) -> str:
    """A run id ``YYYYMMDDTHHMMSS-<6 hex>`` from the UTC start time."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(3)}"


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
    for _ in range(16):
        run_id = new_run_id(now)
        path = runs / run_id
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        artifact_root = save.absolute() if save is not None else path / "artifacts"
        ensure_private_dir(artifact_root)
        return RunDir(run_id=run_id, path=path, artifact_root=artifact_root)
    raise UsageError(f"could not allocate a fresh run directory under {str(runs)!r}")


def list_run_dirs(home: Path) -> list[Path]:
    """Every well-formed run directory under the home, oldest first."""
    runs = home / "runs"
    if not runs.is_dir():
        return []
    return sorted(p for p in runs.iterdir() if is_run_id(p.name) and p.is_dir())
