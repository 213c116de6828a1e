"""Plan names that readers need without the plan models (no pydantic here)."""

from __future__ import annotations

__all__ = ["SYNTHESIS_KEY"]

#: The node key of a run's synthesis (top-level ``synthesis``, ``--synthesize``). Reserved in
#: every plan, so adding a synthesis to a plan at run time can never collide with an entry.
SYNTHESIS_KEY = "synthesis"
