"""Identity substitution at every point the design record lists (ADR-0069 Am. 2, verif. 6).

A fault hook swaps one name for a *substitute* at an exact seam: a regular file with a
unique sentinel content, or a symlink to a pre-existing *victim* file (or directory).
Our own object is renamed aside, never deleted, so the test can tell what the writer
did to whom.  Points: right after creation (fallback path with named temporaries),
between publication and the first append, between later appends, the temporary source
just before publication, the base just before its exchange, the journal during its
retirement, after compaction, the staging directory (at creation and between appends),
directory resolution, and cleanup of the displaced object.

Asserted every time:

* no response or context byte (unique markers) reaches a substitute or a victim;
* victims and substitutes keep their exact bytes and are never unlinked (a foreign
  object the writer displaces is moved to ``quarantine.*`` in staging, intact);
* a mismatch raises ``PersistenceError`` and stops the writer (later records are
  refused), and the pin is not reset to the substitute;
* after ``reconcile()`` every acknowledged transition is recoverable through the
  published names, and the run completes with exactly the expected state.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from crash_support import (
    CTX_MARK,
    RESP_MARK,
    apply,
    expected_states,
    load_here,
    phase_of,
    project,
    transitions,
    writer_for,
)

from steerflow import _faults
from steerflow.checkpoint import _io
from steerflow.errors import PersistenceError

COUNT = 10
LIMITS = {"max_records": 3, "max_bytes": 1_400}
MARKS = (RESP_MARK.encode(), CTX_MARK.encode())
STAGING = ".checkpoint.json.staging"


@pytest.fixture(autouse=True)
def _disarm() -> Iterator[None]:
    _faults.disarm()
    yield
    _faults.disarm()


def _journal(run: Path) -> Path:
    return run / "checkpoint.json.journal"


def _base(run: Path) -> Path:
    return run / "checkpoint.json"


def _staging(run: Path) -> Path:
    return run / STAGING


def _temp(run: Path) -> Path:
    (temp,) = [p for p in _staging(run).iterdir() if p.name.endswith(".tmp")]
    return temp


def _displaced(run: Path) -> Path:
    return _temp(run)  # after an exchange our displaced object sits at the temp name


@dataclass(frozen=True)
class Scenario:
    """Swap ``target(run)`` at the first ``point`` hit in ``phase`` after ``after_acks``."""

    name: str
    point: str
    phase: str
    after_acks: int
    target: Callable[[Path], Path]
    raises: bool  # the operation that meets the substitute must fail (typed)
    fallback: bool = False  # named temporaries instead of O_TMPFILE
    directory: bool = False  # the target is a directory (staging, run dir)


SCENARIOS = [
    Scenario("created-temp-before-adoption", "after:journal-create", "compaction", 2,
             _temp, raises=True, fallback=True),
    Scenario("created-base-temp-before-adoption", "after:base-create", "compaction", 2,
             _temp, raises=True, fallback=True),
    Scenario("journal-after-publication", "after:journal-exchange", "initialization", 0,
             _journal, raises=True),
    Scenario("journal-before-first-base", "before:base-exchange", "initialization", 0,
             _journal, raises=True),
    Scenario("journal-between-appends", "before:journal-write", "append", 1,
             _journal, raises=True),
    Scenario("journal-after-compaction", "after:pin-close", "compaction", 2,
             _journal, raises=True),
    Scenario("temp-base-before-publication", "before:base-exchange", "compaction", 2,
             _temp, raises=True),
    Scenario("temp-journal-before-publication", "before:journal-exchange", "compaction", 2,
             _temp, raises=True),
    Scenario("base-before-exchange", "before:base-exchange", "compaction", 2,
             _base, raises=False),
    Scenario("journal-during-retirement", "before:journal-exchange", "compaction", 2,
             _journal, raises=False),
    Scenario("cleanup-displaced-object", "after:dir-fsync", "compaction", 2,
             _displaced, raises=False),
    Scenario("staging-between-appends", "before:journal-write", "append", 2,
             _staging, raises=False, directory=True),
]  # fmt: skip


class Attack:
    """Performs one substitution and remembers every foreign object it planted."""

    def __init__(self, root: Path, kind: str) -> None:
        self.kind = kind
        self.token = uuid.uuid4().hex
        self.victim = root / "victim.txt"
        self.victim_bytes = f"VICTIM-{self.token}".encode()
        self.victim.write_bytes(self.victim_bytes)
        self.victim_dir = root / "victim-dir"
        self.victim_dir.mkdir()
        (self.victim_dir / "keep").write_bytes(self.victim_bytes)
        self.subst_bytes = f"SUBST-{self.token}".encode()  # no LF: it would read as a torn tail
        self.done: list[Path] = []

    def swap(self, path: Path, directory: bool) -> None:
        if os.path.lexists(path):
            os.rename(path, path.with_name(path.name + ".ours-aside"))
        if self.kind == "file":
            path.write_bytes(self.subst_bytes)
        else:
            os.symlink(self.victim_dir if directory else self.victim, path)
        self.done.append(path)

    def check_foreign_objects(self, root: Path, *allowed: bytes) -> list[str]:
        """Victims intact; the substitute intact somewhere (maybe quarantined); no marks."""
        problems = []
        intact = (self.victim_bytes, self.subst_bytes, *allowed)
        if self.victim.read_bytes() != self.victim_bytes:
            problems.append("victim file changed")
        if sorted(os.listdir(self.victim_dir)) != ["keep"]:
            problems.append(f"victim dir changed: {os.listdir(self.victim_dir)}")
        if (self.victim_dir / "keep").read_bytes() != self.victim_bytes:
            problems.append("victim dir's file changed")
        substitutes = []
        for path in root.rglob("*"):
            if path.is_symlink() or not path.is_file():
                continue
            data = path.read_bytes()
            if self.token.encode() in data:
                if data not in intact:
                    problems.append(f"{path} (a foreign object) was written to")
                if any(mark in data for mark in MARKS):
                    problems.append(f"{path} received response/context bytes")
                if data == self.subst_bytes:
                    substitutes.append(path)
        if self.kind == "file" and self.done and not substitutes:
            problems.append("the substitute file was unlinked")
        return problems


async def run_scenario(root: Path, sc: Scenario, kind: str) -> tuple[Attack, list[str], int]:
    """Drive the script through the attack; returns (attack, problems, typed failures)."""
    run = root / "run"
    run.mkdir()
    attack = Attack(root, kind)
    expected = expected_states(COUNT)
    acks = [0]
    problems: list[str] = []
    when, step = sc.point.split(":")

    def hook(s: str, w: str) -> None:
        hit = (w, s) == (when, step) and not attack.done and acks[0] >= sc.after_acks
        if hit and phase_of("append") == sc.phase:
            attack.swap(sc.target(run), sc.directory)

    failures = 0
    w = writer_for(run, **LIMITS)
    _faults.set_fault_hook(hook)
    try:
        await w.flush()
    except PersistenceError:
        failures += 1
        await w.reconcile()
        await w.flush()
    state, report = load_here(run)
    if state is None or project(state) != expected[0]:
        problems.append(f"the acknowledged initial base is not recoverable: {report}")
    for n, t in enumerate(transitions(COUNT), start=1):
        try:
            await apply(w, t)
        except PersistenceError:
            failures += 1
            with pytest.raises(PersistenceError, match="stopped"):
                await w.record("probe", status="completed", response=RESP_MARK)
            await w.reconcile()  # with the substitute still in place
            state, report = load_here(run)
            if state is None or project(state) not in expected[n - 1 : n + 1]:
                problems.append(f"after reconcile, acknowledged prefix {n - 1} lost: {report}")
            await apply(w, t)
        acks[0] = n
        state, report = load_here(run)
        if state is None or project(state) != expected[n]:
            problems.append(f"acknowledged transition {n} not recoverable: {report}")
    await w.close()
    _faults.set_fault_hook(None)
    state, report = load_here(run)
    if state is None or project(state) != expected[COUNT]:
        problems.append(f"final state differs: {report}")
    return attack, problems, failures


@pytest.mark.parametrize("kind", ["file", "symlink"])
@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_substitution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sc: Scenario, kind: str
) -> None:
    if sc.fallback:
        monkeypatch.setattr(_io, "create_tmpfile", lambda *a, **k: None)
    attack, problems, failures = await run_scenario(tmp_path, sc, kind)
    assert attack.done, "the substitution point was never reached"
    problems += attack.check_foreign_objects(tmp_path)
    assert problems == []
    assert failures == (1 if sc.raises else 0)


@pytest.mark.parametrize("kind", ["file", "symlink"])
async def test_substituted_staging_at_creation_is_refused(tmp_path: Path, kind: str) -> None:
    """A staging name that is not our private directory: typed refusal, nothing touched."""
    attack = Attack(tmp_path, kind)
    run = tmp_path / "run"
    run.mkdir()
    attack.swap(run / STAGING, directory=True)
    w = writer_for(run)
    for _ in range(2):
        with pytest.raises(PersistenceError):
            await w.record("a", status="completed", response=RESP_MARK)
        await w.reconcile()
    await w.close()
    assert attack.check_foreign_objects(tmp_path) == []
    assert sorted(os.listdir(run)) == [STAGING]


async def test_run_directory_swapped_for_a_symlink_at_resolution(tmp_path: Path) -> None:
    """The run path becomes a symlink just before the writer resolves it (R5: resolved once).

    The writer follows what the path names at that moment; pre-existing objects there
    that it did not create (sentinels under our file names) are quarantined intact.
    """
    attack = Attack(tmp_path, "symlink")
    run = tmp_path / "run"
    run.mkdir()
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    sentinels = {name: f"SENTINEL-{name}-{attack.token}".encode() for name in
                 ("checkpoint.json", "checkpoint.json.journal")}  # fmt: skip
    for name, data in sentinels.items():
        (decoy / name).write_bytes(data)
    swapped: list[bool] = []

    def hook(step: str, when: str) -> None:
        if (when, step) == ("before", "dir-open") and not swapped:
            os.rename(run, tmp_path / "run.ours-aside")
            os.symlink(decoy, run)
            swapped.append(True)

    _faults.set_fault_hook(hook)
    w = writer_for(run)
    await w.record("a", status="completed", response=RESP_MARK, flow_context={"m": CTX_MARK})
    await w.close()
    _faults.set_fault_hook(None)
    assert swapped
    kept = {p.read_bytes() for p in (decoy / STAGING).iterdir()}
    assert kept == set(sentinels.values())  # quarantined, not truncated or unlinked
    assert attack.check_foreign_objects(tmp_path, *sentinels.values()) == []
    state, _ = load_here(decoy)
    assert state is not None and set(state["ops"]) == {"a"}


async def test_run_directory_swapped_for_a_file_at_resolution(tmp_path: Path) -> None:
    attack = Attack(tmp_path, "file")
    run = tmp_path / "run"
    run.mkdir()

    def hook(step: str, when: str) -> None:
        if (when, step) == ("before", "dir-open") and not attack.done:
            attack.swap(run, directory=True)

    _faults.set_fault_hook(hook)
    w = writer_for(run)
    with pytest.raises(PersistenceError):
        await w.record("a", status="completed", response=RESP_MARK)
    await w.close()
    assert attack.done
    assert attack.check_foreign_objects(tmp_path) == []
