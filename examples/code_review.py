"""A code review with a deterministic step: write code, run its tests, review the verdict.

    python examples/code_review.py [--home DIR] [--model SPEC] [--resume RUN]

Three nodes, built in code. ``write-code`` is the author: offline, a ``script:`` stand-in
(``code_review_author.yaml`` beside this file) writes ``slugify.py`` and
``test_slugify.py`` into its artifact directory, both declared as the op's artifacts, so
a resume checks them byte for byte. ``run-tests`` is a function node,
``python:code_review:run_tests``: :func:`run_tests` below runs ``python -m pytest -q`` in
write-code's artifact directory and answers with the verdict and pytest's summary line.
``review`` (``--model``, default ``echo``) gets that verdict through its dependency.
Needs pytest in the interpreter that runs it.

A plan naming ``python:`` runs code, so it needs consent: ``FlowOptions(allow_python=True)``
is what ``--allow-python`` is for a plan file. steerflow imports the function from
``sys.path`` (never the working directory), so this program puts its own directory there.
The run resumes like any other, and a completed ``run-tests`` is replayed, not run again::

    python examples/code_review.py --resume RUN
    PYTHONPATH=examples steerflow resume RUN    # the CLI, given the same sys.path
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

import steerflow
import steerflow.views
from steerflow import NodeCall, Op, Plan, Role

HERE = Path(__file__).resolve().parent
AUTHOR_SCRIPT = HERE / "code_review_author.yaml"
FILES = ("slugify.py", "test_slugify.py")
TESTS_SPEC = "python:code_review:run_tests"  # this file, imported as the module code_review
PYTEST_TIMEOUT_S = 300


def run_tests(call: NodeCall) -> str:
    """The ``run-tests`` node: pytest over write-code's files; the verdict is the response.

    Blocking is fine here: a plain function runs on a thread, off the run's event loop.
    pytest's full output becomes this node's artifact ``pytest.txt``.
    """
    # A leg's artifact directory is <artifact root>/<node id>, so the author's files are
    # beside this node's own directory (a resume keeps the source run's root).
    code = call.artifact_path.parent / "write-code"
    done = subprocess.run(
        # -c os.devnull, --rootdir: no ini file above the run directory applies; no cache
        # and no bytecode, so nothing is written into the author's directory; and none of
        # the plugins installed here, so the tests run as the author wrote them.
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-c", os.devnull, "--rootdir", str(code), str(code)],
        cwd=code,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True,
        text=True,
        timeout=PYTEST_TIMEOUT_S,
        check=False,
    )  # fmt: skip
    (call.artifact_dir() / "pytest.txt").write_text(done.stdout + done.stderr, encoding="utf-8")
    lines = done.stdout.strip().splitlines()
    summary = lines[-1] if lines else f"pytest exited {done.returncode}: {done.stderr.strip()}"
    return f"{'PASSED' if done.returncode == 0 else 'FAILED'}: {summary}"


def review_plan() -> Plan:
    """Author, tests, review: the review reads the author's note and the test verdict."""
    return Plan(
        name="code review",
        ops=[
            Op(
                "write-code",
                "Write slugify.py with slugify(text) -> str, and test_slugify.py for it.",
                assignee="author",
                artifacts=FILES,
            ),
            Op(
                "run-tests",
                "Run the tests.",
                depends_on=["write-code"],
                assignee="tester",
                artifacts=["pytest.txt"],
            ),
            Op(
                "review",
                "Review the change. Approve only if the tests passed; else request changes.",
                depends_on=["write-code", "run-tests"],
            ),
        ],
        roles={
            "author": Role(model=f"script:{AUTHOR_SCRIPT}"),
            "tester": Role(model=TESTS_SPEC),
        },
    )


def main() -> int:
    """Run (or resume) the review, then print each node, the test verdict and the review."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="steerflow home (default: STEERFLOW_HOME or ~/.steerflow)")
    parser.add_argument("--model", default="echo", help="the reviewer's model (default: echo)")
    parser.add_argument("--resume", metavar="RUN", help="continue this run instead")
    args = parser.parse_args()

    # Where steerflow finds the module code_review (python examples/code_review.py puts
    # it there too; runpy, or importing main() from elsewhere, does not).
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    home = steerflow.resolve_home(args.home)
    if args.resume is not None:
        # A resume does not ask for consent again: the run it continues had it.
        options = steerflow.FlowOptions(resume=steerflow.prepare_resume(home, args.resume))
    else:
        options = steerflow.FlowOptions(plan=review_plan(), model=args.model, allow_python=True)
    result = asyncio.run(steerflow.run_flow(options, home=home))
    print(f"run {result.run_id}: {result.status}")
    for node in result.nodes:
        print(f"  {node['id']}: {node['status']}")
    if result.run_id is None:
        return int(result.exit_code)
    tests = steerflow.views.node_detail(home, result.run_id, "run-tests")
    print(f"tests: {tests.response_text or tests.status}")
    print(steerflow.views.run_result(home, result.run_id).text)
    return int(result.exit_code)


if __name__ == "__main__":
    raise SystemExit(main())
