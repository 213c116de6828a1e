"""What the executor asks before each provider call: is this process still the run's owner?"""

from __future__ import annotations

from typing import Protocol

__all__ = ["AdmissionFence"]


class AdmissionFence(Protocol):
    """The run's lease, as an admission sees it (``orchestrate.LeaseKeeper`` is one).

    :meth:`fresh` is a local check, cheap enough for every call; only when it says no
    does the executor await :meth:`hold`, which asks the state database.
    """

    def fresh(self) -> bool:
        """True while the lease is known held without asking the database."""
        ...

    async def hold(self) -> bool:
        """Whether the lease is held, confirmed by the database; ``False`` once lost."""
        ...
