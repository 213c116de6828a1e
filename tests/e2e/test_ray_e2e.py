"""``--executor ray`` against a real two-node Ray cluster on this machine (issue 33).

One cluster for the module (``ray_support``), and the module on one xdist worker: a
cluster is two ``ray start`` processes and their daemons on a two-core machine. Every flow
and every ``ctl`` is its own process, as an operator would run them; node calls are the
``python:`` functions of ``ray_nodes.py``, which record where they ran.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ctl_support import ctl_ok, live_flow, wait_for, wait_stamped, write_yaml
from flow_support import child_env, run_cli
from ray_support import HEAD_IP, SIDE_IP, RayTestCluster, start_cluster

from steerflow.checkpoint import load_checkpoint
from steerflow.views import node_detail

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.timeout(240)]

HERE = Path(__file__).resolve().parent
WHERE = "python:ray_nodes:where"


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayTestCluster]:
    started = start_cluster()
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def ray_env(cluster: RayTestCluster) -> dict[str, str]:
    cluster.ensure_side()  # a test before may have killed it
    return {"PYTHONPATH": str(HERE), "RAY_ADDRESS": cluster.address}


def _plan(path: Path, entries: list[dict[str, Any]], **top: Any) -> Path:
    roles = {
        "main": {"model": WHERE, "resources": {"num_cpus": 0.5}},
        "side": {"model": WHERE, "resources": {"side": 1, "num_cpus": 0.5}},
    }
    return write_yaml(path, {"name": "ray", "roles": roles, **top, "plan": entries})


def _entry(agent_id: str, role: str, log: Path, *deps: str, sleep: float = 0.0) -> dict[str, Any]:
    return {
        "agent_id": agent_id,
        "assignee": role,
        "instruction": f"node {agent_id} LOG={log} SLEEP={sleep}",
        "depends_on": list(deps),
    }


def _events(log: Path) -> list[tuple[str, str, int]]:
    return [(e, n, p) for e, n, p, _ in _events_by_run(log)]


def _events_by_run(log: Path) -> list[tuple[str, str, int, str]]:
    """``(event, node, worker pid, run id)`` per line of the calls log."""
    if not log.exists():
        return []
    lines = (line.split() for line in log.read_text().splitlines())
    return [(e, n, int(p), run) for e, n, p, run in lines]


def _logged(log: Path, event: str, node: str) -> bool:
    return any(e == event and n == node for e, n, _ in _events(log))


def _detail(home: Path, run_id: str, node: str) -> dict[str, Any]:
    """``show RUN NODE --json``'s object, read in this process (the reader needs no Ray)."""
    return node_detail(home, run_id, node).to_json()


def _ops(run_dir: Path) -> dict[str, Any]:
    state, report = load_checkpoint(run_dir / "checkpoint.json")
    assert report["status"] in ("clean", "recovered_prefix"), report
    ops: dict[str, Any] = state["ops"]
    return ops


def test_a_roles_nodes_run_where_its_resources_are_and_say_so(
    tmp_path: Path, ray_env: dict[str, str], cluster: RayTestCluster
) -> None:
    home, log = tmp_path / "home", tmp_path / "calls.log"
    plan = _plan(tmp_path / "plan.yaml", [
        _entry("a", "main", log), _entry("b", "side", log, "a"), _entry("c", "side", log),
    ])  # fmt: skip
    done = run_cli(home, "flow", "--plan", plan, "--allow-python", "--executor", "ray",
                   "--json", env=child_env(**ray_env), timeout=180)  # fmt: skip
    assert done.returncode == 0, done.explain() + cluster.tail()
    assert done.json["status"] == "completed"
    ops = _ops(Path(done.json["run_dir"]))
    for node in ("a", "b", "c"):
        said = json.loads(ops[node]["response"])
        assert said["pid"] != os.getpid()
        placement = _detail(home, done.json["run_id"], node)["placement"]
        # steerflow's record of where the call ran is where the function saw itself run
        assert placement["node_id"] == said["ray_node_id"], (placement, said)
        assert placement["pid"] == said["pid"]
        assert placement["node_ip"] == said["ip"]
        if node in ("b", "c"):
            assert said["ip"] == SIDE_IP, f"{node} (role side) ran on {said['ip']}"
    # the dependency's result was rendered in the flow process, before dispatch
    assert "node a" in json.loads(ops["b"]["response"])["instruction"]
    text = run_cli(home, "show", done.json["run_id"], "b", env=child_env())
    b_said = json.loads(ops["b"]["response"])
    assert f"ran on: ray node {b_said['ray_node_id'][:8]} ({SIDE_IP}), pid {b_said['pid']}" in (
        text.stdout
    ), text.stdout
    assert {HEAD_IP, SIDE_IP} >= {json.loads(ops[n]["response"])["ip"] for n in ops}


def test_pause_message_and_stop_from_other_processes_steer_a_flow_on_ray(
    tmp_path: Path, ray_env: dict[str, str]
) -> None:
    home, log = tmp_path / "home", tmp_path / "calls.log"
    plan = _plan(tmp_path / "plan.yaml", [
        _entry("a", "main", log, sleep=2), _entry("b", "side", log, "a", sleep=3),
        _entry("c", "main", log, "b"),
    ])  # fmt: skip
    args = ["--plan", str(plan), "--allow-python", "--executor", "ray", "--concurrency", "1"]
    with live_flow(home, args, env=ray_env) as flow:
        wait_for(lambda: _logged(log, "start", "a"), what="a running on Ray", alive=flow.proc,
                 timeout=90)  # fmt: skip
        pause = ctl_ok(home, "pause", flow.session_id)
        wait_stamped(home, pause, alive=flow.proc)
        flow.wait_nodes(lambda s: s.get("a") == "completed", what="a completed", timeout=60)
        # paused: b is not admitted however long a has been done
        message = ctl_ok(home, "msg", flow.session_id, "use the v2 API, not v1")
        assert not _logged(log, "start", "b")
        resume = ctl_ok(home, "resume", flow.session_id)
        wait_stamped(home, resume, alive=flow.proc)
        wait_for(lambda: _logged(log, "start", "b"), what="b running", alive=flow.proc,
                 timeout=60)  # fmt: skip
        assert [n for e, n, _ in _events(log) if e == "start"] == ["a", "b"]
        stop = ctl_ok(home, "stop", flow.session_id, "--reason", "enough for today")
        assert flow.finish(timeout=90) == 75, flow.stderr()
    assert wait_stamped(home, message).applied_at is not None
    assert wait_stamped(home, stop).applied_at is not None
    result = flow.result()
    statuses = {n["id"]: n["status"] for n in result["nodes"]}
    assert statuses == {"a": "completed", "b": "completed", "c": "pending"}, result
    # the message reached b's call on the side node, inside its steer block, once
    b = json.loads(flow.responses()["b"])
    assert b["ip"] == SIDE_IP
    assert "[OPERATOR STEER]" in b["instruction"] and "use the v2 API, not v1" in b["instruction"]
    assert "use the v2 API" not in json.loads(flow.responses()["a"])["instruction"]
    assert not _logged(log, "start", "c")


def test_stop_now_cancels_the_remote_call_and_records_why(
    tmp_path: Path, ray_env: dict[str, str]
) -> None:
    home, log = tmp_path / "home", tmp_path / "calls.log"
    plan = _plan(tmp_path / "plan.yaml", [_entry("long", "side", log, sleep=120)])
    args = ["--plan", str(plan), "--allow-python", "--executor", "ray"]
    with live_flow(home, args, env=ray_env) as flow:
        wait_for(lambda: _logged(log, "start", "long"), what="the call running on Ray",
                 alive=flow.proc, timeout=90)  # fmt: skip
        ctl_ok(home, "stop", flow.session_id, "--now", "--reason", "wrong branch")
        assert flow.finish(timeout=60) == 75, flow.stderr()
    # the provider's own cancellation ran in the worker (ray.cancel, then CancelledError)
    wait_for(lambda: _logged(log, "cancelled", "long"), what="the remote call cancelled",
             timeout=30)  # fmt: skip
    assert not _logged(log, "end", "long")
    result = flow.result()
    assert result["stopped_by"]["reason"] == "wrong branch"
    node = _detail(home, flow.run_id, "long")
    assert node["status"] == "pending"
    assert "stop" in json.dumps(node), node


def test_a_side_node_killed_mid_call_fails_the_node_and_a_retry_runs_it_again(
    tmp_path: Path, ray_env: dict[str, str], cluster: RayTestCluster
) -> None:
    home, log = tmp_path / "home", tmp_path / "calls.log"
    lost = _entry("lost", "side", log, sleep=60)
    lost["instruction"] += " ONCE"  # the retry does not sleep
    plan = _plan(tmp_path / "plan.yaml", [lost, _entry("fine", "main", log)])
    args = ["--plan", str(plan), "--allow-python", "--executor", "ray"]
    with live_flow(home, args, env=ray_env) as flow:
        wait_for(lambda: _logged(log, "start", "lost"), what="the call on the side node",
                 alive=flow.proc, timeout=90)  # fmt: skip
        os.kill(cluster.side_raylet_pid(), signal.SIGKILL)
        assert flow.finish(timeout=90) == 1, flow.stderr()
    result = flow.result()
    statuses = {n["id"]: n for n in result["nodes"]}
    assert statuses["fine"]["status"] == "completed"
    failed = statuses["lost"]
    # a failed call, never a silent success: the node says which failure and where
    assert failed["status"] == "failed", failed
    assert failed["error"].startswith("ray: NodeDiedError: the call was lost"), failed
    assert SIDE_IP in failed["error"], failed
    assert not _logged(log, "end", "lost")
    cluster.ensure_side()
    again = run_cli(home, "resume", flow.run_id, "--retry-failed", "--executor", "ray",
                    "--json", env=child_env(**ray_env), timeout=180)  # fmt: skip
    assert again.returncode == 0, again.explain()
    starts = Counter(n for e, n, _ in _events(log) if e == "start")
    assert starts == {"lost": 2, "fine": 1}, starts


def test_a_flow_killed_mid_run_resumes_on_ray_and_runs_only_what_was_unfinished(
    tmp_path: Path, ray_env: dict[str, str]
) -> None:
    home, log = tmp_path / "home", tmp_path / "calls.log"
    ids = [f"n{i}" for i in range(6)]
    plan = _plan(tmp_path / "plan.yaml", [_entry(k, "main", log, sleep=1) for k in ids],
                 concurrency=2)  # fmt: skip
    args = ["--plan", str(plan), "--allow-python", "--executor", "ray"]
    with live_flow(home, args, env=ray_env) as flow:
        run_dir = home / "runs" / flow.run_id

        def two_saved() -> bool:
            return (run_dir / "checkpoint.json").exists() and sum(
                e["status"] == "completed" for e in _ops(run_dir).values()
            ) >= 2

        wait_for(two_saved, what="two outcomes saved", alive=flow.proc, timeout=120)
        flow.proc.send_signal(signal.SIGKILL)
        flow.proc.wait(timeout=30)
    acknowledged = {k for k, e in _ops(run_dir).items() if e["status"] == "completed"}
    assert 2 <= len(acknowledged) < len(ids)
    before = len(_events(log))
    again = run_cli(home, "resume", flow.run_id, "--executor", "ray", "--json",
                    env=child_env(**ray_env), timeout=180)  # fmt: skip
    assert again.returncode == 0, again.explain()
    assert again.json["status"] == "completed"
    # Counted by run: a call the killed driver had handed to Ray may still start after the
    # kill (Ray ends a dead driver's tasks asynchronously). Only an unfinished node may do
    # that; the resume starts each unfinished node once and no acknowledged one.
    events = _events_by_run(log)
    late = {n for e, n, _, run in events[before:] if e == "start" and run == flow.run_id}
    assert not late & acknowledged, (late, acknowledged)
    started_after = Counter(
        n for e, n, _, run in events if e == "start" and run == again.json["run_id"]
    )
    assert not set(started_after) & acknowledged, (started_after, acknowledged)
    assert set(started_after) == set(ids) - acknowledged
    assert all(count == 1 for count in started_after.values()), started_after


def test_a_role_no_node_can_place_is_refused_before_anything_runs(
    tmp_path: Path, ray_env: dict[str, str]
) -> None:
    home, log = tmp_path / "home", tmp_path / "calls.log"
    plan = write_yaml(tmp_path / "plan.yaml", {
        "roles": {"gpu": {"model": WHERE, "resources": {"num_gpus": 1}}},
        "plan": [_entry("a", "gpu", log)],
    })  # fmt: skip
    done = run_cli(home, "flow", "--plan", plan, "--allow-python", "--executor", "ray",
                   env=child_env(**ray_env), timeout=120)  # fmt: skip
    assert done.returncode == 2, done.explain()
    line = done.stderr.strip().splitlines()[-1]
    assert "role 'gpu'" in line and "num_gpus: 1" in line and "GPU 1" in line, done.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())
    assert not log.exists()


def test_an_agent_turn_runs_on_ray(tmp_path: Path, ray_env: dict[str, str]) -> None:
    home, log = tmp_path / "home", tmp_path / "calls.log"
    args = ["agent", f"fix it LOG={log}", "--model", WHERE, "--executor", "ray", "--max-turns", "1"]
    done = run_cli(home, *args, "--json", env=child_env(**ray_env), timeout=120)
    assert done.returncode == 0, done.explain()
    said = json.loads(done.json["result"])
    assert said["ip"] in (HEAD_IP, SIDE_IP) and said["pid"] != os.getpid()
    assert [e for e, _, _ in _events(log)] == ["start", "end"]


CHUNKS = [f"line {i}\n" for i in range(5)]


def test_artifacts_usage_output_and_errors_come_back_exactly_as_a_local_calls(
    tmp_path: Path, ray_env: dict[str, str]
) -> None:
    script = write_yaml(tmp_path / "s.yaml", {
        "w": {"response": "wrote", "artifacts": {"out/report.md": "# done\n"},
              "usage": {"input_tokens": 100, "output_tokens": 20}, "stream": CHUNKS},
        "bad": {"fail": "the model said no"},
    })  # fmt: skip
    plan = write_yaml(tmp_path / "plan.yaml", {"plan": [
        {"agent_id": "w", "instruction": "write", "artifacts": ["out/report.md"]},
        {"agent_id": "bad", "instruction": "fail"},
    ]})  # fmt: skip
    results = {}
    for executor in ("local", "ray"):
        home = tmp_path / executor
        done = run_cli(home, "flow", "--plan", plan, "--model", f"script:{script}", "--executor",
                       executor, "--json", env=child_env(**ray_env), timeout=120)  # fmt: skip
        assert done.returncode == 1, done.explain()  # "bad" failed
        ops = _ops(Path(done.json["run_dir"]))
        # the worker's output streamed back to the flow process's live file, in order
        live = Path(done.json["run_dir"]) / "live" / "w" / "0.txt"
        assert live.read_text() == "".join(CHUNKS), executor
        # the worker wrote into the leg directory the flow process checked and hashed
        verified = run_cli(home, "verify", done.json["run_id"], "--json", env=child_env())
        assert verified.returncode == 0, verified.explain()
        results[executor] = (
            {n["id"]: (n["status"], n.get("error")) for n in done.json["nodes"]},
            done.json["usage"]["input_tokens"],
            done.json["usage"]["output_tokens"],
            [(a["path"], a["bytes"], a["digest"]) for a in ops["w"]["artifacts"]],
            ops["w"]["response"],
        )
    assert results["ray"] == results["local"], results
    assert results["ray"][0]["bad"] == ("failed", "the model said no")
