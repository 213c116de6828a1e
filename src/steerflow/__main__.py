"""``python -m steerflow`` behaves like ``steerflow``."""

from __future__ import annotations

from steerflow.cli import cli_exit

if __name__ == "__main__":
    cli_exit()
