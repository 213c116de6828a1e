"""How a ``steerflow`` process ends (decision 392): fast, and nothing lost.

The CLI ends with ``os._exit`` after running the ``atexit`` handlers and flushing both
streams, skipping the interpreter's teardown; with a non-daemon thread still alive it
exits the normal way, which waits for it. Real processes, real pipes: the functions in
``tests/exit_fns.py`` leave a file behind for each ending they see.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flow_support import CliResult, child_env, run_cli, write_yaml

pytestmark = pytest.mark.timeout(120)
TESTS = Path(__file__).resolve().parents[1]


def _flow(tmp_path: Path, function: str) -> tuple[Path, CliResult]:
    marks = tmp_path / "marks"
    marks.mkdir()
    plan = write_yaml(tmp_path / "plan.yaml", {"plan": [{"agent_id": "a", "instruction": "go"}]})
    env = child_env(PYTHONPATH=str(TESTS), EXIT_FNS_DIR=str(marks))
    del env["PYTHONUNBUFFERED"]  # a buffered stdout, as a user's pipe has
    result = run_cli(
        tmp_path / "home", "flow", "--plan", plan, "--model", f"python:exit_fns:{function}",
        "--json", env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.explain()
    return marks, result


def test_atexit_handlers_run_stdout_arrives_whole_and_teardown_is_skipped(
    tmp_path: Path,
) -> None:
    marks, result = _flow(tmp_path, "with_atexit")
    out = json.loads(result.stdout)
    assert out["status"] == "completed"
    assert out["result"].endswith("x" * 1000) and len(out["result"]) >= 200_000
    assert (marks / "atexit").read_text() == "a"
    # The positive control of the fast path: module teardown (this __del__) never ran.
    assert not (marks / "finalized").exists()


def test_a_live_non_daemon_thread_gets_the_normal_exit_that_waits_for_it(
    tmp_path: Path,
) -> None:
    marks, result = _flow(tmp_path, "with_thread")
    assert json.loads(result.stdout)["status"] == "completed"
    assert (marks / "thread").read_text() == "a"  # it ran after the main thread ended
