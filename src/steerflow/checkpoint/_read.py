"""Strict, link-refusing reads of checkpoint files, and JSON decoding that counts duplicates."""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CHECKPOINT_FILENAME",
    "JOURNAL_FILENAME",
    "SNAPSHOT_TYPES",
    "Parsed",
    "parse_json",
    "read_pinned",
]

# The snapshot members every checkpoint (v2 file, v3 base) carries, with their JSON types.
SNAPSHOT_TYPES: tuple[tuple[str, type | tuple[type, ...]], ...] = (
    ("session_id", str),
    ("prompt", str),
    ("plan", list),
    ("flow_context", dict),
    ("ops", dict),
    ("spawned", list),
    ("config", dict),
)

CHECKPOINT_FILENAME = "checkpoint.json"
JOURNAL_FILENAME = "checkpoint.json.journal"


@dataclass
class Parsed:
    """A decoded JSON text plus what strict readers need to know about it."""

    value: Any
    duplicates: int = 0  # duplicate member names anywhere (after unescaping)
    top_duplicates: list[str] = field(default_factory=list)  # duplicated top-level names
    non_finite: bool = False  # NaN / Infinity literals were present


def parse_json(text: str | bytes) -> Parsed:
    """Decode JSON, keeping the last value of a duplicated name but counting it.

    Raises ``ValueError`` (``json.JSONDecodeError`` or ``UnicodeDecodeError``) when the
    text is not JSON at all.
    """
    calls: list[list[str]] = []
    parsed = Parsed(None)

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        dups: list[str] = []
        for key, value in pairs:
            if key in out:
                dups.append(key)
            out[key] = value
        parsed.duplicates += len(dups)
        calls.append(dups)
        return out

    def constant(name: str) -> float:
        parsed.non_finite = True
        return float(name.replace("Infinity", "inf"))

    if isinstance(text, bytes):
        text = text.decode("utf-8")
    try:
        parsed.value = json.loads(text, object_pairs_hook=pairs_hook, parse_constant=constant)
    except RecursionError:
        # A hand-made or tampered file nested past the interpreter's stack is refused like
        # any other undecodable text, not left to escape as a traceback (exit 1).
        raise json.JSONDecodeError("nested too deeply", text, 0) from None
    if isinstance(parsed.value, dict) and calls:
        parsed.top_duplicates = calls[-1]  # the outermost object is decoded last
    return parsed


def read_pinned(path: str) -> tuple[bytes, int] | None:
    """Read a regular file without following links; return (bytes, open fd) or None.

    The returned descriptor pins the inode so its ``(st_dev, st_ino)`` cannot be
    recycled while the caller compares identities; the caller closes it.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        # O_NOFOLLOW's "Too many levels of symbolic links" does not tell an operator why.
        raise OSError(errno.ELOOP, f"{path!r} is a symbolic link (never followed)") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path!r} is not a regular file")
        chunks: list[bytes] = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    except BaseException:
        os.close(fd)
        raise
    return b"".join(chunks), fd
