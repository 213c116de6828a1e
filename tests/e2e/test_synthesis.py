"""Required synthesis and closed admission (issue 13 items 4-5; Amendment 3 item 1).

Real CLI runs on the ``script:`` model. Calls that must be in flight when a deadline or a
``ctl stop`` lands are held on release files by ``gated_cli.py`` (no timing guesses); the
deadline itself is the run's ``--timeout``, observed through its ``admission closed``
progress line before anything held is released.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from ctl_support import live_flow, run_cli, wait_for, wait_stamped, write_yaml
from flow_support import cli_in_process, read_invocations

from steerflow.checkpoint import load_checkpoint

GATED_CLI = Path(__file__).resolve().parent / "gated_cli.py"
#: Long enough for the first call to be held before the deadline on a loaded 2-core box;
#: nothing waits for it to pass except the held call, which the test releases.
DEADLINE_S = "4"
SYNTHESIZE = "Combine every result into one answer."


def _plan(tmp_path: Path, entries: list[dict[str, Any]], **top: Any) -> Path:
    return write_yaml(tmp_path / "plan.yaml", {"name": "synth", **top, "plan": entries})


def _script(tmp_path: Path, nodes: dict[str, Any] | None = None) -> str:
    return f"script:{write_yaml(tmp_path / 'script.yaml', nodes or {'*': {}})}"


def _gated(home: Path, *args: str) -> list[str]:
    return [sys.executable, str(GATED_CLI), "--home", str(home), *args]


def _gate(home: Path, *nodes: str) -> None:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    for node in nodes:
        (home / f"gate-{node}").touch()


def _release(home: Path, *nodes: str) -> None:
    for node in nodes:
        (home / f"release-{node}").touch()


def _started(home: Path) -> list[str]:
    return sorted(p.name.removeprefix("started-") for p in home.glob("started-*"))


def _invoked(home: Path) -> list[str]:
    return [line["node"] for line in read_invocations(home)]


def _statuses(result: dict[str, Any]) -> dict[str, str]:
    return {n["id"]: n["status"] for n in result["nodes"]}


def _ops(result: dict[str, Any]) -> dict[str, Any]:
    state, _ = load_checkpoint(Path(result["checkpoint"]["path"]))
    ops: dict[str, Any] = state["ops"]
    return ops


def _json(home: Path, *args: str) -> dict[str, Any]:
    code, out = cli_in_process(home, *args, "--json")
    assert code == 0, out
    value: dict[str, Any] = json.loads(out)
    return value


def _resume(home: Path, run_id: str) -> dict[str, Any]:
    resumed = run_cli(home, "resume", run_id, "--json", timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    body: dict[str, Any] = json.loads(resumed.stdout)
    assert body["status"] == "completed", body
    return body


def _wait_deadline(flow: Any) -> None:
    wait_for(
        lambda: "admission closed" in flow.stderr_path.read_text(),
        what="the deadline to close admission",
        alive=flow.proc,
    )


# -- synthesis after every worker finished -----------------------------------------------


def test_synthesis_runs_last_over_every_workers_final_result(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plan = _plan(
        tmp_path,
        [
            {"agent_id": "a", "assignee": "w", "instruction": "first"},
            {"agent_id": "b", "assignee": "w", "instruction": "second", "depends_on": ["a"]},
        ],
        synthesis={"instruction": "Join the findings."},
    )
    model = _script(
        tmp_path,
        {
            "a": {
                "response": "alpha",
                "spawn": [
                    {"agent_id": "c", "instruction": "extra"},
                    # the synthesis runs last: nothing may wait for it or take its id
                    {"agent_id": "d", "instruction": "x", "depends_on": ["synthesis"]},
                    {"agent_id": "synthesis", "instruction": "x"},
                ],
            },
            "b": {"response": "bravo"},
            "c": {"response": "charlie"},
            "synthesis": {"response": "the joined answer"},
        },
    )
    done = run_cli(home, "flow", "--plan", str(plan), "--model", model, "--reactive", "all",
                   "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["status"] == "completed"
    assert _statuses(out) == {"a": "completed", "b": "completed", "synthesis": "completed",
                              "c": "completed"}  # fmt: skip
    assert {(r["agent_id"], r["reason"]) for r in out["spawn_rejections"]} == {
        ("d", "builder_error"),
        ("synthesis", "duplicate"),
    }
    invoked = _invoked(home)
    assert invoked[-1] == "synthesis" and sorted(invoked) == ["a", "b", "c", "synthesis"]
    # The instruction as sent: its text, then every worker's result (spawned ones too).
    node = _json(home, "show", out["run_id"], "synthesis")
    assert node["instruction"] == (
        "Join the findings.\n\n[RESULTS OF WORKERS]\n"
        "### a (completed)\nalpha\n\n### b (completed)\nbravo\n\n### c (completed)\ncharlie"
    )
    assert node["depends_on"] == ["a", "b", "c"] and node["status"] == "completed"
    assert node["planned_instruction"] == "Join the findings."
    # show, result and the flow's own result agree on the synthesis.
    view = _json(home, "show", out["run_id"])
    assert {n["id"]: n["status"] for n in view["nodes"]}["synthesis"] == "completed"
    result = _json(home, "result", out["run_id"])
    assert result["source"] == "synthesis" and result["text"] == "the joined answer"
    assert out["result"] == "the joined answer"
    assert _ops(out)["synthesis"]["response"] == "the joined answer"


def test_synthesize_flag_adds_it_and_a_plan_entry_cannot_take_its_key(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plan = _plan(tmp_path, [{"agent_id": "a", "instruction": "only"}])
    done = run_cli(home, "flow", "--plan", str(plan), "--model", _script(tmp_path),
                   "--synthesize", SYNTHESIZE, "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert _statuses(out) == {"a": "completed", "synthesis": "completed"}
    state, _ = load_checkpoint(Path(out["checkpoint"]["path"]))
    # the request is in the config, so a resume knows the run owes it
    assert state["config"]["synthesis"] == {"instruction": SYNTHESIZE, "model": None}
    assert [p["agent_id"] for p in state["plan"]] == ["a"]

    dry = run_cli(home, "flow", "--plan", str(plan), "--synthesize", SYNTHESIZE, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "  synthesis  <- every worker's result (runs last)" in dry.stderr

    clash = _plan(tmp_path, [{"agent_id": "synthesis", "instruction": "mine"}])
    refused = run_cli(home, "flow", "--plan", str(clash), "--json")
    assert refused.returncode == 2, refused.stderr
    assert "reserved" in refused.stderr


# -- a deadline: admission stays closed ------------------------------------------------------


def test_deadline_closes_admission_for_capacity_waiters_and_withholds_synthesis(
    tmp_path: Path,
) -> None:
    """A runs (held), B and C wait for the one slot; the deadline fires; A finishes:
    B and C take the slot after admission closed and must not start, nor the synthesis."""
    home = tmp_path / "home"
    _gate(home, "a", "b", "c")
    plan = _plan(tmp_path, [{"agent_id": k, "instruction": f"task {k}"} for k in "abc"],
                 synthesis={"instruction": "Join."})  # fmt: skip
    args = ["flow", "--plan", str(plan), "--model", _script(tmp_path), "--concurrency", "1",
            "--timeout", DEADLINE_S, "--json"]  # fmt: skip
    with live_flow(home, [], argv=_gated(home, *args)) as flow:
        first = wait_for(lambda: _started(home), what="a first call in flight", alive=flow.proc)
        _wait_deadline(flow)
        _release(home, "a", "b", "c")
        assert flow.finish(timeout=60) == 124, flow.stderr_path.read_text()
    result = flow.result()
    assert result["status"] == "timed_out" and result["exit_code"] == 124
    assert _started(home) == first and _invoked(home) == first  # nothing else started
    statuses = _statuses(result)
    assert [k for k, s in statuses.items() if s == "completed"] == first
    assert statuses["synthesis"] == "pending"
    assert "synthesis" not in _ops(result)  # never recorded completed unless it ran
    stderr = flow.stderr_path.read_text()
    assert stderr.count("node withheld") >= 3  # the two waiters and the synthesis

    # The resume runs the withheld workers, then the synthesis; nothing finished runs again.
    body = _resume(home, result["run_id"])
    assert set(_statuses(body).values()) == {"completed"}
    assert sorted(_invoked(home)) == ["a", "b", "c", "synthesis"]


def test_late_spawn_after_the_deadline_is_rejected_and_synthesis_still_owed(
    tmp_path: Path,
) -> None:
    """Every worker finished, yet the deadline withheld the synthesis: timed_out, not
    completed; the resume computes it from the recorded results alone."""
    home = tmp_path / "home"
    _gate(home, "a")
    plan = _plan(tmp_path, [{"agent_id": "a", "instruction": "only"}])
    late = [{"agent_id": "late", "instruction": "more"}]
    model = _script(tmp_path, {"a": {"response": "alpha", "spawn": late}})
    args = ["flow", "--plan", str(plan), "--model", model, "--reactive", "all",
            "--synthesize", SYNTHESIZE, "--timeout", DEADLINE_S]  # fmt: skip
    with live_flow(home, [], argv=_gated(home, *args)) as flow:
        wait_for(lambda: _started(home) == ["a"], what="a in flight", alive=flow.proc)
        _wait_deadline(flow)
        _release(home, "a")
        assert flow.finish(timeout=60) == 124, flow.stderr_path.read_text()
    stderr = flow.stderr_path.read_text()
    assert "spawn rejected: late from a: admission_closed" in stderr
    out = flow.stdout_path.read_text()
    assert "status: timed_out" in out
    run_id = next(line.split()[1] for line in out.splitlines() if line.startswith("run: "))
    assert _invoked(home) == ["a"]
    shown = _json(home, "show", run_id)
    assert {n["id"]: n["status"] for n in shown["nodes"]} == {"a": "completed",
                                                             "synthesis": "pending"}  # fmt: skip
    # read from the checkpoint alone (no state DB rows), it is owed all the same
    bare = tmp_path / "bare"
    bare.mkdir(mode=0o700)
    shutil.copytree(home / "runs" / run_id, bare / "runs" / run_id)
    alone = _json(bare, "show", run_id)
    assert {n["id"]: n["status"] for n in alone["nodes"]} == {"a": "completed",
                                                             "synthesis": "pending"}  # fmt: skip

    body = _resume(home, run_id)
    assert _invoked(home) == ["a", "synthesis"]  # a is replayed, not run again
    assert _statuses(body) == {"a": "completed", "synthesis": "completed"}
    node = _json(home, "show", body["run_id"], "synthesis")
    assert node["instruction"] == f"{SYNTHESIZE}\n\n[RESULTS OF WORKERS]\n### a (completed)\nalpha"
    assert body["result"] == _json(home, "result", body["run_id"])["text"]


# -- a ctl stop ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["2", "3"])
def test_stop_withholds_synthesis_and_resume_computes_it_without_rerunning_workers(
    tmp_path: Path, version: str
) -> None:
    home = tmp_path / "home"
    _gate(home, "a")
    plan = _plan(tmp_path, [{"agent_id": "a", "instruction": "one"},
                            {"agent_id": "b", "instruction": "two", "depends_on": ["a"]}],
                 synthesis={"instruction": "Join."})  # fmt: skip
    args = ["flow", "--plan", str(plan), "--model", _script(tmp_path), "--json",
            "--checkpoint-version", version]  # fmt: skip
    with live_flow(home, [], argv=_gated(home, *args)) as flow:
        wait_for(lambda: _started(home) == ["a"], what="a in flight", alive=flow.proc)
        code, out = cli_in_process(home, "ctl", "stop", flow.session_id)
        assert code == 0, out
        assert wait_stamped(home, out.split()[0], alive=flow.proc).result == "applied"
        _release(home, "a")
        assert flow.finish(timeout=60) == 75, flow.stderr_path.read_text()
    result = flow.result()
    assert result["status"] == "stopped"
    assert _statuses(result) == {"a": "completed", "b": "pending", "synthesis": "pending"}
    assert "synthesis" not in _ops(result)
    assert _invoked(home) == ["a"]

    body = _resume(home, result["run_id"])
    assert _invoked(home) == ["a", "b", "synthesis"]
    assert _ops(body)["synthesis"]["status"] == "completed"


def test_synthesis_runs_again_when_a_retried_worker_runs_again(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plan = _plan(tmp_path, [{"agent_id": "a", "instruction": "one"},
                            {"agent_id": "b", "instruction": "two"}],
                 synthesis={"instruction": "Join."})  # fmt: skip
    model = _script(tmp_path, {"b": {"fail_once": "flaky"}})
    first = run_cli(home, "flow", "--plan", str(plan), "--model", model, "--json")
    assert first.returncode == 1, first.stderr
    out = json.loads(first.stdout)
    # the synthesis saw b's failure; the run failed all the same
    assert _statuses(out) == {"a": "completed", "b": "failed", "synthesis": "completed"}
    # b runs again, so the synthesis over its old failure is not replayed: it runs again
    again = run_cli(home, "resume", out["run_id"], "--retry-failed", "--json", timeout=120)
    assert again.returncode == 0, again.stderr
    assert sorted(_invoked(home)) == ["a", "b", "b", "synthesis", "synthesis"]
    node = _json(home, "show", json.loads(again.stdout)["run_id"], "synthesis")
    assert "### b (completed)" in node["instruction"]


def test_synthesis_receives_only_the_last_attempt_of_an_escalation_chain(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    ladder = write_yaml(tmp_path / "ladder.yaml", {"*": {"response": "from the ladder"}})
    plan = _plan(
        tmp_path,
        [
            {"agent_id": "a", "assignee": "w", "instruction": "do a"},
            {"agent_id": "b", "instruction": "do b"},
        ],
        roles={"w": {"escalation": [f"script:{ladder}"]}},
        synthesis={"instruction": "Join."},
    )
    model = _script(tmp_path, {"a": {"fail": "the base model failed"}, "b": {"response": "bravo"}})
    done = run_cli(home, "flow", "--plan", str(plan), "--model", model, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert _statuses(out)["a"] == "failed" and _statuses(out)["a.esc1"] == "completed"
    node = _json(home, "show", out["run_id"], "synthesis")
    # the failed attempt a was replaced: only its retry's result is a worker's result
    assert node["instruction"] == (
        "Join.\n\n[RESULTS OF WORKERS]\n"
        "### b (completed)\nbravo\n\n### a.esc1 (completed)\nfrom the ladder"
    )
    assert node["depends_on"] == ["b", "a.esc1"]
