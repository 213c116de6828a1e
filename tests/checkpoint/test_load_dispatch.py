"""Loader version dispatch and the version 2 reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ckpt_support import _disarm_faults  # noqa: F401

from steerflow.checkpoint import CheckpointRecoveryError, load_checkpoint
from steerflow.errors import RefusedError

V2 = {
    "version": 2,
    "session_id": "s",
    "prompt": "p",
    "plan": [],
    "flow_context": {},
    "ops": {"a": {"agent_id": "a", "status": "completed", "response": "r"}},
    "spawned": [],
    "config": {},
}


def refusal(path: Path) -> dict[str, object]:
    with pytest.raises(CheckpointRecoveryError) as info:
        load_checkpoint(path)
    assert isinstance(info.value, RefusedError)
    report = info.value.report
    assert report["status"] == "refused" and report["report_version"] == 1
    return report


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "checkpoint.json"
    path.write_text(text)
    return path


def test_v2_reads_file_or_directory(tmp_path: Path) -> None:
    path = write(tmp_path, json.dumps(V2))
    assert load_checkpoint(path) == load_checkpoint(tmp_path)
    state, report = load_checkpoint(path)
    assert state == V2
    assert report == {
        "report_version": 1,
        "status": "clean",
        "checkpoint_version": 2,
        "generation": None,
        "records_applied": None,
        "last_seq": None,
        "stale_generation_records": None,
        "discarded_tail_bytes": None,
        "refusal": None,
        "valid_prefix_seq": None,
    }


def test_v2_legacy_duplicate_below_top_keeps_last(tmp_path: Path) -> None:
    text = json.dumps(V2).replace('"prompt": "p"', '"prompt": "p", "prompt": "q"')
    assert load_checkpoint(write(tmp_path, text))[0]["prompt"] == "q"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "malformed-json"),
        ('{"version": 2', "malformed-json"),
        ("[2]", "not-an-object"),
        ('{"session_id": "s"}', "missing-version"),
        ('{"version": 5}', "unsupported-version"),
        ('{"version": 4}', "invalid-manifest"),
        ('{"version": 1}', "unsupported-version"),
        ('{"version": "2"}', "unsupported-version"),
        ('{"version": true}', "unsupported-version"),
        ('{"version": 2.0}', "unsupported-version"),
        ('{"version": 2, "version": 3}', "ambiguous-version"),
        ('{"version": 3, "vers\\u0069on": 2}', "ambiguous-version"),
        ('{"version": 2, "ops": []}', "invalid-snapshot"),
    ],
)
def test_refusals_before_anything_else(tmp_path: Path, text: str, reason: str) -> None:
    report = refusal(write(tmp_path, text))
    assert report["refusal"] == {
        "reason": reason,
        "seq": None,
        "line": None,
        "byte_offset": None,
        "file": "checkpoint.json",
        "entry": None,
    }
    assert report["valid_prefix_seq"] is None and report["generation"] is None


def test_missing_checkpoint_is_refused(tmp_path: Path) -> None:
    assert refusal(tmp_path)["refusal"]["reason"] == "missing-checkpoint"  # type: ignore[index]


def test_symlinked_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text(json.dumps(V2))
    (tmp_path / "checkpoint.json").symlink_to(tmp_path / "real.json")
    assert refusal(tmp_path)["refusal"]["reason"] == "unreadable-checkpoint"  # type: ignore[index]


def test_refusal_pickles(tmp_path: Path) -> None:
    import pickle

    with pytest.raises(CheckpointRecoveryError) as info:
        load_checkpoint(write(tmp_path, '{"version": 9}'))
    again = pickle.loads(pickle.dumps(info.value))
    assert again.report == info.value.report and str(again) == str(info.value)
