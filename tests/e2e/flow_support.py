"""Subprocess helpers for the end-to-end CLI tests (no fixtures: see the test modules)."""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

# Imported up front: a first, cold import inside a timed polling loop would compete for the
# CPU with the very process whose latency is being measured.
from steerflow.cli import main as cli_main
from waiting import wait_until

PYTHON = sys.executable
T = TypeVar("T")

#: Variables that would make a child process read some other home or model setup.
_SCRUBBED_ENV = ("STEERFLOW_HOME", "OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY")


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a CLI child: ours, minus anything that picks a home or a model."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass
class CliResult:
    """A finished CLI process."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def json(self) -> dict[str, Any]:
        """stdout parsed as exactly one JSON object."""
        text = self.stdout.strip()
        assert text, f"no stdout from {self.args}; stderr:\n{self.stderr}"
        assert "\n" not in text, f"--json printed more than one line:\n{self.stdout}"
        value = json.loads(text)
        assert isinstance(value, dict)
        return value

    def explain(self) -> str:
        """Everything useful for an assertion message."""
        return (
            f"$ steerflow {' '.join(self.args)}\nexit {self.returncode}\n"
            f"--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
        )


def cli_args(home: Path | None, args: Sequence[str]) -> list[str]:
    """``python -m steerflow [--home HOME] ARGS``."""
    head = [PYTHON, "-m", "steerflow"]
    if home is not None:
        head += ["--home", str(home)]
    return [*head, *map(str, args)]


def run_cli(
    home: Path | None,
    *args: object,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> CliResult:
    """Run the CLI to completion in a subprocess (bounded by ``timeout``)."""
    argv = cli_args(home, [str(a) for a in args])
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or child_env(),
        cwd=cwd,
        check=False,
    )
    return CliResult([str(a) for a in args], proc.returncode, proc.stdout, proc.stderr)


_PR_CAPBSET_DROP = 24
_DAC_CAPS = (1, 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH


def drop_dac_caps() -> None:  # pragma: no cover - runs in the forked child
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in _DAC_CAPS:
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def run_unprivileged(home: Path, *args: object, env: dict[str, str] | None = None) -> CliResult:
    """The CLI as a process that file permissions apply to, even when we are root."""
    proc = subprocess.run(
        cli_args(home, [str(a) for a in args]),
        capture_output=True,
        text=True,
        timeout=60,
        env=env or child_env(),
        preexec_fn=drop_dac_caps if os.geteuid() == 0 else None,
        check=False,
    )
    return CliResult([str(a) for a in args], proc.returncode, proc.stdout, proc.stderr)


def start_cli(
    home: Path, *args: object, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start the CLI in the background (stdout/stderr piped, text mode)."""
    return subprocess.Popen(
        cli_args(home, [str(a) for a in args]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or child_env(),
    )


def finish(proc: subprocess.Popen[str], *, timeout: float = 30.0) -> CliResult:
    """Wait (bounded) for a background CLI; kill it if it overruns, then fail."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"steerflow did not exit within {timeout}s\n{out}\n{err}") from None
    args = [str(a) for a in proc.args[3:]]  # type: ignore[index]
    return CliResult(args, proc.returncode, out, err)


def stop(proc: subprocess.Popen[str]) -> None:
    """Make sure a background CLI we started is gone (test cleanup)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=10)


def wait_for(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.02,
    what: str = "condition",
) -> T:
    """Poll ``probe`` until it returns a truthy value, at most ``timeout`` seconds."""
    return wait_until(probe, timeout=timeout, what=what, interval=interval)


def cli_in_process(home: Path, *args: str) -> tuple[int, str]:
    """Run the CLI in this process (no interpreter start-up); returns (exit code, stdout).

    Used where a test measures latency of another process and a child
    interpreter's own start-up would dominate the measurement.
    """
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["--home", str(home), *args])
    return code, out.getvalue()


def runs_in_process(home: Path) -> list[dict[str, Any]]:
    """``steerflow runs --json`` (in process): the list of runs."""
    code, out = cli_in_process(home, "runs", "--json")
    assert code == 0, out
    return list(json.loads(out)["runs"])


def show_in_process(home: Path, target: str) -> dict[str, Any]:
    """``steerflow show TARGET --json`` (in process)."""
    code, out = cli_in_process(home, "show", target, "--json")
    assert code == 0, out
    value = json.loads(out)
    assert isinstance(value, dict)
    return value


def node_status(view: dict[str, Any]) -> dict[str, str]:
    """``{id: status}`` of a ``show``/``flow`` JSON object."""
    return {n["id"]: n["status"] for n in view["nodes"]}


def write_yaml(path: Path, data: object) -> Path:
    """Write ``data`` as YAML; returns ``path``."""
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def chain_plan(path: Path, ids: Sequence[str] = ("a", "b", "c")) -> Path:
    """A linear plan ``ids[0] -> ids[1] -> ...``."""
    entries: list[dict[str, Any]] = []
    for i, agent_id in enumerate(ids):
        entry: dict[str, Any] = {"agent_id": agent_id, "instruction": f"step {agent_id}"}
        if i:
            entry["depends_on"] = [ids[i - 1]]
        entries.append(entry)
    return write_yaml(path, {"name": "chain", "plan": entries})


def read_invocations(home: Path) -> list[dict[str, Any]]:
    """Lines of ``<home>/script-invocations.jsonl``."""
    log = home / "script-invocations.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
