"""How a tool node's steps read back: one row per step (``show``'s ``steps``), a line of
live output per record, the Studio's timeline rows."""

from __future__ import annotations

from typing import Any

from steerflow.studio._steps import steps_section
from steerflow.tools._loop import live_line
from steerflow.tools._view import node_steps


def _entry(index: int, type_: str, status: str, **data: Any) -> dict[str, Any]:
    return {"node": "a", "record": "op", "key": "a", "index": index, "type": type_,
            "call_id": f"c{index}", "status": status, "data": data}  # fmt: skip


JOURNAL = [
    _entry(1, "model", "completed", text="", started_at=10.0, ended_at=11.0,
           tool_calls=[{"call_id": "c2", "name": "post", "args": {"m": "<b>"}}],
           steered=[{"control_id": "x1,x2", "text": "..."}], usage={"input_tokens": 3}),
    _entry(2, "tool", "in_flight", tool="post", args={"m": "<b>"}, started_at=11.0),
    _entry(2, "tool", "completed", tool="post", args={"m": "<b>"}, result="ok",
           started_at=11.5, ended_at=12.0),
    {**_entry(1, "model", "completed", text="other node"), "key": "b"},
]  # fmt: skip


def test_a_call_is_one_step_with_its_intents_start_and_its_end() -> None:
    steps = node_steps(JOURNAL, "op", "a")
    assert [(s["index"], s["kind"], s["status"]) for s in steps] == [
        (1, "model", "completed"), (2, "tool", "completed"),
    ]  # fmt: skip
    assert steps[0]["steered"] == ["x1", "x2"] and steps[0]["usage"] == {"input_tokens": 3}
    tool = steps[1]
    assert (tool["call_id"], tool["result"], tool["started_at"]) == ("c2", "ok", 11.0)
    assert tool["duration_s"] == 1.0
    assert node_steps(JOURNAL, "spawn", "a") == []


def test_each_record_is_a_line_of_live_output() -> None:
    lines = [live_line(e["index"], e["type"], e["status"], e["data"]) for e in JOURNAL[:3]]
    assert lines == [
        "[step 1] model calls post\n",
        '[step 2] tool post {"m": "<b>"}\n',
        "[step 2] tool post -> completed: ok\n",
    ]


def test_the_studio_timeline_has_a_row_per_step_with_markup_escaped() -> None:
    html = steps_section(node_steps(JOURNAL, "op", "a"))
    assert html.startswith("<h3>steps (2)</h3>")
    assert html.count('<li class="step') == 2
    assert "&lt;b&gt;" in html and "<b>" not in html
    assert 'class="bar-completed"' in html and "operator message x1, x2" in html
    assert steps_section([]) == ""
