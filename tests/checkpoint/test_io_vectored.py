"""``_io.write_all(..., vectored=True)``: ``writev`` in order, resumed after a short write."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from steerflow import _faults
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


def _source(tmp_path: Path) -> tuple[int, bytes]:
    data = bytes(range(256)) * 50
    (tmp_path / "src").write_bytes(data)
    return os.open(tmp_path / "src", os.O_RDONLY), data


def _spans_and_bytes(fd: int) -> list[bytes | _io.Span]:
    return [b"head,", _io.Span(fd, 10, 5000), b",", _io.Span(fd, 0, 0), _io.Span(fd, 7000, 12800)]


def _expected(data: bytes) -> bytes:
    return b"head," + data[10:5000] + b"," + data[7000:12800]


def test_spans_are_copied_in_order_between_the_pieces(tmp_path: Path) -> None:
    src, data = _source(tmp_path)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        written = _io.write_all(fd, _spans_and_bytes(src), "base", vectored=True)
    finally:
        os.close(fd)
        os.close(src)
    assert written == len(_expected(data))
    assert (tmp_path / "f").read_bytes() == _expected(data)


@pytest.mark.parametrize("mode", ["no-copy_file_range", "short-write"])
def test_spans_are_read_and_written_where_the_kernel_cannot_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    # copy_file_range missing (old kernel, seccomp), or the short-write fault mode,
    # which writes everything piecewise through its seams.
    if mode == "short-write":
        _faults.arm("short-write:7")
    else:

        def refuse(*args: object) -> int:
            raise OSError(errno.ENOSYS, "copy_file_range")

        monkeypatch.setattr(os, "copy_file_range", refuse)
    src, data = _source(tmp_path)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        written = _io.write_all(fd, _spans_and_bytes(src), "base", vectored=True)
    finally:
        _faults.disarm()
        os.close(fd)
        os.close(src)
    assert written == len(_expected(data))
    assert (tmp_path / "f").read_bytes() == _expected(data)


def test_a_reserved_size_must_be_exactly_what_is_written(tmp_path: Path) -> None:
    # Bases reserve their blocks (fallocate) from the size the state computed; a size
    # that does not match what was written must never leave zero bytes to publish.
    src, data = _source(tmp_path)
    expected = _expected(data)
    try:
        fd = os.open(tmp_path / "exact", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            written = _io.write_all(
                fd, _spans_and_bytes(src), "base", vectored=True, size=len(expected)
            )
        finally:
            os.close(fd)
        assert written == len(expected)
        assert (tmp_path / "exact").read_bytes() == expected
        for name, size in (("short", len(expected) - 1), ("long", len(expected) + 9)):
            fd = os.open(tmp_path / name, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                with pytest.raises(OSError, match="were reserved") as caught:
                    _io.write_all(fd, _spans_and_bytes(src), "base", vectored=True, size=size)
            finally:
                os.close(fd)
            assert caught.value.errno == errno.EIO
    finally:
        os.close(src)
