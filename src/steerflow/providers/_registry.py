"""Turn a ``--model`` spec into a provider: the one dispatch over every vendor.

Network and agent-worker vendors are imported only when a spec names them, so a
missing SDK is a usage error naming the extra to install, and the vendor modules
(which import :mod:`steerflow.providers._conventions`) never import this one back.
``python:MODULE:FUNCTION`` is a function node; any other ``PREFIX/MODEL`` is looked up in
the ``steerflow.providers`` entry point group (``_plugins``), and only then.
"""

from __future__ import annotations

from collections.abc import Callable

from steerflow.errors import UsageError
from steerflow.providers._base import Provider
from steerflow.providers._plugins import ENTRY_POINT_GROUP, plugin_provider
from steerflow.providers.echo import EchoProvider
from steerflow.providers.function import PYTHON_PREFIX, FunctionProvider
from steerflow.providers.script import ScriptProvider

__all__ = ["EXTRAS", "ProviderCache", "make_provider", "make_remote_provider", "missing_sdk_error"]


def make_provider(spec: str) -> Provider:
    """Build the provider for one model spec (CONTRACT §4)."""
    if spec == "echo" or spec.startswith("echo:"):
        return EchoProvider(spec)
    if spec.startswith("script:"):
        return ScriptProvider(spec)
    if spec.strip().startswith(PYTHON_PREFIX):
        return FunctionProvider(spec)
    vendor, sep, model = spec.partition("/")
    if sep and model:
        if vendor not in _VENDORS:
            plugin = plugin_provider(vendor, spec)
            if plugin is not None:
                return plugin
        return make_remote_provider(vendor, model, spec)
    raise UsageError(
        f"unknown model spec {spec!r}: use echo, echo:delay=S, script:PATH, "
        "python:MODULE:FUNCTION, openai/MODEL, anthropic/MODEL, claude-code/MODEL, "
        "codex/MODEL or PLUGIN/MODEL"
    )


#: The pip extra that installs each SDK-backed vendor.
EXTRAS = {"openai": "openai", "anthropic": "anthropic"}

_VENDORS = ("openai", "anthropic", "claude-code", "codex")


def missing_sdk_error(spec: str, package: str) -> UsageError:
    """The usage error for a model spec whose vendor SDK is not installed.

    Args:
        spec: The ``--model`` spec that needed the SDK.
        package: The import name of the missing SDK (``openai`` or ``anthropic``).

    Returns:
        A :class:`UsageError` whose message names the pip extra to install.
    """
    extra = EXTRAS.get(package, package)
    return UsageError(
        f"model spec {spec!r} needs the {package!r} Python package, which is not installed: "
        f"pip install 'steerflow[{extra}]'"
    )


def _sdk_missing(exc: ImportError, package: str) -> bool:
    name = exc.name or ""
    return name == package or name.startswith(package + ".")


def make_remote_provider(vendor: str, model: str, spec: str) -> Provider:
    """Build an ``openai/``, ``anthropic/``, ``claude-code/`` or ``codex/`` provider.

    Args:
        vendor: The part of the spec before the first ``/``.
        model: The model name after it (passed to the vendor unchanged).
        spec: The complete spec, for messages.

    Returns:
        The provider; clients are created lazily on first use.

    Raises:
        UsageError: Unknown vendor, missing SDK, or missing credentials.
    """
    if vendor == "openai":
        try:
            from steerflow.providers.openai import OpenAIProvider
        except ImportError as exc:
            if _sdk_missing(exc, "openai"):
                raise missing_sdk_error(spec, "openai") from None
            raise
        return OpenAIProvider(model, spec)
    if vendor == "anthropic":
        try:
            from steerflow.providers.anthropic import AnthropicProvider
        except ImportError as exc:
            if _sdk_missing(exc, "anthropic"):
                raise missing_sdk_error(spec, "anthropic") from None
            raise
        return AnthropicProvider(model, spec)
    if vendor == "claude-code":
        from steerflow.providers.agent_cli import ClaudeCodeProvider

        return ClaudeCodeProvider(model, spec)
    if vendor == "codex":
        from steerflow.providers.agent_cli import CodexProvider

        return CodexProvider(model, spec)
    raise UsageError(
        f"model spec {spec!r}: unknown provider {vendor!r} (built in: {', '.join(_VENDORS)}; "
        f"no installed distribution registers {vendor!r} in {ENTRY_POINT_GROUP!r})"
    )


class ProviderCache:
    """One provider per spec for the life of a run.

    ``wrap`` (``--executor ray``) turns each provider built into the one the run calls:
    the same provider, its node calls dispatched elsewhere.
    """

    def __init__(self, wrap: Callable[[Provider], Provider] | None = None) -> None:
        self._providers: dict[str, Provider] = {}
        self._wrap = wrap

    def get(self, spec: str) -> Provider:
        """Return (building once) the provider for ``spec``."""
        if spec not in self._providers:
            provider = make_provider(spec)
            self._providers[spec] = self._wrap(provider) if self._wrap else provider
        return self._providers[spec]

    async def aclose(self) -> None:
        """Close every provider built so far."""
        for provider in self._providers.values():
            await provider.aclose()
