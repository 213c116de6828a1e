"""Settling recorded artifacts (Amendment 1 rows 2, 7, 9): ``steerflow.artifacts.settle`` and
the artifact rule of ``resume.plan_replay``.

Checkpoints are written by the real :class:`CheckpointWriter` (version 3) into a run
directory of a real home, with the contract stored in the real state DB session row and
copied into the checkpoint's ``config``, as a run leaves them; the files are real files.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from steerflow.artifacts import (
    CONFIG_KEY,
    DECLARED_MEMBER,
    ArtifactContract,
    Unsettled,
    hash_file,
    read_source_contract,
    settle,
    source_contract,
)
from steerflow.checkpoint import CheckpointState, CheckpointWriter, load_state
from steerflow.errors import ArtifactContractError, ArtifactsUnsettledError
from steerflow.resume import plan_replay
from steerflow.state import StateDB

# -- a recorded run --------------------------------------------------------------------------


@dataclass
class Leg:
    """One completed node: its files (relative path -> bytes), its spawn emitter if any."""

    files: dict[str, bytes]
    deps: list[str] = field(default_factory=list)
    spawned_by: str | None = None


@dataclass
class Run:
    home: Path
    run_dir: Path
    root: Path
    session_id: str
    contract: dict[str, Any]

    def state(self) -> CheckpointState:
        state, _ = load_state(self.run_dir / "checkpoint.json")
        return state

    def file(self, leg: str, rel: str) -> Path:
        return self.root / leg / rel


def _records(root: Path, key: str, files: dict[str, bytes]) -> list[dict[str, Any]]:
    out = []
    for rel in sorted(files):
        size, digest = hash_file(root / key / rel)
        out.append({"path": rel, "bytes": size, "digest": digest})
    return out


def record_run(
    tmp_path: Path,
    legs: dict[str, Leg],
    *,
    root: Path | None = None,
    store: object = "same",
    copy: object = "same",
    record: bool = True,
) -> Run:
    """A finished run whose completed nodes wrote ``legs`` and recorded them.

    ``store``/``copy``: what the state DB row / the config copy hold ("same": the
    contract; None: nothing; a str: raw text for the DB; a dict: that object).
    """
    home = tmp_path / "home"
    run_dir = home / "runs" / "20260101T000000-abcdef"
    run_dir.mkdir(parents=True, mode=0o700)
    root = root or run_dir / "artifacts"
    planned = {k: v for k, v in legs.items() if v.spawned_by is None}
    spawned = {k: v for k, v in legs.items() if v.spawned_by is not None}
    contract = {
        "version": 1,
        "root": str(root),
        "legs": {k: sorted(v.files) for k, v in sorted(planned.items()) if v.files},
    }
    for key, leg in legs.items():
        for rel, data in leg.files.items():
            path = root / key / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    full = {
        **contract,
        "legs": {k: sorted(v.files) for k, v in sorted(legs.items()) if v.files},
    }
    with StateDB.open(home) as db:
        session = db.create_session(kind="flow", run_id=run_dir.name)
        if store == "same":
            db.set_artifact_contract(session.id, full)
        elif isinstance(store, str):
            _store_raw(db, session.id, store)
        elif store is not None:
            db.set_artifact_contract(session.id, store)
    config: dict[str, Any] = {"model_spec": "echo", "roles": {}}
    if copy == "same":
        config[CONFIG_KEY] = contract
    elif copy is not None:
        config[CONFIG_KEY] = copy
    plan = [
        {
            "agent_id": key,
            "instruction": f"step {key}",
            "dep_indices": [list(planned).index(d) for d in leg.deps],
            "node_id": f"n-{key}",
        }
        for key, leg in planned.items()
    ]

    async def write() -> None:
        writer = CheckpointWriter(
            run_dir / "checkpoint.json",
            session_id=session.id,
            prompt="",
            plan=plan,
            config=config,
            version=3,
        )
        await writer.flush()
        for key, leg in planned.items():
            recorded = _records(root, key, leg.files) if record and leg.files else None
            await writer.record(key, status="completed", response=key, artifacts=recorded)
        for key, leg in spawned.items():
            recorded = _records(root, key, leg.files) if record and leg.files else None
            extra: dict[str, Any] = {"depends_on": [leg.spawned_by, *leg.deps]}
            if recorded:
                extra["artifacts"] = recorded
            if leg.files:
                extra[DECLARED_MEMBER] = sorted(leg.files)
            await writer.record_spawned(
                f"node-of-{key}",
                status="completed",
                response=key,
                operation=f"work {key}",
                assignee=None,
                instruction=f"work {key}",
                parent_id=f"n-{leg.spawned_by}",
                spawn_id=key,
                **extra,
            )
        await writer.close()

    asyncio.run(write())
    return Run(home, run_dir, root, session.id, full)


def _store_raw(db: StateDB, session_id: str, text: str) -> None:
    """Put text that is not a contract into the row, as a corrupted DB would hold it."""
    with db.backend.transaction(write=True) as tx:
        tx.execute(
            "UPDATE sessions SET artifact_contract_json = ? WHERE id = ?", (text, session_id)
        )


CHAIN = {
    "a": Leg({"out/report.md": b"report A"}),
    "b": Leg({"b.txt": b"bbb"}, deps=["a"]),
    "c": Leg({}, deps=["b"]),
    "d": Leg({"d.bin": b"\x00" * 100}),
}


def _one(unsettled: tuple[Unsettled, ...] | list[Unsettled]) -> Unsettled:
    assert len(unsettled) == 1, unsettled
    return unsettled[0]


# -- settled ---------------------------------------------------------------------------------


def test_an_untouched_run_is_settled(tmp_path: Path) -> None:
    run = record_run(tmp_path, CHAIN)
    settlement = settle(run.home, run.state())
    assert settlement.settled
    assert settlement.checked == 3
    assert [leg.key for leg in settlement.legs] == ["a", "b", "d"]
    assert settlement.contract == ArtifactContract.from_json(run.contract)
    body = settlement.to_json()
    assert body["artifact_root"] == str(run.root)
    assert body["unsettled"] == []


def test_a_run_from_before_contracts_has_nothing_to_settle(tmp_path: Path) -> None:
    run = record_run(tmp_path, {"a": Leg({}), "b": Leg({}, deps=["a"])}, store=None, copy=None)
    settlement = settle(run.home, run.state())
    assert settlement.settled and settlement.checked == 0 and settlement.contract is None


# -- each way a file can be unsettled --------------------------------------------------------


def test_a_deleted_artifact_is_missing(tmp_path: Path) -> None:
    run = record_run(tmp_path, CHAIN)
    run.file("b", "b.txt").unlink()
    found = _one(settle(run.home, run.state()).unsettled)
    assert (found.node, found.path, found.reason) == ("b", "b.txt", "missing")
    assert found.expected.bytes == 3
    assert "node 'b': artifact 'b.txt': expected 3 bytes blake2b:" in found.describe()
    assert found.describe().endswith("found missing")


def test_a_truncated_artifact_has_another_size(tmp_path: Path) -> None:
    run = record_run(tmp_path, CHAIN)
    os.truncate(run.file("d", "d.bin"), 10)
    found = _one(settle(run.home, run.state()).unsettled)
    assert (found.node, found.reason, found.found_bytes) == ("d", "size", 10)
    assert found.to_json()["expected"]["bytes"] == 100
    assert found.to_json()["found"]["bytes"] == 10


def test_a_same_size_rewrite_with_its_mtime_restored_is_caught_by_digest(tmp_path: Path) -> None:
    run = record_run(tmp_path, CHAIN)
    path = run.file("a", "out/report.md")
    before = path.stat()
    path.write_bytes(b"report B")  # same length
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns
    assert path.stat().st_size == before.st_size
    found = _one(settle(run.home, run.state()).unsettled)
    assert (found.node, found.path, found.reason) == ("a", "out/report.md", "digest")
    assert found.found_digest == hash_file(path)[1]
    assert found.found_digest != found.expected.digest


def test_an_artifact_replaced_by_a_symlink_to_identical_bytes_is_not_a_regular_file(
    tmp_path: Path,
) -> None:
    run = record_run(tmp_path, CHAIN)
    path = run.file("b", "b.txt")
    twin = tmp_path / "elsewhere.txt"
    twin.write_bytes(path.read_bytes())  # following the link would "match"
    path.unlink()
    path.symlink_to(twin)
    found = _one(settle(run.home, run.state()).unsettled)
    assert (found.node, found.reason, found.detail) == ("b", "not_regular", "a symlink")
    assert "not a regular file (a symlink)" in found.describe()


def test_an_artifact_replaced_by_a_directory_is_not_a_regular_file(tmp_path: Path) -> None:
    run = record_run(tmp_path, CHAIN)
    path = run.file("b", "b.txt")
    path.unlink()
    path.mkdir()
    found = _one(settle(run.home, run.state()).unsettled)
    assert (found.reason, found.detail) == ("not_regular", "a directory")


def test_a_symlinked_directory_on_the_path_is_not_followed(tmp_path: Path) -> None:
    run = record_run(tmp_path, CHAIN)
    real = tmp_path / "moved-out"
    (run.root / "a" / "out").rename(real)
    (run.root / "a" / "out").symlink_to(real)  # same bytes behind the link
    found = _one(settle(run.home, run.state()).unsettled)
    # Never read through the link (its target holds the very bytes recorded); Linux
    # answers O_NOFOLLOW|O_DIRECTORY on a symlink with ENOTDIR, read as "missing".
    assert found.node == "a"
    assert found.reason in ("missing", "not_regular")
    assert found.found_digest is None


def test_a_fifo_at_the_path_does_not_hang_the_check(tmp_path: Path) -> None:
    run = record_run(tmp_path, CHAIN)
    path = run.file("b", "b.txt")
    path.unlink()
    os.mkfifo(path)
    found = _one(settle(run.home, run.state()).unsettled)
    assert found.reason == "not_regular"


def test_a_deleted_artifact_root_leaves_every_record_missing(tmp_path: Path) -> None:
    run = record_run(tmp_path, CHAIN)
    for path in sorted(run.root.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    run.root.rmdir()
    unsettled = settle(run.home, run.state()).unsettled
    assert [(u.node, u.reason) for u in unsettled] == [
        ("a", "missing"),
        ("b", "missing"),
        ("d", "missing"),
    ]


def test_artifacts_are_looked_for_under_the_contract_root_not_the_run_dir(tmp_path: Path) -> None:
    saved = tmp_path / "saved-root"  # the original run used --save
    run = record_run(tmp_path, CHAIN, root=saved)
    assert not (run.run_dir / "artifacts").exists()
    assert settle(run.home, run.state()).settled
    (saved / "b" / "b.txt").write_bytes(b"BBB")
    assert _one(settle(run.home, run.state()).unsettled).reason == "digest"


def test_a_spawned_leg_is_found_under_its_spawn_id(tmp_path: Path) -> None:
    legs = {**CHAIN, "fix-1": Leg({"patch.diff": b"--- a\n+++ b\n"}, spawned_by="b")}
    run = record_run(tmp_path, legs)
    assert (run.root / "fix-1" / "patch.diff").is_file()
    assert not (run.root / "node-of-fix-1").exists()
    settlement = settle(run.home, run.state())
    assert settlement.settled and "fix-1" in [leg.key for leg in settlement.legs]
    run.file("fix-1", "patch.diff").write_bytes(b"")
    found = _one(settle(run.home, run.state()).unsettled)
    assert (found.node, found.kind, found.reason, found.found_bytes) == (
        "fix-1",
        "spawned",
        "size",
        0,
    )


# -- the contract: never absent, unreadable or disagreeing -----------------------------------


def test_recorded_artifacts_without_a_persisted_contract_are_refused(tmp_path: Path) -> None:
    run = record_run(tmp_path, CHAIN, store=None, copy=None)
    with pytest.raises(ArtifactContractError, match="node 'a' recorded artifacts, but its run"):
        settle(run.home, run.state())


def test_a_state_db_without_the_contract_the_checkpoint_copies_is_refused(tmp_path: Path) -> None:
    run = record_run(tmp_path, CHAIN, store=None)
    with pytest.raises(ArtifactContractError, match="state DB holds no artifact contract"):
        source_contract(run.home, run.state())


def test_a_checkpoint_without_the_copy_of_a_stored_contract_is_refused(tmp_path: Path) -> None:
    run = record_run(tmp_path, CHAIN, copy=None)
    with pytest.raises(ArtifactContractError, match="holds no copy"):
        settle(run.home, run.state())


def test_an_unreadable_stored_contract_is_refused(tmp_path: Path) -> None:
    run = record_run(tmp_path, CHAIN, store="{not json")
    with pytest.raises(ArtifactContractError, match="cannot be read"):
        settle(run.home, run.state())


def test_a_stored_contract_with_another_root_disagrees_with_the_copy(tmp_path: Path) -> None:
    other = {"version": 1, "root": str(tmp_path / "elsewhere"), "legs": {}}
    run = record_run(tmp_path, CHAIN, store=other)
    with pytest.raises(ArtifactContractError, match="disagree"):
        settle(run.home, run.state())


def test_today_s_roles_do_not_matter_only_the_persisted_contract(tmp_path: Path) -> None:
    """Deleting a leg from the stored contract (a role that no longer declares it) refuses:
    the record of what the node produced is then unvouched, never silently trusted."""
    run = record_run(tmp_path, CHAIN)
    weaker = {**run.contract, "legs": {k: v for k, v in run.contract["legs"].items() if k != "b"}}
    with StateDB.open(run.home) as db:
        db.set_artifact_contract(run.session_id, weaker)
    with pytest.raises(ArtifactContractError):
        settle(run.home, run.state())


def test_a_declared_leg_whose_entry_records_nothing_is_refused(tmp_path: Path) -> None:
    run = record_run(tmp_path, CHAIN, record=False)
    with pytest.raises(ArtifactContractError, match=r"node 'a'.*declares \['out/report.md'\]"):
        settle(run.home, run.state())


# -- the state DB's copy missing (issue 27): the checkpoint alone, or the explicit flag -------


def _drop_session_row(run: Run) -> None:
    with StateDB.open(run.home) as db, db.backend.transaction(write=True) as tx:
        tx.execute("DELETE FROM sessions WHERE id = ?", (run.session_id,))


@pytest.mark.parametrize("lost", ["no-row", "no-db", "null-contract"])
def test_a_copy_declaring_nothing_is_used_alone_when_the_db_copy_is_missing(
    tmp_path: Path, lost: str
) -> None:
    run = record_run(tmp_path, {"a": Leg({})}, store=None if lost == "null-contract" else "same")
    if lost == "no-row":
        _drop_session_row(run)
    elif lost == "no-db":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{run.home / 'state.db'}{suffix}").unlink(missing_ok=True)
    found = read_source_contract(run.home, run.state())
    assert (found.origin, found.contract) == ("checkpoint", ArtifactContract(run.root, {}))
    assert found.note is not None and "declares no artifacts" in found.note
    settled = settle(run.home, run.state())
    assert settled.settled and settled.to_json()["contract_source"] == "checkpoint"


def test_a_copy_declaring_artifacts_needs_the_flag_and_then_settles_against_it(
    tmp_path: Path,
) -> None:
    run = record_run(tmp_path, CHAIN)
    _drop_session_row(run)
    with pytest.raises(ArtifactContractError) as refused:
        settle(run.home, run.state())
    message = str(refused.value)
    assert "the state DB's copy of the artifact contract is missing" in message
    assert "no session row" in message and "--accept-checkpoint-contract" in message
    accepted = settle(run.home, run.state(), accept_checkpoint_contract=True)
    assert accepted.settled and accepted.origin == "checkpoint" and accepted.checked == 3
    assert accepted.note is not None and "--accept-checkpoint-contract" in accepted.note
    run.file("b", "b.txt").write_bytes(b"other")
    unsettled = settle(run.home, run.state(), accept_checkpoint_contract=True).unsettled
    assert [(u.node, u.path, u.reason) for u in unsettled] == [("b", "b.txt", "size")]


def test_the_flag_never_overrides_a_db_copy_that_is_there(tmp_path: Path) -> None:
    other = {"version": 1, "root": str(tmp_path / "elsewhere"), "legs": {}}
    run = record_run(tmp_path, CHAIN, store=other)
    with pytest.raises(ArtifactContractError, match="disagree"):
        read_source_contract(run.home, run.state(), accept_checkpoint_contract=True)
    intact = record_run(tmp_path / "intact", CHAIN)
    found = read_source_contract(intact.home, intact.state(), accept_checkpoint_contract=True)
    assert (found.origin, found.note) == ("state_db", None)


# -- plan_replay: refuse, or re-run downstream -----------------------------------------------


def test_plan_replay_refuses_an_unsettled_node_naming_node_file_expected_and_found(
    tmp_path: Path,
) -> None:
    run = record_run(tmp_path, CHAIN)
    state = run.state()
    contract = source_contract(run.home, state)
    assert plan_replay(state, run.run_dir, contract=contract).artifacts.keys() == {"a", "b", "d"}
    run.file("b", "b.txt").unlink()
    with pytest.raises(ArtifactsUnsettledError) as caught:
        plan_replay(state, run.run_dir, contract=contract)
    assert caught.value.code == "artifacts-unsettled"
    assert caught.value.exit_code == 3
    assert "node 'b': artifact 'b.txt': expected 3 bytes" in str(caught.value)
    assert "found missing" in str(caught.value)
    assert "--rerun-unsettled" in str(caught.value)
    assert [u["node"] for u in caught.value.unsettled] == ["b"]
    assert json.dumps(caught.value.unsettled)  # plain JSON for resume --json


def test_plan_replay_without_the_contract_refuses_recorded_artifacts(tmp_path: Path) -> None:
    run = record_run(tmp_path, CHAIN)
    with pytest.raises(ArtifactContractError):
        plan_replay(run.state(), run.run_dir)


def test_rerun_unsettled_reruns_the_node_and_everything_downstream_only(tmp_path: Path) -> None:
    legs = {
        **CHAIN,
        "e": Leg({}, deps=["d"]),
        "fix-1": Leg({"p.diff": b"patch"}, spawned_by="b"),
        "fix-2": Leg({}, spawned_by="a"),
    }
    run = record_run(tmp_path, legs)
    state = run.state()
    contract = source_contract(run.home, state)
    run.file("b", "b.txt").write_bytes(b"changed")
    replay = plan_replay(state, run.run_dir, contract=contract, rerun_unsettled=True)
    assert replay.rerun_unsettled == ("b", "c", "fix-1")
    assert set(replay.completed) == {"a", "d", "e"}
    assert {s.spawn_id: s.status for s in replay.spawned} == {
        "fix-1": "pending",
        "fix-2": "completed",
    }
    assert [(u.node, u.reason) for u in replay.unsettled] == [("b", "size")]
    assert set(replay.artifacts) == {"a", "d"}  # what is replayed, settled
    notes = "\n".join(replay.notes)
    assert "node 'b' runs again (--rerun-unsettled): artifact 'b.txt' is 7 bytes" in notes
    assert "node 'c' runs again (--rerun-unsettled): it depends on 'b'" in notes
    assert "node 'fix-1' runs again" in notes
    assert "'a' runs again" not in notes and "'e' runs again" not in notes


# -- the readers: verify and show, in process -------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str]:
    from steerflow.cli import main

    code = main(["--home", str(home), *args])
    return code, capsys.readouterr().out


def test_verify_prints_the_settlement_and_exits_3_when_unsettled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = record_run(tmp_path, CHAIN)
    code, out = _cli(capsys, run.home, "verify", run.run_dir.name)
    assert code == 0
    assert "settled: 3 recorded artifacts of 3 nodes match byte for byte" in out
    run.file("d", "d.bin").write_bytes(b"\x01" * 100)
    code, out = _cli(capsys, run.home, "verify", run.session_id)
    assert code == 3
    assert "unsettled: 1 of 3 recorded artifacts do not match:" in out
    assert "node 'd': artifact 'd.bin': expected 100 bytes" in out
    code, out = _cli(capsys, run.home, "verify", run.run_dir.name, "--json")
    body = json.loads(out)
    assert (code, body["status"], body["exit_code"], body["checked"]) == (3, "unsettled", 3, 3)
    assert [(u["node"], u["reason"]) for u in body["unsettled"]] == [("d", "digest")]


def test_verify_of_a_run_without_a_checkpoint_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = record_run(tmp_path, CHAIN)
    (run.run_dir / "checkpoint.json").unlink()
    (run.run_dir / "checkpoint.json.journal").unlink(missing_ok=True)
    code, out = _cli(capsys, run.home, "verify", run.run_dir.name, "--json")
    assert code == 3
    assert "has no checkpoint.json" in json.loads(out)["error"]["message"]


def test_show_lists_each_recorded_artifact_with_size_and_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = record_run(tmp_path, CHAIN)
    digest = hash_file(run.file("b", "b.txt"))[1]
    code, out = _cli(capsys, run.home, "show", run.run_dir.name)
    assert code == 0
    assert f"      artifact b.txt  3 bytes  {digest}" in out
    code, out = _cli(capsys, run.home, "show", run.run_dir.name, "--json")
    nodes = {n["id"]: n for n in json.loads(out)["nodes"]}
    assert nodes["b"]["artifacts"] == [{"path": "b.txt", "bytes": 3, "digest": digest}]
    assert "artifacts" not in nodes["c"]
    code, out = _cli(capsys, run.home, "show", run.run_dir.name, "b")
    assert code == 0
    assert f"artifacts:\n  b.txt  3 bytes  {digest}\n" in out
