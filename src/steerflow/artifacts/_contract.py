"""The artifact contract: which files each leg declared, and under which root.

Stored form (``sessions.artifact_contract_json``, and a copy under the checkpoint
``config`` key :data:`CONFIG_KEY`)::

    {"version": 1, "root": "<absolute artifact root>",
     "legs": {"<leg key>": ["rel/path", ...], ...}}

``legs`` is sorted by key; a leg's paths keep their declared order with repeats dropped;
a leg that declares nothing is absent. A leg key is the planned ``agent_id`` or a spawned
leg's ``spawn_id`` (never its node id), the same key its artifact directory is named by.
A run always writes a contract, possibly with no legs, so a missing record is never
mistaken for "nothing was declared".

A spawned leg's declaration is also kept in its checkpoint entry, member
:data:`DECLARED_MEMBER`, because the config copy is written once, before any spawn: the
checkpoint's contract is the config copy plus those members (:func:`checkpoint_contract`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steerflow.plan import artifact_path_problem, is_agent_id

__all__ = [
    "CONFIG_KEY",
    "CONTRACT_VERSION",
    "DECLARED_MEMBER",
    "ArtifactContract",
    "ContractError",
    "checkpoint_contract",
    "contract_difference",
    "merge_declared",
]

CONTRACT_VERSION = 1
#: The checkpoint ``config`` key holding the copy of the contract.
CONFIG_KEY = "artifact_contract"
#: The spawned checkpoint entry member holding that leg's declared paths.
DECLARED_MEMBER = "declared_artifacts"


class ContractError(ValueError):
    """A stored contract cannot be read: wrong shape, version, key or path."""


def merge_declared(*groups: Iterable[str]) -> tuple[str, ...]:
    """The paths of ``groups`` in order, each once (role paths first, then the entry's)."""
    return tuple(dict.fromkeys(path for group in groups for path in group))


@dataclass(frozen=True)
class ArtifactContract:
    """An artifact root and, per leg key, the relative paths that leg must produce."""

    root: Path
    legs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def declared(self, leg_key: str) -> tuple[str, ...]:
        """The paths ``leg_key`` declared (empty if none)."""
        return self.legs.get(leg_key, ())

    def with_leg(self, leg_key: str, paths: Iterable[str]) -> ArtifactContract:
        """A copy where ``leg_key`` declares ``paths`` (nothing changes for an empty set)."""
        declared = merge_declared(paths)
        if not declared:
            return self
        return ArtifactContract(self.root, {**self.legs, leg_key: declared})

    def to_json(self) -> dict[str, Any]:
        """The stored form (see the module docstring)."""
        return {
            "version": CONTRACT_VERSION,
            "root": str(self.root),
            "legs": {key: list(self.legs[key]) for key in sorted(self.legs)},
        }

    @classmethod
    def from_json(cls, data: object) -> ArtifactContract:
        """Read a stored contract; anything but the exact stored form is refused.

        Raises:
            ContractError: not an object, another version, a relative root, a leg key
                that could not name a leg directory, or a path that could not be declared.
        """
        if not isinstance(data, Mapping):
            raise ContractError("artifact contract is not a JSON object")
        if set(data) != {"version", "root", "legs"}:
            raise ContractError(f"artifact contract has members {sorted(map(str, data))}")
        if data["version"] != CONTRACT_VERSION or isinstance(data["version"], bool):
            raise ContractError(f"artifact contract version {data['version']!r} is not supported")
        root = data["root"]
        if not isinstance(root, str) or not root.startswith("/"):
            raise ContractError("artifact contract root is not an absolute path")
        legs = data["legs"]
        if not isinstance(legs, Mapping):
            raise ContractError("artifact contract legs is not an object")
        out: dict[str, tuple[str, ...]] = {}
        for key, paths in legs.items():
            if not is_agent_id(key):
                raise ContractError(f"artifact contract leg key {str(key)[:100]!r} is not an id")
            if not isinstance(paths, list) or not paths:
                raise ContractError(f"artifact contract leg {key!r} is not a non-empty list")
            for path in paths:
                problem = artifact_path_problem(path)
                if problem:
                    raise ContractError(f"artifact contract leg {key!r} path {path!r}: {problem}")
            if len(set(paths)) != len(paths):
                raise ContractError(f"artifact contract leg {key!r} repeats a path")
            out[key] = tuple(paths)
        return cls(Path(root), out)


def checkpoint_contract(
    config: Mapping[str, Any], spawned: Iterable[Mapping[str, Any]]
) -> ArtifactContract | None:
    """The contract a checkpoint unit describes: its config copy plus spawned declarations.

    ``spawned`` are the raw spawned entries; one carrying :data:`DECLARED_MEMBER` adds its
    ``spawn_id``'s leg. None when the config holds no contract (a run from before
    contracts, or a checkpoint written by the library without one).

    Raises:
        ContractError: the config copy or a spawned declaration cannot be read.
    """
    stored = config.get(CONFIG_KEY)
    if stored is None:
        return None
    contract = ArtifactContract.from_json(stored)
    for entry in spawned:
        declared = entry.get(DECLARED_MEMBER)
        if declared is None:
            continue
        key = entry.get("spawn_id")
        if not isinstance(key, str) or not is_agent_id(key):
            raise ContractError("a spawned entry declares artifacts without a spawn_id")
        if not isinstance(declared, list) or any(artifact_path_problem(p) for p in declared):
            raise ContractError(f"spawned leg {key!r} declares unreadable artifact paths")
        contract = contract.with_leg(key, declared)
    return contract


def contract_difference(stored: ArtifactContract, copy: ArtifactContract) -> str:
    """Where ``stored`` (the state DB's) and ``copy`` (the checkpoint's) first differ.

    Names the leg and the declared file (or the root), so an operator can see which
    record to believe; an empty string when they are equal.
    """
    if stored.root != copy.root:
        return (
            f"the artifact root is {str(stored.root)!r} in the state DB but "
            f"{str(copy.root)!r} in the checkpoint"
        )
    for leg in sorted(set(stored.legs) | set(copy.legs)):
        ours, theirs = stored.declared(leg), copy.declared(leg)
        if ours == theirs:
            continue
        for path in ours:
            if path not in theirs:
                return (
                    f"leg {leg!r} declares file {path!r} in the state DB but not in the checkpoint"
                )
        for path in theirs:
            if path not in ours:
                return (
                    f"leg {leg!r} declares file {path!r} in the checkpoint but not in the state DB"
                )
        return (
            f"leg {leg!r} declares its files in another order ({list(ours)!r} in the state "
            f"DB, {list(theirs)!r} in the checkpoint)"
        )
    return ""
