"""Nothing from outside reaches the terminal raw (issue 11, item 2).

A loopback OpenAI-compatible server answers with ESC/OSC/BEL/CSI bytes in a planner reply
(assignees, instructions), in an error body, in a reply (response text) and in a spawn
request (its id and assignee); an operator sends a control payload with them. Every
human-readable output of the real CLI (flow progress on stderr, the flow summary, ``runs``,
``show``, ``ctl status``, ``--show-graph``, error lines) shows them escaped (``\\x1b``),
while ``--json`` round-trips the exact text.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flow_support import CliResult, child_env, finish, run_cli, start_cli, stop

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
from llm_fakes import FakeLLMServer, Reply

#: What a terminal acts on: C0 controls but tab and newline, DEL, C1 controls.
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")

TITLE = "\x1b]0;PWNED\x07"  # OSC: sets the window title
CLEAR = "\x1b[2J\x1b[H"  # CSI: clears the screen
C1_CSI = "\x9b31m"  # 8-bit CSI
CLIPBOARD = "\x1b]52;c;cHduZWQ=\x07"  # OSC 52: writes the clipboard

EVIL_ASSIGNEE = f"evil{TITLE}"
EVIL_CHILD_ASSIGNEE = f"kid{C1_CSI}"
EVIL_SPAWN_ID = f"bad{CLEAR}id"
EVIL_ERROR = f"upstream exploded {CLEAR}{TITLE}"
EVIL_REPLY = f"scope notes {CLIPBOARD}"
EVIL_MESSAGE = f"operator says {TITLE}\nsecond line {C1_CSI}"

PLAN = {
    "name": "hostile",
    "plan": [
        {"agent_id": "scope", "assignee": EVIL_ASSIGNEE, "instruction": f"SCOPE-STEP {CLEAR}"},
        {"agent_id": "boom", "assignee": "plain", "instruction": "BOOM-STEP"},
        {"agent_id": "hold", "instruction": "HOLD-STEP"},
        {"agent_id": "lead", "instruction": "LEAD-STEP", "depends_on": ["scope", "hold"]},
    ],
}
SPAWN = {
    "spawn": [
        {"agent_id": EVIL_SPAWN_ID, "instruction": "never runs"},
        {"agent_id": "child", "assignee": EVIL_CHILD_ASSIGNEE, "instruction": "CHILD-STEP"},
    ]
}


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    fake = FakeLLMServer("openai").start()
    try:
        yield fake
    finally:
        fake.close()


def _env(server: FakeLLMServer) -> dict[str, str]:
    env = {k: v for k, v in child_env().items() if not k.startswith("STEERFLOW_")}
    env.update(
        OPENAI_BASE_URL=server.base_url,
        OPENAI_API_KEY="sk-e2e",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        STEERFLOW_PROVIDER_MAX_ATTEMPTS="1",
    )
    return env


def _script(server: FakeLLMServer, gate: threading.Event) -> None:
    server.route("JSON Schema", Reply(text=json.dumps(PLAN)))
    # The SDK takes error.message from a JSON error body verbatim.
    server.route(
        "BOOM-STEP",
        Reply(status=400, body={"error": {"message": EVIL_ERROR, "type": "invalid_request"}}),
    )
    server.route("CHILD-STEP", Reply(text="child done"))
    server.route("LEAD-STEP", Reply(text=f"Lead done.\n\n```json\n{json.dumps(SPAWN)}\n```\n"))
    server.route("SCOPE-STEP", Reply(text=EVIL_REPLY))
    server.route("HOLD-STEP", Reply(text="held", gate=gate))


def _assert_clean(what: str, text: str) -> None:
    found = RAW_CONTROL.findall(text)
    assert not found, f"{what} printed raw control characters {found!r}:\n{text!r}"


def _assert_all_clean(result: CliResult) -> None:
    _assert_clean(f"{result.args} stdout", result.stdout)
    _assert_clean(f"{result.args} stderr", result.stderr)


def _node(view: dict[str, Any], key: str) -> dict[str, Any]:
    found: dict[str, Any] = next(n for n in view["nodes"] if n["id"] == key)
    return found


def test_hostile_bytes_are_escaped_for_humans_and_exact_in_json(
    server: FakeLLMServer, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    env = _env(server)
    gate = threading.Event()
    _script(server, gate)
    model = ("--model", "openai/test-model")
    proc = start_cli(home, "flow", "Do it", *model, "--reactive", "all", "--show-graph", env=env)
    try:
        assert server.wait_for_text("HOLD-STEP", timeout=30), "the flow never reached HOLD-STEP"
        [run] = json.loads(run_cli(home, "runs", "--json", env=env).stdout)["runs"]
        session = run["session_id"]

        # While the flow is held: a control payload with escapes, then every view.
        queued = run_cli(home, "ctl", "msg", session, EVIL_MESSAGE, env=env)
        assert queued.returncode == 0, queued.explain()
        refused = run_cli(home, "ctl", "msg", f"nosuch{TITLE}", "x", env=env)
        assert refused.returncode == 3, refused.explain()
        assert "\\x1b]0;PWNED\\x07" in refused.stderr
        status = run_cli(home, "ctl", "status", session, env=env)
        live_show = run_cli(home, "show", session, env=env)
        for result in (queued, refused, status, live_show):
            _assert_all_clean(result)
        assert status.returncode == 0 and live_show.returncode == 0
        assert "\\x1b]0;PWNED\\x07" in live_show.stdout  # shown, escaped, not dropped
        status_json = json.loads(run_cli(home, "ctl", "status", session, "--json", env=env).stdout)
        assert [c["payload"] for c in status_json["controls"]] == [{"text": EVIL_MESSAGE}]
    finally:
        gate.set()
    try:
        flow = finish(proc, timeout=60)
    finally:
        stop(proc)
    assert flow.returncode == 1, flow.explain()  # `boom` failed
    _assert_all_clean(flow)
    assert "\\x1b[2J" in flow.stdout + flow.stderr  # the server's error, escaped
    assert "\\x1b]0;PWNED\\x07" in flow.stderr  # --show-graph names the assignee, escaped
    assert "bad\\x1b[2J\\x1b[Hid" in flow.stderr  # the rejected spawn id, escaped

    views = (
        ("runs",),
        ("runs", "--all"),
        ("show", session),
        ("show", session, "scope"),  # the node in full: its reply (OSC 52) and assignee
        ("show", session, "boom"),  # the server's error in full
        ("result", session),
        ("ctl", "status", session),
    )
    for args in views:
        view = run_cli(home, *args, env=env)
        assert view.returncode in ((0, 1) if args[0] == "result" else (0,)), view.explain()
        assert "Traceback" not in view.stderr, view.explain()
        _assert_all_clean(view)
    scope = run_cli(home, "show", session, "scope", env=env).stdout
    assert "\\x1b]52;c;cHduZWQ=\\x07" in scope  # the reply is shown, escaped

    # --json: the exact bytes, as JSON strings.
    shown = json.loads(run_cli(home, "show", session, "--json", env=env).stdout)
    assert _node(shown, "scope")["assignee"] == EVIL_ASSIGNEE
    assert _node(shown, "child")["assignee"] == EVIL_CHILD_ASSIGNEE
    again = run_cli(home, "flow", "Do it", *model, "--reactive", "all", "--json", env=env)
    assert again.returncode == 1, again.explain()
    _assert_clean("flow --json stderr", again.stderr)
    out = again.json
    assert EVIL_ERROR in _node(out, "boom")["error"]
    assert [r["agent_id"] for r in out["spawn_rejections"]] == [EVIL_SPAWN_ID]
