"""One recorded artifact of one node, opened inside its leg directory and nowhere else.

Only a path the node's checkpoint entry records can be opened, resolved under the artifact
root the run's persisted contract names (``artifacts.source_contract``, as ``verify`` and
``resume`` resolve it), one component at a time without following a symlink, and only a
regular file is returned: a download cannot leave the leg directory.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steerflow.artifacts import source_contract
from steerflow.checkpoint import CHECKPOINT_FILENAME, load_state
from steerflow.errors import RefusedError, UnknownIdError
from steerflow.plan import artifact_path_problem
from steerflow.resume import resolve_run_target
from steerflow.views._node import node_detail

__all__ = ["OpenedArtifact", "open_artifact"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted at the path must not hang the reader.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class OpenedArtifact:
    """An open regular file (the caller closes ``fd``) and what the checkpoint recorded."""

    fd: int
    path: str
    size: int
    #: The node's checkpoint record of it (``path``, ``bytes``, ``digest``).
    record: dict[str, Any]


def open_artifact(home: Path, target: str, node: str, path: str) -> OpenedArtifact:
    """Open the artifact ``path`` that node ``node`` of run ``target`` recorded.

    Raises:
        UnknownIdError, AmbiguousIdError: no such run or node, or the node recorded no
            artifact ``path``.
        RefusedError: the file is gone, not a regular file, or reached through a symlink.
        ArtifactContractError: the run's artifact contract cannot be read.
    """
    detail = node_detail(home, target, node)
    record = next(
        (a for a in detail.artifacts if isinstance(a, dict) and a.get("path") == path), None
    )
    if record is None or artifact_path_problem(path) is not None:
        raise UnknownIdError(
            f"node {detail.id!r} of run {detail.run_id} recorded no artifact {path!r}"
        )
    run = resolve_run_target(home, target)
    state, _ = load_state(run.run_dir / CHECKPOINT_FILENAME, v2_lenient=True)
    contract = source_contract(home, state)
    saved = state.config.get("save_dir")
    if contract is not None:
        root = contract.root
    elif isinstance(saved, str) and saved:
        root = Path(saved).absolute()
    else:
        root = run.run_dir / "artifacts"
    fd = _open_below(root / detail.id, path)
    size = os.fstat(fd).st_size
    return OpenedArtifact(fd=fd, path=path, size=size, record=dict(record))


def _open_below(leg_dir: Path, rel: str) -> int:
    """``leg_dir/rel`` opened read-only, no symlink followed anywhere below ``leg_dir``."""
    where = f"artifact {rel!r} under {str(leg_dir)!r}"
    try:
        fd = os.open(leg_dir, _DIR_FLAGS)
    except OSError as exc:
        raise RefusedError(
            f"{where}: the leg directory cannot be opened ({exc.strerror})"
        ) from None
    try:
        parts = rel.split("/")
        for part in parts[:-1]:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        out = os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
    except OSError as exc:
        raise RefusedError(f"{where}: cannot be opened ({exc.strerror})") from None
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(out).st_mode):
        os.close(out)
        raise RefusedError(f"{where}: not a regular file")
    os.set_blocking(out, True)
    return out
