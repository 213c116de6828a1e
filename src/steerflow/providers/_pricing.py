"""What a call cost in USD: the operator's prices first, then the ``genai-prices`` table.

``genai-prices`` takes about half a second to import and holds the whole table in
memory, so it is imported only when a run needs a price it has no override for, and
then in a worker thread (:meth:`PriceTable.prepare`), never on the ``ctl``/``runs``
path.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from steerflow._values import shown
from steerflow.errors import InvalidValueError, UsageError
from steerflow.providers._base import Usage

__all__ = [
    "Price",
    "PriceLike",
    "PriceTable",
    "as_price",
    "as_prices",
    "parse_price_flag",
    "positive_price",
    "table_model",
]

#: The ``genai-prices`` provider id of each vendor prefix of a ``--model`` spec.
_VENDORS = {
    "openai": "openai",
    "anthropic": "anthropic",
    "codex": "openai",
    "claude-code": "anthropic",
}

_PER_TOKEN = 1_000_000  # prices are given per million tokens


@dataclass(frozen=True)
class Price:
    """USD per million input and output tokens (``--price MODEL=IN,OUT``).

    ``FlowOptions(prices={"openai/gpt-4o": Price(2.5, 10.0)})``; each is a finite
    number >= 0.

    Raises:
        InvalidValueError: A price that is not a finite number >= 0.
    """

    input: float
    output: float

    def __post_init__(self) -> None:
        # Set once here: a frozen dataclass keeps the checked floats.
        object.__setattr__(self, "input", positive_price(self.input, "Price.input"))
        object.__setattr__(self, "output", positive_price(self.output, "Price.output"))

    def cost(self, usage: Usage) -> float:
        """Input (cache traffic included, at the input price) and output tokens priced."""
        tokens_in, tokens_out = usage.input_tokens or 0, usage.output_tokens or 0
        return (tokens_in * self.input + tokens_out * self.output) / _PER_TOKEN


#: What ``FlowOptions(prices=...)`` takes for one model: a :class:`Price`, an ``(IN, OUT)``
#: pair, or the plan file's ``{"input": IN, "output": OUT}`` (USD per million tokens).
PriceLike: TypeAlias = "Price | tuple[float, float] | Mapping[str, float]"


def positive_price(value: object, where: str) -> float:
    """A price: a finite number >= 0; anything else is a usage error naming ``where``.

    Text is parsed (the ``--price`` flag's and a stored config's numbers); the API's
    :class:`Price` takes numbers.
    """
    if isinstance(value, bool):
        raise InvalidValueError(where, f"{shown(value)} is not a price (USD per million tokens)")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidValueError(
            where, f"{shown(value)} is not a number (USD per million tokens)"
        ) from None
    if not math.isfinite(number) or number < 0:
        raise InvalidValueError(where, f"{shown(value)} must be a finite number >= 0")
    return number


def as_price(value: object, name: str) -> Price:
    """One model's price as ``FlowOptions(prices=...)`` takes it (:data:`PriceLike`).

    Raises:
        InvalidValueError: Anything else, or a number that is not a price; names ``name``.
    """
    if isinstance(value, Price):
        return value
    if isinstance(value, Mapping):
        if set(value) != {"input", "output"}:
            raise InvalidValueError(
                name, f"{shown(dict(value))} needs exactly the keys 'input' and 'output'"
            )
        return Price(
            positive_price(value["input"], f"{name}['input']"),
            positive_price(value["output"], f"{name}['output']"),
        )
    if isinstance(value, Sequence) and not isinstance(value, str | bytes) and len(value) == 2:
        return Price(positive_price(value[0], f"{name}[0]"), positive_price(value[1], f"{name}[1]"))
    raise InvalidValueError(
        name,
        f"{shown(value)} is not a price: give steerflow.Price(IN, OUT), (IN, OUT) or "
        "{'input': IN, 'output': OUT} (USD per million input/output tokens)",
    )


def as_prices(prices: object, name: str = "prices") -> dict[str, Price]:
    """Prices by model (spec or name), each as :func:`as_price` takes it.

    Raises:
        InvalidValueError: Not a mapping, a model that is not a non-empty str, a bad price.
    """
    if not isinstance(prices, Mapping):
        raise InvalidValueError(name, f"{shown(prices)} is not a mapping of model to price")
    out: dict[str, Price] = {}
    for model, price in prices.items():
        if not isinstance(model, str) or not model.strip():
            raise InvalidValueError(name, f"the model {shown(model)} is not a non-empty str")
        out[model] = as_price(price, f"{name}[{model!r}]")
    return out


def parse_price_flag(text: str) -> tuple[str, Price]:
    """``MODEL=IN,OUT`` -> (MODEL, Price); a malformed one is a usage error naming --price."""
    model, sep, prices = text.rpartition("=")
    parts = prices.split(",")
    if not sep or not model.strip() or len(parts) != 2:
        raise UsageError(f"--price {text!r}: give MODEL=IN,OUT (USD per million tokens)")
    return model.strip(), Price(
        positive_price(parts[0].strip(), f"--price {model.strip()} input"),
        positive_price(parts[1].strip(), f"--price {model.strip()} output"),
    )


def table_model(spec: str) -> tuple[str, str] | None:
    """(provider id, model) under which ``genai-prices`` may know ``spec``, else None."""
    vendor, sep, model = spec.partition("/")
    provider = _VENDORS.get(vendor)
    return (provider, model) if sep and provider and model else None


class PriceTable:
    """Prices by ``--model`` spec: overrides (flag, plan key) first, then ``genai-prices``.

    An override's key is a whole spec (``openai/gpt-4o``, ``script:/p/s.yaml``) or the
    model name after the vendor prefix (``gpt-4o``).
    """

    def __init__(self, overrides: Mapping[str, Price] | None = None) -> None:
        self.overrides = dict(overrides or {})
        self._lock = threading.Lock()
        self._known: dict[str, bool] = {}

    def override_for(self, spec: str) -> Price | None:
        """The operator's price for ``spec``, if one was given."""
        if spec in self.overrides:
            return self.overrides[spec]
        model = spec.partition("/")[2]
        return self.overrides.get(model) if model else None

    def prepare(self, specs: Iterable[str]) -> None:
        """Look every spec up once (blocking: call it off the loop); imports the table."""
        for spec in specs:
            self.known(spec)

    def known(self, spec: str) -> bool:
        """Whether a call of ``spec`` can be priced (override, or the table knows it)."""
        if self.override_for(spec) is not None:
            return True
        with self._lock:
            if spec not in self._known:
                self._known[spec] = _table_cost(spec, Usage(input_tokens=1)) is not None
            return self._known[spec]

    def cost(self, spec: str | None, usage: Usage) -> float | None:
        """USD of one call: override, else what the provider reported, else the table."""
        override = self.override_for(spec) if spec else None
        if override is not None:
            return override.cost(usage)
        if usage.cost_usd is not None or spec is None:
            return usage.cost_usd
        if usage.input_tokens is None and usage.output_tokens is None:
            return None
        with self._lock:
            if self._known.get(spec) is False:
                return None
        return _table_cost(spec, usage)

    def priced(self, spec: str | None, usage: Usage | None) -> Usage | None:
        """``usage`` with its ``cost_usd`` filled in where a price is known."""
        if usage is None:
            return None
        cost = self.cost(spec, usage)
        if cost == usage.cost_usd:
            return usage
        return Usage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost_usd=cost,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
        )


def _table_cost(spec: str, usage: Usage) -> float | None:
    """``genai-prices``' figure for one call, or None when it does not know the model."""
    where = table_model(spec)
    if where is None:
        return None
    import genai_prices  # heavy: only here, and first from prepare() in a thread

    counts: dict[str, Any] = {
        name: value
        for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
        if (value := getattr(usage, name)) is not None
    }
    try:
        price = genai_prices.calc_price(
            genai_prices.Usage(**counts), where[1], provider_id=where[0]
        )
    except (LookupError, ValueError):  # unknown model, or inconsistent cache counts
        return None
    return float(price.total_price)
