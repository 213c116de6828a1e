"""A plan built in code runs, crashes and resumes like a plan file (issue 29 item 1).

Real processes: a Python program runs ``FlowOptions(plan=Plan(...))`` on ``echo`` and is
killed by a fault seam after its second outcome is durable; ``steerflow resume RUN`` (the
CLI, another process) continues it. The code plan's ``to_yaml`` runs with ``flow --plan``
and records the same checkpoint plan and config as the code run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from flow_support import child_env, run_cli

from steerflow.checkpoint import load_checkpoint
from steerflow.plan import Op, Plan, Synthesis

PROGRAM = """\
import asyncio, sys
from pathlib import Path

import steerflow

plan = steerflow.Plan(
    ops=[
        steerflow.Op("a", "first"),
        steerflow.Op("b", "second", depends_on=["a"]),
        steerflow.Op("c", "third", depends_on=["b"]),
    ],
    synthesis=steerflow.Synthesis("sum up"),
    concurrency=1,
)
options = steerflow.FlowOptions(plan=plan, model="echo")
result = asyncio.run(steerflow.run_flow(options, home=Path(sys.argv[1])))
print(result.run_id, result.status)
"""

PLAN = Plan(
    ops=[Op("a", "first"), Op("b", "second", depends_on=["a"]), Op("c", "third", depends_on=["b"])],
    synthesis=Synthesis("sum up"),
    concurrency=1,
)


def _run_program(home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, str(home)],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(**env),
        check=False,
    )


def _recorded(run_dir: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The checkpoint's plan and config, without what names this run (ids, root, lineage)."""
    state, _ = load_checkpoint(Path(run_dir))
    plan = [{k: v for k, v in item.items() if k != "node_id"} for item in state["plan"]]
    own = ("artifact_contract", "resumed_from", "run_id")
    assert state["config"]["run_id"] == Path(run_dir).name  # its own id (decision 247)
    config = {k: v for k, v in state["config"].items() if k not in own}
    return plan, config


def test_a_code_plan_killed_mid_flow_is_resumed_by_the_cli(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # acks: the initial flush, a, b; the process dies right after b is durable.
    crashed = _run_program(home, STEERFLOW_FAULT="exit:after:ack:3")
    assert crashed.returncode == 137, crashed.stderr
    (run_id,) = [p.name for p in (home / "runs").iterdir()]
    source = home / "runs" / run_id
    state, _ = load_checkpoint(source)
    assert set(state["ops"]) == {"a", "b"}

    resumed = run_cli(home, "resume", run_id, "--json")
    assert resumed.returncode == 0, resumed.explain()
    out = resumed.json
    assert out["status"] == "completed"
    assert {n["id"]: n["status"] for n in out["nodes"]} == dict.fromkeys(
        ["a", "b", "c", "synthesis"], "completed"
    )
    # a's and b's outcomes, each after its call's write-ahead intent (decision 217)
    assert out["checkpoint_recovery"]["records_applied"] == 4
    # a and b come from the checkpoint, c and the synthesis run: nothing twice.
    assert "node replayed a" in resumed.stderr and "node replayed b" in resumed.stderr
    assert "start a" not in resumed.stderr and "start b" not in resumed.stderr
    assert "start c" in resumed.stderr and "start synthesis" in resumed.stderr
    # The resumed run keeps the code plan's plan and settings.
    assert _recorded(out["run_dir"]) == _recorded(source)


def test_a_code_plans_yaml_runs_with_flow_plan_and_records_the_same(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = _run_program(home)
    assert done.returncode == 0, done.stderr
    run_id, status = done.stdout.split()
    assert status == "completed"
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN.to_yaml(), encoding="utf-8")
    assert Plan.from_file(path) == PLAN

    flow = run_cli(home, "flow", "--plan", path, "--model", "echo", "--json")
    assert flow.returncode == 0, flow.explain()
    assert [n["id"] for n in flow.json["nodes"]] == ["a", "b", "c", "synthesis"]
    assert _recorded(flow.json["run_dir"]) == _recorded(home / "runs" / run_id)
