"""A stalled owner, a resume that takes its lease over, and the owner waking up (issue 27).

The issue's repro, on each state backend: ``play demo --model script:slow.yaml`` runs
with its three ``angle-*`` calls in flight when it is ``SIGSTOP``ped; ``resume`` from
another host (``STEERFLOW_HOST_ID=other``, so only the lease can tell the owner is gone)
is refused while the lease is fresh, and accepted once the state DB's own clock says it
expired; ``SIGCONT`` wakes the owner, which must start no new call, record none of its
in-flight outcomes as the run's, and exit 3 with one ``taken over`` line naming the run,
the new session and its host. Counted in ``<home>/script-invocations.jsonl``: every node
is invoked once, except the three calls the owner had in flight when it stalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from ctl_support import clean_env, live_flow, node_statuses, run_cli, steerflow_argv, wait_for
from flow_support import read_invocations, write_yaml

from steerflow.checkpoint import load_checkpoint
from steerflow.state import LEASE_ENV, StateDB

ANGLES = ("angle-history", "angle-tools", "angle-risks")
LATER = ("draft", "review", "summary", "synthesis")
LEASE_S = "2"
# The takeover test first checks that a live owner's lease refuses a resume. With a 2 s
# lease a run starved of CPU for ~1.5 s (seen at load 12 on two cores) lets its lease
# lapse while it is alive, so that check is made with a lease that only a real stall
# outlasts; the angles outlast the refused resume's own start-up.
FRESH_LEASE_S = "6"
ANGLE_DELAY_S = 8.0


def _slow_script(path: Path, angle_delay: float = 4.0) -> Path:
    # The angles are slow enough to be caught in flight; the rest keeps the test short.
    delays = {angle: {"delay": angle_delay} for angle in ANGLES}
    return write_yaml(path, {"*": {"delay": 0.2}, **delays})


def _lines(home: Path, run_id: str) -> list[dict[str, Any]]:
    return [line for line in read_invocations(home) if line["run_id"] == run_id]


def _lease_expired(home: Path, session_id: str) -> bool:
    """Whether the state DB's own clock is past the session's lease (what a resume reads)."""
    with StateDB.open(home, create=False) as db:
        clock = db.backend.clock_sql
        rows = db.backend.query(
            f"SELECT lease_expires < {clock} AS expired FROM sessions WHERE id = ?",
            (session_id,),
        )
    return bool(rows[0]["expired"])


def _session(home: Path, session_id: str) -> Any:
    with StateDB.open(home, create=False) as db:
        return db.get_session(session_id)


def _resume_elsewhere(home: Path, run_id: str, **env: str) -> Any:
    return run_cli(
        home, "resume", run_id, "--json", env=clean_env({"STEERFLOW_HOST_ID": "other", **env})
    )


def _start_resume(
    home: Path, run_id: str, env: dict[str, str], logs: Path
) -> subprocess.Popen[str]:
    with open(logs.with_suffix(".out"), "w") as out, open(logs.with_suffix(".err"), "w") as err:
        return subprocess.Popen(
            steerflow_argv(home, "resume", run_id, "--json"),
            stdout=out, stderr=err, text=True,
            env=clean_env({"STEERFLOW_HOST_ID": "other", **env}),
        )  # fmt: skip


def _stall_in_flight(home: Path, script: Path, env: dict[str, str]) -> Any:
    argv = steerflow_argv(home, "play", "demo", "--model", f"script:{script}", "--json")
    return live_flow(home, [], env=env, argv=argv)


def _wait_angles_in_flight(home: Path, flow: Any) -> None:
    def ready() -> bool:
        started = {line["node"] for line in _lines(home, flow.run_id)}
        return started >= {"scope", *ANGLES}

    wait_for(ready, timeout=60, what="the three angles in flight", alive=flow.proc)


@pytest.mark.timeout(240)
def test_a_stalled_owner_taken_over_runs_nothing_more(tmp_path: Path, state_backend: str) -> None:
    home = tmp_path / "home"
    script = _slow_script(tmp_path / "slow.yaml", ANGLE_DELAY_S)
    env = {LEASE_ENV: FRESH_LEASE_S}
    with _stall_in_flight(home, script, env) as flow:
        _wait_angles_in_flight(home, flow)
        # Live and renewing: another host's resume is refused by the lease.
        fresh = _resume_elsewhere(home, flow.run_id, **env)
        assert fresh.returncode == 3, fresh.stdout + fresh.stderr
        assert "is still running" in fresh.stderr and "lease runs" in fresh.stderr, fresh.stderr
        assert not _lines(home, flow.run_id)[4:], "the refused resume changed nothing"

        os.kill(flow.proc.pid, signal.SIGSTOP)
        try:
            stopped_at = time.time()
            wait_for(lambda: _lease_expired(home, flow.session_id), timeout=30,
                     what="the lease expired by the state DB's clock")  # fmt: skip
            resumed = _start_resume(home, flow.run_id, env, tmp_path / "resume")
            taken = wait_for(
                lambda: (row := _session(home, flow.session_id)).lease_taken_by and row,
                timeout=60,
                what="the resume to take the lease over",
                alive=resumed,
            )
        finally:
            woke_at = time.time()
            os.kill(flow.proc.pid, signal.SIGCONT)
        assert flow.finish(timeout=60) == 3, flow.stderr()
        assert resumed.wait(timeout=120) == 0, (tmp_path / "resume.err").read_text()

    new = _session(home, taken.lease_taken_by)
    assert (new.owner_host, new.kind) == ("other", "play")
    # The new owner's token is above the one it fenced, which now carries it too.
    assert taken.status == "interrupted"
    assert (taken.lease_epoch, new.lease_epoch) == (2, 2), (taken, new)
    line = [ln for ln in flow.stderr().splitlines() if "taken over" in ln]
    assert len(line) == 1, flow.stderr()
    for name in (flow.run_id, new.id, "other"):
        assert name in line[0], (name, line[0])

    # The stalled owner started nothing after it woke: its calls are the four it had
    # started before the stop (scope done, three angles in flight).
    owner = _lines(home, flow.run_id)
    assert sorted(ln["node"] for ln in owner) == sorted(["scope", *ANGLES]), owner
    assert all(ln["ts"] < stopped_at for ln in owner), (stopped_at, woke_at, owner)
    # The resume replayed scope and ran everything else once.
    again = _lines(home, new.run_id or "")
    assert sorted(ln["node"] for ln in again) == sorted([*ANGLES, *LATER]), again
    # Nothing the owner finished after the takeover was recorded as its run's.
    state, _ = load_checkpoint(home / "runs" / flow.run_id / "checkpoint.json")
    done = {k for k, e in state["ops"].items() if e.get("status") == "completed"}
    assert done == {"scope"}, done
    statuses = node_statuses(home, flow.session_id)
    assert all(statuses[a] != "completed" for a in ANGLES), statuses
    assert _session(home, flow.session_id).status == "interrupted"


@pytest.mark.timeout(180)
def test_a_stalled_owner_with_a_fresh_lease_is_not_taken_over(
    tmp_path: Path, state_backend: str
) -> None:
    home = tmp_path / "home"
    script = _slow_script(tmp_path / "slow.yaml")
    with _stall_in_flight(home, script, {LEASE_ENV: "60"}) as flow:
        _wait_angles_in_flight(home, flow)
        os.kill(flow.proc.pid, signal.SIGSTOP)
        try:
            refused = _resume_elsewhere(home, flow.run_id)
        finally:
            os.kill(flow.proc.pid, signal.SIGCONT)
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert f"run {flow.run_id} is still running" in refused.stderr, refused.stderr
        assert "lease runs" in refused.stderr, refused.stderr
        assert flow.finish(timeout=120) == 0, flow.stderr()
    counts: dict[str, int] = {}
    for line in read_invocations(home):
        counts[line["node"]] = counts.get(line["node"], 0) + 1
    assert counts == dict.fromkeys(["scope", *ANGLES, *LATER], 1), counts
    assert len({ln["run_id"] for ln in read_invocations(home)}) == 1


@pytest.mark.timeout(180)
def test_a_stalled_agent_taken_over_records_no_turn(tmp_path: Path, state_backend: str) -> None:
    home = tmp_path / "home"
    script = write_yaml(tmp_path / "slow.yaml", {"turn-1": {"delay": 4.0}})
    env = {LEASE_ENV: LEASE_S}
    argv = steerflow_argv(home, "agent", "write it", "--model", f"script:{script}", "--json")
    with live_flow(home, [], env=env, argv=argv) as agent:
        wait_for(lambda: _lines(home, agent.run_id), timeout=60, what="turn 1 in flight",
                 alive=agent.proc)  # fmt: skip
        os.kill(agent.proc.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: _lease_expired(home, agent.session_id), timeout=30,
                     what="the lease expired by the state DB's clock")  # fmt: skip
            resumed = _start_resume(home, agent.run_id, env, tmp_path / "resume")
            taken = wait_for(
                lambda: (row := _session(home, agent.session_id)).lease_taken_by and row,
                timeout=60, what="the resume to take the lease over", alive=resumed,
            )  # fmt: skip
        finally:
            os.kill(agent.proc.pid, signal.SIGCONT)
        assert agent.finish(timeout=60) == 3, agent.stderr()
        assert resumed.wait(timeout=120) == 0, (tmp_path / "resume.err").read_text()
    assert any("taken over" in ln and taken.lease_taken_by in ln
               for ln in agent.stderr().splitlines()), agent.stderr()  # fmt: skip
    assert [ln["node"] for ln in _lines(home, agent.run_id)] == ["turn-1"]
    new = _session(home, taken.lease_taken_by)
    assert [ln["node"] for ln in _lines(home, new.run_id or "")] == ["turn-1"]
    state, _ = load_checkpoint(home / "runs" / agent.run_id / "checkpoint.json")
    assert "turn-1" not in state["ops"], state["ops"]
