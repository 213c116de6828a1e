"""The command line (``steerflow``), a thin layer over the library."""

from __future__ import annotations

from steerflow.cli._app import app, cli_exit, main

__all__ = ["app", "cli_exit", "main"]
