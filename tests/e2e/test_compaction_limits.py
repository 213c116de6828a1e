"""``--compact-records`` / ``--compact-bytes`` and the plan keys (issue 17 item 2).

The CLI runs in this process (a flow of a few echo nodes needs no child interpreter);
what is checked is on disk: the version 3 base and journal the limits shaped, and the
``config`` a resume reads them back from.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from flow_support import write_yaml

from steerflow.cli import main as cli_main

NODES = 7


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A steerflow home that does not exist yet."""
    return tmp_path / "home"


def _cli(home: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["--home", str(home), *args])
    return code, out.getvalue(), err.getvalue()


def _flow_json(home: Path, *args: str) -> dict[str, Any]:
    code, out, err = _cli(home, "flow", *args, "--json")
    assert code == 0, out + err
    value = json.loads(out)
    assert isinstance(value, dict)
    return value


def _plan(tmp_path: Path, **top: object) -> Path:
    entries = [{"agent_id": f"n{i}", "instruction": f"step {i}"} for i in range(NODES)]
    return write_yaml(tmp_path / "plan.yaml", {**top, "plan": entries})


def _on_disk(out: dict[str, Any]) -> tuple[dict[str, Any], int, int]:
    """(base document, journal outcome lines, base + journal bytes) of a finished run.

    Each call's write-ahead intent is a journal line too (decision 217); ``max_records``
    counts outcomes only, so only those are counted here.
    """
    base_path = Path(out["checkpoint"]["path"])
    journal = base_path.with_name(base_path.name + ".journal")
    text = journal.read_bytes() if journal.exists() else b""
    lines = sum(json.loads(line)["kind"] != "intent" for line in text.splitlines())
    size = base_path.stat().st_size + (journal.stat().st_size if journal.exists() else 0)
    return json.loads(base_path.read_text(encoding="utf-8")), lines, size


def test_defaults_keep_every_record_in_the_journal_and_the_config_bytes(
    home: Path, tmp_path: Path
) -> None:
    out = _flow_json(home, "--plan", str(_plan(tmp_path)))
    base, lines, size = _on_disk(out)
    assert (len(base["ops"]), lines) == (0, NODES)  # 128 records: no compaction
    # Default limits are not written: the config keeps the bytes older runs have.
    assert "compact_records" not in base["config"] and "compact_bytes" not in base["config"]
    # Nothing was rewritten, so what was written is exactly what is on disk.
    assert out["checkpoint"]["bytes_written"] == size


def test_compact_records_flag_folds_the_journal_into_the_base(home: Path, tmp_path: Path) -> None:
    out = _flow_json(home, "--plan", str(_plan(tmp_path)), "--compact-records", "2")
    base, lines, size = _on_disk(out)
    assert len(base["ops"]) >= NODES - 2 and lines < 2
    assert base["config"]["compact_records"] == 2
    # Each compaction rewrote the base: more bytes were written than are left on disk.
    assert out["checkpoint"]["bytes_written"] > size


def test_compact_bytes_flag_compacts_by_size(home: Path, tmp_path: Path) -> None:
    out = _flow_json(home, "--plan", str(_plan(tmp_path)), "--compact-bytes", "1024")
    base, lines, _ = _on_disk(out)
    assert len(base["ops"]) > 0 and lines < NODES
    assert base["config"]["compact_bytes"] == 1024


def test_the_plan_file_sets_the_limits_and_a_flag_wins(home: Path, tmp_path: Path) -> None:
    plan = str(_plan(tmp_path, compact_records=2))
    base, lines, _ = _on_disk(_flow_json(home, "--plan", plan))
    assert len(base["ops"]) >= NODES - 2 and lines < 2
    base, lines, _ = _on_disk(_flow_json(home, "--plan", plan, "--compact-records", "100"))
    assert (len(base["ops"]), lines) == (0, NODES)
    assert base["config"]["compact_records"] == 100


def test_a_resume_keeps_the_runs_limits_unless_given(home: Path, tmp_path: Path) -> None:
    script = write_yaml(tmp_path / "script.yaml", {"n3": {"fail_once": "flaky"}})
    plan = str(_plan(tmp_path, compact_records=3, compact_bytes=4096))
    code, out, err = _cli(home, "flow", "--plan", plan, "--model", f"script:{script}", "--json")
    assert code == 1, out + err
    first = json.loads(out)["run_id"]

    resumed = json.loads(_cli(home, "resume", first, "--retry-failed", "--json")[1])
    assert resumed["status"] == "completed", resumed
    config = _on_disk(resumed)[0]["config"]
    assert (config["compact_records"], config["compact_bytes"]) == (3, 4096)

    code, out, err = _cli(
        home, "resume", first, "--fork", "--retry-failed", "--compact-records", "50", "--json"
    )
    assert code == 0, out + err
    config = _on_disk(json.loads(out))[0]["config"]
    assert (config["compact_records"], config["compact_bytes"]) == (50, 4096)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--compact-records", "0"], "0 is out of range: give 1..1000000"),
        (["--compact-records", "1000001"], "1000001 is out of range"),
        (["--compact-records", "-3"], "-3 is out of range"),
        (["--compact-records", "12x"], "'12x' is not an integer"),
        (["--compact-bytes", "1023"], "1023 is out of range: give 1024..1073741824"),
        (["--compact-bytes", "2.5"], "'2.5' is not an integer"),
        (
            ["--compact-records", "5", "--checkpoint-version", "2"],
            "apply to version 3 checkpoints only",
        ),
    ],
)
def test_bad_flags_exit_2_with_a_clear_message(
    home: Path, tmp_path: Path, args: list[str], needle: str
) -> None:
    code, out, err = _cli(home, "flow", "--plan", str(_plan(tmp_path)), *args, "--json")
    assert code == 2, out + err
    assert needle in json.loads(out)["error"]["message"]
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


@pytest.mark.parametrize(
    ("top", "needle"),
    [
        ({"compact_records": 0}, "compact_records: Input should be greater than or equal to 1"),
        ({"compact_records": "128"}, "compact_records: Input should be a valid integer"),
        ({"compact_records": True}, "compact_records: Input should be a valid integer"),
        (
            {"compact_bytes": 2**31},
            "compact_bytes: Input should be less than or equal to 1073741824",
        ),
    ],
)
def test_bad_plan_keys_exit_2_naming_the_key(
    home: Path, tmp_path: Path, top: dict[str, object], needle: str
) -> None:
    code, out, err = _cli(home, "flow", "--plan", str(_plan(tmp_path, **top)), "--json")
    assert code == 2, out + err
    assert needle in json.loads(out)["error"]["message"]


def test_plan_keys_are_ignored_with_a_warning_for_version_2(home: Path, tmp_path: Path) -> None:
    plan = str(_plan(tmp_path, compact_records=2))
    code, out, err = _cli(home, "flow", "--plan", plan, "--checkpoint-version", "2", "--json")
    assert code == 0, out + err
    result = json.loads(out)
    assert any("compact_records" in w for w in result["warnings"])
    assert result["checkpoint"]["version"] == 2
    assert result["checkpoint"]["bytes_written"] > 0


def test_the_human_summary_prints_the_bytes_written(home: Path, tmp_path: Path) -> None:
    code, out, err = _cli(home, "flow", "--plan", str(_plan(tmp_path)))
    assert code == 0, out + err
    line = next(x for x in out.splitlines() if x.startswith("checkpoint: "))
    assert line.endswith(" KiB written)"), line
