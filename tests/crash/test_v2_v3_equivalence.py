"""v2/v3 durability equivalence under termination (ADR-0069 Am. 2, verification 7, part 2).

One transition script, two writers.  A version 2 writer runs it in-process and the
snapshot it made recoverable after each acknowledgement is loaded: ``v2[k]`` for the
prefix of ``k`` transitions.  A version 3 child writer runs the same script and is
killed (``os._exit`` at a seam) right after each acknowledgement, before and after each
following journal write, and at every compaction boundary (base exchange, directory
sync, journal exchange).  The v3 state a new load recovers, without ``version`` and
``generation``, must be exactly ``v2[n]`` with ``max_acked <= n <= max_acked + 1``.
"""

from __future__ import annotations

import asyncio
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from crash_support import (
    PARALLEL,
    apply,
    canonical,
    load_here,
    run_child,
    transitions,
    writer_for,
)

OPTS = {"count": 14, "max_records": 3, "max_bytes": 1_400, "big": 1_600}
BOUNDARIES = {
    ("append", "after:ack"),
    ("append", "before:journal-write"),
    ("append", "after:journal-fsync"),
    ("compaction", "before:base-exchange"),
    ("compaction", "after:base-exchange"),
    ("compaction", "after:dir-fsync"),
    ("compaction", "before:journal-exchange"),
    ("compaction", "after:journal-exchange"),
}


def logical(state: dict[str, Any]) -> str:
    """The state without the storage members (version, generation)."""
    return canonical({k: v for k, v in state.items() if k not in ("version", "generation")})


async def v2_prefixes(root: Path) -> list[str]:
    w = writer_for(root, version=2)
    await w.flush()
    out = []
    for t in [None, *transitions(OPTS["count"], big=OPTS["big"])]:
        if t is not None:
            await apply(w, t)
        state, report = load_here(root)
        assert state is not None and state["version"] == 2, report
        out.append(logical(state))
    await w.close()
    return out


def kill_points() -> list[str]:
    with tempfile.TemporaryDirectory() as run:
        result = run_child(Path(run), dry=True, **OPTS)
    assert result.done, result.stderr
    counts: dict[str, int] = {}
    points = []
    for phase, when, step in result.hits:
        point = f"{when}:{step}"
        counts[point] = counts.get(point, 0) + 1
        if (phase, point) in BOUNDARIES:
            points.append(f"exit:{point}:{counts[point]}")
    return points


POINTS = kill_points()


@pytest.fixture(scope="module")
def v2_states(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return asyncio.run(v2_prefixes(tmp_path_factory.mktemp("v2")))


def test_v3_recovers_what_v2_made_recoverable(v2_states: list[str], tmp_path: Path) -> None:
    assert len(POINTS) >= 40

    def one(index_point: tuple[int, str]) -> str | None:
        index, point = index_point
        run = tmp_path / f"k{index}"
        run.mkdir()
        result = run_child(run, point, **OPTS)
        if result.returncode != 137:
            return f"{point}: child did not die there (rc={result.returncode}): {result.stderr}"
        state, report = load_here(run)
        acked = max(result.acks, default=0)
        if state is None:
            return f"{point}: refused after {acked} acknowledgements: {report}"
        got = logical(state)
        if got not in v2_states[acked : acked + 2]:
            seen = [k for k, text in enumerate(v2_states) if text == got]
            return f"{point}: v3 recovered v2 prefix {seen or 'none'}, acked {acked}"
        return None

    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        problems = [p for p in pool.map(one, enumerate(POINTS)) if p]
    assert problems == []


def test_uninterrupted_v3_equals_v2(v2_states: list[str], tmp_path: Path) -> None:
    result = run_child(tmp_path, **OPTS)
    assert result.done, result.stderr
    state, report = load_here(tmp_path)
    assert state is not None and report["status"] == "clean"
    assert logical(state) == v2_states[-1]
