"""A journal beside a version 2 checkpoint is refused, naming the journal (issue 10, item 5).

No version 2 writer makes a journal, so one found beside a v2 snapshot belongs to some
version 3 unit; reading the snapshot alone would drop the outcomes only the journal
holds, and a resume would pay for them again.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from ckpt_support import _disarm_faults, make_writer  # noqa: F401

from steerflow.checkpoint import JOURNAL_FILENAME, CheckpointRecoveryError, load_checkpoint

# A well-formed v3 journal line: what a journal of some other unit would hold.
LINE = (
    b'{"version":3,"generation":"' + b"a" * 32 + b'","seq":1,"kind":"op",'
    b'"entry":{"agent_id":"draft","status":"completed","response":"D"}}\n'
)


def _v2_run(tmp_path: Path) -> Path:
    writer = make_writer(tmp_path, 2)

    async def go() -> None:
        await writer.flush()
        await writer.record("research", status="completed", response="R")
        await writer.close()

    asyncio.run(go())
    return tmp_path


@pytest.mark.parametrize("content", [LINE, b""], ids=["records", "empty"])
def test_journal_beside_v2_is_refused_and_named(tmp_path: Path, content: bytes) -> None:
    run = _v2_run(tmp_path)
    journal = run / JOURNAL_FILENAME
    journal.write_bytes(content)
    before = {p.name: p.read_bytes() for p in (run / "checkpoint.json", journal)}
    with pytest.raises(CheckpointRecoveryError) as info:
        load_checkpoint(run)
    report = info.value.report
    assert report["status"] == "refused"
    assert report["checkpoint_version"] == 2
    assert report["refusal"]["reason"] == "unexpected-journal"
    assert report["refusal"]["file"] == JOURNAL_FILENAME
    assert str(journal) in str(info.value)
    assert {p.name: p.read_bytes() for p in (run / "checkpoint.json", journal)} == before


def test_a_dangling_journal_link_is_refused_too(tmp_path: Path) -> None:
    run = _v2_run(tmp_path)
    os.symlink(tmp_path / "nowhere", run / JOURNAL_FILENAME)
    with pytest.raises(CheckpointRecoveryError, match="unexpected-journal"):
        load_checkpoint(run / "checkpoint.json")


def test_v2_without_journal_still_loads_clean(tmp_path: Path) -> None:
    state, report = load_checkpoint(_v2_run(tmp_path))
    assert report["status"] == "clean" and report["checkpoint_version"] == 2
    assert set(state["ops"]) == {"research"}
