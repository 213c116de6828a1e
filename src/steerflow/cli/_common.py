"""What the command modules share: the exit-code epilogs, option types and help texts.

Light on purpose: every command module imports it, and ``ctl`` must start fast.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

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
    "home_of",
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


class _Seconds(click.ParamType):  # type: ignore[type-arg]  # generic only from click 8.2
    """A positive, finite number of seconds (``nan`` and ``inf`` pass a FloatRange)."""

    name = "seconds"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{quote_input(value)} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{quote_input(value)} is not a positive, finite number", param, ctx)
        return seconds


SECONDS = _Seconds()


class _Usd(click.ParamType):  # type: ignore[type-arg]  # generic only from click 8.2
    """A positive, finite amount of USD (``--max-cost``)."""

    name = "usd"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            usd = float(value)
        except (TypeError, ValueError):
            self.fail(f"{quote_input(value)} is not a number of USD", param, ctx)
        if not math.isfinite(usd) or usd <= 0:
            self.fail(f"{quote_input(value)} is not a positive, finite number", param, ctx)
        return usd


USD = _Usd()


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
        type=click.IntRange(min=1),
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


class _CompactLimit(click.ParamType):  # type: ignore[type-arg]  # generic only from click 8.2
    """A version 3 compaction limit, checked against the same bounds as the plan-file key."""

    name = "integer"

    def __init__(self, key: str) -> None:
        self.key = key  # "records" or "bytes"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        # Imported here, not at module load: `ctl` must not pay for the plan models.
        from steerflow.plan import COMPACT_BYTES, COMPACT_RECORDS

        bound = COMPACT_RECORDS if self.key == "records" else COMPACT_BYTES
        try:
            number = int(str(value), 10)
        except ValueError:
            self.fail(f"{quote_input(value)} is not an integer", param, ctx)
        if not bound.least <= number <= bound.most:
            self.fail(
                f"{number} is out of range: give {bound.least}..{bound.most} "
                f"(default {bound.default})",
                param,
                ctx,
            )
        return number


def executor_options(func: F) -> F:
    """``--executor`` and ``--ray-address`` (flow, play, resume, agent)."""
    func = click.option(
        "--ray-address",
        metavar="ADDR",
        help="The Ray cluster's GCS address (HOST:PORT) for --executor ray. Default: Ray's "
        "own RAY_ADDRESS, else a cluster `ray start` runs on this host (never a new one).",
    )(func)
    return click.option(
        "--executor",
        type=click.Choice(["local", "ray"]),
        envvar="STEERFLOW_EXECUTOR",
        default="local",
        show_default=True,
        help="Where node calls run: in this process, or as Ray tasks (extra 'ray'; "
        "placement by roles.<role>.resources). Scheduling, steering and the checkpoint "
        "stay here. Env: STEERFLOW_EXECUTOR.",
    )(func)


def executor_kw(kw: dict[str, Any]) -> dict[str, Any]:
    """The FlowOptions/AgentOptions executor fields from the parsed flags."""
    return {"executor": kw.get("executor") or "local", "ray_address": kw.get("ray_address")}


def compact_options(func: F) -> F:
    """``--compact-records`` / ``--compact-bytes`` (flow, play, resume)."""
    func = click.option(
        "--compact-bytes",
        type=_CompactLimit("bytes"),
        metavar="N",
        help="Version 3 checkpoints: fold the journal into a new base once it holds N bytes "
        "(default: the plan's compact_bytes, else 8388608; a resume keeps its run's).",
    )(func)
    return click.option(
        "--compact-records",
        type=_CompactLimit("records"),
        metavar="N",
        help="Version 3 checkpoints: fold the journal into a new base after N records "
        "(default: the plan's compact_records, else 128; a resume keeps its run's).",
    )(func)


def home_of(ctx: click.Context, *, create: bool = True) -> Path:
    """The home the root group's ``--home`` (or the environment) names (see resolve_home)."""
    return resolve_home(ctx.obj.get("home") if ctx.obj else None, create=create)
