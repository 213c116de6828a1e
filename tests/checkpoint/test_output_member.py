"""``output`` (issue 40 item 2): a typed node's validated output, covered by ``result_digest``.

Written beside the response by both checkpoint versions; an entry without it (every
checkpoint written before typed outputs) is digested over its response alone, as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt_support import _disarm_faults, make_writer  # noqa: F401

from steerflow.checkpoint import entry_digest, load_checkpoint, result_digest
from steerflow.checkpoint._digest import COVERED_MEMBERS

OUTPUT = {"title": "déjà vu", "score": 7, "tags": ["a", "b"]}
TEXT = '{"title":"déjà vu","score":7,"tags":["a","b"]}'


@pytest.mark.parametrize("version", [2, 3])
async def test_a_recorded_output_is_kept_and_covered(tmp_path: Path, version: int) -> None:
    assert "output" in COVERED_MEMBERS
    writer = make_writer(tmp_path, version=version)
    await writer.flush()
    await writer.record("typed", status="completed", response=TEXT, output=OUTPUT)
    await writer.record("plain", status="completed", response="B")
    await writer.record("null", status="completed", response="null", output=None)
    await writer.record_spawned(
        "n1", status="completed", response=TEXT, spawn_id="s1", output=OUTPUT
    )
    await writer.close()
    state, _ = load_checkpoint(writer.path)
    typed, plain, null = state["ops"]["typed"], state["ops"]["plain"], state["ops"]["null"]
    assert typed["output"] == OUTPUT
    assert typed["result_digest"] == entry_digest(typed) != result_digest(TEXT)
    # an entry without the member digests as every older one did: the response alone
    assert "output" not in plain and plain["result_digest"] == result_digest("B")
    # a JSON null output is a member too, so removing it is noticed
    assert "output" in null and null["result_digest"] != result_digest("null")
    (spawned,) = state["spawned"]
    assert spawned["output"] == OUTPUT
    assert spawned["result_digest"] == entry_digest(spawned) != result_digest(TEXT)
    # a changed, added or removed output no longer matches the recorded digest
    changed = {**typed, "output": {**OUTPUT, "score": 8}}
    removed = {k: v for k, v in typed.items() if k != "output"}
    added = {**plain, "output": "B"}
    assert entry_digest(changed) != typed["result_digest"]
    assert entry_digest(removed) != typed["result_digest"]
    assert entry_digest(added) != plain["result_digest"]
