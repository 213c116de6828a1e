"""The token usage and cost of a call, as stored and shown (CONTRACT §11).

Layer 0, standard library only: the readers (`show`, `runs`, `ctl status`) sum stored
usage without importing the providers package (its vendors pull in asyncio and more).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["USAGE_MEMBERS", "Usage"]

#: The members of a ``usage`` object in JSON (CONTRACT §11), in this order.
USAGE_MEMBERS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cost_usd",
)


@dataclass(frozen=True)
class Usage:
    """Token usage and cost of one call (or of several, summed), as far as reported.

    ``input_tokens`` counts every input token, cache reads and writes included (the
    convention of ``genai-prices``); ``cache_read_tokens``/``cache_write_tokens`` say
    how many of them were cache traffic. None is "not reported", never zero.
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None

    def to_json(self) -> dict[str, int | float | None]:
        """The CONTRACT §11 ``usage`` object: every member, null where not reported."""
        return {name: getattr(self, name) for name in USAGE_MEMBERS}

    @property
    def tokens(self) -> int:
        """Input plus output tokens (what ``--max-tokens`` counts)."""
        return (self.input_tokens or 0) + (self.output_tokens or 0)

    def __add__(self, other: Usage) -> Usage:
        """Members summed; a member stays None only where neither side reported it."""
        return Usage(**{name: _plus(getattr(self, name), getattr(other, name))
                        for name in USAGE_MEMBERS})  # fmt: skip

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
        return cls(**values)


def _plus(a: Any, b: Any) -> Any:
    if a is None:
        return b
    return a if b is None else a + b
