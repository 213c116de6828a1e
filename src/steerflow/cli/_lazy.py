"""A click group that imports a subcommand's module only when that subcommand is used.

Click's documented "LazyGroup" pattern: ``lazy_subcommands`` maps each name to
``"module:attribute"``; ``get_command`` imports the module on first use, so
``steerflow ctl msg`` loads ``cli._cmd_ctl`` and never the flow commands' module.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import click

__all__ = ["LazyGroup"]


class LazyGroup(click.Group):
    """A :class:`click.Group` whose subcommands live in modules imported on demand."""

    def __init__(
        self, *args: Any, lazy_subcommands: Mapping[str, str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_subcommands = dict(lazy_subcommands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every name, sorted as :class:`click.Group` sorts its own (``--help`` order)."""
        return sorted({*super().list_commands(ctx), *self.lazy_subcommands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command ``cmd_name``, its module imported now if it is a lazy one."""
        spec = self.lazy_subcommands.get(cmd_name)
        if spec is None:
            return super().get_command(ctx, cmd_name)
        module_name, _, attribute = spec.partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):  # a wrong table entry: the author's bug
            raise TypeError(f"{spec} is not a click command")
        return command
