"""RunSettings: the one translation between run settings and the checkpoint ``config``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steerflow.errors import UsageError
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


def test_compaction_limits_resolve_flag_then_plan_then_default_and_persist() -> None:
    plan = parse_plan(
        {"compact_records": 7, "plan": [{"agent_id": "a", "instruction": "x"}]},
        source="test",
        max_entries=None,
    )
    from_plan = RunSettings.from_options(FlowOptions(), plan)
    assert (from_plan.compact_records, from_plan.compact_bytes) == (7, 8_388_608)
    flagged = RunSettings.from_options(FlowOptions(compact_records=9, compact_bytes=4096), plan)
    assert (flagged.compact_records, flagged.compact_bytes) == (9, 4096)
    config = flagged.to_checkpoint_config()
    assert (config["compact_records"], config["compact_bytes"]) == (9, 4096)
    resumed = RunSettings.from_checkpoint_config(json.loads(json.dumps(config)))
    assert resumed == flagged
    assert resumed.with_compaction(None, 2048).compact_bytes == 2048
    assert resumed.with_compaction(None, None) == flagged


def test_out_of_range_or_hand_edited_limits() -> None:
    with pytest.raises(UsageError, match="compact_bytes: 10 is out of range"):
        RunSettings.from_options(FlowOptions(compact_bytes=10), None)
    with pytest.raises(UsageError, match="compact_records: True is not an integer"):
        RunSettings.from_options(FlowOptions(compact_records=True), None)
    late = FlowOptions()
    late.compact_records = 0  # set after the options were checked: checked again here
    with pytest.raises(UsageError, match="compact_records: 0 is out of range"):
        RunSettings.from_options(late, None)
    # A config value the writer could not take reads as the default, never as a crash.
    odd = RunSettings.from_checkpoint_config({"compact_records": 0, "compact_bytes": "big"})
    assert (odd.compact_records, odd.compact_bytes) == (128, 8_388_608)


def test_synthesis_flag_replaces_the_plans_instruction_and_is_recorded() -> None:
    entries = [{"agent_id": "a", "instruction": "x"}]
    planned = parse_plan(
        {"synthesis": {"instruction": "Join.", "model": "script:s.yaml"}, "plan": entries},
        source="t",
    )
    own = RunSettings.from_options(FlowOptions(), planned)
    assert own.synthesis == {"instruction": "Join.", "model": "script:s.yaml"}
    assert own.synthesis_model == "script:s.yaml"
    flagged = RunSettings.from_options(FlowOptions(synthesize="Sum up."), planned)
    assert flagged.synthesis == {"instruction": "Sum up.", "model": "script:s.yaml"}
    bare = RunSettings.from_options(FlowOptions(synthesize="Sum up."), None)
    assert bare.synthesis == {"instruction": "Sum up.", "model": None}
    assert bare.synthesis_model == bare.model == "echo"
    # A resume owes the synthesis its source recorded (and none if it recorded none).
    config = flagged.to_checkpoint_config()
    assert list(config)[-1] == "synthesis"
    assert RunSettings.from_checkpoint_config(config).synthesis == flagged.synthesis
    assert "synthesis" not in RunSettings.from_options(FlowOptions(), None).to_checkpoint_config()
    assert RunSettings.from_checkpoint_config({"synthesis": {"model": "echo"}}).synthesis is None
    with pytest.raises(UsageError, match="invalid value for synthesize: "):
        RunSettings.from_options(FlowOptions(synthesize="  "), None)


def test_the_plans_name_is_recorded_only_when_it_has_one() -> None:
    """Decision 206: ``config.name`` lets ``db rebuild`` and a resume name the run."""
    named = parse_plan(
        {"name": "weekly", "plan": [{"agent_id": "a", "instruction": "x"}]},
        source="test",
        max_entries=None,
    )
    config = RunSettings.from_options(FlowOptions(), named).to_checkpoint_config()
    assert config["name"] == "weekly" and list(config)[-1] == "name"
    assert RunSettings.from_checkpoint_config(config).plan_name == "weekly"
    unnamed = parse_plan(
        {"plan": [{"agent_id": "a", "instruction": "x"}]}, source="test", max_entries=None
    )
    assert "name" not in RunSettings.from_options(FlowOptions(), unnamed).to_checkpoint_config()
    assert "name" not in RunSettings.from_options(FlowOptions(), None).to_checkpoint_config()
    assert RunSettings.from_checkpoint_config({"name": 7}).plan_name is None  # hand-edited
