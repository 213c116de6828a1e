"""Property tests for the version 3 writer and loader (hypothesis).

* Random in-place edit sequences on a live nested context (objects, arrays,
  type-distinct scalars 1 / 1.0 / True / "1", -0.0, JSON null values, deletions,
  ``{}`` meaning "remove every key", ``None`` meaning "no update") with random
  compaction limits: after every acknowledgement ``load_checkpoint`` of the files
  equals, type-exactly, the context captured at admission of that prefix.
* A version 2 checkpoint with random planned and spawned entries (every spawned
  reconstruction and extension field: ``emitter_workload``, ``depends_on``, ...) is
  resumed into version 3, and that into a second version 3: every field of every
  entry and the context survive both round trips.
"""

from __future__ import annotations

import asyncio
import copy
import json
import tempfile
from pathlib import Path
from typing import Any

from ckpt_support import PLAN, _disarm_faults, make_writer  # noqa: F401
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steerflow.checkpoint import load_checkpoint

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

keys = st.sampled_from(["a", "b", "", "x/y", "m~n", "~1", "-", "0", "10", "null"])
scalars = st.one_of(
    st.none(),
    st.sampled_from([1, 1.0, True, False, 0, 0.0, -0.0, "1", "", "true"]),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)),
    max_leaves=8,
)
edits = st.lists(
    st.tuples(
        st.sampled_from(["set", "set", "delete", "append", "pop", "clear", "no-update"]),
        st.integers(min_value=0, max_value=10_000),
        keys,
        values,
    ),
    min_size=1,
    max_size=14,
)


def canonical(value: Any) -> str:
    """Type-exact text: 1, 1.0, true and -0.0 all differ; member order is ignored."""
    return json.dumps(value, sort_keys=True, allow_nan=False)


def containers(value: Any) -> list[Any]:
    found = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, (dict, list)):
            found.append(node)
            stack.extend(node.values() if isinstance(node, dict) else node)
    return found


def edit(live: dict[str, Any], op: str, pick: int, key: str, value: Any) -> None:
    """Apply one in-place edit to some container of ``live``."""
    pool = containers(live)
    node = pool[pick % len(pool)]
    if op == "set":
        if isinstance(node, dict):
            node[key] = copy.deepcopy(value)
        elif node:
            node[pick % len(node)] = copy.deepcopy(value)
        else:
            node.append(copy.deepcopy(value))
    elif op == "delete" and isinstance(node, dict) and node:
        del node[sorted(node)[pick % len(node)]]
    elif op == "append":
        if isinstance(node, list):
            node.insert(pick % (len(node) + 1), copy.deepcopy(value))
        else:
            node[key] = [copy.deepcopy(value)]
    elif op == "pop" and isinstance(node, list) and node:
        node.pop(pick % len(node))


async def context_run(run: Path, steps: list[tuple[str, int, str, Any]], limit: int) -> None:
    initial: dict[str, Any] = {"seed": {"list": [1, 1.0, True], "null": None}}
    w = make_writer(run, version=3, flow_context=initial, max_records=limit, max_bytes=2_000)
    live = copy.deepcopy(initial)
    expected = copy.deepcopy(initial)
    for index, (op, pick, key, value) in enumerate(steps):
        passed: dict[str, Any] | None = live
        if op == "clear":
            live.clear()
            passed = {}
        else:
            edit(live, op, pick, key, value)
            if op == "no-update":
                passed = None
        if passed is not None:
            expected = copy.deepcopy(passed)
        if index % 2:
            await w.record(
                f"op{index % 3}", status="completed", response=value, flow_context=passed
            )
        else:
            await w.record_spawned(
                f"n{index % 2}", status="completed", response=value, flow_context=passed
            )
        state, report = load_checkpoint(run)
        assert report["status"] == "clean"
        assert canonical(state["flow_context"]) == canonical(expected), (index, op)
    await w.close()


@SETTINGS
@given(steps=edits, limit=st.integers(min_value=1, max_value=6))
def test_every_acknowledged_prefix_recovers_the_exact_context(
    steps: list[tuple[str, int, str, Any]], limit: int
) -> None:
    with tempfile.TemporaryDirectory() as run:
        asyncio.run(context_run(Path(run), steps, limit))


text_or_none = st.one_of(st.none(), st.text(max_size=8))
planned = st.dictionaries(
    st.text(min_size=1, max_size=6),
    st.tuples(st.sampled_from(["completed", "failed"]), values),
    max_size=4,
)
spawned_entry = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["completed", "failed", "pending"]),
        "response": values,
        "operation": text_or_none,
        "assignee": text_or_none,
        "instruction": text_or_none,
        "parent_id": text_or_none,
        "spawn_id": text_or_none,
        "context": values,
    },
    optional={
        "emitter_workload": st.one_of(st.none(), st.sampled_from(["team", "solo", "scan"])),
        "emitter_contains_user_settings": st.booleans(),
        "depends_on": st.lists(st.text(min_size=1, max_size=4), max_size=3),
        "escalated_from": text_or_none,
        "retry_of": st.dictionaries(keys, scalars, max_size=2),
    },
)
spawned = st.dictionaries(st.text(min_size=1, max_size=6), spawned_entry, max_size=4)
# An entry with ``escalated_from`` (a splice witness) needs the planned node ids beside it
# (Amendment 3 item 5), so these checkpoints carry them.
GUARDED_PLAN = [{**item, "node_id": f"{i:032x}"} for i, item in enumerate(PLAN)]


async def rerecord(run: Path, state: dict[str, Any], version: int) -> dict[str, Any]:
    """What a resume does: a new writer, every entry recorded again in stored order."""
    w = make_writer(run, version=version, flow_context=state["flow_context"], plan=GUARDED_PLAN)
    await w.flush()
    for entry in state["ops"].values():
        await w.record(entry["agent_id"], status=entry["status"], response=entry["response"])
    for entry in state["spawned"]:
        fields = {k: v for k, v in entry.items() if k not in ("node_id", "result_digest")}
        await w.record_spawned(entry["node_id"], **fields)
    await w.close()
    loaded, report = load_checkpoint(run)
    assert report["status"] == "clean"
    return loaded


async def migration(root: Path, ops: dict[str, Any], spawns: dict[str, Any], ctx: Any) -> None:
    (root / "v2").mkdir()
    w = make_writer(root / "v2", version=2, flow_context=ctx, plan=GUARDED_PLAN)
    await w.flush()
    for agent_id, (status, response) in ops.items():
        await w.record(agent_id, status=status, response=response)
    for node_id, fields in spawns.items():
        fields = dict(fields)
        if fields["status"] == "pending":
            fields["response"] = None
        await w.record_spawned(node_id, **fields)
    await w.close()
    v2, _ = load_checkpoint(root / "v2")
    assert v2["version"] == 2
    for name in ("v3", "v3-second"):
        (root / name).mkdir()
    v3 = await rerecord(root / "v3", v2, 3)
    again = await rerecord(root / "v3-second", v3, 3)
    for state in (v3, again):
        assert state["version"] == 3
        for member in ("flow_context", "ops", "spawned", "plan", "config", "max_spawn"):
            assert canonical(state[member]) == canonical(v2[member]), member
        assert [e["node_id"] for e in state["spawned"]] == list(spawns)
        for stored, original in zip(state["spawned"], spawns.values(), strict=True):
            assert set(original) <= set(stored)  # no extension field dropped


@SETTINGS
@given(ops=planned, spawns=spawned, ctx=st.dictionaries(keys, values, max_size=3))
def test_v2_to_v3_round_trip_keeps_every_field(
    ops: dict[str, Any], spawns: dict[str, Any], ctx: dict[str, Any]
) -> None:
    with tempfile.TemporaryDirectory() as root:
        asyncio.run(migration(Path(root), ops, spawns, ctx))
