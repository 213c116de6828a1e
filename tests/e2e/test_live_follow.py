"""``steerflow show TARGET [NODE] --follow`` in a second real process (issue 31).

Each flow runs through ``gated_cli.py``; its streaming node is held mid-stream
(``hold-stream-<node>``) so the follower's view of a running node is asserted while it
is known to be running, with no sleeps.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from ctl_support import clean_env, live_flow, run_cli, steerflow_argv, wait_for, write_yaml

GATED_CLI = Path(__file__).resolve().with_name("gated_cli.py")
CHUNKS = ["one ", "two\n", "\x1b]0;pwned\x07red\n", "four\n"]


class Follower:
    """A ``show --follow`` process whose stdout is read as it comes.

    ``gated``: run through ``gated_cli.py``, which logs every view the follower reads.
    """

    started: ClassVar[list[Follower]] = []

    def __init__(
        self,
        home: Path,
        *args: str,
        preexec: Callable[[], None] | None = None,
        gated: bool = False,
    ) -> None:
        self.err_path = home.parent / f"follower-{len(list(home.parent.glob('follower-*')))}.err"
        argv = steerflow_argv(home, "show", *args, "--follow")
        if gated:
            argv = [sys.executable, str(GATED_CLI), *argv[3:]]
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=err,
                env=clean_env(),
                preexec_fn=preexec or _as_from_a_terminal,
            )
        Follower.started.append(self)
        self._out = bytearray()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while block := self.proc.stdout.read1(4096):
            with self._cond:
                self._out += block
                self._cond.notify_all()

    @property
    def text(self) -> str:
        with self._cond:
            return self._out.decode()

    def wait_text(self, needle: str, timeout: float = 30.0) -> str:
        with self._cond:
            ok = self._cond.wait_for(lambda: needle in self._out.decode(), timeout)
        assert ok, (
            f"follower never printed {needle!r}; got {self.text!r}, {self.err_path.read_text()}"
        )
        return self.text

    def finish(self, timeout: float = 60.0) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()  # never leak a follower into the next test on this worker
            raise
        self._thread.join(timeout=10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return code

    def kill(self) -> None:
        """Kill the follower if it still runs (ours: we hold its pid) and release its pipe."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._thread.join(timeout=10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture(autouse=True)
def _no_follower_left() -> Iterator[None]:
    """A test that failed midway leaves no follower running into the next one."""
    yield
    while Follower.started:
        Follower.started.pop().kill()


def _as_from_a_terminal() -> None:
    """The child's SIGINT as a shell in a terminal leaves it: default and not blocked.

    A pytest worker may hand its children SIGINT blocked or ignored (whatever ran before on
    that worker), and Ctrl-C would then never reach the follower: seen once in a full run,
    a follower that outlived its SIGINT by the whole 60 s bound.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _flow_args(tmp_path: Path, script: dict[str, object], keys: str = "s") -> list[str]:
    plan = [{"agent_id": k, "instruction": f"step {k}"} for k in keys]
    write_yaml(tmp_path / "plan.yaml", {"name": "live", "plan": plan})
    path = write_yaml(tmp_path / "script.yaml", script)
    return ["--plan", str(tmp_path / "plan.yaml"), "--model", f"script:{path}"]


def _gated(home: Path, args: list[str]) -> list[str]:
    return [sys.executable, str(GATED_CLI), "--home", str(home), "flow", *args, "--json"]


def _hold(home: Path, key: str, chunks: int) -> None:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / f"hold-stream-{key}").write_text(str(chunks))


def test_follow_prints_chunks_in_order_before_the_node_completes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _hold(home, "s", 2)
    args = _flow_args(tmp_path, {"s": {"stream": CHUNKS, "response": "the reply"}})
    with live_flow(home, args, argv=_gated(home, args)) as flow:
        wait_for(lambda: (home / "streamed-s").exists(), timeout=30, what="s streamed 2 chunks")
        follower = Follower(home, flow.run_id, "s")
        assert follower.wait_text("one two\n") == "one two\n"
        # Seen while the node is still running: live output, not the recorded response.
        assert flow.wait_nodes(lambda st: st.get("s") == "running", what="s running")
        assert follower.proc.poll() is None
        (home / "release-s").touch()
        assert follower.finish() == 0
        assert flow.finish() == 0
    # In order, nothing twice, the terminal controls escaped, then the final status line.
    assert follower.text == "one two\n\\x1b]0;pwned\\x07red\nfour\n[s] completed\n"
    run_dir = home / "runs" / flow.run_id
    checkpoint = "".join(p.read_text() for p in run_dir.glob("checkpoint.json*"))
    assert "the reply" in checkpoint
    assert "four" not in checkpoint and "pwned" not in checkpoint  # chunks never recorded
    shown = json.loads(run_cli(home, "show", flow.run_id, "s", "--json").stdout)
    assert shown["response"] == "the reply"


def test_follow_of_a_run_prefixes_every_running_node(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _hold(home, "a", 1)
    _hold(home, "bb", 1)
    script = {"a": {"stream": ["a1\n", "a2\n"]}, "bb": {"stream": ["b1\n", "b2\n"]}}
    args = _flow_args(tmp_path, script, keys="ab")
    plan = [{"agent_id": "a", "instruction": "x"}, {"agent_id": "bb", "instruction": "y"}]
    write_yaml(tmp_path / "plan.yaml", {"name": "live", "plan": plan})
    with live_flow(home, args, argv=_gated(home, args)) as flow:
        for key in ("a", "bb"):
            wait_for(lambda k=key: (home / f"streamed-{k}").exists(), timeout=30, what=key)
        follower = Follower(home, flow.run_id)
        follower.wait_text("a  | a1\n")
        follower.wait_text("bb | b1\n")
        (home / "release-a").touch()
        follower.wait_text("a  | a2\n")
        assert "b2" not in follower.text  # bb is still held
        (home / "release-bb").touch()
        assert follower.finish() == 0
        assert flow.finish() == 0
    lines = follower.text.splitlines()
    assert lines[-1] == f"run {flow.run_id}: completed"
    assert sorted(lines[:-1]) == ["a  | a1", "a  | a2", "bb | b1", "bb | b2"]


def test_ctrl_c_stops_only_the_follower(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _hold(home, "s", 1)
    args = _flow_args(tmp_path, {"s": {"stream": ["x\n", "y\n"]}})
    with live_flow(home, args, argv=_gated(home, args)) as flow:
        wait_for(lambda: (home / "streamed-s").exists(), timeout=30, what="s streamed")
        follower = Follower(home, flow.run_id, "s")
        follower.wait_text("x\n")
        follower.proc.send_signal(signal.SIGINT)
        assert follower.finish() == 130
        assert flow.proc.poll() is None  # the run goes on
        (home / "release-s").touch()
        assert flow.finish() == 0
    assert flow.result()["status"] == "completed"


def _sigint_ignored() -> None:
    """What ``cmd &`` in a non-interactive shell hands its job (and Python then keeps)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _sigint_blocked() -> None:
    """A parent's leaked mask: SIGINT would stay pending for good."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


@pytest.mark.parametrize(
    ("inherited", "node"),
    [(_sigint_ignored, ("s",)), (_sigint_blocked, ("s",)), (_sigint_ignored, ())],
    ids=["ignored", "blocked", "ignored-whole-run"],
)
def test_ctrl_c_stops_a_follower_that_inherited_sigint_ignored_or_blocked(
    tmp_path: Path, inherited: Callable[[], None], node: tuple[str, ...]
) -> None:
    """Decision 198: the root cause of a follower that outlived its SIGINT by the whole
    bound was a full run started as a background job (``sh -c '... &'``), whose children
    all inherit SIGINT ignored; the follower now takes SIGINT back itself."""
    home = tmp_path / "home"
    _hold(home, "s", 1)
    args = _flow_args(tmp_path, {"s": {"stream": ["x\n", "y\n"]}})
    with live_flow(home, args, argv=_gated(home, args)) as flow:
        wait_for(lambda: (home / "streamed-s").exists(), timeout=30, what="s streamed")
        follower = Follower(home, flow.run_id, *node, preexec=inherited)
        follower.wait_text("x\n")  # "s | x" for the whole run
        follower.proc.send_signal(signal.SIGINT)
        assert follower.finish(timeout=30) == 130
        assert flow.proc.poll() is None  # the run goes on
        (home / "release-s").touch()
        assert flow.finish() == 0


def test_sigkill_mid_stream_then_resume_records_the_whole_response(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _hold(home, "s", 2)
    args = _flow_args(tmp_path, {"s": {"stream": CHUNKS, "response": "whole"}})
    with live_flow(home, args, argv=_gated(home, args)) as flow:
        wait_for(lambda: (home / "streamed-s").exists(), timeout=30, what="s streamed")
        follower = Follower(home, flow.run_id, "s")
        follower.wait_text("one two\n")
        flow.proc.kill()
        flow.proc.wait(timeout=30)
        # The owner is dead: the follower sees the run end, with nothing recorded for s.
        assert follower.finish() == 0
    assert follower.text.startswith("one two\n")
    assert follower.text.endswith("(run interrupted)\n")
    old = home / "runs" / flow.run_id / "live" / "s"
    assert (old / "0.txt").read_text() == "one two\n"  # what it had produced, kept
    (home / "hold-stream-s").unlink()
    resumed = run_cli(home, "resume", flow.run_id, "--json")
    assert resumed.returncode == 0, resumed.stderr
    new_run = json.loads(resumed.stdout)["run_id"]
    shown = json.loads(run_cli(home, "show", new_run, "s", "--json").stdout)
    assert shown["status"] == "completed" and shown["response"] == "whole"
    again = home / "runs" / new_run / "live" / "s" / "0.txt"
    assert again.read_text() == "".join(CHUNKS)


def test_agent_turns_stream_too_and_a_finished_node_follows_from_its_kept_file(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    script = write_yaml(
        tmp_path / "s.yaml", {"turn-1": {"stream": ["x\n", "y\n"], "response": "r"}}
    )
    done = run_cli(home, "agent", "task", "--model", f"script:{script}", "--json")
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    assert (home / "runs" / run_id / "live" / "turn-1" / "0.txt").read_text() == "x\ny\n"
    # The file is kept once the outcome is acknowledged (decision 190): following a
    # finished node prints what it produced, then its status, and returns at once.
    follower = Follower(home, run_id, "turn-1")
    assert follower.finish() == 0
    assert follower.text == "x\ny\n[turn-1] completed\n"


def _views(home: Path) -> list[dict[str, str]]:
    """The statuses of every view a gated follower read so far, in order."""
    path = home / "follower-views"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]


def _first_view(home: Path, key: str, status: str) -> tuple[int] | None:
    """The index of the first view in which ``key`` had ``status`` (a tuple: 0 is falsy)."""
    found = (i for i, view in enumerate(_views(home)) if view.get(key) == status)
    return next(((i,) for i in found), None)


def test_a_node_follower_prints_the_chunk_written_after_the_status_then_ends(
    tmp_path: Path,
) -> None:
    """Issue 38 item 4: the node's published ``completed`` overtook the writer's last
    append, and the follower ended on it one chunk short. Here the writer is held on the
    last chunk until the follower has read a view with the node completed (and then
    either ended, as before, or read another view): it must wait for the end mark."""
    home = tmp_path / "home"
    chunks = [f"chunk {i:02d}\n" for i in range(1, 17)]
    _hold(home, "s", 15)
    args = _flow_args(tmp_path, {"s": {"stream": chunks, "response": "the reply"}})
    with live_flow(home, args, argv=_gated(home, args)) as flow:
        wait_for(lambda: (home / "streamed-s").exists(), timeout=30, what="s streamed 15 chunks")
        follower = Follower(home, flow.run_id, "s", gated=True)
        follower.wait_text(chunks[14])
        (home / "hold-live-s").touch()  # the writer keeps the 16th chunk and the end mark
        (home / "release-s").touch()
        wait_for(lambda: (home / "held-live-s").exists(), timeout=30, what="the last chunk held")
        flow.wait_nodes(lambda st: st.get("s") == "completed", what="s published completed")
        (first,) = wait_for(
            lambda: _first_view(home, "s", "completed"),
            timeout=30,
            what="the follower reading s completed",
        )
        wait_for(
            lambda: follower.proc.poll() is not None or len(_views(home)) > first + 1,
            timeout=30,
            what="the follower ending, or reading one more view",
        )
        (home / "release-live-s").touch()
        assert follower.finish() == 0
        assert flow.finish() == 0
    assert follower.text == "".join(chunks) + "[s] completed\n"


def test_the_run_follower_prints_a_node_done_early_while_another_runs(tmp_path: Path) -> None:
    """Issue 38 item 4: ``show RUN --follow`` held a node's last line (no newline, as a
    model's reply usually ends) until the whole run ended. ``b`` is held until the
    follower printed all of ``a``: before the fix that never happened."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "gate-b").touch()
    script = {"a": {"stream": ["a1\n", "a2 no newline"]}, "b": {"stream": ["b1\n", "b2"]}}
    args = _flow_args(tmp_path, script, keys="ab")
    with live_flow(home, args, argv=_gated(home, args)) as flow:
        follower = Follower(home, flow.run_id)
        follower.wait_text("a | a2 no newline\n")
        assert flow.wait_nodes(lambda st: st.get("b") == "running", what="b held")
        assert "b |" not in follower.text
        (home / "release-b").touch()
        assert follower.finish() == 0
        assert flow.finish() == 0
    assert follower.text == (
        f"a | a1\na | a2 no newline\nb | b1\nb | b2\nrun {flow.run_id}: completed\n"
    )
