"""Helpers for the resume tests: source-run guards, crafted checkpoints, invocation counts.

No fixtures live here (and there is no ``conftest.py``): the test modules call these
functions with their own ``tmp_path``.  Crafted checkpoints are written as version 2
files (``{"version": 2, ...}``) into a fabricated run directory
``<home>/runs/<valid run id>/`` so the real resolver and loader read them.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flow_support import (
    CliResult,
    read_invocations,
    run_cli,
    wait_for,
    write_yaml,
)

from steerflow.checkpoint import load_checkpoint, result_digest
from steerflow.home import new_run_id

__all__ = [
    "Crafted",
    "SourceGuard",
    "checkpoint_hashes",
    "fabricate_run",
    "invocation_counts",
    "new_runs",
    "ops_of",
    "response_of",
    "resume",
    "run_dirs",
    "run_plan",
    "session_metadata",
    "single_run",
    "spawned_of",
    "wait_checkpoint",
    "wait_for",
    "write_script",
]

CHECKPOINT = "checkpoint.json"
JOURNAL = "checkpoint.json.journal"


# -- hashing the source run ----------------------------------------------------------------


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def checkpoint_hashes(run_dir: Path) -> dict[str, str | None]:
    """SHA-256 of ``checkpoint.json`` and ``checkpoint.json.journal`` (None when absent)."""
    return {name: _sha256(run_dir / name) for name in (CHECKPOINT, JOURNAL)}


def _tree(run_dir: Path) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for root, dirs, files in os.walk(run_dir):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            out[str(path.relative_to(run_dir))] = _sha256(path)
    return out


@dataclass
class SourceGuard:
    """Hashes a source run before a resume and proves afterwards that nothing changed.

    ``checkpoint.json`` and its journal are compared byte for byte (by hash), and so is
    every other file under the run directory (a resume writes only into its own run).
    """

    run_dirs: list[Path]
    before: dict[Path, dict[str, str | None]] = field(default_factory=dict)
    tree_before: dict[Path, dict[str, str | None]] = field(default_factory=dict)

    @classmethod
    def of(cls, *run_dirs: Path) -> SourceGuard:
        guard = cls(list(run_dirs))
        for run_dir in run_dirs:
            guard.before[run_dir] = checkpoint_hashes(run_dir)
            guard.tree_before[run_dir] = _tree(run_dir)
        return guard

    def assert_unchanged(self) -> None:
        for run_dir in self.run_dirs:
            assert checkpoint_hashes(run_dir) == self.before[run_dir], (
                f"the source checkpoint of {run_dir.name} changed"
            )
            assert _tree(run_dir) == self.tree_before[run_dir], (
                f"files of the source run {run_dir.name} changed"
            )


# -- runs, invocations, state DB -----------------------------------------------------------


def run_dirs(home: Path) -> list[Path]:
    """Every run directory of the home, oldest first."""
    runs = home / "runs"
    return sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []


def single_run(home: Path) -> Path:
    """The only run directory of the home."""
    dirs = run_dirs(home)
    assert len(dirs) == 1, [d.name for d in dirs]
    return dirs[0]


def new_runs(home: Path, known: Iterable[Path]) -> list[Path]:
    """Run directories that are not in ``known``."""
    old = {p.name for p in known}
    return [p for p in run_dirs(home) if p.name not in old]


def invocation_counts(home: Path, *, run_id: str | None = None) -> Counter[str]:
    """Invocations per node key from ``<home>/script-invocations.jsonl``."""
    return Counter(
        line["node"]
        for line in read_invocations(home)
        if run_id is None or line["run_id"] == run_id
    )


def ops_of(run_dir: Path) -> dict[str, Any]:
    """``ops`` of a run's checkpoint (any version)."""
    state, _ = load_checkpoint(run_dir / CHECKPOINT)
    return dict(state["ops"])


def session_metadata(home: Path, session_id: str) -> dict[str, Any]:
    """``node_metadata`` of a session, read straight from the state DB."""
    from steerflow.state import StateDB

    with StateDB.open(home, create=False) as db:
        session = db.get_session(session_id)
        assert session is not None, session_id
        return dict(session.node_metadata)


def run_plan(
    home: Path,
    plan: Path,
    script: Path,
    *extra: object,
    timeout: float = 60.0,
) -> CliResult:
    """``steerflow flow --plan PLAN --model script:SCRIPT EXTRA... --json``."""
    return run_cli(
        home,
        "flow",
        "--plan",
        plan,
        "--model",
        f"script:{script}",
        *extra,
        "--json",
        timeout=timeout,
    )


def resume(home: Path, target: object, *flags: object, timeout: float = 60.0) -> CliResult:
    """``steerflow resume TARGET FLAGS...`` (add ``--json`` yourself when wanted)."""
    return run_cli(home, "resume", target, *flags, timeout=timeout)


# -- crafted checkpoints -------------------------------------------------------------------


def fabricate_run(home: Path, state: dict[str, Any], *, run_id: str | None = None) -> Path:
    """Write ``state`` as a version 2 checkpoint into ``<home>/runs/<run_id>/``."""
    home.mkdir(mode=0o700, exist_ok=True)
    runs = home / "runs"
    runs.mkdir(mode=0o700, exist_ok=True)
    run_dir = runs / (run_id or new_run_id(time.time() - 3600))
    run_dir.mkdir(mode=0o700)
    doc = {"version": 2, **{k: v for k, v in state.items() if k != "version"}}
    path = run_dir / CHECKPOINT
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(doc, handle)
    return run_dir


def write_script(path: Path, data: dict[str, Any]) -> Path:
    """A ``script:`` model file."""
    return write_yaml(path, data)


class Crafted:
    """Builds a version 2 checkpoint by hand: plan, ops and spawned entries.

    >>> c = Crafted(script)
    >>> c.node("a"); c.node("b", "a")
    >>> c.done("a", "A")
    >>> run_dir = c.write(home)
    """

    def __init__(
        self,
        script: Path,
        *,
        reactive: str = "off",
        concurrency: int = 4,
        max_ops: int = 0,
        max_spawn: int | None = 20,
    ) -> None:
        self.session_id = uuid.uuid4().hex
        self.plan: list[dict[str, Any]] = []
        self.node_ids: dict[str, str] = {}
        self.ops: dict[str, dict[str, Any]] = {}
        self.spawned: list[dict[str, Any]] = []
        self.config: dict[str, Any] = {
            "model_spec": f"script:{script}",
            "reactive_spec": reactive,
            "max_ops": max_ops,
            "concurrency": concurrency,
            "save_dir": None,
            "playbook": None,
            "roles": {},
            "kind": "flow",
        }
        self.max_spawn = max_spawn

    def node(self, agent_id: str, *deps: str, inherit: bool = False) -> str:
        """Add a planned node; returns its node id."""
        index = {item["agent_id"]: i for i, item in enumerate(self.plan)}
        item: dict[str, Any] = {
            "agent_id": agent_id,
            "dep_indices": [index[d] for d in deps],
            "assignee": None,
            "instruction": f"step {agent_id}",
            "node_id": uuid.uuid4().hex,
        }
        if inherit:
            item["inherit_context"] = True
        self.plan.append(item)
        self.node_ids[agent_id] = item["node_id"]
        return str(item["node_id"])

    def done(self, agent_id: str, response: object, *, digest: bool = True) -> dict[str, Any]:
        """Record a planned node as completed (with a correct result_digest unless told)."""
        entry: dict[str, Any] = {"agent_id": agent_id, "status": "completed", "response": response}
        if digest:
            entry["result_digest"] = result_digest(response)
        self.ops[agent_id] = entry
        return entry

    def failed(self, agent_id: str, error: str = "boom") -> dict[str, Any]:
        """Record a planned node as failed."""
        entry = {"agent_id": agent_id, "status": "failed", "response": {"error": error}}
        self.ops[agent_id] = entry
        return entry

    def spawn(
        self,
        spawn_id: str,
        *,
        parent: str,
        status: str = "completed",
        response: object = None,
        assignee: str | None = "coder",
        depends_on: Sequence[str] | None = None,
        drop: Sequence[str] = (),
        **overrides: Any,
    ) -> dict[str, Any]:
        """Record a spawned entry whose emitter is ``parent`` (an agent id or a spawn id)."""
        parent_id = self.node_ids.get(parent) or next(
            (e["node_id"] for e in self.spawned if e.get("spawn_id") == parent), parent
        )
        if response is None and status == "completed":
            response = f"response of {spawn_id}"
        if status == "failed" and response is None:
            response = {"error": "boom"}
        entry: dict[str, Any] = {
            "node_id": uuid.uuid4().hex,
            "status": status,
            "response": response,
            "operation": f"spawned work {spawn_id}",
            "assignee": assignee,
            "instruction": f"spawned work {spawn_id}",
            "parent_id": parent_id,
            "spawn_id": spawn_id,
            "context": None,
            "depends_on": list(depends_on) if depends_on is not None else [parent],
        }
        if status == "completed":
            entry["result_digest"] = result_digest(response)
        entry.update(overrides)
        for name in drop:
            entry.pop(name, None)
        self.spawned.append(entry)
        return entry

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "version": 2,
            "session_id": self.session_id,
            "prompt": "",
            "plan": self.plan,
            "flow_context": {},
            "ops": self.ops,
            "spawned": self.spawned,
            "config": self.config,
        }
        if self.max_spawn is not None:
            state["max_spawn"] = self.max_spawn
        return state

    def write(self, home: Path, *, run_id: str | None = None, branches: bool = True) -> Path:
        """Write the checkpoint into a fabricated run directory; returns it.

        With ``branches`` every completed node also gets its persisted conversation
        (``branches/<key>.json``), as a real run leaves it.
        """
        run_dir = fabricate_run(home, self.state(), run_id=run_id)
        if branches:
            done = {k: e["response"] for k, e in self.ops.items() if e["status"] == "completed"}
            for entry in self.spawned:
                if entry.get("status") == "completed" and isinstance(entry.get("spawn_id"), str):
                    done[entry["spawn_id"]] = entry["response"]
            folder = run_dir / "branches"
            folder.mkdir(mode=0o700)
            for key, response in done.items():
                conversation = [
                    {"role": "user", "content": f"step {key}"},
                    {"role": "assistant", "content": str(response)},
                ]
                (folder / f"{key}.json").write_text(json.dumps(conversation), encoding="utf-8")
        return run_dir


def response_of(run_dir: Path, key: str) -> object:
    """A planned node's or spawned node's recorded response in a run's checkpoint."""
    state, _ = load_checkpoint(run_dir / CHECKPOINT)
    if key in state["ops"]:
        return state["ops"][key]["response"]
    for entry in state["spawned"]:
        if entry.get("spawn_id") == key:
            return entry["response"]
    raise KeyError(key)


def spawned_of(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Spawned entries of a run's checkpoint by spawn_id."""
    state, _ = load_checkpoint(run_dir / CHECKPOINT)
    return {str(e.get("spawn_id")): e for e in state["spawned"]}


def wait_checkpoint(
    run_parent: Path, predicate: Any, *, timeout: float = 20.0, what: str = "checkpoint"
) -> dict[str, Any]:
    """Poll the home's only run until its checkpoint satisfies ``predicate``."""

    def probe() -> dict[str, Any] | None:
        dirs = run_dirs(run_parent)
        if len(dirs) != 1 or not (dirs[0] / CHECKPOINT).is_file():
            return None
        try:
            state, _ = load_checkpoint(dirs[0] / CHECKPOINT)
        except Exception:  # a torn read while the writer works: try again
            return None
        return state if predicate(state) else None

    return wait_for(probe, timeout=timeout, interval=0.02, what=what)
