"""Helpers for the live-control end-to-end tests: real flow and ``ctl`` processes.

A flow runs as ``python -m steerflow --home HOME flow ...`` in its own process; every
control is sent by a separate ``python -m steerflow --home HOME ctl ...`` process.
Tests wait on observable conditions (state DB rows, node statuses) with bounded
timeouts, never on a fixed sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from steerflow.checkpoint import load_checkpoint
from steerflow.state import STATE_DB_URL_ENV, ControlRow, StateDB, db_exists
from waiting import wait_until

T = TypeVar("T")

HERE = Path(__file__).resolve().parent
SLOW_PLANNER = HERE / "ctl_slowplan.py"
DEFAULT_TIMEOUT_S = 30.0


def steerflow_argv(home: Path, *args: str) -> list[str]:
    """``python -m steerflow --home HOME ARGS...``."""
    return [sys.executable, "-m", "steerflow", "--home", str(home), *args]


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test environment without steerflow settings that would leak into a child."""
    env = {
        k: v
        for k, v in os.environ.items()
        # The state DB URL stays: a test on the PostgreSQL backend (state_backend) sets it.
        if not k.startswith("STEERFLOW_") or k in ("STEERFLOW_CONTROL_POLL_S", STATE_DB_URL_ENV)
    }
    env.update(extra or {})
    return env


def run_cli(
    home: Path, *args: str, env: Mapping[str, str] | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run one steerflow command to completion and capture its output."""
    return subprocess.run(
        steerflow_argv(home, *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(env),
        check=False,
    )


def ctl(home: Path, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``steerflow ctl ARGS...``."""
    return run_cli(home, "ctl", *args, timeout=timeout)


def ctl_ok(home: Path, *args: str) -> str:
    """Run a ``ctl`` writer that must queue; return the control id it printed."""
    proc = ctl(home, *args)
    assert proc.returncode == 0, f"ctl {args} exited {proc.returncode}: {proc.stderr}"
    control_id = proc.stdout.splitlines()[0].strip()
    assert len(control_id) == 32 and int(control_id, 16) >= 0, proc.stdout
    assert "queued" in proc.stdout, proc.stdout
    return control_id


def wait_for(
    predicate: Callable[[], T | None],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.02,
    what: str = "condition",
    alive: subprocess.Popen[str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``.

    With ``alive``, fail early if that process exits first.
    """

    def probe() -> T | None:
        value = predicate()
        if not value and alive is not None and alive.poll() is not None:
            value = predicate()  # it may have finished the work just before exiting
            if not value:
                raise AssertionError(f"flow exited ({alive.returncode}) while waiting for {what}")
        return value

    return wait_until(probe, timeout=timeout, what=what, interval=interval)


@contextmanager
def state_db(home: Path) -> Iterator[StateDB]:
    """A short-lived connection to an existing state DB."""
    with StateDB.open(home, create=False) as db:
        yield db


def controls(home: Path, session_id: str) -> list[ControlRow]:
    """Every control row of a session, in ``(created_at, id)`` order."""
    with state_db(home) as db:
        return db.list_controls(session_id)


def control(home: Path, control_id: str) -> ControlRow:
    """One control row (it must exist)."""
    with state_db(home) as db:
        row = db.get_control(control_id)
    assert row is not None, control_id
    return row


def count_controls(home: Path) -> int:
    """Rows in ``session_controls`` (0 when there is no state DB)."""
    if not db_exists(home):
        return 0
    with state_db(home) as db:
        return db.count_controls()


def wait_stamped(
    home: Path, control_id: str, *, timeout: float = DEFAULT_TIMEOUT_S, **kw: Any
) -> ControlRow:
    """Wait until a control row has its terminal stamp (``applied_at`` set)."""
    return wait_for(
        lambda: row if (row := control(home, control_id)).applied_at is not None else None,
        timeout=timeout,
        what=f"control {control_id} to be stamped",
        **kw,
    )


def node_statuses(home: Path, session_id: str) -> dict[str, str]:
    """``{node_key: status}`` as published in ``session_nodes``."""
    with state_db(home) as db:
        return {n.node_key: n.status for n in db.list_nodes(session_id)}


def session_phase(home: Path, session_id: str) -> str | None:
    """The stored phase of a session."""
    with state_db(home) as db:
        row = db.get_session(session_id)
    return None if row is None else row.phase


def node_metadata(home: Path, session_id: str) -> dict[str, Any]:
    """The stored ``node_metadata`` of a session."""
    with state_db(home) as db:
        row = db.get_session(session_id)
    assert row is not None
    return dict(row.node_metadata)


def ctl_status(home: Path, target: str) -> dict[str, Any]:
    """``steerflow ctl status TARGET --json`` as a dict."""
    proc = ctl(home, "status", target, "--json")
    assert proc.returncode == 0, proc.stderr
    view: dict[str, Any] = json.loads(proc.stdout)
    return view


def invocations(home: Path) -> list[dict[str, Any]]:
    """The lines of ``<home>/script-invocations.jsonl``."""
    path = home / "script-invocations.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_yaml(path: Path, data: object) -> Path:
    """Write ``data`` as YAML and return the path."""
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def independent_plan(path: Path, count: int, *, prefix: str = "n") -> list[str]:
    """A plan of ``count`` nodes without dependencies (run one at a time with
    ``--concurrency 1``, so each starts only after the previous one finished and no
    response repeats another's through a dependency block). Returns the keys."""
    keys = [f"{prefix}{i:03d}" for i in range(count)]
    write_yaml(
        path,
        {
            "name": "ctl-independent",
            "plan": [
                {"agent_id": k, "assignee": "worker", "instruction": f"Do task {k}."} for k in keys
            ],
        },
    )
    return keys


@dataclass
class LiveFlow:
    """A flow process and the session it created."""

    home: Path
    proc: subprocess.Popen[str]
    stdout_path: Path
    stderr_path: Path
    session_id: str = ""
    run_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def wait_session(self, timeout: float = DEFAULT_TIMEOUT_S) -> str:
        """Wait until the flow's session row exists; return its id."""

        def found() -> tuple[str, str] | None:
            if not db_exists(self.home):
                return None
            with state_db(self.home) as db:
                rows = db.list_sessions(limit=1)
            if rows and rows[0].status == "running":
                return rows[0].id, rows[0].run_id or ""
            return None

        self.session_id, self.run_id = wait_for(
            found, timeout=timeout, what="the flow's session", alive=self.proc
        )
        return self.session_id

    def wait_nodes(
        self, predicate: Callable[[dict[str, str]], bool], *, what: str, timeout: float = 30.0
    ) -> dict[str, str]:
        """Wait until the published node statuses satisfy ``predicate``."""

        def check() -> dict[str, str] | None:
            statuses = node_statuses(self.home, self.session_id)
            return statuses if statuses and predicate(statuses) else None

        return wait_for(check, timeout=timeout, what=what, alive=self.proc)

    def finish(self, timeout: float = 120.0) -> int:
        """Wait for the process to exit; return its exit code."""
        return self.proc.wait(timeout=timeout)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM the flow (completed work is persisted) and wait for it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def result(self) -> dict[str, Any]:
        """The ``--json`` result the flow printed."""
        out: dict[str, Any] = json.loads(self.stdout_path.read_text())
        return out

    def stderr(self) -> str:
        """What the flow wrote to stderr so far."""
        return self.stderr_path.read_text(errors="replace")

    def checkpoint(self) -> dict[str, Any]:
        """The logical checkpoint state of this run."""
        path = self.home / "runs" / self.run_id / "checkpoint.json"
        state, _report = load_checkpoint(path)
        return state

    def responses(self) -> dict[str, str]:
        """``{agent_id: stored response}`` of every completed planned node."""
        ops = self.checkpoint().get("ops") or {}
        return {
            key: str(entry.get("response"))
            for key, entry in ops.items()
            if entry.get("status") == "completed"
        }


@contextmanager
def live_flow(
    home: Path,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
    wait_session: bool = True,
) -> Iterator[LiveFlow]:
    """Start ``steerflow flow ARGS --json`` (or ``argv``) and yield it once its session exists.

    The process is killed on exit if it is still running.
    """
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    logs = home.parent / f"{home.name}-flow-{time.monotonic_ns()}"
    stdout_path, stderr_path = logs.with_suffix(".out"), logs.with_suffix(".err")
    command = list(argv) if argv is not None else steerflow_argv(home, "flow", *args, "--json")
    with open(stdout_path, "w") as out, open(stderr_path, "w") as err:
        proc = subprocess.Popen(
            command, stdout=out, stderr=err, text=True, env=clean_env(env), cwd=home.parent
        )
    flow = LiveFlow(home, proc, stdout_path, stderr_path)
    try:
        if wait_session:
            flow.wait_session()
        yield flow
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def steer_lines(response: str) -> list[str]:
    """The message lines of the node's own steer block (first in its instruction)."""
    _, _, rest = response.partition("\n")  # drop the "[echo <node>]" line
    if not rest.startswith("[OPERATOR STEER]\n"):
        return []
    block, closed, _ = rest.partition("[/OPERATOR STEER]")
    assert closed, response
    return [line for line in block.splitlines() if line.startswith("- ")]


def occurrences(texts: Iterable[str], responses: Mapping[str, str]) -> dict[str, list[str]]:
    """For each text, the keys of the responses that contain it."""
    return {t: [k for k, r in responses.items() if t in r] for t in texts}
