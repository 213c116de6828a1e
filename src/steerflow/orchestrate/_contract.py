"""A run's artifact contract: resolved before execution, kept current as legs are spawned.

Amendment 1 row 2: the contract is in ``sessions.artifact_contract_json`` before the first
operation starts, and a spawned leg's declaration is added before that spawned node
starts, so a run killed at any point leaves a record covering every leg that ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

from steerflow.artifacts import ArtifactContract, merge_declared
from steerflow.executor import Graph, Operation
from steerflow.orchestrate._settings import RunSettings
from steerflow.state import StateDB

__all__ = ["ContractKeeper", "resolve_contract", "role_artifacts"]


def role_artifacts(settings: RunSettings) -> Callable[[str | None], Sequence[str]]:
    """``assignee -> declared paths`` from the roles the run records (never today's)."""

    def declared(assignee: str | None) -> Sequence[str]:
        paths = (settings.roles.get(assignee or "") or {}).get("artifacts") or ()
        return [p for p in paths if isinstance(p, str)]

    return declared


def resolve_contract(
    graph: Graph,
    settings: RunSettings,
    root: Path,
    recorded: ArtifactContract | None = None,
) -> ArtifactContract:
    """The contract of a run about to execute ``graph``; stamps each op's declaration.

    A resume keeps the legs its source recorded (a role edited since cannot weaken
    them): ``recorded``, the source session's checked contract, else the copy in the
    source checkpoint's config; a rebuilt spawned leg not listed there keeps the
    declaration its replay gave it. A fresh run's leg declares its role's paths, then its
    own (a plan entry's, or a spawn request's already on the operation).

    Raises:
        ContractError: the recorded contract cannot be read.
    """
    stored = settings.artifact_contract
    if recorded is not None or stored is not None:
        legs = recorded.legs if recorded is not None else ArtifactContract.from_json(stored).legs
        contract = ArtifactContract(root, legs)
        for op in graph:
            if op.key in contract.legs or op.kind == "planned":
                op.declared_artifacts = contract.declared(op.key)
            else:
                contract = contract.with_leg(op.key, op.declared_artifacts)
        return contract
    roles = role_artifacts(settings)
    contract = ArtifactContract(root)
    for op in graph:
        op.declared_artifacts = merge_declared(roles(op.assignee), op.declared_artifacts)
        contract = contract.with_leg(op.key, op.declared_artifacts)
    return contract


class ContractKeeper:
    """Owns the stored contract of one session: written whole on every change."""

    def __init__(self, db: StateDB, session_id: str, contract: ArtifactContract) -> None:
        self._db = db
        self._session_id = session_id
        self.contract = contract

    async def persist(self) -> None:
        """Write the contract to the session row (a committed transaction)."""
        stored = self.contract.to_json()
        await asyncio.to_thread(self._db.set_artifact_contract, self._session_id, stored)

    async def add_spawned(self, children: list[Operation]) -> None:
        """Spawn observer: record the children's declarations before any of them starts."""
        contract = self.contract
        for child in children:
            contract = contract.with_leg(child.key, child.declared_artifacts)
        if contract is not self.contract:
            self.contract = contract
            await self.persist()
