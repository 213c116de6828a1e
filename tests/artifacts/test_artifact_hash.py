"""Reading a leg's files: streamed BLAKE2b, bounded memory, nothing followed."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from steerflow.artifacts import (
    CHUNK,
    ArtifactProblem,
    ArtifactRecord,
    check_leg,
    hash_file,
    inspect_artifact,
    records_from_json,
)


def _expected(data: bytes) -> str:
    return "blake2b:" + hashlib.blake2b(data, digest_size=32).hexdigest()


@pytest.mark.parametrize("size", [1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17])
def test_a_streamed_digest_equals_the_one_shot_digest(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    assert hash_file(tmp_path / "f") == (size, _expected(data))
    # a small chunk crosses many boundaries inside the same file
    assert hash_file(tmp_path / "f", chunk=7) == (size, _expected(data))


def test_the_digest_is_what_b2sum_l_256_prints(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"hello artifact\n" * 1000)
    out = subprocess.run(
        ["b2sum", "-l", "256", str(tmp_path / "f")], capture_output=True, text=True, check=True
    )
    assert hash_file(tmp_path / "f")[1] == "blake2b:" + out.stdout.split()[0]


def _leg(tmp_path: Path) -> Path:
    leg = tmp_path / "root" / "draft"
    (leg / "out").mkdir(parents=True)
    (leg / "out" / "report.md").write_bytes(b"report")
    (leg / "empty.txt").write_bytes(b"")
    (leg / "dir").mkdir()
    (tmp_path / "elsewhere.txt").write_bytes(b"outside")
    (leg / "link.txt").symlink_to(tmp_path / "elsewhere.txt")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.txt").write_bytes(b"x")
    (leg / "linkdir").symlink_to(tmp_path / "elsewhere")
    os.mkfifo(leg / "fifo")
    (leg / "plain").write_bytes(b"p")
    return leg


def test_inspect_reports_each_kind_of_absence(tmp_path: Path) -> None:
    leg = _leg(tmp_path)
    found = inspect_artifact(leg, "out/report.md")
    assert found == ArtifactRecord("out/report.md", 6, _expected(b"report"))
    assert inspect_artifact(leg, "empty.txt") == ArtifactRecord("empty.txt", 0, _expected(b""))
    kinds = {
        rel: getattr(inspect_artifact(leg, rel), "kind", None)
        for rel in (
            "nope.txt",
            "out/nope/x",
            "plain/x",
            "dir",
            "link.txt",
            "linkdir/x.txt",
            "fifo",
        )
    }
    assert kinds == {
        "nope.txt": "missing",
        "out/nope/x": "missing",
        "plain/x": "missing",
        "dir": "not_regular",
        "link.txt": "not_regular",
        "linkdir/x.txt": "not_regular",
        "fifo": "not_regular",
    }
    assert "symlink" in str(inspect_artifact(leg, "linkdir/x.txt"))


def test_a_missing_or_symlinked_leg_directory_is_not_followed(tmp_path: Path) -> None:
    leg = _leg(tmp_path)
    assert inspect_artifact(tmp_path / "root" / "absent", "a") == ArtifactProblem("a", "missing")
    (tmp_path / "root" / "alias").symlink_to(leg)
    problem = inspect_artifact(tmp_path / "root" / "alias", "out/report.md")
    assert isinstance(problem, ArtifactProblem) and problem.kind == "not_regular"


async def test_the_live_check_names_every_missing_or_empty_file(tmp_path: Path) -> None:
    leg = _leg(tmp_path)
    check = await check_leg(leg, ["plain", "out/report.md", "empty.txt", "nope.txt", "dir"])
    assert not check.ok
    assert [r.path for r in check.records] == ["out/report.md", "plain"]
    assert [(p.path, p.kind) for p in check.problems] == [
        ("empty.txt", "empty"),
        ("nope.txt", "missing"),
        ("dir", "not_regular"),
    ]
    message = check.error()
    for text in ("empty.txt (empty)", "nope.txt (missing)", "dir (not a regular file", str(leg)):
        assert text in message
    good = await check_leg(leg, ["plain", "out/report.md"])
    assert good.ok and good.to_json() == [
        {"path": "out/report.md", "bytes": 6, "digest": _expected(b"report")},
        {"path": "plain", "bytes": 1, "digest": _expected(b"p")},
    ]


def test_recorded_artifacts_are_read_strictly() -> None:
    good = {"path": "a", "bytes": 1, "digest": _expected(b"a")}
    assert records_from_json([good]) == (ArtifactRecord("a", 1, _expected(b"a")),)
    for bad in (
        {"path": "a", "bytes": 1},
        {**good, "bytes": -1},
        {**good, "bytes": True},
        {**good, "digest": "sha256:" + "0" * 64},
        {**good, "digest": "blake2b:" + "0" * 32},
        {**good, "digest": "blake2b:" + "G" * 64},
        {**good, "path": ""},
        {**good, "extra": 1},
    ):
        with pytest.raises(ValueError, match="artifact"):
            records_from_json([bad])
    with pytest.raises(ValueError, match="sorted"):
        records_from_json([{**good, "path": "b"}, good])
    with pytest.raises(ValueError, match="not a list"):
        records_from_json(good)


# Peak RSS growth of a fresh interpreter hashing a sparse file of SIZE bytes: the file is
# read in full (zero pages), so a reader that buffered it would grow by that much: 256 MiB
# by default (8x the bound on growth), 2 GiB in the `slow` run.
_MEASURE = textwrap.dedent(
    """
    import os, sys
    from steerflow.artifacts import hash_file

    def hwm_kib():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])

    path, size = sys.argv[1], int(sys.argv[2])
    before = hwm_kib()
    got, digest = hash_file(path)
    assert got == size, (got, size)
    print(hwm_kib() - before, digest)
    """
)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "size", [pytest.param(256 * 1024**2, id="256MiB"), pytest.param(2 * 1024**3, id="2GiB",
                                                                     marks=pytest.mark.slow)],
)  # fmt: skip
def test_a_large_sparse_artifact_is_hashed_with_flat_memory(tmp_path: Path, size: int) -> None:
    path = tmp_path / "sparse.bin"
    with path.open("wb") as handle:
        handle.truncate(size)  # a hole: no disk used, reads return zeros
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path), str(size)],
        capture_output=True,
        text=True,
        check=True,
        timeout=580,
    )
    growth_kib, digest = out.stdout.split()
    assert int(growth_kib) < 32 * 1024, f"peak RSS grew by {growth_kib} KiB"
    assert digest.startswith("blake2b:") and len(digest) == len("blake2b:") + 64
