"""A real PostgreSQL server for the tests: initdb + pg_ctl into a temporary directory.

The machine's PostgreSQL binaries are used (``pg_ctl`` on PATH, else
``/usr/lib/postgresql/<version>/bin``); ``.ci/run`` installs Debian's ``postgresql``
package when they are missing. Nothing is skipped: without binaries the fixture fails
and says so. ``initdb`` refuses to run as root, so under root the server runs as the
``postgres`` user, in a directory that user owns. It listens on loopback and on a unix
socket in its own directory, on a free port, with ``fsync`` off (a test server).

Under pytest-xdist every worker starts its own server (a session fixture is per process).
Each test gets its own empty namespace: a schema of one shared database, first on the
``search_path`` its URL sets (``?options=-csearch_path=...``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PgRaw", "PgServer", "find_pg_bin", "pg_server"]

_START_TIMEOUT_S = 60
_PORT_ATTEMPTS = 5
_SHARED_DB = "steerflow_tests"


def find_pg_bin() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``; fails with how to get them."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.insert(0, str(Path(os.path.realpath(on_path)).parent))
    for directory in candidates:
        if (Path(directory) / "initdb").exists() and (Path(directory) / "pg_ctl").exists():
            return Path(directory)
    raise RuntimeError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under "
        "/usr/lib/postgresql/*/bin: install them (Debian: apt-get install -y postgresql); "
        ".ci/run does this itself"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PgServer:
    """A running test server; :meth:`new_database` gives a test its own database."""

    bin_dir: Path
    data_dir: Path
    port: int
    user: str
    _shared_created: bool = False

    def url(self, dbname: str = "postgres") -> str:
        """A URL for ``dbname`` over loopback TCP (trust authentication)."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def psql(self, sql: str, dbname: str = "postgres") -> None:
        """Run one statement as the superuser, autocommit."""
        import psycopg

        with psycopg.connect(self.url(dbname), autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[call-overload]

    def new_database(self) -> str:
        """A URL whose database looks empty: a new schema first on its ``search_path``.

        A schema costs milliseconds where a database costs a copy of ``template0`` on disk
        (hundreds of tests would leave gigabytes to remove at the end).
        """
        if not self._shared_created:
            self.psql(f'CREATE DATABASE "{_SHARED_DB}" TEMPLATE template0')
            self._shared_created = True
        name = f"t_{uuid.uuid4().hex[:16]}"
        self.psql(f'CREATE SCHEMA "{name}"', _SHARED_DB)
        return f"{self.url(_SHARED_DB)}?options=-csearch_path%3D{name}"


class PgRaw:
    """A plain autocommit psycopg connection that takes ``?`` placeholders like sqlite3.

    The state tests write rows with chosen ids through it, on either backend.
    """

    def __init__(self, url: str) -> None:
        import psycopg

        self._conn = psycopg.connect(url, autocommit=True)

    def execute(self, sql: str, params: Sequence[object] = ()) -> Any:
        """Run one statement; the cursor has ``fetchone``/``fetchall`` and iterates."""
        return self._conn.execute(sql.replace("?", "%s"), tuple(params))  # type: ignore[call-overload]

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


def _start(
    bin_dir: Path,
    data: Path,
    base: Path,
    log: Path,
    listen: Sequence[str],
    run_as: str | None,
    max_connections: int,
) -> int:
    """``pg_ctl start`` on a free port; the port it listens on.

    The port is free when picked but only bound when the server starts: another process
    (a parallel pytest-xdist worker starting its own server, any loopback client) may take
    it in between. That start fails with "Address already in use" in the log, and a new
    port is picked; any other failure is raised.
    """
    for attempt in range(_PORT_ATTEMPTS):
        port = _free_port()
        options = (
            f"-p {port} -k {base} -c listen_addresses={','.join(listen)} -c fsync=off"
            " -c synchronous_commit=off -c full_page_writes=off"
            f" -c max_connections={max_connections}"
        )
        log.unlink(missing_ok=True)
        try:
            subprocess.run(
                _as_owner([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o",
                           options, "-w", "-t", str(_START_TIMEOUT_S), "start"], run_as),
                check=True, capture_output=True, text=True, timeout=_START_TIMEOUT_S + 10,
            )  # fmt: skip
        except subprocess.CalledProcessError:
            taken = log.exists() and "Address already in use" in log.read_text()
            if not taken or attempt == _PORT_ATTEMPTS - 1:
                raise
            continue
        return port
    raise AssertionError("unreachable")


def _as_owner(argv: Sequence[str], user: str | None) -> list[str]:
    return ["runuser", "-u", user, "--", *argv] if user else list(argv)


@contextlib.contextmanager
def pg_server(
    *,
    listen: Sequence[str] = ("127.0.0.1",),
    trust_networks: Sequence[str] = (),
    max_connections: int = 200,
) -> Iterator[PgServer]:
    """Start a throw-away server; stop it and remove its files on exit.

    Args:
        listen: Addresses the server listens on (they must exist when it starts).
        trust_networks: CIDR networks also admitted without a password (``pg_hba``
            ``host`` lines), for clients in other network namespaces.
        max_connections: The server's ``max_connections`` (its
            ``superuser_reserved_connections``, 3, count against it): the fleet tests
            start a small server to see what a full one does to real flows.
    """
    bin_dir = find_pg_bin()
    root = os.geteuid() == 0
    run_as = "postgres" if root else None
    # Named by the pytest-xdist worker (gw0, gw1, ...): each worker starts its own server.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    base = Path(tempfile.mkdtemp(prefix=f"steerflow-pg-{worker}-"))
    data = base / "data"
    if root:
        entry = pwd.getpwnam("postgres")
        os.chown(base, entry.pw_uid, entry.pw_gid)
    base.chmod(0o755)
    user = "postgres" if root else pwd.getpwuid(os.geteuid()).pw_name
    log = base / "server.log"
    try:
        subprocess.run(
            _as_owner([str(bin_dir / "initdb"), "-D", str(data), "-U", user, "-A", "trust",
                       "-E", "UTF8", "--no-sync", "--no-instructions"], run_as),
            check=True, capture_output=True, text=True, timeout=_START_TIMEOUT_S,
        )  # fmt: skip
        if trust_networks:
            with open(data / "pg_hba.conf", "a", encoding="utf-8") as hba:
                hba.writelines(f"host all all {net} trust\n" for net in trust_networks)
        port = _start(bin_dir, data, base, log, listen, run_as, max_connections)
    except subprocess.CalledProcessError as exc:
        detail = log.read_text() if log.exists() else ""
        shutil.rmtree(base, ignore_errors=True)
        raise RuntimeError(
            f"cannot start a test PostgreSQL server: {exc.stderr or exc}\n{detail}"
        ) from exc
    try:
        yield PgServer(bin_dir, data, port, user)
    finally:
        subprocess.run(
            _as_owner([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w",
                       "stop"], run_as),
            capture_output=True, timeout=_START_TIMEOUT_S,
        )  # fmt: skip
        shutil.rmtree(base, ignore_errors=True)
