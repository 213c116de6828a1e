"""Agent command-line workers: ``claude-code/MODEL`` and ``codex/MODEL``.

Each operation runs the agent CLI once, non-interactively, in the node's
artifact directory (created with mode 0700). The prompt goes in on stdin (no
argument-length limit, no risk of being read as a flag); stdout and stderr are
captured. A non-zero exit is a :class:`ProviderError` carrying the exit code
and the tail of stderr. The per-call timeout and asyncio cancellation (a signal,
or a ``--timeout`` deadline: see ``cancel_at_deadline``) stop the worker the same
way: SIGTERM to its process group, a grace period (5 s by default), then SIGKILL.
Every regular file in the artifact directory afterwards is reported in
``ProviderResponse.artifacts``.

Environment:

* ``STEERFLOW_CLAUDE_BIN`` / ``STEERFLOW_CODEX_BIN`` - the executable
  (default ``claude`` / ``codex`` on PATH).
* ``STEERFLOW_CLAUDE_ARGS`` / ``STEERFLOW_CODEX_ARGS`` - extra arguments
  (shell-quoted), appended after steerflow's own.
* ``STEERFLOW_AGENT_TIMEOUT_S`` - per-call timeout when the request has none
  (default 1800).
* ``STEERFLOW_AGENT_KILL_GRACE_S`` - SIGTERM-to-SIGKILL grace (default 5).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import json
import os
import shlex
import shutil
import signal
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from steerflow.errors import ProviderError, UsageError
from steerflow.providers._agent_events import render_claude_event, render_codex_event
from steerflow.providers._base import (
    Message,
    PlanReply,
    PlanRequest,
    Provider,
    ProviderRequest,
    ProviderResponse,
    Usage,
)
from steerflow.providers._conventions import (
    extract_spawns,
    parse_plan_reply,
    plan_system_prompt,
    plan_user_prompt,
    split_history,
    system_with_spawn,
)
from steerflow.providers._env import env_float
from steerflow.providers._paths import ensure_leg_dir

__all__ = [
    "AgentCLIProvider",
    "ClaudeCodeProvider",
    "CodexProvider",
    "list_artifacts",
    "run_process",
]

DEFAULT_TIMEOUT_S = 1800.0
DEFAULT_KILL_GRACE_S = 5.0
_TAIL = 2000


class AgentCLIProvider(Provider, abc.ABC):
    """Shared subprocess handling of the agent CLIs.

    Args:
        model: Model name passed to the CLI.
        spec: The ``--model`` spec (defaults to ``<vendor>/MODEL``).
        env: Environment to read settings from (``os.environ`` when None).

    Raises:
        UsageError: The executable is not found, or a setting is malformed.
    """

    cancel_at_deadline: ClassVar[bool] = True
    needs_artifact_dir: ClassVar[bool] = False  # ``invoke`` makes its cwd itself, symlink-safe
    vendor: ClassVar[str]
    bin_env: ClassVar[str]
    args_env: ClassVar[str]
    default_bin: ClassVar[str]

    def __init__(
        self, model: str, spec: str | None = None, *, env: Mapping[str, str] | None = None
    ) -> None:
        env = os.environ if env is None else env
        self.spec = spec or f"{self.vendor}/{model}"
        self.model = model
        wanted = env.get(self.bin_env) or self.default_bin
        found = shutil.which(wanted, path=env.get("PATH"))
        if found is None:
            raise UsageError(
                f"model spec {self.spec!r}: executable {wanted!r} not found "
                f"(install it, put it on PATH, or set {self.bin_env})"
            )
        self.binary = found
        try:
            self.extra_args = shlex.split(env.get(self.args_env, ""))
        except ValueError as exc:
            raise UsageError(f"{self.args_env}: {exc}") from None
        self.default_timeout_s = env_float(
            env, "STEERFLOW_AGENT_TIMEOUT_S", DEFAULT_TIMEOUT_S, minimum=0.001
        )
        self.kill_grace_s = env_float(env, "STEERFLOW_AGENT_KILL_GRACE_S", DEFAULT_KILL_GRACE_S)

    @abc.abstractmethod
    def command(
        self,
        system: str | None,
        output_file: Path,
        conversation: str | None = None,
        *,
        stream: bool = False,
    ) -> list[str]:
        """The argv of one run (the prompt is written to stdin).

        Args:
            system: The system prompt, if any.
            output_file: A path outside the artifact directory the CLI may write
                its final message to.
            conversation: The CLI's own session to continue, if it can resume one.
            stream: Ask for one JSON event per line as the agent works.
        """

    @abc.abstractmethod
    def parse(self, stdout: str, output_file: Path) -> tuple[str, Usage | None]:
        """Turn a successful run's output into reply text and usage."""

    def conversation_id(self, stdout: str) -> str | None:
        """The CLI's session id in a successful run's output, if it reports one."""
        return None

    def render_event(self, event: dict[str, object]) -> str:
        """One JSON event of the CLI's stream as readable live text ("" to show nothing)."""
        return ""

    def _live_line(self, emit: Callable[[str], None], line: str) -> None:
        event = _json_line(line)
        if event is None:
            emit(line + "\n")  # plain output is shown as it came
        else:
            emit(self.render_event(event))

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        """Run the CLI once in the node's artifact directory.

        Args:
            request: The rendered operation.

        Returns:
            The final message (without a spawn block), raw spawn items, usage
            and the files found in the artifact directory.

        Raises:
            ProviderError: Non-zero exit, timeout, or an error result.
            asyncio.CancelledError: Cancelled; the worker was stopped first.
        """
        # The worker runs with its leg directory as cwd: it must be that directory itself,
        # never a symlink to (or a name for) somewhere else.
        workdir = await asyncio.to_thread(
            ensure_leg_dir, request.artifact_dir.parent, request.artifact_dir.name
        )
        system, turns = split_history(request.history)
        system = system_with_spawn(system, request.allow_spawn)
        prompt = _with_transcript(turns, request.instruction)
        # Its events go to the live view only when someone watches (decision 193).
        emit = request.emit if request.live is not None else None
        text, usage, conversation = await self._run(
            system, prompt, workdir, request.timeout_s, request.conversation, emit
        )
        spawns: list[object] = []
        if request.allow_spawn:
            text, spawns = extract_spawns(text)
        artifacts = await asyncio.to_thread(list_artifacts, workdir)
        return ProviderResponse(
            text=text, spawns=spawns, usage=usage, artifacts=artifacts, conversation=conversation
        )

    async def plan(self, request: PlanRequest) -> object:
        """Ask the agent for a plan as one JSON object, in a scratch directory.

        Args:
            request: Prompt, schema, entry limit and the previous rejection.

        Returns:
            The decoded plan object.

        Raises:
            ProviderError: The run failed or the reply is not a JSON object.
        """
        return (await self.plan_with_usage(request)).data

    async def plan_with_usage(self, request: PlanRequest) -> PlanReply:
        """:meth:`plan`, with the usage the agent reported."""
        with tempfile.TemporaryDirectory(prefix="steerflow-plan-") as scratch:
            text, usage, _ = await self._run(
                plan_system_prompt(request), plan_user_prompt(request), Path(scratch), None
            )
        return PlanReply(parse_plan_reply(text, self.spec), usage)

    async def _run(
        self,
        system: str | None,
        prompt: str,
        cwd: Path,
        timeout_s: float | None,
        conversation: str | None = None,
        emit: Callable[[str], None] | None = None,
    ) -> tuple[str, Usage | None, str | None]:
        timeout = timeout_s if timeout_s and timeout_s > 0 else self.default_timeout_s
        on_line = None if emit is None else functools.partial(self._live_line, emit)
        with tempfile.TemporaryDirectory(prefix="steerflow-agent-") as scratch:
            output_file = Path(scratch) / "last-message.txt"
            argv = self.command(system, output_file, conversation, stream=emit is not None)
            stdout, stderr, code = await run_process(
                argv, prompt.encode(), cwd, timeout, self.kill_grace_s, self.spec, on_line=on_line
            )
            if code != 0:
                tail = (stderr.strip() or stdout.strip())[-_TAIL:]
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                raise ProviderError(
                    f"{self.spec}: {Path(argv[0]).name} {how}" + (f": {tail}" if tail else "")
                )
            text, usage = self.parse(stdout, output_file)
            return text, usage, self.conversation_id(stdout)


async def run_process(
    argv: Sequence[str],
    stdin: bytes,
    cwd: Path,
    timeout_s: float,
    grace_s: float,
    label: str,
    *,
    on_line: Callable[[str], None] | None = None,
) -> tuple[str, str, int]:
    """Run one worker process in its own process group and collect its output.

    With ``on_line`` every stdout line is also handed to it as soon as it is read.

    Args:
        argv: Executable and arguments.
        stdin: Bytes written to the worker's stdin (then closed).
        cwd: Working directory.
        timeout_s: Wall-clock limit of the run.
        grace_s: Time between SIGTERM and SIGKILL when stopping it.
        label: Prefix of error messages.
        on_line: Called with each stdout line (without its newline) as it is read.

    Returns:
        Decoded stdout, decoded stderr and the exit code (negative: signal).

    Raises:
        ProviderError: The worker could not start, or ran past ``timeout_s``
            (``retryable=True``); it was stopped first.
        asyncio.CancelledError: Cancelled; the worker was stopped first.
    """
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise ProviderError(f"{label}: cannot start {argv[0]!r}: {exc}") from exc
    try:
        async with asyncio.timeout(timeout_s):
            if on_line is None:
                out, err = await proc.communicate(stdin)
            else:
                out, err = await _communicate_lines(proc, stdin, on_line)
    except TimeoutError:
        await _stop(proc, grace_s)
        raise ProviderError(
            f"{label}: {Path(argv[0]).name} ran past its {timeout_s:g} s timeout and was stopped",
            retryable=True,
        ) from None
    except BaseException:
        # Cancellation (or anything unexpected): never leave the worker running.
        await asyncio.shield(_stop(proc, grace_s))
        raise
    code = proc.returncode if proc.returncode is not None else await proc.wait()
    return out.decode(errors="replace"), err.decode(errors="replace"), code


async def _communicate_lines(
    proc: asyncio.subprocess.Process, stdin: bytes, on_line: Callable[[str], None]
) -> tuple[bytes, bytes]:
    """``communicate``, with each stdout line passed on as it arrives (any length)."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdout, stderr = proc.stdout, proc.stderr

    async def feed() -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin)  # type: ignore[union-attr]
            await proc.stdin.drain()  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]

    async def lines() -> bytes:
        seen, pending = bytearray(), b""
        while block := await stdout.read(1 << 16):
            seen += block
            *complete, pending = (pending + block).split(b"\n")
            for line in complete:
                on_line(line.decode(errors="replace"))
        if pending:
            on_line(pending.decode(errors="replace"))
        return bytes(seen)

    async with asyncio.TaskGroup() as group:
        group.create_task(feed())
        out = group.create_task(lines())
        err = group.create_task(stderr.read())
    await proc.wait()
    return out.result(), err.result()


async def _stop(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM the worker's process group, wait ``grace_s``, then SIGKILL it."""
    if proc.returncode is None:
        _signal_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), timeout=grace_s)
    # Whatever is left of the group (the leader, or children it forked) goes now.
    _signal_group(proc.pid, signal.SIGKILL)
    await proc.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def list_artifacts(root: Path) -> list[str]:
    """Every regular file under ``root``, as sorted POSIX paths relative to it.

    Symbolic links are neither followed nor listed.
    """
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        dirnames.sort()
        for name in filenames:
            path = base / name
            if path.is_file() and not path.is_symlink():
                found.append(path.relative_to(root).as_posix())
    return sorted(found)


def _with_transcript(turns: Sequence[Message], instruction: str) -> str:
    """Prefix inherited turns to the instruction (the CLIs take one prompt)."""
    if not turns:
        return instruction
    lines = ["Conversation so far:"]
    for turn in turns:
        lines.append(f"[{turn.role}]\n{turn.content}")
    lines.append(f"[user]\n{instruction}")
    return "\n\n".join(lines)


class ClaudeCodeProvider(AgentCLIProvider):
    """``claude -p`` (Claude Code print mode) with JSON output.

    Runs ``claude -p --output-format json --model MODEL --permission-mode
    acceptEdits [--append-system-prompt SYSTEM] [extra args]`` with the prompt on
    stdin. Usage and ``total_cost_usd`` come from the CLI's result object.
    """

    vendor = "claude-code"
    bin_env = "STEERFLOW_CLAUDE_BIN"
    args_env = "STEERFLOW_CLAUDE_ARGS"
    default_bin = "claude"

    def command(
        self,
        system: str | None,
        output_file: Path,
        conversation: str | None = None,
        *,
        stream: bool = False,
    ) -> list[str]:
        """The ``claude`` argv (the output file is not used: JSON comes on stdout).

        With ``conversation``, ``--resume <id>`` continues that CLI session. With
        ``stream``, ``stream-json`` (which print mode takes only with ``--verbose``):
        its last line is the same result object.
        """
        output = ["stream-json", "--verbose"] if stream else ["json"]
        argv = [self.binary, "-p", "--output-format", *output, "--model", self.model]
        argv += ["--permission-mode", "acceptEdits"]
        if conversation:
            argv += ["--resume", conversation]
        if system:
            argv += ["--append-system-prompt", system]
        return [*argv, *self.extra_args]

    def conversation_id(self, stdout: str) -> str | None:
        """The ``session_id`` of the result object (what ``--resume`` takes)."""
        result = _last_json_object(stdout, lambda obj: obj.get("type") == "result")
        session = result.get("session_id") if result is not None else None
        return session if isinstance(session, str) and session else None

    def render_event(self, event: dict[str, object]) -> str:
        """A ``stream-json`` event: text, tool calls, edits, commands, results."""
        return render_claude_event(event)

    def parse(self, stdout: str, output_file: Path) -> tuple[str, Usage | None]:
        """Read the result object; plain text output is taken as the reply."""
        result = _last_json_object(stdout, lambda obj: obj.get("type") == "result")
        if result is None:
            return stdout.strip(), None
        text = result.get("result")
        if result.get("is_error"):
            detail = text if isinstance(text, str) and text else result.get("subtype", "error")
            raise ProviderError(f"{self.spec}: claude reported an error: {detail}")
        usage_raw = result.get("usage")
        usage_map = usage_raw if isinstance(usage_raw, dict) else {}
        counted = [
            count
            for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
            if (count := _as_int(usage_map.get(key))) is not None
        ]
        usage = Usage(
            input_tokens=sum(counted) if counted else None,
            output_tokens=_as_int(usage_map.get("output_tokens")),
            cost_usd=_as_float(result.get("total_cost_usd")),
            cache_read_tokens=_as_int(usage_map.get("cache_read_input_tokens")),
            cache_write_tokens=_as_int(usage_map.get("cache_creation_input_tokens")),
        )
        return (text if isinstance(text, str) else ""), usage


class CodexProvider(AgentCLIProvider):
    """``codex exec`` (Codex non-interactive mode) with JSONL events.

    Runs ``codex exec --model MODEL --sandbox workspace-write
    --skip-git-repo-check --json --output-last-message FILE [extra args] -``
    with the prompt (system text first) on stdin. The reply is the last-message
    file, else the last ``agent_message`` event, else raw stdout; token usage
    is summed from ``turn.completed`` events. Codex reports no price.
    """

    vendor = "codex"
    bin_env = "STEERFLOW_CODEX_BIN"
    args_env = "STEERFLOW_CODEX_ARGS"
    default_bin = "codex"

    def command(
        self,
        system: str | None,
        output_file: Path,
        conversation: str | None = None,
        *,
        stream: bool = False,
    ) -> list[str]:
        """The ``codex exec`` argv; ``-`` makes codex read the prompt from stdin.

        ``stream`` changes nothing: ``--json`` already prints one event per line.

        ``conversation`` is not used: a continued codex conversation gets the earlier
        turns as a transcript in the prompt (decision: agent continuation).
        """
        return [
            self.binary,
            "exec",
            "--model",
            self.model,
            "--sandbox",
            "workspace-write",
            "--skip-git-repo-check",
            "--json",
            "--output-last-message",
            str(output_file),
            *self.extra_args,
            "-",
        ]

    async def _run(
        self,
        system: str | None,
        prompt: str,
        cwd: Path,
        timeout_s: float | None,
        conversation: str | None = None,
        emit: Callable[[str], None] | None = None,
    ) -> tuple[str, Usage | None, str | None]:
        # codex has no system-prompt flag: the system text leads the prompt.
        if system:
            prompt = f"{system}\n\n---\n\n{prompt}"
        return await super()._run(None, prompt, cwd, timeout_s, conversation, emit)

    def render_event(self, event: dict[str, object]) -> str:
        """A ``--json`` event: messages, commands and their exit codes, file changes."""
        return render_codex_event(event)

    def parse(self, stdout: str, output_file: Path) -> tuple[str, Usage | None]:
        """Read the last message and sum ``turn.completed`` usage."""
        events = [e for e in (_json_line(line) for line in stdout.splitlines()) if e is not None]
        failed = [e for e in events if e.get("type") in ("turn.failed", "error")]
        message = None
        inputs = outputs = 0
        seen_usage = False
        for event in events:
            item = event.get("item")
            if (
                event.get("type") == "item.completed"
                and isinstance(item, dict)
                and item.get("type") == "agent_message"
                and isinstance(item.get("text"), str)
            ):
                message = item["text"]
            usage = event.get("usage")
            if event.get("type") == "turn.completed" and isinstance(usage, dict):
                seen_usage = True
                inputs += _as_int(usage.get("input_tokens")) or 0
                outputs += _as_int(usage.get("output_tokens")) or 0
        try:
            text = output_file.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            text = ""
        text = text or (message or "") or ("" if events else stdout.strip())
        if failed and not text:
            raise ProviderError(f"{self.spec}: codex reported an error: {_event_error(failed[-1])}")
        usage_out = Usage(input_tokens=inputs, output_tokens=outputs) if seen_usage else None
        return text, usage_out


def _json_line(line: str) -> dict[str, object] | None:
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _last_json_object(
    stdout: str, predicate: Callable[[dict[str, object]], bool]
) -> dict[str, object] | None:
    """The whole of stdout as one JSON object, else its last matching JSON line."""
    try:
        whole = json.loads(stdout)
    except ValueError:
        whole = None
    if isinstance(whole, dict) and predicate(whole):
        return whole
    for line in reversed(stdout.splitlines()):
        obj = _json_line(line)
        if obj is not None and predicate(obj):
            return obj
    return None


def _event_error(event: Mapping[str, object]) -> str:
    error = event.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    message = event.get("message")
    return str(message) if message else json.dumps(event)[:500]


def _as_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _as_float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
