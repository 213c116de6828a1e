"""``steerflow mcp``: the run readers (and, on request, the ``ctl`` writers) as MCP tools.

A stdio Model Context Protocol server built on the official ``mcp`` SDK (the optional
extra ``mcp``), over :mod:`steerflow.views`: the same typed readers ``show``, ``runs``,
``ctl status`` and ``resume --dry-run`` use. Importing this package does not import the
SDK; :func:`build_server` and :func:`serve` do (``UsageError`` naming the ``pip install``
when it is missing).
"""

from __future__ import annotations

from steerflow.mcp._server import CONTROL_TOOLS, READ_TOOLS, build_server, serve

__all__ = ["CONTROL_TOOLS", "READ_TOOLS", "build_server", "serve"]
