"""A version 4 compaction publishes the journal it replaces as a segment (decision 395).

The writer side: what a compaction names, what it no longer writes, a batch crossing the
count limit. The reader side: a journal segment's own rules, one refusal at a time (the
segment is edited, its length and digest restated and the manifest re-sealed, so each
case reaches the check it names).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ckpt_support import _disarm_faults, make_writer  # noqa: F401
from test_load_v4 import manifest, write_manifest

from steerflow import _faults
from steerflow.checkpoint import CheckpointRecoveryError, _v4, load_checkpoint

RESPONSE = "x" * 300  # an entry well above a journal line's own members


async def _write(run: Path, *, journals: bool) -> int:
    """Seven outcomes, compacting every 2: three compactions. Returns the bytes written."""
    w = make_writer(run, version=4, max_records=2, flow_context={"k": 0})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_v4, "PUBLISH_JOURNALS", journals)
        for i in range(7):
            await w.record(
                f"op{i % 3}", status="completed", response=f"{RESPONSE}{i}", flow_context={"k": i}
            )
            if i == 1:
                await w.record_spawned(
                    "n1", status="completed", response="s", parent_id=None, spawn_id="sp1"
                )
        await w.close()
    return w.bytes_written


def _unit(run: Path) -> Path:
    run.mkdir(mode=0o700)
    asyncio.run(_write(run, journals=True))
    return run


def test_a_compaction_names_its_journal_instead_of_copying_its_entries(tmp_path: Path) -> None:
    journals, entries = tmp_path / "journals", tmp_path / "entries"
    journals.mkdir(mode=0o700)
    entries.mkdir(mode=0o700)
    journal_bytes = asyncio.run(_write(journals, journals=True))
    entry_bytes = asyncio.run(_write(entries, journals=False))
    # The same logical state either way (the golden units check the same on committed files).
    (a, ra), (b, rb) = load_checkpoint(journals), load_checkpoint(entries)
    assert {k: v for k, v in a.items() if k != "generation"} == {
        k: v for k, v in b.items() if k != "generation"
    }
    assert ra["status"] == rb["status"] == "clean"
    refs = manifest(journals)["segments"]
    named = [r for r in refs if "journal" in r]
    assert len(named) == 3 and all(r["level"] == 0 for r in named)
    assert not [r for r in refs if "journal" not in r]  # no entry segment at all
    for ref in named:  # a segment is the journal's lines, all of the generation it names
        lines = (journals / ref["name"]).read_bytes().splitlines()
        assert {json.loads(x)["generation"] for x in lines} == {ref["journal"]}
        assert [json.loads(x)["seq"] for x in lines] == list(range(1, len(lines) + 1))
    assert not [r for r in manifest(entries)["segments"] if "journal" in r]
    # Each compacted outcome is written once (its journal line) instead of twice: the
    # entry segments' bytes are what the journal form saves, to the manifests' few bytes.
    copies = sum(len((entries / r["name"]).read_bytes()) for r in manifest(entries)["segments"])
    assert copies > 6 * len(RESPONSE)
    # (The manifests name each journal segment's generation: ~45 bytes a reference, six
    # references over the three compactions' manifests.)
    assert entry_bytes - copies <= journal_bytes < entry_bytes - copies + 6 * 50


async def test_a_batch_across_the_count_limit_is_journaled_not_folded(tmp_path: Path) -> None:
    w = make_writer(tmp_path, version=4, max_records=3)
    await w.flush()
    links: list[str] = []
    _faults.set_fault_hook(lambda step, when: links.append(step) if when == "after" else None)
    try:
        # One batch of ten: three lines fill the journal, the fourth reaches the limit, so
        # the three are written and the journal published as a segment; and so on. Where
        # version 3 folds the rest of the batch into its base, nothing here is copied.
        await asyncio.gather(
            *(
                w.record(f"op-{i}", status="completed", response=i, flow_context={"n": i})
                for i in range(10)
            )
        )
    finally:
        _faults.set_fault_hook(None)
    assert links.count("journal-segment-link") == 3
    assert links.count("segment-write") == 0  # no entry segment, no merge yet
    refs = manifest(tmp_path)["segments"]
    assert [("journal" in r, r["level"]) for r in refs] == [(True, 0)] * 3
    held = [
        [json.loads(x)["entry"]["agent_id"] for x in (tmp_path / r["name"]).read_bytes().split()]
        for r in refs
    ]
    assert held == [["op-0", "op-1", "op-2"], ["op-3", "op-4", "op-5"], ["op-6", "op-7", "op-8"]]
    lines = (tmp_path / "checkpoint.json.journal").read_bytes().splitlines()
    assert [(json.loads(x)["seq"], json.loads(x)["entry"]["agent_id"]) for x in lines] == [
        (1, "op-9")
    ]
    assert w.records_acknowledged == 10
    await w.close()
    state, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean" and list(state["ops"]) == [f"op-{i}" for i in range(10)]
    assert state["flow_context"] == {"n": 9}


def test_an_op_repeated_in_one_journal_segment_keeps_its_first_place(tmp_path: Path) -> None:
    async def write() -> None:
        w = make_writer(tmp_path, version=4, max_records=4)
        await w.record("a", status="failed", response="first")
        await w.record("b", status="completed", response="b")
        await w.record("a", status="completed", response="second")
        await w.record("c", status="completed", response="c")
        await w.record("d", status="completed", response="d")  # compacts the four above
        await w.close()

    asyncio.run(write())
    (ref,) = manifest(tmp_path)["segments"]
    ids = [
        json.loads(x)["entry"]["agent_id"] for x in (tmp_path / ref["name"]).read_bytes().split()
    ]
    assert ids == ["a", "b", "a", "c"]
    state, _ = load_checkpoint(tmp_path)
    assert list(state["ops"]) == ["a", "b", "c", "d"]
    assert state["ops"]["a"]["response"] == "second"


# -- the reader's rules ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _unit(tmp_path_factory.mktemp("v4j") / "run")


@pytest.fixture
def unit(template: Path, tmp_path: Path) -> Path:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(template, run)
    return run


def edit_journal_segment(run: Path, change: Callable[[list[bytes]], bytes]) -> str:
    """Replace the first journal segment's bytes; restate its length and digest."""
    doc = manifest(run)
    ref = next(r for r in doc["segments"] if "journal" in r)
    data = change((run / ref["name"]).read_bytes().splitlines(keepends=True))
    (run / ref["name"]).write_bytes(data)
    ref["bytes"], ref["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    write_manifest(run, doc)
    return str(ref["name"])


def refused(run: Path) -> tuple[dict[str, Any], str]:
    """The refusal's report and its message (which carries the detail)."""
    with pytest.raises(CheckpointRecoveryError) as info:
        load_checkpoint(run)
    found: dict[str, Any] = info.value.report["refusal"]
    return found, str(info.value)


def _record(line: bytes, **members: Any) -> bytes:
    rec = json.loads(line)
    rec.update(members)
    return json.dumps(rec, separators=(",", ":")).encode() + b"\n"


def test_the_unit_has_journal_segments_and_loads(unit: Path) -> None:
    state, report = load_checkpoint(unit)
    assert report["status"] == "clean" and list(state["ops"]) == ["op0", "op1", "op2"]
    assert state["ops"]["op0"]["response"] == f"{RESPONSE}6"
    assert [e["spawn_id"] for e in state["spawned"]] == ["sp1"]
    assert len([r for r in manifest(unit)["segments"] if "journal" in r]) >= 2


CASES: list[tuple[str, Callable[[list[bytes]], bytes], str, str]] = [
    (
        "torn",
        lambda lines: b"".join(lines)[:-1],
        "invalid-segment",
        "ends inside a record",
    ),
    (
        "not-json",
        lambda lines: b"{not json\n" + b"".join(lines[1:]),
        "invalid-segment",
        "record 1: malformed-record",
    ),
    (
        "bad-entry",
        lambda lines: _record(lines[0], entry={"agent_id": "op0"}) + b"".join(lines[1:]),
        "invalid-segment",
        "record 1: invalid-entry (response missing)",
    ),
    (
        "other-generation",
        lambda lines: _record(lines[0], generation="f" * 32) + b"".join(lines[1:]),
        "segment-identity",
        "record 1 is not record 1 of its journal",
    ),
    (
        "reordered",
        lambda lines: b"".join([lines[1], lines[0], *lines[2:]]),
        "segment-identity",
        "record 1 is not record 1 of its journal",
    ),
    (
        "version-3-record",
        lambda lines: _record(lines[0], version=3) + b"".join(lines[1:]),
        "invalid-segment",
        "record 1: unsupported-record-version",
    ),
]


@pytest.mark.parametrize(
    ("change", "reason", "detail"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_journal_segment_out_of_rule_is_refused_naming_it(
    unit: Path, change: Callable[[list[bytes]], bytes], reason: str, detail: str
) -> None:
    name = edit_journal_segment(unit, change)
    before = {p.name: p.read_bytes() for p in unit.iterdir() if p.is_file()}
    found, message = refused(unit)
    assert (found["reason"], found["file"]) == (reason, name)
    assert message.endswith(f"): {name!r} {detail}")
    # A refusal changes nothing.
    assert {p.name: p.read_bytes() for p in unit.iterdir() if p.is_file()} == before


def test_a_changed_byte_in_a_journal_segment_is_a_digest_mismatch(unit: Path) -> None:
    ref = next(r for r in manifest(unit)["segments"] if "journal" in r)
    path = unit / ref["name"]
    data = bytearray(path.read_bytes())
    data[data.index(b"xxx") + 1] = ord("y")
    path.write_bytes(bytes(data))
    found, _ = refused(unit)
    assert (found["reason"], found["file"]) == ("segment-digest-mismatch", ref["name"])


NOT_LEVEL_0 = "a journal segment is not level 0 with its records' generation"


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        (lambda r: r.update(level=1), NOT_LEVEL_0),
        (lambda r: r.update(journal="G" * 32), NOT_LEVEL_0),
        (lambda r: r.update(journal=None), NOT_LEVEL_0),
        (
            lambda r: r.update(extra=1),
            "a segment reference is not exactly ['bytes', 'journal', 'level', 'name', 'sha256']",
        ),
    ],
    ids=["level-1", "bad-generation", "null-generation", "extra-member"],
)
def test_a_journal_segment_reference_out_of_rule_is_refused(
    unit: Path, change: Callable[[dict[str, Any]], None], detail: str
) -> None:
    doc = manifest(unit)
    change(next(r for r in doc["segments"] if "journal" in r))
    write_manifest(unit, doc)
    found, message = refused(unit)
    assert (found["reason"], found["file"]) == ("invalid-manifest", "checkpoint.json")
    assert message.endswith(f": {detail}")


def test_intents_and_steps_in_a_journal_segment_are_not_folded_again(tmp_path: Path) -> None:
    """An intent closed before the compaction stays closed: the manifest says what is open."""

    async def write() -> None:
        w = make_writer(tmp_path, version=4, max_records=2)
        await w.record_call(
            "c" * 32, node="a", record="op", key="a", attempt=1, model="echo", started_at=1.0
        )
        await w.record("a", status="completed", response="r")
        await w.record_call(
            "d" * 32, node="b", record="op", key="b", attempt=1, model="echo", started_at=2.0
        )
        await w.record("z", status="completed", response="r")
        await w.record("y", status="completed", response="r")  # compacts: b still open
        await w.close()

    asyncio.run(write())
    (ref,) = manifest(tmp_path)["segments"]
    kinds = [json.loads(x)["kind"] for x in (tmp_path / ref["name"]).read_bytes().split()]
    assert kinds == ["intent", "op", "intent", "op"]
    state, report = load_checkpoint(tmp_path)
    assert report["status"] == "clean"
    assert [i["call_id"] for i in state["in_flight"]] == ["d" * 32]
    assert manifest(tmp_path)["in_flight"][0]["call_id"] == "d" * 32
