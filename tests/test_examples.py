"""The programs in ``examples/`` run as a user runs them, each in a real process (issue 29).

``research_fanout.py`` builds its plan in code and runs it on ``echo``; the YAML it saves
runs with ``steerflow flow --plan``. ``steered.py flow`` is steered by ``steered.py steer``,
another process, through the library's control writers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

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


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT_S, env=_env(), check=False
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


def test_the_readme_from_python_section_runs_in_under_25_lines(tmp_path: Path) -> None:
    readme = (EXAMPLES.parent / "README.md").read_text(encoding="utf-8")
    section = readme.partition("\n## From Python\n")[2].partition("\n## ")[0]
    code = section.partition("```python\n")[2].partition("```")[0]
    assert 0 < len(code.splitlines()) < 25
    home = tmp_path / "home"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**_env(), "STEERFLOW_HOME": str(home)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "plan_ready " and re.fullmatch(r"completed \S+", lines[-1]), lines
    assert "node_completed synthesis" in lines
    assert (home / "runs" / lines[-1].split()[1] / "checkpoint.json").is_file()
