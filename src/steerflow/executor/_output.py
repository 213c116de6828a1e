"""Typed outputs (issue 40 item 2): a reply checked against the node's ``output_schema``.

The provider is asked with the schema on the request (each vendor asks for structured
output its own way: docs/outputs.md). What it returns is decoded (the provider's
``output`` when it gave one, else its text parsed as JSON) and validated with
``jsonschema``; a reply that does not fit is asked again, with the validation error as a
new user message after the reply, at most ``Operation.output_reasks`` times (decisions
283, 284). Each new ask is a call like the first: the lease fence, a write-ahead intent,
the budget's room and admission are checked before it leaves, and every reply is charged
as it returns. The node's response is then the output as JSON text, so dependents, edge
conditions and ``result`` read the same JSON the checkpoint records beside it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from steerflow._usage import Usage
from steerflow.errors import ProviderError
from steerflow.executor._budget import BUDGET_REASON, Meter
from steerflow.executor._graph import Operation
from steerflow.providers import Message, ProviderRequest, ProviderResponse

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

__all__ = ["CHARGED", "DEFAULT_REASKS", "ask_structured", "decode", "output_json", "problem_of"]

#: Re-asks of a reply that does not fit its schema when the node gives no ``retry``.
DEFAULT_REASKS = 1
#: ``Operation.extra`` flag: the call's usage is already charged, reply by reply.
CHARGED = "charged"
#: The longest validation problem quoted back to the model and into the node's error.
_PROBLEM_CHARS = 500

Send = Callable[[ProviderRequest], Awaitable[ProviderResponse | None]]


class _Run(Protocol):
    """What a re-ask reads of the executor (``FlowExecutor``)."""

    admission_open: bool
    meter: Meter | None

    def close_admission(self, reason: str) -> None: ...


def _validator(schema: dict[str, Any]) -> Validator:
    from jsonschema import Draft202012Validator
    from jsonschema.validators import validator_for

    cls = validator_for(schema, default=Draft202012Validator)
    return cls(schema)


def decode(response: ProviderResponse) -> tuple[object, str | None]:
    """The reply's structured value, or ``(None, why it is not JSON)``.

    A provider's decoded ``output`` wins; else the text, without a Markdown code fence
    around it (models add one even when told not to), parsed as JSON.
    """
    if response.output is not None:
        return response.output, None
    text = response.text.strip()
    if text.startswith("```") and text.endswith("```") and "\n" in text:
        text = text[text.index("\n") + 1 : -3].strip()
    try:
        return json.loads(text, parse_constant=_not_json), None
    except ValueError as exc:
        shown = response.text if len(response.text) <= 80 else response.text[:80] + "…"
        return None, f"the reply is not JSON ({exc}): {shown!r}"


def _not_json(name: str) -> object:
    """``NaN`` and ``Infinity``, which Python's parser takes and JSON (and a digest) does not."""
    raise ValueError(f"{name} is not a JSON value")


def problem_of(validator: Validator, value: object) -> str | None:
    """The most relevant way ``value`` fails the schema (where, and what), or None."""
    from jsonschema.exceptions import best_match

    error = best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    text = f"at {'$' + where if where else 'the top level'}: {error.message}"
    return text if len(text) <= _PROBLEM_CHARS else text[:_PROBLEM_CHARS] + "…"


def _checked(validator: Validator, response: ProviderResponse) -> tuple[object, str | None]:
    """The reply decoded and validated: its value, and what is wrong with it (or None)."""
    value, problem = decode(response)
    return value, problem if problem is not None else problem_of(validator, value)


def output_json(value: object) -> str:
    """The output as the node's response text: JSON, compact, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _again(request: ProviderRequest, reply: str, problem: str) -> ProviderRequest:
    """The next ask: the conversation so far, the reply, and what was wrong with it."""
    history = (*request.history, Message("user", request.instruction), Message("assistant", reply))
    feedback = (
        f"Your reply does not match the required JSON Schema {problem}. "
        "Reply again with only the JSON value, matching the schema."
    )
    return dataclasses.replace(request, history=history, instruction=feedback)


def _room(run: _Run, op: Operation) -> bool:
    """Whether one more call of ``op`` may leave: admission open, the budget's room."""
    if not run.admission_open:
        return False
    meter = run.meter
    if meter is not None:
        if not meter.room():
            run.close_admission(BUDGET_REASON)
            return False
        meter.reserve(op.node_id)
    return True


def _charge(run: _Run, op: Operation, usage: Usage | None, total: Usage | None) -> Usage | None:
    """Price one reply, count it (its reservation ends), and add it to the node's total."""
    meter = run.meter
    priced = meter.charge(op.model, usage, op.node_id) if meter is not None else usage
    if priced is None:
        return total
    return priced if total is None else total + priced


async def ask_structured(
    run: _Run, op: Operation, request: ProviderRequest, send: Send
) -> ProviderResponse | None:
    """Ask ``request`` (its ``output_schema`` set) until a reply fits, or fail the node.

    Returns:
        The reply whose ``output`` is the validated value and whose text is its JSON, with
        the usage of every call made; None when a call could not leave (the fence, a
        closed admission or budget): the node stays pending, as for any held call.

    Raises:
        ProviderError: Still not valid after ``op.output_reasks`` re-asks; names the
            problem. A failed call's own error passes through unchanged.
    """
    assert request.output_schema is not None
    # Off the loop: jsonschema reads its meta-schemas from files on first use.
    validator = await asyncio.to_thread(_validator, request.output_schema)
    total: Usage | None = None
    op.extra[CHARGED] = True  # every reply is charged here, as it returns
    try:
        for number in range(1 + max(0, op.output_reasks)):
            if number and not _room(run, op):
                return None
            response = await send(request)
            if response is None:
                return None
            total = _charge(run, op, response.usage, total)
            value, problem = await asyncio.to_thread(_checked, validator, response)
            if problem is None:
                try:
                    text = output_json(value)
                except ValueError as exc:  # NaN or Infinity from a provider's decoder
                    problem = f"the reply is not JSON ({exc})"
                else:
                    response.output, response.text, response.usage = value, text, total
                    return response
            request = _again(request, response.text or repr(value), problem)
    finally:
        op.usage = total  # what the calls cost, whatever came of them
    calls = 1 + max(0, op.output_reasks)
    noun = "call" if calls == 1 else "calls"
    raise ProviderError(
        f"node {op.key!r}: the reply does not match its output_schema after {calls} {noun} "
        f"({problem})"
    )
