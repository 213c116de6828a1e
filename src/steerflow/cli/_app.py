"""The ``steerflow`` command line: a thin layer over the library API."""

from __future__ import annotations

import io
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from steerflow.cli._output import emit_json, emit_text, printable, run_with_signals, warn
from steerflow.errors import ExitCode, SteerflowError, UsageError, quote_input
from steerflow.home import resolve_home

if TYPE_CHECKING:
    from steerflow.orchestrate import FlowOptions, FlowResult

# The flow machinery (executor, providers, checkpoint, rich) is imported inside the
# commands that run flows: `ctl` is called in tight loops from other terminals and
# scripts, and starts about three times faster without it.

__all__ = ["app", "cli_exit", "main"]

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
_UNEXPECTED = "  1    an unexpected runtime error (e.g. an unreadable state DB)\n"
_USAGE = "  2    usage error (bad flags or arguments)\n"
_REFUSED_HOME = "       home not writable or shared, database busy\n"
CTL_EPILOG = (
    "\b\nExit codes:\n  0    queued (not yet applied: see `steerflow ctl status`)\n"
    + _UNEXPECTED
    + "  2    usage error (bad arguments; ctl msg: empty text or text over 64 KiB)\n"
    "  3    refused: unknown/ambiguous id, session not running, kind not allowed,\n" + _REFUSED_HOME
)
RESOLVE_EPILOG = (
    "\b\nExit codes:\n  0    resolved\n"
    + _UNEXPECTED
    + _USAGE
    + "  3    refused: unknown control id, control not in 'applying',\n"
    + _REFUSED_HOME
)
READ_EPILOG = (
    "\b\nExit codes:\n  0    shown\n"
    + _UNEXPECTED
    + _USAGE
    + "  3    refused: unknown/ambiguous id,\n"
    + _REFUSED_HOME
)
RUNS_EPILOG = (
    "\b\nExit codes:\n  0    listed\n" + _UNEXPECTED + _USAGE + "  3    refused:\n" + _REFUSED_HOME
)
RESULT_EPILOG = (
    "\b\nExit codes:\n  0    the run completed; its result printed\n"
    "  1    the run did not complete (failed, running, interrupted, timed out):\n"
    "       what it recorded is printed\n"
    + _USAGE
    + "  3    refused: unknown/ambiguous id, checkpoint missing or refused,\n"
    + _REFUSED_HOME
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
        type=_Usd(),
        metavar="USD",
        help="Spend cap in USD for the whole resume chain (the planner and every retry "
        "included): once no call fits, admit nothing new, let running calls finish, "
        "persist, exit 76. Every model needs a known price (or --price).",
    )(func)


def _budget_kw(kw: dict[str, Any]) -> dict[str, Any]:
    """The FlowOptions/AgentOptions budget fields from the parsed flags."""
    from steerflow.providers._pricing import parse_price_flag

    return {
        "max_cost": kw.get("max_cost"),
        "max_tokens": kw.get("max_tokens"),
        "prices": dict(parse_price_flag(text) for text in kw.get("prices") or ()),
    }


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


def _home(ctx: click.Context) -> Path:
    return resolve_home(ctx.obj.get("home") if ctx.obj else None)


def run_options(func: F) -> F:
    """Options shared by ``flow`` and ``play`` (defined once)."""
    decorators = [
        click.option(
            "--model",
            "model",
            metavar="SPEC",
            help="Model: echo, echo:delay=S, script:PATH, openai/M, anthropic/M, claude-code/M, codex/M. Default: the plan's, else echo.",
        ),
        click.option("--reactive", metavar="off|all|ROLE,...", help=REACTIVE_HELP),
        click.option("--max-ops", type=click.IntRange(min=0), metavar="N", help=MAX_OPS_HELP),
        click.option(
            "--concurrency",
            type=click.IntRange(1, 256),
            metavar="N",
            help="Operations running at once (default: the plan's, else 4).",
        ),
        click.option(
            "--save",
            type=click.Path(file_okay=False, path_type=Path),
            metavar="DIR",
            help="Artifact root for this run (default: <run dir>/artifacts); an existing DIR "
            "keeps its mode, directories steerflow creates are 0700.",
        ),
        click.option(
            "--timeout",
            "timeout",
            type=SECONDS,
            metavar="SECONDS",
            help=(
                "Deadline: admit nothing new after it, let running model calls finish, stop "
                "agent workers (their nodes rerun on resume), persist, exit 124."
            ),
        ),
        click.option(
            "--checkpoint-version",
            type=click.Choice(["2", "3"]),
            default="3",
            show_default=True,
            help="Checkpoint format: 3 = base + journal, 2 = full snapshot per outcome.",
        ),
        compact_options,
        budget_options,
        click.option(
            "--max-plan-entries",
            type=click.IntRange(min=1),
            default=1000,
            show_default=True,
            metavar="N",
            help="Most entries a plan may have: a larger plan file or playbook exits 2, a larger "
            "planner reply is an invalid reply (one retry); plans are never cut.",
        ),
        click.option(
            "--allow-agent-workers",
            is_flag=True,
            help="Let a plan file or playbook run the claude-code/codex workers it names "
            "(they execute code here); not needed for a worker given with --model.",
        ),
        click.option(
            "--synthesize",
            metavar="TEXT",
            help="Finish with a synthesis node that receives every worker's final result "
            "(replaces the instruction of the plan's synthesis, keeps its model). Required "
            "work: a run whose deadline or stop withholds it is timed_out/stopped, and a "
            "resume computes it from the recorded results.",
        ),
        click.option("--dry-run", is_flag=True, help="Plan and show the graph; run nothing."),
        click.option(
            "--show-graph",
            is_flag=True,
            help="Print the DAG and write graph.mmd (Mermaid) into the run directory.",
        ),
        click.option(
            "--json",
            "as_json",
            is_flag=True,
            help="Print one JSON object on stdout (progress stays on stderr).",
        ),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


@click.group(epilog=EXIT_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--home",
    type=click.Path(file_okay=False),
    envvar="STEERFLOW_HOME",
    help="Home directory (default: $STEERFLOW_HOME or ~/.steerflow).",
)
@click.option(
    "--state-db",
    "state_db",
    metavar="URL",
    help="State database URL: sqlite:///REL/PATH (relative to the current directory), "
    "sqlite:////ABS/PATH, or postgresql://HOST/DB (extra 'postgres'; default: "
    "$STEERFLOW_STATE_DB_URL, else <home>/state.db). A malformed URL is exit 2.",
)
@click.version_option(package_name="steerflow")
@click.pass_context
def app(ctx: click.Context, home: str | None, state_db: str | None) -> None:
    """Run LLM-agent flows as a dependency graph you can steer live and resume faithfully.

    \b
    Quick start:
      steerflow play demo                 # bundled playbook, offline echo model
      steerflow runs                      # recent runs
      steerflow show RUN_OR_SESSION       # live node status
      steerflow show RUN NODE             # one node: instruction as sent, response
      steerflow result RUN                # the run's result
      steerflow ctl pause SESSION         # from another terminal
    """
    ctx.ensure_object(dict)
    ctx.obj["home"] = home
    from steerflow.state import STATE_DB_URL_ENV, normalize_state_db_url

    url = state_db if state_db is not None else os.environ.get(STATE_DB_URL_ENV, "").strip()
    if state_db is not None or url:
        # Checked before any command starts (a bad URL is exit 2 in one line), and through
        # the environment, so the flow's child processes use the same database.
        os.environ[STATE_DB_URL_ENV] = normalize_state_db_url(url)


def _flow_options(**kw: Any) -> FlowOptions:
    from steerflow.orchestrate import FlowOptions

    return FlowOptions(
        prompt=kw.get("prompt"),
        plan_path=kw.get("plan"),
        playbook=kw.get("playbook"),
        model=kw.get("model"),
        reactive=kw.get("reactive"),
        max_ops=kw.get("max_ops"),
        concurrency=kw.get("concurrency"),
        save=kw.get("save"),
        timeout_s=kw.get("timeout"),
        checkpoint_version=int(kw.get("checkpoint_version") or 3),
        dry_run=bool(kw.get("dry_run")),
        show_graph=bool(kw.get("show_graph")),
        kind=kw.get("kind", "flow"),
        max_plan_entries=int(kw.get("max_plan_entries") or 1000),
        compact_records=kw.get("compact_records"),
        compact_bytes=kw.get("compact_bytes"),
        allow_agent_workers=bool(kw.get("allow_agent_workers")),
        synthesize=kw.get("synthesize"),
        **_budget_kw(kw),
    )


def execute(home: Path, options: FlowOptions, *, as_json: bool) -> int:
    """Run a flow with signal handling and print its result; returns the exit code."""
    from steerflow.cli._progress import Progress
    from steerflow.executor import EventBus
    from steerflow.orchestrate import FlowRun

    events = EventBus()
    progress = Progress(quiet=False)
    events.subscribe(progress)
    run = FlowRun(options, home=home, events=events)

    try:
        result = run_with_signals(run.run, run.request_stop)
    finally:
        progress.close()  # the last summary of a run whose progress was summarised
    from steerflow.cli._reading import flow_result_text

    print_result(result, as_json=as_json, result_text=flow_result_text(home, result.run_dir))
    return int(result.exit_code)


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


def print_result(result: FlowResult, *, as_json: bool, result_text: str | None = None) -> None:
    """Print a flow result as JSON or as a short human summary ending with the run's result."""
    if result.graph_text:
        warn("graph:\n" + result.graph_text)
    for warning in result.warnings:
        warn(f"warning: {printable(warning)}")
    report = result.checkpoint_recovery or {}
    if report and report.get("status") != "clean":
        warn(
            f"checkpoint recovery: {report.get('status')}: {report.get('records_applied')} "
            f"journal records applied up to seq {report.get('last_seq')}, "
            f"{report.get('discarded_tail_bytes')} torn tail bytes discarded, "
            f"{report.get('stale_generation_records')} stale records ignored"
        )
    for rejection in result.spawn_rejections:
        warn(
            f"spawn rejected: {printable(rejection['agent_id'] or '<none>')} from "
            f"{printable(rejection['emitter'])}: {rejection['reason']} "
            f"({printable(rejection['detail'])})"
        )
    if result.budget_exhausted is not None and result.run_id:
        warn(budget_line(result.budget_exhausted["line"], result.budget, result.run_id))
    if as_json:
        emit_json({**result.to_json(), "result": result_text})
        return
    lines = [f"status: {result.status}"]
    if result.run_id:
        lines.append(f"run: {result.run_id}  session: {result.session_id}")
    if result.checkpoint.get("path"):
        from steerflow.cli._reading import fmt_bytes

        saved = "saved" if result.checkpoint.get("persisted") else "NOT persisted"
        written = fmt_bytes(result.checkpoint.get("bytes_written"))
        lines.append(
            f"checkpoint: {result.checkpoint['path']} (v{result.checkpoint['version']}, {saved}, "
            f"{written} written)"
        )
        if result.checkpoint.get("error"):
            lines.append(f"checkpoint error: {printable(result.checkpoint['error'])}")
    if result.resumed_from:
        lines.append(f"resumed from session: {result.resumed_from}")
    if result.stopped_by is not None:
        how = "ctl stop --now" if result.stopped_by.get("now") else "ctl stop"
        why = result.stopped_by.get("reason")
        # A stop that withheld nothing did not stop the run (decision 104): say so.
        what = "stop requested" if result.status == "completed" else "stopped by an operator"
        lines.append(
            f"{what} ({how}, control {result.stopped_by.get('control_id')})"
            + (f": {printable(why)}" if why else "")
        )
    from steerflow.cli._reading import node_list

    lines += node_list(result.nodes, result.run_id)
    if result.status in ("timed_out", "interrupted", "stopped") and result.run_id:
        ckpt_path = result.checkpoint.get("path")
        if ckpt_path and Path(ckpt_path).is_file():
            lines.append(f"resume with: steerflow resume {result.run_id}")
        else:  # stopped while planning, before a plan existed: the warning says why
            said = [w for w in result.warnings if w.startswith("nothing to resume:")]
            lines.append(said[0] if said else "nothing to resume: no checkpoint was saved")
    if result_text is not None:
        from steerflow.cli._reading import result_tail

        lines += result_tail(result_text, result.run_id)
    emit_text("\n".join(lines))


@app.command(epilog=RUN_EPILOG)
@click.argument("prompt", required=False)
@click.option(
    "--plan",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Run this plan file (YAML or JSON) instead of asking the planner.",
)
@click.option(
    "-p",
    "--playbook",
    metavar="NAME",
    help="Run a playbook: <home>/playbooks/NAME.yaml, then the bundled ones.",
)
@run_options
@click.pass_context
def flow(ctx: click.Context, /, **kw: Any) -> int:
    """Plan PROMPT with the model (or take --plan/--playbook), then run it."""
    if kw["plan"] is not None and kw["playbook"] is not None:
        raise UsageError("give either --plan or --playbook, not both")
    kw["kind"] = "play" if kw["playbook"] else "flow"
    return execute(_home(ctx), _flow_options(**kw), as_json=kw["as_json"])


@app.command(epilog=RUN_EPILOG)
@click.argument("name")
@click.argument("prompt", required=False)
@run_options
@click.pass_context
def play(ctx: click.Context, /, name: str, **kw: Any) -> int:
    """Run playbook NAME (sugar for: flow -p NAME [PROMPT])."""
    kw.update(playbook=name, kind="play")
    return execute(_home(ctx), _flow_options(**kw), as_json=kw["as_json"])


@app.command(epilog=RUN_EPILOG)
@click.argument("task")
@click.option(
    "--model",
    "model",
    metavar="SPEC",
    default="echo",
    show_default=True,
    help="The agent: claude-code/M, codex/M, openai/M, anthropic/M, echo, script:PATH.",
)
@click.option(
    "--max-turns",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    metavar="N",
    help="Most turns (TASK is turn 1); messages still pending when it "
    "is reached are stamped rejected:max-turns.",
)
@click.option(
    "--timeout",
    type=SECONDS,
    metavar="SECONDS",
    help="Deadline: start no new turn after it (an agent worker's turn is stopped), "
    "persist, exit 124.",
)
@click.option(
    "--save",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Artifact root (default: <run dir>/artifacts); every turn runs in DIR/agent.",
)
@budget_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.pass_context
def agent(ctx: click.Context, /, task: str, model: str, max_turns: int, timeout: float | None,
          save: Path | None, as_json: bool, **budget: Any) -> int:  # fmt: skip
    """Run one agent on TASK; `ctl msg` corrections start the next turn when a turn ends.

    After each turn the operator messages queued meanwhile (`steerflow ctl msg SESSION
    TEXT`, at most once each) become the next turn's prompt under an [OPERATOR STEER]
    block; with none queued the agent is done. claude-code continues its own session
    (--resume), other models get the earlier turns. `ctl stop` ends it after the current
    turn (--now: cancels the turn), exit 75; `ctl pause|resume` are refused (flow-only).
    Each finished turn is checkpointed as turn-<n>; `steerflow resume RUN` continues.
    """
    from steerflow.cli._agent import execute_agent
    from steerflow.orchestrate._agent_options import AgentOptions

    if not task.strip():
        raise UsageError("agent needs a non-empty TASK")
    options = AgentOptions(task=task, model=model, max_turns=max_turns, timeout_s=timeout,
                           save=save, **_budget_kw(budget))  # fmt: skip
    return execute_agent(_home(ctx), options, as_json=as_json)


@app.command(epilog=RUN_EPILOG)
@click.argument("target")
@click.option(
    "--retry-failed",
    is_flag=True,
    help="Run failed nodes again (this repeats their side effects). Spawned nodes recorded below a re-run parent are rebuilt, never dropped: completed ones are replayed, failed ones run again after their parent.",
)
@click.option(
    "--allow-degraded-context",
    is_flag=True,
    help="Let nodes whose inherited conversation cannot be restored run with an empty branch (named in the result).",
)
@click.option(
    "--dry-run", is_flag=True, help="Check the checkpoint and show what would run; run nothing."
)
@click.option(
    "--show-graph",
    is_flag=True,
    help="Print the DAG and write graph.mmd into the new run directory.",
)
@click.option(
    "--timeout",
    type=SECONDS,
    metavar="SECONDS",
    help="Deadline for the resumed run (same rules as flow --timeout).",
)
@click.option(
    "--fork",
    is_flag=True,
    help="Branch on purpose: resume TARGET even though another resume holds it or already "
    "continued it. Its pending nodes run, and are paid for, again; without --fork such a "
    "resume is refused (exit 3) naming the holder session or the newest run of the chain. "
    "Never while TARGET itself still runs.",
)
@click.option(
    "--rerun-unsettled",
    is_flag=True,
    help="Run again the completed nodes whose recorded artifacts no longer match (missing, "
    "not a regular file, other size or digest), and everything downstream of them, instead "
    "of refusing (exit 3); each is named in the progress and the result.",
)
@click.option(
    "--save",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="The artifact root is always the source run's (also when it used --save); "
    "another DIR is a usage error (exit 2).",
)
@click.option(
    "--accept-checkpoint-contract",
    is_flag=True,
    help=ACCEPT_CONTRACT_HELP,
)
@click.option(
    "--redeliver-claimed",
    is_flag=True,
    help="Re-queue into the resumed run the operator messages a dead process had claimed "
    "(left 'applying') but not delivered, each as a new message; the old row becomes "
    "abandoned:redelivered:<new id>. Without it they stay lost (at most once) and are "
    "listed as warnings and in stranded_messages. Messages never claimed are re-queued "
    "either way.",
)
@compact_options
@budget_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.pass_context
def resume(ctx: click.Context, /, target: str, **kw: Any) -> int:
    """Resume a run from its checkpoint: replay what finished, run the rest, or refuse.

    TARGET is a run directory, a run id or unambiguous prefix, or a session,
    invocation or play id (or prefix). Model, prompt, plan, budgets, reactive policy,
    concurrency and save dir come from the checkpoint; the new run gets its own session
    and run directory and records resumed_from.

    One resume per run: while another resume of TARGET runs, or once one has saved a
    checkpoint, a resume of TARGET is refused (exit 3) naming the session holding it or
    the newest run of the chain to resume instead. --fork branches on purpose.
    A run that is still running (live owner) is refused too, --fork or not: stop it
    (SIGINT) or let it finish first.

    Completed nodes that recorded artifacts are settled first: each file is looked for
    under the source run's artifact root and compared by size and BLAKE2b digest against
    the contract that run persisted. A mismatch refuses the resume (exit 3) naming node,
    file, expected and found, unless --rerun-unsettled (see `steerflow verify`).

    Operator messages a dead process of the chain left behind are listed (warnings, and
    stranded_messages in --json): text, when sent, who had claimed it. Ones never
    claimed are re-queued into the resumed run; claimed ones only with
    --redeliver-claimed.
    """
    from steerflow.orchestrate import FlowOptions, prepare_resume

    home = _home(ctx)
    if (agent_exit := _resume_agent(home, target, kw)) is not None:
        return agent_exit
    seed = prepare_resume(
        home,
        target,
        retry_failed=kw["retry_failed"],
        allow_degraded_context=kw["allow_degraded_context"],
        fork=kw["fork"],
        rerun_unsettled=kw["rerun_unsettled"],
        save=kw["save"],
        accept_checkpoint_contract=kw["accept_checkpoint_contract"],
        redeliver_claimed=kw["redeliver_claimed"],
    )
    options = FlowOptions(
        resume=seed,
        dry_run=kw["dry_run"],
        show_graph=kw["show_graph"],
        timeout_s=kw["timeout"],
        checkpoint_version=3,
        compact_records=kw["compact_records"],
        compact_bytes=kw["compact_bytes"],
        **_budget_kw(kw),
    )
    return execute(home, options, as_json=kw["as_json"])


def _resume_agent(home: Path, target: str, kw: dict[str, Any]) -> int | None:
    """Resume ``target`` as an agent run (issue 19); ``None`` when it is not one."""
    from steerflow.orchestrate._agent_resume import agent_resume_source, prepare_agent_resume

    run = agent_resume_source(home, target)
    if run is None:
        return None
    for flag in (
        "allow_degraded_context",
        "rerun_unsettled",
        "show_graph",
        "accept_checkpoint_contract",
    ):
        if kw.get(flag):
            raise UsageError(f"--{flag.replace('_', '-')} does not apply to an agent run")
    from steerflow.cli._agent import execute_agent, print_agent_dry_run
    from steerflow.orchestrate._agent_options import AgentOptions

    seed = prepare_agent_resume(
        home,
        run,
        retry_failed=kw["retry_failed"],
        fork=kw["fork"],
        redeliver_claimed=kw["redeliver_claimed"],
    )
    if kw.get("dry_run"):
        return print_agent_dry_run(seed, as_json=kw["as_json"])
    options = AgentOptions(resume=seed, timeout_s=kw["timeout"], **_budget_kw(kw))
    return execute_agent(home, options, as_json=kw["as_json"])


VERIFY_EPILOG = (
    "\b\nExit codes:\n  0    settled: every recorded artifact is there as recorded\n"
    + _UNEXPECTED
    + _USAGE
    + "  3    unsettled (listed), or refused: unknown/ambiguous id, checkpoint missing or\n"
    "       refused, artifact contract missing, unreadable or disagreeing,\n" + _REFUSED_HOME
)


@app.command(epilog=VERIFY_EPILOG)
@click.argument("target")
@click.option("--accept-checkpoint-contract", is_flag=True, help=ACCEPT_CONTRACT_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.pass_context
def verify(ctx: click.Context, target: str, accept_checkpoint_contract: bool, as_json: bool) -> int:
    """Check a run's recorded artifacts, byte for byte, without resuming it.

    TARGET is as for resume and show. Every completed node that recorded artifacts is
    checked against the artifact contract its run persisted: each file must still be a
    regular file under the run's artifact root with the recorded size and BLAKE2b
    digest. Prints one line per file that does not match (expected vs found).
    """
    from steerflow.cli._reading import show_verify

    return show_verify(
        _home(ctx), target, as_json=as_json, accept_checkpoint_contract=accept_checkpoint_contract
    )


@app.command(epilog=RUNS_EPILOG)
@click.option("--all", "show_all", is_flag=True, help="List every run, not only the 20 newest.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.pass_context
def runs(ctx: click.Context, show_all: bool, as_json: bool) -> int:
    """List runs, newest first (a dead run shows as interrupted)."""
    from steerflow.cli._views import resume_links, runs_view

    view = runs_view(_home(ctx), limit=None if show_all else 20)
    if as_json:
        emit_json(view)
    elif not view["runs"]:
        emit_text("no runs yet: try `steerflow play demo`")
    else:
        from steerflow.cli._reading import fmt_duration

        header = f"{'RUN':<24} {'STATUS':<12} {'KIND':<5} {'DURATION':>9}  SESSION"
        emit_text(
            "\n".join(
                [header]
                + [
                    f"{r['run_id'] or '-':<24} {r['status']:<12} {r['kind']:<5} "
                    f"{fmt_duration(r.get('duration_s')):>9}  {r['session_id']}"
                    + (f"  ({links})" if (links := resume_links(r)) else "")
                    for r in view["runs"]
                ]
            )
        )
    return 0


@app.command(epilog=READ_EPILOG)
@click.argument("target")
@click.argument("node", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.option(
    "--raw",
    is_flag=True,
    help="With NODE: print only the node's response, byte for byte (for pipes).",
)
@click.pass_context
def show(ctx: click.Context, target: str, node: str | None, as_json: bool, raw: bool) -> int:
    """Show a run: status, phase and every node's live status; or one NODE in full.

    NODE is a planned agent_id or a spawned node's spawn_id (or an unambiguous prefix):
    its status, model, times, usage, the instruction exactly as the provider received it,
    the response, error, artifacts and spawn links. Works while the run is still going.
    """
    if node is not None:
        from steerflow.cli._reading import show_node

        return show_node(_home(ctx), target, node, as_json=as_json, raw=raw)
    if raw:
        raise UsageError("--raw needs a NODE: steerflow show RUN NODE --raw")
    from steerflow.cli._views import resume_links, show_view

    view = show_view(_home(ctx), target)
    if as_json:
        emit_json(view)
        return 0
    # A run without a session row or checkpoint says so, never "None" / "(vNone)".
    lines = [
        f"run: {view['run_id']}  session: {view['session_id'] or '(none recorded)'}",
        f"status: {view['status'] or 'unknown'}  phase: {view['phase'] or 'unknown'}",
    ]
    if links := resume_links(view):
        lines.append(links)
    ckpt = view.get("checkpoint") or {}
    if not view.get("reachable", True):
        from steerflow.cli._views import unreachable_line

        lines.append(unreachable_line(view))
    elif ckpt.get("path") and not ckpt.get("exists"):
        lines.append("checkpoint: none (the run saved no checkpoint; nothing to resume)")
    elif ckpt.get("path") and ckpt.get("version") is None:
        lines.append(f"checkpoint: {ckpt['path']} (unreadable)")
    elif ckpt.get("path"):
        lines.append(f"checkpoint: {ckpt['path']} (v{ckpt.get('version')})")
    report = view.get("checkpoint_recovery") or {}
    if report and report.get("status") != "clean":
        lines.append(f"checkpoint recovery: {report.get('status')} {report.get('refusal') or ''}")
    from steerflow.cli._reading import fmt_duration, fmt_usage

    lines.append("nodes:")
    lines.append(f"  {'STATUS':<10} {'KIND':<8} {'DURATION':>9}  {'MODEL':<16} ID")
    for item in view["nodes"]:
        who = f" ({printable(item['assignee'])})" if item.get("assignee") else ""
        lines.append(
            f"  {item['status']:<10} {item['kind']:<8} {fmt_duration(item.get('duration_s')):>9}  "
            f"{printable(item.get('model') or '-'):<16} {printable(item['id'])}{who}"
            + (f"  [{fmt_usage(used)}]" if (used := item.get("usage")) else "")
        )
        if item.get("artifacts"):
            from steerflow.cli._reading import artifact_lines

            lines += artifact_lines(item["artifacts"], indent="      artifact ")
    summary = view["summary"]
    lines.append(
        f"summary: {summary['completed']} completed, {summary['failed']} failed, "
        f"{summary['skipped']} skipped, {summary['pending']} pending"
        + (f", {summary['running']} running" if summary["running"] else "")
        + f"; usage: {fmt_usage(summary['usage'])}"
    )
    caps = view.get("budget") or {}
    if caps.get("max_cost") is not None or caps.get("max_tokens") is not None:
        lines.append(f"budget: {caps_text(caps)}")
    emit_text("\n".join(lines))
    return 0


@app.command(epilog=RESULT_EPILOG)
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.pass_context
def result(ctx: click.Context, target: str, as_json: bool) -> int:
    """Print a run's result: the synthesis response, else every sink node's response.

    Sink nodes are the nodes no other node depends on (planned and spawned), in plan
    order, each under its id. Exit 0 for a completed run, 1 otherwise (what exists is
    printed), 3 when the run's checkpoint cannot be read.
    """
    from steerflow.cli._reading import show_result

    return show_result(_home(ctx), target, as_json=as_json)


@app.group()
def ctl() -> None:
    """Steer a running flow from another terminal (queued; applied by the flow's poller)."""


def _queued(
    home: Path, target: str, verb: str, text: str | None = None, *, now: bool = False
) -> int:
    from steerflow.control import enqueue_control

    queued = enqueue_control(home, target, verb, text, now=now)  # type: ignore[arg-type]
    emit_text(
        f"{queued.control_id}\nqueued {verb} for session {queued.session_id} "
        "(queued, not yet applied: see `steerflow ctl status`)"
    )
    return 0


@ctl.command("pause", epilog=CTL_EPILOG)
@click.argument("target")
@click.pass_context
def ctl_pause(ctx: click.Context, target: str) -> int:
    """Hold every operation that has not started yet."""
    return _queued(_home(ctx), target, "pause")


@ctl.command("resume", epilog=CTL_EPILOG)
@click.argument("target")
@click.pass_context
def ctl_resume(ctx: click.Context, target: str) -> int:
    """Release a paused flow."""
    return _queued(_home(ctx), target, "resume")


@ctl.command("msg", epilog=CTL_EPILOG)
@click.argument("target")
@click.argument("text")
@click.pass_context
def ctl_msg(ctx: click.Context, target: str, text: str) -> int:
    """Send a correction into the next operation, or an agent's next turn (at most once)."""
    return _queued(_home(ctx), target, "message", text)


@ctl.command("stop", epilog=CTL_EPILOG)
@click.argument("target")
@click.option(
    "--now",
    is_flag=True,
    help="Also cancel the operations already running, as SIGINT does (their nodes stay "
    "pending and rerun on resume); a planner call is cancelled too (nothing to resume).",
)
@click.option(
    "--reason",
    metavar="TEXT",
    help="Why (at most 64 KiB); recorded and shown in the run's output.",
)
@click.pass_context
def ctl_stop(ctx: click.Context, target: str, now: bool, reason: str | None) -> int:
    """Stop a flow, or an agent after its current turn; exit 75 (resumable).

    A flow admits nothing new and lets running operations finish; a flow still planning
    lets its planner finish and saves the plan for `resume`.
    """
    return _queued(_home(ctx), target, "stop", reason, now=now)


@ctl.command("budget", epilog=CTL_EPILOG)
@click.argument("target")
@click.option("--max-cost", type=_Usd(), metavar="USD", help="New spend cap (the whole chain).")
@click.option("--max-tokens", type=click.IntRange(min=1), metavar="N", help="New token cap.")
@click.pass_context
def ctl_budget(ctx: click.Context, target: str, max_cost: float | None,
               max_tokens: int | None) -> int:  # fmt: skip
    """Raise or lower a running flow's or agent's caps, from its next admission on.

    A cap below what the chain has spent closes admission (exit 76 for the run); once
    the budget closed it, a higher cap is for `steerflow resume RUN --max-cost USD`.
    """
    from steerflow.control import enqueue_control

    budget = {"max_cost": max_cost, "max_tokens": max_tokens}
    queued = enqueue_control(_home(ctx), target, "budget", budget=budget)
    emit_text(
        f"{queued.control_id}\nqueued budget for session {queued.session_id} "
        "(queued, not yet applied: see `steerflow ctl status`)"
    )
    return 0


@ctl.command("resolve", epilog=RESOLVE_EPILOG)
@click.argument("control_id")
@click.option(
    "--as",
    "outcome",
    type=click.Choice(["applied", "abandoned"]),
    required=True,
    help="The outcome you observed.",
)
@click.option("--by", metavar="WHO", help="Who resolved it (stored as abandoned:WHO).")
@click.pass_context
def ctl_resolve(ctx: click.Context, control_id: str, outcome: str, by: str | None) -> int:
    """Close a control left in 'applying' by a flow that died mid-apply."""
    from steerflow.control import resolve_control

    row = resolve_control(_home(ctx), control_id, outcome, by)  # type: ignore[arg-type]
    emit_text(f"{row.id} {row.result}")
    return 0


@ctl.command("status", epilog=READ_EPILOG)
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.pass_context
def ctl_status(ctx: click.Context, target: str, as_json: bool) -> int:
    """Show a session's phase, poller state and controls."""
    from steerflow.cli._views import ctl_status_view

    view = ctl_status_view(_home(ctx), target)
    if as_json:
        emit_json(view)
        return 0
    lines = [
        f"session: {view['session_id']}  status: {view['status']}  phase: {view['phase']}  "
        f"poller: {view['poller']}"
        + (f"  turns: {view['turns']}" if view.get("turns") is not None else "")
    ]
    caps, spent = view.get("budget") or {}, view.get("spent") or {}
    if caps.get("max_cost") is not None or caps.get("max_tokens") is not None:
        from steerflow.cli._reading import fmt_usage

        lines.append(f"budget: {caps_text(caps)}; spent: {fmt_usage(spent)}")
    for c in view["controls"]:
        lines.append(f"  {c['id']}  {c['verb']:<8} {printable(c['result'] or 'pending')}")
    emit_text("\n".join(lines))
    return 0


DB_COPY_EPILOG = (
    "\b\nExit codes:\n  0    copied\n"
    + _UNEXPECTED
    + "  2    usage error (bad URL; a postgresql:// URL without the 'postgres' extra)\n"
    + "  3    refused: no state database here, target holds another home's sessions\n"
    + "       (without --merge), source and target the same, database busy\n"
)


@app.group()
def db() -> None:
    """The state database itself."""


@db.command("copy", epilog=DB_COPY_EPILOG)
@click.option(
    "--to",
    "to_url",
    required=True,
    metavar="URL",
    help="Target: postgresql://HOST/DB, sqlite:///REL/PATH or sqlite:////ABS/PATH (tables "
    "created when missing). The source itself, however spelled, is refused.",
)
@click.option(
    "--merge",
    is_flag=True,
    help="Add this home's rows to a target that already holds other sessions.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.pass_context
def db_copy(ctx: click.Context, to_url: str, merge: bool, as_json: bool) -> int:
    """Copy this home's state database (sessions, controls, node status...) to URL.

    Idempotent: rows already there are brought up to date, nothing is duplicated.
    Checkpoints stay in the run directories; only the state rows move.
    """
    from steerflow.state import StateDB, copy_state, normalize_state_db_url, open_copy_target

    to_url = normalize_state_db_url(to_url)  # a bad URL: exit 2 before the source is opened
    with (
        StateDB.open(_home(ctx), create=False, read_only=True) as source,
        open_copy_target(source, to_url) as target,
    ):
        report = copy_state(source, target, merge=merge)
    if as_json:
        emit_json(report.to_json())
        return 0
    total = ", ".join(f"{n} {table}" for table, n in report.rows.items())
    emit_text(f"copied {total}\nfrom {report.source}\nto {report.target}")
    return 0


DB_REBUILD_EPILOG = (
    "\b\nExit codes:\n  0    scanned: every run registered, already known, or skipped (listed)\n"
    + _UNEXPECTED
    + _USAGE
    + "  3    refused: <home>/runs is a symlink, state DB read-only or busy\n"
)


@db.command("rebuild", epilog=DB_REBUILD_EPILOG)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.pass_context
def db_rebuild(ctx: click.Context, as_json: bool) -> int:
    """Register again every run found under <home>/runs/ (after losing the state DB).

    Each run whose checkpoint loads gets its session back (its own session id, prompt
    and kind), as completed when its checkpoint records every node completed, else
    interrupted; a resumed run gets its claim on its source back. Runs the state DB
    already knows are left as they are, so running it twice changes nothing. Links,
    names that are not run ids and unreadable checkpoints are listed and skipped;
    nothing under runs/ is written. The artifact contract stays in the checkpoints:
    resume or verify a run that declares artifacts with --accept-checkpoint-contract.
    """
    from steerflow.orchestrate._rebuild import rebuild_state

    report = rebuild_state(_home(ctx))
    if as_json:
        emit_json(report.to_json())
        return 0
    lines = []
    for run in report.runs:
        if run.outcome == "registered":
            lines.append(f"registered  {run.name}  {run.status:<11}  session {run.session_id}")
        elif run.outcome == "known":
            lines.append(f"known       {printable(run.name)}  ({printable(run.reason or '')})")
        else:
            lines.append(f"skipped     {printable(run.name)}: {printable(run.reason or '')}")
    lines.append(
        f"{report.count('registered')} registered, {report.count('known')} already known, "
        f"{report.count('skipped')} skipped, in {report.state_db}"
    )
    emit_text("\n".join(lines))
    return 0


MCP_EPILOG = (
    "\b\nExit codes:\n  0    the client closed the connection\n"
    + _UNEXPECTED
    + "  2    usage error (bad flags, or the mcp extra is not installed)\n"
)


@app.command("mcp", epilog=MCP_EPILOG)
@click.option(
    "--allow-control",
    is_flag=True,
    help="Also offer the tools pause, resume, message and stop, which steer running flows "
    "as `steerflow ctl` does; without it the server only reads.",
)
@click.pass_context
def mcp_command(ctx: click.Context, allow_control: bool) -> int:
    """Serve runs to an agent: an MCP server on stdin/stdout (needs the extra `mcp`).

    \b
    Tools: list_runs, show_run, node_detail, checkpoint_report, resume_preflight;
    with --allow-control also pause, resume, message, stop.
    """
    from steerflow.mcp import serve

    serve(_home(ctx), allow_control=allow_control)
    return 0


STUDIO_EPILOG = (
    "\b\nExit codes:\n  0    stopped (SIGINT/SIGTERM)\n"
    + _UNEXPECTED
    + "  2    usage error (bad flags, a non-loopback --host without --allow-remote, an\n"
    "       address that cannot be bound, or the studio extra is not installed)\n"
)


@app.command("studio", epilog=STUDIO_EPILOG)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="Port to listen on (0: any free port; the printed URL names it).",
)
@click.option("--open", "open_browser", is_flag=True, help="Open the URL in a browser.")
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Allow a --host other than loopback (anyone who can reach it and has the URL's "
    "token can steer your runs).",
)
@click.pass_context
def studio_command(
    ctx: click.Context, host: str, port: int, open_browser: bool, allow_remote: bool
) -> int:
    """Watch and steer runs in a browser (needs the extra `studio`).

    Prints the URL to open; it carries a one-time access token, which the first page
    load moves into a cookie. Stop with Ctrl-C.
    """
    from steerflow.studio import serve

    serve(
        _home(ctx),
        host=host,
        port=port,
        allow_remote=allow_remote,
        open_browser=open_browser,
        on_ready=lambda url: emit_text(f"steerflow studio: {url}"),
    )
    return 0


def _emit_error_json(code: str, message: str, exit_code: ExitCode) -> None:
    """The error object ``--json`` prints for failures outside ``SteerflowError``."""
    emit_json(
        {
            "status": "refused" if exit_code == ExitCode.REFUSED else "error",
            "exit_code": int(exit_code),
            "error": {"code": code, "message": message},
        }
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code (never raises for expected errors)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        code = app.main(args=args, prog_name="steerflow", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.exceptions.Abort:
        return int(ExitCode.SIGINT)
    except click.ClickException as exc:
        # Parser errors (unknown flag, out-of-range value, --plan naming a directory) are
        # usage errors like any other: one JSON object with --json, escaped text for humans.
        if "--json" in args:
            _emit_error_json(UsageError.code, exc.format_message(), ExitCode.USAGE)
        shown = io.StringIO()
        exc.show(file=shown)
        warn(shown.getvalue())
        return int(ExitCode.USAGE)
    except SteerflowError as exc:
        if "--json" in args:
            emit_json(
                {
                    **(exc.source_ids or {}),  # a refused resume names its source run
                    "status": "refused" if exc.exit_code == ExitCode.REFUSED else "error",
                    "exit_code": int(exc.exit_code),
                    "error": {"code": exc.code, "message": str(exc)},
                    **({"checkpoint_recovery": exc.report} if hasattr(exc, "report") else {}),
                    **({"unsettled": exc.unsettled} if hasattr(exc, "unsettled") else {}),
                }
            )
        warn(f"steerflow: error: {exc}")
        return int(exc.exit_code)
    except KeyboardInterrupt:
        return int(ExitCode.SIGINT)
    except BrokenPipeError:
        return 0
    except OSError as exc:  # the environment failed us (disk, permissions): one line
        if "--json" in args:
            _emit_error_json("os-error", str(exc), ExitCode.FAILED)
        warn(f"steerflow: error: {exc}")
        return int(ExitCode.FAILED)
    return int(code or 0)


def cli_exit() -> None:
    """Console-script entry point."""
    sys.exit(main())
