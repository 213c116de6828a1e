"""Controls sent while a flow is still planning are honoured.

The flow process runs the real CLI through ``ctl_slowplan.py``, whose ``echo``
planner waits for ``HOME/release-plan``, so the controls provably land before
any operation exists: the pause holds the first operation, and the message
reaches it (and only it), which is when its row is stamped ``applied``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ctl_support import (
    SLOW_PLANNER,
    control,
    ctl_ok,
    ctl_status,
    live_flow,
    node_statuses,
    session_phase,
    steer_lines,
    wait_for,
    wait_stamped,
)


def test_pause_and_message_during_planning(tmp_path: Path) -> None:
    home = tmp_path / "home"
    argv = [sys.executable, str(SLOW_PLANNER), "--home", str(home),
            "flow", "Plan a small survey", "--model", "echo:delay=0.1", "--json"]  # fmt: skip
    with live_flow(home, [], argv=argv) as flow:
        sid = flow.session_id
        assert session_phase(home, sid) == "planning"
        pause = ctl_ok(home, "pause", sid)
        message = ctl_ok(home, "msg", sid, "early-steer: keep it short")
        assert wait_stamped(home, pause, alive=flow.proc).result == "applied"
        # Queued for the first operation: ``applied`` only once one is invoked with it.
        wait_for(lambda: control(home, message).is_applying, what="message queued",
                 alive=flow.proc)  # fmt: skip
        view = ctl_status(home, sid)
        assert view["phase"] == "paused" and view["poller"] == "active"
        assert node_statuses(home, sid) == {}  # still planning: no operation exists yet

        (home / "release-plan").touch()
        # The plan is made; its first operation reaches the closed gate and waits.
        statuses = flow.wait_nodes(lambda s: s.get("scope") == "paused", what="scope held")
        assert all(s in ("paused", "pending") for s in statuses.values()), statuses
        assert session_phase(home, sid) == "paused"

        resume = ctl_ok(home, "resume", sid)
        assert wait_stamped(home, resume, alive=flow.proc).result == "applied"
        assert flow.finish(timeout=60) == 0, flow.stderr()
    assert control(home, message).result == "applied"

    responses = flow.responses()
    assert set(responses) == {"scope", "explore-a", "explore-b", "synthesize"}
    lines = steer_lines(responses["scope"])
    assert len(lines) == 1 and lines[0].endswith("Z: early-steer: keep it short"), lines
    # Later operations see it only inside scope's result, never as a steer of their own.
    assert all(steer_lines(responses[k]) == [] for k in responses if k != "scope")
    queue = flow.checkpoint()["flow_context"]["operator_messages"]
    assert [(m["control_id"], m["rendered_into_op"]) for m in queue] == [(message, "scope")]
