"""A run's spend against its caps: what every call cost, and whether one more fits.

The meter prices each call as it returns (:meth:`Meter.charge`), counts it into the
spend of the whole resume chain (``base``: what the runs before this one paid), and
answers the admission check (:meth:`Meter.room`): spend so far, plus a reservation
for every call in flight and for the one asking, must stay within each cap. A call's
reservation is the most expensive call the chain has seen; until one is known, the
first call runs alone (:meth:`Meter.unsized`). So with calls of one size a cap is never
passed, and in general the overshoot is at most the calls in flight when it was
crossed, each at most the largest call (docs/decisions.md, decision 180).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from steerflow.errors import UsageError
from steerflow.providers import Provider, Usage
from steerflow.providers._pricing import PriceTable

__all__ = ["BUDGET_REASON", "Caps", "Meter", "enforceable", "unenforceable"]

#: ``admission_reason`` once the budget closed admission (CONTRACT §11).
BUDGET_REASON = "budget"


@dataclass(frozen=True)
class Caps:
    """The caps of a run (None: no cap): USD, and input plus output tokens."""

    max_cost: float | None = None
    max_tokens: int | None = None

    @property
    def any(self) -> bool:
        """Whether some cap is set."""
        return self.max_cost is not None or self.max_tokens is not None

    def to_json(self) -> dict[str, float | int | None]:
        """The ``budget`` object of CONTRACT §11."""
        return {"max_cost": self.max_cost, "max_tokens": self.max_tokens}


def enforceable(caps: Caps, prices: PriceTable, providers: dict[str, Provider]) -> None:
    """Refuse (exit 2) caps that cannot be enforced: no usage reported, or no price known.

    Blocking: the price table's first look-up imports it. Never "free by default".
    """
    if not caps.any:
        return
    for spec, provider in sorted(providers.items()):
        if not provider.reports_usage:
            raise UsageError(
                f"model {spec!r} reports no token usage, so --max-cost/--max-tokens "
                "cannot be enforced on it"
            )
        if caps.max_cost is not None and not prices.known(spec):
            raise UsageError(
                f"--max-cost: no price is known for model {spec!r}: give "
                f"--price {spec}=IN,OUT (USD per million input/output tokens)"
            )


def unenforceable(prices: PriceTable, providers: dict[str, Provider]) -> dict[str, str]:
    """Cap name (``max_cost``, ``max_tokens``) -> why these models cannot enforce it.

    What a later ``ctl budget`` could not enforce either: the run records it in its
    session row (``control.UNENFORCEABLE_KEY``), where the ``ctl`` writers read it
    (decision 246). Blocking, as :func:`enforceable`.
    """
    out: dict[str, str] = {}
    for name, probe in (("max_cost", Caps(max_cost=1.0)), ("max_tokens", Caps(max_tokens=1))):
        try:
            enforceable(probe, prices, providers)
        except UsageError as exc:
            out[name] = str(exc)
    return out


class Meter:
    """Spend and caps of one run (and the chain before it)."""

    def __init__(
        self, prices: PriceTable | None = None, caps: Caps | None = None, base: Usage | None = None
    ) -> None:
        self.prices = prices or PriceTable()
        self.caps = caps or Caps()
        #: What the runs of the chain before this one spent.
        self.base = base or Usage()
        #: What this run's calls spent (the planner's and every attempt included).
        self.spent = Usage()
        self._inflight: set[str] = set()
        self._largest_cost = 0.0
        self._largest_tokens = 0
        #: Whether some call's size is known (this run's, or one the chain recorded).
        self._sized = False
        self._released = asyncio.Event()

    @property
    def total(self) -> Usage:
        """The chain's spend: ``base`` plus this run's."""
        return self.base + self.spent

    def charge(self, spec: str | None, usage: Usage | None) -> Usage | None:
        """Price one returned call, count it, and return its priced usage."""
        priced = self.prices.priced(spec, usage)
        if priced is None:
            return None
        self.spent = self.spent + priced
        self.observe(priced)
        return priced

    def observe(self, usage: Usage | None) -> None:
        """Size the reservation by a call seen (this run's, or one the chain recorded)."""
        if usage is not None:
            self._sized = True
            self._largest_cost = max(self._largest_cost, usage.cost_usd or 0.0)
            self._largest_tokens = max(self._largest_tokens, usage.tokens)

    def unsized(self) -> bool:
        """Under a cap, while no call's size is known and one is in flight: wait for it.

        The first call of a capped run runs alone, so the reservations that follow are
        sized by a real call instead of by nothing (decision 180).
        """
        return self.caps.any and not self._sized and bool(self._inflight)

    async def wait_release(self) -> None:
        """Until a call in flight ends (charged, failed, or never made)."""
        await self._released.wait()

    def room(self) -> bool:
        """Whether one more call fits beside those in flight (the admission check)."""
        calls = len(self._inflight) + 1
        total = self.total
        cap_cost, cap_tokens = self.caps.max_cost, self.caps.max_tokens
        if cap_cost is not None:
            spent = total.cost_usd or 0.0
            if spent >= cap_cost or spent + calls * self._largest_cost > cap_cost:
                return False
        if cap_tokens is not None:
            used = total.tokens
            if used >= cap_tokens or used + calls * self._largest_tokens > cap_tokens:
                return False
        return True

    def recap(self, max_cost: float | None, max_tokens: int | None) -> Caps:
        """``ctl budget``: replace the caps given (None keeps that one); the new caps."""
        self.caps = Caps(
            self.caps.max_cost if max_cost is None else max_cost,
            self.caps.max_tokens if max_tokens is None else max_tokens,
        )
        return self.caps

    def reached(self) -> bool:
        """Whether the spend alone has reached a cap (no reservation counted)."""
        total = self.total
        cost, tokens = self.caps.max_cost, self.caps.max_tokens
        return (cost is not None and (total.cost_usd or 0.0) >= cost) or (
            tokens is not None and total.tokens >= tokens
        )

    def reserve(self, key: str) -> None:
        """A call admitted: it is in flight until :meth:`release`."""
        self._inflight.add(key)

    def release(self, key: str) -> None:
        """The call ended (charged, failed or never made)."""
        self._inflight.discard(key)
        released, self._released = self._released, asyncio.Event()
        released.set()

    def exhausted_line(self) -> str:
        """What was spent against which cap, for the one line a budget stop prints."""
        total = self.total
        parts = []
        if self.caps.max_cost is not None:
            parts.append(f"${total.cost_usd or 0.0:.4f} of the ${self.caps.max_cost:g} cap")
        if self.caps.max_tokens is not None:
            parts.append(f"{total.tokens} of the {self.caps.max_tokens} token cap")
        return "spent " + " and ".join(parts)
