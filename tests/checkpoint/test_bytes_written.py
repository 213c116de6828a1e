"""``CheckpointWriter.bytes_written``: every byte the writer put into checkpoint files."""

from __future__ import annotations

from pathlib import Path

from ckpt_support import _disarm_faults, make_writer  # noqa: F401


def _size(run: Path, name: str) -> int:
    return (run / name).stat().st_size


async def test_v2_counts_each_published_snapshot(tmp_path: Path) -> None:
    w = make_writer(tmp_path, version=2)
    assert w.bytes_written == 0
    await w.flush()
    first = _size(tmp_path, "checkpoint.json")
    assert w.bytes_written == first
    await w.record("research", status="completed", response="x" * 100)
    assert w.bytes_written == first + _size(tmp_path, "checkpoint.json")
    await w.close()


async def test_v3_counts_bases_journal_lines_and_compactions(tmp_path: Path) -> None:
    w = make_writer(tmp_path, version=3, max_records=2)
    await w.flush()
    total = _size(tmp_path, "checkpoint.json")
    assert w.bytes_written == total  # the first base; the journal starts empty
    await w.record("research", status="completed", response="a")
    await w.record("draft", status="completed", response="b")
    journal = _size(tmp_path, "checkpoint.json.journal")
    assert journal > 0 and w.bytes_written == total + journal
    total += journal
    # The third record exceeds max_records: a new base, then the record in a fresh journal.
    await w.record("research", status="completed", response="c")
    assert w.bytes_written == (
        total + _size(tmp_path, "checkpoint.json") + _size(tmp_path, "checkpoint.json.journal")
    )
    await w.close()
