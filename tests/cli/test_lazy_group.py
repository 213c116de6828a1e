"""The root group's table of lazily imported commands (``cli._app.COMMANDS``) is right."""

from __future__ import annotations

import contextlib
import io

import click
import pytest

from steerflow.cli import app, main
from steerflow.cli._app import COMMANDS
from steerflow.cli._lazy import LazyGroup

EXPECTED = [
    "agent",
    "approvals",
    "ctl",
    "db",
    "flow",
    "mcp",
    "play",
    "result",
    "resume",
    "runs",
    "show",
    "studio",
    "verify",
]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_entry_is_the_command_of_that_name(name: str) -> None:
    with click.Context(app) as ctx:
        command = app.get_command(ctx, name)
    assert isinstance(command, click.Command)
    assert command.name == name


def test_help_lists_every_command_sorted() -> None:
    with click.Context(app) as ctx:
        assert app.list_commands(ctx) == EXPECTED
        assert app.get_command(ctx, "nope") is None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--help"]) == 0
    listed = out.getvalue().split("\nCommands:\n", 1)[1].split("\n\n", 1)[0]
    assert [line.split()[0] for line in listed.splitlines()] == EXPECTED


def test_a_bad_table_entry_is_refused_by_name() -> None:
    group = LazyGroup(name="g", lazy_subcommands={"x": "steerflow.cli._common:SECONDS"})
    with click.Context(group) as ctx, pytest.raises(TypeError, match="_common:SECONDS"):
        group.get_command(ctx, "x")


def test_an_unknown_command_is_a_usage_error() -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["nope"]) == 2
    assert "No such command 'nope'" in err.getvalue()
