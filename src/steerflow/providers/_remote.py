"""Where the remote-provider conventions and dispatch used to live; kept as an alias.

The conventions are :mod:`steerflow.providers._conventions` and the dispatch is
:mod:`steerflow.providers._registry`. This module only re-exports them for code
that still imports it; nothing imports it from inside ``providers``, so it adds
no cycle.
"""

from __future__ import annotations

from steerflow.providers._conventions import (
    SPAWN_GUIDANCE,
    extract_spawns,
    parse_plan_reply,
    plan_system_prompt,
    plan_user_prompt,
    split_history,
    system_with_spawn,
)
from steerflow.providers._registry import EXTRAS, make_remote_provider, missing_sdk_error

__all__ = [
    "EXTRAS",
    "SPAWN_GUIDANCE",
    "extract_spawns",
    "make_remote_provider",
    "missing_sdk_error",
    "parse_plan_reply",
    "plan_system_prompt",
    "plan_user_prompt",
    "split_history",
    "system_with_spawn",
]
