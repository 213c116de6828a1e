"""``resume`` of a version 2 checkpoint with a journal beside it is refused (issue 10, item 5).

The journal here records ``c`` completed: an outcome that exists only in the journal.
Read alone, the v2 snapshot would make the resume invoke ``c`` again; instead the
resume exits 3 naming the journal, runs nothing and leaves both files as they were.

Also here: a legacy v2 value the resumed run's first checkpoint cannot hold (issue 10,
item 1) is refused the same way, before any node runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from flow_support import chain_plan, child_env, read_invocations, run_cli, show_in_process
from resume_support import Crafted, SourceGuard, resume, run_dirs, single_run, write_script

from steerflow.checkpoint import JOURNAL_FILENAME

JOURNAL_LINE = (
    b'{"version":3,"generation":"' + b"b" * 32 + b'","seq":1,"kind":"op",'
    b'"entry":{"agent_id":"c","status":"completed","response":"C"}}\n'
)


def test_resume_refuses_a_v2_checkpoint_with_a_journal_beside_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", {})
    plan = chain_plan(tmp_path / "plan.yaml")
    killed = run_cli(
        home, "flow", "--plan", plan, "--model", f"script:{script}", "--checkpoint-version", "2",
        env=child_env(STEERFLOW_FAULT="exit:after:ack:3"),  # the flush, then a and b
    )  # fmt: skip
    assert killed.returncode == 137, killed.explain()
    run_dir = single_run(home)
    journal = run_dir / JOURNAL_FILENAME
    journal.write_bytes(JOURNAL_LINE)
    guard = SourceGuard.of(run_dir)
    calls = len(read_invocations(home))

    result = resume(home, run_dir.name, "--json")

    assert result.returncode == 3, result.explain()
    body = json.loads(result.stdout)
    assert body["status"] == "refused" and body["exit_code"] == 3, result.explain()
    assert str(journal) in body["error"]["message"], result.explain()
    assert str(journal) in result.stderr
    guard.assert_unchanged()
    assert len(read_invocations(home)) == calls, "a refused resume invoked a node"
    assert run_dirs(home) == [run_dir], "a refused resume created a run directory"
    refusal = show_in_process(home, run_dir.name)["checkpoint_recovery"]["refusal"]
    assert refusal["reason"] == "unexpected-journal"
    assert refusal["file"] == JOURNAL_FILENAME


def test_resume_refuses_a_replayed_value_the_new_checkpoint_cannot_hold(tmp_path: Path) -> None:
    """A legacy v2 entry without a digest whose response is NaN: refused before any node runs
    (the resumed run's first checkpoint must hold every replayed entry, decision 43)."""
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", {})
    crafted = Crafted(script)
    crafted.node("a")
    crafted.node("b", "a")
    crafted.done("a", float("nan"), digest=False)
    run_dir = crafted.write(home)
    guard = SourceGuard.of(run_dir)

    result = resume(home, run_dir.name, "--json")

    assert result.returncode == 3, result.explain()
    message = json.loads(result.stdout)["error"]["message"]
    assert "'a'" in message and "non-finite" in message, message
    guard.assert_unchanged()
    assert read_invocations(home) == []
