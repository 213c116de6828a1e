"""Playbooks: found in ``<home>/playbooks`` first, then among the bundled ones (``demo``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from steerflow.errors import PlanValidationError, UsageError
from steerflow.plan import bundled_playbooks, find_playbook, parse_reactive

MINE = """\
name: mine
model: echo
concurrency: 2
plan:
  - {agent_id: first, assignee: me, instruction: "go"}
  - {agent_id: second, instruction: "then", depends_on: [first]}
"""


def test_demo_is_bundled(tmp_path: Path) -> None:
    assert "demo" in bundled_playbooks()
    plan, where = find_playbook("demo", home=tmp_path)
    assert "bundled" in where and "demo" in where
    assert plan.name == "demo"
    assert (plan.model or "echo") == "echo"
    assert not parse_reactive(plan.reactive).enabled
    ids = [e.agent_id for e in plan.plan]
    assert len(ids) == len(set(ids)) >= 3
    # at least one fan-out and one join, so the demo exercises the scheduler
    assert any(len(e.dependencies) > 1 for e in plan.plan)
    roots = [e for e in plan.plan if not e.dependencies]
    assert roots


def test_every_bundled_playbook_validates(tmp_path: Path) -> None:
    for name in bundled_playbooks():
        plan, _ = find_playbook(name, home=tmp_path)
        assert plan.plan


def test_home_playbook_wins_over_bundled(tmp_path: Path) -> None:
    (tmp_path / "playbooks").mkdir()
    own = tmp_path / "playbooks" / "demo.yaml"
    own.write_text(MINE.replace("name: mine", "name: my-demo"))
    plan, where = find_playbook("demo", home=tmp_path)
    assert plan.name == "my-demo"
    assert where == str(own)


def test_home_only_playbook(tmp_path: Path) -> None:
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "mine.yaml").write_text(MINE)
    plan, _ = find_playbook("mine", home=tmp_path)
    assert [e.agent_id for e in plan.plan] == ["first", "second"]


def test_unknown_playbook_lists_the_bundled_ones(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        find_playbook("nope", home=tmp_path)
    assert "nope" in str(info.value) and "demo" in str(info.value)


@pytest.mark.parametrize("name", ["../demo", "a/b", "", "x" * 65, "with space"])
def test_bad_playbook_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(UsageError, match=re.escape(f"invalid playbook name {name!r}")):
        find_playbook(name, home=tmp_path)


def test_invalid_home_playbook_names_its_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "playbooks").mkdir()
    path = tmp_path / "playbooks" / "broken.yaml"
    path.write_text("plan:\n  - agent_id: a\n    instruction: x\n    when: later\n")
    with pytest.raises(PlanValidationError) as info:
        find_playbook("broken", home=tmp_path)
    assert f"{path}:4" in str(info.value)


def test_play_and_flow_p_run_a_home_playbook(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "playbooks").mkdir(parents=True)
    (home / "playbooks" / "mine.yaml").write_text(MINE)
    base = [sys.executable, "-m", "steerflow", "--home", str(home)]
    for args in (["play", "mine", "the prompt", "--json"], ["flow", "-p", "mine", "--json"]):
        proc = subprocess.run([*base, *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert [(n["id"], n["status"]) for n in out["nodes"]] == [
            ("first", "completed"),
            ("second", "completed"),
        ]
    runs = json.loads(
        subprocess.run([*base, "runs", "--json"], capture_output=True, text=True, timeout=60).stdout
    )["runs"]
    assert [r["kind"] for r in runs] == ["play", "play"]


def test_the_entry_limit_applies_to_home_and_bundled_playbooks(tmp_path: Path) -> None:
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "mine.yaml").write_text(MINE)
    with pytest.raises(
        PlanValidationError, match="the plan has 2 entries, more than the limit of 1"
    ):
        find_playbook("mine", home=tmp_path, max_entries=1)
    with pytest.raises(
        PlanValidationError,
        match=re.escape(
            "<bundled playbook demo>: the plan has 7 entries, more than the limit of 6"
        ),
    ):
        find_playbook("demo", home=tmp_path, max_entries=6)
    assert len(find_playbook("demo", home=tmp_path, max_entries=7)[0].plan) == 7


def test_unknown_playbook_message_is_exact(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        find_playbook("nope", home=tmp_path)
    assert str(info.value) == (
        f"playbook 'nope' not found in {str(tmp_path / 'playbooks')!r} or bundled playbooks "
        f"({', '.join(bundled_playbooks())})"
    )
