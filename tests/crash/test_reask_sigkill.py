"""Death between a typed node's re-asks (issue 40 item 2, decisions 217 and 284).

A re-ask is a paid call like the first, so it gets its own write-ahead intent.
``STEERFLOW_FAULT=exit:after:intent-ack:2`` ends the flow once the re-ask's intent is
acknowledged and before it is sent: a new process lists both of the node's calls as in
flight (neither has an outcome; each may have been paid), and a resume asks the node
again from its first call and records its validated output.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from flow_support import child_env, read_invocations, run_cli, write_yaml

pytestmark = pytest.mark.timeout(120)

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def test_a_flow_killed_before_a_reask_lists_both_calls_and_resumes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = tmp_path / "s.yaml"
    write_yaml(script, {"typed": {"response": {"n": "not a number"}}})
    plan = write_yaml(
        tmp_path / "p.yaml",
        {"plan": [{"agent_id": "typed", "instruction": "count", "output_schema": SCHEMA}]},
    )
    env = child_env(STEERFLOW_FAULT="exit:after:intent-ack:2")
    killed = run_cli(home, "flow", "--plan", plan, "--model", f"script:{script}", "--json",
                     env=env)  # fmt: skip
    assert killed.returncode == 137, killed.explain()
    assert len(read_invocations(home)) == 1  # the first ask; the re-ask never left
    run_id = sorted(p.name for p in (home / "runs").iterdir())[-1]

    dry = run_cli(home, "resume", run_id, "--dry-run", "--json")
    assert dry.returncode == 0, dry.explain()
    calls = [(c["node"], c["attempt"]) for c in dry.json["in_flight_calls"]]
    assert calls == [("typed", 1), ("typed", 2)]

    write_yaml(script, {"typed": {"response": {"n": 3}}})
    done = run_cli(home, "resume", run_id, "--json")
    assert done.returncode == 0, done.explain()
    assert len(read_invocations(home)) == 2  # asked once more, valid at once
    shown = run_cli(home, "show", done.json["run_id"], "typed", "--json")
    assert shown.json["output"] == {"n": 3}
