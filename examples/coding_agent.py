"""A coding agent that fixes a failing test with file and pytest tools, step by step.

    python examples/coding_agent.py [--home DIR] [--workdir DIR] [--model SPEC] [--resume RUN]

One node, ``fix``, with three tools defined below: :func:`read_file`, :func:`write_file`
and :func:`run_pytest`, given to the op as functions (``Op(tools=[...])`` keeps each as
``python:coding_agent:NAME``, which a resume in another process imports again). The
project is a copy of a small package whose test fails (``median`` of an even-length list
is wrong), made in ``--workdir`` (default: a new temporary directory).

Offline, the model is ``script:`` (``coding_agent_script.yaml`` beside this file): it
reads the code, runs the tests, writes the fix and runs the tests again, one tool call
per step, exactly as a real model's replies would drive the loop; ``--model
openai/gpt-4.1`` (or ``anthropic/...``) runs the same flow against a real model.
Every step is journaled before the next begins: kill the program at any point and
``--resume RUN`` continues at the first unrecorded step, never running a finished tool
call again (``write_file`` is a side effect; ``read_file`` and ``run_pytest`` are declared
idempotent, so one a crash interrupted simply runs again).

``steerflow show RUN fix`` lists the steps; ``steerflow show RUN fix --follow`` streams
them while the agent works. With ``--ask-before-pytest`` each ``run_pytest`` call waits
for an operator: ``steerflow approvals`` lists it, ``steerflow ctl approve RUN REQUEST_ID``
(from any terminal) lets it run, ``steerflow ctl deny RUN REQUEST_ID --reason TEXT`` tells
the model why not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import steerflow
import steerflow.views
from steerflow import Op, Plan

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "coding_agent_script.yaml"
WORKDIR_ENV = "CODING_AGENT_WORKDIR"
PYTEST_TIMEOUT_S = 300

BUGGY = {
    "stats.py": '''"""Small statistics helpers."""


def median(values: list[float]) -> float:
    """The middle value of ``values`` (the mean of the two middle ones for an even count)."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]
''',
    "test_stats.py": """from stats import median


def test_odd() -> None:
    assert median([3, 1, 2]) == 2


def test_even() -> None:
    assert median([4, 1, 3, 2]) == 2.5
""",
}


def _inside(path: str) -> Path:
    """``path`` under the project; anything that would leave it is refused."""
    root = Path(os.environ[WORKDIR_ENV]).resolve()
    target = (root / path).resolve()
    if not target.is_relative_to(root):
        raise ValueError(f"{path!r} is outside the project")
    return target


def read_file(path: str) -> str:
    """Read a file of the project.

    Args:
        path: The file's path, relative to the project root.
    """
    return _inside(path).read_text(encoding="utf-8")


def write_file(path: str, content: str) -> str:
    """Replace a file of the project with new content.

    Args:
        path: The file's path, relative to the project root.
        content: The whole new content of the file.
    """
    _inside(path).write_text(content, encoding="utf-8")
    return f"wrote {len(content)} characters to {path}"


def run_pytest() -> str:
    """Run the project's tests with pytest; the summary and any failures."""
    root = Path(os.environ[WORKDIR_ENV])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
         "--rootdir", str(root), str(root)],
        cwd=root,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True,
        text=True,
        timeout=PYTEST_TIMEOUT_S,
        check=False,
    )  # fmt: skip
    verdict = "PASSED" if done.returncode == 0 else "FAILED"
    return f"{verdict}\n{done.stdout[-4000:]}{done.stderr[-1000:]}"


def fix_plan(ask_before_pytest: bool = False) -> Plan:
    """One agent node that may read, write and test the project.

    ``ask_before_pytest``: every ``run_pytest`` call (it runs code) waits for an operator's
    ``steerflow ctl approve RUN REQUEST_ID`` (or ``deny``) first (docs/approvals.md).
    """
    # The functions as the module ``coding_agent`` holds them, not as ``__main__`` does:
    # a resume in another process imports that name (``Op`` refuses ``__main__``'s).
    from coding_agent import read_file, run_pytest, write_file

    return Plan(
        name="coding agent",
        ops=[
            Op(
                "fix",
                "The project's tests fail. Find the bug, fix it, and make sure the tests pass. "
                "Answer with what you changed.",
                tools=[read_file, write_file, run_pytest],
                max_steps=12,
            )
        ],
        tool_options={
            "read_file": {"idempotent": True},
            "run_pytest": {"idempotent": True}
            | ({"approval": "required"} if ask_before_pytest else {}),
        },
    )


def _project(workdir: str | None) -> Path:
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="coding-agent-"))
    root.mkdir(parents=True, exist_ok=True)
    for name, text in BUGGY.items():
        if not (root / name).exists():
            (root / name).write_text(text, encoding="utf-8")
    return root


def main() -> int:
    """Run (or resume) the agent, then print its steps, its answer and the final test run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="steerflow home (default: STEERFLOW_HOME or ~/.steerflow)")
    parser.add_argument("--workdir", help="the project (made, with the failing test, if new)")
    parser.add_argument("--model", default=f"script:{SCRIPT}", help="the agent's model")
    parser.add_argument("--resume", metavar="RUN", help="continue this run instead")
    parser.add_argument(
        "--ask-before-pytest",
        action="store_true",
        help="each run_pytest call waits for `steerflow ctl approve RUN REQUEST_ID`",
    )
    args = parser.parse_args()

    # steerflow imports the tools as the module coding_agent from sys.path.
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    if os.environ.get(WORKDIR_ENV) and not args.workdir:
        args.workdir = os.environ[WORKDIR_ENV]
    os.environ[WORKDIR_ENV] = str(_project(args.workdir))
    home = steerflow.resolve_home(args.home)
    if args.resume is not None:
        options = steerflow.FlowOptions(resume=steerflow.prepare_resume(home, args.resume))
    else:
        plan = fix_plan(args.ask_before_pytest)
        options = steerflow.FlowOptions(plan=plan, model=args.model, allow_python=True)
    result = asyncio.run(steerflow.run_flow(options, home=home))
    print(f"run {result.run_id}: {result.status}")
    print(f"project: {os.environ[WORKDIR_ENV]}")
    if result.run_id is None:
        return int(result.exit_code)
    fix = steerflow.views.node_detail(home, result.run_id, "fix")
    for step in fix.raw.get("steps", []):
        what = step.get("tool") or ("reply" if not step.get("tool_calls") else "model")
        print(f"  step {step['index']}: {step['kind']} {what} {step['status']}")
    print(f"answer: {fix.response_text or fix.status}")
    print(f"tests now: {run_pytest().splitlines()[0]}")
    shutil.rmtree(Path(os.environ[WORKDIR_ENV]) / "__pycache__", ignore_errors=True)
    return int(result.exit_code)


if __name__ == "__main__":
    raise SystemExit(main())
