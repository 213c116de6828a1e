"""Helpers for the ``steerflow agent`` tests (issue 19): gated turns, a fake ``claude``.

A turn is held open by the test, not by a sleep: the model writes ``started-<key>`` into
a gate directory and waits (bounded) for ``release-<key>`` before it answers, so the test
can send controls from another process while a turn is known to be running.

* ``script:`` turns: the CLI runs through ``agent_gate_cli.py``, which wraps the real
  ``ScriptProvider.invoke`` (it still logs to ``script-invocations.jsonl`` and responds as
  scripted) with the gate. Turn keys are ``turn-1``, ``turn-2``, ...
* ``claude-code/...`` (``codex/...``): :func:`write_gated_claude` writes a fake that records
  argv, cwd and stdin per run, gates on ``started-<n>``/``release-<n>`` (n = its run count),
  and prints the CLI's JSON result with a ``session_id`` (``sess-A`` unless ``--resume ID``
  names one, which it then keeps).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from flow_support import PYTHON, child_env, wait_for

HERE = Path(__file__).resolve().parent
GATE_CLI = HERE / "agent_gate_cli.py"
#: Bound on any single wait of these tests (slow, shared CI machines).
WAIT_S = 60.0

_FAKE_CLAUDE = r"""#!{python}
import json, os, pathlib, sys
sys.path.insert(0, {tests!r})  # the shared bounded wait (tests/waiting.py)
from waiting import wait_until
gate = pathlib.Path({gate!r})
log = pathlib.Path({log!r})
stdin = sys.stdin.read()
n = (len(log.read_text().splitlines()) if log.exists() else 0) + 1
with open(log, "a") as fh:
    fh.write(json.dumps({{"argv": sys.argv, "cwd": os.getcwd(), "stdin": stdin,
                         "pid": os.getpid()}}) + "\n")
(gate / f"started-{{n}}").touch()
release = gate / f"release-{{n}}"
wait_until(release.exists, timeout=120, what=str(release), interval=0.01)
if {codex!r}:
    print(json.dumps({{"type": "item.completed",
                      "item": {{"type": "agent_message", "text": "reply %d" % n}}}}))
    sys.exit(0)
session = sys.argv[sys.argv.index("--resume") + 1] if "--resume" in sys.argv else "sess-A"
print(json.dumps({{"type": "result", "subtype": "success", "is_error": False,
                  "result": "reply %d" % n, "session_id": session, "total_cost_usd": 0.01,
                  "usage": {{"input_tokens": 3, "output_tokens": 4}}}}))
"""


class Gate:
    """The files a gated turn waits on."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)

    def started(self, key: object) -> bool:
        return (self.dir / f"started-{key}").exists()

    def wait_started(self, key: object, proc: subprocess.Popen[str] | None = None) -> None:
        def probe() -> bool:
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"the agent exited ({proc.returncode}) before {key} started")
            return self.started(key)

        wait_for(probe, timeout=WAIT_S, what=f"turn {key} to start")

    def release(self, *keys: object) -> None:
        for key in keys:
            (self.dir / f"release-{key}").touch()


def start_gated_agent(
    home: Path, gate: Gate, *args: object, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``steerflow --home HOME ARGS`` with every ``script:`` turn held by ``gate``."""
    argv = [PYTHON, str(GATE_CLI), str(gate.dir), "--home", str(home), *map(str, args)]
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or child_env(),
        cwd=HERE,
    )


def write_gated_claude(directory: Path, gate: Gate, name: str = "claude") -> tuple[Path, Path]:
    """A fake ``claude`` (or, named ``codex``, a fake ``codex exec``) and its run log."""
    directory.mkdir(parents=True, exist_ok=True)
    path, log = directory / name, directory / f"{name}.log"
    path.write_text(
        _FAKE_CLAUDE.format(
            python=sys.executable,
            tests=str(HERE.parent),
            gate=str(gate.dir),
            log=str(log),
            codex=name == "codex",
        )
    )
    path.chmod(0o755)
    return path, log


def claude_runs(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def session_of(home: Path) -> str:
    """The newest session id, once the agent has created it."""
    from steerflow.state import StateDB, db_exists

    def probe() -> str | None:
        if not db_exists(home):
            return None
        with StateDB.open(home, create=False) as db:
            rows = db.list_sessions(limit=1)
            return rows[0].id if rows else None

    return wait_for(probe, timeout=WAIT_S, what="the agent session")


def poller_listed(home: Path, session_id: str) -> None:
    """Return once the session's poller has listed every row committed before this call.

    ``ctl pause`` refuses an agent before any insert, so a ``pause`` row inserted by another
    writer is stamped ``rejected:error:...`` by the poller as soon as it lists it; once it
    is stamped, every earlier row of the session was looked at too.
    """
    from steerflow.state import StateDB

    with StateDB.open(home, create=False) as db:
        probe = db.insert_control(session_id=session_id, verb="pause", payload=None).id

    def stamped() -> bool:
        with StateDB.open(home, create=False) as db:
            row = db.get_control(probe)
        return row is not None and (row.result or "").startswith("rejected:error:")

    wait_for(stamped, timeout=WAIT_S, what="the agent's poller to list the session's rows")


def wait_left_pending(home: Path, control_id: str) -> None:
    """The agent's poller has seen the message and left it pending (issue 26).

    A message sent while a turn runs is claimed only when the turn that renders it
    (the next one) starts; until then its row stays pending.
    """
    from steerflow.state import StateDB

    with StateDB.open(home, create=False) as db:
        row = db.get_control(control_id)
    assert row is not None, control_id
    poller_listed(home, row.session_id)
    with StateDB.open(home, create=False) as db:
        row = db.get_control(control_id)
    assert row is not None and row.result is None, row  # not claimed while the turn runs
