"""The hot CLI paths import only what they use (issue 29 item 6), checked in real processes.

``ctl`` is the live steering path: an operator's ``ctl msg`` starts a process whose start-up
is the latency they see, so it must not load the plan models (pydantic), the servers
(Starlette, the MCP SDK), the flow machinery or asyncio. ``runs`` and ``show`` read the
state DB and the checkpoint (so do ``show RUN NODE`` and ``result``), and need none of that
either. Each case runs ``steerflow.cli.main`` in a fresh interpreter against a home holding
one finished run, then lists ``sys.modules``: a deterministic check, not a timing
(``benchmarks/cli_start.py`` has the timings).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from steerflow.cli import main as cli_main

# Runs the command line in this interpreter, then writes what it loaded to $SF_MODULES_OUT.
_PROBE = """
import json, os, sys
from steerflow.cli import main
code = main(sys.argv[1:])
with open(os.environ["SF_MODULES_OUT"], "w") as out:
    json.dump({"exit_code": code, "modules": sorted(sys.modules)}, out)
"""

#: Never on a read or control path: the plan models, servers, the flow machinery, the loop.
NEVER = (
    "pydantic",
    "starlette",
    "uvicorn",
    "mcp",
    "rich",
    "yaml",
    "asyncio",
    "steerflow.plan._model",
    "steerflow.executor",
    "steerflow.orchestrate._run",
    "steerflow.checkpoint._writer",
    "steerflow.cli._cmd_flow",
    "steerflow.studio",
    "steerflow.state._postgres",  # SQLite here: the backend is never loaded (decision 391)
)
#: Not on the ``ctl`` path either: plans and checkpoints are not read to queue a control.
NEVER_FOR_CTL = (*NEVER, "steerflow.plan", "steerflow.checkpoint", "steerflow.cli._cmd_read")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """(home, run_id, session_id) of one completed ``play demo`` run."""
    home = tmp_path_factory.mktemp("imports") / "home"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cli_main(["--home", str(home), "play", "demo", "--json"])
    result = json.loads(out.getvalue())
    assert code == 0 and result["status"] == "completed", result
    return home, result["run_id"], result["session_id"]


def _loaded(home: Path, tmp_path: Path, args: list[str]) -> dict[str, Any]:
    """Exit code and ``sys.modules`` of ``steerflow --home HOME ARGS`` in a new process."""
    report = tmp_path / "modules.json"
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("STEERFLOW_HOME", "STEERFLOW_STATE_DB_URL", "COVERAGE_PROCESS_START", "FORCE_COLOR")
    }
    env["SF_MODULES_OUT"] = str(report)
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, "--home", str(home), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert report.is_file(), f"probe wrote nothing; exit {proc.returncode}\n{proc.stderr}"
    loaded: dict[str, Any] = json.loads(report.read_text())
    return loaded


def _offending(modules: list[str], never: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == n or m.startswith(n + ".") for n in never)]


# (argv after --home with RUN and SESSION placeholders, expected exit code)
CTL_CASES = [
    (["ctl", "pause", "SESSION"], 3),  # the run finished: refused after resolving the id
    (["ctl", "resume", "SESSION"], 3),
    (["ctl", "msg", "SESSION", "focus on tests"], 3),
    (["ctl", "stop", "SESSION"], 3),
    (["ctl", "status", "SESSION"], 0),
    (["ctl", "status", "SESSION", "--json"], 0),
]
READ_CASES = [
    (["runs"], 0),
    (["runs", "--json"], 0),
    (["show", "RUN"], 0),
    (["show", "RUN", "--json"], 0),
    (["show", "RUN", "scope"], 0),  # one node in full: the same readers
    (["result", "RUN"], 0),
]


def _id(template: list[str]) -> str:
    return "-".join(a.strip("-").replace(" ", "_") for a in template)


def _argv(template: list[str], run_id: str, session: str) -> list[str]:
    return [{"RUN": run_id, "SESSION": session}.get(a, a) for a in template]


@pytest.mark.parametrize(("template", "code"), CTL_CASES, ids=[_id(t) for t, _ in CTL_CASES])
def test_ctl_imports_no_plan_models_servers_or_loop(
    finished_run: tuple[Path, str, str], tmp_path: Path, template: list[str], code: int
) -> None:
    home, run_id, session = finished_run
    loaded = _loaded(home, tmp_path, _argv(template, run_id, session))
    assert loaded["exit_code"] == code
    assert "steerflow.cli._cmd_ctl" in loaded["modules"]  # the probe sees what ran
    assert _offending(loaded["modules"], NEVER_FOR_CTL) == []


@pytest.mark.parametrize(("template", "code"), READ_CASES, ids=[_id(t) for t, _ in READ_CASES])
def test_runs_show_result_import_no_plan_models_servers_or_loop(
    finished_run: tuple[Path, str, str], tmp_path: Path, template: list[str], code: int
) -> None:
    home, run_id, session = finished_run
    loaded = _loaded(home, tmp_path, _argv(template, run_id, session))
    assert loaded["exit_code"] == code
    assert "steerflow.orchestrate._detail" in loaded["modules"]  # the run readers ran
    assert _offending(loaded["modules"], NEVER) == []


def test_the_probe_sees_the_flow_machinery(
    finished_run: tuple[Path, str, str], tmp_path: Path
) -> None:
    """Guard against a check that can never fail: a dry run does load the plan models."""
    home, _, _ = finished_run
    loaded = _loaded(home, tmp_path, ["play", "demo", "--dry-run", "--json"])
    assert loaded["exit_code"] == 0
    found = _offending(loaded["modules"], NEVER)
    assert {"pydantic", "steerflow.plan._model", "steerflow.cli._cmd_flow"} <= set(found)


def test_a_flow_writing_its_progress_to_a_pipe_never_imports_rich(
    finished_run: tuple[Path, str, str], tmp_path: Path
) -> None:
    """Colour is for terminals: a scripted run pays nothing for rich (decision 389), and a
    run on SQLite nothing for the PostgreSQL backend (decision 391)."""
    home, _, _ = finished_run
    loaded = _loaded(home, tmp_path, ["play", "demo", "--json"])
    assert loaded["exit_code"] == 0
    assert "steerflow.cli._progress" in loaded["modules"]  # progress was printed
    assert _offending(loaded["modules"], ("rich", "steerflow.state._postgres")) == []
