"""Refusals name the entry (issue 10 item 4): file, entry ids and, in the journal, line and seq.

The CONTRACT §8 members (``reason``, ``seq``, ``line``, ``byte_offset``) stay; ``file``
and ``entry`` are added.  Ids are names, so the report still holds no values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ckpt_support import _disarm_faults  # noqa: F401

from steerflow.checkpoint import CheckpointRecoveryError, load_checkpoint

GEN = "0123456789abcdef0123456789abcdef"
BASE_FILE = "checkpoint.json"
JOURNAL_FILE = "checkpoint.json.journal"


def base(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": 3,
        "generation": GEN,
        "journal_seq": 0,
        "session_id": "s",
        "prompt": "p",
        "plan": [{"agent_id": "a", "dep_indices": [], "assignee": "x"}],
        "flow_context": {},
        "ops": {},
        "spawned": [],
        "config": {},
    }
    doc.update(over)
    return doc


def spawned(node_id: str, spawn_id: str, **over: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "node_id": node_id,
        "status": "completed",
        "response": "r",
        "spawn_id": spawn_id,
        "parent_id": None,
    }
    entry.update(over)
    return entry


def rec(seq: int, **over: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "version": 3,
        "generation": GEN,
        "seq": seq,
        "kind": "op",
        "entry": {"agent_id": "a", "status": "completed", "response": "SECRET-RESPONSE"},
    }
    record.update(over)
    return record


def line(record: dict[str, Any] | str) -> bytes:
    text = record if isinstance(record, str) else json.dumps(record, separators=(",", ":"))
    return text.encode() + b"\n"


def refused(tmp_path: Path, base_doc: dict[str, Any], *lines: bytes) -> CheckpointRecoveryError:
    (tmp_path / BASE_FILE).write_text(json.dumps(base_doc))
    (tmp_path / JOURNAL_FILE).write_bytes(b"".join(lines))
    with pytest.raises(CheckpointRecoveryError) as info:
        load_checkpoint(tmp_path / BASE_FILE)
    assert info.value.report["status"] == "refused"
    assert "SECRET" not in json.dumps(info.value.report)
    return info.value


# == base ========================================================================================


def test_bad_planned_entry_in_the_base_names_agent_id_and_file(tmp_path: Path) -> None:
    bad = {"agent_id": "a", "status": "weird", "response": "SECRET-RESPONSE"}
    exc = refused(tmp_path, base(ops={"a": bad}))
    assert exc.report["refusal"] == {
        "reason": "invalid-entry",
        "seq": None,
        "line": None,
        "byte_offset": None,
        "file": BASE_FILE,
        "entry": {"kind": "op", "agent_id": "a"},
    }
    assert "planned node 'a'" in str(exc) and BASE_FILE in str(exc)
    assert "unsupported status" in str(exc)


def test_bad_spawned_entry_in_the_base_names_node_and_spawn_id(tmp_path: Path) -> None:
    exc = refused(tmp_path, base(spawned=[spawned("n1", "fix-1", status="weird")]))
    refusal = exc.report["refusal"]
    assert refusal["reason"] == "invalid-entry" and refusal["file"] == BASE_FILE
    assert refusal["entry"] == {"kind": "spawn", "node_id": "n1", "spawn_id": "fix-1"}
    assert "spawned node 'fix-1' (node_id 'n1')" in str(exc)


def test_repeated_spawned_node_id_in_the_base_names_it(tmp_path: Path) -> None:
    doc = base(spawned=[spawned("n1", "fix-1"), spawned("n2", "fix-2"), spawned("n1", "fix-3")])
    exc = refused(tmp_path, doc)
    refusal = exc.report["refusal"]
    assert refusal["reason"] == "invalid-base" and refusal["file"] == BASE_FILE
    assert refusal["entry"] == {"kind": "spawn", "node_id": "n1", "spawn_id": "fix-3"}
    assert "'n1'" in str(exc) and "a spawned node_id repeats" in str(exc)


def test_spawned_entry_without_readable_ids_is_named_by_position(tmp_path: Path) -> None:
    doc = base(spawned=[spawned("n1", "fix-1"), {"status": "completed", "response": 1}])
    refusal = refused(tmp_path, doc).report["refusal"]
    assert refusal["entry"] == {"kind": "spawn", "index": 1}


# == journal =====================================================================================


def test_bad_entry_in_the_journal_names_line_seq_file_and_agent_id(tmp_path: Path) -> None:
    good = line(rec(1))
    bad = rec(2, entry={"agent_id": "a", "status": "weird", "response": "SECRET-RESPONSE"})
    exc = refused(tmp_path, base(), good, line(bad))
    assert exc.report["refusal"] == {
        "reason": "invalid-entry",
        "seq": 2,
        "line": 2,
        "byte_offset": len(good),
        "file": JOURNAL_FILE,
        "entry": {"kind": "op", "agent_id": "a"},
    }
    assert exc.report["valid_prefix_seq"] == 1
    assert "seq=2" in str(exc) and "line=2" in str(exc) and JOURNAL_FILE in str(exc)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (rec(2, extra=1), "unknown-member"),
        (rec(2, kind="weird"), "unknown-kind"),
        (rec(2, flow_context={"patch": "x"}), "invalid-patch"),
        (rec(2, version=4), "unsupported-record-version"),
    ],
)
def test_journal_refusal_reports_a_readable_seq(
    tmp_path: Path, bad: dict[str, Any], reason: str
) -> None:
    refusal = refused(tmp_path, base(), line(rec(1)), line(bad)).report["refusal"]
    assert (refusal["reason"], refusal["seq"], refusal["line"]) == (reason, 2, 2)
    assert refusal["file"] == JOURNAL_FILE


def test_bad_spawned_record_names_node_and_spawn_id(tmp_path: Path) -> None:
    bad = rec(1, kind="spawn", entry=spawned("n9", "fix-9", status="pending"))
    refusal = refused(tmp_path, base(), line(bad)).report["refusal"]
    assert refusal["reason"] == "invalid-entry" and refusal["seq"] == 1
    assert refusal["entry"] == {"kind": "spawn", "node_id": "n9", "spawn_id": "fix-9"}


def test_sequence_gap_names_the_entry(tmp_path: Path) -> None:
    refusal = refused(tmp_path, base(), line(rec(1)), line(rec(3))).report["refusal"]
    assert refusal["reason"] == "sequence-gap" and refusal["seq"] == 3
    assert refusal["entry"] == {"kind": "op", "agent_id": "a"}
    assert refusal["file"] == JOURNAL_FILE


def test_ambiguous_seq_is_not_reported(tmp_path: Path) -> None:
    text = json.dumps(rec(2)).replace('"seq": 2', '"seq": 2, "seq": 5')
    refusal = refused(tmp_path, base(), line(rec(1)), line(text)).report["refusal"]
    assert refusal["reason"] == "duplicate-member" and refusal["seq"] is None
    assert refusal["line"] == 2


def test_unparsable_record_names_only_its_position(tmp_path: Path) -> None:
    refusal = refused(tmp_path, base(), line(rec(1)), b"{not json\n").report["refusal"]
    assert refusal["reason"] == "malformed-record"
    assert (refusal["seq"], refusal["entry"], refusal["line"]) == (None, None, 2)


def test_ids_that_are_not_id_shaped_are_not_echoed(tmp_path: Path) -> None:
    bad = rec(1, entry={"agent_id": "SECRET words here", "status": "weird", "response": 1})
    refusal = refused(tmp_path, base(), line(bad)).report["refusal"]
    assert refusal["entry"] is None and refusal["seq"] == 1


# == version 2 ===================================================================================


def test_malformed_v2_entries_are_named(tmp_path: Path) -> None:
    doc = {k: v for k, v in base().items() if k not in ("generation", "journal_seq")}
    doc["version"] = 2
    doc["ops"] = {"a": {"agent_id": "b", "status": "completed", "response": 1}}
    (tmp_path / BASE_FILE).write_text(json.dumps(doc))
    with pytest.raises(CheckpointRecoveryError) as info:
        load_checkpoint(tmp_path / BASE_FILE)
    refusal = info.value.report["refusal"]
    assert refusal["file"] == BASE_FILE
    assert refusal["entry"] == {"kind": "op", "agent_id": "a"}
    doc["ops"] = {}
    doc["spawned"] = [{"spawn_id": "fix-1", "node_id": 7}]
    (tmp_path / BASE_FILE).write_text(json.dumps(doc))
    with pytest.raises(CheckpointRecoveryError) as info:
        load_checkpoint(tmp_path / BASE_FILE)
    assert info.value.report["refusal"]["entry"] == {
        "kind": "spawn",
        "node_id": None,
        "spawn_id": "fix-1",
    }
