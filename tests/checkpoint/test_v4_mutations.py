"""A mutated version 4 unit is refused, typed, never resumed as something else (decision 340).

The corpus: the committed ``v4-compacted`` golden unit and a unit written here whose
segments were merged (fanout 2), each mutated one way at a time: every byte of the
manifest and of every segment flipped, each file truncated by one byte or emptied, each
segment deleted, two segments' names swapped, a segment replaced by another's bytes,
the journal deleted.  Every load must either raise ``CheckpointRecoveryError`` (a
typed refusal with a reason) or give exactly the unmutated state (never the case here:
every byte but the journal's is covered by a digest); a refusal leaves the files as
they were.  The count of silent wrong loads is printed and must be 0.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ckpt_support import _disarm_faults, make_writer  # noqa: F401

from golden import make_golden
from steerflow.checkpoint import CheckpointRecoveryError, _v4, load_checkpoint

GOLDEN = Path(make_golden.__file__).resolve().parent
SEG = "checkpoint.json.seg."

Mutation = tuple[str, Callable[[Path], None]]


def _flip(name: str, at: int) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        data = bytearray((run / name).read_bytes())
        data[at] ^= 0x20  # a letter's case, a digit into a control byte, a quote into "\x02"
        (run / name).write_bytes(bytes(data))

    return apply


def _truncate(name: str, keep: int) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        data = (run / name).read_bytes()
        (run / name).write_bytes(data[:keep])

    return apply


def _delete(name: str) -> Callable[[Path], None]:
    return lambda run: (run / name).unlink()


def _swap(a: str, b: str) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        os.rename(run / a, run / "swap.tmp")
        os.rename(run / b, run / a)
        os.rename(run / "swap.tmp", run / b)

    return apply


def _copy_over(src: str, dst: str) -> Callable[[Path], None]:
    return lambda run: (run / dst).write_bytes((run / src).read_bytes())


def mutations(run: Path, step: int) -> Iterator[Mutation]:
    """Every ``step``-th byte of each file flipped (offset by the file's index), and the rest."""
    names = sorted(p.name for p in run.iterdir() if p.name.startswith(SEG))
    for index, name in enumerate(["checkpoint.json", *names]):
        size = (run / name).stat().st_size
        for at in range(index % step, size, step):
            yield f"flip {name}@{at}", _flip(name, at)
        if step > 1:  # the sample keeps the ends, where the seal and closing braces are
            for at in {0, size - 2, size - 1} - set(range(index % step, size, step)):
                yield f"flip {name}@{at}", _flip(name, at)
        yield f"truncate {name}", _truncate(name, size - 1)
        yield f"empty {name}", _truncate(name, 0)
    for name in names:
        yield f"delete {name}", _delete(name)
    for a, b in itertools.pairwise(names):
        yield f"swap {a} {b}", _swap(a, b)
        yield f"copy {a} over {b}", _copy_over(a, b)
    yield "delete journal", _delete("checkpoint.json.journal")


def _snapshot(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}


def _restore(run: Path, original: dict[str, bytes]) -> None:
    """Put ``run`` back as ``original`` says, rewriting only what a mutation changed."""
    for path in run.iterdir():
        if path.name not in original:
            path.unlink()
    for name, data in original.items():
        path = run / name
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)


def campaign(unit: Path, step: int) -> tuple[int, list[str], dict[str, int]]:
    """(mutations tried, silent wrong ones, refusals by reason); ``unit`` is restored."""
    expected = load_checkpoint(unit)[0]
    original = _snapshot(unit)
    tried, silent = 0, []
    reasons: dict[str, int] = {}
    run = unit
    for label, mutate in list(mutations(unit, step)):
        _restore(run, original)
        mutate(run)
        before = _snapshot(run)
        tried += 1
        try:
            state, _ = load_checkpoint(run)
        except CheckpointRecoveryError as exc:
            reason = exc.report["refusal"]["reason"]
            reasons[reason] = reasons.get(reason, 0) + 1
            assert _snapshot(run) == before, f"{label}: the refusal changed the files"
            continue
        if state != expected:
            silent.append(label)
    _restore(run, original)
    return tried, silent, reasons


def _merged_unit(run: Path) -> Path:
    async def write() -> None:
        writer = make_writer(run, version=4, max_records=2)
        for i in range(9):
            await writer.record(
                f"n{i % 6}", status="completed", response=f"r{i}", flow_context={"i": i}
            )
            if i % 3 == 0:
                await writer.record_spawned(
                    f"s{i}", status="completed", response="x", parent_id=None, spawn_id=f"p{i}"
                )
        await writer.close()

    asyncio.run(write())
    return run


def _unit(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    unit = tmp_path / "unit"
    if source == "golden":
        run_id = make_golden.UNITS["v4-compacted"][0]
        shutil.copytree(GOLDEN / "v4-compacted" / "runs" / run_id, unit)
        shutil.rmtree(unit / "branches")
    else:
        monkeypatch.setattr(_v4, "SEGMENT_FANOUT", 2)
        unit.mkdir(mode=0o700)
        _merged_unit(unit)
        assert load_checkpoint(unit)[1]["status"] == "clean"
    assert len([p for p in unit.iterdir() if p.name.startswith(SEG)]) >= 2
    return unit


def _check(source: str, unit: Path, step: int) -> dict[str, int]:
    tried, silent, reasons = campaign(unit, step)
    print(f"{source}: {tried} mutated units, {len(silent)} silent wrong, refusals {reasons}")
    assert silent == []
    # The typed refusals only a version 4 reader gives are all reached.
    assert {"missing-segment", "segment-digest-mismatch", "manifest-digest-mismatch"} <= set(
        reasons
    )
    return reasons


@pytest.mark.parametrize("source", ["golden", "merged"])
def test_a_sample_of_mutated_v4_units_is_refused(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default-run sample of the slow sweep below: every 29th byte, the same checks."""
    _check(source, _unit(source, tmp_path, monkeypatch), 29)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["golden", "merged"])
def test_no_mutation_of_a_v4_unit_resumes_silently_wrong(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every byte of the manifest and of every segment flipped (5,397 units when written)."""
    _check(source, _unit(source, tmp_path, monkeypatch), 1)


def test_a_v3_reader_refuses_a_v4_unit_typed(tmp_path: Path) -> None:
    """What a reader without version 4 does with the manifest: ``unsupported-version``."""
    from steerflow.checkpoint._load_v3 import fold_unit
    from steerflow.checkpoint._report import Report

    unit = GOLDEN / "v4" / "runs" / make_golden.UNITS["v4"][0]
    report = Report(default_file="checkpoint.json")
    with pytest.raises(CheckpointRecoveryError) as info:
        fold_unit((unit / "checkpoint.json").read_bytes(), b"", report)
    assert info.value.report["refusal"]["reason"] == "unsupported-version"
