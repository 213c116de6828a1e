"""Budgets offline: ``script:`` models reporting ``usage`` (CONTRACT §11), through the CLI.

Every call here reports 1000 input and 500 output tokens and is priced at $10/$20 per
million (the plan key ``prices``), so each costs exactly $0.02; the script invocation log
counts what was paid for across a run and its resumes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from flow_support import read_invocations, run_cli, write_yaml

pytestmark = pytest.mark.timeout(180)

USAGE = {"input_tokens": 1000, "output_tokens": 500}


def _prices(*scripts: Path) -> dict[str, Any]:
    return {f"script:{s}": {"input": 10, "output": 20} for s in scripts}


def _statuses(out: dict[str, Any]) -> dict[str, str]:
    return {n["id"]: n["status"] for n in out["nodes"]}


def test_a_cap_crossed_during_an_escalation_ladder(tmp_path: Path) -> None:
    home = tmp_path / "home"
    scripts = [tmp_path / f"m{i}.yaml" for i in range(3)]
    for script in scripts[:2]:  # a paid call that writes nothing fails its artifact check
        write_yaml(script, {"*": {"usage": USAGE}})
    write_yaml(scripts[2], {"*": {"usage": USAGE, "artifacts": {"out.txt": "done"}}})
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "max_cost": 0.05,
            "prices": _prices(*scripts),
            "roles": {
                "w": {
                    "model": f"script:{scripts[0]}",
                    "escalation": [f"script:{scripts[1]}", f"script:{scripts[2]}"],
                }
            },
            "plan": [
                {"agent_id": "a", "assignee": "w", "instruction": "do a", "artifacts": ["out.txt"]},
                {"agent_id": "b", "instruction": "use a", "depends_on": ["a"]},
            ],
        },
    )
    model = f"script:{scripts[2]}"
    first = run_cli(home, "flow", "--plan", plan, "--model", model, "--json")
    assert first.returncode == 76, first.explain()
    out = first.json
    # a ($0.02) failed, a.esc1 fitted ($0.04), a.esc2 would have passed $0.05.
    assert _statuses(out) == {"a": "failed", "a.esc1": "failed", "a.esc2": "pending",
                              "b": "pending"}  # fmt: skip
    assert out["usage"]["cost_usd"] == pytest.approx(0.04)  # failed attempts are paid for
    assert [i["node"] for i in read_invocations(home)] == ["a", "a.esc1"]

    again = run_cli(home, "resume", out["run_id"], "--max-cost", "0.5", "--json")
    assert again.returncode == 0, again.explain()
    assert [i["node"] for i in read_invocations(home)] == ["a", "a.esc1", "a.esc2", "b"]
    assert again.json["usage"]["cost_usd"] == pytest.approx(0.04)  # a.esc2 and b only


def test_a_cap_crossed_during_a_spawn_burst(tmp_path: Path) -> None:
    home = tmp_path / "home"
    children = [{"agent_id": f"c{i}", "instruction": f"part {i}"} for i in range(1, 7)]
    script = write_yaml(
        tmp_path / "s.yaml", {"*": {"usage": USAGE}, "a": {"usage": USAGE, "spawn": children}}
    )
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "concurrency": 1,
            "prices": _prices(script),
            "plan": [{"agent_id": "a", "instruction": "split the work"}],
        },
    )
    args = ["--plan", plan, "--model", f"script:{script}", "--reactive", "all", "--json"]
    first = run_cli(home, "flow", *args, "--max-cost", "0.07")
    assert first.returncode == 76, first.explain()
    statuses = _statuses(first.json)
    assert [k for k, v in statuses.items() if v == "completed"] == ["a", "c1", "c2"]
    assert [k for k, v in statuses.items() if v == "pending"] == ["c3", "c4", "c5", "c6"]
    assert len(read_invocations(home)) == 3

    # A second resume of the chain: the cap counts the first run's $0.06 too.
    second = run_cli(home, "resume", first.json["run_id"], "--max-cost", "0.11", "--json")
    assert second.returncode == 76, second.explain()
    assert [i["node"] for i in read_invocations(home)] == ["a", "c1", "c2", "c3", "c4"]
    assert second.json["budget_exhausted"]["spent"]["cost_usd"] == pytest.approx(0.10)
    third = run_cli(home, "resume", second.json["run_id"], "--max-cost", "1", "--json")
    assert third.returncode == 0, third.explain()
    nodes = [i["node"] for i in read_invocations(home)]
    assert nodes == ["a", "c1", "c2", "c3", "c4", "c5", "c6"]  # each paid for once


def test_a_script_cap_without_a_price_is_refused_before_anything_runs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = write_yaml(tmp_path / "s.yaml", {"*": {"usage": USAGE}})
    plan = write_yaml(tmp_path / "plan.yaml", {"plan": [{"agent_id": "a", "instruction": "x"}]})
    run = run_cli(home, "flow", "--plan", plan, "--model", f"script:{script}", "--max-cost", "1")
    assert run.returncode == 2, run.explain()
    assert f"no price is known for model 'script:{script}'" in run.stderr
    assert read_invocations(home) == []


@pytest.mark.parametrize("usage", [{"input_tokens": -1}, {"input_tokens": "many"}, {"x": 1}])
def test_bad_script_usage_is_a_usage_error(tmp_path: Path, usage: dict[str, Any]) -> None:
    script = write_yaml(tmp_path / "s.yaml", {"a": {"usage": usage}})
    plan = write_yaml(tmp_path / "plan.yaml", {"plan": [{"agent_id": "a", "instruction": "x"}]})
    run = run_cli(tmp_path / "home", "flow", "--plan", plan, "--model", f"script:{script}")
    assert run.returncode == 2, run.explain()
    assert "usage" in run.stderr


def test_a_cost_total_leaving_out_unpriced_calls_says_it_is_partial(tmp_path: Path) -> None:
    """One model priced, one not: every total shows the cost as partial (decision 249)."""
    home = tmp_path / "home"
    priced, unpriced = (write_yaml(tmp_path / f"{n}.yaml", {"*": {"usage": USAGE}})
                        for n in ("priced", "unpriced"))  # fmt: skip
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "prices": _prices(priced),
            "roles": {"paid": {"model": f"script:{priced}"},
                      "free": {"model": f"script:{unpriced}"}},
            "plan": [{"agent_id": k, "assignee": role, "instruction": k}
                     for k, role in (("a", "paid"), ("b", "free"), ("c", "free"))],
        },
    )  # fmt: skip
    done = run_cli(home, "flow", "--plan", plan, "--json")
    assert done.returncode == 0, done.explain()
    partial = {"cost_partial": True, "unpriced_calls": 2}
    usage = done.json["usage"]
    assert usage["cost_usd"] == pytest.approx(0.02) and usage | partial == usage, usage
    run = done.json["run_id"]

    shown = run_cli(home, "show", run)
    assert "usage: 3000 in / 1500 out tokens, $0.0200 (partial: 2 calls unpriced)" in shown.stdout
    for args, pick in (
        (["show", run, "--json"], lambda out: out["usage"]),
        (["show", run, "--json"], lambda out: out["summary"]["usage"]),
        (["runs", "--json"], lambda out: out["runs"][0]["usage"]),
        (["result", run, "--json"], lambda out: out["usage"]),
        (["ctl", "status", run, "--json"], lambda out: out["spent"]),
    ):
        out = run_cli(home, *args)
        assert out.returncode == 0, out.explain()
        got = pick(out.json)
        assert got["cost_usd"] == pytest.approx(0.02) and got | partial == got, (args, got)
