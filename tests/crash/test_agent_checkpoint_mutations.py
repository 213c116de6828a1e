"""Mutated ``agent`` checkpoints are refused, naming the entry (issue 26 item 6).

A real ``steerflow agent`` runs two turns (the second started by a ``ctl msg`` from another
process); then its journal is changed at record boundaries, the way a lost tail, a lost
head or a shuffled copy would change it, and ``steerflow resume`` (a new process) must
refuse (exit 3) naming the turn, run nothing and leave the checkpoint as it was:

* the tail lost (only turn 1's record kept): the message the state DB stamped ``applied``
  is in no recorded turn, so turn 2 is named missing (before: exit 0, the message and
  turn 2 silently gone);
* the head lost (turn 1's records dropped, the rest renumbered): turn 1 is named missing
  (before: ``invalid-transition`` at turn 2's record);
* the turns swapped (each record's label exchanged): turn 1's entry no longer matches its
  digest, which covers its label and number (before: replayed in the wrong slots, exit 0).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from agent_support import WAIT_S, Gate, session_of, start_gated_agent, wait_left_pending
from ctl_support import control, ctl_ok
from flow_support import finish, read_invocations, run_cli, stop, write_yaml

pytestmark = pytest.mark.timeout(240)

Records = list[dict[str, Any]]


def _two_turns(tmp_path: Path) -> tuple[Path, Path, str]:
    """(home, run dir, the message that started turn 2) of a finished two-turn agent."""
    home, gate = tmp_path / "home", Gate(tmp_path / "gate")
    model = "script:" + str(write_yaml(tmp_path / "s.yaml", {"turn-1": {"response": "one"}}))
    proc = start_gated_agent(home, gate, "agent", "t", "--model", model, "--json")
    try:
        gate.wait_started("turn-1", proc)
        msg = ctl_ok(home, "msg", session_of(home), "SECOND")
        wait_left_pending(home, msg)
        gate.release("turn-1", "turn-2")
        done = finish(proc, timeout=WAIT_S)
    finally:
        stop(proc)
    assert done.returncode == 0, done.explain()
    assert [t["id"] for t in done.json["turns"]] == ["turn-1", "turn-2"]
    assert control(home, msg).result == "applied"
    return home, Path(done.json["run_dir"]), msg


def _journal(run_dir: Path) -> Records:
    text = (run_dir / "checkpoint.json.journal").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _label(record: dict[str, Any]) -> str:
    """The turn a record is about: an outcome's agent id, a call intent's node."""
    entry = record["entry"]
    return str(entry["node"] if record["kind"] == "intent" else entry["agent_id"])


def _labels(records: Records) -> list[str]:
    """The outcome records' turns (each turn's call intent comes before its outcome)."""
    return [_label(r) for r in records if r["kind"] == "op"]


def _lose_tail(records: Records) -> Records:
    first = next(n for n, r in enumerate(records) if r["kind"] == "op")
    return records[: first + 1]  # turn 1's intent and outcome; turn 2's prompt and outcome lost


def _lose_head(records: Records) -> Records:
    rest = [r for r in records if _label(r) != "turn-1"]
    return [{**r, "seq": n} for n, r in enumerate(rest, 1)]


def _swap(records: Records) -> Records:
    other = {"turn-1": "turn-2", "turn-2": "turn-1"}
    return [
        {**r, "entry": {**r["entry"], "agent_id": other[r["entry"]["agent_id"]]}}
        if r["kind"] == "op"
        else r
        for r in records
    ]


@pytest.mark.parametrize(
    ("mutate", "named"),
    [
        (_lose_tail, "turn-2 is missing from the checkpoint"),
        (_lose_head, "turn-1 is missing while later turns are recorded"),
        (_swap, "turn-1's entry records turn 2: its turns were swapped or renumbered"),
    ],
    ids=["lost-tail", "lost-head", "swapped"],
)
def test_a_mutated_agent_journal_is_refused_naming_the_turn(
    tmp_path: Path, mutate: Callable[[Records], Records], named: str
) -> None:
    home, run_dir, msg = _two_turns(tmp_path)
    records = _journal(run_dir)
    # turn 1's outcome, turn 1 again carrying turn 2's prompt (``next``), turn 2's outcome
    assert _labels(records) == ["turn-1", "turn-1", "turn-2"]
    outcomes = [r for r in records if r["kind"] == "op"]
    assert outcomes[1]["entry"]["next"]["controls"] == [msg]
    journal = run_dir / "checkpoint.json.journal"
    journal.write_text(
        "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in mutate(records))
    )
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    invoked = len(read_invocations(home))

    refused = run_cli(home, "resume", run_dir.name, "--json", timeout=WAIT_S)
    assert refused.returncode == 3, refused.explain()
    message = refused.json["error"]["message"]
    assert named in message, message
    if mutate is _lose_tail:
        assert msg in message and "stamped applied" in message
    dry = run_cli(home, "resume", run_dir.name, "--dry-run", "--json", timeout=WAIT_S)
    assert dry.returncode == 3 and named in dry.json["error"]["message"], dry.explain()
    assert len(read_invocations(home)) == invoked
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


def _three_turns(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """(home, run dir, the messages that started turns 2 and 3) of a finished agent."""
    home, gate = tmp_path / "home", Gate(tmp_path / "gate")
    model = "script:" + str(write_yaml(tmp_path / "s.yaml", {"turn-1": {"response": "one"}}))
    proc = start_gated_agent(home, gate, "agent", "t", "--model", model, "--json")
    try:
        sent: list[str] = []
        for turn, text in ((1, "SECOND"), (2, "THIRD")):
            gate.wait_started(f"turn-{turn}", proc)
            sent.append(ctl_ok(home, "msg", session_of(home), text))
            wait_left_pending(home, sent[-1])  # claimed when the next turn starts
            gate.release(f"turn-{turn}")
        gate.release("turn-3")
        done = finish(proc, timeout=WAIT_S)
    finally:
        stop(proc)
    assert done.returncode == 0, done.explain()
    assert [t["id"] for t in done.json["turns"]] == ["turn-1", "turn-2", "turn-3"]
    assert [control(home, m).result for m in sent] == ["applied", "applied"]
    return home, Path(done.json["run_dir"]), sent


def test_a_journal_cut_inside_turn_2_names_turn_2_missing(tmp_path: Path) -> None:
    """Kept: turn 1 and turn 2's prompt (as in flight); lost: turn 2's outcome, turn 3.

    The message that started turn 3 was stamped applied, so turn 2 had finished: turn 2 is
    the first turn the checkpoint lost. Before issue 38 the refusal named turn-3 (the turn
    that message started, as the state DB published it).
    """
    home, run_dir, (second, third) = _three_turns(tmp_path)
    records = _journal(run_dir)
    assert _labels(records) == ["turn-1", "turn-1", "turn-2", "turn-2", "turn-3"]
    ops = [n for n, r in enumerate(records) if r["kind"] == "op"]
    assert records[ops[1]]["entry"]["next"]["controls"] == [second]
    kept = records[: ops[1] + 1]  # turn 1's intent and outcome, then turn 2's prompt
    journal = run_dir / "checkpoint.json.journal"
    journal.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in kept))
    invoked = len(read_invocations(home))

    for extra in ((), ("--dry-run",)):
        refused = run_cli(home, "resume", run_dir.name, *extra, "--json", timeout=WAIT_S)
        assert refused.returncode == 3, refused.explain()
        message = refused.json["error"]["message"]
        assert "turn-2 is missing from the checkpoint" in message, message
        assert "turn-3 is missing" not in message and third in message, message
    assert len(read_invocations(home)) == invoked
