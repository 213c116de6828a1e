"""Resume (D5): resolve a target, and check a checkpoint into a replay plan.

:func:`rerun_cut` makes the checkpoint a ``resume --from NODE`` fork starts from.

:func:`resolve_run_target` finds the run a ``resume``/``show`` target names;
:func:`plan_replay` applies the D5 refusal rules, the spawned reconstruction and the
Amendment 1 settle check to a loaded checkpoint and returns a pure :class:`ReplayPlan`
(no executor types): ``orchestrate`` applies it to a graph.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING

from steerflow._lazy import lazy_exports

if TYPE_CHECKING:
    from pathlib import Path

    from steerflow.resume._from import RerunFrom, rerun_cut
    from steerflow.resume._plan import ReplayPlan, ReplaySpawn, paid_nodes, plan_replay
    from steerflow.resume._target import RunTarget, resolve_run_target

__all__ = [
    "ReplayPlan",
    "ReplaySpawn",
    "RerunFrom",
    "RunTarget",
    "paid_nodes",
    "plan_replay",
    "rerun_cut",
    "resolve_run_target",
]


# Where each name lives (a submodule of this package), imported on first access.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ReplayPlan": "_plan",
        "ReplaySpawn": "_plan",
        "RerunFrom": "_from",
        "paid_nodes": "_plan",
        "rerun_cut": "_from",
        "RunTarget": "_target",
        "plan_replay": "_plan",
        "resolve_run_target": "_target",
    },
)


class _Package(types.ModuleType):
    """This package, callable as the root's ``steerflow.resume`` control writer.

    ``steerflow`` re-exports ``views.resume`` under the name of this package (CONTRACT
    §11), and importing a subpackage binds its name on the parent; so once this package
    is imported, ``steerflow.resume(home, target)`` reaches it, and it does the same.
    """

    def __call__(self, home: Path | str, target: str, *, state_db: str | None = None) -> str:
        """``steerflow.views.resume``: queue ``ctl resume TARGET``; the control id."""
        from steerflow.control import send_control

        return send_control(home, target, "resume", state_db=state_db)


sys.modules[__name__].__class__ = _Package
