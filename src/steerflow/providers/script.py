"""The ``script:PATH`` model: per-node behaviour scripted from a YAML/JSON file (CONTRACT §4)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from steerflow.errors import ProviderError, UsageError
from steerflow.providers._base import (
    PlanRequest,
    Provider,
    ProviderRequest,
    ProviderResponse,
    StepReply,
    StepRequest,
    ToolCall,
    Usage,
)
from steerflow.providers._paths import write_leg_file
from steerflow.providers.echo import echo_plan, echo_text

__all__ = ["INVOCATION_LOG", "NodeScript", "ScriptProvider", "ScriptStep", "load_script"]

INVOCATION_LOG = "script-invocations.jsonl"


class ScriptUsage(BaseModel):
    """The usage a scripted call reports (CONTRACT §11): token counts, never negative."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    input_tokens: int | None = Field(default=None, ge=0, strict=True)
    output_tokens: int | None = Field(default=None, ge=0, strict=True)
    cache_read_tokens: int | None = Field(default=None, ge=0, strict=True)
    cache_write_tokens: int | None = Field(default=None, ge=0, strict=True)

    def reported(self) -> Usage:
        """As a provider's :class:`Usage` (no cost: the price table prices it)."""
        return Usage(**self.model_dump())


class ScriptToolCall(BaseModel):
    """One tool call a scripted step asks for: the tool's name and its arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    name: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)


class ScriptStep(BaseModel):
    """One model request of a tool node (CONTRACT §12): tool calls, or the final response.

    ``usage`` is what the step reports; without it, the node's ``usage`` (if any).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    tool_calls: list[ScriptToolCall] | None = Field(default=None, min_length=1)
    response: Any = None
    usage: ScriptUsage | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ScriptStep:
        asks = self.tool_calls is not None
        answers = "response" in self.model_fields_set
        if asks == answers:
            raise ValueError("a step has either tool_calls or a response (exactly one)")
        return self

    def text(self) -> str:
        """The response as text (a non-string value as JSON, as a node's response is)."""
        if self.response is None or self.tool_calls is not None:
            return ""
        if isinstance(self.response, str):
            return self.response
        return json.dumps(self.response, sort_keys=True)


class NodeScript(BaseModel):
    """What a scripted node does; every field optional, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    delay: float | None = Field(default=None, ge=0)
    response: Any = None
    fail: str | None = None
    fail_once: str | None = None
    spawn: list[dict[str, Any] | None] | None = None
    artifacts: dict[str, str] | None = None
    #: Chunks of live output, emitted in order with ``delay`` spread between them
    #: (CONTRACT §11); the response is still ``response`` (else the echo text).
    stream: list[str] | None = None
    usage: ScriptUsage | None = None
    #: A tool node's model requests, played one per step (CONTRACT §12, decision 272).
    steps: list[ScriptStep] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _response_ends_steps(self) -> NodeScript:
        # The loop ends at the first reply without tool calls: a step after it never plays.
        steps = self.steps or []
        for number, step in enumerate(steps[:-1], start=1):
            if step.tool_calls is None:
                raise ValueError(
                    f"step {number} is a response, which ends the node; "
                    f"the {len(steps) - number} step(s) after it would never run"
                )
        return self

    def final_text(self) -> str | None:
        """The last step's response, if the steps end in one (what ``invoke`` answers)."""
        if not self.steps or self.steps[-1].tool_calls is not None:
            return None
        return self.steps[-1].text()


def load_script(path: Path) -> dict[str, NodeScript]:
    """Read and validate a script file; unknown keys are a usage error."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read script file {str(path)!r}: {exc.strerror}") from None
    try:
        data = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"script file {str(path)!r} is not valid YAML/JSON: {exc}") from None
    except RecursionError:  # nested past the decoder's stack: bad input, not a crash
        raise UsageError(f"script file {str(path)!r} is nested too deeply") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UsageError(f"script file {str(path)!r}: top level must be a mapping of node ids")
    if _exceeds(data, _MAX_VALUES):
        # YAML aliases share one object per anchor, so a few lines can stand for millions
        # of values that only encoding the response would expand (minutes, gigabytes).
        raise UsageError(
            f"script file {str(path)!r} expands to more than {_MAX_VALUES:,} values "
            "(YAML aliases repeating an anchor?)"
        )
    scripts: dict[str, NodeScript] = {}
    for key, value in data.items():
        try:
            scripts[str(key)] = NodeScript.model_validate(value or {})
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<entry>'}: "
                + ("unknown key" if e["type"] == "extra_forbidden" else e["msg"])
                for e in exc.errors()
            )
            raise UsageError(f"script file {str(path)!r}, entry {key!r}: {problems}") from None
    return scripts


_MAX_VALUES = 1_000_000


def _exceeds(data: object, limit: int) -> bool:
    """Whether ``data`` holds more than ``limit`` values, stopping as soon as it does.

    A shared (aliased) container counts each time it is reached, as encoding would.
    """
    seen, stack = 0, [data]
    while stack:
        value = stack.pop()
        seen += 1
        if seen > limit:
            return True
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


class ScriptProvider(Provider):
    """Responds, fails, spawns or writes artifacts as the script file says."""

    # ``write_leg_file`` makes the leg directory, and only for a node with artifacts.
    needs_artifact_dir: ClassVar[bool] = False
    supports_tools: ClassVar[bool] = True  # invoke_step plays a node's ``steps``

    def __init__(self, spec: str) -> None:
        self.spec = spec
        raw = spec.partition(":")[2]
        if not raw:
            raise UsageError("--model script:PATH needs a path")
        self.path = Path(raw).expanduser().absolute()
        self.scripts = load_script(self.path)

    def portable_spec(self) -> str:
        """``script:`` and the file's absolute path: a Ray worker has its own cwd."""
        return f"script:{self.path}"

    def _node(self, key: str) -> NodeScript:
        defaults = self.scripts.get("*", NodeScript())
        own = self.scripts.get(key, NodeScript())
        merged = defaults.model_dump(exclude_unset=True) | own.model_dump(exclude_unset=True)
        return NodeScript.model_validate(merged)

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        """Log the invocation, then behave as scripted.

        A node scripted with ``steps`` and run without tools answers its final response
        step; steps that end in tool calls fail it (decision 272).
        """
        node = self._node(request.node_key)
        await self._behave(request, node, step=None)
        usage = node.usage
        if node.steps is not None:
            text = node.final_text()
            if text is None:
                raise ProviderError(
                    f"script node {request.node_key!r}: its steps end in tool calls, so it "
                    "answers only as a node with tools (end the steps with a response)"
                )
            usage = node.steps[-1].usage or usage
        else:
            text = _response(request, node)
        written = []
        if node.artifacts:
            written = await asyncio.to_thread(
                _write_artifacts, request.artifact_dir, node.artifacts
            )
        return ProviderResponse(
            text=text,
            spawns=list(node.spawn or []),
            artifacts=written,
            usage=_reported(usage),
        )

    async def invoke_step(self, request: StepRequest) -> StepReply:
        """Play step ``request.step`` of the node's ``steps`` (1-based; CONTRACT §12).

        Each model request is logged (with its ``step``) and waits, streams and fails as
        ``invoke`` does. Call ids are ``call_<step>_<i>`` (``i`` from 1): stable across a
        resume and a rerun, as a vendor's would be in a recorded step. A node without
        ``steps`` answers at once with its response (no tool calls).

        Raises:
            ProviderError: Scripted to fail, or the loop asked past the last step.
        """
        key, step = request.node.node_key, request.step
        node = self._node(key)
        await self._behave(request.node, node, step=step)
        if node.steps is None:
            return StepReply(text=_response(request.node, node), usage=_reported(node.usage))
        if not 1 <= step <= len(node.steps):
            raise ProviderError(
                f"script node {key!r} has {len(node.steps)} step(s); model request {step} "
                "asks past the end (add steps, or end them with a response)"
            )
        scripted = node.steps[step - 1]
        calls = [
            ToolCall(f"call_{step}_{index}", call.name, dict(call.args))
            for index, call in enumerate(scripted.tool_calls or (), start=1)
        ]
        usage = _reported(scripted.usage or node.usage)
        return StepReply(text=scripted.text(), tool_calls=calls, usage=usage)

    async def _behave(
        self, request: ProviderRequest, node: NodeScript, *, step: int | None
    ) -> None:
        """What every scripted model request does before it answers: log, wait, fail."""
        await asyncio.to_thread(_append_invocation, request, step)
        if node.stream:
            await _stream(request, node.stream, node.delay or 0.0)
        elif node.delay:
            await asyncio.sleep(node.delay)
        if node.fail is not None:
            raise ProviderError(node.fail)
        if node.fail_once is not None and await asyncio.to_thread(
            _first_time, request.home, self.path, request.node_key
        ):
            raise ProviderError(node.fail_once)

    async def plan(self, request: PlanRequest) -> object:
        """Scripts do not plan: they reuse the deterministic echo plan."""
        return echo_plan(request.prompt)


async def _stream(request: ProviderRequest, chunks: list[str], delay: float) -> None:
    """Emit ``chunks`` with ``delay`` spread evenly between them (none before the first)."""
    gap = delay / (len(chunks) - 1) if len(chunks) > 1 else 0.0
    for index, chunk in enumerate(chunks):
        if index and gap:
            await asyncio.sleep(gap)
        request.emit(chunk)
    if len(chunks) == 1 and delay:
        await asyncio.sleep(delay)


def _reported(usage: ScriptUsage | None) -> Usage | None:
    return usage.reported() if usage is not None else None


def _response(request: ProviderRequest, node: NodeScript) -> str:
    """The node's scripted response as text, else the echo text."""
    text = echo_text(request) if node.response is None else node.response
    return text if isinstance(text, str) else json.dumps(text, sort_keys=True)


def _append_invocation(request: ProviderRequest, step: int | None = None) -> None:
    """One line per model request; a tool node's carry their ``step`` (1-based)."""
    entry: dict[str, Any] = {"node": request.node_key, "run_id": request.run_id, "ts": time.time()}
    if step is not None:
        entry["step"] = step  # CONTRACT §4's members stay first and unchanged
    line = json.dumps(entry)
    fd = os.open(
        request.home / INVOCATION_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600
    )
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _first_time(home: Path, script: Path, key: str) -> bool:
    """True exactly once per (home, script file, node): the marker file is created exclusively."""
    state = home / "script-state"
    state.mkdir(mode=0o700, exist_ok=True)
    digest = hashlib.sha256(f"{script}\0{key}".encode()).hexdigest()[:32]
    try:
        fd = os.open(state / f"fail-once-{digest}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _write_artifacts(root: Path, files: dict[str, str]) -> list[str]:
    return [write_leg_file(root, rel, content.encode()) for rel, content in files.items()]
