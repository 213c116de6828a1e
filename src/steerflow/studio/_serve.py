"""Listening: check the host, bind, announce the URL with its token, run uvicorn."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from steerflow.errors import UsageError

if TYPE_CHECKING:
    import uvicorn

from steerflow.studio._security import COOKIE, allowed_hosts, check_bind_host, new_token

__all__ = ["INSTALL_HINT", "Listening", "listen", "need_extra", "serve"]

INSTALL_HINT = "pip install 'steerflow[studio]'"


def need_extra() -> None:
    """Raise a usage error naming the ``pip install`` when the extra is missing."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise UsageError(
            f"steerflow studio needs the optional web server ({exc.name or 'starlette'} is "
            f"not installed): {INSTALL_HINT}"
        ) from None


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        # Listening before the URL is announced: a client that connects at once is queued,
        # not refused, while uvicorn starts.
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


@dataclass
class Listening:
    """A studio bound and listening, not yet serving: ``run`` serves until told to stop."""

    server: uvicorn.Server
    sock: socket.socket
    #: The URL to open, with the access token.
    url: str

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM (main thread) or ``server.should_exit``."""
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self.sock.close()


def listen(
    home: Path, *, host: str = "127.0.0.1", port: int = 8765, allow_remote: bool = False
) -> Listening:
    """Check the host, bind and listen, and build the app behind a fresh token.

    ``port`` 0 picks a free port (the URL names it).

    Raises:
        UsageError: the extra is missing, ``host`` is not loopback without
            ``allow_remote``, or the address cannot be bound.
    """
    check_bind_host(host, allow_remote=allow_remote)
    need_extra()
    import uvicorn

    from steerflow.studio._app import build_app

    sock = _listen(host, port)
    bound = int(sock.getsockname()[1])
    token = new_token()
    hosts = None if allow_remote else allowed_hosts(host.strip("[]"), bound)
    app = build_app(home, token=token, hosts=hosts, cookie=f"{COOKIE}_{bound}")
    shown = f"[{host.strip('[]')}]" if ":" in host.strip("[]") else host
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", ws="none")
    )
    return Listening(server, sock, f"http://{shown}:{bound}/?token={token}")


def serve(
    home: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    allow_remote: bool = False,
    open_browser: bool = False,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the Studio until SIGINT/SIGTERM; ``on_ready`` gets the URL with its token.

    Raises:
        UsageError: as :func:`listen`.
    """
    listening = listen(home, host=host, port=port, allow_remote=allow_remote)
    if on_ready is not None:
        on_ready(listening.url)
    if open_browser:
        import webbrowser

        webbrowser.open(listening.url)
    listening.run()
