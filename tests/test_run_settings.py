"""RunSettings: the one translation between run settings and the checkpoint ``config``."""

from __future__ import annotations

import json
from pathlib import Path

from steerflow.orchestrate._options import FlowOptions
from steerflow.orchestrate._settings import RunSettings
from steerflow.plan import parse_plan

GOLDEN_V2 = Path(__file__).parent / "golden" / "v2" / "runs"


def _golden_config() -> dict[str, object]:
    (checkpoint,) = GOLDEN_V2.glob("*/checkpoint.json")
    config = json.loads(checkpoint.read_text(encoding="utf-8"))["config"]
    assert isinstance(config, dict)
    return config


def test_a_recorded_config_round_trips_byte_for_byte() -> None:
    config = _golden_config()
    again = RunSettings.from_checkpoint_config(config).to_checkpoint_config()
    assert json.dumps(again) == json.dumps(config)  # same keys, same order, same values


def test_a_resume_runs_with_the_settings_its_source_recorded() -> None:
    plan = parse_plan(
        {
            "model": "echo",
            "reactive": "coder",
            "max_ops": 9,
            "concurrency": 2,
            "roles": {"coder": {"model": "script:fix.yaml", "system": "be terse"}},
            "plan": [{"agent_id": "a", "instruction": "x", "assignee": "coder"}],
        },
        source="test",
        max_entries=None,
    )
    options = FlowOptions(plan_path=Path("p.yaml"), save=Path("/tmp/out"), kind="play")
    fresh = RunSettings.from_options(options, plan)
    resumed = RunSettings.from_checkpoint_config(
        json.loads(json.dumps(fresh.to_checkpoint_config()))
    )
    assert resumed == fresh
    assert resumed.model_for("coder") == "script:fix.yaml"
    assert resumed.model_for("reviewer") == "echo"
    assert resumed.system_for("coder") == "be terse"
    assert resumed.reactive.allows("coder") and not resumed.reactive.allows("reviewer")


def test_options_win_over_the_plan_and_defaults_fill_the_rest() -> None:
    plan = parse_plan(
        {"model": "echo", "concurrency": 3, "plan": [{"agent_id": "a", "instruction": "x"}]},
        source="test",
        max_entries=None,
    )
    settings = RunSettings.from_options(FlowOptions(model="script:m.yaml", max_ops=5), plan)
    assert (settings.model, settings.concurrency, settings.max_ops) == ("script:m.yaml", 3, 5)
    assert settings.reactive.spec == "off" and settings.kind == "flow"
    assert RunSettings.from_checkpoint_config({}).to_checkpoint_config()["model_spec"] == "echo"
