"""``ctl`` takes a run id, and refuses a cap the run cannot enforce when it is sent (issue 38).

A live flow (its one node held by ``gated_cli.py``) on a ``script:`` model that reports
usage but has no price: ``ctl budget RUN --max-cost`` is refused at once (exit 3) with the
reason the run recorded, and queues nothing; a token cap, which it can enforce, is queued
and applied. Every ``ctl`` here names the run by its run id (CONTRACT §12).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ctl_support import (
    count_controls,
    ctl,
    ctl_ok,
    live_flow,
    node_metadata,
    session_phase,
    wait_stamped,
    write_yaml,
)

import steerflow
from steerflow.errors import RefusedError

GATED_CLI = Path(__file__).resolve().with_name("gated_cli.py")


def test_a_run_id_is_a_target_and_an_unpriced_cost_cap_is_refused_when_sent(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    script = write_yaml(tmp_path / "s.yaml", {"*": {"usage": {"input_tokens": 10,
                                                              "output_tokens": 5}}})  # fmt: skip
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {"plan": [{"agent_id": "a", "instruction": "x"},
                  {"agent_id": "b", "instruction": "y", "depends_on": ["a"]}]},
    )  # fmt: skip
    args = ["--plan", str(plan), "--model", f"script:{script}"]
    home.mkdir(mode=0o700)
    (home / "gate-a").touch()
    argv = [sys.executable, str(GATED_CLI), "--home", str(home), "flow", *args, "--json"]
    with live_flow(home, args, argv=argv) as flow:
        run, sid = flow.run_id, flow.session_id
        flow.wait_nodes(lambda st: st.get("a") == "running", what="a running")
        # The run recorded, before it ran anything, what it cannot enforce.
        why = node_metadata(home, sid)["unenforceable"]["max_cost"]
        assert "no price is known for model 'script:" in why, why
        assert "max_tokens" not in node_metadata(home, sid)["unenforceable"]

        refused = ctl(home, "budget", run, "--max-cost", "5")
        assert refused.returncode == 3, (refused.stdout, refused.stderr)
        assert f"unenforceable: {why}" in refused.stderr
        assert refused.stdout == "" and count_controls(home) == 0
        with pytest.raises(RefusedError, match="no price is known for model 'script:"):
            steerflow.budget(home, run, max_cost=5)
        assert count_controls(home) == 0

        capped = ctl_ok(home, "budget", run, "--max-tokens", "100000")
        assert wait_stamped(home, capped, alive=flow.proc).result == "applied"
        paused = ctl_ok(home, "pause", run)  # a run id: the session that runs it
        assert wait_stamped(home, paused, alive=flow.proc).result == "applied"
        assert session_phase(home, sid) == "paused"
        # Queued while paused and before the resume: the poller applies controls in
        # order (D1), so the message is in the shared context before b may start.
        ctl_ok(home, "msg", run, "for b")
        (home / "release-a").touch()
        resumed = ctl_ok(home, "resume", run)
        assert wait_stamped(home, resumed, alive=flow.proc).result == "applied"
        assert flow.finish() == 0, flow.stderr()
    assert "for b" in flow.responses()["b"]


def test_a_run_id_no_session_ran_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plan = write_yaml(tmp_path / "plan.yaml", {"plan": [{"agent_id": "a", "instruction": "x"}]})
    with live_flow(home, ["--plan", str(plan)], wait_session=False) as flow:
        assert flow.finish() == 0
    refused = ctl(home, "pause", "20200101T000000-abcdef")
    assert refused.returncode == 3 and "unknown run id" in refused.stderr, refused.stderr
    assert count_controls(home) == 0
