"""Input nested past the interpreter's stack, and repeated keys: plan files, script files and
tampered checkpoints are refused with a typed error and CONTRACT's exit code, never a
traceback (exit 1). Real CLI processes, real files."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from flow_support import chain_plan, run_cli

pytestmark = pytest.mark.timeout(180)

# Far past any recursion limit: both JSON and YAML decoders recurse once per level.
DEEP = 100_000
# Under json.loads' limit but past the YAML composer's, which the plan loader uses to find
# the line of a field it refuses.
MIDDLE = 500


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _digests(run_dir: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.iterdir())
        if p.is_file()
    }


def _no_traceback(result: object) -> None:
    assert "Traceback" not in result.stderr, result.explain()  # type: ignore[attr-defined]


@pytest.mark.parametrize("form", ["json", "yaml"])
@pytest.mark.parametrize("depth", [DEEP, MIDDLE])
def test_a_plan_nested_too_deeply_is_a_usage_error(
    home: Path, tmp_path: Path, form: str, depth: int
) -> None:
    plan = tmp_path / f"plan.{form}"
    if form == "json":
        plan.write_text(
            '{"plan": [{"agent_id": "a", "instruction": "x", "extra": ' + _nested(depth) + "}]}"
        )
    else:
        plan.write_text(f"plan:\n  - agent_id: a\n    instruction: {_nested(depth)}\n")
    result = run_cli(home, "flow", "--plan", plan)
    assert result.returncode == 2, result.explain()
    _no_traceback(result)
    assert str(plan) in result.stderr, result.explain()
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


def test_a_script_file_nested_too_deeply_is_a_usage_error(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text(f"a: {_nested(DEEP)}\n")
    result = run_cli(
        home, "flow", "--plan", chain_plan(tmp_path / "p.yaml"), "--model", f"script:{script}"
    )
    assert result.returncode == 2, result.explain()
    _no_traceback(result)
    assert str(script) in result.stderr and "nested too deeply" in result.stderr


@pytest.mark.parametrize(
    ("text", "where", "key"),
    [
        (
            "plan:\n  - {agent_id: a, instruction: x}\nplan:\n  - {agent_id: b, instruction: y}\n",
            ":3:",
            "'plan'",
        ),
        (
            "plan:\n  - agent_id: a\n    instruction: x\n    instruction: y\n",
            ":4:",
            "'instruction'",
        ),
        (
            '{"plan": [{"agent_id": "a", "instruction": "x", "instruction": "y"}]}',
            ":",
            "'instruction'",
        ),
    ],
    ids=["yaml-top", "yaml-entry", "json-entry"],
)
def test_a_repeated_key_in_a_plan_is_a_usage_error_naming_it(
    home: Path, tmp_path: Path, text: str, where: str, key: str
) -> None:
    plan = tmp_path / ("plan.json" if text.startswith("{") else "plan.yaml")
    plan.write_text(text)
    result = run_cli(home, "flow", "--plan", plan, "--json")
    assert result.returncode == 2, result.explain()
    assert result.json["error"]["code"] == "plan-invalid", result.explain()
    assert f"{plan}{where}" in result.stderr and f"duplicate key {key}" in result.stderr


def test_a_merge_key_may_still_be_overridden(home: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("plan:\n  - &a {agent_id: a, instruction: x}\n  - <<: *a\n    agent_id: b\n")
    result = run_cli(home, "flow", "--plan", plan, "--dry-run", "--json")
    assert result.returncode == 0, result.explain()
    assert [n["id"] for n in result.json["nodes"]] == ["a", "b"]


@pytest.mark.parametrize("part", ["checkpoint.json", "checkpoint.json.journal"])
def test_a_checkpoint_nested_too_deeply_is_refused_and_left_alone(
    home: Path, tmp_path: Path, part: str
) -> None:
    done = run_cli(home, "flow", "--plan", chain_plan(tmp_path / "p.yaml"), "--json")
    assert done.returncode == 0, done.explain()
    run_id = str(done.json["run_id"])
    run_dir = home / "runs" / run_id
    target = run_dir / part
    if part == "checkpoint.json":
        target.write_text('{"version": 3, "plan": ' + _nested(DEEP) + "}")
    else:
        with target.open("a") as journal:
            journal.write('{"version": 3, "entry": ' + _nested(DEEP) + "}\n")
    before = _digests(run_dir)

    shown = run_cli(home, "show", run_id, "--json")
    assert shown.returncode == 0, shown.explain()
    assert shown.json["checkpoint_recovery"]["status"] == "refused", shown.explain()
    for args in (
        ("result", run_id),
        ("verify", run_id),
        ("resume", run_id, "--dry-run"),
        ("resume", run_id),
    ):
        result = run_cli(home, *args)
        assert result.returncode == 3, result.explain()
        _no_traceback(result)
        assert f"file={part!r}" in result.stderr, result.explain()
    assert _digests(run_dir) == before
    assert json.loads(run_cli(home, "runs", "--json").stdout)["runs"][0]["run_id"] == run_id


def _replace_with_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path, 0o600)


def _replace_with_dangling_link(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.parent / "nowhere")


def _replace_with_link_to_a_copy(path: Path) -> None:
    copy = path.parent.parent.parent / f"copy-of-{path.name}"
    copy.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(copy)


@pytest.mark.parametrize(
    ("part", "swap", "says"),
    [
        ("checkpoint.json", _replace_with_fifo, "is not a regular file"),
        ("checkpoint.json", _replace_with_dangling_link, "is a symbolic link (never followed)"),
        ("checkpoint.json", _replace_with_link_to_a_copy, "is a symbolic link (never followed)"),
        (
            "checkpoint.json.journal",
            _replace_with_link_to_a_copy,
            "is a symbolic link (never followed)",
        ),
    ],
    ids=["base-fifo", "base-dangling-link", "base-link", "journal-link"],
)
def test_a_checkpoint_that_is_not_a_regular_file_is_refused_by_what_it_is(
    home: Path, tmp_path: Path, part: str, swap: Callable[[Path], None], says: str
) -> None:
    done = run_cli(home, "flow", "--plan", chain_plan(tmp_path / "p.yaml"), "--json")
    assert done.returncode == 0, done.explain()
    run_id = str(done.json["run_id"])
    swap(home / "runs" / run_id / part)

    shown = run_cli(home, "show", run_id, "--json")
    assert shown.returncode == 0, shown.explain()
    assert shown.json["checkpoint_recovery"]["status"] == "refused", shown.explain()
    for args in (("verify", run_id), ("resume", run_id, "--dry-run"), ("resume", run_id)):
        result = run_cli(home, *args)
        assert result.returncode == 3, result.explain()
        assert "checkpoint recovery refused" in result.stderr, result.explain()
        assert f"file={part!r}" in result.stderr and says in result.stderr, result.explain()
        assert "has no checkpoint.json" not in result.stderr, result.explain()


def test_a_context_the_writer_cannot_store_refuses_the_resume_before_it_starts(
    home: Path, tmp_path: Path
) -> None:
    # Loadable (json.loads copes with 300 levels) but deeper than the writer stores, so a
    # resume would fail once its new checkpoint is first written: it must be refused
    # first, leaving no new run, no new session and the source files as they were.
    done = run_cli(home, "flow", "--plan", chain_plan(tmp_path / "p.yaml"), "--json")
    assert done.returncode == 0, done.explain()
    run_id = str(done.json["run_id"])
    run_dir = home / "runs" / run_id
    base = json.loads((run_dir / "checkpoint.json").read_text())
    deep: object = "leaf"
    for _ in range(300):
        deep = {"k": deep}
    base["flow_context"] = {"notes": deep}
    (run_dir / "checkpoint.json").write_text(json.dumps(base))
    before = _digests(run_dir)
    assert run_cli(home, "show", run_id, "--json").json["checkpoint_recovery"]["status"] == "clean"

    for args in (("resume", run_id, "--dry-run"), ("resume", run_id)):
        result = run_cli(home, *args)
        assert result.returncode == 3, result.explain()
        _no_traceback(result)
        assert "cannot be stored again" in result.stderr, result.explain()
        assert "more than 256 levels deep" in result.stderr, result.explain()
    assert _digests(run_dir) == before
    assert [r["run_id"] for r in run_cli(home, "runs", "--all", "--json").json["runs"]] == [run_id]
    assert sorted(p.name for p in (home / "runs").iterdir()) == [run_id]
