"""Artifact contracts (Amendment 1 rows 2, 7, 8, 9): what each leg must produce, and proof.

A leg declares relative paths (``roles.<role>.artifacts``, a plan entry's ``artifacts``,
a spawn request's ``artifacts``); the run persists the resulting
:class:`ArtifactContract` before anything executes, checks each declared file when its
operation finishes, and records ``{"path", "bytes", "digest"}`` per file in the node's
checkpoint entry. Digests are streamed BLAKE2b, whatever the size.
"""

from __future__ import annotations

from steerflow.artifacts._contract import (
    CONFIG_KEY,
    CONTRACT_VERSION,
    DECLARED_MEMBER,
    ArtifactContract,
    ContractError,
    checkpoint_contract,
    merge_declared,
)
from steerflow.artifacts._hash import (
    CHUNK,
    DIGEST_PREFIX,
    ArtifactProblem,
    ArtifactRecord,
    LegCheck,
    ProblemKind,
    check_leg,
    hash_fd,
    hash_file,
    inspect_artifact,
    records_from_json,
)
from steerflow.artifacts._settle import (
    ContractOrigin,
    RecordedLeg,
    Settlement,
    SourceContract,
    Unsettled,
    UnsettledReason,
    read_source_contract,
    recorded_legs,
    settle,
    settle_legs,
    source_contract,
)

__all__ = [
    "CHUNK",
    "CONFIG_KEY",
    "CONTRACT_VERSION",
    "DECLARED_MEMBER",
    "DIGEST_PREFIX",
    "ArtifactContract",
    "ArtifactProblem",
    "ArtifactRecord",
    "ContractError",
    "ContractOrigin",
    "LegCheck",
    "ProblemKind",
    "RecordedLeg",
    "Settlement",
    "SourceContract",
    "Unsettled",
    "UnsettledReason",
    "check_leg",
    "checkpoint_contract",
    "hash_fd",
    "hash_file",
    "inspect_artifact",
    "merge_declared",
    "read_source_contract",
    "recorded_legs",
    "records_from_json",
    "settle",
    "settle_legs",
    "source_contract",
]
