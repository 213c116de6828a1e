"""The programs in ``examples/`` run as a user runs them, each in a real process (issue 29).

``research_fanout.py`` builds its plan in code and runs it on ``echo``; the YAML it saves
runs with ``steerflow flow --plan``. ``steered.py flow`` is steered by ``steered.py steer``,
another process, through the library's control writers. ``code_review.py`` runs pytest in
a ``python:`` function node on the files a ``script:`` author wrote, and is killed and
resumed both before and after that step.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from steerflow.checkpoint import load_checkpoint
from steerflow.providers import NodeCall

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TIMEOUT_S = 120.0
CONTROL_ID = r"[0-9a-f]{32}"
GATED = Path(__file__).resolve().parent / "gated_example.py"


def _env() -> dict[str, str]:
    scrubbed = ("STEERFLOW_HOME", "STEERFLOW_STATE_DB_URL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY")
    env = {k: v for k, v in os.environ.items() if k not in scrubbed}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _example(name: str, *args: object) -> list[str]:
    return [sys.executable, str(EXAMPLES / name), *map(str, args)]


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT_S, env=_env() | env, check=False
    )


def test_research_fanout_runs_offline_and_its_plan_runs_with_the_cli(tmp_path: Path) -> None:
    home, saved = tmp_path / "home", tmp_path / "research.yaml"
    done = _run(_example("research_fanout.py", "--home", home, "--save-plan", saved))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"run \d{8}T\d{6}-[0-9a-f]{6}: completed", lines[0]), lines[0]
    assert lines[1:6] == [
        "  research-0: completed",
        "  research-1: completed",
        "  research-2: completed",
        "  review: completed",
        "  synthesis: completed",
    ]
    # The result is the synthesis over every worker (echo repeats what it was given).
    result = "\n".join(lines[6:])
    assert result.startswith("[echo synthesis]\nWrite a one-page brief")
    workers = result.partition("[RESULTS OF WORKERS]")[2]
    for worker in ("research-0", "research-1", "research-2", "review"):
        assert f"### {worker} (completed)" in workers

    flow = _run([sys.executable, "-m", "steerflow", "--home", str(home), "flow", "--plan",
                 str(saved), "--model", "echo", "--json"])  # fmt: skip
    assert flow.returncode == 0, flow.stderr
    out = json.loads(flow.stdout)
    assert [n["id"] for n in out["nodes"]] == [
        "research-0", "research-1", "research-2", "review", "synthesis"
    ]  # fmt: skip
    assert {n["status"] for n in out["nodes"]} == {"completed"}


def test_steered_flow_is_paused_messaged_and_resumed_from_another_process(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "gate-gather").touch()  # gather is held until the steering process is done
    flow = subprocess.Popen(
        [
            sys.executable,
            str(GATED),
            *_example("steered.py", "flow", "--home", home, "--slow-s", 0)[1:],
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        steer = _run(_example("steered.py", "steer", "--home", home, "--message", "be brief"))
        (home / "release-gather").touch()
        out, err = flow.communicate(timeout=TIMEOUT_S)
    finally:
        if flow.poll() is None:
            flow.kill()
            flow.communicate(timeout=30)
    assert steer.returncode == 0, steer.stderr
    assert flow.returncode == 0, err
    ids = dict(line.split() for line in steer.stdout.splitlines())
    assert list(ids) == ["pause", "message", "resume"]
    assert all(re.fullmatch(CONTROL_ID, value) for value in ids.values()), ids

    events = out.splitlines()
    assert re.fullmatch(r"run \S+ session [0-9a-f]{32}", events[0]), events[0]
    assert events[-1] == "status completed"
    kinds = [line.split()[0] for line in events[1:-1]]
    # The pause, the message and the resume land while gather is held; the drafts start
    # after it, and the first of them carries the message.
    pause = kinds.index("control_applied")
    assert events[1 + pause].startswith("control_applied verb=pause")
    assert "control_applied verb=resume messages=0" in events
    delivered = [e for e in events if e.startswith("control_applied verb=message")]
    assert delivered == ["control_applied verb=message key=draft-0 messages=1"]
    started = [e.split()[1] for e in events if e.startswith("node_started")]
    assert started == [
        "key=gather", "key=draft-0", "key=draft-1", "key=draft-2", "key=synthesis"
    ]  # fmt: skip
    gather_done = events.index(next(e for e in events if e.startswith("node_completed key=gather")))
    assert events.index(events[1 + pause]) < gather_done


SUMMARY = r"PASSED: 3 passed in \d+\.\d+s"
#: The fault seam's acks: the initial flush, then one per durable outcome.
AFTER_WRITE_CODE, AFTER_RUN_TESTS = "exit:after:ack:2", "exit:after:ack:3"


def _review_lines(stdout: str) -> tuple[str, list[str]]:
    """The run id from ``run RUN: status``, and every line after it."""
    lines = stdout.splitlines()
    match = re.fullmatch(r"run (\S+): \w+", lines[0])
    assert match, lines[0]
    return match.group(1), lines[1:]


def _author_calls(home: Path) -> int:
    log = home / "script-invocations.jsonl"
    return [json.loads(line)["node"] for line in log.read_text().splitlines()].count("write-code")


def _killed(home: Path, fault: str) -> tuple[str, Path]:
    """Run code_review.py until the fault seam kills it; the run id and its artifact root."""
    crashed = _run(_example("code_review.py", "--home", home), STEERFLOW_FAULT=fault)
    assert crashed.returncode == 137, crashed.stderr
    (run_id,) = [p.name for p in (home / "runs").iterdir()]
    return run_id, home / "runs" / run_id / "artifacts"


def test_code_review_runs_pytest_in_a_function_node_and_the_review_gets_its_verdict(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    done = _run(_example("code_review.py", "--home", home))
    assert done.returncode == 0, done.stderr
    run_id, lines = _review_lines(done.stdout)
    assert lines[:3] == ["  write-code: completed", "  run-tests: completed", "  review: completed"]
    assert re.fullmatch(f"tests: {SUMMARY}", lines[3]), lines[3]
    verdict = lines[3].removeprefix("tests: ")
    # The review (echo: it repeats its instruction) received the verdict as a dependency.
    review = "\n".join(lines[4:])
    assert review.startswith("### review\n[echo review]\nReview the change.")
    assert f"### run-tests (completed)\n{verdict}" in review
    root = home / "runs" / run_id / "artifacts"
    # pytest wrote nothing beside the author's declared files; its log is run-tests' artifact.
    assert sorted(p.name for p in (root / "write-code").iterdir()) == [
        "slugify.py", "test_slugify.py"
    ]  # fmt: skip
    log = (root / "run-tests" / "pytest.txt").read_text()
    assert verdict.removeprefix("PASSED: ") in log


def test_code_review_stopped_after_its_tests_resumes_without_running_them_again(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    run_id, root = _killed(home, AFTER_RUN_TESTS)
    state, _ = load_checkpoint(home / "runs" / run_id)
    assert set(state["ops"]) == {"write-code", "run-tests"}
    log = root / "run-tests" / "pytest.txt"
    written = log.stat().st_mtime_ns
    cli = [sys.executable, "-m", "steerflow", "--home", str(home), "resume", run_id, "--json"]

    # steerflow imports the function from sys.path, never from the working directory.
    refused = _run(cli)
    assert refused.returncode == 2, refused.stderr
    assert "cannot import module 'code_review'" in refused.stderr

    resumed = _run(cli, PYTHONPATH=str(EXAMPLES))
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    assert {n["id"]: n["status"] for n in out["nodes"]} == dict.fromkeys(
        ["write-code", "run-tests", "review"], "completed"
    )
    # Neither the author nor the function ran again: both replayed from the checkpoint.
    assert "node replayed write-code" in resumed.stderr
    assert "node replayed run-tests" in resumed.stderr
    assert "start run-tests" not in resumed.stderr and "start review" in resumed.stderr
    assert log.stat().st_mtime_ns == written
    assert _author_calls(home) == 1
    assert re.search(f"### run-tests \\(completed\\)\n{SUMMARY}", out["result"]), out["result"]


def test_code_review_stopped_before_its_tests_runs_them_on_the_authors_files_on_resume(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    run_id, root = _killed(home, AFTER_WRITE_CODE)
    assert not (root / "run-tests").exists()

    resumed = _run(_example("code_review.py", "--home", home, "--resume", run_id))
    assert resumed.returncode == 0, resumed.stderr
    new_run, lines = _review_lines(resumed.stdout)
    assert new_run != run_id
    assert re.fullmatch(f"tests: {SUMMARY}", lines[3]), lines
    # The resumed run keeps the source's artifact root: the function found the author's
    # files there, and wrote its own log beside them; the author did not run again.
    assert (root / "run-tests" / "pytest.txt").is_file()
    assert _author_calls(home) == 1


def _code_review() -> ModuleType:
    spec = importlib.util.spec_from_file_location("code_review", EXAMPLES / "code_review.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_code_reviews_function_reports_failing_tests_as_its_verdict(tmp_path: Path) -> None:
    author = tmp_path / "artifacts" / "write-code"
    author.mkdir(parents=True)
    (author / "slugify.py").write_text("def slugify(text):\n    return text.lower()\n")
    (author / "test_slugify.py").write_text(
        "from slugify import slugify\n\n"
        "def test_lower():\n    assert slugify('AB') == 'ab'\n\n"
        "def test_hyphens():\n    assert slugify('a b') == 'a-b'\n"
    )
    call = NodeCall(run_id="r", node_id="run-tests", instruction="Run the tests.",
                    artifact_path=tmp_path / "artifacts" / "run-tests")  # fmt: skip
    verdict = _code_review().run_tests(call)
    assert re.fullmatch(r"FAILED: 1 failed, 1 passed in \d+\.\d+s", verdict), verdict
    log = (tmp_path / "artifacts" / "run-tests" / "pytest.txt").read_text()
    assert "test_hyphens" in log and "AssertionError" in log
    assert sorted(p.name for p in author.iterdir()) == ["slugify.py", "test_slugify.py"]


def _steps(stdout: str) -> list[str]:
    return [line.strip() for line in stdout.splitlines() if line.startswith("  step ")]


def test_coding_agent_fixes_the_failing_test_with_its_tools_offline(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "project"
    done = _run(_example("coding_agent.py", "--home", home, "--workdir", work))
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"run \d{8}T\d{6}-[0-9a-f]{6}: completed", done.stdout.splitlines()[0])
    assert _steps(done.stdout) == [
        "step 1: model model completed", "step 2: tool run_pytest completed",
        "step 3: model model completed", "step 4: tool read_file completed",
        "step 5: model model completed", "step 6: tool write_file completed",
        "step 7: model model completed", "step 8: tool run_pytest completed",
        "step 9: model reply completed",
    ]  # fmt: skip
    assert "tests now: PASSED" in done.stdout
    assert "(ordered[middle - 1] + ordered[middle]) / 2" in (work / "stats.py").read_text()


def test_coding_agent_killed_after_writing_resumes_without_writing_again(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "project"
    # The third tool call (write_file) returned and its result is on record; then death.
    killed = _run(_example("coding_agent.py", "--home", home, "--workdir", work),
                  STEERFLOW_FAULT="exit:after:tool-result:3")  # fmt: skip
    assert killed.returncode == 137, killed.stderr
    fixed = (work / "stats.py").read_text()
    assert "middle - 1" in fixed
    (work / "stats.py").write_text(fixed + "# edited after the crash\n")  # a rewrite would drop it
    run_id = sorted(p.name for p in (home / "runs").iterdir())[-1]
    done = _run(_example("coding_agent.py", "--home", home, "--workdir", work, "--resume", run_id))
    assert done.returncode == 0, done.stderr
    assert "tests now: PASSED" in done.stdout
    assert (work / "stats.py").read_text().endswith("# edited after the crash\n")
    assert len(_steps(done.stdout)) == 9
