"""The library's control writers against a live flow process (issue 29 item 4).

``steerflow.pause``/``resume``/``message``/``stop`` each return the id of the row they
queued; the flow (another process, on a state DB outside its home named by URL) applies
it. Targets are a run id, a session id or a prefix of one, as ``ctl`` (plus run ids).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ctl_support import live_flow, wait_for, write_yaml

import steerflow
from steerflow.errors import RefusedError, UnknownIdError
from steerflow.state import StateDB

IN_FLIGHT_S = 60.0  # the slow node never finishes on its own: the stop ends it


def _db(url: str) -> StateDB:
    return StateDB.open_url(url, create=False)


def _running(url: str) -> tuple[str, str] | None:
    """The live session's (id, run id) once its slow node runs."""
    if not Path(url.removeprefix("sqlite:///")).exists():
        return None
    with _db(url) as db:
        rows = db.list_sessions(limit=1)
        if not rows or rows[0].status != "running" or rows[0].phase != "executing":
            return None
        nodes = {n.node_key: n.status for n in db.list_nodes(rows[0].id)}
    return (rows[0].id, rows[0].run_id or "") if nodes.get("slow") == "running" else None


def _result(url: str, control_id: str) -> str | None:
    with _db(url) as db:
        row = db.get_control(control_id)
    assert row is not None, control_id
    return row.result


def test_each_writer_returns_the_id_the_live_flow_applies(tmp_path: Path) -> None:
    home = tmp_path / "home"
    url = f"sqlite:///{tmp_path / 'elsewhere' / 'state.db'}"
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "plan": [
                {"agent_id": "slow", "instruction": "held"},
                {"agent_id": "next", "instruction": "after", "depends_on": ["slow"]},
            ]
        },
    )
    script = write_yaml(tmp_path / "script.yaml", {"slow": {"delay": IN_FLIGHT_S}})
    args = ["--plan", str(plan), "--model", f"script:{script}"]
    with live_flow(home, args, env={"STEERFLOW_STATE_DB_URL": url}, wait_session=False) as flow:
        session_id, run_id = wait_for(lambda: _running(url), timeout=30, what="slow running")
        # The home has no state DB of its own: without the URL there is nothing to steer.
        with pytest.raises(RefusedError):
            steerflow.pause(home, run_id)

        paused = steerflow.pause(home, run_id, state_db=url)
        assert wait_for(lambda: _result(url, paused), timeout=30, what="pause") == "applied"
        noted = steerflow.message(home, session_id[:8], "for the next one", state_db=url)
        assert len(noted) == 32
        resumed = steerflow.resume(home, session_id, state_db=url)
        assert wait_for(lambda: _result(url, resumed), timeout=30, what="resume") == "applied"
        stopped = steerflow.stop(home, run_id, now=True, reason="enough", state_db=url)
        assert flow.finish(timeout=60) == 75, flow.stderr()
        assert _result(url, stopped) == "applied"
        assert flow.result()["stopped_by"] == {
            "control_id": stopped,
            "reason": "enough",
            "now": True,
        }
        with _db(url) as db:
            ids = [c.id for c in db.list_controls(session_id)]
        assert ids == [paused, noted, resumed, stopped]


def test_an_unknown_run_id_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with StateDB.open(home):
        pass  # an empty state DB
    with pytest.raises(UnknownIdError, match="no session ran it"):
        steerflow.stop(home, "20260101T000000-abcdef")


@pytest.mark.parametrize("first", ["steerflow", "steerflow.resume"])
def test_steerflow_resume_is_the_writer_whichever_is_imported_first(
    tmp_path: Path, first: str
) -> None:
    """``steerflow.resume`` is also a subpackage's name; both spellings queue a resume."""
    program = (
        f"import {first}\n"
        "import steerflow, steerflow.views, sys\n"
        "from steerflow.errors import RefusedError\n"
        "for writer in (steerflow.resume, steerflow.views.resume):\n"
        "    try:\n"
        "        writer(sys.argv[1], 'abc123')\n"
        "    except RefusedError as exc:\n"
        "        print(type(writer).__name__, exc)\n"
    )
    home = tmp_path / "home"
    done = subprocess.run(
        [sys.executable, "-c", program, str(home)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all("no state database" in line for line in lines), lines
