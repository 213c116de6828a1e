"""What an ``agent`` run keeps in its checkpoint, and reading it back (issue 19).

An agent's checkpoint has an empty plan; each finished turn is a planned entry
``turn-<n>`` (a ``kind: op`` journal line in version 3). The flow context holds
what a resume needs beside the responses, under ``"agent"``:

* ``turns``: one ``{"turn", "instruction", "controls"}`` per recorded turn, in order
  (``instruction`` exactly as the model received it, steer block included);
* ``next``: the turn that was started after the last recorded one, if any (its
  prompt, and the controls it delivered), so a resume runs it again with the same
  prompt instead of losing the messages already stamped ``applied``;
* ``conversation``: the agent CLI's own session id (``claude-code``), continued
  with ``--resume`` on later turns and after a resume.

The checkpoint ``config`` says ``{"kind": "agent", "model", "max_turns",
"artifact_root", "leg"}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final

from steerflow.checkpoint import CheckpointState, PlannedEntry, entry_digest
from steerflow.errors import FlowResumeError

__all__ = [
    "AGENT_CONTEXT_KEY",
    "AGENT_KIND",
    "LEG_KEY",
    "AgentTurns",
    "RecordedTurn",
    "is_agent_state",
    "ordered_keys",
    "read_turns",
    "turn_key",
]

AGENT_KIND: Final = "agent"
AGENT_CONTEXT_KEY = "agent"
#: The one leg directory every turn runs in (``<artifact_root>/agent``).
LEG_KEY = "agent"
_TURN_KEY = re.compile(r"turn-([1-9][0-9]*)")


def turn_key(number: int) -> str:
    """The checkpoint key of turn ``number`` (1-based)."""
    return f"turn-{number}"


def ordered_keys(keys: list[str]) -> list[str]:
    """``turn-<n>`` keys by ``n`` (``turn-10`` after ``turn-9``), any other key after them."""

    def order(key: str) -> tuple[int, int, str]:
        match = _TURN_KEY.fullmatch(key)
        return (0, int(match.group(1)), "") if match else (1, 0, key)

    return sorted(keys, key=order)


def is_agent_state(state: CheckpointState) -> bool:
    """True if the checkpoint was written by an ``agent`` run."""
    return state.config.get("kind") == AGENT_KIND


@dataclass(frozen=True)
class RecordedTurn:
    """One turn as its checkpoint entry and the context record it."""

    number: int
    entry: PlannedEntry
    instruction: str | None
    controls: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return turn_key(self.number)


@dataclass(frozen=True)
class AgentTurns:
    """The turns of an agent checkpoint, in order, and the turn started after them."""

    turns: tuple[RecordedTurn, ...]
    next_instruction: str | None
    next_controls: tuple[str, ...]
    conversation: str | None
    model: str | None
    max_turns: int | None
    problems: list[str] = field(default_factory=list)

    def refuse_if_unfaithful(self, run_id: str, *, retry_failed: bool) -> None:
        """Refuse a resume that could not continue the agent as it ran.

        Raises:
            FlowResumeError: a turn is missing, unreadable or altered, the model is not
                recorded, or the last turn failed without ``retry_failed``.
        """
        if self.problems:
            raise FlowResumeError(f"agent run {run_id} cannot be resumed: {self.problems[0]}")
        for turn in self.turns[:-1]:
            if turn.entry.status != "completed":
                raise FlowResumeError(
                    f"agent run {run_id}: {turn.key} is {turn.entry.status} but later turns "
                    "ran after it"
                )
        last = self.turns[-1] if self.turns else None
        if last is not None and last.entry.status == "failed" and not retry_failed:
            raise FlowResumeError(
                f"agent run {run_id}: {last.key} failed; --retry-failed runs it again "
                "(this repeats its side effects)"
            )


def _context(state: CheckpointState) -> dict[str, Any]:
    agent = state.flow_context.get(AGENT_CONTEXT_KEY)
    return agent if isinstance(agent, dict) else {}


def _digest_problem(key: str, entry: PlannedEntry) -> str | None:
    if entry.result_digest is None:
        return None
    try:
        actual = entry_digest(dict(entry.raw))
    except (TypeError, ValueError):
        return f"{key}'s response cannot be checked against its result_digest"
    if actual != entry.result_digest:
        return f"{key}'s response does not match its result_digest (the checkpoint was altered)"
    return None


def read_turns(state: CheckpointState) -> AgentTurns:
    """The recorded turns (numbered 1..n) and what a resume must know; never raises.

    Whatever would make a resume unfaithful is listed in ``problems`` (in order):
    entries that are not ``turn-<n>``, a gap in the numbering, a turn whose
    instruction the context lacks, a digest mismatch.
    """
    agent = _context(state)
    problems: list[str] = []
    numbered: dict[int, PlannedEntry] = {}
    for key, entry in state.ops.items():
        match = _TURN_KEY.fullmatch(key)
        if match is None:
            problems.append(f"entry {key!r} is not a turn")
            continue
        numbered[int(match.group(1))] = entry
    recorded = agent.get("turns")
    records = [r for r in recorded if isinstance(r, dict)] if isinstance(recorded, list) else []
    turns: list[RecordedTurn] = []
    for number in range(1, len(numbered) + 1):
        found = numbered.get(number)
        if found is None:
            problems.append(f"turn-{number} is missing while later turns are recorded")
            break
        entry = found
        record = records[number - 1] if number <= len(records) else {}
        instruction = record.get("instruction") if record.get("turn") == number else None
        if not isinstance(instruction, str):
            problems.append(f"the prompt of turn-{number} is not recorded")
            instruction = None
        if (problem := _digest_problem(turn_key(number), entry)) is not None:
            problems.append(problem)
        controls = record.get("controls")
        turns.append(
            RecordedTurn(
                number=number,
                entry=entry,
                instruction=instruction,
                controls=tuple(c for c in controls if isinstance(c, str))
                if isinstance(controls, list)
                else (),
            )
        )
    nxt = agent.get("next")
    next_instruction: str | None = None
    next_controls: tuple[str, ...] = ()
    if isinstance(nxt, dict) and nxt.get("turn") == len(turns) + 1:
        if isinstance(nxt.get("instruction"), str):
            next_instruction = nxt["instruction"]
            controls = nxt.get("controls")
            if isinstance(controls, list):
                next_controls = tuple(c for c in controls if isinstance(c, str))
        else:
            problems.append(f"the prompt of turn-{len(turns) + 1} (in flight) is not recorded")
    elif nxt is not None:
        problems.append("the turn in flight does not follow the recorded ones")
    if not turns and next_instruction is None:
        next_instruction = state.prompt  # turn 1 runs the task itself
    model = state.config.get("model")
    if not isinstance(model, str) or not model:
        problems.append("the checkpoint records no model")
        model = None
    max_turns = state.config.get("max_turns")
    conversation = agent.get("conversation")
    return AgentTurns(
        turns=tuple(turns),
        next_instruction=next_instruction,
        next_controls=next_controls,
        conversation=conversation if isinstance(conversation, str) and conversation else None,
        model=model,
        max_turns=max_turns if isinstance(max_turns, int) and max_turns > 0 else None,
        problems=problems,
    )
