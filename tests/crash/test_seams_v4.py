"""Process death at every durability seam of a version 4 checkpoint (decision 340).

``pytest -m slow tests/crash/test_seams_v4.py`` runs the whole campaign; the default run
keeps a sample (:func:`in_sample`) and the coverage checks.

The campaign of ``test_seams.py`` (discovered seams, each killed at its first and last
hit per phase, normal and 7-byte short-write modes, the state loaded by another
process must be the replay of ``max_acked .. max_acked + 1`` transitions), run on a
version 4 writer whose segment fanout is 2, so the 14-transition script writes
segments, merges them (cascading to level 2) and unlinks the merged ones: every new
file write (``segment-*``, ``manifest-*``) and every unlink is a kill point.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from crash_support import killed_child_problem, load_fresh, run_child
from discovery import once
from test_seams import Case, Hits, cases_of, covered

OPTS = {
    "count": 14,
    "max_records": 3,
    "max_bytes": 1_400,
    "big": 1_600,
    "version": 4,
    "segment_fanout": 2,
}
SHORT = "short-write:7"

_SEGMENT = ["segment-create", "segment-write", "segment-flush", "segment-fsync", "segment-link"]
_MANIFEST = [
    "manifest-create", "manifest-write", "manifest-flush", "manifest-fsync",
    "manifest-link", "manifest-exchange",
]  # fmt: skip
RECORD_STEPS = {
    "initialization": [
        "dir-open", "staging-create", "staging-lock",
        "journal-create", "journal-write", "journal-flush", "journal-fsync", "journal-link",
        "journal-exchange", *_SEGMENT, "dir-fsync", *_MANIFEST, "advance", "ack",
    ],
    "append": ["journal-write", "journal-lf", "journal-flush", "journal-fsync", "advance", "ack"],
    "compaction": [
        "journal-segment-link", *_SEGMENT, "dir-fsync", *_MANIFEST, "cleanup-unlink",
        "journal-create", "journal-write", "journal-flush", "journal-fsync", "journal-link",
        "journal-exchange", "pin-close", "segment-unlink",
    ],
    "close": ["pin-close", "staging-remove"],
}  # fmt: skip
#: The seams that exist only in version 4 (the issue's "seam count for the new files").
#: ``journal-segment-link``: the replaced journal named as a segment (decision 395).
NEW_FILE_STEPS = {*_SEGMENT, "segment-unlink", "journal-segment-link", *_MANIFEST}

#: The default run's kill points (after each, in a compaction): the journal named as a
#: segment, a segment written, made durable and named, the names made durable, the
#: manifest written, durable and swapped in, and a merged segment unlinked (create and
#: the empty flush seam: slow only).
SAMPLE_STEPS = {
    "journal-segment-link", "segment-write", "segment-fsync", "segment-link", "dir-fsync",
    "manifest-write", "manifest-fsync", "manifest-exchange", "segment-unlink",
}  # fmt: skip

_DISCOVERED: list[tuple[list[Case], Hits]] = []


def dry_run(short: bool) -> list[tuple[str, str, str]]:
    with tempfile.TemporaryDirectory() as run:
        result = run_child(Path(run), SHORT if short else None, dry=True, **OPTS)
    assert result.done, result.stderr
    return result.hits


def discovered(config: pytest.Config) -> tuple[list[Case], Hits]:
    if not _DISCOVERED:
        stored = once(
            config,
            "seam-hits-v4",
            [Path(__file__), Path(__file__).with_name("test_seams.py")],
            lambda: {"normal": dry_run(False), "short": dry_run(True)},
        )
        hits = {
            False: [(p, w, s) for p, w, s in stored["normal"]],
            True: [(p, w, s) for p, w, s in stored["short"]],
        }
        _DISCOVERED.append((cases_of(hits), hits))
    return _DISCOVERED[0]


def in_sample(case: Case) -> bool:
    """The default run's cases: each new-file seam's first hit after it, in a compaction.

    The whole campaign (both ends of every seam of every phase, both modes) is ``slow``
    (185 kills); the sample keeps :data:`SAMPLE_STEPS` once each, and a torn segment
    and a torn manifest (short-write mode).
    """
    when, step = case.point.split(":", 1)
    if case.phase != "compaction" or when != "after":
        return False
    if case.short:
        return step in ("segment-write-part", "manifest-write-part") and case.nth == min(
            c.nth
            for c in _DISCOVERED[0][0]
            if c.short and (c.phase, c.point) == (case.phase, case.point)
        )
    firsts = [
        c.nth
        for c in _DISCOVERED[0][0]
        if not c.short and (c.phase, c.point) == (case.phase, case.point)
    ]
    return step in SAMPLE_STEPS and case.nth == min(firsts)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case_v4" in metafunc.fixturenames:
        cases, _ = discovered(metafunc.config)
        params = [
            pytest.param(c, id=c.id, marks=() if in_sample(c) else pytest.mark.slow) for c in cases
        ]
        metafunc.parametrize("case_v4", params)


@pytest.fixture(scope="session")
def discovery_v4(pytestconfig: pytest.Config) -> tuple[list[Case], Hits]:
    return discovered(pytestconfig)


def test_v4_death_at_seam_loses_no_acknowledged_transition(case_v4: Case, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    problem = killed_child_problem(run, case_v4.fault, "at the seam", **OPTS)
    assert problem is None, f"{case_v4.fault}: {problem}"
    state, report = load_fresh(run)  # and a new process reads the same unit
    assert state is not None or report["refusal"]["reason"] == "missing-checkpoint"


def test_v4_campaign_covers_every_new_file_step(discovery_v4: tuple[list[Case], Hits]) -> None:
    cases, hits = discovery_v4
    points = covered(cases)
    new = sorted({(c.phase, c.point) for c in cases if c.point.split(":", 1)[1] in NEW_FILE_STEPS})
    new_cases = [c for c in cases if c.point.split(":", 1)[1] in NEW_FILE_STEPS]
    print(
        f"version 4 campaign: {len(cases)} kill points ({sum(map(in_sample, cases))} in the "
        f"default run); new-file seams (phase, point): {len(new)}, as {len(new_cases)} kills"
    )
    print(json.dumps(points, indent=1))
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
            ("initialization", "segment-write-part"),
            ("initialization", "manifest-write-part"),
            ("compaction", "segment-write-part"),
            ("compaction", "manifest-write-part"),
        ]
        if f"after:{step}" not in points.get(phase, [])
    ]
    assert missing == []
    # Merges happened: more segments were written than compactions ran, and some unlinked.
    steps = [s for p, w, s in hits[False] if w == "after"]
    assert steps.count("segment-unlink") >= 4
    # Every compaction with outcomes since the last one named its journal as a segment.
    assert steps.count("journal-segment-link") >= 4
    assert steps.count("segment-link") > steps.count("manifest-exchange")
