"""Version 3 loader on crafted base/journal pairs: every refusal and report case."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ckpt_support import _disarm_faults  # noqa: F401

from steerflow.checkpoint import CheckpointRecoveryError, load_checkpoint
from steerflow.checkpoint._load_v3 import _InvalidError, check_entry, fold_unit, load_v3
from steerflow.checkpoint._report import Report

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


def _named_entry(bad: bytes) -> dict[str, str] | None:
    """The op a refusal names: the bad record's own, when it still says which one."""
    try:
        record = json.loads(bad)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("kind") != "op":
        return None
    entry = record.get("entry")
    if isinstance(entry, dict) and isinstance(entry.get("agent_id"), str):
        return {"kind": "op", "agent_id": entry["agent_id"]}
    return None


def _journal_refusal(tmp_path: Path, bad: bytes, reason: str, seq: int | None) -> None:
    good = line(rec(1))
    report = refused(unit(tmp_path, base(), good, bad, line(rec(3))))
    assert report["refusal"] == {"reason": reason, "seq": seq, "line": 2,
                                 "byte_offset": len(good), "file": "checkpoint.json.journal",
                                 "entry": _named_entry(bad)}  # fmt: skip
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
    # a doubled outer "seq" is ambiguous, so the refusal names no seq
    seq = None if case.startswith("outer") else 2
    _journal_refusal(tmp_path, line(DUP_CASES[case]), "duplicate-member", seq)


def test_distinct_names_control(tmp_path: Path) -> None:
    text = DUP_CASES["nested-value"].replace("\\u0078", "\\u0079")
    _, report = load_checkpoint(unit(tmp_path, base(), line(rec(1)), line(text)))
    assert report["status"] == "clean"


# the seq a refusal reports: the bad record's own (2) unless it has no readable one
_REFUSED_SEQ: dict[str, int | None] = {
    "malformed-record": None,
    "invalid-seq": None,
    "duplicate-seq": 1,
    "sequence-gap": 3,
}


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
    _journal_refusal(tmp_path, bad + b"\n", reason, _REFUSED_SEQ.get(reason, 2))


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


# -- the refusal's detail is part of the message an operator reads (issue 20) -------------------


def refused_message(path: Path) -> tuple[dict[str, Any], str]:
    with pytest.raises(CheckpointRecoveryError) as info:
        load_checkpoint(path)
    return dict(info.value.report["refusal"]), str(info.value)


OK_OP = {"agent_id": "a", "status": "completed", "response": 1}


@pytest.mark.parametrize(
    ("kind", "entry", "detail"),
    [
        ("op", ["a"], "entry is not an object"),
        (
            "op",
            {"agent_id": "", "status": "completed", "response": 1},
            "agent_id missing or not a string",
        ),
        (
            "spawn",
            {"node_id": 5, "status": "completed", "response": 1},
            "node_id missing or not a string",
        ),
        ("op", {"agent_id": "a", "status": "completed"}, "response missing"),
        (
            "op",
            {"agent_id": "a", "status": "pending", "response": None},
            "unsupported status 'pending': not completed or failed",
        ),
        (
            "spawn",
            {"node_id": "n", "status": "done", "response": 1},
            "unsupported status 'done': not completed or failed, nor pending",
        ),
        (
            "spawn",
            {"node_id": "n", "status": "pending", "response": "r"},
            "a pending entry carries a response",
        ),
        ({**OK_OP, "result_digest": 5}, None, "result_digest is not a string"),
        ({**OK_OP, "spawned_ids": "n1"}, None, "spawned_ids is not a list of distinct node ids"),
        (
            {**OK_OP, "spawned_ids": ["n1", 2]},
            None,
            "spawned_ids is not a list of distinct node ids",
        ),
        (
            {**OK_OP, "spawned_ids": ["n1", ""]},
            None,
            "spawned_ids is not a list of distinct node ids",
        ),
        (
            {**OK_OP, "spawned_ids": ["n1", "n1"]},
            None,
            "spawned_ids is not a list of distinct node ids",
        ),
    ]
    + [
        (
            "spawn",
            {"node_id": "n", "status": "completed", "response": 1, name: 7},
            f"{name} is not a string or null",
        )
        for name in ("operation", "assignee", "instruction", "parent_id", "spawn_id")
    ],
)
def test_check_entry_refusals_are_exact(kind: Any, entry: Any, detail: str) -> None:
    if entry is None:  # an op entry given whole in the first column
        kind, entry = "op", kind
    with pytest.raises(_InvalidError) as info:
        check_entry(kind, entry)
    assert (info.value.reason, info.value.detail) == ("invalid-entry", detail)


@pytest.mark.parametrize(
    ("kind", "entry"),
    [
        ("op", {"agent_id": "a", "status": "failed", "response": None}),
        ("spawn", {"node_id": "n", "status": "failed", "response": None}),
        ("spawn", {"node_id": "n", "status": "pending", "response": None}),
        ("op", {**OK_OP, "result_digest": "blake2b:00", "spawned_ids": ["n1", "n2"]}),
        ("op", {**OK_OP, "spawned_ids": []}),
        ("op", {**OK_OP, "operation": 7}),  # only spawned entries carry the optional text
        (
            "spawn",
            {
                "node_id": "n",
                "status": "completed",
                "response": 1,
                "operation": None,
                "spawn_id": "f",
            },
        ),
    ],
)
def test_check_entry_accepts(kind: str, entry: dict[str, Any]) -> None:
    check_entry(kind, entry)


def test_a_spawned_ids_member_in_a_journal_entry_is_checked(tmp_path: Path) -> None:
    bad = rec(2, entry={**OK_OP, "spawned_ids": ["x", "x"]})
    refusal, message = refused_message(unit(tmp_path, base(), line(rec(1)), line(bad)))
    assert refusal["reason"] == "invalid-entry"
    assert message.endswith(": spawned_ids is not a list of distinct node ids")


@pytest.mark.parametrize(
    ("doc", "reason", "entry", "detail"),
    [
        (base(version=5), "unsupported-version", None, None),
        (base(version=True), "unsupported-version", None, None),
        (base(journal_seq=3), "invalid-base", None, "journal_seq is not 0"),
        (base(journal_seq=False), "invalid-base", None, "journal_seq is not 0"),
        (base(ops=[]), "invalid-base", None, "member 'ops' missing or mistyped"),
        (base(prompt=None), "invalid-base", None, "member 'prompt' missing or mistyped"),
        (base(max_spawn="20"), "invalid-base", None, "max_spawn mistyped"),
        (base(max_spawn=True), "invalid-base", None, "max_spawn mistyped"),
        (
            base(ops={"a": {**OK_OP, "agent_id": "b"}}),
            "invalid-base",
            {"kind": "op", "agent_id": "a"},
            "an ops key differs from its agent_id",
        ),
        (
            base(ops={"k": {"status": "completed", "response": 1}}),
            "invalid-entry",
            {"kind": "op", "agent_id": "k"},
            "agent_id missing or not a string",
        ),
        (
            base(
                spawned=[{"node_id": "n", "status": "completed", "response": 1, "spawn_id": "f"}]
                * 2
            ),
            "invalid-base",
            {"kind": "spawn", "node_id": "n", "spawn_id": "f"},
            "a spawned node_id repeats",
        ),
        (
            base(spawned=[{"node_id": "n", "status": "completed", "response": 1, "assignee": 3}]),
            "invalid-entry",
            {"kind": "spawn", "node_id": "n", "spawn_id": None},
            "assignee is not a string or null",
        ),
        (
            base(
                spawned=[{"node_id": "n", "status": "pending", "response": None}, {"status": "x"}]
            ),
            "invalid-entry",
            {"kind": "spawn", "index": 1},
            "node_id missing or not a string",
        ),
    ],
)
def test_base_refusal_is_exact(
    tmp_path: Path, doc: Any, reason: str, entry: Any, detail: str | None
) -> None:
    refusal, message = refused_message(unit(tmp_path, doc, line(rec(1))))
    assert (refusal["reason"], refusal["entry"], refusal["file"]) == (
        reason,
        entry,
        "checkpoint.json",
    )
    assert message.startswith(f"checkpoint recovery refused: {reason}")
    if detail is None:
        assert message.endswith("(file='checkpoint.json')")
    else:
        assert message.endswith(f": {detail}")


def test_base_without_max_spawn_or_with_null_loads(tmp_path: Path) -> None:
    doc = base()
    del doc["max_spawn"]
    state, _ = load_checkpoint(unit(tmp_path, doc))
    assert "max_spawn" not in state
    state, _ = load_checkpoint(unit(tmp_path, base(max_spawn=None)))
    assert "max_spawn" not in state
    state, _ = load_checkpoint(unit(tmp_path, base(max_spawn=0)))
    assert state["max_spawn"] == 0


@pytest.mark.parametrize(
    ("bad", "reason", "detail"),
    [
        (b"[1,2]", "malformed-record", "not an object"),
        (
            line(rec(2, flow_context={"patch": [], "x": 1}))[:-1],
            "invalid-patch",
            "flow_context must be exactly {patch}",
        ),
        (
            line(rec(2, flow_context=[]))[:-1],
            "invalid-patch",
            "flow_context must be exactly {patch}",
        ),
        (
            line(rec(2, flow_context={"patch": [{"op": "move", "from": "/a", "path": "/b"}]}))[:-1],
            "invalid-patch",
            "op 0, path '/b': operation 'move' is not allowed",
        ),
        (
            line(rec(2, flow_context={"patch": [{"op": "remove", "path": "/missing"}]}))[:-1],
            "invalid-transition",
            "op 0, path '/missing': member 'missing' does not exist",
        ),
    ],
)
def test_journal_refusal_detail_is_exact(
    tmp_path: Path, bad: bytes, reason: str, detail: str
) -> None:
    refusal, message = refused_message(unit(tmp_path, base(), line(rec(1)), bad + b"\n"))
    assert (refusal["reason"], refusal["line"], refusal["file"]) == (
        reason,
        2,
        "checkpoint.json.journal",
    )
    assert message.endswith(f": {detail}")


def test_largest_seq_is_in_range(tmp_path: Path) -> None:
    # 2**63-1 is a valid seq (here out of order, so a gap); 2**63 is not a seq at all
    refusal, _ = refused_message(unit(tmp_path, base(), line(rec(2**63 - 1))))
    assert (refusal["reason"], refusal["seq"]) == ("sequence-gap", 2**63 - 1)
    refusal, _ = refused_message(unit(tmp_path, base(), line(rec(2**63))))
    assert (refusal["reason"], refusal["seq"]) == ("invalid-seq", None)


def test_base_that_is_not_an_object_is_an_unsupported_version() -> None:
    report = Report(default_file="checkpoint.json")
    with pytest.raises(CheckpointRecoveryError) as info:
        fold_unit(b"[3]", b"", report)
    assert info.value.report["refusal"]["reason"] == "unsupported-version"


def test_unreadable_base_or_journal_names_the_file(tmp_path: Path) -> None:
    unit(tmp_path, base())
    (tmp_path / "checkpoint.json.journal").unlink()
    (tmp_path / "checkpoint.json.journal").mkdir()  # not a regular file: refused, not read
    refusal, message = refused_message(tmp_path / "checkpoint.json")
    assert (refusal["reason"], refusal["file"]) == ("unreadable-journal", "checkpoint.json.journal")
    assert message.endswith("is not a regular file")
    (tmp_path / "checkpoint.json").unlink()
    (tmp_path / "checkpoint.json").mkdir()
    with pytest.raises(CheckpointRecoveryError) as info:  # the loader's own check, behind dispatch
        load_v3(str(tmp_path / "checkpoint.json"), Report())
    refusal = info.value.report["refusal"]
    assert (refusal["reason"], refusal["file"]) == ("unreadable-checkpoint", "checkpoint.json")
    assert str(info.value).endswith("is not a regular file")


def test_missing_journal_names_the_journal_file(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.json").write_text(json.dumps(base()))
    refusal, message = refused_message(tmp_path / "checkpoint.json")
    assert (refusal["reason"], refusal["file"]) == ("missing-journal", "checkpoint.json.journal")
    assert message == (
        "checkpoint recovery refused: missing-journal (file='checkpoint.json.journal')"
    )


# -- fold_unit on its own: the loader's checks, not only what dispatch and typing add -----------


def _fold_refusal(base_bytes: bytes, journal: bytes = b"") -> tuple[dict[str, Any], str]:
    with pytest.raises(CheckpointRecoveryError) as info:
        fold_unit(base_bytes, journal, Report())  # no default file: the loader names it
    return dict(info.value.report["refusal"]), str(info.value)


@pytest.mark.parametrize(
    ("base_bytes", "reason", "detail"),
    [
        (b"{", "malformed-json", None),
        (json.dumps(base(version=4)).encode(), "unsupported-version", None),
        (
            json.dumps(
                base(spawned=[{"node_id": "n", "status": "failed", "response": 1, "assignee": 3}])
            ).encode(),
            "invalid-entry",
            "assignee is not a string or null",
        ),
        (json.dumps(base(journal_seq=1)).encode(), "invalid-base", "journal_seq is not 0"),
    ],
)
def test_fold_unit_refuses_a_bad_base_naming_the_base_file(
    base_bytes: bytes, reason: str, detail: str | None
) -> None:
    refusal, message = _fold_refusal(base_bytes)
    assert (refusal["reason"], refusal["file"]) == (reason, "checkpoint.json")
    suffix = f" (file='checkpoint.json'): {detail}" if detail else " (file='checkpoint.json')"
    assert message.endswith(suffix), message


def test_fold_unit_refusal_without_detail_has_no_detail_suffix() -> None:
    text = '{"version":3,"generation":"G","generation":"G"}'.replace("G", GEN)
    _, message = _fold_refusal(text.encode())
    assert message == ("checkpoint recovery refused: duplicate-member (file='checkpoint.json')")


def test_refusal_of_the_first_record_reports_an_empty_valid_prefix(tmp_path: Path) -> None:
    report = refused(unit(tmp_path, base(), b"\n", line(rec(1))))
    assert (report["refusal"]["reason"], report["refusal"]["line"]) == ("malformed-record", 1)
    assert (report["valid_prefix_seq"], report["last_seq"], report["records_applied"]) == (0, 0, 0)
    assert report["discarded_tail_bytes"] == 0


def test_largest_seq_is_reported_for_an_otherwise_bad_record(tmp_path: Path) -> None:
    refusal, _ = refused_message(unit(tmp_path, base(), line(rec(2**63 - 1, kind="note"))))
    assert (refusal["reason"], refusal["seq"]) == ("unknown-kind", 2**63 - 1)


def _spawn(n: int, node: str, status: str, response: object) -> dict[str, Any]:
    entry = {"node_id": node, "status": status, "response": response, "spawn_id": f"f-{node}"}
    return rec(n, kind="spawn", entry=entry, flow_context={"patch": []})


def test_spawned_entries_are_replaced_in_place_and_appended_in_order(tmp_path: Path) -> None:
    known = {"node_id": "old", "status": "pending", "response": None}
    path = unit(
        tmp_path,
        base(spawned=[known]),
        line(_spawn(1, "new", "pending", None)),
        line(_spawn(2, "old", "completed", "o")),
        line(_spawn(3, "new", "failed", None)),
    )
    state, _ = load_checkpoint(path)
    assert [(e["node_id"], e["status"]) for e in state["spawned"]] == [
        ("old", "completed"),
        ("new", "failed"),
    ]
    assert (state["session_id"], state["prompt"], state["plan"], state["config"]) == (
        "s",
        "p",
        base()["plan"],
        {"max_ops": 0},
    )


def test_loading_closes_every_descriptor_it_opened(tmp_path: Path) -> None:
    path = unit(tmp_path, base(), line(rec(1)))
    fds = Path("/proc/self/fd")
    assert fds.is_dir(), "steerflow targets Linux: /proc/self/fd must exist"
    before = len(list(fds.iterdir()))
    for _ in range(5):
        load_checkpoint(path)
    assert len(list(fds.iterdir())) == before
