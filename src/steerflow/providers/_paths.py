"""Leg directories and the paths written inside them, without following symlinks.

A leg's artifact directory is ``<artifact root>/<leg key>``. Ids are validated upstream, but
the directory is still made and opened relative to an open descriptor of the artifact root
with ``O_NOFOLLOW``, and every path a provider writes is resolved one component at a time
under the leg directory, so neither a hostile id nor a symlink planted in the tree can make
steerflow write outside it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from steerflow.errors import UnsafePathError, UsageError
from steerflow.home import make_private_dirs

__all__ = ["ensure_leg_dir", "is_leg_key", "write_leg_file"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _is_component(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def is_leg_key(key: str) -> bool:
    """True if ``key`` can name a leg directory: one plain component, no leading dot."""
    return _is_component(key) and not key.startswith(".")


def _open_child_dir(parent_fd: int, name: str, *, create: bool, where: str) -> int:
    """Open (optionally create, mode 0700) directory ``name`` under ``parent_fd``, no symlinks."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent_fd)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePathError(f"{where} is a symlink or not a directory; refused") from None
        raise UnsafePathError(f"cannot open {where}: {exc.strerror}") from None


def _open_leg(leg_dir: Path, *, create: bool) -> int:
    name = leg_dir.name
    if not is_leg_key(name):
        raise UnsafePathError(f"leg directory name {name!r} is not a plain path component")
    try:
        root_fd = os.open(leg_dir.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UnsafePathError(
            f"cannot open artifact root {str(leg_dir.parent)!r}: {exc.strerror}"
        ) from None
    try:
        return _open_child_dir(
            root_fd, name, create=create, where=f"leg directory {str(leg_dir)!r}"
        )
    finally:
        os.close(root_fd)


def ensure_leg_dir(artifact_root: Path, leg_key: str) -> Path:
    """Create (0700) or reuse ``<artifact_root>/<leg_key>``; refuse a symlink or a bad key.

    Raises:
        UnsafePathError: ``leg_key`` is not one plain component (``.``, ``..``, ``/``, a
            leading dot), or the leg directory exists as a symlink or non-directory.
    """
    if not is_leg_key(leg_key):
        raise UnsafePathError(f"leg id {leg_key!r} cannot name an artifact directory")
    try:  # the root is ours or --save DIR: created 0700 if missing, never re-moded
        make_private_dirs(artifact_root)
    except UsageError as exc:
        raise UnsafePathError(str(exc)) from None
    leg_dir = artifact_root / leg_key
    os.close(_open_leg(leg_dir, create=True))
    return leg_dir


def write_leg_file(leg_dir: Path, rel: str, content: bytes) -> str:
    """Write ``content`` to the relative path ``rel`` strictly inside ``leg_dir``.

    Intermediate directories are created 0700, the file 0600; nothing is followed.

    Returns:
        ``rel`` normalised to POSIX form (``a/./b`` → ``a/b``).

    Raises:
        UnsafePathError: ``rel`` is absolute, empty, has a ``..`` component, or passes
            through (or ends at) a symlink.
    """
    if rel.startswith("/") or "\0" in rel:
        raise UnsafePathError(f"artifact path {rel!r} must be relative to the leg directory")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise UnsafePathError(f"artifact path {rel!r} must stay inside the leg directory")
    ensure_leg_dir(leg_dir.parent, leg_dir.name)
    fd = _open_leg(leg_dir, create=False)
    try:
        for depth, part in enumerate(parts[:-1]):
            where = f"artifact path {rel!r} (at {'/'.join(parts[: depth + 1])!r})"
            child = _open_child_dir(fd, part, create=True, where=where)
            os.close(fd)
            fd = child
        try:
            # No O_TRUNC yet: a hard link to a file elsewhere, or a FIFO, is refused untouched.
            out = os.open(
                parts[-1],
                os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                0o600,
                dir_fd=fd,
            )
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePathError(f"artifact path {rel!r} is a symlink; refused") from None
            raise UnsafePathError(f"cannot write artifact {rel!r}: {exc.strerror}") from None
        try:
            st = os.fstat(out)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise UnsafePathError(
                    f"artifact path {rel!r} is not a plain file of this leg; refused"
                )
            os.ftruncate(out, 0)
            view = memoryview(content)
            while view:
                view = view[os.write(out, view) :]
        finally:
            os.close(out)
    finally:
        os.close(fd)
    return "/".join(parts)
