"""Chains of crash -> resume -> crash: no node acknowledged anywhere in the chain runs again.

A resumed run replays what its source recorded.  Its first checkpoint publication must
already hold every replayed entry; otherwise a kill right after it leaves the newest
run of the chain with a checkpoint that lacks acknowledged work, and resuming *that*
run pays for the work again (issue 10, item 1).

Each test drives one real ``steerflow`` chain with the ``script:`` model, whose
invocation log (``<home>/script-invocations.jsonl``) counts every provider call:

1. ``flow`` over a 6-node chain, where ``b`` spawns ``s1`` (``--reactive all``), with
   the source checkpoint version under test, killed (``STEERFLOW_FAULT``) after a few
   acknowledgements;
2. a resume of the newest run that records every durability seam it hits (a fault hook,
   so seams added later are covered without editing this file) and dies at its first
   acknowledgement: the end of its initialization;
3. one resume of the newest run per seam hit of that initialization, killed exactly
   there (``exit:<when>:<step>:<nth>``), then resumes killed after each of their first
   records, and a last resume that completes.

"Newest run" is the latest run of the chain that has a ``checkpoint.json``: the run an
operator resumes.  Before every step the test loads every run's checkpoint; a node
recorded completed in any of them must not be invoked by that step or any later one.
After every step the newest run's checkpoint must record every such node completed,
which names the kill point that lost one even before a later step pays for it again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from flow_support import PYTHON, child_env, cli_args, read_invocations, write_yaml

from steerflow.checkpoint import CheckpointRecoveryError, load_checkpoint

NODES = ["a", "b", "c", "d", "e", "f"]
SCRIPT = {"b": {"spawn": [{"agent_id": "s1", "assignee": "helper", "instruction": "side"}]}}
FIRST_KILL = "exit:after:ack:4"  # the initial flush, then a, s1's intent and b
# A resumed run's first acknowledgement is its initial publication; these kill it after
# its first, first, then second record (the chain advances by one, one, two nodes).
RECORD_KILLS = ["exit:after:ack:2", "exit:after:ack:2", "exit:after:ack:3"]
KILLED = 137  # os._exit(137) at an armed seam

# Runs ``steerflow`` in this interpreter with a hook on every durability seam; writes the
# hits (``[when, step]``) to argv[1] and dies at the first acknowledgement.
_RECORDING_DRIVER = """
import json, os, sys
from steerflow import _faults
from steerflow.cli import main
hits = []
def hook(step, when):
    hits.append([when, step])
    if (when, step) == ("after", "ack"):
        with open(sys.argv[1], "w") as out:
            json.dump(hits, out)
        os._exit(137)
_faults.set_fault_hook(hook)
sys.exit(main(sys.argv[2:]))
"""


@dataclass
class Chain:
    """One home's chain of runs, in creation order, and what the test learned so far."""

    home: Path
    runs: list[Path] = field(default_factory=list)
    acked: dict[str, str] = field(default_factory=dict)  # node -> run that recorded it
    problems: list[str] = field(default_factory=list)

    def newest(self) -> Path:
        """The latest run with a checkpoint (the one an operator resumes)."""
        with_checkpoint = [r for r in self.runs if (r / "checkpoint.json").exists()]
        assert with_checkpoint, "no run of the chain has a checkpoint"
        return with_checkpoint[-1]

    def adopt_new_run(self) -> Path | None:
        """Append the run directory the last step created (None if it created none)."""
        root = self.home / "runs"
        known = {r.name for r in self.runs}
        new = [p for p in root.iterdir() if p.is_dir() and p.name not in known]
        assert len(new) <= 1, new
        if new:
            self.runs.append(new[0])
        return new[0] if new else None

    def learn_acknowledged(self) -> None:
        """Add every node recorded completed in any run's checkpoint to ``acked``."""
        for run in self.runs:
            for node in _completed(run):
                self.acked.setdefault(node, run.name)

    def step(
        self, what: str, argv: list[str], env: dict[str, str]
    ) -> subprocess.CompletedProcess[str]:
        """Run one CLI process; note every acknowledged node it invoked again."""
        self.learn_acknowledged()
        before = len(read_invocations(self.home))
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        run = self.adopt_new_run()
        again = [
            call["node"]
            for call in read_invocations(self.home)[before:]
            if call["node"] in self.acked
        ]
        for node in again:
            self.problems.append(
                f"{what}: {node} was recorded completed by run {self.acked[node]} and was "
                f"invoked again by run {run.name if run else '?'}"
            )
        if proc.returncode not in (0, KILLED):
            self.problems.append(f"{what}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
        # What the next step resumes must already hold all of it (the chain is linear).
        self.learn_acknowledged()
        lacking = sorted(set(self.acked) - _completed(self.newest()))
        if lacking:
            self.problems.append(
                f"{what}: the newest run {self.newest().name} lacks acknowledged {lacking}"
            )
        return proc


def _completed(run: Path) -> set[str]:
    """Nodes a run's checkpoint records completed (empty if it has none)."""
    if not (run / "checkpoint.json").exists():
        return set()
    try:
        state, _ = load_checkpoint(run / "checkpoint.json")
    except CheckpointRecoveryError as exc:
        raise AssertionError(f"the checkpoint of {run.name} was refused: {exc}") from exc
    done = {k for k, e in state["ops"].items() if e["status"] == "completed"}
    return done | {str(e.get("spawn_id")) for e in state["spawned"] if e["status"] == "completed"}


def _resume_args(chain: Chain) -> list[str]:
    """``--home HOME resume NEWEST``: what follows ``python -m steerflow``."""
    return ["--home", str(chain.home), "resume", chain.newest().name]


def _resume_argv(chain: Chain) -> list[str]:
    return [PYTHON, "-m", "steerflow", *_resume_args(chain)]


def _fault_env(fault: str) -> dict[str, str]:
    return child_env(STEERFLOW_FAULT=fault)


def _initialization_kills(hits: list[list[str]]) -> list[str]:
    """``exit:<when>:<step>:<nth>`` for every seam hit up to the first acknowledgement."""
    counts: dict[str, int] = {}
    kills = []
    for when, step in hits:
        point = f"{when}:{step}"
        counts[point] = counts.get(point, 0) + 1
        kills.append(f"exit:{point}:{counts[point]}")
        if point == "after:ack":
            break
    return kills


def _start_chain(tmp_path: Path, version: str) -> Chain:
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "name": "chain",
            "plan": [
                {"agent_id": n, "instruction": f"step {n}", **({"depends_on": [p]} if p else {})}
                for p, n in zip([None, *NODES], NODES, strict=False)
            ],
        },
    )
    script = write_yaml(tmp_path / "script.yaml", SCRIPT)
    chain = Chain(tmp_path / "home")
    args = ["flow", "--plan", plan, "--model", f"script:{script}", "--reactive", "all"]
    args += ["--checkpoint-version", version]
    first = chain.step("first run", cli_args(chain.home, args), _fault_env(FIRST_KILL))
    assert first.returncode == KILLED, chain.problems
    assert chain.runs and (chain.runs[0] / "checkpoint.json").exists()
    return chain


# Some twenty `steerflow` processes in a row (one per seam of a resume's initialization):
# 40-80 s alone on a loaded two-core machine, more beside three other test workers.
# Version 3 (what `flow` writes) runs in CI; the legacy version 2 chain is the same
# campaign again and runs with the stress tests (`pytest -m slow`): ~30 s of a two-core
# suite budget.
@pytest.mark.timeout(300)
@pytest.mark.parametrize("version", ["3", pytest.param("2", marks=pytest.mark.slow)])
def test_resume_chain_never_reinvokes_acknowledged_work(tmp_path: Path, version: str) -> None:
    chain = _start_chain(tmp_path, version)
    assert {"a", "b"} <= _completed(chain.runs[0]), "the first run recorded too little"

    hits_file = tmp_path / "hits.json"
    argv = [PYTHON, "-c", _RECORDING_DRIVER, str(hits_file), *_resume_args(chain)]
    recorded = chain.step("initialization (recorded)", argv, child_env())
    assert recorded.returncode == KILLED, chain.problems
    kills = _initialization_kills(json.loads(hits_file.read_text()))
    points = {kill.split(":", 1)[1].rsplit(":", 1)[0] for kill in kills}
    assert {"before:base-write", "after:base-exchange", "after:ack"} <= points, kills

    for fault in [*kills, *RECORD_KILLS]:
        step = chain.step(f"killed at {fault}", _resume_argv(chain), _fault_env(fault))
        assert step.returncode == KILLED or fault in RECORD_KILLS, f"{fault} was never reached"

    final = chain.step("final resume", [*_resume_argv(chain), "--json"], child_env())
    assert final.returncode == 0, final.stderr
    body = json.loads(final.stdout)
    assert body["status"] == "completed", body
    assert not chain.problems, "\n".join(chain.problems)
    assert _completed(Path(body["run_dir"])) == {*NODES, "s1"}
