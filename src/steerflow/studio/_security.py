"""The Studio's access rules, free of any web framework so they are tested on their own.

- Loopback only unless ``--allow-remote``: the host to bind is checked before anything
  listens, and requests whose ``Host`` header names another host are refused (a page on
  another site cannot reach the Studio by rebinding a DNS name to 127.0.0.1).
- A random token in the printed URL; the first request carrying it gets it back as an
  ``HttpOnly; SameSite=Strict`` cookie and is redirected to the same URL without it, so
  the token leaves the address bar and history. Every later request needs the cookie.
- State-changing requests also need a CSRF token (an HMAC of the session token), sent as a
  form field that only a page the Studio rendered can know.
- Every response carries a Content-Security-Policy without inline script.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets

from steerflow.errors import UsageError

__all__ = [
    "COOKIE",
    "CSP",
    "SECURITY_HEADERS",
    "allowed_hosts",
    "check_bind_host",
    "csrf_token",
    "is_loopback",
    "new_token",
    "same_secret",
]

COOKIE = "steerflow_studio"
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; script-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: tuple[tuple[str, str], ...] = (
    ("content-security-policy", CSP),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    # The first URL carries the token: never send it on as a referrer.
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-store"),
)


def new_token() -> str:
    """A fresh session token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def csrf_token(token: str) -> str:
    """The CSRF token of a session: derived, so the server keeps no state per page."""
    return hmac.new(token.encode(), b"steerflow-studio-csrf", hashlib.sha256).hexdigest()


def same_secret(given: str | None, expected: str) -> bool:
    """Constant-time comparison; a missing value never matches."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (``127.0.0.0/8``, ``::1``)."""
    name = host.strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind_host(host: str, *, allow_remote: bool) -> None:
    """Refuse to listen beyond loopback unless the operator asked for it.

    Raises:
        UsageError: ``host`` is not a loopback host and ``allow_remote`` is false.
    """
    if not allow_remote and not is_loopback(host):
        raise UsageError(
            f"--host {host!r} is not a loopback address: the Studio steers runs, so it "
            "listens on 127.0.0.1 unless you add --allow-remote"
        )


def allowed_hosts(host: str, port: int) -> frozenset[str]:
    """``Host`` header values a loopback Studio answers to."""
    names = {"127.0.0.1", "localhost", "[::1]"}
    if ":" in host and not host.startswith("["):
        names.add(f"[{host}]")  # an IPv6 literal
    else:
        names.add(host)
    return frozenset(f"{name}:{port}" for name in names)
