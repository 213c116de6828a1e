"""Plans in checkpoint form: moved to :mod:`steerflow.plan` (a resume rebuilds plans too)."""

from __future__ import annotations

from steerflow.plan import plan_from_checkpoint, plan_to_checkpoint

__all__ = ["plan_from_checkpoint", "plan_to_checkpoint"]
