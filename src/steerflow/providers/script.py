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
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from steerflow.errors import ProviderError, UsageError
from steerflow.providers._base import (
    PlanRequest,
    Provider,
    ProviderRequest,
    ProviderResponse,
    Usage,
)
from steerflow.providers._paths import write_leg_file
from steerflow.providers.echo import echo_plan, echo_text

__all__ = ["INVOCATION_LOG", "NodeScript", "ScriptProvider", "load_script"]

INVOCATION_LOG = "script-invocations.jsonl"


class ScriptUsage(BaseModel):
    """The usage a scripted call reports (CONTRACT §11): token counts, never negative."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_tokens: int | None = Field(default=None, ge=0, strict=True)
    output_tokens: int | None = Field(default=None, ge=0, strict=True)
    cache_read_tokens: int | None = Field(default=None, ge=0, strict=True)
    cache_write_tokens: int | None = Field(default=None, ge=0, strict=True)

    def reported(self) -> Usage:
        """As a provider's :class:`Usage` (no cost: the price table prices it)."""
        return Usage(**self.model_dump())


class NodeScript(BaseModel):
    """What a scripted node does; every field optional, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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
        """Log the invocation, then behave as scripted."""
        node = self._node(request.node_key)
        await asyncio.to_thread(_append_invocation, request)
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
        written = []
        if node.artifacts:
            written = await asyncio.to_thread(
                _write_artifacts, request.artifact_dir, node.artifacts
            )
        text = echo_text(request) if node.response is None else node.response
        if not isinstance(text, str):
            text = json.dumps(text, sort_keys=True)
        usage = node.usage.reported() if node.usage is not None else None
        return ProviderResponse(
            text=text, spawns=list(node.spawn or []), artifacts=written, usage=usage
        )

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


def _append_invocation(request: ProviderRequest) -> None:
    line = json.dumps({"node": request.node_key, "run_id": request.run_id, "ts": time.time()})
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
