"""Approvals through the CLI (issue 41): a tool call that waits for an operator's decision,
sent from another process, journaled, and applied by a resume after a SIGKILL.

The model is a ``script:`` with three tool calls; ``post`` (a side effect, logged to
``$TOOL_LEDGER`` by ``tests/tool_fns.py``) needs approval, ``lookup`` does not. The script
provider logs each model request to ``<home>/script-invocations.jsonl``, so a test counts
what the model was asked across processes and kills.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from flow_support import (
    child_env,
    finish,
    read_invocations,
    run_cli,
    start_cli,
    stop,
    wait_for,
    write_yaml,
)

from steerflow.state import StateDB

pytestmark = pytest.mark.timeout(180)

TESTS = Path(__file__).resolve().parents[1]

THREE_CALLS = [
    {"tool_calls": [{"name": "lookup", "args": {"key": "a"}}]},
    {"tool_calls": [{"name": "post", "args": {"message": "ship it"}}]},
    {"tool_calls": [{"name": "lookup", "args": {"key": "b"}}]},
    {"response": "done"},
]


def _env(tmp_path: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    return child_env(PYTHONPATH=path, TOOL_LEDGER=str(tmp_path / "ledger.jsonl"))


def _ledger(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _setup(tmp_path: Path, steps: list[dict[str, Any]] = THREE_CALLS, **plan: Any) -> Path:
    script = write_yaml(tmp_path / "s.yaml", {"a": {"steps": steps}})
    entry = {
        "agent_id": "a",
        "instruction": "tell the team",
        "tools": ["python:tool_fns:post", "python:tool_fns:lookup"],
    }
    data = {"tool_options": {"post": {"approval": "required"}}, "plan": [entry], **plan}
    write_yaml(tmp_path / "p.yaml", data)
    return script


def _start(home: Path, tmp_path: Path, script: Path, *more: str) -> subprocess.Popen[str]:
    return start_cli(home, "flow", "--plan", tmp_path / "p.yaml", "--model", f"script:{script}",
                     "--allow-python", "--json", *more, env=_env(tmp_path))  # fmt: skip


def _approvals(home: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    listed = run_cli(home, "approvals", "--json", env=env)
    assert listed.returncode == 0, listed.explain()
    return list(listed.json["approvals"])


def _waiting(
    home: Path, env: dict[str, str], proc: subprocess.Popen[str] | None = None, *, not_of: str = ""
) -> Any:
    """The first request that waits (``not_of``: of another run than that one)."""

    def probe() -> dict[str, Any] | None:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the flow exited early: {finish(proc).explain()}")
        found = [r for r in _approvals(home, env) if r["run_id"] != not_of]
        return found[0] if found else None

    return wait_for(probe, timeout=60, interval=0.1, what="an approval request")


def _db(home: Path) -> StateDB:
    """The state DB the children use: ``STEERFLOW_STATE_DB_URL`` (PostgreSQL) or the home's."""
    url = os.environ.get("STEERFLOW_STATE_DB_URL")
    return StateDB.open_url(url, create=False) if url else StateDB.open(home, create=False)


def _controls(home: Path) -> list[Any]:
    with _db(home) as db:
        return [
            c
            for s in db.list_sessions(limit=None)
            for c in db.list_controls(s.id)
            if c.verb in ("approve", "deny")
        ]


def _requests(home: Path) -> list[int]:
    return [int(line.get("step", 0)) for line in read_invocations(home)]


def _steps(home: Path, run_id: str, env: dict[str, str]) -> list[dict[str, Any]]:
    shown = run_cli(home, "show", run_id, "a", "--json", env=env)
    assert shown.returncode == 0, shown.explain()
    return list(shown.json["steps"])


def test_a_call_waits_is_approved_from_another_process_and_runs(
    tmp_path: Path, state_backend: str
) -> None:
    home, env = tmp_path / "home", _env(tmp_path)
    proc = _start(home, tmp_path, _setup(tmp_path))
    try:
        request = _waiting(home, env, proc)
        assert (request["node"], request["tool"], request["args"]) == (
            "a", "post", {"message": "ship it"},
        )  # fmt: skip
        # It waits: the post did not run, the first lookup did; the node says so.
        assert [e["tool"] for e in _ledger(tmp_path)] == ["lookup"]
        shown = run_cli(home, "show", request["run_id"], "--json", env=env)
        assert {n["id"]: n["status"] for n in shown.json["nodes"]} == {"a": "awaiting_approval"}
        runs = run_cli(home, "runs", "--json", env=env)
        assert [r["approvals_waiting"] for r in runs.json["runs"]] == [1]
        status = run_cli(home, "ctl", "status", request["run_id"], env=env)
        assert "approvals waiting: 1" in status.stdout, status.explain()
        sent = run_cli(home, "ctl", "approve", request["run_id"], request["request_id"], env=env)
        assert sent.returncode == 0, sent.explain()
        done = finish(proc, timeout=60)
    finally:
        stop(proc)
    assert done.returncode == 0, done.explain()
    assert [e["tool"] for e in _ledger(tmp_path)] == ["lookup", "post", "lookup"]
    [control] = _controls(home)
    assert (control.verb, control.result) == ("approve", "applied")
    assert control.sender.startswith("cli:")
    steps = _steps(home, request["run_id"], env)
    approval = [s for s in steps if s["kind"] == "approval"]
    assert [s["status"] for s in approval] == ["approved"]
    assert _approvals(home, env) == []


def test_a_denied_call_gives_the_model_the_reason(tmp_path: Path) -> None:
    home, env = tmp_path / "home", _env(tmp_path)
    proc = _start(home, tmp_path, _setup(tmp_path))
    try:
        request = _waiting(home, env, proc)
        sent = run_cli(home, "ctl", "deny", request["run_id"], request["request_id"],
                       "--reason", "not on a Friday", env=env)  # fmt: skip
        assert sent.returncode == 0, sent.explain()
        done = finish(proc, timeout=60)
    finally:
        stop(proc)
    assert done.returncode == 0, done.explain()
    assert [e["tool"] for e in _ledger(tmp_path)] == ["lookup", "lookup"]  # never posted
    steps = _steps(home, request["run_id"], env)
    assert [s["kind"] for s in steps if s.get("tool") == "post"] == ["approval"]  # never ran
    [denied] = [s for s in steps if s["kind"] == "approval"]
    assert (denied["status"], denied["reason"]) == ("denied", "not on a Friday")
    assert denied["sender"].startswith("cli:")
    # The model was asked on (steps 3 and 4): the denial was its tool result (unit-tested
    # in tests/tools/test_loop.py, where the conversation is visible).
    assert _requests(home) == [1, 2, 3, 4]


def test_approved_with_edited_arguments_runs_those_and_records_the_edit(tmp_path: Path) -> None:
    home, env = tmp_path / "home", _env(tmp_path)
    proc = _start(home, tmp_path, _setup(tmp_path))
    try:
        request = _waiting(home, env, proc)
        sent = run_cli(home, "ctl", "approve", request["run_id"], request["request_id"],
                       "--args", '{"message": "ship it on Monday"}', env=env)  # fmt: skip
        assert sent.returncode == 0, sent.explain()
        done = finish(proc, timeout=60)
    finally:
        stop(proc)
    assert done.returncode == 0, done.explain()
    posts = [e for e in _ledger(tmp_path) if e["tool"] == "post"]
    assert posts == [{"tool": "post", "message": "ship it on Monday"}]
    [post] = [s for s in _steps(home, request["run_id"], env) if s.get("tool") == "post"
              and s["kind"] == "tool"]  # fmt: skip
    assert post["args"] == {"message": "ship it on Monday"}


def test_killed_while_waiting_a_decision_sent_meanwhile_is_applied_by_the_resume(
    tmp_path: Path, state_backend: str
) -> None:
    home, env = tmp_path / "home", _env(tmp_path)
    script = _setup(tmp_path)
    proc = _start(home, tmp_path, script)
    try:
        request = _waiting(home, env, proc)
        asked = _requests(home)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        stop(proc)
    assert asked == [1, 2]  # the request came from the second model reply
    # Nothing runs the run now; the request is still listed, and a decision is queued.
    [still] = _approvals(home, env)
    assert still["request_id"] == request["request_id"]
    sent = run_cli(home, "ctl", "approve", request["run_id"], request["request_id"], env=env)
    assert sent.returncode == 0, sent.explain()
    resumed = run_cli(home, "resume", request["run_id"], "--json", env=env, timeout=90)
    assert resumed.returncode == 0, resumed.explain()
    # The model was not asked again for what it had answered: only steps 3 and 4 are new.
    assert _requests(home) == [1, 2, 3, 4]
    assert [e["tool"] for e in _ledger(tmp_path)] == ["lookup", "post", "lookup"]
    [control] = _controls(home)
    assert (control.verb, control.result) == ("approve", "applied")
    assert _approvals(home, env) == []


def test_two_decisions_at_once_one_is_applied_the_other_rejected_naming_it(
    tmp_path: Path, state_backend: str
) -> None:
    home, env = tmp_path / "home", _env(tmp_path)
    proc = _start(home, tmp_path, _setup(tmp_path))
    try:
        request = _waiting(home, env, proc)
        run, rid = request["run_id"], request["request_id"]
        both = [
            start_cli(home, "ctl", "approve", run, rid, env=env),
            start_cli(home, "ctl", "deny", run, rid, "--reason", "no", env=env),
        ]
        sent = [finish(p, timeout=60) for p in both]
        done = finish(proc, timeout=60)
    finally:
        stop(proc)
    assert done.returncode == 0, done.explain()
    queued = [s for s in sent if s.returncode == 0]
    refused = [s for s in sent if s.returncode != 0]
    rows = _controls(home)
    applied = [c for c in rows if c.result == "applied"]
    assert len(applied) == 1, [(c.verb, c.result) for c in rows]
    first = applied[0]
    if len(queued) == 2:  # both queued: the run took the first and named it to the second
        [other] = [c for c in rows if c is not first]
        assert other.result == f"rejected:already-decided:{_verdict(first.verb)}:{first.id}"
    else:  # the second came after the first was applied: refused when sent, naming it
        assert first.id in refused[0].stderr, refused[0].explain()


def _verdict(verb: str) -> str:
    return "approved" if verb == "approve" else "denied"


def test_bad_input_is_refused_and_arguments_are_shown_escaped(tmp_path: Path) -> None:
    home, env = tmp_path / "home", _env(tmp_path)
    steps = [
        {"tool_calls": [{"name": "post", "args": {"message": "red \x1b[31malert"}}]},
        {"response": "done"},
    ]
    plain = {"plan": [{"agent_id": "x", "instruction": "hi"}]}
    other_plan = write_yaml(tmp_path / "other.yaml", plain)
    other = run_cli(home, "flow", "--plan", other_plan, "--model", "echo", "--json", env=env)
    assert other.returncode == 0, other.explain()
    proc = _start(home, tmp_path, _setup(tmp_path, steps))
    try:
        request = _waiting(home, env, proc)
        run, rid = request["run_id"], request["request_id"]
        elsewhere = run_cli(home, "ctl", "approve", other.json["run_id"], rid, env=env)
        assert elsewhere.returncode == 3, elsewhere.explain()
        assert f"belongs to run {run}" in elsewhere.stderr
        listed = run_cli(home, "approvals", env=env)
        assert listed.returncode == 0, listed.explain()
        assert "\x1b" not in listed.stdout and "\\u001b[31malert" in listed.stdout
        unknown = run_cli(home, "ctl", "approve", run, "apr_0000000000000000", env=env)
        assert unknown.returncode != 0 and "unknown approval request" in unknown.stderr
        bad = run_cli(home, "ctl", "approve", run, rid, "--args", "{not json", env=env)
        assert bad.returncode == 2, bad.explain()
        not_object = run_cli(home, "ctl", "approve", run, rid, "--args", "[1]", env=env)
        assert not_object.returncode == 2, not_object.explain()
        assert _controls(home) == []  # nothing refused was queued
        sent = run_cli(home, "ctl", "deny", run, rid, env=env)
        assert sent.returncode == 0, sent.explain()
        done = finish(proc, timeout=60)
    finally:
        stop(proc)
    assert done.returncode == 0, done.explain()
    assert _ledger(tmp_path) == []


def test_a_node_with_approval_required_waits_before_its_call_while_others_run(
    tmp_path: Path,
) -> None:
    home, env = tmp_path / "home", _env(tmp_path)
    script = write_yaml(tmp_path / "s.yaml", {"publish": {"response": "published"},
                                              "other": {"response": "other done"}})  # fmt: skip
    plan = [
        {"agent_id": "publish", "instruction": "publish the post", "approval": "required"},
        {"agent_id": "other", "instruction": "do the other thing"},
    ]
    write_yaml(tmp_path / "p.yaml", {"plan": plan})
    proc = _start(home, tmp_path, script)
    try:
        request = _waiting(home, env, proc)
        assert (request["node"], request["tool"]) == ("publish", None)
        assert request["args"] == {"instruction": "publish the post"}

        def other_done() -> bool:
            shown = run_cli(home, "show", request["run_id"], "--json", env=env)
            nodes = {n["id"]: n["status"] for n in shown.json["nodes"]}
            return nodes == {"publish": "awaiting_approval", "other": "completed"}

        wait_for(other_done, timeout=60, interval=0.1, what="other completed, publish waiting")
        assert [r["node"] for r in read_invocations(home)] == ["other"]  # publish not called
        sent = run_cli(home, "ctl", "deny", request["run_id"], request["request_id"],
                       "--reason", "legal did not sign off", env=env)  # fmt: skip
        assert sent.returncode == 0, sent.explain()
        done = finish(proc, timeout=60)
    finally:
        stop(proc)
    nodes = {n["id"]: n for n in done.json["nodes"]}
    assert nodes["publish"]["status"] == "failed"
    assert "legal did not sign off" in str(nodes["publish"].get("error")), done.explain()
    assert [r["node"] for r in read_invocations(home)] == ["other"]


def test_an_unanswered_request_is_denied_at_the_approval_timeout(tmp_path: Path) -> None:
    home, env = tmp_path / "home", _env(tmp_path)
    proc = _start(home, tmp_path, _setup(tmp_path), "--approval-timeout", "1")
    try:
        done = finish(proc, timeout=60)
    finally:
        stop(proc)
    assert done.returncode == 0, done.explain()
    assert [e["tool"] for e in _ledger(tmp_path)] == ["lookup", "lookup"]
    run_id = done.json["run_id"]
    [denied] = [s for s in _steps(home, run_id, env) if s["kind"] == "approval"]
    assert (denied["status"], denied["sender"]) == ("denied", "timeout")
    assert denied["reason"] == "no decision within 1 s (approval timeout)"


def test_ctl_stop_while_waiting_stops_resumable_and_the_resume_waits_again(
    tmp_path: Path,
) -> None:
    home, env = tmp_path / "home", _env(tmp_path)
    proc = _start(home, tmp_path, _setup(tmp_path))
    try:
        request = _waiting(home, env, proc)
        sent = run_cli(home, "ctl", "stop", request["run_id"], env=env)
        assert sent.returncode == 0, sent.explain()
        stopped = finish(proc, timeout=60)
    finally:
        stop(proc)
    assert stopped.returncode == 75, stopped.explain()
    assert [e["tool"] for e in _ledger(tmp_path)] == ["lookup"]
    resumed = start_cli(home, "resume", request["run_id"], "--json", env=env)
    try:
        again = _waiting(home, env, resumed, not_of=request["run_id"])
        assert again["request_id"] == request["request_id"]  # the same request, not a new one
        assert [r["run_id"] for r in _approvals(home, env)] == [again["run_id"]]
        assert _requests(home) == [1, 2]  # the model was not asked again
        sent = run_cli(home, "ctl", "approve", again["run_id"], again["request_id"], env=env)
        assert sent.returncode == 0, sent.explain()
        done = finish(resumed, timeout=60)
    finally:
        stop(resumed)
    assert done.returncode == 0, done.explain()
    assert [e["tool"] for e in _ledger(tmp_path)] == ["lookup", "post", "lookup"]


async def test_mcp_lists_approves_and_denies_with_the_sdk_client(tmp_path: Path) -> None:
    """The MCP server's list_approvals, approve and deny (``--allow-control``), in process."""
    import asyncio

    from mcp import Client

    from steerflow.mcp import build_server

    home, env = tmp_path / "home", _env(tmp_path)
    steps = [
        {"tool_calls": [{"name": "post", "args": {"message": "one"}}]},
        {"tool_calls": [{"name": "post", "args": {"message": "two"}}]},
        {"response": "done"},
    ]
    proc = _start(home, tmp_path, _setup(tmp_path, steps))
    try:
        first = await asyncio.to_thread(_waiting, home, env, proc)
        async with Client(build_server(home, allow_control=True)) as client:
            listed = (await client.call_tool("list_approvals", {})).structured_content
            assert [r["request_id"] for r in listed["approvals"]] == [first["request_id"]]
            sent = await client.call_tool("approve", {"target": first["run_id"],
                "request_id": first["request_id"], "args": {"message": "one, edited"}})  # fmt: skip
            assert not sent.is_error, sent.content

            def second() -> Any:
                found = [r for r in _approvals(home, env) if r["request_id"] != first["request_id"]]
                return found[0] if found else None

            other = await asyncio.to_thread(wait_for, second, timeout=60, what="second request")
            denied = await client.call_tool("deny", {"target": other["run_id"],
                "request_id": other["request_id"], "reason": "one is enough"})  # fmt: skip
            assert not denied.is_error, denied.content
            unknown = await client.call_tool("deny", {"target": other["run_id"],
                                                      "request_id": "apr_nope"})  # fmt: skip
            assert unknown.is_error
        done = await asyncio.to_thread(finish, proc, timeout=60)
    finally:
        stop(proc)
    assert done.returncode == 0, done.explain()
    assert _ledger(tmp_path) == [{"tool": "post", "message": "one, edited"}]
    senders = {c.verb: c.sender for c in _controls(home)}
    assert senders["approve"].startswith("mcp:") and senders["deny"].startswith("mcp:")


def test_the_studio_approvals_page_lists_escapes_and_decides_with_csrf(tmp_path: Path) -> None:
    """``/approvals`` over real HTTP on loopback: the forms need the page's CSRF token."""
    import re
    import threading

    import httpx

    from steerflow.studio import listen

    home, env = tmp_path / "home", _env(tmp_path)
    evil = "<img src=x onerror=alert(1)>"
    steps = [{"tool_calls": [{"name": "post", "args": {"message": evil}}]}, {"response": "ok"}]
    proc = _start(home, tmp_path, _setup(tmp_path, steps))
    listening = listen(home, port=0)
    thread = threading.Thread(target=listening.run, name="studio", daemon=True)
    thread.start()
    try:
        request = _waiting(home, env, proc)
        wait_for(lambda: listening.server.started, timeout=30, what="the studio to start")
        base = listening.url.split("/?", 1)[0]
        with httpx.Client(base_url=base, timeout=30) as client:
            assert client.get(listening.url.removeprefix(base)).status_code == 303  # cookie
            run_page = client.get(f"/runs/{request['run_id']}").text
            assert '1 approval request waits for a decision: <a href="/approvals">' in run_page
            page = client.get("/approvals").text
            assert request["request_id"] in page
            assert evil not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
            match = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
            assert match, page
            form = {"run": request["run_id"], "request_id": request["request_id"],
                    "verb": "approve", "args": '{"message": "safe text"}'}  # fmt: skip
            refused = client.post("/approvals/decide", data={**form, "csrf": "0" * 64})
            assert refused.status_code == 403
            bad = client.post("/approvals/decide", data={**form, "args": "{no", "csrf": match[1]})
            assert bad.status_code == 400
            assert _controls(home) == []
            sent = client.post("/approvals/decide", data={**form, "csrf": match[1]})
            assert sent.status_code == 303, sent.text
        done = finish(proc, timeout=60)
    finally:
        stop(proc)
        listening.server.should_exit = True
        thread.join(timeout=30)
    assert done.returncode == 0, done.explain()
    assert _ledger(tmp_path) == [{"tool": "post", "message": "safe text"}]
    [control] = _controls(home)
    assert control.result == "applied" and control.sender.startswith("studio:")


def test_a_decision_from_another_host_over_postgresql(tmp_path: Path, pg: Any) -> None:
    """The flow on ``host-a``, ``approvals`` and ``ctl approve`` on ``host-b``: the two share
    only the PostgreSQL state DB (``--state-db``); the row's NOTIFY wakes the run."""
    from steerflow.state import HOST_ID_ENV, STATE_DB_URL_ENV, StateDB

    url = pg.new_database()
    home_a, home_b = tmp_path / "host-a", tmp_path / "host-b"
    env_a = {**_env(tmp_path), HOST_ID_ENV: "host-a", STATE_DB_URL_ENV: ""}
    env_b = {**_env(tmp_path), HOST_ID_ENV: "host-b", STATE_DB_URL_ENV: ""}
    script = _setup(tmp_path)
    proc = start_cli(home_a, "--state-db", url, "flow", "--plan", tmp_path / "p.yaml",
                     "--model", f"script:{script}", "--allow-python", "--json",
                     env=env_a)  # fmt: skip
    try:

        def waiting() -> dict[str, Any] | None:
            if proc.poll() is not None:
                raise AssertionError(f"the flow exited early: {finish(proc).explain()}")
            listed = run_cli(home_b, "--state-db", url, "approvals", "--json", env=env_b)
            assert listed.returncode == 0, listed.explain()
            found = listed.json["approvals"]
            return found[0] if found else None

        request = wait_for(waiting, timeout=60, interval=0.1, what="a request seen from host-b")
        sent = run_cli(home_b, "--state-db", url, "ctl", "approve", request["run_id"],
                       request["request_id"], env=env_b)  # fmt: skip
        assert sent.returncode == 0, sent.explain()
        done = finish(proc, timeout=60)
    finally:
        stop(proc)
    assert done.returncode == 0, done.explain()
    assert [e["tool"] for e in _ledger(tmp_path)] == ["lookup", "post", "lookup"]
    with StateDB.open_url(url, create=False) as db:
        [control] = [c for s in db.list_sessions(limit=None) for c in db.list_controls(s.id)]
    assert (control.verb, control.result) == ("approve", "applied")
    assert "@host-b:" in str(control.sender)
