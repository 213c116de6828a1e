"""The follower's end rules in one process (decision 235); the real processes are in
``tests/e2e/test_live_follow.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from steerflow.cli import _follow


def _view(status: str, nodes: list[dict[str, Any]], run_dir: Path | None = None) -> dict[str, Any]:
    return {"run_id": "r1", "status": status, "nodes": nodes, "run_dir": run_dir}


def _node(status: str, **detail: object) -> dict[str, Any]:
    return {"id": "n", "status": status, "detail": detail or None}


@pytest.mark.parametrize(
    ("view", "whole", "over"),
    [
        (_view("running", [_node("running")]), True, False),  # the status is not there yet
        (_view("running", [_node("completed", streamed=True)]), False, False),  # the race
        (_view("running", [_node("completed", streamed=True)]), True, True),
        (_view("running", [_node("completed")]), False, True),  # emitted nothing: no mark
        (_view("running", [_node("failed", streamed=True)]), True, True),
        (_view("running", [_node("skipped")]), False, True),
        (_view("interrupted", [_node("running", streamed=True)]), False, True),  # writer gone
        (_view("running", []), False, False),  # not published yet
    ],
)
def test_a_node_follower_ends_on_the_end_mark_not_on_the_status(
    view: dict[str, Any], whole: bool, over: bool
) -> None:
    node = _follow._node(view, "n")
    assert _follow._over(view, node, whole=whole, since=None) is over


def test_a_mark_whose_outcome_never_comes_ends_the_follower_after_the_settle_bound() -> None:
    view = _view("running", [_node("running")])
    node = _follow._node(view, "n")
    assert _follow._over(view, node, whole=True, since=1.0) is False
    assert _follow._over(view, node, whole=True, since=_follow._SETTLE_S + 1) is True


def test_following_a_run_that_has_no_nodes_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run followed while it plans has no nodes: the prefix width kept its default
    (``max(width, *())`` raised TypeError on the second view)."""
    views: Iterator[dict[str, Any]] = iter(
        [
            _view("running", [], tmp_path),
            _view("running", [], tmp_path),
            _view("completed", [{"id": "a-long-id", "status": "completed"}], tmp_path),
        ]
    )
    monkeypatch.setattr(_follow, "_view", lambda home, target: next(views))
    monkeypatch.setattr(_follow, "STATUS_S", 0.0)
    assert _follow.follow_run(tmp_path, "r1") == 0
    assert capsys.readouterr().out == "run r1: completed\n"
