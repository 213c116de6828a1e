"""Double faults: the process dies *inside* ``reconcile()`` after a write error.

A write error leaves the writer stopped until ``reconcile()`` adopts the durable prefix
and republishes it as a new generation (a compaction).  That recovery writes files too,
so a death in the middle of it must not lose what was acknowledged before the error.

For each first fault (an uncertain error in an append or in a compaction), a dry run of
the child writer in ``--recover`` mode (``crash_support``: on ``PersistenceError`` it
calls ``reconcile()`` and records the same transition again) lists every seam hit, with
the ones inside ``reconcile()`` labelled.  Each distinct reconcile seam, before and after,
becomes a case: the child runs with the first fault and an ``os._exit`` at that seam's
hit, and a load by the test process (which never wrote it) must find every acknowledged
transition (the failed one may or may not be there: it was never acknowledged) with a
``clean`` or ``recovered_prefix`` report.  Each case is its own test (pytest-xdist spreads
them); the seven dry runs go through ``discovery.once``, like ``test_seams``'s.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from crash_support import killed_child_problem, run_child
from discovery import once

OPTS = {"count": 14, "max_records": 3, "max_bytes": 1_400, "big": 1_600, "recover": True}

#: First faults, as (phase, point, action): errors whose outcome is uncertain (bytes may
#: have reached the disk) and one that wrote nothing, in an append and in a compaction.
FIRST_FAULTS = [
    ("append", "after:journal-write", "eio"),
    ("append", "after:journal-fsync", "eio"),
    ("append", "before:journal-write", "enospc"),
    ("compaction", "before:base-exchange", "eio"),
    ("compaction", "after:base-exchange", "eio"),
    ("compaction", "after:journal-exchange", "eio"),
]

#: Steps ``reconcile()`` must take (its republication) and that the campaign must cover.
RECONCILE_STEPS = [
    "base-create", "base-write", "base-fsync", "base-link", "base-exchange", "dir-fsync",
    "journal-create", "journal-fsync", "journal-link", "journal-exchange",
]  # fmt: skip


@dataclass(frozen=True)
class Case:
    """A first fault, then death at the ``nth`` global hit of ``kill`` (inside reconcile)."""

    first: str
    kill: str
    nth: int

    @property
    def fault(self) -> str:
        return f"{self.first},exit:{self.kill}:{self.nth}"

    @property
    def id(self) -> str:
        return f"{self.first}--{self.kill}-{self.nth}".replace(":", "_")


def _dry(fault: str | None) -> list[tuple[str, str, str]]:
    with tempfile.TemporaryDirectory() as run:
        result = run_child(Path(run), fault, dry=True, **OPTS)
    assert result.done, result.stderr
    return result.hits


def _middle_hit(hits: list[tuple[str, str, str]], phase: str, point: str) -> int:
    """Global hit number (of ``point``) of its middle occurrence in ``phase``."""
    count, in_phase = 0, []
    for hit_phase, when, step in hits:
        if f"{when}:{step}" == point:
            count += 1
            if hit_phase == phase:
                in_phase.append(count)
    assert in_phase, f"{point} never reached in {phase}"
    return in_phase[len(in_phase) // 2]


def dry_hits() -> dict[str, list[tuple[str, str, str]]]:
    """The plain dry run's hits, and each first fault's ("" is the plain run)."""
    plain = _dry(None)
    hits = {"": plain}
    for phase, point, action in FIRST_FAULTS:
        first = f"{action}:{point}:{_middle_hit(plain, phase, point)}"
        hits[first] = _dry(first)
    return hits


def discover(hits: dict[str, list[tuple[str, str, str]]]) -> list[Case]:
    """One case per (first fault, distinct reconcile seam), at its first hit."""
    cases: list[Case] = []
    for phase, point, action in FIRST_FAULTS:
        first = f"{action}:{point}:{_middle_hit(hits[''], phase, point)}"
        counts: dict[str, int] = {}
        seen: set[str] = set()
        for hit_phase, when, step in hits[first]:
            kill = f"{when}:{step}"
            counts[kill] = counts.get(kill, 0) + 1
            if hit_phase == "reconcile" and kill not in seen:
                seen.add(kill)
                cases.append(Case(first, kill, counts[kill]))
        assert seen, f"{first} never led to reconcile()"
    return cases


_CASES: list[list[Case]] = []


def cases(config: pytest.Config) -> list[Case]:
    """The campaign, discovered once per session (``discovery.once``)."""
    if not _CASES:
        stored = once(config, "reconcile-hits", [Path(__file__)], dry_hits)
        _CASES.append(discover({k: [(p, w, s) for p, w, s in v] for k, v in stored.items()}))
    return _CASES[0]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" in metafunc.fixturenames:
        found = cases(metafunc.config)
        metafunc.parametrize("case", found, ids=[c.id for c in found])


def test_death_inside_reconcile_loses_no_acknowledged_transition(
    case: Case, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    problem = killed_child_problem(run, case.fault, "in reconcile", **OPTS)
    assert problem is None, f"{case.fault}: {problem}"


def test_campaign_covers_reconcile_republication(pytestconfig: pytest.Config) -> None:
    campaign = cases(pytestconfig)
    for first in {c.first for c in campaign}:
        points = {c.kill for c in campaign if c.first == first}
        missing = [
            f"{when}:{step}"
            for step in RECONCILE_STEPS
            for when in ("before", "after")
            if f"{when}:{step}" not in points
        ]
        assert missing == [], f"{first}: {missing}"
