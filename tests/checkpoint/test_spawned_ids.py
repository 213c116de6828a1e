"""``spawned_ids`` (CONTRACT §10): written by the writer, covered by ``result_digest``.

Entries without the member keep the digest every older checkpoint carries (over the
response alone); entries with it are digested over ``{"response", "spawned_ids"}``, so
changing, adding or removing the member no longer matches (the resume's settle check
then refuses; see ``tests/e2e/test_spawn_witness.py``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from ckpt_support import _disarm_faults, make_writer  # noqa: F401

from steerflow.checkpoint import (
    CheckpointRecoveryError,
    entry_digest,
    load_checkpoint,
    result_digest,
)

# Pinned by hand: the canonical bytes below and their BLAKE2b-256.
WITNESSED = {"agent_id": "a", "status": "completed", "response": "A", "spawned_ids": ["n1", "n2"]}
WITNESSED_BYTES = b'{"response":"A","spawned_ids":["n1","n2"]}'
WITNESSED_DIGEST = "blake2b:4cb9e22f92b6bb3021f5a30bb5b1695c0961b6df8eddb7aa6184541ecc361342"
# The known answer of tests/checkpoint/test_digest_known_answers.py for "notes".
NOTES_DIGEST = "blake2b:3c1287a29ab74727b02354f4e23bc6792e289e70273bf69a82f908c54a2711d7"


def test_entry_without_covered_members_keeps_the_response_digest() -> None:
    entry = {"agent_id": "a", "status": "completed", "response": "notes", "other": 1}
    assert entry_digest(entry) == result_digest("notes") == NOTES_DIGEST


def test_spawned_ids_are_covered_by_the_digest() -> None:
    assert hashlib.blake2b(WITNESSED_BYTES, digest_size=32).hexdigest() == WITNESSED_DIGEST[8:]
    assert entry_digest(WITNESSED) == WITNESSED_DIGEST
    for tampered in (
        {**WITNESSED, "spawned_ids": ["n1"]},
        {**WITNESSED, "spawned_ids": ["n2", "n1"]},
        {**WITNESSED, "spawned_ids": ["n1", "n2", "n3"]},
        {k: v for k, v in WITNESSED.items() if k != "spawned_ids"},
    ):
        assert entry_digest(tampered) != WITNESSED_DIGEST, tampered


@pytest.mark.parametrize("version", [2, 3])
async def test_writer_records_spawned_ids_under_the_digest(tmp_path: Path, version: int) -> None:
    writer = make_writer(tmp_path, version=version)
    await writer.flush()
    await writer.record_spawned("n1", status="pending", response=None, spawn_id="s1")
    await writer.record("a", status="completed", response="A", spawned_ids=["n1"])
    await writer.record_spawned(
        "n1", status="completed", response="S1", spawn_id="s1", spawned_ids=["n2"]
    )
    await writer.record("b", status="completed", response="notes", spawned_ids=[])
    await writer.close()
    state, report = load_checkpoint(tmp_path / "checkpoint.json")
    assert report["status"] == "clean"
    a, b = state["ops"]["a"], state["ops"]["b"]
    assert a["spawned_ids"] == ["n1"] and "spawned_ids" not in b
    assert a["result_digest"] == entry_digest(a) != result_digest("A")
    assert b["result_digest"] == NOTES_DIGEST
    (child,) = state["spawned"]
    assert child["spawned_ids"] == ["n2"] and child["result_digest"] == entry_digest(child)


@pytest.mark.parametrize(
    ("spawned_ids", "message"),
    [
        ("n1", "sequence of node ids"),
        (["n1", ""], "sequence of node ids"),
        (["n1", "n1"], "repeats"),
    ],
)
async def test_writer_refuses_bad_spawned_ids(
    tmp_path: Path, spawned_ids: object, message: str
) -> None:
    writer = make_writer(tmp_path, version=3)
    with pytest.raises(ValueError, match=message):
        await writer.record("a", status="completed", response="A", spawned_ids=spawned_ids)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pending"):
        await writer.record_spawned("n1", status="pending", response=None, spawned_ids=["n2"])
    await writer.close()


@pytest.mark.parametrize("bad", [["n1", "n1"], "n1", [1], [""]])
def test_loader_refuses_malformed_spawned_ids_in_v3(tmp_path: Path, bad: object) -> None:
    base = {
        "version": 3,
        "generation": "0" * 32,
        "journal_seq": 0,
        "session_id": "s",
        "prompt": "p",
        "plan": [],
        "flow_context": {},
        "ops": {"a": {"agent_id": "a", "status": "completed", "response": 1, "spawned_ids": bad}},
        "spawned": [],
        "config": {},
    }
    (tmp_path / "checkpoint.json").write_text(json.dumps(base))
    (tmp_path / "checkpoint.json.journal").write_bytes(b"")
    with pytest.raises(CheckpointRecoveryError) as info:
        load_checkpoint(tmp_path / "checkpoint.json")
    refusal = info.value.report["refusal"]
    assert refusal["reason"] == "invalid-entry"
    assert refusal["entry"] == {"kind": "op", "agent_id": "a"}
