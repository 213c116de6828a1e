"""The version 4 reader's rules, one refusal at a time (decision 340).

Units are written by the real writer (version 4, compacting every 2 records), then one
member of the manifest or of a segment is changed and the manifest re-sealed (and a
changed segment's length and digest restated), so each case reaches exactly the check
it names instead of stopping at a digest.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ckpt_support import _disarm_faults, make_writer  # noqa: F401

from steerflow.checkpoint import CheckpointRecoveryError, _v4, load_checkpoint
from steerflow.checkpoint._load_v4 import seal_manifest, valid_segment_name
from steerflow.checkpoint._state import dumps_compact

MANIFEST = "checkpoint.json"
SEAL = ',"manifest_sha256":"'


def _unit(run: Path) -> Path:
    async def write() -> None:
        w = make_writer(run, version=4, max_records=2, flow_context={"k": 0})
        for i in range(5):
            await w.record(
                f"op{i % 3}", status="completed", response=f"r{i}", flow_context={"k": i}
            )
            if i == 0:  # early: compacted into a segment
                await w.record_spawned(
                    "n1", status="completed", response="s", parent_id=None, spawn_id="sp1"
                )
        await w.close()

    run.mkdir(mode=0o700, exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        # Entry segments only (the form before decision 395, still read): the cases below
        # edit a segment's JSON; the journal form's own rules are test_v4_journal_segments.
        patch.setattr(_v4, "PUBLISH_JOURNALS", False)
        asyncio.run(write())
    return run


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _unit(tmp_path_factory.mktemp("v4") / "run")


@pytest.fixture
def unit(template: Path, tmp_path: Path) -> Path:
    """A private copy of the module's unit (written once: the writer is the slow part)."""
    run = tmp_path / "run"
    shutil.copytree(template, run)
    return run


def manifest(run: Path) -> dict[str, Any]:
    text = (run / MANIFEST).read_text()
    cut = text.rindex(SEAL)
    doc: dict[str, Any] = json.loads(text[:cut] + "}")
    return doc


def write_manifest(run: Path, doc: dict[str, Any]) -> None:
    (run / MANIFEST).write_bytes(seal_manifest(dumps_compact(doc)))


def edit_manifest(run: Path, change: Callable[[dict[str, Any]], None]) -> None:
    doc = manifest(run)
    change(doc)
    write_manifest(run, doc)


def edit_segment(run: Path, which: int, change: Callable[[dict[str, Any]], Any]) -> str:
    """Change segment ``which`` (-1: meta) and restate its length and digest; its name."""
    doc = manifest(run)
    ref = doc["meta"] if which < 0 else doc["segments"][which]
    seg = json.loads((run / ref["name"]).read_bytes())
    replaced = change(seg)
    data = replaced if isinstance(replaced, bytes) else json.dumps(seg).encode()
    (run / ref["name"]).write_bytes(data)
    ref["bytes"], ref["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    write_manifest(run, doc)
    return str(ref["name"])


def refusal(run: Path) -> dict[str, Any]:
    with pytest.raises(CheckpointRecoveryError) as info:
        load_checkpoint(run)
    found: dict[str, Any] = info.value.report["refusal"]
    return found


def test_the_unit_loads_and_its_manifest_is_small(unit: Path) -> None:
    state, report = load_checkpoint(unit)
    assert report["checkpoint_version"] == 4 and report["status"] == "clean"
    assert list(state["ops"]) == ["op0", "op1", "op2"]
    assert state["ops"]["op1"]["response"] == "r4" and state["ops"]["op0"]["response"] == "r3"
    assert state["flow_context"] == {"k": 4}
    doc = manifest(unit)
    assert len(doc["segments"]) >= 2 and "plan" not in doc and "ops" not in doc
    # Re-sealing an unchanged manifest gives the same bytes (the seal is over them).
    assert seal_manifest(dumps_compact(doc)) == (unit / MANIFEST).read_bytes()


@pytest.mark.parametrize(
    ("change", "reason", "detail"),
    [
        (lambda d: d.update(extra=1), "invalid-manifest", "unknown members ['extra']"),
        (lambda d: d.pop("segments"), "invalid-manifest", "missing ['segments']"),
        (lambda d: d.pop("meta"), "invalid-manifest", "missing ['meta']"),
        (lambda d: d.pop("flow_context"), "invalid-manifest", "missing ['flow_context']"),
        (lambda d: d.pop("generation"), "invalid-manifest", "missing ['generation']"),
        (lambda d: d.pop("journal_seq"), "invalid-manifest", "missing ['journal_seq']"),
        (lambda d: d.update(generation="G" * 32), "invalid-generation", ""),
        (lambda d: d.update(journal_seq=1), "invalid-base", "journal_seq is not 0"),
        (lambda d: d.update(journal_seq=False), "invalid-base", "journal_seq is not 0"),
        (
            lambda d: d.update(flow_context=[]),
            "invalid-base",
            "member 'flow_context' missing or mistyped",
        ),
        (lambda d: d.update(segments={}), "invalid-manifest", "segments is not a list"),
        (
            lambda d: d["meta"].update(level=0),
            "invalid-manifest",
            "a segment reference is not exactly ['bytes', 'name', 'sha256']",
        ),
        (
            lambda d: d["meta"].pop("sha256"),
            "invalid-manifest",
            "a segment reference is not exactly ['bytes', 'name', 'sha256']",
        ),
        (
            lambda d: d["meta"].update(name="../checkpoint.json.seg." + "0" * 32),
            "invalid-manifest",
            "a segment name is not seg.<32 hex>",
        ),
        (
            lambda d: d["meta"].update(name=d["meta"]["name"].upper()),
            "invalid-manifest",
            "a segment name is not seg.<32 hex>",
        ),
        (
            lambda d: d["meta"].update(name=d["meta"]["name"] + "0"),
            "invalid-manifest",
            "a segment name is not seg.<32 hex>",
        ),
        (
            lambda d: d["meta"].update(bytes=-1),
            "invalid-manifest",
            "a segment length is not a count",
        ),
        (
            lambda d: d["meta"].update(bytes=True),
            "invalid-manifest",
            "a segment length is not a count",
        ),
        (
            lambda d: d["meta"].update(bytes="1"),
            "invalid-manifest",
            "a segment length is not a count",
        ),
        (
            lambda d: d["meta"].update(sha256="0" * 63),
            "invalid-manifest",
            "a segment digest is not 64 hex",
        ),
        (
            lambda d: d["meta"].update(sha256="A" * 64),
            "invalid-manifest",
            "a segment digest is not 64 hex",
        ),
        (
            lambda d: d["meta"].update(sha256=None),
            "invalid-manifest",
            "a segment digest is not 64 hex",
        ),
        (
            lambda d: d["segments"][0].pop("level"),
            "invalid-manifest",
            "a segment reference is not exactly ['bytes', 'level', 'name', 'sha256']",
        ),
        (
            lambda d: d["segments"][0].update(level=-1),
            "invalid-manifest",
            "a segment level is not 0..64",
        ),
        (
            lambda d: d["segments"][0].update(level=65),
            "invalid-manifest",
            "a segment level is not 0..64",
        ),
        (
            lambda d: d["segments"][0].update(level=True),
            "invalid-manifest",
            "a segment level is not 0..64",
        ),
        (
            lambda d: d["segments"].append(dict(d["segments"][0])),
            "invalid-manifest",
            "a segment is named twice",
        ),
        (
            lambda d: d["segments"].append({**d["meta"], "level": 0}),
            "invalid-manifest",
            "a segment is named twice",
        ),
        (
            lambda d: d["segments"].append("x"),
            "invalid-manifest",
            "a segment reference is not exactly ['bytes', 'level', 'name', 'sha256']",
        ),
        (
            lambda d: d["segments"][0].update(bytes=d["segments"][0]["bytes"] + 1),
            "segment-digest-mismatch",
            "differs from the length and digest named",
        ),
        (
            lambda d: d["segments"][0].update(sha256="0" * 64),
            "segment-digest-mismatch",
            "differs from the length and digest named",
        ),
        (  # 0 is a count: the segment is then refused as differing from it
            lambda d: d["segments"][0].update(bytes=0),
            "segment-digest-mismatch",
            "differs from the length and digest named",
        ),
        (lambda d: d["segments"].reverse(), "sequence-gap", ""),
    ],
)
def test_a_manifest_member_out_of_rule_is_refused(
    unit: Path, change: Callable[[dict[str, Any]], None], reason: str, detail: str
) -> None:
    if reason == "sequence-gap":  # reordered segments are valid: the fold order changes
        edit_manifest(unit, change)
        state, _ = load_checkpoint(unit)
        assert state["ops"]["op1"]["response"] != "r4" or list(state["ops"]) != [
            "op0",
            "op1",
            "op2",
        ]
        return
    edit_manifest(unit, change)
    before = {p.name: p.read_bytes() for p in unit.iterdir() if p.is_file()}
    with pytest.raises(CheckpointRecoveryError) as info:
        load_checkpoint(unit)
    found = info.value.report["refusal"]
    assert found["reason"] == reason
    # the exact text (a segment's is preceded by its name)
    assert str(info.value).endswith((f": {detail}", f"' {detail}") if detail else ")")
    assert found["file"] == MANIFEST or found["file"].startswith(MANIFEST + ".seg.")
    assert {p.name: p.read_bytes() for p in unit.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("level", [0, 64])
def test_levels_0_to_64_are_accepted(unit: Path, level: int) -> None:
    edit_manifest(unit, lambda d: d["segments"][0].update(level=level))
    assert load_checkpoint(unit)[1]["status"] == "clean"


def test_the_seal_covers_every_byte(unit: Path) -> None:
    data = (unit / MANIFEST).read_bytes()
    (unit / MANIFEST).write_bytes(data.replace(b'"journal_seq":0', b'"journal_seq": 0'))
    assert refusal(unit)["reason"] == "manifest-digest-mismatch"
    (unit / MANIFEST).write_bytes(data[: data.rindex(SEAL.encode())] + b"}")
    assert refusal(unit)["reason"] == "invalid-manifest"
    (unit / MANIFEST).write_bytes(data.replace(b'"}', b'" }'))
    assert refusal(unit)["reason"] == "invalid-manifest"
    (unit / MANIFEST).write_bytes(b'{"version":4,' + data[1:])
    assert refusal(unit)["reason"] in ("manifest-digest-mismatch", "ambiguous-version")


def test_duplicates_and_non_finite_numbers_in_the_manifest(unit: Path) -> None:
    body = manifest(unit)
    text = dumps_compact(body)
    dup = text[:-1] + b',"journal_seq":0}'
    (unit / MANIFEST).write_bytes(seal_manifest(dup))
    assert refusal(unit)["reason"] == "duplicate-member"
    nan = re.sub(rb'"flow_context":\{"k":\d+\}', b'"flow_context":{"k":NaN}', text)
    assert nan != text
    (unit / MANIFEST).write_bytes(seal_manifest(nan))
    assert refusal(unit)["reason"] == "non-finite-number"


@pytest.mark.parametrize(
    ("which", "change", "reason", "message"),
    [
        (
            0,
            lambda s: s.update(version=3),
            "invalid-segment",
            "invalid-segment (file='NAME'): 'NAME' is not a version 4 segment",
        ),
        (
            0,
            lambda s: s.update(version=True),
            "invalid-segment",
            "invalid-segment (file='NAME'): 'NAME' is not a version 4 segment",
        ),
        (
            0,
            lambda s: s.update(segment="0" * 32),
            "segment-identity",
            "segment-identity (file='NAME'): 'NAME' holds another segment",
        ),
        (
            0,
            lambda s: s.update(extra=1),
            "invalid-segment",
            "invalid-segment (file='NAME'): 'NAME' is not exactly "
            "['ops', 'segment', 'spawned', 'version']",
        ),
        (
            0,
            lambda s: s.pop("spawned"),
            "invalid-segment",
            "invalid-segment (file='NAME'): 'NAME' is not exactly "
            "['ops', 'segment', 'spawned', 'version']",
        ),
        (
            0,
            lambda s: s.update(ops=[]),
            "invalid-segment",
            "invalid-segment (file='NAME'): 'NAME': ops or spawned mistyped",
        ),
        (
            0,
            lambda s: s.update(spawned={}),
            "invalid-segment",
            "invalid-segment (file='NAME'): 'NAME': ops or spawned mistyped",
        ),
        (
            -1,
            lambda s: s.update(version=3),
            "invalid-segment",
            "invalid-segment (file='NAME'): 'NAME' is not a version 4 segment",
        ),
        (
            -1,
            lambda s: s.pop("plan"),
            "invalid-segment",
            "invalid-segment (file='NAME'): 'NAME': its members are not D4's",
        ),
        (
            -1,
            lambda s: s.update(extra=1),
            "invalid-segment",
            "invalid-segment (file='NAME'): 'NAME': its members are not D4's",
        ),
        (
            -1,
            lambda s: s.update(segment="f" * 32),
            "segment-identity",
            "segment-identity (file='NAME'): 'NAME' holds another segment",
        ),
        (0, lambda s: b"{", "malformed-json", "malformed-json (file='NAME'): 'NAME' is not JSON"),
        (
            0,
            lambda s: b"[]",
            "invalid-segment",
            "invalid-segment (file='NAME'): 'NAME' is not a version 4 segment",
        ),
        (
            0,
            lambda s: json.dumps(s).replace('"ops"', '"ops": {}, "ops"', 1).encode(),
            "duplicate-member",
            "duplicate-member (file='NAME'): 'NAME' repeats a member name",
        ),
        (
            0,
            lambda s: (
                json.dumps(s)
                .replace('"r', '"', 1)
                .replace('"response": "', '"response": NaN, "x": "', 1)
                .encode()
            ),
            "non-finite-number",
            "non-finite-number (file='NAME'): 'NAME' holds NaN or an infinity",
        ),
    ],
)
def test_a_segment_out_of_rule_is_refused_naming_it(
    unit: Path, which: int, change: Callable[[dict[str, Any]], Any], reason: str, message: str
) -> None:
    name = edit_segment(unit, which, change)
    with pytest.raises(CheckpointRecoveryError) as info:
        load_checkpoint(unit)
    found = info.value.report["refusal"]
    assert (found["reason"], found["file"]) == (reason, name)
    assert str(info.value) == "checkpoint recovery refused: " + message.replace("NAME", name)


def test_an_entry_in_a_segment_is_validated(unit: Path) -> None:
    def bad(seg: dict[str, Any]) -> None:
        key = next(iter(seg["ops"]))
        seg["ops"][key]["status"] = "weird"

    edit_segment(unit, len(manifest(unit)["segments"]) - 1, bad)
    assert refusal(unit)["reason"] == "invalid-entry"


def test_spawned_upserts_keep_their_place_and_repeats_in_one_segment_are_refused(
    unit: Path,
) -> None:
    refs = manifest(unit)["segments"]
    docs = [json.loads((unit / ref["name"]).read_bytes()) for ref in refs]
    last = next(i for i, doc in enumerate(docs) if doc["spawned"])
    spawned = docs[last]["spawned"]
    assert [e["node_id"] for e in spawned] == ["n1"]

    def add_twice(seg: dict[str, Any]) -> None:
        seg["spawned"] = [spawned[0], spawned[0]]

    edit_segment(unit, last, add_twice)
    assert refusal(unit)["reason"] == "invalid-segment"

    def no_id(seg: dict[str, Any]) -> None:
        seg["spawned"] = [{"status": "completed"}]

    edit_segment(unit, last, no_id)
    assert refusal(unit)["reason"] == "invalid-entry"


def test_a_later_segment_wins_and_the_first_place_is_kept(tmp_path: Path) -> None:
    run = _unit(tmp_path / "r")
    doc = manifest(run)
    seen: dict[str, int] = {}
    for index, ref in enumerate(doc["segments"]):
        for key in json.loads((run / ref["name"]).read_bytes())["ops"]:
            seen.setdefault(key, index)
    state, _ = load_checkpoint(run)
    assert list(state["ops"]) == sorted(seen, key=lambda k: (seen[k], k))
    assert state["ops"]["op0"]["response"] == "r3"  # upserted in a later segment


def test_a_missing_segment_is_named(unit: Path) -> None:
    name = manifest(unit)["segments"][0]["name"]
    (unit / name).unlink()
    found = refusal(unit)
    assert (found["reason"], found["file"]) == ("missing-segment", name)


def test_a_symlinked_segment_is_not_followed(unit: Path, tmp_path: Path) -> None:
    name = manifest(unit)["segments"][0]["name"]
    (tmp_path / "elsewhere").write_bytes((unit / name).read_bytes())
    (unit / name).unlink()
    (unit / name).symlink_to(tmp_path / "elsewhere")
    found = refusal(unit)
    assert (found["reason"], found["file"]) == ("unreadable-segment", name)


def test_segment_names() -> None:
    assert valid_segment_name("checkpoint.json.seg." + "0a" * 16)
    for bad in (
        "checkpoint.json.seg." + "0A" * 16,
        "checkpoint.json.seg." + "0" * 31,
        "x",
        3,
        None,
    ):
        assert not valid_segment_name(bad)


def test_a_seal_that_does_not_match_says_why(unit: Path) -> None:
    data = (unit / MANIFEST).read_bytes()
    for spoiled, message in [
        (
            data.replace(b'"journal_seq":0', b'"journal_seq": 0'),
            "manifest-digest-mismatch (file='checkpoint.json'): "
            "the manifest differs from its digest",
        ),
        (
            data[: data.rindex(SEAL.encode())] + b"}",
            "invalid-manifest (file='checkpoint.json'): the manifest does not end with its digest",
        ),
    ]:
        (unit / MANIFEST).write_bytes(spoiled)
        with pytest.raises(CheckpointRecoveryError) as info:
            load_checkpoint(unit)
        assert str(info.value) == "checkpoint recovery refused: " + message


def test_a_bad_entry_in_a_segment_is_named_by_its_ids_in_checkpoint_json(unit: Path) -> None:
    """Decision 387: the entry's ids say where it is; ``file`` stays the logical file."""

    def bad(seg: dict[str, Any]) -> None:
        seg["ops"]["op1"]["status"] = "weird"

    last = len(manifest(unit)["segments"]) - 1
    name = edit_segment(unit, last, bad)
    assert name.startswith(MANIFEST + ".seg.")
    with pytest.raises(CheckpointRecoveryError) as info:
        load_checkpoint(unit)
    assert info.value.report["refusal"] == {
        "reason": "invalid-entry",
        "seq": None,
        "line": None,
        "byte_offset": None,
        "file": MANIFEST,
        "entry": {"kind": "op", "agent_id": "op1"},
    }
    assert str(info.value) == (
        "checkpoint recovery refused: invalid-entry at planned node 'op1' "
        "(file='checkpoint.json'): unsupported status 'weird': not completed or failed"
    )


def _spawn_segment(run: Path) -> int:
    refs = manifest(run)["segments"]
    docs = [json.loads((run / ref["name"]).read_bytes()) for ref in refs]
    return next(i for i, doc in enumerate(docs) if doc["spawned"])


@pytest.mark.parametrize(
    ("spawned", "reason", "detail"),
    [
        (lambda e: ["x"], "invalid-entry", "a spawned entry without node_id"),
        (lambda e: [{**e, "node_id": 7}], "invalid-entry", "a spawned entry without node_id"),
        (lambda e: [e, e], "invalid-segment", "a node_id repeats"),
    ],
)
def test_a_bad_spawned_list_is_refused_naming_the_segment(
    unit: Path, spawned: Callable[[dict[str, Any]], list[Any]], reason: str, detail: str
) -> None:
    def change(seg: dict[str, Any]) -> None:
        seg["spawned"] = spawned(seg["spawned"][0])

    name = edit_segment(unit, _spawn_segment(unit), change)
    with pytest.raises(CheckpointRecoveryError) as info:
        load_checkpoint(unit)
    assert (info.value.report["refusal"]["reason"], info.value.report["refusal"]["file"]) == (
        reason,
        name,
    )
    assert str(info.value) == (
        f"checkpoint recovery refused: {reason} (file={name!r}): {name!r}: {detail}"
    )


def _spawned_in(run: Path, ref: dict[str, Any]) -> list[Any]:
    """The spawned entries a segment holds, in either form (decision 395)."""
    data = (run / ref["name"]).read_bytes()
    if "journal" in ref:
        records = [json.loads(line) for line in data.splitlines()]
        return [r["entry"] for r in records if r["kind"] == "spawn"]
    spawned: list[Any] = json.loads(data)["spawned"]
    return spawned


@pytest.mark.parametrize("journals", [True, False], ids=["journal-segments", "entry-segments"])
def test_a_spawned_node_rewritten_in_a_later_segment_keeps_its_place(
    tmp_path: Path, journals: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer replaces a spawned node by ``node_id``; the fold does what it wrote."""
    monkeypatch.setattr(_v4, "PUBLISH_JOURNALS", journals)

    async def write() -> None:
        w = make_writer(tmp_path, version=4, max_records=2)
        await w.record_spawned("n1", status="failed", response="e", parent_id=None)
        await w.record_spawned("n2", status="completed", response="b", parent_id=None)
        await w.record("a", status="completed", response="r")
        await w.record("b", status="completed", response="r")
        await w.record_spawned("n1", status="completed", response="ok", parent_id=None)
        await w.record("c", status="completed", response="r")
        await w.record("d", status="completed", response="r")
        await w.close()

    asyncio.run(write())
    holding = [
        ref["name"]
        for ref in manifest(tmp_path)["segments"]
        if any(e["node_id"] == "n1" for e in _spawned_in(tmp_path, ref))
    ]
    assert len(holding) == 2  # n1 is in two segments: the fold upserts it
    state, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean"
    assert [(e["node_id"], e["status"], e["response"]) for e in state["spawned"]] == [
        ("n1", "completed", "ok"),
        ("n2", "completed", "b"),
    ]


def test_intents_and_steps_in_the_manifest_are_loaded_as_written(tmp_path: Path) -> None:
    """A compaction moves open call intents and a tool loop's steps into the manifest."""
    intent, open_call = "a" * 32, "b" * 32
    steps = [
        {"node": "a", "record": "op", "key": "a", "index": 1, "type": "model",
         "call_id": intent, "status": "completed",
         "data": {"text": "", "tool_calls": [{"call_id": "c1", "name": "add", "args": {}}]}},
        {"node": "a", "record": "op", "key": "a", "index": 2, "type": "tool",
         "call_id": "c1", "status": "in_flight", "data": {"tool": "add", "args": {}}},
    ]  # fmt: skip

    async def write() -> None:
        w = make_writer(tmp_path, version=4, max_records=1)
        for call_id, node in ((intent, "a"), (open_call, "b")):
            await w.record_call(call_id, node=node, record="op", key=node, attempt=1,
                                model="script:x", started_at=1.0)  # fmt: skip
        for step in steps:
            await w.record_step(step)
        await w.record("c", status="completed", response="C")  # compacts
        await w.record("d", status="completed", response="D")
        await w.close()

    asyncio.run(write())
    doc = manifest(tmp_path)
    assert set(doc) >= {"in_flight", "steps"}
    state, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean"
    assert state["in_flight"] == doc["in_flight"]
    assert [entry["call_id"] for entry in state["in_flight"]] == [open_call]
    assert state["steps"] == doc["steps"]
    assert [{k: v for k, v in s.items() if k != "result_digest"} for s in state["steps"]] == steps


def test_a_meta_segment_without_max_spawn_loads_without_it(tmp_path: Path) -> None:
    async def write() -> None:
        w = make_writer(tmp_path, version=4, max_records=1, max_spawn=None)
        await w.record("a", status="completed", response="A")
        await w.record("b", status="completed", response="B")
        await w.close()

    asyncio.run(write())
    meta = json.loads((tmp_path / manifest(tmp_path)["meta"]["name"]).read_bytes())
    assert "max_spawn" not in meta
    state, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean" and "max_spawn" not in state
    assert list(state["ops"]) == ["a", "b"]
