"""Run checkpoints: the version 2 snapshot and the version 3 base + journal.

A checkpoint unit lives in the run directory as ``checkpoint.json`` and, for version
3, ``checkpoint.json.journal`` beside it; back them up or move them together.
:class:`CheckpointWriter` produces them and :func:`load_checkpoint` reads either
version and returns the ``checkpoint_recovery`` report with the state.
"""

from __future__ import annotations

from steerflow.errors import CheckpointRecoveryError

from ._digest import entry_digest, result_digest
from ._load import CHECKPOINT_FILENAME, JOURNAL_FILENAME, load_checkpoint
from ._writer import CheckpointWriter, SavedHook

__all__ = [
    "CHECKPOINT_FILENAME",
    "JOURNAL_FILENAME",
    "CheckpointRecoveryError",
    "CheckpointWriter",
    "SavedHook",
    "entry_digest",
    "load_checkpoint",
    "result_digest",
]
