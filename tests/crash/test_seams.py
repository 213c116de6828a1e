"""Process death at every named durability seam, by phase (ADR-0069 Am. 2, verification 3).

The seam list is discovered, not written down: a dry run of the child workload (see
``crash_support``) with a fault hook records every ``(phase, when, step)`` hit, once in
normal mode and once in short-write mode (7-byte writes, LF written alone).  Every
distinct ``(phase, point)`` becomes a case, killed at its first and at its last hit in
that phase, so a seam added to ``checkpoint/_io.py`` or ``_v3.py`` is covered without
editing this file.  The phases are initialization (first base and journal), append,
compaction (count, byte and oversize-record compactions) and close.

Each case runs the child with ``STEERFLOW_FAULT=exit:<when>:<step>:<nth>`` in a fresh
directory; the child reports each acknowledgement through its stdout pipe only after
``record()`` returned and dies with ``os._exit(137)`` at the seam.  Another process
(this test process, which never opened that checkpoint for writing) then loads it,
and its state must be the replay of ``n`` transitions with
``max_acked <= n <= max_acked + 1``.  Each parametrized test runs and asserts its own
case, so pytest-xdist spreads the campaign over its workers.

The discovery's two dry runs are child processes, and parametrization needs the cases
at collection, so they cannot wait for a fixture.  Instead ``pytest_generate_tests``
asks :func:`discovered`, which runs them through ``discovery.once``: at most once per
test run (shared by the xdist workers) and once per source tree (the pytest cache keyed
by a hash of ``src/steerflow``, ``crash_support.py``, this file and the Python version):
a collection with unchanged sources starts no child.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from crash_support import (
    check_recovered,
    child_command,
    child_env,
    killed_child_problem,
    load_fresh,
    parse_report,
    run_child,
)
from discovery import once

# Byte-limit compactions before transitions 3, 5 and 13, a count-limit one before 11,
# and oversize transitions 7 and 14 committed through a new base.
OPTS = {"count": 14, "max_records": 3, "max_bytes": 1_400, "big": 1_600}
SHORT = "short-write:7"

# The steps the design record lists, as seam names (verification 3), per phase.
RECORD_STEPS = {
    "initialization": [
        "dir-open", "staging-create", "staging-lock",
        "journal-create", "journal-write", "journal-flush", "journal-fsync", "journal-link",
        "journal-exchange", "base-create", "base-write", "base-flush", "base-fsync",
        "base-link", "base-exchange", "dir-fsync", "advance", "ack",
    ],
    "append": [
        "journal-write", "journal-lf", "journal-flush", "journal-fsync", "advance", "ack",
    ],
    "compaction": [
        "base-create", "base-write", "base-flush", "base-fsync", "base-link",
        "base-exchange", "dir-fsync", "cleanup-unlink", "journal-create", "journal-write",
        "journal-flush", "journal-fsync", "journal-link", "journal-exchange", "pin-close",
    ],
    "close": ["pin-close", "staging-remove"],
}  # fmt: skip
SHORT_ONLY = ["journal-write-part", "base-write-part"]  # "after" only: between two parts


@dataclass(frozen=True)
class Case:
    """One kill point: mode, phase, ``<when>:<step>`` and its global hit number."""

    short: bool
    phase: str
    point: str
    nth: int

    @property
    def fault(self) -> str:
        kill = f"exit:{self.point}:{self.nth}"
        return f"{SHORT},{kill}" if self.short else kill

    @property
    def id(self) -> str:
        return f"{'short-' if self.short else ''}{self.phase}-{self.point}-{self.nth}"


def dry_run(short: bool) -> list[tuple[str, str, str]]:
    """Every seam hit of one uninterrupted child run, in order."""
    import tempfile

    with tempfile.TemporaryDirectory() as run:
        result = run_child(Path(run), SHORT if short else None, dry=True, **OPTS)
    assert result.done, result.stderr
    return result.hits


Hits = dict[bool, list[tuple[str, str, str]]]
_DISCOVERED: list[tuple[list[Case], Hits]] = []


def discovered(config: pytest.Config) -> tuple[list[Case], Hits]:
    """The cases and hits, from this session's, the cache's or this run's dry runs."""
    if not _DISCOVERED:
        stored = once(
            config,
            "seam-hits",
            [Path(__file__)],
            lambda: {"normal": dry_run(False), "short": dry_run(True)},
        )
        hits = {
            False: [(p, w, s) for p, w, s in stored["normal"]],
            True: [(p, w, s) for p, w, s in stored["short"]],
        }
        _DISCOVERED.append((cases_of(hits), hits))
    return _DISCOVERED[0]


def cases_of(hits: Hits) -> list[Case]:
    """Cases: first and last hit of each (phase, point), both modes."""
    cases: list[Case] = []
    for short, seq in hits.items():
        counts: dict[str, int] = {}
        spans: dict[tuple[str, str], list[int]] = {}
        for phase, when, step in seq:
            point = f"{when}:{step}"
            counts[point] = counts.get(point, 0) + 1
            spans.setdefault((phase, point), []).append(counts[point])
        for (phase, point), nths in spans.items():
            step = point.split(":", 1)[1]
            if short and not step.endswith(("-write-part", "-lf")):
                continue  # the rest is the normal-mode campaign's
            picks = {nths[0], nths[-1]}
            if short and step.endswith("-write-part"):
                picks.add(nths[len(nths) // 2])
            cases += [Case(short, phase, point, n) for n in sorted(picks)]
    return cases


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" in metafunc.fixturenames:
        cases, _ = discovered(metafunc.config)
        metafunc.parametrize("case", cases, ids=[c.id for c in cases])


@pytest.fixture(scope="session")
def discovery(pytestconfig: pytest.Config) -> tuple[list[Case], Hits]:
    return discovered(pytestconfig)


def covered(cases: list[Case]) -> dict[str, list[str]]:
    """Phase -> sorted points exercised by the campaign."""
    out: dict[str, set[str]] = {}
    for case in cases:
        out.setdefault(case.phase, set()).add(case.point)
    return {phase: sorted(points) for phase, points in sorted(out.items())}


def test_death_at_seam_loses_no_acknowledged_transition(case: Case, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    problem = killed_child_problem(run, case.fault, "at the seam", **OPTS)
    assert problem is None, f"{case.fault}: {problem}"


def test_campaign_covers_every_step_the_record_lists(
    discovery: tuple[list[Case], Hits],
) -> None:
    cases, hits = discovery
    points = covered(cases)
    print("seams covered:\n" + json.dumps(points, indent=1))
    missing = [
        f"{phase}: {when}:{step}"
        for phase, steps in RECORD_STEPS.items()
        for step in steps
        for when in ("before", "after")
        if f"{when}:{step}" not in points.get(phase, [])
    ]
    missing += [
        f"{phase}: after:{step}"
        for phase, step in [
            ("append", "journal-write-part"),
            ("initialization", "base-write-part"),
            ("compaction", "base-write-part"),
        ]
        if f"after:{step}" not in points.get(phase, [])
    ]
    assert missing == []
    assert {step for *_, step in hits[True]} >= set(SHORT_ONLY)
    assert len(cases) >= 100


def test_every_discovered_seam_is_a_case(discovery: tuple[list[Case], Hits]) -> None:
    """No seam the dry runs reached is left out of the campaign."""
    cases, hits = discovery
    reached = {(p, f"{w}:{s}") for p, w, s in hits[False]}
    reached |= {(p, f"{w}:{s}") for p, w, s in hits[True] if s.endswith(("-write-part", "-lf"))}
    assert reached == {(c.phase, c.point) for c in cases}


def test_uninterrupted_child_recovers_clean(tmp_path: Path) -> None:
    proc = subprocess.run(
        child_command(tmp_path, **OPTS), env=child_env(None), capture_output=True, timeout=60
    )
    flushed, acks, done, _ = parse_report(proc.stdout)
    assert proc.returncode == 0 and done, proc.stderr
    state, report = load_fresh(tmp_path)
    assert report["status"] == "clean"
    problem, n = check_recovered(
        state, report, flushed=flushed, acks=acks, in_flight=0, count=OPTS["count"], big=OPTS["big"]
    )
    assert problem is None and n == OPTS["count"]
