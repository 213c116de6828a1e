"""Typed outputs through the command line (issue 40 item 2), each step a real subprocess.

A plan file gives a node an ``output_schema``; the ``script:`` model answers it. What is
checked: ``result --json`` and ``show RUN NODE --json`` carry the validated ``output``;
the dependent's instruction holds the upstream JSON; a reply that never fits fails the
node after ``1 + retry.attempts`` calls, naming the problem; a plan whose schema is not a
JSON Schema exits 2 naming the key; and an ``output`` edited in the checkpoint makes a
resume refuse (exit 3), as an edited response does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from flow_support import read_invocations, run_cli, write_yaml

SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "score": {"type": "integer", "minimum": 0}},
    "required": ["title", "score"],
    "additionalProperties": False,
}


def _plan(tmp_path: Path, **entry: Any) -> Path:
    return write_yaml(
        tmp_path / "plan.yaml",
        {
            "plan": [
                {"agent_id": "rate", "instruction": "Rate it", "output_schema": SCHEMA, **entry},
                {"agent_id": "use", "instruction": "Use the rating", "depends_on": ["rate"]},
            ]
        },
    )


def _script(tmp_path: Path, nodes: dict[str, Any]) -> str:
    return "script:" + str(write_yaml(tmp_path / "script.yaml", nodes))


def test_result_and_show_carry_the_output_and_the_dependent_gets_its_json(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    reply = {"title": "déjà vu", "score": 7}
    model = _script(tmp_path, {"rate": {"response": reply}, "use": {"response": "used"}})
    done = run_cli(home, "flow", "--plan", _plan(tmp_path), "--model", model, "--json")
    assert done.returncode == 0, done.explain()
    run = done.json["run_id"]

    shown = run_cli(home, "show", run, "rate", "--json")
    assert shown.returncode == 0, shown.explain()
    assert shown.json["output"] == reply
    assert json.loads(shown.json["response"]) == reply  # the response is the output's JSON

    human = run_cli(home, "show", run, "rate")
    assert human.returncode == 0, human.explain()
    pretty = '{\n  "score": 7,\n  "title": "déjà vu"\n}'  # script: dumps keys sorted
    assert f"output (validated against its output_schema):\n{pretty}\n" in human.stdout

    used = run_cli(home, "show", run, "use", "--json").json
    assert used["output"] is None  # no schema: no output
    assert "### rate (completed)\n" in used["instruction"]
    block = used["instruction"].split("### rate (completed)\n", 1)[1]
    assert json.loads(block) == reply

    result = run_cli(home, "result", run, "--json")
    assert result.returncode == 0, result.explain()
    assert [(n["id"], n["output"]) for n in result.json["nodes"]] == [("use", None)]

    # ``rate`` as the only sink: the result carries its output
    only = write_yaml(
        tmp_path / "one.yaml",
        {"plan": [{"agent_id": "rate", "instruction": "Rate it", "output_schema": SCHEMA}]},
    )
    second = run_cli(home, "flow", "--plan", only, "--model", model, "--json")
    assert second.returncode == 0, second.explain()
    result = run_cli(home, "result", second.json["run_id"], "--json").json
    assert [(n["id"], n["output"]) for n in result["nodes"]] == [("rate", reply)]


def test_a_reply_that_never_fits_fails_after_one_plus_attempts_calls(tmp_path: Path) -> None:
    home = tmp_path / "home"
    model = _script(tmp_path, {"rate": {"response": {"title": "x", "score": -1}}})
    plan = _plan(tmp_path, retry={"attempts": 2})
    done = run_cli(home, "flow", "--plan", plan, "--model", model, "--json")
    assert done.returncode == 1, done.explain()
    nodes = {n["id"]: n for n in done.json["nodes"]}
    assert nodes["rate"]["status"] == "failed"
    error = nodes["rate"]["error"]
    assert "does not match its output_schema after 3 calls" in error
    assert "$.score" in error and "minimum" in error
    assert nodes["use"]["status"] == "skipped"
    calls = [i for i in read_invocations(home) if i["node"] == "rate"]
    assert len(calls) == 3


def test_a_plan_whose_schema_is_not_a_json_schema_exits_2_naming_the_key(
    tmp_path: Path,
) -> None:
    plan = write_yaml(
        tmp_path / "bad.yaml",
        {"plan": [{"agent_id": "a", "instruction": "x", "output_schema": {"type": "nope"}}]},
    )
    done = run_cli(tmp_path / "home", "flow", "--plan", plan, "--model", "echo", "--json")
    assert done.returncode == 2, done.explain()
    message = done.json["error"]["message"]
    assert "plan[0].output_schema" in message and "not a valid JSON Schema" in message


def test_echo_cannot_answer_a_typed_node(tmp_path: Path) -> None:
    plan = write_yaml(
        tmp_path / "p.yaml",
        {"plan": [{"agent_id": "a", "instruction": "x", "output_schema": SCHEMA}]},
    )
    done = run_cli(tmp_path / "home", "flow", "--plan", plan, "--model", "echo", "--json")
    assert done.returncode == 1, done.explain()
    (node,) = done.json["nodes"]
    assert node["status"] == "failed" and "echo cannot answer node 'a'" in node["error"]


def _journal(run_dir: Path) -> list[dict[str, Any]]:
    text = (run_dir / "checkpoint.json.journal").read_text()
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize(
    "edit",
    [
        lambda entry: {**entry, "output": {"title": "déjà vu", "score": 8}},
        lambda entry: {k: v for k, v in entry.items() if k != "output"},
    ],
    ids=["changed", "removed"],
)
def test_an_edited_output_is_refused_like_an_edited_response(tmp_path: Path, edit: Any) -> None:
    home = tmp_path / "home"
    model = _script(
        tmp_path,
        {"rate": {"response": {"title": "déjà vu", "score": 7}}, "use": {"fail": "no"}},
    )
    done = run_cli(home, "flow", "--plan", _plan(tmp_path), "--model", model, "--json")
    assert done.returncode == 1, done.explain()
    run_dir = Path(done.json["run_dir"])
    records = _journal(run_dir)
    (rated,) = [r for r in records if r["kind"] == "op" and r["entry"]["agent_id"] == "rate"]
    assert rated["entry"]["output"] == {"title": "déjà vu", "score": 7}

    # Untouched, a resume replays ``rate`` with its output (nothing asked again).
    dry = run_cli(home, "resume", run_dir.name, "--retry-failed", "--dry-run", "--json")
    assert dry.returncode == 0, dry.explain()

    rated["entry"] = edit(rated["entry"])
    (run_dir / "checkpoint.json.journal").write_text(
        "".join(json.dumps(r, separators=(",", ":"), ensure_ascii=False) + "\n" for r in records)
    )
    invoked = len(read_invocations(home))
    refused = run_cli(home, "resume", run_dir.name, "--retry-failed", "--json")
    assert refused.returncode == 3, refused.explain()
    message = refused.json["error"]["message"]
    assert "'rate'" in message and "result_digest" in message
    assert len(read_invocations(home)) == invoked  # nothing ran


def test_a_resume_replays_the_output_and_hands_it_to_the_rerun_dependent(tmp_path: Path) -> None:
    home = tmp_path / "home"
    reply = {"title": "déjà vu", "score": 7}
    nodes: dict[str, Any] = {"rate": {"response": reply}, "use": {"fail": "not yet"}}
    model = _script(tmp_path, nodes)
    first = run_cli(home, "flow", "--plan", _plan(tmp_path), "--model", model, "--json")
    assert first.returncode == 1, first.explain()
    _script(tmp_path, {**nodes, "use": {"response": "used"}})  # the same file, now passing

    resumed = run_cli(home, "resume", first.json["run_id"], "--retry-failed", "--json")
    assert resumed.returncode == 0, resumed.explain()
    run = resumed.json["run_id"]
    calls = [i["node"] for i in read_invocations(home)]
    assert calls.count("rate") == 1  # replayed, never asked again
    shown = run_cli(home, "show", run, "rate", "--json").json
    assert shown["replayed"] is True and shown["output"] == reply

    used = run_cli(home, "show", run, "use", "--json").json
    assert json.loads(used["instruction"].split("### rate (completed)\n", 1)[1]) == reply
    # the resumed checkpoint carries the output, and its digest still verifies
    again = run_cli(home, "resume", run, "--dry-run", "--json")
    assert again.returncode == 0, again.explain()
