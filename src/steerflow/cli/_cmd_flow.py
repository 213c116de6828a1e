"""``flow``, ``play``, ``agent`` and ``resume``: the commands that run something.

The flow machinery (executor, providers, checkpoint, rich) is imported inside the
commands, when one of them runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from steerflow._values import CHECKPOINT_VERSIONS, MAX_CONCURRENCY
from steerflow.cli._common import (
    ACCEPT_CONTRACT_HELP,
    MAX_OPS_HELP,
    REACTIVE_HELP,
    RUN_EPILOG,
    SECONDS,
    TEXT,
    F,
    budget_kw,
    budget_line,
    budget_options,
    compact_options,
    executor_kw,
    executor_options,
    flags_named,
    home_of,
    whole,
)
from steerflow.cli._output import emit_json, emit_text, printable, run_with_signals, warn
from steerflow.errors import UsageError

if TYPE_CHECKING:
    from steerflow.orchestrate import FlowOptions, FlowResult

__all__ = ["agent", "execute", "flow", "play", "print_result", "resume", "run_options"]


# The options of ``flow`` and ``play``, in --help order (defined once).
_RUN_OPTIONS: list[Callable[[Any], Any]] = [
    click.option(
        "--model",
        "model",
        metavar="SPEC",
        help="Model: echo, echo:delay=S, script:PATH, openai/M, anthropic/M, claude-code/M, codex/M. Default: the plan's, else echo.",
    ),
    click.option("--reactive", metavar="off|all|ROLE,...", help=REACTIVE_HELP),
    click.option("--max-ops", type=whole(0), metavar="N", help=MAX_OPS_HELP),
    click.option(
        "--concurrency",
        type=whole(1, MAX_CONCURRENCY),
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
        "--approval-timeout",
        "approval_timeout",
        type=SECONDS,
        metavar="S",
        help="Deny an approval request nobody answered within S seconds, with that reason "
        "(default: the plan's approval_timeout_s, else wait for ever).",
    ),
    click.option(
        "--checkpoint-version",
        type=click.Choice([str(v) for v in CHECKPOINT_VERSIONS]),
        default="3",
        show_default=True,
        help="Checkpoint format: 3 = base + journal, 2 = full snapshot per outcome, "
        "4 = immutable segments under a manifest + journal: bytes linear in the run and "
        "large responses read back from it instead of held; for batches of thousands of "
        "nodes (docs/batches.md). A resume keeps version 4.",
    ),
    compact_options,
    budget_options,
    executor_options,
    click.option(
        "--max-plan-entries",
        type=whole(1),
        default=1000,
        show_default=True,
        metavar="N",
        help="Most entries a plan may have: a larger plan file or playbook exits 2, a larger "
        "planner reply is an invalid reply (one retry); plans are never cut. A batch of "
        "thousands of nodes: also --checkpoint-version 4 (docs/batches.md).",
    ),
    click.option(
        "--allow-agent-workers",
        is_flag=True,
        help="Let a plan file or playbook run the claude-code/codex workers it names "
        "(they execute code here); not needed for a worker given with --model.",
    ),
    click.option(
        "--allow-python",
        is_flag=True,
        help="Let a plan file or playbook run the python:MODULE:FUNCTION nodes it names "
        "(they run code in this process); not needed for the spec given with --model.",
    ),
    click.option(
        "--allow-mcp",
        is_flag=True,
        help="Let a plan file or playbook start the MCP servers it declares (mcp_servers:) "
        "for its mcp:SERVER tools; they are commands of the plan's choosing. python: tools "
        "need --allow-python.",
    ),
    click.option(
        "--synthesize",
        type=TEXT,
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


def run_options(func: F) -> F:
    """Options shared by ``flow`` and ``play`` (defined once)."""
    for decorator in reversed(_RUN_OPTIONS):
        func = decorator(func)
    return func


#: A plan allowed past this many entries is a batch (``--max-plan-entries``' default).
_BATCH_ENTRIES = 1000


def _batch_hint(kw: dict[str, Any]) -> None:
    """A batch left on version 3 writes bytes quadratic in its nodes: say what to use.

    CONTRACT §8 keeps version 3 the default, so this only tells (stderr, one line), when
    ``--max-plan-entries`` admits a batch and ``--checkpoint-version`` was not given.
    """
    ctx = click.get_current_context(silent=True)
    given = ctx is not None and ctx.get_parameter_source("checkpoint_version") not in (
        click.core.ParameterSource.DEFAULT,
        None,
    )
    if given or int(kw.get("max_plan_entries") or _BATCH_ENTRIES) <= _BATCH_ENTRIES:
        return
    warn(
        "note: a batch on checkpoint version 3 writes bytes that grow with the square of "
        "its nodes; give --checkpoint-version 4 (docs/batches.md)"
    )


def _flow_options(**kw: Any) -> FlowOptions:
    from steerflow.orchestrate import FlowOptions

    _batch_hint(kw)
    with flags_named():
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
            approval_timeout_s=kw.get("approval_timeout"),
            checkpoint_version=int(kw.get("checkpoint_version") or 3),
            dry_run=bool(kw.get("dry_run")),
            show_graph=bool(kw.get("show_graph")),
            kind=kw.get("kind", "flow"),
            max_plan_entries=int(kw.get("max_plan_entries") or _BATCH_ENTRIES),
            compact_records=kw.get("compact_records"),
            compact_bytes=kw.get("compact_bytes"),
            allow_agent_workers=bool(kw.get("allow_agent_workers")),
            allow_python=bool(kw.get("allow_python")),
            allow_mcp=bool(kw.get("allow_mcp")),
            synthesize=kw.get("synthesize"),
            **budget_kw(kw),
            **executor_kw(kw),
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
    # Pauses, resumes and stops come from the steering state, not the bus (decision 165).
    run.steering.on_applied.append(progress.control_applied)

    try:
        result = run_with_signals(run.run, run.request_stop)
    finally:
        progress.close()  # the last summary of a run whose progress was summarised
    from steerflow.cli._reading import flow_result_text

    print_result(result, as_json=as_json, result_text=flow_result_text(home, result.run_dir))
    return int(result.exit_code)


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


@click.command(epilog=RUN_EPILOG)
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
    return execute(home_of(ctx), _flow_options(**kw), as_json=kw["as_json"])


@click.command(epilog=RUN_EPILOG)
@click.argument("name")
@click.argument("prompt", required=False)
@run_options
@click.pass_context
def play(ctx: click.Context, /, name: str, **kw: Any) -> int:
    """Run playbook NAME (sugar for: flow -p NAME [PROMPT])."""
    kw.update(playbook=name, kind="play")
    return execute(home_of(ctx), _flow_options(**kw), as_json=kw["as_json"])


@click.command(epilog=RUN_EPILOG)
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
    type=whole(1),
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
@click.option(
    "--tool",
    "tools",
    multiple=True,
    metavar="SPEC",
    help="Give the agent a tool: python:MODULE:FUNCTION (its signature, type hints and "
    "docstring are what the model sees), mcp:SERVER (every tool of a server given with "
    "--mcp-server) or mcp:SERVER/TOOL. Repeatable; naming it is its consent. Each turn "
    "then runs a loop of model requests and tool calls, every step journaled, so a resume "
    "never runs a finished call again (needs openai/, anthropic/ or script:).",
)
@click.option(
    "--mcp-server",
    "mcp_servers",
    multiple=True,
    metavar="NAME=SERVER",
    callback=lambda _ctx, _param, value: mcp_server_options(value),
    help="Declare the MCP server NAME for --tool mcp:NAME: a command line run over stdio "
    "(fs='npx -y @modelcontextprotocol/server-filesystem /tmp'), a streamable HTTP URL "
    '(docs=http://127.0.0.1:8000/mcp), or a plan\'s JSON form (\'{"command": [...], "env": '
    "{...}}'). Repeatable; declaring it is its consent. Started on first use, ended "
    "with the run; its stderr is kept in the run directory.",
)
@budget_options
@executor_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.pass_context
def agent(ctx: click.Context, /, task: str, model: str, max_turns: int, timeout: float | None,
          save: Path | None, tools: tuple[str, ...], mcp_servers: dict[str, Any],
          as_json: bool, **more: Any) -> int:  # fmt: skip
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
    with flags_named():
        options = AgentOptions(task=task, model=model, max_turns=max_turns, timeout_s=timeout,
                               save=save, tools=tools, mcp_servers=mcp_servers,
                               **budget_kw(more),
                               **executor_kw(more))  # fmt: skip
    return execute_agent(home_of(ctx), options, as_json=as_json)


def mcp_server_options(values: tuple[str, ...]) -> dict[str, Any]:
    """``--mcp-server NAME=SERVER`` values as a plan's ``mcp_servers`` mapping.

    SERVER is a plan's JSON form when it starts with ``{``, a streamable HTTP URL when it
    starts with ``http://`` or ``https://``, else a command line split as a POSIX shell
    would (no shell runs it). The declarations are checked by ``AgentOptions``.
    """
    import json
    import shlex

    servers: dict[str, Any] = {}
    for value in values:
        name, sep, server = value.partition("=")
        if not sep or not name or not server.strip():
            raise click.BadParameter(f"{value!r} is not NAME=SERVER", param_hint="--mcp-server")
        if name in servers:
            raise click.BadParameter(f"{name!r} is declared twice", param_hint="--mcp-server")
        try:
            if server.lstrip().startswith("{"):
                servers[name] = json.loads(server)
            elif server.startswith(("http://", "https://")):
                servers[name] = {"url": server}
            else:
                servers[name] = {"command": shlex.split(server)}
        except ValueError as exc:  # json.JSONDecodeError, or shlex's unclosed quote
            raise click.BadParameter(f"{name}: {exc}", param_hint="--mcp-server") from None
    return servers


@click.command(epilog=RUN_EPILOG)
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
    "--from",
    "from_node",
    metavar="NODE",
    help="Rerun from NODE: a fork (a new run; TARGET is unchanged, finished or not) that "
    "replays every completed node that is neither NODE nor downstream of it, and runs NODE "
    "and everything downstream of it (its dependents, the synthesis) again, paid; it names "
    "them on stderr before it starts (`rerun` in --json). Failed and pending nodes "
    "elsewhere behave as with --fork. NODE is a planned node or synthesis, not a spawned "
    "one (an unknown NODE exits 2).",
)
@click.option(
    "--instruction",
    metavar="TEXT",
    help="With --from: NODE runs with TEXT instead of its recorded instruction; the new "
    "run records the edit (original and new text; `show RUN NODE` says so).",
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
@click.option(
    "--tool-call",
    "tool_calls",
    multiple=True,
    metavar="CALL_ID=retry|skip",
    help="Decide a tool call that was running when the run died and is not declared "
    "idempotent (the resume refuses, exit 3, naming it): retry runs it again (its side "
    "effect may happen twice), skip tells the model its outcome is unknown. Repeatable; "
    "the decision is recorded in the step.",
)
@click.option(
    "--approval-timeout",
    "approval_timeout",
    type=SECONDS,
    metavar="S",
    help="Deny an approval request nobody answered within S seconds (default: the run's).",
)
@compact_options
@budget_options
@executor_options
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
    --redeliver-claimed, except one an agent's turn in flight took (delivered_in):
    the resume runs that turn with it and stamps it applied.
    """
    from steerflow.orchestrate import FlowOptions, prepare_resume

    home = home_of(ctx)
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
        tool_calls=tool_call_decisions(kw["tool_calls"]),
        from_node=kw["from_node"],
        instruction=kw["instruction"],
    )
    if seed.replay.rerun_from is not None:
        # Said before anything is paid for (dry run or not): what this fork pays for.
        warn(seed.replay.rerun_from.line())
    with flags_named():
        options = FlowOptions(
            resume=seed,
            dry_run=kw["dry_run"],
            show_graph=kw["show_graph"],
            timeout_s=kw["timeout"],
            approval_timeout_s=kw["approval_timeout"],
            # A version 4 run (a batch) resumes into version 4; any other into 3 (decision 394).
            checkpoint_version=4 if _source_version(seed) == 4 else 3,
            compact_records=kw["compact_records"],
            compact_bytes=kw["compact_bytes"],
            **budget_kw(kw),
            **executor_kw(kw),
        )
    return execute(home, options, as_json=kw["as_json"])


def _source_version(seed: Any) -> object:
    """The checkpoint version of the run a resume starts from (its loader's report)."""
    return (seed.checkpoint_recovery or {}).get("checkpoint_version")


def tool_call_decisions(values: tuple[str, ...]) -> dict[str, str]:
    """``--tool-call CALL_ID=retry|skip`` values by call id; a malformed one exits 2."""
    decisions: dict[str, str] = {}
    for value in values:
        call, sep, how = value.partition("=")
        if not sep or not call or how not in ("retry", "skip"):
            raise UsageError(f"--tool-call {value!r}: expected CALL_ID=retry or CALL_ID=skip")
        if decisions.get(call, how) != how:
            raise UsageError(f"--tool-call decides {call!r} twice, differently")
        decisions[call] = how
    return decisions


def _resume_agent(home: Path, target: str, kw: dict[str, Any]) -> int | None:
    """Resume ``target`` as an agent run (issue 19); ``None`` when it is not one."""
    from steerflow.orchestrate._agent_resume import agent_resume_source, prepare_agent_resume

    run = agent_resume_source(home, target)
    if run is None:
        return None
    if kw.get("from_node") is not None or kw.get("instruction") is not None:
        raise UsageError("--from and --instruction do not apply to an agent run (one agent)")
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
        tool_calls=tool_call_decisions(kw["tool_calls"]),
    )
    if kw.get("dry_run"):
        return print_agent_dry_run(seed, as_json=kw["as_json"])
    with flags_named():
        options = AgentOptions(
            resume=seed, timeout_s=kw["timeout"], **budget_kw(kw), **executor_kw(kw)
        )
    return execute_agent(home, options, as_json=kw["as_json"])
