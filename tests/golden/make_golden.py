"""Write the golden checkpoint units under ``tests/golden/`` with today's writer.

Run from the repository root: ``.venv/bin/python tests/golden/make_golden.py``.
Rewriting the committed files is a format change: review the diff as one.

Every unit records the same run, step by step, through :class:`CheckpointWriter`:
an operator message rendered into ``research``; spawn intent for ``fix-1`` and
``fix-2`` before their emitter ``draft`` completes (witnessing both); ``fix-1``
completing; ``fix-2`` left ``pending``; ``review`` never reached.  The branches of
the completed nodes are written by the code a run uses.  Ids, timestamps and v3
generations are fixed (generations through a counter in place of ``uuid4``), so a
rerun reproduces the files byte for byte.

Beside each unit, ``expected.json`` holds what :func:`load_checkpoint` returned
when the unit was written: the logical state and the ``checkpoint_recovery`` report.

The newer entry kinds (issue 26) have units of their own, each in today's form and
in the form written before their identity was covered by ``result_digest``:

* ``agent-v3`` / ``agent-v3-legacy``: an ``agent`` run whose turn 1 ran the task, an
  operator message started turn 2, and another one started turn 3, which was in
  flight (its prompt recorded as ``next``) when the run ended. Today's form keeps each
  turn's number, prompt, controls and the worker's session in its entry
  (:func:`steerflow.orchestrate._agent_state.turn_members`, as the run writes them);
  the legacy form kept them in the flow context's ``agent`` member.
* ``escalation-v3`` / ``escalation-v3-legacy``: ``a`` failed, its escalation retry
  ``a.esc1`` (intent first, as a run records it) completed, ``b`` never reached; the
  legacy retry entry lacks the ``escalation`` attempt number.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from steerflow.checkpoint import CheckpointWriter, load_checkpoint
from steerflow.checkpoint import _v3 as v3_backend
from steerflow.providers import Message

HERE = Path(__file__).resolve().parent
SCRIPT = "golden-script.yaml"

#: unit directory -> (run id, version, max_records)
UNITS: dict[str, tuple[str, int, int]] = {
    "v2": ("20260101T000000-00aa02", 2, 128),
    "v3": ("20260101T000000-00aa03", 3, 128),
    # Three records per generation: the base holds the first outcomes folded in, the
    # journal the rest, and the generation differs from a fresh unit's first one.
    "v3-compacted": ("20260101T000000-00aa04", 3, 3),
    # Version 4 (decision 340): a manifest, the meta segment and the journal; compacted
    # once, an entry segment holding the first three outcomes too.
    "v4": ("20260101T000000-00aa09", 4, 128),
    "v4-compacted": ("20260101T000000-00aa10", 4, 3),
}

#: Units an earlier writer wrote, kept as they were so the reader keeps reading them; the
#: generator no longer writes them (unit directory -> the run id, version, max_records
#: it was written with).  ``v4-compacted-r1``: ``v4-compacted`` before decision 395, its
#: first three outcomes in an entry segment where the writer now publishes the journal.
FROZEN: dict[str, tuple[str, int, int]] = {
    "v4-compacted-r1": ("20260101T000000-00aa10", 4, 3),
}

#: unit directory -> run id of the agent and escalation units (all version 3)
KIND_UNITS: dict[str, str] = {
    "agent-v3": "20260101T000000-00aa05",
    "agent-v3-legacy": "20260101T000000-00aa06",
    "escalation-v3": "20260101T000000-00aa07",
    "escalation-v3-legacy": "20260101T000000-00aa08",
}

SESSION_ID = "5e55" * 8
NODE = {
    "research": "11" * 16,
    "draft": "22" * 16,
    "review": "33" * 16,
    "fix-1": "a1" * 16,
    "fix-2": "a2" * 16,
}
PLAN = [
    {
        "agent_id": "research",
        "dep_indices": [],
        "assignee": "researcher",
        "instruction": "Collect the sources",
        "node_id": NODE["research"],
    },
    {
        "agent_id": "draft",
        "dep_indices": [0],
        "assignee": "coder",
        "instruction": "Draft the change",
        "inherit_context": True,
        "node_id": NODE["draft"],
    },
    {
        "agent_id": "review",
        "dep_indices": [1],
        "assignee": "reviewer",
        "instruction": "Review the draft",
        "node_id": NODE["review"],
    },
]
CONFIG = {
    "model_spec": f"script:{SCRIPT}",
    "reactive_spec": "off",
    "max_ops": 0,
    "concurrency": 4,
    "save_dir": None,
    "playbook": None,
    "roles": {},
    "kind": "flow",
}
RENDERED = {
    "ts": 1767225600.5,
    "text": "prefer primary sources",
    "control_id": "c0" * 16,
    "rendered_into_op": "research",
}
UNRENDERED = {
    "ts": 1767225601.25,
    "text": "keep it short",
    "control_id": "c1" * 16,
    "rendered_into_op": None,
}
RESPONSES = {
    "research": "recorded: three primary sources",
    "draft": {"summary": "recorded: draft", "files": ["a.py", "b.py"]},
    "fix-1": "recorded: fix-1 applied",
}


def _spawn_fields(spawn_id: str) -> dict[str, Any]:
    return {
        "operation": f"Fix {spawn_id}",
        "assignee": "coder",
        "instruction": f"Fix {spawn_id}",
        "parent_id": NODE["draft"],
        "spawn_id": spawn_id,
        "context": None,
        "depends_on": ["draft"],
    }


@contextmanager
def _fixed_generations() -> Iterator[None]:
    counter = itertools.count(1)
    with mock.patch.object(
        v3_backend.uuid, "uuid4", side_effect=lambda: uuid.UUID(int=0x6E000000 + next(counter))
    ):
        yield


async def _record(run_dir: Path, version: int, max_records: int) -> None:
    writer = CheckpointWriter(
        run_dir / "checkpoint.json",
        session_id=SESSION_ID,
        prompt="Fix the parser and review it",
        plan=PLAN,
        config=CONFIG,
        max_spawn=20,
        flow_context={},
        version=version,
        max_records=max_records,
    )
    await writer.flush()
    await writer.record(
        "research",
        status="completed",
        response=RESPONSES["research"],
        flow_context={"operator_messages": [RENDERED]},
    )
    for spawn_id in ("fix-1", "fix-2"):  # intent precedes the emitter's outcome
        await writer.record_spawned(
            NODE[spawn_id], status="pending", response=None, **_spawn_fields(spawn_id)
        )
    await writer.record(
        "draft",
        status="completed",
        response=RESPONSES["draft"],
        flow_context={"operator_messages": [RENDERED, UNRENDERED]},
        spawned_ids=[NODE["fix-1"], NODE["fix-2"]],
    )
    await writer.record_spawned(
        NODE["fix-1"],
        status="completed",
        response=RESPONSES["fix-1"],
        spawned_ids=None,
        **_spawn_fields("fix-1"),
    )
    await writer.close()


AGENT_TASK = "Port the parser"
AGENT_CONFIG = {
    "kind": "agent",
    "model": f"script:{SCRIPT}",
    "max_turns": 20,
    # Relative, like the script path: a resume runs in a directory of its own.
    "artifact_root": "golden-agent-artifacts",
    "leg": "agent",
}
STEER = "[OPERATOR STEER]\n- 2026-01-01T00:00:0{n}.000Z: {text}\n[/OPERATOR STEER]\n\nContinue."
#: Each turn: (number, prompt, controls, response); turn 3 never finished.
TURNS = [
    (1, AGENT_TASK, [], "recorded: turn 1"),
    (2, STEER.format(n=1, text="keep the API"), ["c2" * 16], "recorded: turn 2"),
]
IN_FLIGHT = {"turn": 3, "instruction": STEER.format(n=2, text="add tests"), "controls": ["c3" * 16]}
CONVERSATION = "sess-golden"


async def _record_agent(run_dir: Path, *, legacy: bool) -> None:
    from steerflow.orchestrate._agent_state import turn_members

    writer = CheckpointWriter(
        run_dir / "checkpoint.json",
        session_id=SESSION_ID,
        prompt=AGENT_TASK,
        plan=[],
        config=AGENT_CONFIG,
        flow_context={},
        version=3,
    )
    await writer.flush()
    context: dict[str, Any] = {"turns": []}
    for number, prompt, controls, response in TURNS:
        nxt = (
            IN_FLIGHT
            if number == len(TURNS)
            else {"turn": number + 1, "instruction": TURNS[number][1], "controls": TURNS[number][2]}
        )
        key = f"turn-{number}"
        if legacy:  # the flow context carried the turns (issue 19)
            record = {"turn": number, "instruction": prompt, "controls": controls}
            context = {**context, "turns": [*context["turns"], record]}
            context["conversation"] = CONVERSATION
            context.pop("next", None)
            await writer.record(key, status="completed", response=response,
                                flow_context={"agent": context})  # fmt: skip
            context = {**context, "next": nxt}
            await writer.record(key, status="completed", response=response,
                                flow_context={"agent": context})  # fmt: skip
            continue
        members = turn_members(number, prompt, tuple(controls), CONVERSATION)
        await writer.record(key, status="completed", response=response, **members)
        await writer.record(
            key, status="completed", response=response,
            **turn_members(number, prompt, tuple(controls), CONVERSATION, in_flight=nxt),
        )  # fmt: skip
    await writer.close()


ESC_NODE = {"a": "e1" * 16, "b": "e2" * 16, "a.esc1": "e3" * 16}
ESC_PLAN = [
    {"agent_id": "a", "dep_indices": [], "assignee": "worker", "instruction": "do a",
     "node_id": ESC_NODE["a"]},
    {"agent_id": "b", "dep_indices": [0], "instruction": "use a", "node_id": ESC_NODE["b"]},
]  # fmt: skip
ESC_CONFIG = {
    **CONFIG,
    "roles": {"worker": {"model": f"script:{SCRIPT}", "escalation": [f"script:{SCRIPT}"]}},
}
ESC_RESPONSES = {"a": {"error": "recorded: base model failed"}, "a.esc1": "recorded: rescued"}


def _retry_fields(*, legacy: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "operation": "do a",
        "assignee": "worker",
        "instruction": "do a",
        "parent_id": ESC_NODE["a"],
        "spawn_id": "a.esc1",
        "context": None,
        "depends_on": ["a"],
        "escalated_from": ESC_NODE["a"],
        "model": f"script:{SCRIPT}",
    }
    if not legacy:
        fields["escalation"] = 1
    return fields


async def _record_escalation(run_dir: Path, *, legacy: bool) -> None:
    writer = CheckpointWriter(
        run_dir / "checkpoint.json",
        session_id=SESSION_ID,
        prompt="Do a, then b",
        plan=ESC_PLAN,
        config=ESC_CONFIG,
        max_spawn=20,
        flow_context={},
        version=3,
    )
    await writer.flush()
    fields = _retry_fields(legacy=legacy)
    # The retry is recorded (intent) before the failed attempt's outcome, as a run does.
    await writer.record_spawned(ESC_NODE["a.esc1"], status="pending", response=None, **fields)
    await writer.record("a", status="failed", response=ESC_RESPONSES["a"])
    await writer.record_spawned(
        ESC_NODE["a.esc1"], status="completed", response=ESC_RESPONSES["a.esc1"], **fields
    )
    await writer.close()


def write_kind_unit(name: str, root: Path = HERE) -> Path:
    """(Re)write one agent or escalation unit and its ``expected.json``; returns the run dir."""
    unit = root / name
    shutil.rmtree(unit, ignore_errors=True)
    run_dir = unit / "runs" / KIND_UNITS[name]
    run_dir.mkdir(parents=True)
    legacy = name.endswith("-legacy")
    record = _record_agent if name.startswith("agent") else _record_escalation
    with _fixed_generations():
        asyncio.run(record(run_dir, legacy=legacy))
    return _finish_unit(unit, run_dir)


def _finish_unit(unit: Path, run_dir: Path) -> Path:
    staging = run_dir / ".checkpoint.json.staging"
    if staging.is_dir():  # the writer's empty staging directory: git would drop it anyway
        staging.rmdir()
    state, report = load_checkpoint(run_dir)
    expected = {"state": state, "report": report}
    (unit / "expected.json").write_text(
        json.dumps(expected, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return run_dir


def _write_branches(run_dir: Path) -> None:
    from steerflow.checkpoint import save_branch

    for key in ("research", "draft", "fix-1"):
        reply = RESPONSES[key]
        save_branch(
            run_dir,
            key,
            [
                Message("user", f"step {key}"),
                Message("assistant", reply if isinstance(reply, str) else json.dumps(reply)),
            ],
        )


def write_unit(name: str, root: Path = HERE) -> Path:
    """(Re)write one golden unit and its ``expected.json`` under ``root``; returns the run dir."""
    run_id, version, max_records = UNITS[name]
    unit = root / name
    shutil.rmtree(unit, ignore_errors=True)
    run_dir = unit / "runs" / run_id
    run_dir.mkdir(parents=True)
    with _fixed_generations():
        asyncio.run(_record(run_dir, version, max_records))
    _write_branches(run_dir)
    return _finish_unit(unit, run_dir)


def write_all(root: Path = HERE) -> list[Path]:
    """Every unit, plus the script file a resume of them runs with."""
    (root / SCRIPT).write_text("# every node answers as echo; see README.md\n{}\n")
    return [write_unit(name, root) for name in UNITS] + [
        write_kind_unit(name, root) for name in KIND_UNITS
    ]


def main() -> int:
    for run_dir in write_all():
        print(run_dir.relative_to(HERE))
    return 0


if __name__ == "__main__":
    sys.exit(main())
