"""``steerflow studio``: a local web page over the run readers (optional extra ``studio``).

An ASGI app (Starlette, served by uvicorn) over :mod:`steerflow.views`, behind the access
rules of :mod:`steerflow.studio._security`: loopback only unless asked, a token moved from
the printed URL into an ``HttpOnly; SameSite=Strict`` cookie, a CSRF token on every form,
a Content-Security-Policy without inline script, and every outside text escaped.
Importing this package needs neither Starlette nor uvicorn; :func:`serve` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from steerflow.studio._security import check_bind_host, csrf_token, is_loopback
from steerflow.studio._serve import INSTALL_HINT, Listening, listen, need_extra, serve

if TYPE_CHECKING:
    from starlette.types import ASGIApp

__all__ = [
    "INSTALL_HINT",
    "Listening",
    "check_bind_host",
    "create_app",
    "csrf_token",
    "is_loopback",
    "listen",
    "serve",
]


def create_app(home: Path, *, token: str, hosts: frozenset[str] | None = None) -> ASGIApp:
    """The Studio's ASGI app for ``home``; every request needs ``token``.

    ``hosts`` are the ``Host`` header values it answers to (None: any, which only
    ``--allow-remote`` should use; :func:`serve` passes the loopback names of its port).

    Raises:
        UsageError: Starlette or uvicorn is not installed.
    """
    need_extra()
    from steerflow.studio._app import build_app

    return build_app(home, token=token, hosts=hosts)
