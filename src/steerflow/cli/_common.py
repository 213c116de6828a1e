"""What the command modules share: the exit-code epilogs, option types and help texts.

Light on purpose: every command module imports it, and ``ctl`` must start fast.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

from steerflow._values import EXECUTORS, positive_seconds, positive_usd, some_text, whole_number
from steerflow.errors import quote_input
from steerflow.home import resolve_home

__all__ = [
    "ACCEPT_CONTRACT_HELP",
    "CTL_EPILOG",
    "EXIT_EPILOG",
    "MAX_OPS_HELP",
    "REACTIVE_HELP",
    "READ_EPILOG",
    "REFUSED_HOME",
    "RESOLVE_EPILOG",
    "RESULT_EPILOG",
    "RUNS_EPILOG",
    "RUN_EPILOG",
    "SECONDS",
    "TEXT",
    "UNEXPECTED",
    "USAGE",
    "USD",
    "budget_kw",
    "budget_line",
    "budget_options",
    "caps_text",
    "compact_options",
    "executor_kw",
    "executor_options",
    "flags_named",
    "home_of",
    "whole",
]

F = TypeVar("F", bound=Callable[..., Any])

# How a run ends other than completed or failed: shared by the global and the run tables.
_RUN_ENDINGS = """\
  75   stopped by an operator (ctl stop); completed work persisted and resumable
  76   budget reached; completed work persisted and resumable
  124  deadline reached; completed work persisted and resumable
  130  interrupted by SIGINT; completed work persisted
  143  terminated by SIGTERM; completed work persisted
"""

EXIT_EPILOG = (
    """\b
Exit codes:
  0    completed (for ctl: queued)
  1    a node failed, or an unexpected runtime error
  2    usage error (bad flags, bad plan file)
  3    refused: unknown/ambiguous id, session not running, kind not allowed,
       resume refused, checkpoint recovery refused, database busy
"""
    + _RUN_ENDINGS
)

# flow, play, agent and resume: the run's own outcomes, without ctl's "queued" or
# "kind not allowed" (which only a `ctl` call can get).
RUN_EPILOG = (
    """\b
Exit codes:
  0    completed
  1    a node failed, or an unexpected runtime error
  2    usage error (bad flags, bad plan file)
  3    refused: resume refused, checkpoint recovery refused, unknown/ambiguous
       run id (resume), home not writable or shared, database busy
"""
    + _RUN_ENDINGS
)

# The commands that only read or queue list just the codes they can return.
UNEXPECTED = "  1    an unexpected runtime error (e.g. an unreadable state DB)\n"
USAGE = "  2    usage error (bad flags or arguments)\n"
REFUSED_HOME = "       home not writable or shared, database busy\n"
CTL_EPILOG = (
    "\b\nExit codes:\n  0    queued (not yet applied: see `steerflow ctl status`)\n"
    + UNEXPECTED
    + "  2    usage error (bad arguments; ctl msg: empty text or text over 64 KiB)\n"
    "  3    refused: unknown/ambiguous id, session not running, kind not allowed,\n" + REFUSED_HOME
)
RESOLVE_EPILOG = (
    "\b\nExit codes:\n  0    resolved\n"
    + UNEXPECTED
    + USAGE
    + "  3    refused: unknown control id, control not in 'applying',\n"
    + REFUSED_HOME
)
READ_EPILOG = (
    "\b\nExit codes:\n  0    shown\n"
    + UNEXPECTED
    + USAGE
    + "  3    refused: unknown/ambiguous id,\n"
    + REFUSED_HOME
)
RUNS_EPILOG = (
    "\b\nExit codes:\n  0    listed\n" + UNEXPECTED + USAGE + "  3    refused:\n" + REFUSED_HOME
)
RESULT_EPILOG = (
    "\b\nExit codes:\n  0    the run completed; its result printed\n"
    "  1    the run did not complete (failed, running, interrupted, timed out):\n"
    "       what it recorded is printed\n"
    + USAGE
    + "  3    refused: unknown/ambiguous id, checkpoint missing or refused,\n"
    + REFUSED_HOME
)

REACTIVE_HELP = (
    "Let operations spawn new ones: off (default), all, or a comma-separated list of roles "
    "allowed to spawn."
)
ACCEPT_CONTRACT_HELP = (
    "When the state DB's copy of the run's artifact contract is missing (a lost or replaced "
    "DB, `db rebuild`), settle its recorded artifacts against the checkpoint's own copy "
    "(said in the output). Without it such a run is refused (exit 3) if it declares artifacts."
)
MAX_OPS_HELP = (
    "Total operation budget shared by plan and spawns: spawns allowed = max(0, N - plan size). "
    "0 or unset means no cap on the plan, but spawns are still capped at 20 to bound cost; "
    "every spawn refused by the budget is printed."
)


class _Checked(click.ParamType):  # type: ignore[type-arg]  # generic only from click 8.2
    """A flag's text parsed, then checked by the check the API runs (``steerflow._values``).

    So ``--timeout nan`` and ``FlowOptions(timeout_s=nan)`` are refused for the same
    reason; click names the flag, the API the parameter (decision 245).
    """

    def __init__(
        self, name: str, parse: Callable[[str], Any], noun: str, check: Callable[[Any, str], Any]
    ) -> None:
        self.name = name
        self._parse = parse
        self._noun = noun
        self._check = check

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from steerflow.errors import InvalidValueError

        try:
            parsed = self._parse(str(value))
        except ValueError:  # also an int past the interpreter's digit limit
            self.fail(f"{quote_input(value)} is not {self._noun}", param, ctx)
        flag = param.opts[0] if param is not None and param.opts else self.name
        try:
            return self._check(parsed, flag)
        except InvalidValueError as exc:
            self.fail(exc.problem, param, ctx)


def _integer(text: str) -> int:
    return int(text, 10)


def whole(least: int, most: int | None = None) -> click.ParamType:  # type: ignore[type-arg]
    """An integer flag from ``least`` to ``most``, checked as the API checks it."""

    def check(value: Any, name: str) -> int:
        return whole_number(value, name, least=least, most=most)

    return _Checked("integer", _integer, "an integer", check)


SECONDS = _Checked("seconds", float, "a number of seconds", positive_seconds)
USD = _Checked("usd", float, "a number of USD", positive_usd)
TEXT = _Checked("text", str, "text", some_text)


def budget_options(func: F) -> F:
    """``--max-cost``, ``--max-tokens``, ``--price`` (flow, play, resume, agent)."""
    func = click.option(
        "--price",
        "prices",
        multiple=True,
        metavar="MODEL=IN,OUT",
        help="USD per million input/output tokens for MODEL (a --model spec or its model "
        "name); overrides the genai-prices table, and prices models it does not know. "
        "Repeatable.",
    )(func)
    func = click.option(
        "--max-tokens",
        type=whole(1),
        metavar="N",
        help="Token cap (input + output) for the whole resume chain: once no call fits, "
        "admit nothing new, let running calls finish, persist, exit 76.",
    )(func)
    return click.option(
        "--max-cost",
        type=USD,
        metavar="USD",
        help="Spend cap in USD for the whole resume chain (the planner and every retry "
        "included): once no call fits, admit nothing new, let running calls finish, "
        "persist, exit 76. Every model needs a known price (or --price).",
    )(func)


def budget_kw(kw: dict[str, Any]) -> dict[str, Any]:
    """The FlowOptions/AgentOptions budget fields from the parsed flags."""
    from steerflow.providers._pricing import parse_price_flag

    return {
        "max_cost": kw.get("max_cost"),
        "max_tokens": kw.get("max_tokens"),
        "prices": dict(parse_price_flag(text) for text in kw.get("prices") or ()),
        # A refusal of these caps names the flags the operator typed.
        "names_flags": True,
    }


def caps_text(caps: dict[str, Any]) -> str:
    """``max_cost $0.05, max_tokens 1000`` for the caps that are set."""
    parts = [f"max_cost ${caps['max_cost']:g}"] if caps.get("max_cost") is not None else []
    if caps.get("max_tokens") is not None:
        parts.append(f"max_tokens {caps['max_tokens']}")
    return ", ".join(parts)


def budget_line(spent: str, caps: dict[str, Any], run_id: str) -> str:
    """The one line a budget stop prints: spent, the cap, and how to go on."""
    flags = " ".join(
        f"--{name.replace('_', '-')} MORE" for name in ("max_cost", "max_tokens") if caps.get(name)
    )
    return f"budget reached: {spent}; resume with: steerflow resume {run_id} {flags}"


def _compact_limit(key: str) -> click.ParamType:  # type: ignore[type-arg]
    """A version 3 compaction limit, checked against the same bounds as the plan-file key."""

    def check(value: Any, name: str) -> int:
        # Imported here, not at module load: `ctl` must not pay for the plan models.
        from steerflow.plan import COMPACT_BYTES, COMPACT_RECORDS

        bound = COMPACT_RECORDS if key == "records" else COMPACT_BYTES
        return whole_number(value, name, least=bound.least, most=bound.most, default=bound.default)

    return _Checked("integer", _integer, "an integer", check)


def executor_options(func: F) -> F:
    """``--executor``, ``--ray-address`` and ``--otel`` (flow, play, resume, agent)."""
    func = click.option(
        "--otel",
        is_flag=True,
        default=None,
        help="Send the run as an OpenTelemetry trace (extra 'otel'): run, nodes, model "
        "requests, tool calls; configured by the standard OTEL_* variables "
        "(OTEL_EXPORTER_OTLP_ENDPOINT...). Env: STEERFLOW_OTEL=1. See docs/tracing.md.",
    )(func)
    func = click.option(
        "--ray-address",
        metavar="ADDR",
        help="The Ray cluster's GCS address (HOST:PORT) for --executor ray. Default: Ray's "
        "own RAY_ADDRESS, else a cluster `ray start` runs on this host (never a new one).",
    )(func)
    return click.option(
        "--executor",
        type=click.Choice(list(EXECUTORS)),
        envvar="STEERFLOW_EXECUTOR",
        default="local",
        show_default=True,
        help="Where node calls run: in this process, or as Ray tasks (extra 'ray'; "
        "placement by roles.<role>.resources). Scheduling, steering and the checkpoint "
        "stay here. Env: STEERFLOW_EXECUTOR.",
    )(func)


def executor_kw(kw: dict[str, Any]) -> dict[str, Any]:
    """The FlowOptions/AgentOptions executor fields from the parsed flags."""
    return {
        "executor": kw.get("executor") or "local",
        "ray_address": kw.get("ray_address"),
        # None unless --otel: then STEERFLOW_OTEL decides (issue 45)
        "otel": True if kw.get("otel") else None,
    }


def compact_options(func: F) -> F:
    """``--compact-records`` / ``--compact-bytes`` (flow, play, resume)."""
    func = click.option(
        "--compact-bytes",
        type=_compact_limit("bytes"),
        metavar="N",
        help="Version 3 checkpoints: fold the journal into a new base once it holds N bytes "
        "(default: the plan's compact_bytes, else 8388608; a resume keeps its run's).",
    )(func)
    return click.option(
        "--compact-records",
        type=_compact_limit("records"),
        metavar="N",
        help="Version 3 checkpoints: fold the journal into a new base after N records "
        "(default: the plan's compact_records, else 128; a resume keeps its run's).",
    )(func)


def home_of(ctx: click.Context, *, create: bool = True) -> Path:
    """The home the root group's ``--home`` (or the environment) names (see resolve_home)."""
    return resolve_home(ctx.obj.get("home") if ctx.obj else None, create=create)


#: The flag that sets each ``FlowOptions``/``AgentOptions`` parameter: what a refusal of
#: options built from flags names (decision 245).
FLAG_OF = {
    "timeout_s": "--timeout",
    "max_ops": "--max-ops",
    "concurrency": "--concurrency",
    "checkpoint_version": "--checkpoint-version",
    "compact_records": "--compact-records",
    "compact_bytes": "--compact-bytes",
    "max_plan_entries": "--max-plan-entries",
    "synthesize": "--synthesize",
    "reactive": "--reactive",
    "max_cost": "--max-cost",
    "max_tokens": "--max-tokens",
    "executor": "--executor",
    "ray_address": "--ray-address",
    "max_turns": "--max-turns",
    "model": "--model",
    "task": "TASK",
}


@contextmanager
def flags_named() -> Iterator[None]:
    """Around options built from flags: a refusal names the flag, not the parameter.

    The option types refuse most bad values while parsing; this covers the checks only
    the options run (``--reactive a,,b``, a blank ``--ray-address``).
    """
    from steerflow.errors import InvalidValueError

    try:
        yield
    except InvalidValueError as exc:
        flag = FLAG_OF.get(exc.parameter)
        if flag is None:
            raise
        raise InvalidValueError(flag, exc.problem) from None
