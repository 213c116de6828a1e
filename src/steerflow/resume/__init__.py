"""Resume: resolve a target, check the checkpoint, rebuild a faithful graph (D5)."""

from __future__ import annotations

from steerflow.resume._target import RunTarget, resolve_run_target

__all__ = ["RunTarget", "resolve_run_target"]
