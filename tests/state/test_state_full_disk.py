"""A disk that fills while the state DB is first built never leaves a broken ``state.db``.

Real full disks: a small tmpfs per size, mounted for the test (CI runs as root, as the
network-namespace tests do; without root this fails naming the reason, it is not skipped).
Every size from "nothing fits" to "everything fits" is tried, so whichever write the disk
refuses — the log, the fold of the log into the file, the link into place — is covered.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from steerflow.errors import SteerflowError
from steerflow.state import StateDB


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    assert os.geteuid() == 0, "mounting a tmpfs needs root (CI runs as root)"
    mount = tmp_path / "disk"
    mount.mkdir()
    yield mount
    _unmount(mount)


def _unmount(mount: Path) -> None:
    if os.path.ismount(mount):
        done = subprocess.run(["umount", str(mount)], capture_output=True, text=True)
        assert done.returncode == 0, f"cannot unmount {mount}: {done.stderr.strip()}"


def _mount(mount: Path, size_kib: int) -> None:
    _unmount(mount)  # one disk at a time: a busy one (a file left open) fails here
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"cannot mount a tmpfs: {done.stderr.strip()}"


def test_a_refused_first_open_leaves_no_state_db_and_a_made_one_is_whole(
    small_disk: Path,
) -> None:
    outcomes, refusals = set(), []
    for size_kib in range(16, 260, 8):
        _mount(small_disk, size_kib)
        home = small_disk / "home"
        try:
            StateDB.open(home).close()
        except SteerflowError as exc:
            outcomes.add("refused")
            refusals.append(str(exc))
            leftovers = sorted(p.name for p in home.iterdir()) if home.exists() else []
            assert leftovers == [], (size_kib, leftovers)  # nothing half-built stays
            continue
        outcomes.add("made")
        with contextlib.closing(sqlite3.connect(home / "state.db")) as db:
            # before the fix: "database disk image is malformed"
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)], size_kib
    assert outcomes == {"refused", "made"}  # the sizes span both sides of the edge
    assert all("state database" in text for text in refusals), refusals
