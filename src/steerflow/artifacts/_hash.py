"""Reading a leg's declared files: streamed BLAKE2b, never following a symlink.

A file is hashed in fixed :data:`CHUNK`-byte reads into one reused buffer, so memory stays
flat whatever its size (Amendment 1 row 8: no size cap). ``os.readv`` and
``hashlib.blake2b.update`` release the GIL on buffers this large, so the loop stays
responsive while :func:`check_leg` works on a worker thread.

Every component under the leg directory is opened with ``O_NOFOLLOW`` relative to its
parent's descriptor: a symlink anywhere on the path, a directory, a FIFO or a device is
"not a regular file", never read through.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "CHUNK",
    "DIGEST_PREFIX",
    "ArtifactProblem",
    "ArtifactRecord",
    "LegCheck",
    "ProblemKind",
    "check_leg",
    "hash_fd",
    "hash_file",
    "inspect_artifact",
    "records_from_json",
]

#: Bytes per read: large enough for full hashing speed, small enough to keep memory flat.
CHUNK = 1 << 20
DIGEST_PREFIX = "blake2b:"
_DIGEST_SIZE = 32  # bytes, as for ``result_digest``: 64 hex characters

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted at a declared path must not hang the check.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

#: ``missing``: no such file; ``not_regular``: a symlink (on the path or at its end), a
#: directory, FIFO or device; ``unreadable``: exists but cannot be opened or read;
#: ``empty``: a regular file of size 0 (a live run requires a non-zero size).
ProblemKind = Literal["missing", "not_regular", "unreadable", "empty"]

_SAYS: dict[str, str] = {
    "missing": "missing",
    "not_regular": "not a regular file",
    "unreadable": "unreadable",
    "empty": "empty",
}


@dataclass(frozen=True)
class ArtifactRecord:
    """A declared file as found: its size in bytes and ``blake2b:<64 hex>`` digest."""

    path: str
    bytes: int
    digest: str

    def to_json(self) -> dict[str, Any]:
        """The checkpoint entry form: ``{"path", "bytes", "digest"}``."""
        return {"path": self.path, "bytes": self.bytes, "digest": self.digest}

    @classmethod
    def from_json(cls, data: object) -> ArtifactRecord:
        """Read one recorded artifact; raise ``ValueError`` on any other shape."""
        if not isinstance(data, Mapping) or set(data) != {"path", "bytes", "digest"}:
            raise ValueError("an artifact record is an object with path, bytes and digest")
        path, size, digest = data["path"], data["bytes"], data["digest"]
        if not isinstance(path, str) or not path:
            raise ValueError("an artifact record's path is not a non-empty string")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"artifact {path!r}: bytes is not a non-negative integer")
        if not _is_digest(digest):
            raise ValueError(f"artifact {path!r}: digest is not blake2b:<64 hex>")
        return cls(path, size, digest)


def records_from_json(data: object) -> tuple[ArtifactRecord, ...]:
    """An entry's ``artifacts`` member, read strictly (sorted by path, no repeats)."""
    if not isinstance(data, list):
        raise ValueError("artifacts is not a list")
    records = tuple(ArtifactRecord.from_json(item) for item in data)
    paths = [r.path for r in records]
    if paths != sorted(set(paths)):
        raise ValueError("artifacts are not sorted by path without repeats")
    return records


def _is_digest(value: object) -> bool:
    if not isinstance(value, str) or not value.startswith(DIGEST_PREFIX):
        return False
    hexpart = value[len(DIGEST_PREFIX) :]
    return len(hexpart) == 2 * _DIGEST_SIZE and all(c in "0123456789abcdef" for c in hexpart)


@dataclass(frozen=True)
class ArtifactProblem:
    """A declared file that is not there as a non-empty regular file."""

    path: str
    kind: ProblemKind
    detail: str = ""

    def __str__(self) -> str:
        said = _SAYS[self.kind]
        return f"{self.path} ({said}: {self.detail})" if self.detail else f"{self.path} ({said})"


def hash_fd(fd: int, *, chunk: int = CHUNK) -> tuple[int, str]:
    """``(bytes read, digest)`` of what ``fd`` reads from its offset to the end."""
    digest = hashlib.blake2b(digest_size=_DIGEST_SIZE)
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    total = 0
    while True:
        n = os.readv(fd, [buffer])
        if n == 0:
            break
        digest.update(view[:n])
        total += n
    return total, DIGEST_PREFIX + digest.hexdigest()


def hash_file(path: str | os.PathLike[str], *, chunk: int = CHUNK) -> tuple[int, str]:
    """``(bytes, digest)`` of a regular file, not following a symlink at ``path``."""
    fd = os.open(path, _FILE_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        return hash_fd(fd, chunk=chunk)
    finally:
        os.close(fd)


def _problem(rel: str, exc: OSError) -> ArtifactProblem:
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return ArtifactProblem(rel, "missing")
    if exc.errno == errno.ELOOP:
        return ArtifactProblem(rel, "not_regular", "a symlink")
    return ArtifactProblem(rel, "unreadable", exc.strerror or str(exc))


def _dir_problem(rel: str, exc: OSError, is_link: bool, what: str) -> ArtifactProblem:
    # O_DIRECTORY|O_NOFOLLOW on a symlink fails with ENOTDIR (not ELOOP) on Linux, as it
    # does for a plain file in the way: lstat tells the two apart.
    if is_link:
        return ArtifactProblem(rel, "not_regular", f"{what} is a symlink")
    return _problem(rel, exc)


def _is_link(name: str | Path, dir_fd: int | None = None) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def inspect_artifact(leg_dir: Path, rel: str) -> ArtifactRecord | ArtifactProblem:
    """What is at ``leg_dir/rel``: a record (size, digest) or why it is not a regular file.

    Blocking (it reads the whole file): call it on a worker thread. An empty regular file
    is a record with ``bytes == 0``; whether that is acceptable is the caller's rule.
    """
    parts = rel.split("/")
    try:
        fd = os.open(leg_dir, _DIR_FLAGS)
    except OSError as exc:
        return _dir_problem(rel, exc, _is_link(leg_dir), "the leg directory")
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                return _dir_problem(rel, exc, _is_link(part, fd), f"{part!r} on its path")
            os.close(fd)
            fd = child
        try:
            out = os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
        except OSError as exc:
            return _problem(rel, exc)
        try:
            mode = os.fstat(out).st_mode
            if not stat.S_ISREG(mode):
                what = "a directory" if stat.S_ISDIR(mode) else "not a file"
                return ArtifactProblem(rel, "not_regular", what)
            os.set_blocking(out, True)
            size, digest = hash_fd(out)
        except OSError as exc:
            return ArtifactProblem(rel, "unreadable", exc.strerror or str(exc))
        finally:
            os.close(out)
        return ArtifactRecord(rel, size, digest)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class LegCheck:
    """The live check of one leg: what was found, and what is wrong."""

    leg_dir: Path
    records: tuple[ArtifactRecord, ...]
    problems: tuple[ArtifactProblem, ...]

    @property
    def ok(self) -> bool:
        """True when every declared file is a non-empty regular file."""
        return not self.problems

    def error(self) -> str:
        """The node's error text, naming every missing or empty file."""
        listed = ", ".join(str(p) for p in self.problems)
        return f"declared artifacts not produced in {str(self.leg_dir)!r}: {listed}"

    def to_json(self) -> list[dict[str, Any]]:
        """The entry's ``artifacts`` member: records sorted by path."""
        return [r.to_json() for r in self.records]


def _check_leg_sync(leg_dir: Path, declared: Sequence[str]) -> LegCheck:
    records: list[ArtifactRecord] = []
    problems: list[ArtifactProblem] = []
    for rel in declared:
        found = inspect_artifact(leg_dir, rel)
        if isinstance(found, ArtifactProblem):
            problems.append(found)
        elif found.bytes == 0:
            problems.append(ArtifactProblem(rel, "empty"))
        else:
            records.append(found)
    return LegCheck(leg_dir, tuple(sorted(records, key=lambda r: r.path)), tuple(problems))


async def check_leg(leg_dir: Path, declared: Iterable[str]) -> LegCheck:
    """Check (on a worker thread) that each declared path is a non-empty regular file.

    Records come back sorted by path, problems in declared order.
    """
    return await asyncio.to_thread(_check_leg_sync, leg_dir, list(declared))
