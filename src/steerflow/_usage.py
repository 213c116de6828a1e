"""The token usage and cost of a call, as stored and shown (CONTRACT §11).

Layer 0, standard library only: the readers (`show`, `runs`, `ctl status`) sum stored
usage without importing the providers package (its vendors pull in asyncio and more).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["PARTIAL_MEMBERS", "USAGE_MEMBERS", "Usage", "cost_text"]

#: The members of a ``usage`` object in JSON (CONTRACT §11), in this order.
USAGE_MEMBERS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cost_usd",
)

#: What a total adds to its ``usage`` object when its ``cost_usd`` leaves out calls that
#: reported tokens but had no price (decision 249): ``cost_partial`` (true) and
#: ``unpriced_calls`` (how many). Absent from every other ``usage`` object.
PARTIAL_MEMBERS = ("cost_partial", "unpriced_calls")


@dataclass(frozen=True)
class Usage:
    """Token usage and cost of one call (or of several, summed), as far as reported.

    ``input_tokens`` counts every input token, cache reads and writes included (the
    convention of ``genai-prices``); ``cache_read_tokens``/``cache_write_tokens`` say
    how many of them were cache traffic. None is "not reported", never zero.

    A sum (``+``) also counts ``unpriced_calls``: the calls it holds that reported tokens
    but no cost. When some of its calls had a price and these did not, its ``cost_usd``
    is a partial total, and says so (:attr:`partial`, :data:`PARTIAL_MEMBERS`).
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    unpriced_calls: int = 0

    def to_json(self) -> dict[str, Any]:
        """The CONTRACT §11 ``usage`` object: every member, null where not reported.

        A partial cost adds ``cost_partial: true`` and ``unpriced_calls: N``.
        """
        out: dict[str, Any] = {name: getattr(self, name) for name in USAGE_MEMBERS}
        if self.partial:
            out |= {"cost_partial": True, "unpriced_calls": self.unpriced_calls}
        return out

    @property
    def partial(self) -> bool:
        """Whether ``cost_usd`` is a total that leaves out calls with no price."""
        return self.cost_usd is not None and self.unpriced_calls > 0

    def counted(self) -> Usage:
        """This usage as a sum: one call that reported tokens but no cost counts unpriced.

        A sum already counted (or any priced or empty usage) is returned as it is.
        """
        reported = self.input_tokens is not None or self.output_tokens is not None
        if self.unpriced_calls or self.cost_usd is not None or not reported:
            return self
        return replace(self, unpriced_calls=1)

    @property
    def tokens(self) -> int:
        """Input plus output tokens (what ``--max-tokens`` counts)."""
        return (self.input_tokens or 0) + (self.output_tokens or 0)

    def __add__(self, other: Usage) -> Usage:
        """Members summed; a member stays None only where neither side reported it.

        Each side counts as a sum (:meth:`counted`), so the unpriced calls add up.
        """
        return Usage(**{name: _plus(getattr(self, name), getattr(other, name))
                        for name in USAGE_MEMBERS},
                     unpriced_calls=self.counted().unpriced_calls
                     + other.counted().unpriced_calls)  # fmt: skip

    @classmethod
    def from_json(cls, data: object) -> Usage | None:
        """A stored ``usage`` object back (unknown or mistyped members are None)."""
        if not isinstance(data, dict):
            return None
        values: dict[str, Any] = {}
        for name in USAGE_MEMBERS:
            value = data.get(name)
            ok = isinstance(value, float | int) if name == "cost_usd" else isinstance(value, int)
            values[name] = value if ok and not isinstance(value, bool) else None
        if values["cost_usd"] is not None:
            values["cost_usd"] = float(values["cost_usd"])
        unpriced = data.get("unpriced_calls")
        if isinstance(unpriced, int) and not isinstance(unpriced, bool) and unpriced > 0:
            values["unpriced_calls"] = unpriced
        return cls(**values)


def cost_text(usage: object) -> str | None:
    """``$0.0120``, or ``$0.0120 (partial: 2 calls unpriced)``; None without a cost.

    ``usage`` is a ``usage`` JSON object (stored, or :meth:`Usage.to_json`).
    """
    if not isinstance(usage, Mapping):
        return None
    cost = usage.get("cost_usd")
    if isinstance(cost, bool) or not isinstance(cost, int | float):
        return None
    text = f"${cost:.4f}"
    unpriced = usage.get("unpriced_calls")
    if usage.get("cost_partial") is True and isinstance(unpriced, int) and unpriced > 0:
        text += f" (partial: {unpriced} call{'s' if unpriced != 1 else ''} unpriced)"
    return text


def _plus(a: Any, b: Any) -> Any:
    if a is None:
        return b
    return a if b is None else a + b
