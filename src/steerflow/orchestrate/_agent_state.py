"""What an ``agent`` run keeps in its checkpoint, and reading it back (issues 19, 26).

An agent's checkpoint has an empty plan; each finished turn is a planned entry
``turn-<n>`` (a ``kind: op`` journal line in version 3) that says what the turn was,
beside its response (decision 112), every member covered by its ``result_digest``:

* ``turn``: ``n`` again, so a renumbered or swapped entry does not match its key;
* ``instruction``: the prompt exactly as the model received it, steer block included;
* ``controls``: the ids of the operator messages the turn consumed;
* ``conversation``: the agent CLI's own session id after the turn (``claude-code``),
  continued with ``--resume`` on later turns and after a resume;
* ``next`` (on the last entry only, when a turn was started after it): the prompt and
  controls of that turn, recorded (by recording the last entry again with it) before
  its messages are stamped ``applied``, so a resume runs it again with the same prompt
  instead of losing them.

No member of the flow context is used, so a journal that lost records at a record
boundary never fails to fold: the missing turn is named as missing. Checkpoints
written before issue 26 kept the same facts in the flow context's ``agent`` member
(``turns``: ``{"turn", "instruction", "controls"}`` per turn, ``next``,
``conversation``); they are read from there (an entry without ``turn``).

The checkpoint ``config`` says ``{"kind": "agent", "model", "max_turns",
"artifact_root", "leg"}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
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
    "turn_members",
]

AGENT_KIND: Final = "agent"
AGENT_CONTEXT_KEY = "agent"
#: The one leg directory every turn runs in (``<artifact_root>/agent``).
LEG_KEY = "agent"
_TURN_KEY = re.compile(r"turn-([1-9][0-9]*)")


def turn_key(number: int) -> str:
    """The checkpoint key of turn ``number`` (1-based)."""
    return f"turn-{number}"


def turn_members(
    number: int,
    instruction: str,
    controls: tuple[str, ...],
    conversation: str | None,
    *,
    in_flight: dict[str, Any] | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The members of turn ``number``'s entry beside its status and response."""
    members: dict[str, Any] = {
        "turn": number,
        "instruction": instruction,
        "controls": list(controls),
    }
    if conversation is not None:
        members["conversation"] = conversation
    if in_flight is not None:
        members["next"] = dict(in_flight)
    if usage is not None:
        members["usage"] = dict(usage)  # covered by the digest (decision 183)
    return members


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
    #: The worker's own session id after this turn, when the entry records one.
    conversation: str | None = None

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
        return (
            f"{key}'s entry does not match its result_digest (its response, prompt, controls "
            "or number was changed after it was recorded)"
        )
    return None


def _ids(value: object) -> tuple[str, ...] | None:
    """A list of control ids, or None when ``value`` is not one."""
    if isinstance(value, list) and all(isinstance(c, str) and c for c in value):
        return tuple(value)
    return None


def _turn(number: int, entry: PlannedEntry, record: dict[str, Any]) -> tuple[RecordedTurn, str]:
    """One recorded turn, and the first thing wrong with it (``""``: nothing).

    ``record`` is the flow-context record of an entry from before issue 26 (no ``turn``).
    """
    key = turn_key(number)
    raw = entry.raw
    own = "turn" in raw
    fields: Mapping[str, Any] = raw if own else record
    problem = ""
    if own and (type(raw["turn"]) is not int or raw["turn"] != number):
        shown = str(raw["turn"])[:20]
        problem = f"{key}'s entry records turn {shown}: its turns were swapped or renumbered"
    instruction = fields.get("instruction") if own or record.get("turn") == number else None
    if not isinstance(instruction, str):
        problem = problem or f"the prompt of {key} is not recorded"
        instruction = None
    controls = _ids(fields.get("controls", []))
    if controls is None:
        problem = problem or f"the controls {key} consumed are not a list of control ids"
    conversation = raw.get("conversation") if own else None
    turn = RecordedTurn(
        number=number,
        entry=entry,
        instruction=instruction,
        controls=controls or (),
        conversation=conversation if isinstance(conversation, str) and conversation else None,
    )
    return turn, problem


def _in_flight(
    state: CheckpointState, turns: list[RecordedTurn], problems: list[str]
) -> tuple[str | None, tuple[str, ...]]:
    """The prompt and controls of the turn started after the recorded ones, if any."""
    last = turns[-1].entry.raw if turns else {}
    nxt = last.get("next") if "turn" in last else _context(state).get("next")
    number = len(turns) + 1
    if nxt is None:
        return None, ()
    if not isinstance(nxt, dict) or nxt.get("turn") != number:
        problems.append("the turn in flight does not follow the recorded ones")
        return None, ()
    instruction, controls = nxt.get("instruction"), _ids(nxt.get("controls", []))
    if not isinstance(instruction, str) or controls is None:
        problems.append(f"the prompt of turn-{number} (in flight) is not recorded")
        return None, ()
    return instruction, controls


def read_turns(state: CheckpointState) -> AgentTurns:
    """The recorded turns (numbered 1..n) and what a resume must know; never raises.

    Whatever would make a resume unfaithful is listed in ``problems`` (in order):
    entries that are not ``turn-<n>``, a missing turn (named), an entry whose number
    is not its key's, a turn whose prompt or controls are not recorded, a digest
    mismatch.
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
    for number in range(1, max(numbered, default=0) + 1):
        found = numbered.get(number)
        if found is None:
            problems.append(
                f"turn-{number} is missing while later turns are recorded "
                f"(up to turn-{max(numbered)}): the checkpoint lost it"
            )
            break
        record = records[number - 1] if number <= len(records) else {}
        turn, problem = _turn(number, found, record)
        if problem:
            problems.append(problem)
        if (digest := _digest_problem(turn_key(number), found)) is not None:
            problems.append(digest)
        turns.append(turn)
    next_instruction, next_controls = _in_flight(state, turns, problems)
    if not turns and next_instruction is None:
        next_instruction = state.prompt  # turn 1 runs the task itself
    model = state.config.get("model")
    if not isinstance(model, str) or not model:
        problems.append("the checkpoint records no model")
        model = None
    max_turns = state.config.get("max_turns")
    return AgentTurns(
        turns=tuple(turns),
        next_instruction=next_instruction,
        next_controls=next_controls,
        conversation=_conversation(turns, agent),
        model=model,
        max_turns=max_turns if isinstance(max_turns, int) and max_turns > 0 else None,
        problems=problems,
    )


def _conversation(turns: list[RecordedTurn], agent: dict[str, Any]) -> str | None:
    """The worker's session after the last turn that reported one (older form: the context)."""
    for turn in reversed(turns):
        if turn.conversation is not None:
            return turn.conversation
    if turns and "turn" in turns[-1].entry.raw:
        return None
    conversation = agent.get("conversation")
    return conversation if isinstance(conversation, str) and conversation else None
