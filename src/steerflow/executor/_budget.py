"""A run's spend against its caps: what every call cost, and whether one more fits.

The meter prices each call as it returns (:meth:`Meter.charge`), counts it into the
spend of the whole resume chain (``base``: what the runs before this one paid), and
answers the admission check (:meth:`Meter.room`): spend so far, plus a reservation
for every call in flight and for the one asking, must stay within each cap. A call's
reservation is the most expensive call the chain has seen; until one is known, the
first call runs alone (:meth:`Meter.unsized`). So with calls of one size a cap is never
passed, and in general the overshoot is at most the calls in flight when it was
crossed, each at most the largest call (docs/decisions.md, decision 180).

A call's reservation ends when it is charged, not when its outcome is saved: from then
on its real cost is in the spend, and counting the reservation too closed admission a
call early (issue 38 item 2). Calls an earlier run of the chain left in flight (write-
ahead intents without an outcome, decision 217) may have been paid: their reservations
count as spent (``doubt``); one recorded before any call's size was known is sized, like
a reservation, by the largest call the chain has seen.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

from steerflow.errors import UsageError
from steerflow.providers import Provider, Usage
from steerflow.providers._pricing import PriceTable

__all__ = [
    "BUDGET_REASON",
    "FLAG_NAMES",
    "PARAMETER_NAMES",
    "CapNames",
    "Caps",
    "InFlightDoubt",
    "Meter",
    "enforceable",
    "unenforceable",
]

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


@dataclass(frozen=True)
class CapNames:
    """How a refusal spells the caps and a price: the CLI's flags or the API's parameters."""

    caps: str
    cost: str
    #: A ``str.format`` template of the fix that gives model ``{spec}`` a price.
    price: str


#: The command line's spelling (``steerflow flow --max-cost``).
FLAG_NAMES = CapNames("--max-cost/--max-tokens", "--max-cost", "--price {spec}=IN,OUT")
#: ``FlowOptions``/``AgentOptions``'s spelling (issue 40: an API user never typed a flag).
PARAMETER_NAMES = CapNames(
    "max_cost/max_tokens", "max_cost", "prices={{{spec!r}: steerflow.Price(IN, OUT)}}"
)


def enforceable(
    caps: Caps,
    prices: PriceTable,
    providers: dict[str, Provider],
    names: CapNames = FLAG_NAMES,
) -> None:
    """Refuse (exit 2) caps that cannot be enforced: no usage reported, or no price known.

    Blocking: the price table's first look-up imports it. Never "free by default".
    ``names``: how the refusal spells the caps and the fix (flags or parameters).
    """
    if not caps.any:
        return
    for spec, provider in sorted(providers.items()):
        if not provider.reports_usage:
            raise UsageError(
                f"model {spec!r} reports no token usage, so {names.caps} cannot be enforced on it"
            )
        if caps.max_cost is not None and not prices.known(spec):
            raise UsageError(
                f"{names.cost}: no price is known for model {spec!r}: give "
                f"{names.price.format(spec=spec)} (USD per million input/output tokens)"
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
        self,
        prices: PriceTable | None = None,
        caps: Caps | None = None,
        base: Usage | None = None,
        doubt: InFlightDoubt | None = None,
    ) -> None:
        self.prices = prices or PriceTable()
        self.caps = caps or Caps()
        #: What the runs of the chain before this one spent.
        self.base = base or Usage()
        #: Calls earlier runs of the chain left in flight: counted as spent.
        self.doubt = doubt or InFlightDoubt()
        #: What this run's calls spent (the planner's and every attempt included).
        self.spent = Usage()
        self._inflight: set[str] = set()
        self._largest_cost = 0.0
        self._largest_tokens = 0
        #: Whether some call's size is known (this run's, or one the chain recorded).
        self._sized = False
        self._cost_known = False  # whether some call seen had a cost
        self._released = asyncio.Event()

    @property
    def total(self) -> Usage:
        """The chain's spend: ``base`` plus this run's."""
        return self.base + self.spent

    def _counted(self) -> tuple[float, int]:
        """Cost and tokens held against the caps: the spend plus the calls in doubt."""
        total, doubt = self.total, self.doubt
        cost = (total.cost_usd or 0.0) + doubt.cost_usd + doubt.unsized * self._largest_cost
        tokens = total.tokens + doubt.tokens + doubt.unsized * self._largest_tokens
        return cost, tokens

    def reservation(self) -> tuple[float | None, int | None]:
        """What one call admitted now reserves (cost, tokens); None while no size is known."""
        if not self._sized:
            return None, None
        # A cost is reserved only once some call had one: an unpriced model's calls are
        # "cost not known", never "$0" (tokens still are).
        return (self._largest_cost if self._cost_known else None), self._largest_tokens

    def charge(self, spec: str | None, usage: Usage | None, key: str | None = None) -> Usage | None:
        """Price one returned call, count it, and return its priced usage.

        ``key``: the call's reservation, which ends here (its cost is now spent).
        """
        priced = self.prices.priced(spec, usage)
        if priced is not None:
            self.spent = self.spent + priced
            self.observe(priced)
        if key is not None:
            self.release(key)
        return priced

    def observe(self, usage: Usage | None) -> None:
        """Size the reservation by a call seen (this run's, or one the chain recorded)."""
        if usage is not None:
            self._sized = True
            self._cost_known = self._cost_known or usage.cost_usd is not None
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
        spent, used = self._counted()
        cap_cost, cap_tokens = self.caps.max_cost, self.caps.max_tokens
        # A small tolerance: $0.002 calls under a $0.010 cap must fit five times, which
        # binary floating point adds up to 0.010000000000000002.
        if cap_cost is not None and (
            spent >= cap_cost - _EPS or spent + calls * self._largest_cost > cap_cost + _EPS
        ):
            return False
        return cap_tokens is None or (
            used < cap_tokens and used + calls * self._largest_tokens <= cap_tokens
        )

    def recap(self, max_cost: float | None, max_tokens: int | None) -> Caps:
        """``ctl budget``: replace the caps given (None keeps that one); the new caps."""
        self.caps = Caps(
            self.caps.max_cost if max_cost is None else max_cost,
            self.caps.max_tokens if max_tokens is None else max_tokens,
        )
        return self.caps

    def reached(self) -> bool:
        """Whether the spend alone has reached a cap (no reservation counted)."""
        spent, used = self._counted()
        cost, tokens = self.caps.max_cost, self.caps.max_tokens
        return (cost is not None and spent >= cost - _EPS) or (
            tokens is not None and used >= tokens
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
        line = "spent " + " and ".join(parts)
        if self.doubt.calls:
            line += f", counting {self.doubt.describe(self._largest_cost)}"
        return line


#: Cost tolerance of the cap checks (USD): far below any call's price.
_EPS = 1e-9


@dataclass(frozen=True)
class InFlightDoubt:
    """Calls earlier runs of the chain left in flight (decision 217), counted as spent.

    ``cost_usd``/``tokens`` sum the reservations their intents recorded; ``unsized``
    counts those recorded before any call's size was known.
    """

    calls: int = 0
    cost_usd: float = 0.0
    tokens: int = 0
    unsized: int = 0

    def __add__(self, other: InFlightDoubt) -> InFlightDoubt:
        return InFlightDoubt(
            self.calls + other.calls,
            self.cost_usd + other.cost_usd,
            self.tokens + other.tokens,
            self.unsized + other.unsized,
        )

    def describe(self, largest_cost: float = 0.0) -> str:
        """``3 calls that may have been paid (about $0.0060)``."""
        cost = self.cost_usd + self.unsized * largest_cost
        noun = "call" if self.calls == 1 else "calls"
        return f"{self.calls} {noun} that may have been paid (about ${cost:.4f})"

    def to_json(self) -> dict[str, int | float]:
        """The checkpoint ``config.in_flight_before`` form."""
        return {
            "calls": self.calls,
            "cost_usd": self.cost_usd,
            "tokens": self.tokens,
            "unsized": self.unsized,
        }

    @classmethod
    def from_json(cls, value: object) -> InFlightDoubt:
        """Read ``config.in_flight_before`` (absent or malformed: none)."""
        if not isinstance(value, dict):
            return cls()

        def number(name: str, kind: type) -> Any:
            item = value.get(name)
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                return kind(0)
            return kind(item) if math.isfinite(item) and item >= 0 else kind(0)

        return cls(number("calls", int), number("cost_usd", float), number("tokens", int),
                   number("unsized", int))  # fmt: skip
