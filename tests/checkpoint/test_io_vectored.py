"""``_io.write_all(..., vectored=True)``: ``writev`` in order, resumed after a short write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from steerflow.checkpoint import _io


def _pieces() -> list[bytes]:
    return [b"", *(bytes([65 + i % 26]) * (i % 7) for i in range(3000)), b"", b"end"]


def test_vectored_write_is_every_piece_in_order(tmp_path: Path) -> None:
    pieces = _pieces()  # more than one writev's worth of buffers (1,024 per call)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert _io.write_all(fd, pieces, "base", vectored=True) == sum(map(len, pieces))
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"".join(pieces)


def test_short_writev_resumes_exactly_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel may write fewer bytes than asked (a full disk, a signal); this fault
    # injection makes every writev stop after at most 5 bytes, mid-buffer.
    real = os.writev
    calls = []

    def short(fd: int, buffers: list[bytes]) -> int:
        data = b"".join(bytes(b) for b in buffers)[:5]
        calls.append(len(data))
        return real(fd, [data])

    monkeypatch.setattr(os, "writev", short)
    pieces = [b"ab", b"", b"cdefgh", b"ijklmnopq", b"r"]
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert _io.write_all(fd, pieces, "base", vectored=True) == 18
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"abcdefghijklmnopqr"
    assert calls == [5, 5, 5, 3]
