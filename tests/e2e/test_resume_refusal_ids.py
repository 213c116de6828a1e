"""A refused ``resume --json`` names its source run and the checkpoint entry at fault.

Issue 10 item 4: the JSON carries the source's ``session_id`` and ``run_id`` when they
are known, and ``checkpoint_recovery.refusal`` names the file, line, ``seq`` and the
entry's ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flow_support import chain_plan, read_invocations
from resume_support import (
    Crafted,
    SourceGuard,
    resume,
    run_dirs,
    run_plan,
    single_run,
    write_script,
)

JOURNAL = "checkpoint.json.journal"


def _refused(home: Path, target: str) -> dict[str, Any]:
    before_runs, before_calls = run_dirs(home), len(read_invocations(home))
    result = resume(home, target, "--json")
    assert result.returncode == 3, result.explain()
    assert run_dirs(home) == before_runs and len(read_invocations(home)) == before_calls
    body = dict(result.json)
    assert body["status"] == "refused" and body["exit_code"] == 3
    return body


def _finished_chain(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", {})
    result = run_plan(home, chain_plan(tmp_path / "plan.yaml"), script)
    assert result.returncode == 0, result.explain()
    return home, single_run(home), dict(result.json)


def test_journal_refusal_names_source_run_line_seq_and_entry(tmp_path: Path) -> None:
    home, run_dir, source = _finished_chain(tmp_path)
    journal = run_dir / JOURNAL
    lines = journal.read_bytes().splitlines(keepends=True)
    record = json.loads(lines[1])
    record["entry"]["status"] = "weird"
    agent_id, seq = record["entry"]["agent_id"], record["seq"]
    lines[1] = json.dumps(record).encode() + b"\n"
    journal.write_bytes(b"".join(lines))
    guard = SourceGuard.of(run_dir)
    body = _refused(home, source["run_id"][:12])
    guard.assert_unchanged()
    assert body["error"]["code"] == "checkpoint-recovery-refused"
    assert body["session_id"] == source["session_id"]
    assert body["run_id"] == source["run_id"]
    refusal = body["checkpoint_recovery"]["refusal"]
    assert refusal == {
        "reason": "invalid-entry",
        "seq": seq,
        "line": 2,
        "byte_offset": len(lines[0]),
        "file": JOURNAL,
        "entry": {"kind": "op", "agent_id": agent_id},
    }
    assert f"planned node {agent_id!r}" in body["error"]["message"]


def test_resume_rule_refusal_names_source_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    crafted = Crafted(write_script(tmp_path / "script.yaml", {}))
    crafted.node("a")
    crafted.node("b", "a")
    crafted.failed("a")
    run_dir = crafted.write(home)
    body = _refused(home, run_dir.name)
    assert body["error"]["code"] == "resume-refused"
    assert (body["session_id"], body["run_id"]) == (crafted.session_id, run_dir.name)


def test_unknown_session_is_null_when_the_checkpoint_cannot_be_read(tmp_path: Path) -> None:
    """A fabricated run (no state DB row) whose checkpoint is refused: the run id is
    known, the session id is not, and it is null rather than invented."""
    home = tmp_path / "home"
    crafted = Crafted(write_script(tmp_path / "script.yaml", {}))
    crafted.node("a")
    run_dir = crafted.write(home)
    (run_dir / "checkpoint.json").write_text('{"version": 2, "ops": []}')
    body = _refused(home, str(run_dir))
    assert body["error"]["code"] == "checkpoint-recovery-refused"
    assert body["run_id"] == run_dir.name and body["session_id"] is None
    assert body["checkpoint_recovery"]["refusal"]["file"] == "checkpoint.json"
