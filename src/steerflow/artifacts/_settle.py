"""Settling recorded artifacts (Amendment 1 rows 2, 7, 9): is what a node produced still there?

A completed node whose checkpoint entry records ``artifacts`` is worth what it produced
only while those files are still there, byte for byte. Settling a checkpoint:

1. reads the contract the run that wrote the checkpoint persisted in the state DB (its
   session's ``artifact_contract_json``) and the checkpoint's own copy
   (:func:`~steerflow.artifacts.checkpoint_contract`); they must be equal. Nothing is
   re-derived from roles as they are today, so removing a role's ``artifacts`` between
   runs does not weaken the check;
2. checks every completed entry against it: a leg that recorded artifacts needs a
   contract declaring exactly those paths, and a leg the contract declares files for
   needs a record of them (an absent record is not evidence);
3. looks for each recorded file under the contract's root (the original run's, also
   with ``--save``) at ``<root>/<leg key>/<path>``, never following a symlink, and
   compares size and streamed BLAKE2b digest, so a rewrite that keeps size and mtime
   is caught.

Steps 1 and 2 refuse (:class:`~steerflow.errors.ArtifactContractError`); step 3 returns
:class:`Unsettled` records for the caller to refuse or re-run. Everything here blocks
(it reads whole files): call it off the event loop.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from steerflow.artifacts._contract import (
    ArtifactContract,
    ContractError,
    checkpoint_contract,
    contract_difference,
)
from steerflow.artifacts._hash import (
    ArtifactProblem,
    ArtifactRecord,
    inspect_artifact,
    records_from_json,
)
from steerflow.checkpoint import CheckpointState
from steerflow.errors import ArtifactContractError
from steerflow.state import NodeKind, StateDB, db_exists

__all__ = [
    "ContractOrigin",
    "RecordedLeg",
    "Settlement",
    "SourceContract",
    "Unsettled",
    "UnsettledReason",
    "read_source_contract",
    "recorded_legs",
    "settle",
    "settle_legs",
    "source_contract",
]

#: ``missing``: nothing at the path; ``not_regular``: a symlink (at the path or on the way),
#: a directory, FIFO or device; ``unreadable``: there but cannot be read; ``size``: another
#: size; ``digest``: the same size, other bytes.
UnsettledReason = Literal["missing", "not_regular", "unreadable", "size", "digest"]


@dataclass(frozen=True)
class RecordedLeg:
    """A completed node that recorded artifacts: its leg key, kind and records."""

    key: str
    kind: NodeKind
    records: tuple[ArtifactRecord, ...]


@dataclass(frozen=True)
class Unsettled:
    """One recorded artifact that is not there as recorded."""

    node: str
    kind: NodeKind
    path: str
    reason: UnsettledReason
    expected: ArtifactRecord
    found_bytes: int | None = None
    found_digest: str | None = None
    detail: str = ""

    def found_text(self) -> str:
        """What was found instead, in words."""
        if self.reason == "size":
            return f"{self.found_bytes} bytes"
        if self.reason == "digest":
            return f"the same size with digest {self.found_digest}"
        said = {"missing": "missing", "not_regular": "not a regular file"}.get(
            self.reason, self.reason
        )
        return f"{said} ({self.detail})" if self.detail else said

    def describe(self) -> str:
        """``node 'b': artifact 'out/x.md': expected N bytes blake2b:..., found ...``."""
        return (
            f"node {self.node!r}: artifact {self.path!r}: expected {self.expected.bytes} bytes "
            f"{self.expected.digest}, found {self.found_text()}"
        )

    def to_json(self) -> dict[str, Any]:
        """The stable object ``verify --json`` and a refused ``resume --json`` print."""
        return {
            "node": self.node,
            "kind": self.kind,
            "path": self.path,
            "reason": self.reason,
            "expected": {"bytes": self.expected.bytes, "digest": self.expected.digest},
            "found": {
                "bytes": self.found_bytes,
                "digest": self.found_digest,
                "detail": self.detail or None,
            },
        }


@dataclass(frozen=True)
class Settlement:
    """A checkpoint settled against its contract: what was checked and what did not match."""

    contract: ArtifactContract | None
    legs: tuple[RecordedLeg, ...]
    unsettled: tuple[Unsettled, ...]
    #: Where ``contract`` came from (``SourceContract.origin``) and the note saying so.
    origin: ContractOrigin | None = None
    note: str | None = None

    @property
    def settled(self) -> bool:
        """True when every recorded artifact is there as recorded."""
        return not self.unsettled

    @property
    def checked(self) -> int:
        """How many recorded files were looked at."""
        return sum(len(leg.records) for leg in self.legs)

    def to_json(self) -> dict[str, Any]:
        """``artifact_root``, ``contract_source``, ``checked``, ``nodes``, ``unsettled``.

        ``contract_source`` is ``state_db``, ``checkpoint`` (the DB's copy was missing) or
        null (no contract at all).
        """
        return {
            "artifact_root": str(self.contract.root) if self.contract else None,
            "contract_source": self.origin,
            "warnings": [self.note] if self.note else [],
            "checked": self.checked,
            "nodes": [
                {
                    "id": leg.key,
                    "kind": leg.kind,
                    "artifacts": [r.to_json() for r in leg.records],
                }
                for leg in self.legs
            ],
            "unsettled": [u.to_json() for u in self.unsettled],
        }


# -- 1. the persisted contract -------------------------------------------------------------

#: Where the contract a settle used came from: the state DB's row (checked equal to the
#: checkpoint's copy), or the checkpoint's own copy because the DB's is missing.
ContractOrigin = Literal["state_db", "checkpoint"]


@dataclass(frozen=True)
class SourceContract:
    """The contract a checkpoint is settled against, where it came from, and why."""

    contract: ArtifactContract | None
    #: None when neither record holds a contract (a run from before contracts).
    origin: ContractOrigin | None
    #: One line for the run's warnings when the checkpoint's own copy was used, else None.
    note: str | None = None


@dataclass(frozen=True)
class _Stored:
    """The state DB's copy: the contract, or why there is none, or why it cannot be read."""

    contract: ArtifactContract | None = None
    absent: str | None = None
    unreadable: str | None = None


def _stored_contract(home: Path, session_id: str) -> _Stored:
    """The contract in the state DB row of ``session_id``."""
    if not session_id:
        return _Stored(absent="the checkpoint names no session")
    if not db_exists(home):
        return _Stored(absent="there is no state DB")
    with StateDB.open(home, create=False) as db:
        row = db.get_session(session_id)
    if row is None:
        return _Stored(absent="the state DB has no session row for it")
    if row.artifact_contract_json is None:
        return _Stored(absent="the state DB holds no artifact contract for it")
    try:
        return _Stored(ArtifactContract.from_json(json.loads(row.artifact_contract_json)))
    except (ValueError, ContractError) as exc:  # JSONDecodeError is a ValueError
        return _Stored(unreadable=str(exc))


def _declared_legs(contract: ArtifactContract) -> str:
    keys = sorted(contract.legs)
    shown = ", ".join(repr(k) for k in keys[:5]) + (", ..." if len(keys) > 5 else "")
    return f"{len(keys)} leg{'s' if len(keys) != 1 else ''}: {shown}"


def read_source_contract(
    home: Path, state: CheckpointState, *, accept_checkpoint_contract: bool = False
) -> SourceContract:
    """The contract the run that wrote ``state`` persisted, checked against the copy.

    When the state DB's copy is missing (no state DB, no session row: a lost or replaced
    DB; or a row without a contract), the checkpoint's own copy is used if it declares no
    artifacts (there is nothing the DB's copy could vouch for), and otherwise only with
    ``accept_checkpoint_contract``; either way the result's ``note`` says so.

    Raises:
        ArtifactContractError: either record is unreadable, or they disagree, or the
            DB's copy is missing while the checkpoint's declares artifacts and
            ``accept_checkpoint_contract`` is false.
    """
    where = f"session {state.session_id}"
    found = _stored_contract(home, state.session_id)
    if found.unreadable is not None:
        raise ArtifactContractError(
            f"the artifact contract {where} persisted cannot be read ({found.unreadable}); "
            "its recorded artifacts cannot be settled"
        )
    stored, absent = found.contract, found.absent
    try:
        copy = checkpoint_contract(state.config, (e.raw for e in state.spawned))
    except ContractError as exc:
        raise ArtifactContractError(
            f"the checkpoint's copy of the artifact contract cannot be read ({exc})"
        ) from None
    if stored is not None:
        if copy is None:
            why = "its checkpoint holds no copy of the artifact contract the state DB records"
        elif stored != copy:
            # Name the leg and file (decision 114): which record to believe is the
            # operator's call, and "they disagree" alone gives nothing to check.
            why = (
                "the state DB's artifact contract (sessions.artifact_contract_json) and the "
                "checkpoint's copy (config.artifact_contract and spawned declarations) "
                f"disagree: {contract_difference(stored, copy)}"
            )
        else:
            return SourceContract(stored, "state_db")
        raise ArtifactContractError(f"{where}: {why}; its recorded artifacts cannot be settled")
    if copy is None:
        return SourceContract(None, None)
    if not copy.legs:
        note = (
            f"the state DB's copy of the artifact contract of {where} is missing ({absent}); "
            "its checkpoint's copy declares no artifacts, so the checkpoint alone is used"
        )
        return SourceContract(copy, "checkpoint", note)
    if not accept_checkpoint_contract:
        raise ArtifactContractError(
            f"{where}: the state DB's copy of the artifact contract is missing ({absent}), "
            f"but its checkpoint declares artifacts ({_declared_legs(copy)}); its recorded "
            "artifacts cannot be settled against the state DB. Pass "
            "--accept-checkpoint-contract to settle them against the checkpoint's own copy "
            "(only if you trust that file: nothing else vouches for what it declares)"
        )
    note = (
        f"recorded artifacts of {where} are settled against the checkpoint's own copy of "
        f"the artifact contract (--accept-checkpoint-contract): the state DB's copy is "
        f"missing ({absent}); it declares {_declared_legs(copy)}"
    )
    return SourceContract(copy, "checkpoint", note)


def source_contract(
    home: Path, state: CheckpointState, *, accept_checkpoint_contract: bool = False
) -> ArtifactContract | None:
    """:func:`read_source_contract`'s contract alone (None: neither record holds one).

    Whether None is acceptable is :func:`recorded_legs`' rule.
    """
    return read_source_contract(
        home, state, accept_checkpoint_contract=accept_checkpoint_contract
    ).contract


# -- 2. entries against the contract ---------------------------------------------------------


def _completed(state: CheckpointState) -> Iterable[tuple[str, NodeKind, Mapping[str, Any]]]:
    for key, entry in state.ops.items():
        if entry.status == "completed":
            yield key, "planned", entry.raw
    for spawned in state.spawned:
        if spawned.status == "completed":
            yield spawned.spawn_id or spawned.node_id, "spawned", spawned.raw


def recorded_legs(
    contract: ArtifactContract | None, state: CheckpointState
) -> tuple[RecordedLeg, ...]:
    """Every completed node that recorded artifacts, checked against ``contract``.

    Raises:
        ArtifactContractError: a node recorded artifacts with no contract, or records
            other paths than its contract declares, or declares files it never recorded,
            or its ``artifacts`` member cannot be read.
    """
    legs: list[RecordedLeg] = []
    for key, kind, raw in _completed(state):
        member = raw.get("artifacts")
        try:
            records = records_from_json(member) if member is not None else None
        except ValueError as exc:
            raise ArtifactContractError(
                f"node {key!r}: its recorded artifacts cannot be read ({exc})"
            ) from None
        declared = contract.declared(key) if contract is not None else ()
        if not records and not declared:
            continue
        if contract is None:
            raise ArtifactContractError(
                f"node {key!r} recorded artifacts, but its run persisted no artifact contract; "
                "an absent record is not evidence, so they cannot be settled"
            )
        paths = sorted(r.path for r in records or ())
        if paths != sorted(declared):
            raise ArtifactContractError(
                f"node {key!r}: its artifact contract declares {sorted(declared)} but its "
                f"entry records {paths}; the record cannot settle the contract"
            )
        legs.append(RecordedLeg(key, kind, records or ()))
    return tuple(legs)


# -- 3. the files ------------------------------------------------------------------------------


#: A live-check problem as a settle reason (an empty file is a record, compared by size).
_REASON: dict[str, UnsettledReason] = {
    "missing": "missing",
    "not_regular": "not_regular",
    "unreadable": "unreadable",
    "empty": "size",
}


def _compare(leg: RecordedLeg, expected: ArtifactRecord, root: Path) -> Unsettled | None:
    found = inspect_artifact(root / leg.key, expected.path)

    def unsettled(reason: UnsettledReason, **found_as: Any) -> Unsettled:
        return Unsettled(leg.key, leg.kind, expected.path, reason, expected, **found_as)

    if isinstance(found, ArtifactProblem):
        return unsettled(_REASON[found.kind], detail=found.detail)
    if found.bytes != expected.bytes:
        return unsettled("size", found_bytes=found.bytes)
    if found.digest != expected.digest:
        return unsettled("digest", found_bytes=found.bytes, found_digest=found.digest)
    return None


def settle_legs(contract: ArtifactContract, legs: Iterable[RecordedLeg]) -> list[Unsettled]:
    """Look for every recorded file under the contract's root; what does not match."""
    out: list[Unsettled] = []
    for leg in legs:
        for expected in leg.records:
            problem = _compare(leg, expected, contract.root)
            if problem is not None:
                out.append(problem)
    return out


def settle(
    home: Path, state: CheckpointState, *, accept_checkpoint_contract: bool = False
) -> Settlement:
    """Settle every completed node of a loaded checkpoint (``steerflow verify``).

    ``home`` locates the state DB holding the persisted contract of the session that
    wrote ``state``; ``accept_checkpoint_contract`` is :func:`read_source_contract`'s.

    Raises:
        ArtifactContractError: the contract is missing, unreadable or disagrees (see
            :func:`read_source_contract` and :func:`recorded_legs`).
    """
    source = read_source_contract(
        home, state, accept_checkpoint_contract=accept_checkpoint_contract
    )
    contract = source.contract
    legs = recorded_legs(contract, state)
    unsettled = settle_legs(contract, legs) if contract is not None else []
    return Settlement(contract, legs, tuple(unsettled), source.origin, source.note)
