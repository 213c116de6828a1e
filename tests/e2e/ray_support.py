"""A real two-node Ray cluster on this machine, for the ``--executor ray`` tests.

``ray start --head --block`` and a second ``ray start --block --address=...`` with the
custom resource ``side``, each on its own loopback address (``127.0.0.2`` and ``127.0.0.3``:
Ray rewrites ``127.0.0.1`` and ``localhost`` to the machine's routable address, and the
tests stay on loopback). One CPU each, a small object store, no dashboard, no usage stats:
the machine has two cores. The processes are ended by their pids (SIGTERM, then SIGKILL
for anything left under the cluster's temp directory).

Ray's workers run with ``PYTHONPATH`` holding this directory, so the ``python:`` functions
of ``ray_nodes.py`` import there as they do in the flow process.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from waiting import wait_until

__all__ = ["HEAD_IP", "SIDE_IP", "RayTestCluster", "start_cluster"]

HERE = Path(__file__).resolve().parent
RAY = Path(sys.executable).parent / "ray"
HEAD_IP, SIDE_IP = "127.0.0.2", "127.0.0.3"
_START_TIMEOUT_S = 90.0
_OBJECT_STORE = str(80 * 1024 * 1024)
_ADDRESS = re.compile(r"ray start --address='([0-9.]+:[0-9]+)'")


#: Marks every process of one test cluster (Ray renames its agents' command lines).
_MARK = "STEERFLOW_TEST_RAY_ROOT"


def cluster_env(path: str = str(HERE), root: Path | None = None) -> dict[str, str]:
    """The environment of the cluster's processes (and so of its workers)."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.update(RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=path, PYTHONUNBUFFERED="1")
    if root is not None:
        env[_MARK] = str(root)
    return env


def _marked(root: Path) -> list[int]:
    """Pids of the processes started with this cluster's mark in their environment."""
    mark = f"{_MARK}={root}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if mark in (proc / "environ").read_bytes().split(b"\0"):
                    pids.append(int(proc.name))
    return pids


@dataclass
class RayTestCluster:
    """The running cluster: its GCS address, and the two ``ray start --block`` processes."""

    root: Path
    #: The workers' ``PYTHONPATH`` (where the ``python:`` node functions import from).
    path: str = str(HERE)
    address: str = ""
    head: subprocess.Popen[bytes] | None = None
    side: subprocess.Popen[bytes] | None = None
    _logs: list[Path] = field(default_factory=list)

    def _start(self, name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.root / f"{name}.log"
        self._logs.append(log)
        temp = self.root / name
        temp.mkdir(exist_ok=True)
        argv = [str(RAY), "start", "--block", "--num-cpus=1",
                f"--object-store-memory={_OBJECT_STORE}", f"--temp-dir={temp}",
                "--disable-usage-stats", *args]  # fmt: skip
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=cluster_env(self.path, self.root)
            )
        return proc, log

    def start_head(self) -> None:
        self.head, log = self._start("head", "--head", "--port=0", "--include-dashboard=false",
                                     f"--node-ip-address={HEAD_IP}")  # fmt: skip

        def address() -> str | None:
            self._alive(self.head, log)
            found = _ADDRESS.search(log.read_text(errors="replace"))
            return found.group(1) if found else None

        self.address = wait_until(address, timeout=_START_TIMEOUT_S, what="the Ray head")

    def start_side(self) -> None:
        """Start (or start again) the node with the ``side`` resource and wait for it."""
        self.side, log = self._start("side", f"--address={self.address}",
                                     f"--node-ip-address={SIDE_IP}",
                                     '--resources={"side": 1}')  # fmt: skip

        def started() -> bool:
            self._alive(self.side, log)
            return "Ray runtime started" in log.read_text(errors="replace")

        wait_until(started, timeout=_START_TIMEOUT_S, what="the Ray side node")
        # The flow refuses a role no alive node can place: wait until the GCS lists it.
        probe = (
            "import ray, sys\n"
            f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
            "from waiting import wait_until\n"
            f"ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False)\n"
            "wait_until(lambda: any(n['Alive'] and n['Resources'].get('side')\n"
            "                       for n in ray.nodes()), timeout=60, interval=0.1,\n"
            "           what='the side node in the GCS')\n"
        )
        subprocess.run(
            [sys.executable, "-c", probe], env=cluster_env(self.path), check=True, timeout=90
        )

    def ensure_side(self) -> None:
        """The side node is up (a test may have killed it)."""
        if self.side is None or self.side.poll() is not None:
            self.start_side()

    def side_raylet_pid(self) -> int:
        """The side node's raylet (a child of its ``ray start``)."""
        assert self.side is not None
        out = subprocess.run(["pgrep", "-P", str(self.side.pid), "-f", "raylet"],
                             capture_output=True, text=True, check=False)  # fmt: skip
        pids = [int(p) for p in out.stdout.split()]
        assert pids, f"no raylet under ray start pid {self.side.pid}"
        return pids[0]

    @staticmethod
    def _alive(proc: subprocess.Popen[bytes] | None, log: Path) -> None:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"ray start exited {proc.returncode}:\n{log.read_text()[-4000:]}")

    def close(self) -> None:
        for proc in (self.side, self.head):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (self.side, self.head):
            if proc is not None:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        # Whatever a killed raylet left behind (its agents rename their command lines).
        for pid in _marked(self.root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.root)

    def tail(self) -> str:
        """The cluster's own logs' ends, for an assertion message."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
            for p in self._logs
            if p.exists()
        )


def start_cluster(path: str = str(HERE)) -> RayTestCluster:
    """Head and side node, up, workers importing from ``path``; the caller closes it."""
    # Short and under /tmp: Ray's unix sockets live below the temp dir (108-byte paths).
    cluster = RayTestCluster(Path(tempfile.mkdtemp(prefix="sfray-", dir="/tmp")), path)
    try:
        cluster.start_head()
        cluster.start_side()
    except BaseException:
        cluster.close()
        raise
    return cluster
