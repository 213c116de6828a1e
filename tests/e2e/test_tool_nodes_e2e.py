"""Tool nodes through the CLI (issue 39): a ``script:`` model that calls ``python:`` tools,
each step journaled, shown by ``show RUN NODE``, and refused or replayed on resume.

The tools are ``tests/tool_fns.py`` on the child's ``PYTHONPATH``; each call appends a line
to ``$TOOL_LEDGER``, so a test counts side effects across processes and kills.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from flow_support import child_env, read_invocations, run_cli, write_yaml

pytestmark = pytest.mark.timeout(120)

TESTS = Path(__file__).resolve().parents[1]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return child_env(PYTHONPATH=str(TESTS), TOOL_LEDGER=str(tmp_path / "ledger.jsonl"), **extra)


def _ledger(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _setup(tmp_path: Path, steps: list[dict[str, Any]], **plan: Any) -> tuple[Path, Path]:
    script = write_yaml(tmp_path / "s.yaml", {"a": {"steps": steps}})
    entry = {"agent_id": "a", "instruction": "tell the team", "tools": ["python:tool_fns:post"]}
    entry.update(plan.pop("entry", {}))
    data = {"plan": [entry], **plan}
    return write_yaml(tmp_path / "p.yaml", data), script


TWO_POSTS = [
    {"tool_calls": [{"name": "post", "args": {"message": "one"}}]},
    {"tool_calls": [{"name": "post", "args": {"message": "two"}}]},
    {"response": "posted both"},
]


def _flow(home: Path, plan: Path, script: Path, env: dict[str, str], *more: str) -> Any:
    return run_cli(home, "flow", "--plan", plan, "--model", f"script:{script}",
                   "--allow-python", "--json", *more, env=env)  # fmt: skip


def _run_id(home: Path) -> str:
    """The newest run, as ``steerflow runs`` orders them (not by name: two runs started in
    one second sort by their random suffix)."""
    from steerflow.views import list_runs

    return str(list_runs(home, limit=1)[0].run_id)


def test_a_tool_node_runs_its_loop_and_show_lists_every_step(tmp_path: Path) -> None:
    home, env = tmp_path / "home", _env(tmp_path)
    plan, script = _setup(tmp_path, TWO_POSTS)
    done = _flow(home, plan, script, env)
    assert done.returncode == 0, done.explain()
    assert [n["status"] for n in done.json["nodes"]] == ["completed"]
    assert [e["message"] for e in _ledger(tmp_path)] == ["one", "two"]

    shown = run_cli(home, "show", _run_id(home), "a", "--json", env=env)
    assert shown.returncode == 0, shown.explain()
    steps = shown.json["steps"]
    assert [(s["index"], s["kind"], s["status"]) for s in steps] == [
        (1, "model", "completed"), (2, "tool", "completed"), (3, "model", "completed"),
        (4, "tool", "completed"), (5, "model", "completed"),
    ]  # fmt: skip
    tool = steps[1]
    assert (tool["tool"], tool["args"], tool["result"]) == ("post", {"message": "one"}, "posted #1")
    assert tool["call_id"] == steps[0]["tool_calls"][0]["call_id"]
    assert shown.json["response"] == "posted both"

    text = run_cli(home, "show", _run_id(home), "a", env=env)
    assert "steps: 5" in text.stdout and "tool  post" in text.stdout, text.explain()


def test_python_tools_need_consent(tmp_path: Path) -> None:
    home, env = tmp_path / "home", _env(tmp_path)
    plan, script = _setup(tmp_path, TWO_POSTS)
    refused = run_cli(home, "flow", "--plan", plan, "--model", f"script:{script}", env=env)
    assert refused.returncode == 2, refused.explain()
    assert "python:tool_fns:post" in refused.stderr and "--allow-python" in refused.stderr
    assert _ledger(tmp_path) == []


def test_max_steps_fails_the_node_naming_the_limit(tmp_path: Path) -> None:
    home, env = tmp_path / "home", _env(tmp_path)
    plan, script = _setup(tmp_path, TWO_POSTS, entry={"max_steps": 1})
    failed = _flow(home, plan, script, env)
    assert failed.returncode == 1, failed.explain()
    (node,) = failed.json["nodes"]
    assert node["status"] == "failed" and "max_steps 1" in node["error"]


def _killed_at(tmp_path: Path, fault: str, **plan: Any) -> tuple[Path, str, dict[str, str]]:
    home, env = tmp_path / "home", _env(tmp_path)
    plan_path, script = _setup(tmp_path, TWO_POSTS, **plan)
    killed = _flow(home, plan_path, script, _env(tmp_path, STEERFLOW_FAULT=fault))
    assert killed.returncode == 137, killed.explain()
    return home, _run_id(home), env


def test_killed_after_a_result_is_recorded_no_completed_call_runs_again(tmp_path: Path) -> None:
    home, run_id, env = _killed_at(tmp_path, "exit:after:tool-result:1")
    assert len(_ledger(tmp_path)) == 1
    done = run_cli(home, "resume", run_id, "--json", env=env)
    assert done.returncode == 0, done.explain()
    assert [e["message"] for e in _ledger(tmp_path)] == ["one", "two"]
    steps_run = [i.get("step") for i in read_invocations(home)]
    assert sorted(steps_run) == [1, 2, 3]  # each model request paid once, across the kill


def test_killed_before_an_intent_the_call_runs_once_on_resume(tmp_path: Path) -> None:
    home, run_id, env = _killed_at(tmp_path, "exit:before:tool-intent:2")
    assert len(_ledger(tmp_path)) == 1
    done = run_cli(home, "resume", run_id, "--json", env=env)
    assert done.returncode == 0, done.explain()
    assert [e["message"] for e in _ledger(tmp_path)] == ["one", "two"]


@pytest.mark.parametrize("seam", ["after:tool-intent", "before:tool-result"])
def test_an_unfinished_call_is_refused_then_skipped_without_running_again(
    tmp_path: Path, seam: str
) -> None:
    home, run_id, env = _killed_at(tmp_path, f"exit:{seam}:1")
    ran_before = len(_ledger(tmp_path))  # 0 after the intent, 1 after the tool returned
    assert ran_before == (1 if seam.endswith("tool-result") else 0)

    refused = run_cli(home, "resume", run_id, "--json", env=env)
    assert refused.returncode == 3, refused.explain()
    for part in ("'a'", "step 2", "'post'", '{"message": "one"}', "--tool-call"):
        assert part in refused.stderr, refused.explain()
    assert len(_ledger(tmp_path)) == ran_before  # a refusal runs nothing

    done = run_cli(home, "resume", run_id, "--tool-call", "call_1_1=skip", "--json", env=env)
    assert done.returncode == 0, done.explain()
    assert [e["message"] for e in _ledger(tmp_path)][ran_before:] == ["two"]
    shown = run_cli(home, "show", _run_id(home), "a", "--json", env=env)
    skipped = shown.json["steps"][1]
    assert (skipped["status"], skipped["decision"]) == ("skipped", "skip")


def test_an_unfinished_call_retried_by_the_operator_runs_again(tmp_path: Path) -> None:
    home, run_id, env = _killed_at(tmp_path, "exit:after:tool-intent:1")
    done = run_cli(home, "resume", run_id, "--tool-call", "call_1_1=retry", "--json", env=env)
    assert done.returncode == 0, done.explain()
    assert [e["message"] for e in _ledger(tmp_path)] == ["one", "two"]


def test_an_idempotent_unfinished_call_runs_again_without_asking(tmp_path: Path) -> None:
    home, run_id, env = _killed_at(
        tmp_path, "exit:before:tool-result:1", tool_options={"post": {"idempotent": True}}
    )
    assert len(_ledger(tmp_path)) == 1
    done = run_cli(home, "resume", run_id, "--json", env=env)
    assert done.returncode == 0, done.explain()
    assert [e["message"] for e in _ledger(tmp_path)] == ["one", "one", "two"]


def test_a_malformed_or_unknown_tool_call_decision_is_a_usage_error(tmp_path: Path) -> None:
    home, run_id, env = _killed_at(tmp_path, "exit:after:tool-intent:1")
    for flag, named in (("call_1_1=maybe", "retry"), ("nope=skip", "'nope'")):
        refused = run_cli(home, "resume", run_id, "--tool-call", flag, env=env)
        assert refused.returncode == 2, refused.explain()
        assert named in refused.stderr
    assert _ledger(tmp_path) == []


def test_killed_before_a_reply_is_recorded_its_request_is_listed_as_in_flight(
    tmp_path: Path,
) -> None:
    home, run_id, env = _killed_at(tmp_path, "exit:before:model-step:2")
    dry = run_cli(home, "resume", run_id, "--dry-run", "--json", env=env)
    assert dry.returncode == 0, dry.explain()
    assert [c["node"] for c in dry.json["in_flight_calls"]] == ["a"]
    done = run_cli(home, "resume", run_id, "--json", env=env)
    assert done.returncode == 0, done.explain()
    assert [e["message"] for e in _ledger(tmp_path)] == ["one", "two"]


def _message_into_a_ten_step_loop(tmp_path: Path, **extra_env: str) -> tuple[Any, str, dict]:
    """A flow whose 10-step loop holds its first tool until ``ctl msg`` was claimed.

    The message is sent while the first tool runs, and the tool let go once the run's
    poller claimed it: the loop's next model request (step 3) is the one to carry it.
    Returns the finished CLI, the control id and the environment.
    """
    from ctl_support import control, ctl_ok
    from flow_support import finish, start_cli, stop, wait_for

    home = tmp_path / "home"
    env = _env(tmp_path, TOOL_RELEASE=str(tmp_path / "release"))
    steps: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "wait_for_release", "args": {"tag": "first"}}]}
    ]
    steps += [{"tool_calls": [{"name": "lookup", "args": {"key": f"k{i}"}}]} for i in range(8)]
    steps.append({"response": "done"})
    plan, script = _setup(
        tmp_path, steps,
        entry={"tools": ["python:tool_fns:wait_for_release", "python:tool_fns:lookup"]},
    )  # fmt: skip
    proc = start_cli(home, "flow", "--plan", plan, "--model", f"script:{script}",
                     "--allow-python", "--json", env={**env, **extra_env})  # fmt: skip
    try:
        wait_for(lambda: _ledger(tmp_path), timeout=30, what="the first tool to start")
        control_id = ctl_ok(home, "msg", _run_id(home), "use the other file")
        wait_for(lambda: control(home, control_id).result, timeout=30, what="the message claimed")
        (tmp_path / "release").touch()
        done = finish(proc, timeout=60)
    finally:
        stop(proc)
    return done, control_id, env


def test_an_operator_message_reaches_the_next_model_request_of_a_running_loop_once(
    tmp_path: Path,
) -> None:
    done, control_id, env = _message_into_a_ten_step_loop(tmp_path)
    home = tmp_path / "home"
    assert done.returncode == 0, done.explain()
    shown = run_cli(home, "show", _run_id(home), "a", "--json", env=env)
    steered = [s["index"] for s in shown.json["steps"] if s.get("steered")]
    assert steered == [3], shown.json["steps"]  # the loop's second request, and no other
    assert shown.json["steps"][2]["steered"] == [control_id]
    assert len(shown.json["steps"]) == 19


def test_an_agent_with_a_tool_runs_a_loop_per_turn_and_resumes_without_repeating_it(
    tmp_path: Path,
) -> None:
    home, env = tmp_path / "home", _env(tmp_path)
    script = write_yaml(tmp_path / "s.yaml", {"turn-1": {"steps": TWO_POSTS}})
    argv = ["agent", "tell the team", "--model", f"script:{script}",
            "--tool", "python:tool_fns:post", "--json"]  # fmt: skip
    killed = run_cli(home, *argv, env=_env(tmp_path, STEERFLOW_FAULT="exit:after:tool-result:1"))
    assert killed.returncode == 137, killed.explain()
    assert len(_ledger(tmp_path)) == 1
    done = run_cli(home, "resume", _run_id(home), "--json", env=env)
    assert done.returncode == 0, done.explain()
    assert done.json["result"] == "posted both"
    assert [e["message"] for e in _ledger(tmp_path)] == ["one", "two"]


MCP_SERVER = Path(__file__).resolve().parents[1] / "tools" / "mcp_fixture_server.py"


def test_an_agent_with_an_mcp_server_from_the_command_line_resumes_through_it(
    tmp_path: Path,
) -> None:
    """``--mcp-server NAME=...`` declares what ``--tool mcp:NAME`` needs (decision 310): the
    declaration is kept in the checkpoint, so the resume starts the same server again."""
    home, env = tmp_path / "home", _env(tmp_path)
    ledger = tmp_path / "mcp-ledger.txt"
    server = {"command": [sys.executable, str(MCP_SERVER), "stdio"],
              "env": {"MCP_LEDGER": str(ledger)}}  # fmt: skip
    script = write_yaml(tmp_path / "s.yaml", {"turn-1": {"steps": TWO_POSTS}})
    argv = ["agent", "tell the team", "--model", f"script:{script}", "--tool", "mcp:fx/post",
            "--mcp-server", f"fx={json.dumps(server)}", "--json"]  # fmt: skip
    killed = run_cli(home, *argv, env=_env(tmp_path, STEERFLOW_FAULT="exit:after:tool-result:1"))
    assert killed.returncode == 137, killed.explain()
    assert ledger.read_text() == "one\n"
    run_id = _run_id(home)
    run_dir = home / "runs" / run_id
    assert "fixture server: started" in (run_dir / "mcp" / "fx.stderr").read_text()
    done = run_cli(home, "resume", run_id, "--json", env=env)
    assert done.returncode == 0, done.explain()
    assert done.json["result"] == "posted both"
    assert ledger.read_text() == "one\ntwo\n"  # the first post was not sent again


def test_an_agent_tool_names_a_declared_server(tmp_path: Path) -> None:
    home = tmp_path / "home"
    refused = run_cli(home, "agent", "t", "--tool", "mcp:files", env=_env(tmp_path))
    assert refused.returncode == 2, refused.explain()
    assert "mcp:files" in refused.stderr and "--mcp-server files=COMMAND" in refused.stderr
    for bad, said in (("files", "not NAME=SERVER"), ("files={nope", "files:"),
                      ("files='unclosed", "closing quotation"),
                      ('files={"url": "ftp://x"}', "mcp_servers.files")):  # fmt: skip
        refused = run_cli(home, "agent", "t", "--tool", "mcp:files", "--mcp-server", bad,
                          env=_env(tmp_path))  # fmt: skip
        assert refused.returncode == 2, refused.explain()
        assert said in refused.stderr, refused.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


def test_a_message_a_killed_loop_carried_is_not_delivered_again_on_resume(
    tmp_path: Path,
) -> None:
    # Dies right after the reply to the request that carried the message is on record.
    killed, control_id, env = _message_into_a_ten_step_loop(
        tmp_path, STEERFLOW_FAULT="exit:after:model-step:2"
    )
    home = tmp_path / "home"
    assert killed.returncode == 137, killed.explain()
    done = run_cli(home, "resume", _run_id(home), "--json", env=env)
    assert done.returncode == 0, done.explain()
    assert control_id not in json.dumps(done.json.get("stranded_messages"))
    shown = run_cli(home, "show", _run_id(home), "a", "--json", env=env)
    steered = [(s["index"], s["steered"]) for s in shown.json["steps"] if s.get("steered")]
    assert steered == [(3, [control_id])], shown.json["steps"]


def test_stop_now_cancels_the_call_in_flight_and_leaves_it_to_the_operator(
    tmp_path: Path,
) -> None:
    from ctl_support import ctl_ok
    from flow_support import finish, start_cli, stop, wait_for

    home = tmp_path / "home"
    env = _env(tmp_path, TOOL_RELEASE=str(tmp_path / "release"))
    steps = [{"tool_calls": [{"name": "wait_for_release", "args": {"tag": "held"}}]},
             {"response": "done"}]  # fmt: skip
    plan, script = _setup(tmp_path, steps, entry={"tools": ["python:tool_fns:wait_for_release"]})
    proc = start_cli(home, "flow", "--plan", plan, "--model", f"script:{script}",
                     "--allow-python", "--json", env=env)  # fmt: skip
    try:
        wait_for(lambda: _ledger(tmp_path), timeout=30, what="the tool to start")
        ctl_ok(home, "stop", _run_id(home), "--now")
        stopped = finish(proc, timeout=60)
    finally:
        (tmp_path / "release").touch()  # the cancelled tool's thread may still wait
        stop(proc)
    assert stopped.returncode == 75, stopped.explain()
    shown = run_cli(home, "show", _run_id(home), "a", "--json", env=env)
    assert [(s["index"], s["status"]) for s in shown.json["steps"]] == [
        (1, "completed"), (2, "in_flight"),
    ]  # fmt: skip
    refused = run_cli(home, "resume", _run_id(home), env=env)
    assert refused.returncode == 3 and "wait_for_release" in refused.stderr, refused.explain()


def test_mcp_tools_of_a_plan_need_consent_and_the_servers_stderr_is_kept(
    tmp_path: Path,
) -> None:
    import sys

    home, env = tmp_path / "home", _env(tmp_path)
    server = TESTS / "tools" / "mcp_fixture_server.py"
    servers = {"fx": {"command": [sys.executable, str(server), "stdio"],
                      "env": {"MCP_LEDGER": str(tmp_path / "mcp-ledger.txt")}}}  # fmt: skip
    steps = [{"tool_calls": [{"name": "post", "args": {"message": "via mcp"}}]},
             {"response": "done"}]  # fmt: skip
    plan, script = _setup(tmp_path, steps, entry={"tools": ["mcp:fx/post"]}, mcp_servers=servers)
    args = ["flow", "--plan", plan, "--model", f"script:{script}", "--json"]
    refused = run_cli(home, *args, env=env)
    assert refused.returncode == 2, refused.explain()
    assert "--allow-mcp" in refused.stderr and "fx" in refused.stderr
    done = run_cli(home, *args, "--allow-mcp", env=env)
    assert done.returncode == 0, done.explain()
    assert (tmp_path / "mcp-ledger.txt").read_text() == "via mcp\n"
    stderr = home / "runs" / _run_id(home) / "mcp" / "fx.stderr"
    assert "fixture server: started" in stderr.read_text()
    shown = run_cli(home, "show", _run_id(home), "a", "--json", env=env)
    assert shown.json["steps"][1]["result"] == "posted via mcp"


def test_control_bytes_from_a_model_or_a_tool_never_reach_the_terminal(tmp_path: Path) -> None:
    home, env = tmp_path / "home", _env(tmp_path)
    hostile = "\x1b[2J\x07evil\nsecond line"
    steps = [{"tool_calls": [{"name": "lookup", "args": {"key": hostile}}]},
             {"response": f"done {hostile}"}]  # fmt: skip
    plan, script = _setup(tmp_path, steps, entry={"tools": ["python:tool_fns:lookup"]})
    assert _flow(home, plan, script, env).returncode == 0
    text = run_cli(home, "show", _run_id(home), "a", env=env)
    assert text.returncode == 0, text.explain()
    assert "\x1b" not in text.stdout and "\x07" not in text.stdout
    assert "\\x1b[2J\\x07evil" in text.stdout  # shown, escaped
    exact = run_cli(home, "show", _run_id(home), "a", "--json", env=env)
    assert exact.json["steps"][1]["args"] == {"key": hostile}  # --json keeps it exact
