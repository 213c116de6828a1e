"""Run checkpoints: the version 2 snapshot and the version 3 base + journal.

A checkpoint unit lives in the run directory as ``checkpoint.json`` and, for version
3, ``checkpoint.json.journal`` beside it; back them up or move them together.
:class:`CheckpointWriter` produces them and :func:`load_checkpoint` reads either
version and returns the ``checkpoint_recovery`` report with the state (a D4 dict);
:func:`load_state` returns the same state typed (:class:`CheckpointState` with
:class:`PlannedEntry`/:class:`SpawnedEntry`).  Branch files (``branches/<key>.json``,
the conversations a resume restores) are saved and loaded here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from steerflow._lazy import lazy_exports
from steerflow.errors import CheckpointRecoveryError

if TYPE_CHECKING:
    from steerflow.checkpoint._branches import BRANCHES_DIR, load_branch, save_branch
    from steerflow.checkpoint._capture import context_problem
    from steerflow.checkpoint._digest import entry_digest, result_digest
    from steerflow.checkpoint._entries import CheckpointState, PlannedEntry, SpawnedEntry
    from steerflow.checkpoint._intents import InFlightCall
    from steerflow.checkpoint._load import (
        CHECKPOINT_FILENAME,
        JOURNAL_FILENAME,
        LoadedCheckpoint,
        load_checkpoint,
        load_state,
    )
    from steerflow.checkpoint._writer import CheckpointWriter, SavedHook

__all__ = [
    "BRANCHES_DIR",
    "CHECKPOINT_FILENAME",
    "JOURNAL_FILENAME",
    "CheckpointRecoveryError",
    "CheckpointState",
    "CheckpointWriter",
    "InFlightCall",
    "LoadedCheckpoint",
    "PlannedEntry",
    "SavedHook",
    "SpawnedEntry",
    "context_problem",
    "entry_digest",
    "load_branch",
    "load_checkpoint",
    "load_state",
    "result_digest",
    "save_branch",
]


# Where each name lives (a submodule of this package), imported on first access.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BRANCHES_DIR": "_branches",
        "CHECKPOINT_FILENAME": "_load",
        "CheckpointState": "_entries",
        "CheckpointWriter": "_writer",
        "InFlightCall": "_intents",
        "JOURNAL_FILENAME": "_load",
        "LoadedCheckpoint": "_load",
        "PlannedEntry": "_entries",
        "SavedHook": "_writer",
        "SpawnedEntry": "_entries",
        "context_problem": "_capture",
        "entry_digest": "_digest",
        "load_branch": "_branches",
        "load_checkpoint": "_load",
        "load_state": "_load",
        "result_digest": "_digest",
        "save_branch": "_branches",
    },
)
