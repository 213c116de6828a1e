"""A flow whose checkpoint writes fail: recovered when it can be, reported when not.

The flow runs as a real subprocess with ``STEERFLOW_FAULT`` injecting ``EIO`` right
after the journal's ``fsync`` (an uncertain outcome: the bytes may be durable).  The
version-3 writer then refuses records until ``reconcile()``; the run reconciles and
records the outcome again (decision 27).  If that fails too, the run reports the error
(exit 1, ``persisted`` false), admits no further operation (decision 35) and the
durable prefix stays resumable: no node whose outcome was acknowledged runs again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from flow_support import (
    chain_plan,
    child_env,
    node_status,
    run_cli,
    show_in_process,
    write_yaml,
)
from resume_support import invocation_counts, write_script

from steerflow.checkpoint import load_checkpoint
from steerflow.orchestrate._recorder import MAX_RECONCILES

NODES = ("a", "b", "c", "d", "e")
#: Journal fsync hits: 1 when the empty journal is created, n + 1 for the record of the
#: n-th node (every node of the chain completes one after the other): 4 is ``c``'s.
FIRST_FAILING_FSYNC = 4


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def _flow(home: Path, tmp_path: Path, fault: str) -> tuple[dict[str, object], str, int]:
    plan = chain_plan(tmp_path / "plan.yaml", NODES)
    script = write_script(tmp_path / "script.yaml", {"*": {"delay": 0.0}})
    result = run_cli(
        home, "flow", "--plan", plan, "--model", f"script:{script}", "--json",
        env=child_env(STEERFLOW_FAULT=fault),
    )  # fmt: skip
    return result.json, result.stderr, result.returncode


def test_transient_write_error_is_reconciled_and_every_outcome_persisted(
    home: Path, tmp_path: Path
) -> None:
    out, stderr, code = _flow(home, tmp_path, f"eio:after:journal-fsync:{FIRST_FAILING_FSYNC}")
    assert code == 0, stderr
    assert out["status"] == "completed"
    checkpoint = out["checkpoint"]
    assert checkpoint["persisted"] is True and checkpoint["error"] is None  # type: ignore[index]
    assert checkpoint["reconciled"] == 1  # type: ignore[index]
    [warning] = out["warnings"]  # type: ignore[misc]
    assert "recovered from the durable prefix" in warning and "injected fault" in warning
    assert "checkpoint write failed, recovered from the durable prefix" in stderr
    state, report = load_checkpoint(Path(str(out["run_dir"])))
    assert report["status"] == "clean"
    assert {k: e["status"] for k, e in state["ops"].items()} == dict.fromkeys(NODES, "completed")
    assert show_in_process(home, str(out["session_id"]))["status"] == "completed"


#: From ``c``'s record on, no journal line and no base (the reconciliation's) can be
#: written: the disk is full.  Journal write hits follow the fsync numbering.
DISK_FULL_FROM_THIRD_RECORD = ",".join(
    [f"enospc:before:journal-write:{n}" for n in range(FIRST_FAILING_FSYNC, 40)]
    + [f"enospc:before:base-write:{n}" for n in range(2, 40)]
)


def test_persistent_write_error_fails_the_run_and_the_durable_prefix_resumes(
    home: Path, tmp_path: Path
) -> None:
    out, stderr, code = _flow(home, tmp_path, DISK_FULL_FROM_THIRD_RECORD)
    assert code == 1, stderr
    assert out["status"] == "failed"
    checkpoint = out["checkpoint"]
    assert checkpoint["persisted"] is False  # type: ignore[index]
    assert "injected fault" in str(checkpoint["error"])  # type: ignore[index]
    assert 1 <= checkpoint["reconciled"] <= MAX_RECONCILES  # type: ignore[index,operator]
    assert "CHECKPOINT FAILED" in stderr
    # ``c`` was paid for but could not be saved: nothing after it is started.
    assert node_status(out) == {
        **dict.fromkeys("abc", "completed"),
        **dict.fromkeys("de", "pending"),
    }
    assert set(invocation_counts(home)) == {"a", "b", "c"}
    state, report = load_checkpoint(Path(str(out["run_dir"])))
    assert report["status"] in ("clean", "recovered_prefix")
    durable = sorted(k for k, e in state["ops"].items() if e["status"] == "completed")
    assert durable == ["a", "b"]

    resumed = run_cli(home, "resume", out["run_id"], "--json")
    assert resumed.returncode == 0, resumed.explain()
    assert node_status(resumed.json) == dict.fromkeys(NODES, "completed")
    again = invocation_counts(home, run_id=resumed.json["run_id"])
    assert not set(again) & set(durable), again  # acknowledged outcomes are replayed
    assert set(again) == set(NODES) - set(durable)


def test_concurrent_outcomes_failing_in_one_batch_are_all_recovered(
    home: Path, tmp_path: Path
) -> None:
    """Group commit: one failed fsync fails every record of its batch; one reconciliation
    serves them all, and each outcome is recorded again."""
    ids = [f"n{i}" for i in range(8)]
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {"name": "wide", "plan": [{"agent_id": i, "instruction": f"do {i}"} for i in ids]},
    )
    script = write_script(tmp_path / "script.yaml", {"*": {"delay": 0.05}})
    # The 1st journal fsync publishes the empty journal; the 2nd is the first batch of
    # records, however many group commit put in it (a later hit may never come).
    result = run_cli(
        home, "flow", "--plan", plan, "--model", f"script:{script}", "--concurrency", 8,
        "--json", env=child_env(STEERFLOW_FAULT="eio:after:journal-fsync:2"),
    )  # fmt: skip
    assert result.returncode == 0, result.explain()
    out = result.json
    assert out["checkpoint"]["persisted"] is True and out["checkpoint"]["reconciled"] == 1
    state, report = load_checkpoint(Path(out["run_dir"]))
    assert report["status"] == "clean"
    assert {k: e["status"] for k, e in state["ops"].items()} == dict.fromkeys(ids, "completed")


def test_lost_checkpoint_closes_admission_and_in_flight_calls_finish(
    home: Path, tmp_path: Path
) -> None:
    """Disk full from the third record on: the first outcome that cannot be saved closes
    admission. The call already in flight finishes; nothing else is invoked; the
    withheld nodes stay pending and the resume runs them (decision 35)."""
    fanout = ("d1", "d2", "d3")
    entries: list[dict[str, object]] = [{"agent_id": "slow", "instruction": "take a while"}]
    for key, dep in (("a", None), ("b", "a"), ("c", "b"), *((d, "c") for d in fanout)):
        entries.append(
            {"agent_id": key, "instruction": f"do {key}", **({"depends_on": [dep]} if dep else {})}
        )
    plan = write_yaml(tmp_path / "plan.yaml", {"name": "fan", "plan": entries})
    # ``slow`` runs beside the chain; whichever outcome is third cannot be saved, and
    # ``d1``-``d3`` can only start after ``c`` has been recorded, so none may run.
    script = write_script(tmp_path / "script.yaml", {"*": {"delay": 0.0}, "slow": {"delay": 2.0}})
    result = run_cli(
        home, "flow", "--plan", plan, "--model", f"script:{script}", "--json",
        env=child_env(STEERFLOW_FAULT=DISK_FULL_FROM_THIRD_RECORD),
    )  # fmt: skip
    assert result.returncode == 1, result.explain()
    out = result.json
    assert out["status"] == "failed"
    assert out["checkpoint"]["persisted"] is False and out["checkpoint"]["error"]
    statuses = node_status(out)
    assert {k: statuses[k] for k in fanout} == dict.fromkeys(fanout, "pending"), statuses
    # Every call that was admitted finished (none was cancelled); nothing else was invoked.
    # (``c`` runs unless ``slow`` took the second record, which a loaded machine may allow.)
    invoked = invocation_counts(home, run_id=out["run_id"])
    assert {"slow", "a", "b"} <= set(invoked) <= {"slow", "a", "b", "c"}, invoked
    assert all(n == 1 for n in invoked.values()), invoked
    assert {k: statuses[k] for k in invoked} == dict.fromkeys(invoked, "completed")
    assert {k for k, v in statuses.items() if v == "pending"} == set(statuses) - set(invoked)
    shown = node_status(show_in_process(home, str(out["session_id"])))
    assert {k: shown[k] for k in fanout} == dict.fromkeys(fanout, "pending"), shown

    state, _ = load_checkpoint(Path(str(out["run_dir"])))
    durable = {k for k, e in state["ops"].items() if e["status"] == "completed"}
    assert len(durable) == 2 and not durable & set(fanout), durable
    resumed = run_cli(home, "resume", out["run_id"], "--json")
    assert resumed.returncode == 0, resumed.explain()
    assert set(node_status(resumed.json).values()) == {"completed"}
    again = invocation_counts(home, run_id=resumed.json["run_id"])
    assert set(again) == set(statuses) - durable, again  # the withheld ones run now
