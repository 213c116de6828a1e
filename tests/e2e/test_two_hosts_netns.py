"""Two hosts in two network namespaces, one PostgreSQL state DB (issue 15).

Each host is a network namespace joined to the root namespace by its own veth pair (a
/30 of ``10.231.0.0/16``) plus a UTS namespace whose host name (``host-a``, ``host-b``)
is the host identity steerflow records and compares, with a ``$HOME`` of its own. The
PostgreSQL server runs in the root namespace and listens on the two root-side veth
addresses only (and loopback, for this test process), so each host reaches it over its
own link; ``pg_stat_activity`` shows a client from each namespace's address.

A flow runs on ``host-a`` (its run directory under host-a's home); ``host-b`` pauses it
(the next node is held), sends a message (rendered into the next node's instruction, read
back on ``host-a`` with ``show``), resumes and stops it (exit 75). A second flow is
SIGKILLed: ``host-a`` sees the dead pid at once, ``host-b`` judges by the heartbeat only,
``running`` while it is fresh, ``interrupted`` once it is older than the window (aged in
the row, as ``test_two_hosts_pg.py`` does, rather than waited out).

The namespaces need root and iproute2/util-linux: without them the test fails and says
so (nothing is skipped).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ctl_support import independent_plan, write_yaml

from pg_support import PgRaw, PgServer, pg_server
from steerflow.errors import RefusedError
from steerflow.state import HEARTBEAT_STALE_S, STATE_DB_URL_ENV, ControlRow, StateDB
from waiting import wait_until

# One pytest-xdist worker runs the module (`--dist loadgroup`): its namespaces and server
# are module fixtures, built once instead of once per worker that drew one of its tests.
pytestmark = pytest.mark.xdist_group("two-hosts-netns")

GATED_CLI = Path(__file__).resolve().with_name("gated_cli.py")
PYTHON = sys.executable
STEERFLOW = str(Path(sys.executable).parent / "steerflow")
WAIT_S = 30.0
_NET_PREFIX = "10.231"
_SCRUBBED = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY")

# Holds one connection from inside a namespace and prints the address the server saw.
_HOLD_CONNECTION = (
    "import sys, psycopg\n"
    "conn = psycopg.connect(sys.argv[1], connect_timeout=10)\n"
    "print(conn.execute('SELECT host(inet_client_addr())').fetchone()[0], flush=True)\n"
    "sys.stdin.read()\n"
)


@dataclass(frozen=True)
class Host:
    """One simulated machine: a network namespace, its address and the server's side."""

    name: str  # the host name inside its UTS namespace
    netns: str
    addr: str  # this host's own address (namespace side of its veth)
    server_addr: str  # the root-side address of its veth, where PostgreSQL listens
    network: str


def _run(argv: Sequence[str], what: str) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        pytest.fail(f"{what}: `{shlex.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def _require_namespaces() -> None:
    missing = [tool for tool in ("ip", "unshare", "hostname") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        pytest.fail(
            "the two-host test needs root (network and UTS namespaces) and the tools ip "
            f"(iproute2), unshare and hostname (util-linux); euid={os.geteuid()}, "
            f"missing={missing or 'none'}"
        )
    if not Path(STEERFLOW).exists():
        pytest.fail(f"the steerflow console script is missing next to {PYTHON}: install the venv")


def _free_octets(count: int) -> list[int]:
    """Third octets of ``10.231.K.0/30`` networks no interface of this machine uses."""
    shown = _run(["ip", "-4", "-o", "addr", "show"], "listing addresses")
    used = {int(m) for m in re.findall(rf"inet {re.escape(_NET_PREFIX)}\.(\d+)\.", shown)}
    start = os.getpid() % 250
    free = [k for k in ((start + i) % 250 + 1 for i in range(250)) if k not in used]
    if len(free) < count:
        pytest.fail(f"no free {_NET_PREFIX}.K.0/30 networks left for the test namespaces")
    return free[:count]


@contextmanager
def _addresses_locked() -> Iterator[None]:
    """Held from reading the machine's addresses to adding ours, across processes.

    Two test processes (pytest-xdist workers, or the suites of two checkouts) picking
    networks at once would both see the same ``10.231.K.0/30`` free. The lock file is only
    ever locked, never read, so one left behind is harmless.
    """
    path = Path(tempfile.gettempdir()) / "steerflow-test-netns.lock"
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _make_host(
    letter: str, octet: int, tag: str, namespaces: list[str], root_links: list[str]
) -> Host:
    """One namespace and its veth pair; what it made is appended for the teardown."""
    netns, root_if, ns_if = f"steerflow-{tag}-{letter}", f"sf{tag}{letter}r", f"sf{tag}{letter}n"
    server_addr, addr = f"{_NET_PREFIX}.{octet}.1", f"{_NET_PREFIX}.{octet}.2"
    _run(["ip", "netns", "add", netns], "creating a network namespace")
    namespaces.append(netns)
    _run(["ip", "link", "add", root_if, "type", "veth", "peer", "name", ns_if,
          "netns", netns], "creating a veth pair")  # fmt: skip
    root_links.append(root_if)
    _run(["ip", "addr", "add", f"{server_addr}/30", "dev", root_if], "addressing a veth")
    _run(["ip", "link", "set", root_if, "up"], "raising a veth")
    _run(["ip", "-n", netns, "addr", "add", f"{addr}/30", "dev", ns_if], "addressing")
    _run(["ip", "-n", netns, "link", "set", ns_if, "up"], "raising the namespace veth")
    _run(["ip", "-n", netns, "link", "set", "lo", "up"], "raising the namespace loopback")
    return Host(f"host-{letter}", netns, addr, server_addr, f"{_NET_PREFIX}.{octet}.0/30")


@pytest.fixture(scope="module")
def hosts() -> Iterator[tuple[Host, Host]]:
    """``host-a`` and ``host-b``: two namespaces, each with its own veth link to the root."""
    _require_namespaces()
    tag = str(os.getpid())
    namespaces: list[str] = []
    root_links: list[str] = []
    made: list[Host] = []
    try:
        with _addresses_locked():
            for letter, octet in zip("ab", _free_octets(2), strict=True):
                made.append(_make_host(letter, octet, tag, namespaces, root_links))
        yield made[0], made[1]
    finally:
        # Deleting a namespace destroys its veth end and with it the pair; a root end
        # still listed after that (it should not be) is removed as well.
        for netns in namespaces:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
        for link in root_links:
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)


@pytest.fixture(scope="module")
def pg_two_hosts(hosts: tuple[Host, Host]) -> Iterator[PgServer]:
    """A server on loopback and both root-side veth addresses, trusting both /30s."""
    a, b = hosts
    with pg_server(
        listen=("127.0.0.1", a.server_addr, b.server_addr), trust_networks=(a.network, b.network)
    ) as server:
        yield server


@dataclass
class Machine:
    """A host as the test drives it: commands run in its namespaces, under its ``$HOME``."""

    host: Host
    home: Path  # $HOME; the steerflow home is the default ``~/.steerflow``
    url: str  # the state DB through this host's own link

    @property
    def steerflow_home(self) -> Path:
        return self.home / ".steerflow"

    def argv(self, *argv: str) -> list[str]:
        """``argv`` run as a process of this host (its netns, its own host name)."""
        inner = f"hostname {shlex.quote(self.host.name)} && exec {shlex.join(argv)}"
        return ["ip", "netns", "exec", self.host.netns, "unshare", "--uts", "sh", "-c", inner]

    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("STEERFLOW_") and k not in _SCRUBBED
        }
        env.update({"HOME": str(self.home), "PYTHONUNBUFFERED": "1", STATE_DB_URL_ENV: self.url})
        return env

    def steerflow(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``steerflow ARGS`` on this host, to completion."""
        return subprocess.run(
            self.argv(STEERFLOW, *args), capture_output=True, text=True, timeout=60,
            env=self.env(), cwd=self.home, check=False,
        )  # fmt: skip

    def json(self, *args: str) -> dict[str, Any]:
        proc = self.steerflow(*args, "--json")
        assert proc.returncode == 0, (self.host.name, args, proc.returncode, proc.stderr)
        value: dict[str, Any] = json.loads(proc.stdout)
        return value

    def ctl(self, *args: str) -> str:
        """A ``ctl`` writer that must queue; returns the control id it printed."""
        proc = self.steerflow("ctl", *args)
        assert proc.returncode == 0, (self.host.name, args, proc.stderr)
        assert "queued" in proc.stdout, proc.stdout
        return proc.stdout.splitlines()[0].strip()

    def status(self, session_id: str) -> str:
        return str(self.json("ctl", "status", session_id)["status"])

    def listed(self, session_id: str) -> str:
        runs = self.json("runs")["runs"]
        return str(next(r["status"] for r in runs if r["session_id"] == session_id))

    def start_flow(self, args: Sequence[str], logs: Path) -> subprocess.Popen[str]:
        """``steerflow flow ARGS --json`` with script calls held on gate files."""
        with open(logs.with_suffix(".out"), "w") as out, open(logs.with_suffix(".err"), "w") as err:
            return subprocess.Popen(
                self.argv(PYTHON, str(GATED_CLI), "flow", *args, "--json"),
                stdout=out, stderr=err, text=True, env=self.env(), cwd=self.home,
            )  # fmt: skip


def _host_url(server: PgServer, db_url: str, host: Host) -> str:
    loopback = f"@127.0.0.1:{server.port}/"
    assert loopback in db_url, db_url
    return db_url.replace(loopback, f"@{host.server_addr}:{server.port}/")


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode() for part in raw.split(b"\0") if part]


class Observer:
    """This test's own view of the state DB (over loopback, in the root namespace)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _db(self) -> StateDB:
        return StateDB.open_url(self.url, create=False)

    def control(self, control_id: str) -> ControlRow:
        with self._db() as db:
            row = db.get_control(control_id)
        assert row is not None, control_id
        return row

    def nodes(self, session_id: str) -> dict[str, str]:
        with self._db() as db:
            return {n.node_key: n.status for n in db.list_nodes(session_id)}

    def running_session(
        self, other_than: set[str]
    ) -> tuple[str, str, int | None, str | None] | None:
        try:
            db = self._db()
        except RefusedError:  # the flow has not created the tables yet
            return None
        with db:
            for row in db.list_sessions(limit=5):
                if row.status == "running" and row.id not in other_than:
                    return row.id, row.run_id or "", row.owner_pid, row.owner_host
        return None


def _alive(proc: subprocess.Popen[str], what: str) -> None:
    if proc.poll() is not None:
        raise AssertionError(f"the flow exited ({proc.returncode}) while waiting for {what}")


def _wait(probe: Any, what: str, proc: subprocess.Popen[str] | None = None) -> Any:
    def check() -> Any:
        value = probe()
        if not value and proc is not None:
            _alive(proc, what)
        return value

    return wait_until(check, timeout=WAIT_S, what=what, interval=0.05)


def _wait_stamped(
    obs: Observer, control_id: str, proc: subprocess.Popen[str] | None = None
) -> ControlRow:
    row: ControlRow = _wait(
        lambda: r if (r := obs.control(control_id)).applied_at is not None else None,
        f"control {control_id} stamped",
        proc,
    )
    return row


def _start_session(
    machine: Machine, obs: Observer, args: Sequence[str], logs: Path, seen: set[str]
) -> tuple[subprocess.Popen[str], str, str]:
    """Start a flow on ``machine``; return it once its session is running and its
    Popen pid is the flow process itself (the namespace wrappers exec'd into it)."""
    proc = machine.start_flow(args, logs)
    try:
        sid, run_id, owner_pid, owner_host = _wait(
            lambda: obs.running_session(seen), "the flow's session", proc
        )
        # The session records the real host name of host-a's UTS namespace and the pid
        # we hold: the `ip netns exec`/`unshare`/`sh` chain exec'd into the flow process.
        assert owner_host == machine.host.name, owner_host
        assert owner_pid == proc.pid, (owner_pid, proc.pid)
        cmdline = _cmdline(proc.pid)
        assert cmdline[1:3] == [str(GATED_CLI), "flow"], cmdline
    except BaseException:
        proc.kill()
        proc.wait(timeout=30)
        raise
    return proc, sid, run_id


def _client_addrs(admin: str) -> set[str]:
    conn = PgRaw(admin)
    try:
        rows = conn.execute(
            "SELECT host(client_addr) FROM pg_stat_activity WHERE client_addr IS NOT NULL"
        ).fetchall()
    finally:
        conn.close()
    return {str(r[0]) for r in rows}


@pytest.mark.timeout(180)
def test_pause_message_stop_and_liveness_across_namespaces(
    tmp_path: Path, hosts: tuple[Host, Host], pg_two_hosts: PgServer
) -> None:
    host_a, host_b = hosts
    admin = pg_two_hosts.new_database()
    obs = Observer(admin)
    a = Machine(host_a, tmp_path / "home-a", _host_url(pg_two_hosts, admin, host_a))
    b = Machine(host_b, tmp_path / "home-b", _host_url(pg_two_hosts, admin, host_b))
    for machine in (a, b):
        machine.steerflow_home.mkdir(mode=0o700, parents=True)
    gates = a.steerflow_home  # gated_cli reads gate/started/release files in the flow's home
    # Each namespace routes only its own /30: host-a has no way to host-b's server address.
    unreachable = subprocess.run(
        ["ip", "-n", host_a.netns, "route", "get", host_b.server_addr],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert unreachable.returncode != 0, unreachable.stdout

    independent_plan(tmp_path / "plan.yaml", 4)
    write_yaml(tmp_path / "script.yaml", {"*": {}})
    args = [
        "--plan", str(tmp_path / "plan.yaml"),
        "--model", f"script:{tmp_path / 'script.yaml'}",
        "--concurrency", "1",
    ]  # fmt: skip
    for key in ("n000", "n001"):
        (gates / f"gate-{key}").touch()

    proc, sid, run_id = _start_session(a, obs, args, tmp_path / "flow-1", set())
    try:
        holder_err = tmp_path / "holder.err"
        with open(holder_err, "w") as err:
            holder = subprocess.Popen(
                b.argv(PYTHON, "-c", _HOLD_CONNECTION, b.url), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, text=True, env=b.env(),
            )  # fmt: skip
        try:
            _wait(lambda: (gates / "started-n000").exists(), "n000 in flight", proc)
            assert holder.stdout is not None
            line = holder.stdout.readline().strip()  # bounded: the holder's connect_timeout
            assert line == host_b.addr, (line, holder_err.read_text())
            # Both hosts connected at once, each from its own namespace's address.
            seen = _wait(
                lambda: s if {host_a.addr, host_b.addr} <= (s := _client_addrs(admin)) else None,
                "a client from each namespace in pg_stat_activity",
                proc,
            )
            assert host_a.server_addr not in seen and host_b.server_addr not in seen, seen
        finally:
            holder.communicate(timeout=30)  # closes its stdin: it disconnects and exits

        assert b.status(sid) == "running"
        # Pause from host-b: the in-flight node finishes, the next one is held.
        assert _wait_stamped(obs, b.ctl("pause", sid), proc).result == "applied"
        (gates / "release-n000").touch()
        statuses = _wait(
            lambda: s if (s := obs.nodes(sid)).get("n001") == "paused" else None,
            "n001 held at the pause gate",
            proc,
        )
        assert statuses["n000"] == "completed", statuses
        assert not (gates / "started-n001").exists(), "n001 was invoked while paused"
        view = b.json("ctl", "status", sid)
        assert (view["status"], view["phase"]) == ("running", "paused"), view

        # A message from host-b, then resume: it lands in n001's rendered instruction.
        text = f"from host-b {uuid.uuid4().hex[:8]}"
        message = b.ctl("msg", sid, text)
        _wait(lambda: obs.control(message).result, "the message claimed", proc)
        assert _wait_stamped(obs, b.ctl("resume", sid), proc).result == "applied"
        _wait(lambda: (gates / "started-n001").exists(), "n001 invoked after resume", proc)
        assert _wait_stamped(obs, message, proc).result == "applied"
        node = a.json("show", run_id, "n001")
        assert text in str(node["instruction"]), node
        assert not (b.steerflow_home / "runs").exists()

        # Stop from host-b: graceful, the in-flight node finishes, the flow exits 75.
        assert _wait_stamped(obs, b.ctl("stop", sid, "--reason", "from host-b"), proc).result == (
            "applied"
        )
        (gates / "release-n001").touch()
        assert proc.wait(timeout=60) == 75, (tmp_path / "flow-1.err").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert b.status(sid) == "stopped"
    assert b.listed(sid) == "stopped"

    # A second flow, SIGKILLed: host-a sees the dead pid, host-b only the heartbeat.
    for name in ("release-n000", "release-n001", "started-n000", "started-n001"):
        (gates / name).unlink()
    proc, killed, _ = _start_session(a, obs, args, tmp_path / "flow-2", {sid})
    try:
        _wait(lambda: (gates / "started-n000").exists(), "n000 in flight", proc)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert a.status(killed) == "interrupted"
    assert b.status(killed) == "running"  # never judged by a pid of another host
    assert b.listed(killed) == "running"
    conn = PgRaw(admin)
    try:
        conn.execute(
            "UPDATE sessions SET heartbeat_at = heartbeat_at - ? WHERE id = ?",
            (HEARTBEAT_STALE_S + 1, killed),
        )
    finally:
        conn.close()
    assert b.status(killed) == "interrupted"
    assert b.listed(killed) == "interrupted"


def _lines(home: Path, run_id: str) -> list[dict[str, Any]]:
    path = home / ".steerflow" / "script-invocations.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [line for line in lines if line["run_id"] == run_id]


def _lease(obs: Observer, session_id: str) -> dict[str, Any]:
    with obs._db() as db:
        clock = db.backend.clock_sql
        rows = db.backend.query(
            f"SELECT lease_expires < {clock} AS expired, lease_taken_by, lease_epoch, status"
            " FROM sessions WHERE id = ?",
            (session_id,),
        )
    return rows[0]


@pytest.mark.timeout(240)
def test_a_stalled_owner_is_fenced_across_namespaces(
    tmp_path: Path, hosts: tuple[Host, Host], pg_two_hosts: PgServer
) -> None:
    """Issue 27: host-a's flow is SIGSTOPped past its lease, host-b resumes it, host-a wakes.

    Both hosts share one home (a shared file system: host-b resumes from host-a's run
    directory), each reaches PostgreSQL over its own link, and each has its own host name.
    """
    host_a, host_b = hosts
    admin = pg_two_hosts.new_database()
    obs = Observer(admin)
    shared = tmp_path / "shared-home"
    a = Machine(host_a, shared, _host_url(pg_two_hosts, admin, host_a))
    b = Machine(host_b, shared, _host_url(pg_two_hosts, admin, host_b))
    a.steerflow_home.mkdir(mode=0o700, parents=True)
    angles = ("angle-history", "angle-tools", "angle-risks")
    script = tmp_path / "slow.yaml"
    write_yaml(script, {"*": {"delay": 0.2}, **{k: {"delay": 4.0} for k in angles}})
    lease = {"STEERFLOW_LEASE_S": "2"}
    err_a = tmp_path / "flow-a.err"
    with open(tmp_path / "flow-a.out", "w") as out, open(err_a, "w") as err:
        proc = subprocess.Popen(
            a.argv(STEERFLOW, "play", "demo", "--model", f"script:{script}", "--json"),
            stdout=out, stderr=err, text=True, env={**a.env(), **lease}, cwd=a.home,
        )  # fmt: skip
    try:
        sid, run_id, owner_pid, owner_host = _wait(
            lambda: obs.running_session(set()), "host-a's session", proc
        )
        assert (owner_pid, owner_host) == (proc.pid, host_a.name)
        _wait(lambda: {ln["node"] for ln in _lines(shared, run_id)} >= {"scope", *angles},
              "the three angles in flight on host-a", proc)  # fmt: skip
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            stopped_at = time.time()
            _wait(lambda: _lease(obs, sid)["expired"], "host-a's lease expired by the server")
            resumed = subprocess.run(
                b.argv(STEERFLOW, "resume", run_id, "--json"), capture_output=True, text=True,
                timeout=120, env={**b.env(), **lease}, cwd=b.home, check=False,
            )  # fmt: skip
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert resumed.returncode == 0, resumed.stderr
        assert proc.wait(timeout=60) == 3, err_a.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    new_run = json.loads(resumed.stdout)["run_id"]
    new_sid = json.loads(resumed.stdout)["session_id"]
    fenced = _lease(obs, sid)
    assert (fenced["lease_taken_by"], fenced["status"]) == (new_sid, "interrupted"), fenced
    line = [ln for ln in err_a.read_text().splitlines() if "taken over" in ln]
    assert len(line) == 1 and all(x in line[0] for x in (run_id, new_sid, host_b.name)), line
    owner = _lines(shared, run_id)
    assert sorted(ln["node"] for ln in owner) == sorted(["scope", *angles]), owner
    assert all(ln["ts"] < stopped_at for ln in owner), owner
    again = [ln["node"] for ln in _lines(shared, new_run)]
    assert sorted(again) == sorted([*angles, "draft", "review", "summary", "synthesis"]), again
