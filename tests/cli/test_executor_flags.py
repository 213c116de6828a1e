"""``--executor``/``--ray-address`` refusals through the real CLI, with no cluster at all.

Each is one line on stderr with the contract's exit code, before a run directory exists:
nothing was allocated, nothing paid for.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from steerflow.state import BUSY_TIMEOUT_S
from waiting import wait_until

PLAY = ["play", "demo"]


def _run(
    home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:

    base = {k: v for k, v in os.environ.items() if not k.startswith(("STEERFLOW_", "RAY_"))}
    return subprocess.run(
        [sys.executable, "-m", "steerflow", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **(env or {})},
        check=False,
    )


def _no_run_dir(home: Path) -> bool:
    runs = home / "runs"
    return not runs.exists() or not any(runs.iterdir())


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again when the block ends


def test_without_the_ray_extra_executor_ray_is_one_usage_line_naming_it(tmp_path: Path) -> None:
    # a `ray` that cannot be imported, first on the path: what a venv without the extra sees
    fake = tmp_path / "site" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\", name='ray')\n")
    done = _run(tmp_path / "home", *PLAY, "--executor", "ray",
                env={"PYTHONPATH": str(tmp_path / "site")})  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "steerflow: error: --executor ray needs the 'ray' Python package, which is not "
        "installed: pip install 'steerflow[ray]'"
    ]
    assert _no_run_dir(tmp_path / "home")


@pytest.mark.parametrize(
    ("address", "code", "says"),
    [
        ("nonsense", 2, "not HOST:PORT"),
        ("ray://head:10001", 2, "Ray Client addresses are not supported"),
        ("127.0.0.1:{port}", 3, "cannot connect to the Ray cluster at '127.0.0.1:"),
        # The check FlowOptions(ray_address="") runs too, naming the flag (decision 245).
        ("", 2, "invalid value for --ray-address: '' is empty"),
        ("..:1", 2, "'..' is not a host name"),
        ("x" * 100_000 + ":1", 2, "(100002 characters): not HOST:PORT"),
        ("\x1b[31mred\x07:1", 3, "at '\\x1b[31mred\\x07:1'"),
    ],
)
def test_a_bad_or_dead_ray_address_is_refused_at_once(
    tmp_path: Path, address: str, code: int, says: str
) -> None:
    address = address.format(port=_closed_port())
    done = _run(tmp_path / "home", *PLAY, "--executor", "ray", "--ray-address", address)
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    # hostile input is echoed escaped and bounded: no raw control bytes, no flood
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr and len(lines[0]) < 400
    assert _no_run_dir(tmp_path / "home")


def test_the_executor_comes_from_the_environment_and_is_checked(tmp_path: Path) -> None:
    done = _run(tmp_path / "home", *PLAY, env={"STEERFLOW_EXECUTOR": "dask"})
    assert done.returncode == 2
    assert "'dask' is not one of 'local', 'ray'" in done.stderr
    # and the variable selects ray, whose missing cluster is then the refusal
    port = _closed_port()
    done = _run(tmp_path / "home", *PLAY, env={"STEERFLOW_EXECUTOR": "ray",
                                               "RAY_ADDRESS": f"127.0.0.1:{port}"})  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert f"cannot connect to the Ray cluster at '127.0.0.1:{port}'" in done.stderr


def test_every_running_command_takes_the_executor_flags() -> None:
    for command in ("flow", "play", "resume", "agent"):
        shown = subprocess.run([sys.executable, "-m", "steerflow", command, "--help"],
                               capture_output=True, text=True, check=True)  # fmt: skip
        assert "--executor [local|ray]" in shown.stdout, command
        assert "--ray-address ADDR" in shown.stdout, command


class _Silent:
    """A loopback listener that accepts every connection and never sends a byte."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[float] = []  # monotonic time of each accept
        self._held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):  # closed by the test
            while True:
                conn, _ = self.sock.accept()
                self._held.append(conn)
                self.accepted.append(time.monotonic())

    def close(self) -> None:
        self.sock.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def silent() -> Iterator[_Silent]:
    listener = _Silent()
    yield listener
    listener.close()


def test_a_listener_that_never_answers_is_refused_within_the_state_dbs_bound(
    tmp_path: Path, silent: _Silent
) -> None:
    """Accepted and never answered: exit 3 in one line once the bound (the state DB's, 10 s)
    has passed since the first connection, not Ray's minutes of retries."""
    address = f"127.0.0.1:{silent.port}"
    done = _run(tmp_path / "home", *PLAY, "--executor", "ray", "--ray-address", address)
    ended = time.monotonic()
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"steerflow: error: --executor ray: cannot connect to the Ray cluster at {address!r}: "
        f"no answer within {BUSY_TIMEOUT_S:g} s"
    ]
    assert silent.accepted and ended - silent.accepted[0] < BUSY_TIMEOUT_S + 5
    assert _no_run_dir(tmp_path / "home")


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_connecting_ends_the_wait_at_once(
    tmp_path: Path, silent: _Silent, signum: signal.Signals, code: int
) -> None:
    address = f"127.0.0.1:{silent.port}"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("STEERFLOW_", "RAY_"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "steerflow", "--home", str(tmp_path / "home"), *PLAY,
         "--executor", "ray", "--ray-address", address],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=base,
    )  # fmt: skip
    try:
        wait_until(lambda: silent.accepted or proc.poll() is not None, timeout=60,
                   what="steerflow's connection to the listener")  # fmt: skip
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signum)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # the signal's own exit, not the bound's refusal (3): ended by the signal, at once
    assert proc.returncode == code, err
    assert time.monotonic() - sent < BUSY_TIMEOUT_S
    assert err.strip().splitlines() == [
        f"steerflow: error: --executor ray: stopped by {signum.name} while connecting to the "
        f"Ray cluster at {address!r}; nothing was started"
    ]
    assert _no_run_dir(tmp_path / "home")
