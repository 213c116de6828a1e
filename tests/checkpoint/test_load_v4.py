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

from steerflow.checkpoint import CheckpointRecoveryError, load_checkpoint
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
