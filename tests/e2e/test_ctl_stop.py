"""``ctl stop`` against a live flow process (issue 13 item 6; CONTRACT §10, exit 75).

The flow is ``a -> b -> c`` on the ``script:`` model, ``a`` slow enough to be in
flight when the stop lands. The stop that must land while ``a`` runs is queued in
this process (:func:`flow_support.cli_in_process`, as in ``test_ctl_pause``); the
flow, and every resume, runs in its own process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ctl_support import (
    SLOW_PLANNER,
    control,
    ctl_ok,
    invocations,
    live_flow,
    node_metadata,
    run_cli,
    session_phase,
    state_db,
    wait_stamped,
    write_yaml,
)
from flow_support import cli_in_process

from steerflow.control import MAX_MESSAGE_BYTES

IN_FLIGHT_S = 4.0  # see test_ctl_pause: a wide margin for a loaded 2-core box


def _plan(tmp_path: Path) -> list[str]:
    write_yaml(
        tmp_path / "plan.yaml",
        {
            "name": "stop-chain",
            "plan": [
                {"agent_id": "a", "assignee": "w", "instruction": "first"},
                {"agent_id": "b", "assignee": "w", "instruction": "second", "depends_on": ["a"]},
                {"agent_id": "c", "assignee": "w", "instruction": "third", "depends_on": ["b"]},
            ],
        },
    )  # fmt: skip
    write_yaml(tmp_path / "script.yaml", {"a": {"delay": IN_FLIGHT_S}})
    return ["--plan", str(tmp_path / "plan.yaml"), "--model", f"script:{tmp_path / 'script.yaml'}"]


def _stop(home: Path, target: str, *flags: str) -> str:
    code, out = cli_in_process(home, "ctl", "stop", target, *flags)
    assert code == 0, f"ctl stop exited {code}: {out}"
    control_id = out.splitlines()[0].strip()
    assert len(control_id) == 32 and "queued stop" in out, out
    return control_id


def _invoked(home: Path) -> list[str]:
    return [line["node"] for line in invocations(home)]


def _session_status(home: Path, session_id: str) -> str:
    with state_db(home) as db:
        row = db.get_session(session_id)
    assert row is not None
    return row.status


def _statuses(result: dict[str, object]) -> dict[str, str]:
    nodes = result["nodes"]
    assert isinstance(nodes, list)
    return {n["id"]: n["status"] for n in nodes}


def _resume_to_completion(home: Path, run_id: str) -> dict[str, object]:
    resumed = run_cli(home, "resume", run_id, "--json", timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    body: dict[str, object] = json.loads(resumed.stdout)
    assert body["status"] == "completed"
    assert _statuses(body) == {"a": "completed", "b": "completed", "c": "completed"}
    return body


def test_graceful_stop_lets_the_inflight_op_finish_then_resume_completes(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with live_flow(home, _plan(tmp_path)) as flow:
        sid = flow.session_id
        flow.wait_nodes(lambda s: s.get("a") == "running", what="a running")
        stop = _stop(home, sid, "--reason", "maintenance window")
        assert wait_stamped(home, stop, alive=flow.proc).result == "applied"
        assert flow.finish(timeout=60) == 75, flow.stderr()
    result = flow.result()
    assert result["status"] == "stopped" and result["exit_code"] == 75
    assert _statuses(result) == {"a": "completed", "b": "pending", "c": "pending"}
    assert result["stopped_by"] == {"control_id": stop, "reason": "maintenance window",
                                    "now": False}  # fmt: skip
    assert _invoked(home) == ["a"]  # nothing new admitted after the stop
    assert _session_status(home, sid) == "stopped"
    assert node_metadata(home, sid)["stopped_by"]["reason"] == "maintenance window"

    _resume_to_completion(home, flow.run_id)
    assert sorted(_invoked(home)) == ["a", "b", "c"]  # a is not run again


def test_stop_now_cancels_the_inflight_op_which_stays_pending(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with live_flow(home, _plan(tmp_path)) as flow:
        sid = flow.session_id
        flow.wait_nodes(lambda s: s.get("a") == "running", what="a running")
        stop = _stop(home, sid, "--now")
        assert wait_stamped(home, stop, alive=flow.proc).result == "applied"
        assert flow.finish(timeout=60) == 75, flow.stderr()
    result = flow.result()
    assert result["status"] == "stopped"
    assert _statuses(result) == {"a": "pending", "b": "pending", "c": "pending"}
    assert result["stopped_by"] == {"control_id": stop, "reason": None, "now": True}
    assert _session_status(home, sid) == "stopped"

    _resume_to_completion(home, flow.run_id)
    assert sorted(_invoked(home)) == ["a", "a", "b", "c"]  # the cancelled a ran again


def test_text_output_names_the_stop_and_how_to_resume(tmp_path: Path) -> None:
    home = tmp_path / "home"
    argv_tail = [*_plan(tmp_path)]
    argv = [sys.executable, "-m", "steerflow", "--home", str(home), "flow", *argv_tail]
    with live_flow(home, [], argv=argv) as flow:
        flow.wait_nodes(lambda s: s.get("a") == "running", what="a running")
        stop = _stop(home, flow.session_id, "--now", "--reason", "wrong repo")
        assert flow.finish(timeout=60) == 75, flow.stderr()
    out = flow.stdout_path.read_text()
    assert "status: stopped" in out
    assert f"stopped by an operator (ctl stop --now, control {stop}): wrong repo" in out
    assert f"resume with: steerflow resume {flow.run_id}" in out


def test_stop_while_paused_ends_the_pause_and_the_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with live_flow(home, _plan(tmp_path)) as flow:
        sid = flow.session_id
        flow.wait_nodes(lambda s: s.get("a") == "running", what="a running")
        code, out = cli_in_process(home, "ctl", "pause", sid)
        assert code == 0, out
        # a finishes; b reaches the closed gate and is held there
        flow.wait_nodes(lambda s: s["a"] == "completed" and s["b"] == "paused", what="b held")
        assert session_phase(home, sid) == "paused"
        stop = ctl_ok(home, "stop", sid)  # a separate ctl process
        assert wait_stamped(home, stop, alive=flow.proc).result == "applied"
        assert flow.finish(timeout=60) == 75, flow.stderr()
    result = flow.result()
    assert _statuses(result) == {"a": "completed", "b": "pending", "c": "pending"}
    assert _invoked(home) == ["a"]
    assert session_phase(home, sid) == "executing"  # the pause ended with the stop
    # The flow's progress shows both controls, the stop before the admission it closes.
    err = flow.stderr().splitlines()
    paused = err.index("operator pause applied: nodes not yet started wait for a resume")
    stopped = err.index(f"operator stop applied (control {stop})")
    assert paused < stopped < err.index("admission closed (stop)"), err

    _resume_to_completion(home, flow.run_id)
    assert sorted(_invoked(home)) == ["a", "b", "c"]


def test_stop_during_planning_ends_the_run_before_any_operation(tmp_path: Path) -> None:
    """The planner call finishes (its plan is kept: decision 101), nothing is invoked."""
    home = tmp_path / "home"
    argv = [sys.executable, str(SLOW_PLANNER), "--home", str(home),
            "flow", "Plan a small survey", "--model", "echo:delay=0.1", "--json"]  # fmt: skip
    with live_flow(home, [], argv=argv) as flow:
        sid = flow.session_id
        assert session_phase(home, sid) == "planning"
        stop = ctl_ok(home, "stop", sid, "--reason", "not today")
        assert wait_stamped(home, stop, alive=flow.proc).result == "applied"
        (home / "release-plan").touch()
        assert flow.finish(timeout=60) == 75, flow.stderr()
    result = flow.result()
    assert result["status"] == "stopped"
    assert {n["status"] for n in result["nodes"]} == {"pending"}
    assert _session_status(home, sid) == "stopped"
    assert control(home, stop).result == "applied"


def test_stop_of_a_finished_run_is_refused_without_a_row(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write_yaml(tmp_path / "plan.yaml", {"name": "tiny", "plan": [
        {"agent_id": "a", "assignee": "w", "instruction": "only"}]})  # fmt: skip
    done = run_cli(home, "flow", "--plan", str(tmp_path / "plan.yaml"), "--model", "echo",
                   "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    sid = json.loads(done.stdout)["session_id"]
    refused = run_cli(home, "ctl", "stop", sid)
    assert refused.returncode == 3, refused.stderr
    assert "not running" in refused.stderr
    with state_db(home) as db:
        assert db.count_controls() == 0


def test_stop_reason_is_capped_like_a_message(tmp_path: Path) -> None:
    """``--reason`` is kept in the row, the metadata and every result: 64 KiB at most, the
    same bound and error style as ``ctl msg`` (issue 26 item 5). A refusal adds no row."""
    home = tmp_path / "home"
    args = _plan(tmp_path)
    # a is held far longer than the refusals take, and only the --now stop ends it.
    write_yaml(tmp_path / "script.yaml", {"a": {"delay": 120}})
    with live_flow(home, args) as flow:
        sid = flow.session_id
        flow.wait_nodes(lambda s: s.get("a") == "running", what="a running")
        too_big = "é" * (MAX_MESSAGE_BYTES // 2) + "x"  # 64 KiB + 1 byte in UTF-8
        refused = run_cli(home, "ctl", "stop", sid, "--reason", too_big)
        assert refused.returncode == 2, refused.stderr
        lines = refused.stderr.strip().splitlines()
        assert lines == [
            "steerflow: error: ctl stop --reason is 65537 bytes; the limit is 65536 bytes (64 KiB)"
        ], refused.stderr
        with state_db(home) as db:
            assert db.count_controls() == 0
        at_limit = ctl_ok(home, "stop", sid, "--now", "--reason", "r" * MAX_MESSAGE_BYTES)
        assert wait_stamped(home, at_limit, alive=flow.proc).result == "applied"
        assert flow.finish(timeout=60) == 75, flow.stderr()
    assert flow.result()["stopped_by"]["reason"] == "r" * MAX_MESSAGE_BYTES


def test_a_stop_during_the_last_node_lets_the_run_complete_and_says_so(tmp_path: Path) -> None:
    """Decision 104: a graceful stop that lands while the last node runs withholds nothing;
    the run ends ``completed`` with exit 0 (75 would promise a resume with nothing to run),
    the row is ``applied`` (admission did close: no spawn or retry could start after it),
    and the result says plainly that the stop withheld nothing."""
    write_yaml(tmp_path / "plan.yaml", {"name": "last", "plan": [
        {"agent_id": "a", "assignee": "w", "instruction": "first"},
        {"agent_id": "b", "assignee": "w", "instruction": "last", "depends_on": ["a"]},
    ]})  # fmt: skip
    write_yaml(tmp_path / "script.yaml", {"b": {"delay": IN_FLIGHT_S}})
    home = tmp_path / "home"
    args = ["--plan", str(tmp_path / "plan.yaml"), "--model", f"script:{tmp_path / 'script.yaml'}"]
    with live_flow(home, args) as flow:
        flow.wait_nodes(lambda s: s.get("b") == "running", what="b running")
        stop = ctl_ok(home, "stop", flow.session_id, "--reason", "too late")
        assert wait_stamped(home, stop, alive=flow.proc).result == "applied"
        assert flow.finish(timeout=60) == 0, flow.stderr()
    result = flow.result()
    assert (result["status"], result["exit_code"]) == ("completed", 0)
    assert _statuses(result) == {"a": "completed", "b": "completed"}
    assert result["stopped_by"] == {"control_id": stop, "reason": "too late", "now": False}
    said = (
        f"ctl stop (control {stop}) came after every node had started: nothing was "
        "withheld, and the run completed"
    )
    assert said in result["warnings"] and said in flow.stderr()
    assert _session_status(home, flow.session_id) == "completed"
    assert control(home, stop).result == "applied"
    assert _invoked(home) == ["a", "b"]
