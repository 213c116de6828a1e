"""Version 3 loader on crafted base/journal pairs: every refusal and report case."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ckpt_support import _disarm_faults  # noqa: F401

from steerflow.checkpoint import CheckpointRecoveryError, load_checkpoint

GEN = "0123456789abcdef0123456789abcdef"
OLD = "fedcba9876543210fedcba9876543210"


def base(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": 3,
        "generation": GEN,
        "journal_seq": 0,
        "session_id": "s",
        "prompt": "p",
        "plan": [{"agent_id": "a", "dep_indices": [], "assignee": "x"}],
        "flow_context": {"nested": {"entries": []}},
        "ops": {},
        "spawned": [],
        "config": {"max_ops": 0},
        "max_spawn": 20,
    }
    doc.update(over)
    return doc


def rec(n: int, agent: str = "a", gen: str = GEN, **over: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "version": 3,
        "generation": gen,
        "seq": n,
        "kind": "op",
        "entry": {"agent_id": agent, "status": "completed", "response": f"r{n}"},
        "flow_context": {"patch": [{"op": "add", "path": "/nested/entries/-", "value": n}]},
    }
    record.update(over)
    return record


def line(record: dict[str, Any] | str) -> bytes:
    text = record if isinstance(record, str) else json.dumps(record, separators=(",", ":"))
    return text.encode() + b"\n"


def unit(tmp_path: Path, base_doc: dict[str, Any] | str, *lines: bytes, tail: bytes = b"") -> Path:
    text = base_doc if isinstance(base_doc, str) else json.dumps(base_doc)
    (tmp_path / "checkpoint.json").write_text(text)
    (tmp_path / "checkpoint.json.journal").write_bytes(b"".join(lines) + tail)
    return tmp_path / "checkpoint.json"


def refused(path: Path) -> dict[str, Any]:
    with pytest.raises(CheckpointRecoveryError) as info:
        load_checkpoint(path)
    report = dict(info.value.report)
    assert report["status"] == "refused"
    assert report["checkpoint_version"] in (3, None)
    return report


def test_clean_fold(tmp_path: Path) -> None:
    spawn = {
        "version": 3,
        "generation": GEN,
        "seq": 3,
        "kind": "spawn",
        "entry": {"node_id": "n", "status": "pending", "response": None, "spawn_id": "f"},
    }
    path = unit(tmp_path, base(), line(rec(1)), line(rec(2, "b")), line(spawn))
    state, report = load_checkpoint(path)
    assert state["version"] == 3 and state["generation"] == GEN and "journal_seq" not in state
    assert state["flow_context"] == {"nested": {"entries": [1, 2]}}
    assert set(state["ops"]) == {"a", "b"} and state["spawned"][0]["node_id"] == "n"
    assert report == {
        "report_version": 1,
        "status": "clean",
        "checkpoint_version": 3,
        "generation": GEN,
        "records_applied": 3,
        "last_seq": 3,
        "stale_generation_records": 0,
        "discarded_tail_bytes": 0,
        "refusal": None,
        "valid_prefix_seq": 3,
    }
    assert load_checkpoint(tmp_path) == (state, report)  # run directory accepted too


def test_repeated_identity_replaces(tmp_path: Path) -> None:
    path = unit(tmp_path, base(), line(rec(1)), line(rec(2)))
    state, _ = load_checkpoint(path)
    assert state["ops"] == {"a": {"agent_id": "a", "status": "completed", "response": "r2"}}


def test_torn_tail_is_omitted_and_reported(tmp_path: Path) -> None:
    torn = line(rec(2))[:-9]
    path = unit(tmp_path, base(), line(rec(1)), tail=torn)
    state, report = load_checkpoint(path)
    assert report["status"] == "recovered_prefix"
    assert report["discarded_tail_bytes"] == len(torn)
    assert report["last_seq"] == 1 and state["flow_context"]["nested"]["entries"] == [1]


def test_exact_lf_completion_is_recovered(tmp_path: Path) -> None:
    path = unit(tmp_path, base(), line(rec(1)), line(rec(2)))
    _, report = load_checkpoint(path)
    assert report["status"] == "clean" and report["last_seq"] == 2


def test_stale_generation_counted_and_ignored(tmp_path: Path) -> None:
    path = unit(tmp_path, base(), line(rec(1, gen=OLD)), line(rec(2, gen=OLD)))
    state, report = load_checkpoint(path)
    assert report["status"] == "recovered_prefix"
    assert report["stale_generation_records"] == 2 and report["records_applied"] == 0
    assert state["ops"] == {} and state["flow_context"] == {"nested": {"entries": []}}


def test_empty_journal_is_clean(tmp_path: Path) -> None:
    _, report = load_checkpoint(unit(tmp_path, base()))
    assert report["status"] == "clean" and report["last_seq"] == 0


def test_missing_journal_is_refused(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.json").write_text(json.dumps(base()))
    report = refused(tmp_path)
    assert report["refusal"]["reason"] == "missing-journal"


def _journal_refusal(tmp_path: Path, bad: bytes, reason: str) -> None:
    good = line(rec(1))
    report = refused(unit(tmp_path, base(), good, bad, line(rec(3))))
    assert report["refusal"] == {"reason": reason, "seq": report["refusal"]["seq"], "line": 2,
                                 "byte_offset": len(good), "file": "checkpoint.json.journal",
                                 "entry": report["refusal"]["entry"]}  # fmt: skip
    assert report["valid_prefix_seq"] == 1 and report["generation"] == GEN


DUP_CASES = {
    "outer": '{"version":3,"generation":"GENERATION","seq":2,"seq":2,"kind":"op",'
    '"entry":{"agent_id":"a","status":"completed","response":"r"}}'.replace("GENERATION", GEN),
    "outer-escaped": '{"version":3,"generation":"GENERATION","seq":2,"s\\u0065q":2,"kind":"op",'
    '"entry":{"agent_id":"a","status":"completed","response":"r"}}'.replace("GENERATION", GEN),
    "entry": '{"version":3,"generation":"GENERATION","seq":2,"kind":"op",'
    '"entry":{"agent_id":"a","agent_id":"b","status":"completed","response":"r"}}'.replace(
        "GENERATION", GEN
    ),
    "nested-value": '{"version":3,"generation":"GENERATION","seq":2,"kind":"op",'
    '"entry":{"agent_id":"a","status":"completed","response":{"x":1,"\\u0078":2}}}'.replace(
        "GENERATION", GEN
    ),
    "patch-value": '{"version":3,"generation":"GENERATION","seq":2,"kind":"op",'
    '"entry":{"agent_id":"a","status":"completed","response":"r"},'
    '"flow_context":{"patch":[{"op":"add","path":"/k","value":{"y":1,"y":1}}]}}'.replace(
        "GENERATION", GEN
    ),
}


@pytest.mark.parametrize("case", sorted(DUP_CASES))
def test_duplicate_names_in_journal_refused(tmp_path: Path, case: str) -> None:
    _journal_refusal(tmp_path, line(DUP_CASES[case]), "duplicate-member")


def test_distinct_names_control(tmp_path: Path) -> None:
    text = DUP_CASES["nested-value"].replace("\\u0078", "\\u0079")
    _, report = load_checkpoint(unit(tmp_path, base(), line(rec(1)), line(text)))
    assert report["status"] == "clean"


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (b"{not json", "malformed-record"),
        (b"", "malformed-record"),
        (b"[1,2]", "malformed-record"),
        (b"\xff\xfe", "malformed-record"),
        (line(rec(2, extra=1))[:-1], "unknown-member"),
        (line({k: v for k, v in rec(2).items() if k != "kind"})[:-1], "missing-member"),
        (line(rec(2, version=4))[:-1], "unsupported-record-version"),
        (line(rec(2, version=True))[:-1], "unsupported-record-version"),
        (line(rec(2, gen="0123456789ABCDEF0123456789ABCDEF"))[:-1], "invalid-generation"),
        (line(rec(2, gen="abc"))[:-1], "invalid-generation"),
        (line(rec(2, seq="2"))[:-1], "invalid-seq"),
        (line(rec(2, seq=2.0))[:-1], "invalid-seq"),
        (line(rec(2, seq=0))[:-1], "invalid-seq"),
        (line(rec(2, seq=2**63))[:-1], "invalid-seq"),
        (line(rec(2, kind="note"))[:-1], "unknown-kind"),
        (
            line(rec(2, entry={"agent_id": "a", "status": "done", "response": 1}))[:-1],
            "invalid-entry",
        ),
        (line(rec(2, entry={"agent_id": "a", "status": "completed"}))[:-1], "invalid-entry"),
        (line(rec(2, entry={"status": "completed", "response": 1}))[:-1], "invalid-entry"),
        (line(rec(2, flow_context={"patch": [], "x": 1}))[:-1], "invalid-patch"),
        (
            line(rec(2, flow_context={"patch": [{"op": "move", "from": "/a", "path": "/b"}]}))[:-1],
            "invalid-patch",
        ),
        (
            line(rec(2, flow_context={"patch": [{"op": "remove", "path": "/missing"}]}))[:-1],
            "invalid-transition",
        ),
        (
            line(rec(2, entry={"agent_id": "a", "status": "completed", "response": "NaN"}))[
                :-1
            ].replace(b'"NaN"', b"NaN"),
            "non-finite-number",
        ),
        (line(rec(1))[:-1], "duplicate-seq"),
        (line(rec(3))[:-1], "sequence-gap"),
    ],
)
def test_malformed_complete_records_refused(tmp_path: Path, bad: bytes, reason: str) -> None:
    _journal_refusal(tmp_path, bad + b"\n", reason)


def test_malformed_late_operation_leaves_record_unapplied(tmp_path: Path) -> None:
    patch = [
        {"op": "add", "path": "/nested/entries/-", "value": 2},
        {"op": "replace", "path": "/nowhere/x", "value": 3},
    ]
    report = refused(
        unit(tmp_path, base(), line(rec(1)), line(rec(2, flow_context={"patch": patch})))
    )
    assert report["refusal"]["reason"] == "invalid-transition"
    assert report["records_applied"] == 1 and report["valid_prefix_seq"] == 1


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            '{"version":3,"generation":"GENERATION","generation":"GENERATION"}'.replace(
                "GENERATION", GEN
            ),
            "duplicate-member",
        ),
        (
            json.dumps(
                base(ops={"a": {"agent_id": "a", "status": "completed", "response": 1}})
            ).replace('"response": 1', '"response": 1, "response": 2'),
            "duplicate-member",
        ),
        (
            json.dumps(base(flow_context={"k": {"z": 1}})).replace(
                '"z": 1', '"z": 1, "\\u007a": 2'
            ),
            "duplicate-member",
        ),
        (json.dumps(base(generation="xyz")), "invalid-generation"),
        (json.dumps(base(journal_seq=3)), "invalid-base"),
        (json.dumps(base(ops=[])), "invalid-base"),
        (
            json.dumps(base(ops={"a": {"agent_id": "b", "status": "completed", "response": 1}})),
            "invalid-base",
        ),
        (
            json.dumps(base(spawned=[{"node_id": "n", "status": "weird", "response": 1}])),
            "invalid-entry",
        ),
        (json.dumps(base(flow_context={"x": float("inf")})), "non-finite-number"),
    ],
)
def test_base_refusals_have_no_journal_prefix(tmp_path: Path, text: str, reason: str) -> None:
    report = refused(unit(tmp_path, text, line(rec(1))))
    refusal = dict(report["refusal"])
    named = (
        None,
        {"kind": "op", "agent_id": "a"},
        {"kind": "spawn", "node_id": "n", "spawn_id": None},
    )
    assert refusal.pop("entry") in named
    assert refusal == {"reason": reason, "seq": None, "line": None, "byte_offset": None,
                       "file": "checkpoint.json"}  # fmt: skip
    assert report["valid_prefix_seq"] is None and report["records_applied"] is None


def test_report_never_contains_values(tmp_path: Path) -> None:
    secret = "TOP-SECRET-RESPONSE"
    bad = rec(2, entry={"agent_id": "a", "status": "completed", "response": secret}, extra=secret)
    report = refused(unit(tmp_path, base(prompt=secret), line(rec(1)), line(bad)))
    assert secret not in json.dumps(report)


def test_interrupted_reset_old_journal_with_new_base(tmp_path: Path) -> None:
    # A compaction published the new base (GEN) but died before swapping the journal.
    folded = base(ops={"a": {"agent_id": "a", "status": "completed", "response": "r1"}},
                  flow_context={"nested": {"entries": [1]}})  # fmt: skip
    state, report = load_checkpoint(unit(tmp_path, folded, line(rec(1, gen=OLD))))
    assert report["stale_generation_records"] == 1 and report["status"] == "recovered_prefix"
    assert state["ops"]["a"]["response"] == "r1"
