"""Resume between checkpoint versions 3 and 4, both ways (issue 43, decision 340).

There is no ``migrate`` command: a resume writes the version it is asked for, so a
version 3 run of today resumes into version 4 and a version 4 run back into version 3.
Real ``run_flow`` runs (echo model, a real home and state DB), the plan ``a → b, c → d``:
the source completes, then a rerun from ``d`` replays ``a``, ``b`` and ``c`` from the
source's checkpoint (their entries byte-identical in meaning) and runs ``d`` again.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import steerflow
from steerflow import FlowOptions

PLAN = {
    "plan": [
        {"agent_id": "a", "instruction": "Do a."},
        {"agent_id": "b", "instruction": "Do b.", "depends_on": ["a"]},
        {"agent_id": "c", "instruction": "Do c.", "depends_on": ["a"]},
        {"agent_id": "d", "instruction": "Do d.", "depends_on": ["b", "c"]},
    ],
}


def _files(run_dir: Path) -> list[str]:
    return sorted(
        p.name.split(".seg.")[0] + (".seg" if ".seg." in p.name else "")
        for p in run_dir.iterdir()
        if p.name.startswith("checkpoint.json")
    )


def _plan(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if k != "node_id"} for item in state["plan"]]


def _rerun(home: Path, run_id: str, version: int) -> Any:
    seed = steerflow.prepare_resume(home, run_id, from_node="d")
    result = asyncio.run(
        steerflow.run_flow(FlowOptions(resume=seed, checkpoint_version=version), home=home)
    )
    assert result.status == "completed"
    return result


def test_a_v3_run_resumes_into_v4_and_back(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    source = asyncio.run(
        steerflow.run_flow(
            FlowOptions(plan_path=plan, model="echo", checkpoint_version=3), home=home
        )
    )
    assert source.status == "completed"
    v3_state, v3_report = steerflow.load_checkpoint(Path(str(source.run_dir)))
    assert v3_report["checkpoint_version"] == 3

    into_v4 = _rerun(home, str(source.run_id), 4)
    v4_dir = Path(str(into_v4.run_dir))
    v4_state, v4_report = steerflow.load_checkpoint(v4_dir)
    assert v4_report["checkpoint_version"] == 4 and v4_report["status"] == "clean"
    assert "checkpoint.json.seg" in _files(v4_dir)  # the manifest names segments
    for node in ("a", "b", "c"):  # replayed, not run again: the source's entries
        assert v4_state["ops"][node]["response"] == v3_state["ops"][node]["response"]
        assert v4_state["ops"][node]["result_digest"] == v3_state["ops"][node]["result_digest"]
    assert _plan(v4_state) == _plan(v3_state)  # node ids are each run's own

    back = _rerun(home, str(into_v4.run_id), 3)
    back_dir = Path(str(back.run_dir))
    back_state, back_report = steerflow.load_checkpoint(back_dir)
    assert back_report["checkpoint_version"] == 3
    assert "checkpoint.json.seg" not in _files(back_dir)
    for node in ("a", "b", "c"):
        assert back_state["ops"][node] == v4_state["ops"][node]
    # Both resumed runs ran d once each and replayed the rest (the source ran all four).
    assert set(back_state["ops"]) == set(v3_state["ops"]) == set(v4_state["ops"])
