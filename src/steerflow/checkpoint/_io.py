"""Every filesystem call the checkpoint writer makes, each bracketed by a fault seam.

Seam names are ``<object>-<step>``: the object is ``snapshot`` (v2 file), ``base``,
``journal``, ``staging`` or ``dir``; the step is ``create``, ``write``, ``write-part``
(after a short write, before the rest), ``lf`` (around the write that completes a
line's LF; in short-write mode the LF is written alone), ``fsync``, ``close``,
``link``, ``exchange``, ``replace``, ``unlink``, ``quarantine`` or ``lock``.  Raw file
descriptors only: there is no userspace buffer, so the ``flush`` seams the writer
places after each write have nothing to do beyond the write loop.

Only Linux is qualified.  ``renameat2`` comes through ctypes; where the kernel or the
filesystem lacks it (NFS, some FUSE), :func:`exchange` reports ``None`` and the caller
falls back to ``os.replace`` after an identity pre-check, which can still destroy an
occupant that appears between the check and the rename (documented residual risk).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import stat
import uuid
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from steerflow import _faults

__all__ = [
    "Identity",
    "Span",
    "close",
    "create_exclusive",
    "create_tmpfile",
    "exchange",
    "fsync",
    "fsync_dir",
    "identity",
    "link_fd",
    "lock_exclusive",
    "lstat_identity",
    "open_dir",
    "open_staging",
    "remove_dir",
    "rename_noreplace",
    "replace",
    "unique_name",
    "unlink",
    "write_all",
]

Identity = tuple[int, int]  # (st_dev, st_ino)

_seam = _faults.seam

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def identity(fd: int) -> Identity:
    """``(st_dev, st_ino)`` of an open descriptor."""
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)


def lstat_identity(dir_fd: int, name: str) -> Identity | None:
    """Identity of the object named ``name`` (links not followed), or None if absent."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def unique_name(prefix: str) -> str:
    """A fresh name for a temporary object."""
    return f"{prefix}.{uuid.uuid4().hex}.tmp"


def open_dir(path: str) -> int:
    """Open a directory handle that later calls address by ``dir_fd``."""
    _seam("dir-open", "before")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    _seam("dir-open", "after")
    return fd


def open_staging(parent_fd: int, name: str) -> int:
    """Create (0700) or open the private staging directory and check it is ours.

    Refuses a symlink (ENOTDIR through ``O_NOFOLLOW``), another owner, any group or
    other permission bit, and a different filesystem from the parent.
    """
    _seam("staging-create", "before")
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    fd = os.open(
        name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd
    )
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise OSError(errno.ENOTDIR, f"staging {name!r} is not a directory")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise PermissionError(errno.EPERM, f"staging {name!r} is not private to this user")
        if st.st_dev != os.fstat(parent_fd).st_dev:
            raise OSError(errno.EXDEV, f"staging {name!r} is on another filesystem")
    except BaseException:
        os.close(fd)
        raise
    _seam("staging-create", "after")
    return fd


def lock_exclusive(fd: int) -> None:
    """Take the single-writer lock on ``fd`` without waiting (BlockingIOError if held)."""
    _seam("staging-lock", "before")
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _seam("staging-lock", "after")


def create_exclusive(dir_fd: int, name: str, obj: str, *, append: bool = False) -> int:
    """Create ``name`` with O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, and return its fd."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    if append:
        flags |= os.O_APPEND
    _seam(f"{obj}-create", "before")
    fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    _seam(f"{obj}-create", "after")
    return fd


def create_tmpfile(dir_fd: int, obj: str, *, append: bool = False) -> int | None:
    """An unnamed file (O_TMPFILE) in the directory, or None where unsupported."""
    tmpfile = getattr(os, "O_TMPFILE", 0)
    if not tmpfile:
        return None
    flags = tmpfile | os.O_WRONLY | os.O_CLOEXEC | (os.O_APPEND if append else 0)
    _seam(f"{obj}-create", "before")
    try:
        fd = os.open(".", flags, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
            return None
        raise
    _seam(f"{obj}-create", "after")
    return fd


def link_fd(fd: int, dir_fd: int, name: str, obj: str) -> None:
    """Give the unnamed file behind ``fd`` the name ``name`` (linkat via /proc/self/fd)."""
    _seam(f"{obj}-link", "before")
    os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
    _seam(f"{obj}-link", "after")


_IOV_MAX = 1024  # Linux's limit on buffers per writev(2)
_VEC_BYTES = 4 << 20  # about this much is handed to one writev(2)
_READ_CHUNK = 1 << 20  # largest read of a span where it cannot be copied in the kernel
#: copy_file_range(2) errors that mean "not here" (old kernel, filesystem, seccomp):
#: the span is then read and written through user space instead.
_NO_COPY = frozenset({errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM})


class Span(NamedTuple):
    """Bytes ``[start, end)`` of the file behind ``fd`` (opened for reading), as a piece.

    A vectored :func:`write_all` copies it with ``copy_file_range``, so a base's
    unchanged entries go from the previous base to the new one without passing
    through (and being allocated in) user space.
    """

    fd: int
    start: int
    end: int


def read_span(span: Span) -> Iterator[bytes]:
    """The bytes of ``span``, at most 1 MiB at a time."""
    start, end = span.start, span.end
    while start < end:
        chunk = os.pread(span.fd, min(_READ_CHUNK, end - start), start)
        if not chunk:
            raise OSError(errno.EIO, "a span's file is shorter than the span")
        start += len(chunk)
        yield chunk


def _bytes_only(data: Iterable[bytes | Span]) -> Iterator[bytes]:
    for chunk in data:
        if isinstance(chunk, Span):
            yield from read_span(chunk)
        else:
            yield chunk


def write_all(
    fd: int,
    data: bytes | Iterable[bytes | Span],
    obj: str,
    *,
    vectored: bool = False,
    size: int | None = None,
) -> int:
    """Write every byte of ``data`` (bytes, or chunks in order), looping over short writes.

    Returns the number of bytes written.  Chunked input lets a large snapshot be encoded
    and written piecewise, so the worker never holds the GIL for one long encode.
    ``vectored`` (for data without line framing: bases and snapshots) hands up to
    1,024 chunks to one ``writev``, so a base assembled from many kept entry encodings
    is never joined into one large buffer first, and copies :class:`Span` pieces in the
    kernel; the short-write fault mode still writes piecewise (spans read back).
    ``size`` (vectored only), the exact total about to be written to a new empty file,
    reserves its blocks first (:func:`_reserve`); the file must then hold exactly the
    bytes written, or ``OSError(EIO)`` is raised.
    """
    cap = _faults.short_write_cap()
    if vectored and cap is None and not isinstance(data, bytes):
        return _write_vector(fd, data, obj, size)
    written = 0
    _seam(f"{obj}-write", "before")
    for chunk in (data,) if isinstance(data, bytes) else _bytes_only(data):
        view = memoryview(chunk)
        total = len(view)
        off = 0
        ends_line = total > 0 and view[total - 1] == 0x0A
        while off < total:
            end = total if cap is None else min(total, off + cap)
            if cap is not None and ends_line and end == total and total - off > 1:
                end = total - 1  # short-write mode: the closing LF travels in its own write
            completes_line = ends_line and end == total
            if completes_line:
                _seam(f"{obj}-lf", "before")  # the write that completes the record's LF
            n = os.write(fd, view[off:end])
            if n <= 0:
                raise OSError(errno.EIO, "write made no progress")
            off += n
            if completes_line and off == total:
                _seam(f"{obj}-lf", "after")
            if off < total:
                _seam(f"{obj}-write-part", "after")
        written += total
    _seam(f"{obj}-write", "after")
    return written


def _write_vector(fd: int, chunks: Iterable[bytes | Span], obj: str, total: int | None) -> int:
    """``writev`` the chunks in order, resuming exactly where a short write stopped.

    Chunks are taken from ``chunks`` as they are written, at most ``_IOV_MAX`` of them
    and about ``_VEC_BYTES`` at a time, so chunks produced on demand are never all in
    memory at once.  A :class:`Span` is copied (:func:`_copy_span`) once every chunk
    before it is written.  ``total``: see :func:`write_all`'s ``size``.
    """
    written = 0
    source = iter(chunks)
    more = True
    pending: list[bytes | memoryview] = []
    size = 0  # bytes in ``pending``
    span: Span | None = None  # the next span, copied once ``pending`` is written
    _seam(f"{obj}-write", "before")
    reserved = total is not None and _reserve(fd, total)
    while True:
        while more and span is None and len(pending) < _IOV_MAX and size < _VEC_BYTES:
            chunk = next(source, None)
            if chunk is None:
                more = False
            elif isinstance(chunk, Span):
                span = chunk
            else:
                pending.append(chunk)
                size += len(chunk)
        if not pending:
            if span is None:
                break
            written += _copy_span(fd, span)
            span = None
            continue
        n = os.writev(fd, pending) if size else 0
        if size and n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        written += n
        if n == size:
            pending.clear()
            size = 0
            continue
        done = 0  # a short write: drop the chunks it completed, cut the one it split
        while done + len(pending[0]) <= n:
            done += len(pending.pop(0))
        pending[0] = memoryview(pending[0])[n - done :]
        size -= n
        _seam(f"{obj}-write-part", "after")
    if reserved and (written != total or os.fstat(fd).st_size != written):
        # Never publish reserved but unwritten (zero) bytes.
        raise OSError(errno.EIO, f"{obj}: wrote {written} bytes where {total} were reserved")
    _seam(f"{obj}-write", "after")
    return written


def _reserve(fd: int, total: int) -> bool:
    """Allocate ``total`` bytes of the new empty file behind ``fd`` before writing them.

    One ``fallocate(2)`` (mode 0, never glibc's zero-writing emulation) instead of
    block-by-block delayed allocation at writeback: about a quarter less kernel time
    per base on ext4.  Best effort: where it is unsupported or refused (a full disk),
    the write decides as before.  True when the call was made, whatever its outcome
    (a refused one may still have grown the file): the caller then checks the size.
    """
    func = _fallocate_func()
    if func is None or total <= 0:
        return False
    func(fd, 0, 0, total)
    return True


_fallocate: object = None


def _fallocate_func() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    global _fallocate
    if _fallocate is None:
        try:
            func = ctypes.CDLL(None, use_errno=True).fallocate
            func.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            func.restype = ctypes.c_int
            _fallocate = func
        except (OSError, AttributeError):
            _fallocate = False
    return _fallocate or None


def _copy_span(fd: int, span: Span) -> int:
    """Append ``span`` at ``fd``'s offset with ``copy_file_range`` (falls back to read+write)."""
    start, end = span.start, span.end
    while start < end:
        try:
            n = os.copy_file_range(span.fd, fd, end - start, start)
        except OSError as exc:
            if exc.errno not in _NO_COPY:
                raise
            for chunk in read_span(Span(span.fd, start, end)):
                view, off = memoryview(chunk), 0
                while off < len(view):
                    w = os.write(fd, view[off:])
                    if w <= 0:
                        raise OSError(errno.EIO, "write made no progress") from None
                    off += w
            break
        if n <= 0:
            raise OSError(errno.EIO, "a span's file is shorter than the span")
        start += n
    return span.end - span.start


def fsync(fd: int, obj: str) -> None:
    """Flush one file to disk; a failed fsync is final for that fd (never retried)."""
    _seam(f"{obj}-fsync", "before")
    os.fsync(fd)
    _seam(f"{obj}-fsync", "after")


def fsync_dir(dir_fd: int) -> None:
    """Flush to disk a directory whose entries changed."""
    _seam("dir-fsync", "before")
    os.fsync(dir_fd)
    _seam("dir-fsync", "after")


def close(fd: int, obj: str) -> None:
    """Close a descriptor; errors propagate to the caller."""
    _seam(f"{obj}-close", "before")
    os.close(fd)
    _seam(f"{obj}-close", "after")


def replace(src_dir: int, src: str, dst_dir: int, dst: str, obj: str) -> None:
    """``rename(2)`` over the destination (the v2 publication and the fallback path)."""
    _seam(f"{obj}-replace", "before")
    os.replace(src, dst, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
    _seam(f"{obj}-replace", "after")


def unlink(dir_fd: int, name: str, obj: str) -> None:
    """Remove one name."""
    _seam(f"{obj}-unlink", "before")
    os.unlink(name, dir_fd=dir_fd)
    _seam(f"{obj}-unlink", "after")


def remove_dir(dir_fd: int, name: str, obj: str) -> bool:
    """Remove the empty directory ``name``; False (and nothing removed) if it is not empty."""
    _seam(f"{obj}-remove", "before")
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False
        raise
    _seam(f"{obj}-remove", "after")
    return True


def _renameat2(src_dir: int, src: str, dst_dir: int, dst: str, flags: int) -> None:
    func = _renameat2_func()
    if func is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    rc = func(src_dir, os.fsencode(src), dst_dir, os.fsencode(dst), flags)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), dst)


_libc_func: object = None


def _renameat2_func() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    global _libc_func
    if _libc_func is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            func = libc.renameat2
            func.argtypes = [
                ctypes.c_int,
                ctypes.c_char_p,
                ctypes.c_int,
                ctypes.c_char_p,
                ctypes.c_uint,
            ]
            func.restype = ctypes.c_int
            _libc_func = func
        except (OSError, AttributeError):
            _libc_func = False
    return _libc_func or None


def rename_noreplace(src_dir: int, src: str, dst_dir: int, dst: str, obj: str) -> bool | None:
    """Rename only if ``dst`` is free.  True done, False taken (EEXIST), None unsupported."""
    _seam(f"{obj}-rename", "before")
    try:
        _renameat2(src_dir, src, dst_dir, dst, _RENAME_NOREPLACE)
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            return False
        if exc.errno in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            return None
        raise
    _seam(f"{obj}-rename", "after")
    return True


def exchange(src_dir: int, src: str, dst_dir: int, dst: str, obj: str) -> bool | None:
    """Publish ``src`` as ``dst`` without destroying an occupant.

    Returns True when an occupant was swapped into ``src`` (RENAME_EXCHANGE), False when
    ``dst`` was free and the rename happened (RENAME_NOREPLACE), None when the platform
    has no ``renameat2`` flags (the caller then falls back, see the module docstring).
    """
    _seam(f"{obj}-exchange", "before")
    for _ in range(8):
        try:
            _renameat2(src_dir, src, dst_dir, dst, _RENAME_EXCHANGE)
        except OSError as exc:
            if exc.errno in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                return None
            if exc.errno != errno.ENOENT:
                raise
        else:
            _seam(f"{obj}-exchange", "after")
            return True
        try:
            _renameat2(src_dir, src, dst_dir, dst, _RENAME_NOREPLACE)
        except OSError as exc:
            if exc.errno != errno.EEXIST:  # appeared meanwhile: exchange again
                raise
        else:
            _seam(f"{obj}-exchange", "after")
            return False
    raise OSError(errno.EAGAIN, f"destination {dst!r} kept appearing and vanishing")
