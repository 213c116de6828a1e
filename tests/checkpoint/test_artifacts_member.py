"""``artifacts`` (CONTRACT §10): written by the writer, covered by ``result_digest``."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt_support import _disarm_faults, make_writer  # noqa: F401

from steerflow.checkpoint import entry_digest, load_checkpoint, result_digest

FOUND = [
    {"path": "a.txt", "bytes": 3, "digest": "blake2b:" + "1" * 64},
    {"path": "out/b.md", "bytes": 9, "digest": "blake2b:" + "2" * 64},
]


@pytest.mark.parametrize("version", [2, 3])
async def test_recorded_artifacts_are_kept_and_covered(tmp_path: Path, version: int) -> None:
    writer = make_writer(tmp_path, version=version)
    await writer.flush()
    await writer.record("a", status="completed", response="A", artifacts=FOUND)
    await writer.record("b", status="completed", response="B", artifacts=[])
    await writer.record_spawned(
        "n1", status="completed", response="S", spawn_id="s1", artifacts=FOUND[:1]
    )
    await writer.close()
    state, _ = load_checkpoint(writer.path)
    a, b = state["ops"]["a"], state["ops"]["b"]
    assert a["artifacts"] == FOUND
    assert a["result_digest"] == entry_digest(a) != result_digest("A")
    assert "artifacts" not in b and b["result_digest"] == result_digest("B")
    (spawned,) = state["spawned"]
    assert spawned["artifacts"] == FOUND[:1]
    assert spawned["result_digest"] == entry_digest(spawned) != result_digest("S")
    # a changed size or digest no longer matches the recorded digest
    for tampered in ({**FOUND[0], "bytes": 4}, {**FOUND[0], "digest": "blake2b:" + "3" * 64}):
        assert entry_digest({**a, "artifacts": [tampered, FOUND[1]]}) != a["result_digest"]
