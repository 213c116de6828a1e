"""``ctl msg`` against a live flow process: at-most-once steering (ADR-0069 D3, CONTRACT §6-§7).

The trial flow is many independent nodes run one at a time (``--concurrency 1``)
on the ``script:`` model (echo text: the complete rendered instruction), so each
stored response holds exactly the steer block its own operation received and
never another node's text through a dependency block.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from ctl_support import (
    control,
    controls,
    ctl_ok,
    independent_plan,
    invocations,
    live_flow,
    node_metadata,
    node_statuses,
    occurrences,
    state_db,
    steer_lines,
    wait_for,
    wait_stamped,
    write_yaml,
)
from flow_support import run_cli as run_cli_json
from resume_support import Crafted, fabricate_run, write_script

from steerflow.checkpoint import load_checkpoint
from steerflow.executor import STEER_CLOSE, STEER_OPEN

TRIALS = 50  # `pytest -m slow`
SAMPLE_TRIALS = 10
# The plan maximum: 200 s of node time is far more than the trials need even when a
# loaded machine makes each `ctl` process several times slower; the flow is stopped
# once they are checked, so an idle run only pays for the last two operations.
NODES = 200
NODE_S = 1.0

_STEER_LINE = re.compile(r"^- \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z: (?P<text>.*)$")


def _args(tmp_path: Path, keys_count: int, delay: float) -> list[str]:
    independent_plan(tmp_path / "plan.yaml", keys_count)
    write_yaml(tmp_path / "script.yaml", {"*": {"delay": delay}})
    return [
        "--plan", str(tmp_path / "plan.yaml"),
        "--model", f"script:{tmp_path / 'script.yaml'}",
        "--concurrency", "1",
    ]  # fmt: skip


def _started(home: Path, session_id: str) -> int:
    return sum(s in ("running", "completed") for s in node_statuses(home, session_id).values())


def _completed(home: Path, session_id: str) -> int:
    return sum(s == "completed" for s in node_statuses(home, session_id).values())


def _logged_results(home: Path, session_id: str) -> list[str]:
    return [e["result"] for e in node_metadata(home, session_id).get("control_log", [])]


@pytest.mark.slow
@pytest.mark.timeout(300)  # fifty `ctl` processes in a row: minutes on a loaded machine
def test_message_reaches_exactly_the_next_operation_in_50_trials(tmp_path: Path) -> None:
    _message_trials(tmp_path, TRIALS)


def test_message_reaches_exactly_the_next_operation_in_10_trials(tmp_path: Path) -> None:
    """The default run's share of the 50 trials (``pytest -m slow``)."""
    _message_trials(tmp_path, SAMPLE_TRIALS)


def _message_trials(tmp_path: Path, trials: int) -> None:
    home = tmp_path / "home"
    with live_flow(home, _args(tmp_path, NODES, NODE_S)) as flow:
        sid = flow.session_id
        flow.wait_nodes(lambda s: "running" in s.values(), what="the first node running")
        sent: list[tuple[str, str]] = []
        for i in range(trials):
            text = f"steer-{i:02d}-{uuid.uuid4().hex[:8]}"
            control_id = ctl_ok(home, "msg", sid, text)
            row = wait_stamped(home, control_id, alive=flow.proc)
            assert row.result == "applied", (i, row)
            sent.append((control_id, text))
        # Let the operation that took the last message finish, then stop the run
        # (completed work is persisted; nothing is left in flight with a message).
        base = _completed(home, sid)
        wait_for(lambda: _completed(home, sid) >= base + 2, what="the last steer rendered",
                 alive=flow.proc)  # fmt: skip
        assert _started(home, sid) < NODES, "the flow ran out of operations during the trials"
        assert flow.terminate() == 143, flow.stderr()

    responses = flow.responses()
    found = occurrences([text for _, text in sent], responses)
    misses = {t: keys for t, keys in found.items() if len(keys) != 1}
    assert not misses, f"messages not rendered exactly once: {misses}"

    # Each message sits in its operation's own steer block, in stored order, with a
    # UTC timestamp; no other operation's block repeats it.
    lines_by_key = {k: steer_lines(r) for k, r in responses.items()}
    for key, lines in lines_by_key.items():
        texts = [m.group("text") for m in map(_STEER_LINE.match, lines) if m]
        assert len(texts) == len(lines), lines
        if texts:
            response = responses[key]
            assert response.index(STEER_OPEN) < response.index(STEER_CLOSE)
            assert response.rstrip().endswith(f"Do task {key}."), response
            assert texts == [t for _, t in sent if t in texts], "steer lines out of stored order"

    # "Next": the operation that rendered a message started after the message was sent,
    # and later messages never land in earlier operations.
    started_at = {line["node"]: line["ts"] for line in invocations(home)}
    with state_db(home) as db:
        rows = {c.id: c for c in db.list_controls(sid)}
    order = []
    for control_id, text in sent:
        (key,) = found[text]
        assert started_at[key] > rows[control_id].created_at, (text, key)
        order.append(started_at[key])
    assert order == sorted(order)

    # The canonical queue in the checkpoint records where each message went.
    queue = flow.checkpoint()["flow_context"]["operator_messages"]
    assert [m["control_id"] for m in queue] == [c for c, _ in sent]
    assert all(m["rendered_into_op"] == found[m["text"]][0] for m in queue)


def test_message_without_pending_operation_and_a_graceful_stop(tmp_path: Path) -> None:
    home = tmp_path / "home"
    independent_plan(tmp_path / "plan.yaml", 1)
    # The only node stays in flight until both rows are stamped (with a wide margin for a
    # loaded machine); the flow is then stopped instead of waiting the node out.
    write_yaml(tmp_path / "script.yaml", {"*": {"delay": 30.0}})
    args = ["--plan", str(tmp_path / "plan.yaml"), "--model", f"script:{tmp_path / 'script.yaml'}"]
    with live_flow(home, args) as flow:
        sid = flow.session_id
        flow.wait_nodes(lambda s: s.get("n000") == "running", what="the only node running")
        late = ctl_ok(home, "msg", sid, "too-late-for-anyone")
        # A row without a payload (another caller than the CLI) is a graceful stop.
        with state_db(home) as db:
            stop = db.insert_control(session_id=sid, verb="stop", payload=None)
        assert wait_stamped(home, late, alive=flow.proc).result == "rejected:no-pending-ops"
        assert wait_stamped(home, stop.id, alive=flow.proc).result == "applied"
        # Both verdicts came from the live run (not from its final pass), which goes on:
        # its only operation is still in flight (a graceful stop lets it finish), so there
        # was none left to render the message.
        assert node_statuses(home, sid) == {"n000": "running"}
        with state_db(home) as db:
            session = db.get_session(sid)
        assert session is not None and session.status == "running", session
        logged = wait_for(
            lambda: log if len(log := _logged_results(home, sid)) >= 2 else None,
            what="both verdicts in the control log",
            alive=flow.proc,
        )
        assert logged == ["rejected:no-pending-ops", "applied"]
        assert flow.terminate() == 143, flow.stderr()  # a signal after the stop still wins
    assert [line["node"] for line in invocations(home)] == ["n000"]
    assert flow.result()["status"] == "interrupted"
    assert node_metadata(home, sid)["poller"] == "stopped"
    assert [(c.id, c.result) for c in controls(home, sid)] == [
        (late, "rejected:no-pending-ops"),
        (stop.id, "applied"),
    ]


def test_message_no_operation_was_invoked_with_is_rejected_when_the_run_ends(
    tmp_path: Path,
) -> None:
    """Decision 36: a message appended while ``n001`` was still pending, which the run then
    never started (SIGTERM), is ``rejected:no-pending-ops``, not ``applied``."""
    home = tmp_path / "home"
    independent_plan(tmp_path / "plan.yaml", 2)
    # n000 stays in flight until the flow is stopped; n001 waits for the only slot.
    write_yaml(tmp_path / "script.yaml", {"*": {"delay": 30.0}})
    args = [
        "--plan", str(tmp_path / "plan.yaml"),
        "--model", f"script:{tmp_path / 'script.yaml'}",
        "--concurrency", "1",
    ]  # fmt: skip
    with live_flow(home, args) as flow:
        sid = flow.session_id
        flow.wait_nodes(lambda s: s.get("n000") == "running", what="n000 running")
        message = ctl_ok(home, "msg", sid, "waiting-for-n001")
        # Claimed and queued for n001 (still pending), but no operation was invoked with it.
        queued = wait_for(lambda: r if (r := control(home, message)).result else None,
                          what="the message handled", alive=flow.proc)  # fmt: skip
        assert queued.is_applying and queued.applied_at is None, queued
        assert flow.terminate() == 143, flow.stderr()
    assert [line["node"] for line in invocations(home)] == ["n000"]
    assert control(home, message).result == "rejected:no-pending-ops"


def test_resume_does_not_render_the_source_runs_leftover_messages(tmp_path: Path) -> None:
    """A message the source run queued but never delivered was stamped by that run
    (``rejected:no-pending-ops``, or left ``applying`` if it died); the resumed run must not
    render it into an operation behind that stamp."""
    home = tmp_path / "home"
    script = write_script(tmp_path / "script.yaml", {"*": {"delay": 0.0}})
    crafted = Crafted(script)
    crafted.node("a")
    crafted.node("b", "a")
    crafted.done("a", "A")
    state = crafted.state()
    leftover = {"ts": 1.0, "text": "leftover-steer", "control_id": "c" * 32,
                "rendered_into_op": None}  # fmt: skip
    state["flow_context"] = {"operator_messages": [leftover]}
    run_dir = fabricate_run(home, state)
    resumed = run_cli_json(home, "resume", run_dir.name, "--json")
    assert resumed.returncode == 0, resumed.explain()
    assert [line["node"] for line in invocations(home)] == ["b"]
    new_state, _ = load_checkpoint(Path(resumed.json["run_dir"]))
    assert "leftover-steer" not in str(new_state["ops"]["b"]["response"])
    [queued] = new_state["flow_context"]["operator_messages"]
    assert queued["rendered_into_op"] is None and queued["dropped"] == "source-run-ended"
