"""Shared helpers for the checkpoint writer/loader tests (not a test module)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from steerflow import _faults
from steerflow.checkpoint import CheckpointWriter

PLAN = [
    {"agent_id": "research", "dep_indices": [], "assignee": "researcher"},
    {"agent_id": "draft", "dep_indices": [0], "assignee": "coder"},
]
CONFIG = {"model_spec": "echo", "reactive_spec": "off", "max_ops": 0}


@pytest.fixture(autouse=True)
def _disarm_faults() -> Iterator[None]:
    _faults.disarm()
    yield
    _faults.disarm()


def make_writer(run_dir: Path, version: int = 2, **kwargs: Any) -> CheckpointWriter:
    """A writer for ``run_dir/checkpoint.json`` with a small fixed plan."""
    params: dict[str, Any] = {
        "session_id": "0" * 32,
        "prompt": "do the thing",
        "plan": PLAN,
        "config": CONFIG,
        "max_spawn": 20,
        "flow_context": {},
        "version": version,
    }
    params.update(kwargs)
    return CheckpointWriter(run_dir / "checkpoint.json", **params)
