"""The ``steerflow`` command line: the root group, the exit-code mapping, the entry point.

Each command group lives in its own module (``_cmd_flow``: flow, play, agent, resume;
``_cmd_read``: verify, runs, show, result; ``_cmd_ctl``; ``_cmd_db``; ``_cmd_serve``: mcp,
studio), imported only when its command runs (:class:`~steerflow.cli._lazy.LazyGroup`):
``ctl`` is called in tight loops from other terminals and scripts, and its start-up is the
live steering latency an operator sees. Errors from every command map to exit codes here,
in :func:`main`, and nowhere else.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

import click

from steerflow.cli._common import EXIT_EPILOG
from steerflow.cli._lazy import LazyGroup
from steerflow.cli._output import emit_json, warn
from steerflow.errors import ExitCode, SteerflowError, UsageError

__all__ = ["app", "cli_exit", "main"]

# Every command: where it lives ("module:attribute"). `steerflow --help` lists them sorted.
COMMANDS = {
    "agent": "steerflow.cli._cmd_flow:agent",
    "approvals": "steerflow.cli._cmd_approvals:approvals",
    "ctl": "steerflow.cli._cmd_ctl:ctl",
    "db": "steerflow.cli._cmd_db:db",
    "flow": "steerflow.cli._cmd_flow:flow",
    "mcp": "steerflow.cli._cmd_serve:mcp_command",
    "play": "steerflow.cli._cmd_flow:play",
    "result": "steerflow.cli._cmd_read:result",
    "resume": "steerflow.cli._cmd_flow:resume",
    "runs": "steerflow.cli._cmd_read:runs",
    "show": "steerflow.cli._cmd_read:show",
    "studio": "steerflow.cli._cmd_serve:studio_command",
    "verify": "steerflow.cli._cmd_read:verify",
}


@click.group(
    cls=LazyGroup,
    lazy_subcommands=COMMANDS,
    epilog=EXIT_EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
)
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


def cli_exit() -> NoReturn:
    """Console-script entry point (and ``python -m steerflow``'s)."""
    exit_now(main())


def exit_now(code: int) -> NoReturn:
    """End the process with ``code``, skipping the interpreter's teardown (decision 392).

    Tearing down the ~400 modules a ``flow`` loads took 40-45 ms of its ~330 ms of CPU,
    and every test and script starts hundreds of them; mypy's ``hard_exit`` does the same.
    Nothing is lost: a run's writes are durable before :func:`main` returns (checkpoints and
    branch files fsynced and closed, the state DB committed), the ``atexit`` handlers still
    run (logging, OpenTelemetry and Ray flush there), and both standard streams are
    flushed. While a non-daemon thread is alive, the normal exit runs instead, since it
    waits for that thread.
    """
    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        # A closed pipe or stream has nothing left to deliver.
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    os._exit(code)
