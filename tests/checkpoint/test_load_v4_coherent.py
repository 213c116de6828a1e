"""What a version 4 reader sees while a writer publishes (decision 340, "Coherent view").

The publications are real: a writer (version 4, a compaction every 2 records, segments merged
two at a time) records nine outcomes and the files of the unit are kept after each record.
A test starts a run directory as one publication and, through a wrapper around the reader's
``read_pinned``, makes the writer's next step (new segments linked, the manifest and then the
journal renamed over the old ones, the segments no longer named unlinked) happen just before
one chosen file read.  No threads and no sleeps: the interleaving is the test's, so every
retry path of ``_coherent_read`` and ``load_v4`` is taken on purpose.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ckpt_support import _disarm_faults, make_writer  # noqa: F401

from steerflow.checkpoint import CheckpointRecoveryError, _load_v4, _v4, load_checkpoint
from steerflow.checkpoint._load_v4 import seal_manifest
from steerflow.checkpoint._read import read_pinned
from steerflow.checkpoint._report import Report
from steerflow.checkpoint._state import dumps_compact

MANIFEST = "checkpoint.json"
JOURNAL = "checkpoint.json.journal"
SEG = "checkpoint.json.seg."

Files = dict[str, bytes]


@pytest.fixture(scope="module")
def publications(tmp_path_factory: pytest.TempPathFactory) -> list[Files]:
    """The unit's files after each of nine records (a merge after records 4 and 8)."""
    run = tmp_path_factory.mktemp("v4") / "run"
    run.mkdir(mode=0o700)
    kept: list[Files] = []

    async def write() -> None:
        writer = make_writer(run, version=4, max_records=2, flow_context={"k": 0})
        for i in range(9):
            await writer.record(
                f"op{i % 3}", status="completed", response=f"r{i}", flow_context={"k": i}
            )
            if i == 5:
                await writer.record_spawned(
                    "n1", status="completed", response="s", parent_id=None, spawn_id="sp1"
                )
            kept.append({p.name: p.read_bytes() for p in run.iterdir() if p.is_file()})
        await writer.close()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_v4, "SEGMENT_FANOUT", 2)
        asyncio.run(write())
    return kept


def generation(files: Files) -> str:
    return str(json.loads(files[MANIFEST])["generation"])


def unsealed(manifest: bytes) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(manifest[: manifest.rindex(b',"manifest_sha256"')] + b"}")
    return doc


def entry_segments(files: Files) -> list[str]:
    return [ref["name"] for ref in json.loads(files[MANIFEST])["segments"]]


def start(run: Path, files: Files) -> Path:
    run.mkdir(mode=0o700)
    for name, data in files.items():
        (run / name).write_bytes(data)
    return run


def replace(run: Path, name: str, data: bytes) -> None:
    """Publish ``data`` as ``name`` under a new inode, as the writer does."""
    (run / "publish.tmp").write_bytes(data)
    os.replace(run / "publish.tmp", run / name)


def publish(run: Path, files: Files) -> None:
    """The writer's compaction: new segments, the manifest, the journal, then the unlinks."""
    for name, data in files.items():
        if name.startswith(SEG) and not (run / name).exists():
            (run / name).write_bytes(data)
    replace(run, MANIFEST, files[MANIFEST])
    replace(run, JOURNAL, files[JOURNAL])
    for path in run.iterdir():
        if path.name.startswith(SEG) and path.name not in files:
            path.unlink()


def expected(tmp_path: Path, files: Files) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a quiet read of ``files`` gives."""
    return load_checkpoint(start(tmp_path / "quiet", files))


class Reads:
    """The reader's file reads in ``root``, by name, with an action to run before a chosen one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
        self.root = str(root)
        self.names: list[str] = []
        self.before: dict[tuple[str, int], Callable[[], None]] = {}
        monkeypatch.setattr(_load_v4, "read_pinned", self._read)

    def _read(self, path: str) -> tuple[bytes, int] | None:
        if os.path.dirname(path) != self.root:  # a quiet read to compare with
            return read_pinned(path)
        name = os.path.basename(path)
        action = self.before.pop((name, self.names.count(name)), None)
        self.names.append(name)
        if action is not None:
            action()
        return read_pinned(path)

    def count(self, name: str) -> int:
        return self.names.count(name)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Reads]:
    found = Reads(monkeypatch, tmp_path / "run")
    yield found
    assert found.before == {}, "an action was never reached"


def refused(run: Path) -> tuple[dict[str, Any], str]:
    with pytest.raises(CheckpointRecoveryError) as info:
        load_checkpoint(run)
    return dict(info.value.report["refusal"]), str(info.value)


def test_a_manifest_published_during_a_read_is_read_again(
    publications: list[Files], tmp_path: Path, reads: Reads
) -> None:
    old, new = publications[3], publications[4]
    assert generation(old) != generation(new)
    run = start(tmp_path / "run", old)
    # The old manifest and its segments are read, then the journal of the new publication.
    reads.before[(JOURNAL, 0)] = lambda: publish(run, new)
    state, report = load_checkpoint(run)
    assert (state, report) == expected(tmp_path, new)
    assert report["status"] == "clean" and report["generation"] == generation(new)
    assert reads.count(MANIFEST) == 2


def test_a_segment_unlinked_under_an_older_manifest_is_read_again(
    publications: list[Files], tmp_path: Path, reads: Reads
) -> None:
    """A merge: the new manifest names one segment of a higher level, the old ones go."""
    old, new = publications[6], publications[8]
    gone = entry_segments(old)
    assert len(gone) == 2 and not set(gone) & set(new)
    run = start(tmp_path / "run", old)
    # The first segment is read; the merge unlinks the second before the reader gets to it.
    reads.before[(gone[1], 0)] = lambda: publish(run, new)
    state, report = load_checkpoint(run)
    assert (state, report) == expected(tmp_path, new)
    assert state["spawned"][0]["node_id"] == "n1"  # the spawn merged into the new segment
    assert reads.count(MANIFEST) == 2 and reads.count(gone[1]) == 1


@pytest.mark.parametrize(
    "gone_at",
    [
        # Gone when the reader checks the name still holds the manifest it read, back after.
        pytest.param((JOURNAL, 0), id="missing-for-a-moment"),
        pytest.param((MANIFEST, 0), id="absent-at-the-first-read"),
    ],
)
def test_a_manifest_missing_for_a_moment_is_read_again(
    publications: list[Files], tmp_path: Path, reads: Reads, gone_at: tuple[str, int]
) -> None:
    files = publications[4]
    run = start(tmp_path / "run", files)
    reads.before[gone_at] = lambda: os.rename(run / MANIFEST, run / "aside")
    reads.before[(MANIFEST, 1)] = lambda: os.rename(run / "aside", run / MANIFEST)
    assert load_checkpoint(run) == expected(tmp_path, files)
    assert reads.count(MANIFEST) == 2


def test_a_manifest_name_turned_into_a_link_during_a_read_is_not_followed(
    publications: list[Files], tmp_path: Path, reads: Reads
) -> None:
    """The name must still hold the file read, not a link to it: read again, refused."""
    run = start(tmp_path / "run", publications[4])

    def link() -> None:
        os.rename(run / MANIFEST, run / "real")
        (run / MANIFEST).symlink_to(run / "real")

    reads.before[(JOURNAL, 0)] = link
    refusal, message = refused(run)
    assert (refusal["reason"], refusal["file"]) == ("unreadable-checkpoint", MANIFEST)
    assert message.endswith(f"{str(run / MANIFEST)!r} is a symbolic link (never followed)")
    assert reads.count(MANIFEST) == 2


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (b'{"version":3}', "unsupported-version"),
        (b'{"version":4', "malformed-json"),
    ],
)
def test_a_manifest_replaced_after_the_version_was_read_is_refused(
    publications: list[Files], tmp_path: Path, reads: Reads, text: bytes, reason: str
) -> None:
    """Dispatch read a version 4 manifest; the reader's own read finds something else."""
    run = start(tmp_path / "run", publications[4])
    reads.before[(MANIFEST, 0)] = lambda: replace(run, MANIFEST, text)
    refusal, message = refused(run)
    assert (refusal["reason"], refusal["file"]) == (reason, MANIFEST)
    assert message == f"checkpoint recovery refused: {reason} (file='checkpoint.json')"


def test_a_manifest_gone_on_every_read_is_an_incoherent_read(
    publications: list[Files], tmp_path: Path, reads: Reads
) -> None:
    run = start(tmp_path / "run", publications[4])
    # Present when the loader chose the version reader, gone from then on.
    reads.before[(MANIFEST, 0)] = lambda: (run / MANIFEST).unlink()
    refusal, message = refused(run)
    assert (refusal["reason"], refusal["file"]) == ("incoherent-read", MANIFEST)
    assert message == "checkpoint recovery refused: incoherent-read (file='checkpoint.json')"
    assert reads.count(MANIFEST) == 5  # bounded


def test_a_manifest_replaced_on_every_read_is_an_incoherent_read(
    publications: list[Files], tmp_path: Path, reads: Reads
) -> None:
    files = publications[4]
    run = start(tmp_path / "run", files)
    for attempt in range(5):  # an endless run of compactions: never the same manifest twice
        reads.before[(JOURNAL, attempt)] = lambda: replace(run, MANIFEST, files[MANIFEST])
    refusal, message = refused(run)
    assert (refusal["reason"], refusal["file"]) == ("incoherent-read", MANIFEST)
    assert message == "checkpoint recovery refused: incoherent-read (file='checkpoint.json')"
    assert reads.count(MANIFEST) == 5


def test_a_missing_journal_is_looked_for_again_then_refused_naming_it(
    publications: list[Files], tmp_path: Path, reads: Reads
) -> None:
    files = dict(publications[4])
    del files[JOURNAL]
    refusal, message = refused(start(tmp_path / "run", files))
    assert (refusal["reason"], refusal["file"]) == ("missing-journal", JOURNAL)
    assert message == (
        "checkpoint recovery refused: missing-journal (file='checkpoint.json.journal')"
    )
    assert reads.count(JOURNAL) == 5


def test_a_journal_that_appears_on_a_later_read_is_used(
    publications: list[Files], tmp_path: Path, reads: Reads
) -> None:
    files = publications[4]
    run = start(tmp_path / "run", {k: v for k, v in files.items() if k != JOURNAL})
    reads.before[(MANIFEST, 2)] = lambda: replace(run, JOURNAL, files[JOURNAL])
    state, report = load_checkpoint(run)
    assert (state, report) == expected(tmp_path, files)
    assert report["records_applied"] == 1 and reads.count(MANIFEST) == 3


def test_stale_records_between_a_manifest_and_its_journal_reset_are_read_again(
    publications: list[Files], tmp_path: Path, reads: Reads
) -> None:
    """The window of step 2 of the crash argument: the new manifest, the old journal."""
    old, new = publications[3], publications[4]
    run = start(tmp_path / "run", {**new, JOURNAL: old[JOURNAL]})
    reads.before[(MANIFEST, 1)] = lambda: replace(run, JOURNAL, new[JOURNAL])
    state, report = load_checkpoint(run)
    assert (state, report) == expected(tmp_path, new)
    assert report["status"] == "clean" and report["stale_generation_records"] == 0
    assert reads.count(MANIFEST) == 2


def test_stale_records_that_stay_are_reported_after_five_reads(
    publications: list[Files], tmp_path: Path, reads: Reads
) -> None:
    old, new = publications[3], publications[4]
    state, report = load_checkpoint(start(tmp_path / "run", {**new, JOURNAL: old[JOURNAL]}))
    quiet, _ = expected(tmp_path, {**new, JOURNAL: b""})
    assert state == quiet  # the stale records are in the new segments already
    assert report["status"] == "recovered_prefix"
    assert report["stale_generation_records"] == old[JOURNAL].count(b"\n") == 2
    assert report["records_applied"] == 0
    assert reads.count(MANIFEST) == 5


@pytest.mark.parametrize(
    ("where", "reason", "tail"),
    [
        (MANIFEST, "unreadable-checkpoint", "is not a regular file"),
        (JOURNAL, "unreadable-journal", "is not a regular file"),
        ("segment", "unreadable-segment", "is a symbolic link (never followed)"),
    ],
)
def test_an_unreadable_file_is_refused_naming_it(
    publications: list[Files],
    tmp_path: Path,
    reads: Reads,
    where: str,
    reason: str,
    tail: str,
) -> None:
    files = publications[4]
    run = start(tmp_path / "run", files)
    name = entry_segments(files)[0] if where == "segment" else where

    def spoil() -> None:
        (run / name).unlink()
        if where == "segment":
            (run / name).symlink_to(tmp_path / "elsewhere")
        else:
            (run / name).mkdir()

    reads.before[(name, 0)] = spoil
    refusal, message = refused(run)
    assert (refusal["reason"], refusal["file"]) == (reason, name)
    path = str(run / name)
    assert message == f"checkpoint recovery refused: {reason} (file={name!r}): {path!r} {tail}"
    assert reads.count(name) == 1  # refused at once, not read again


def test_the_reader_names_an_unreadable_manifest_without_a_default(
    publications: list[Files], tmp_path: Path, reads: Reads
) -> None:
    """As ``load_v3``: the reader names the file itself, not through the report's default."""
    run = start(tmp_path / "run", publications[4])

    def spoil() -> None:
        (run / MANIFEST).unlink()
        (run / MANIFEST).mkdir()

    reads.before[(MANIFEST, 0)] = spoil
    with pytest.raises(CheckpointRecoveryError) as info:
        _load_v4.load_v4(str(run / MANIFEST), Report())
    report = info.value.report
    assert (report["refusal"]["reason"], report["refusal"]["file"]) == (
        "unreadable-checkpoint",
        MANIFEST,
    )
    assert report["checkpoint_version"] == 4


def test_fold_v4_names_the_file_at_fault_without_a_default(
    publications: list[Files],
) -> None:
    """The writer's reconciliation folds with a bare ``Report()``: the reader names files."""
    files = publications[4]
    manifest = files[MANIFEST]
    segments: dict[str, bytes | None] = {k: v for k, v in files.items() if k.startswith(SEG)}
    journal = files[JOURNAL]
    state = _load_v4.fold_v4(manifest, segments, journal, Report())
    assert state["ops"]["op1"]["response"] == "r4"

    def refusal(segs: dict[str, bytes | None], data: bytes = manifest) -> dict[str, Any]:
        with pytest.raises(CheckpointRecoveryError) as info:
            _load_v4.fold_v4(data, segs, journal, Report())
        return dict(info.value.report["refusal"])

    name = entry_segments(files)[0]
    found = refusal({**segments, name: None})
    assert (found["reason"], found["file"]) == ("missing-segment", name)
    found = refusal(segments, manifest.replace(b'"journal_seq":0', b'"journal_seq": 0'))
    assert (found["reason"], found["file"]) == ("manifest-digest-mismatch", MANIFEST)
    for text, reason in [
        (b"{", "malformed-json"),
        (b'{"version":3}', "unsupported-version"),
        (b"[4]", "invalid-manifest"),  # not an object: it has no seal to check
        # a sealed manifest whose version is the number 4 but not an integer
        (seal_manifest(dumps_compact({**unsealed(manifest), "version": 4.0})),
         "unsupported-version"),
    ]:  # fmt: skip
        found = refusal(segments, text)
        assert (found["reason"], found["file"], found["entry"]) == (reason, MANIFEST, None)

    # An entry's refusal names the logical file and the entry (decision 387).
    def spoil(seg: bytes) -> bytes:
        doc = json.loads(seg)
        doc["ops"]["op1"]["status"] = "weird"
        return json.dumps(doc).encode()

    last = entry_segments(files)[-1]
    ref = unsealed(manifest)
    data = spoil(files[last])
    ref["segments"][-1].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    found = refusal({**segments, last: data}, seal_manifest(dumps_compact(ref)))
    assert (found["reason"], found["file"], found["entry"]) == (
        "invalid-entry",
        MANIFEST,
        {"kind": "op", "agent_id": "op1"},
    )
