"""Studio 3 (issue 42 item 5): only actions that can work, over real HTTP on loopback.

Real flows (``steerflow flow`` subprocesses on the ``script:`` model) for the failed and
the budget-exhausted run; each recovery link the run page offers is checked against the
CLI's own ``resume --dry-run`` with the same flags. The Set cap and queued-control cases
are real state DB rows (``StateDB``) the studio reads as a flow would leave them.
"""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

from ctl_support import run_cli, wait_for, write_yaml
from test_studio_e2e import studio

from steerflow import views
from steerflow.state import StateDB

RUN = "20260101T000000-abcdef"
FLAGS = {"resume": [], "retry_failed": ["--retry-failed"], "fork": ["--fork"],
         "rerun_unsettled": ["--rerun-unsettled"]}  # fmt: skip


def _csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
    assert match, page
    return match.group(1)


def _flow(tmp_path: Path, home: Path, script: dict[str, object], *extra: str) -> str:
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "name": "two steps",
            "plan": [
                {"agent_id": "a", "instruction": "do a"},
                {"agent_id": "b", "instruction": "do b", "depends_on": ["a"]},
            ],
        },
    )
    path = write_yaml(tmp_path / "script.yaml", script)
    done = run_cli(home, "flow", "--plan", plan, "--model", f"script:{path}", *extra, "--json")
    assert done.returncode in (0, 1, 76), done.stderr  # 76: budget exhausted
    return str(json.loads(done.stdout)["run_id"])


def test_a_failed_run_offers_only_the_modes_its_dry_runs_accept(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run = _flow(tmp_path, home, {"b": {"fail": "b broke"}})
    with studio(home) as s, s.client() as client:
        page = client.get(f"/runs/{run}").text
    actions = page[page.index('id="recovery-actions"') :].split("</p>", 1)[0]
    offered = set(re.findall(r'<a class="action" data-mode="(\w+)"', actions))
    disabled = set(re.findall(r'<span class="action disabled" data-mode="(\w+)"', actions))
    assert offered | disabled == set(FLAGS) and not offered & disabled
    assert offered == {"retry_failed"}  # a failed node: only --retry-failed resumes it
    # The page's refusal is the CLI's: same exit, same words.
    dry = run_cli(home, "resume", run, "--dry-run", "--json")
    assert dry.returncode == 3, dry.stderr
    (title,) = re.findall(r'data-mode="resume" aria-disabled="true" title="([^"]*)"', actions)
    assert unescape(title).split(": ", 1)[1] in dry.stderr
    retry = run_cli(home, "resume", run, "--retry-failed", "--dry-run", "--json")
    assert retry.returncode == 0, retry.stderr  # the one offered is one the CLI accepts


def test_budget_exhausted_run_raises_its_cap_and_resumes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    used = {"response": "ok", "usage": {"input_tokens": 40, "output_tokens": 10}}
    run = _flow(tmp_path, home, {"a": used, "b": used}, "--max-tokens", "30")
    with studio(home) as s, s.client() as client:
        page = client.get(f"/runs/{run}").text
        assert 'id="run-status">budget_exhausted</span>' in page
        assert 'id="raise-cap"' in page and 'name="max_tokens"' in page
        confirm = client.get(
            f"/runs/{run}/resume", params={"mode": "resume", "max_tokens": "1000"}
        ).text
        assert f"steerflow resume {run} --max-tokens 1000" in confirm
        assert '<input type="hidden" name="max_tokens" value="1000">' in confirm
        bad = client.get(f"/runs/{run}/resume", params={"mode": "resume", "max_tokens": "-3"})
        assert bad.status_code == 400 and "--max-tokens" in bad.text
        started = client.post(
            f"/runs/{run}/resume",
            data={"csrf": _csrf(confirm), "mode": "resume", "max_tokens": "1000"},
        )
        assert started.status_code == 303, started.text

        def resumed() -> str | None:
            new = [r for r in views.list_runs(home, limit=None) if r.resumed_from_run == run]
            return new[0].status if new and new[0].status != "running" else None

        # The raised cap went with it: the new run is not exhausted at once.
        assert wait_for(resumed, timeout=60, what="the resume to end") == "completed"


def test_set_cap_refused_up_front_and_queued_notice_cleared(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "runs" / RUN).mkdir(parents=True)
    why = "--max-cost: no price is known for model 'script:x'"
    with StateDB.open(home) as db:
        row = db.create_session(kind="flow", run_id=RUN, phase="executing")
        db.update_node_metadata(row.id, {"unenforceable": {"max_cost": why}})
        pause = db.insert_control(session_id=row.id, verb="pause", payload=None)
    with studio(home) as s, s.client() as client:
        refused = client.get(f"/runs/{RUN}/budget", params={"max_cost": "1"}).text
        assert 'id="budget-refused"' in refused and "no price is known" in refused
        assert "Set the new cap" not in refused and "may spend" not in refused
        # A token cap those models can enforce is still offered.
        tokens = client.get(f"/runs/{RUN}/budget", params={"max_tokens": "100"}).text
        assert "Set the new cap" in tokens and 'id="budget-refused"' not in tokens

        waiting = client.get(f"/runs/{RUN}", params={"queued": pause.id}).text
        assert f"queued control {pause.id}: the flow applies it" in waiting
        with StateDB.open(home) as db:
            db.finalize_control(pause.id, "applied")
        # The same URL (the page reloads itself in place) no longer says "queued".
        applied = client.get(f"/runs/{RUN}", params={"queued": pause.id}).text
        assert "the flow applies it" not in applied
        assert f'id="page-notice">queued control {pause.id}: applied</p>' in applied
