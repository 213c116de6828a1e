"""What ``--ray-address`` must answer before ``ray.init`` is let near it (decision 243).

Loopback listeners that each misbehave one way; the real GCS's answer is checked by
``tests/e2e/test_ray_e2e.py`` (its flows join through the same probe).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from steerflow.cluster._connect import _reachable

#: A server's HTTP/2 preface: an empty SETTINGS frame.
SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


@contextlib.contextmanager
def _listener(on_accept: Callable[[socket.socket], None]) -> Iterator[str]:
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                held.append(conn)
                on_accept(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        # shutdown() wakes the blocked accept() (close() alone does not, on Linux); only
        # once the thread ended is ``held`` complete, so no accepted socket is left to
        # the garbage collector (an unraisable ResourceWarning in a later test).
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        thread.join(timeout=10)
        server.close()
        for conn in held:
            conn.close()


def _soon(seconds: float = 0.5) -> float:
    return time.monotonic() + seconds


def test_an_http2_server_passes() -> None:
    with _listener(lambda conn: conn.sendall(SETTINGS)) as address:
        _reachable(address, _soon(10))


@pytest.mark.parametrize(
    ("behaviour", "says"),
    [
        (lambda conn: None, "no answer within 10 s"),
        (lambda conn: conn.shutdown(socket.SHUT_RDWR), "closed without an answer"),
        (lambda conn: conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n"), "not a Ray GCS"),
    ],
    ids=["silent", "closes", "http1"],
)
def test_anything_else_is_refused_within_the_deadline(
    behaviour: Callable[[socket.socket], None], says: str
) -> None:
    with _listener(behaviour) as address:
        started = time.monotonic()
        with pytest.raises(ConnectionError, match=says):
            _reachable(address, _soon())
        assert time.monotonic() - started < 5


def test_with_tls_only_the_connection_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    # a TLS GCS waits for the client's hello: a silent listener is what it looks like here
    monkeypatch.setenv("RAY_USE_TLS", "1")
    with _listener(lambda conn: None) as address:
        _reachable(address, _soon())
