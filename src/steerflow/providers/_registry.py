"""Turn a ``--model`` spec into a provider."""

from __future__ import annotations

from steerflow.errors import UsageError
from steerflow.providers._base import Provider
from steerflow.providers.echo import EchoProvider
from steerflow.providers.script import ScriptProvider

__all__ = ["KNOWN_PREFIXES", "ProviderCache", "make_provider"]

KNOWN_PREFIXES = ("echo", "script:", "openai/", "anthropic/", "claude-code/", "codex/")


def make_provider(spec: str) -> Provider:
    """Build the provider for one model spec (CONTRACT §4)."""
    if spec == "echo" or spec.startswith("echo:"):
        return EchoProvider(spec)
    if spec.startswith("script:"):
        return ScriptProvider(spec)
    vendor, sep, model = spec.partition("/")
    if sep and model:
        return _make_remote(vendor, model, spec)
    raise UsageError(
        f"unknown model spec {spec!r}: use echo, echo:delay=S, script:PATH, openai/MODEL, "
        "anthropic/MODEL, claude-code/MODEL or codex/MODEL"
    )


def _make_remote(vendor: str, model: str, spec: str) -> Provider:
    try:
        from steerflow.providers import _remote
    except ImportError:  # pragma: no cover - the remote module ships with the package
        raise UsageError(f"model spec {spec!r} is not supported in this build") from None
    return _remote.make_remote_provider(vendor, model, spec)


class ProviderCache:
    """One provider per spec for the life of a run."""

    def __init__(self) -> None:
        self._providers: dict[str, Provider] = {}

    def get(self, spec: str) -> Provider:
        """Return (building once) the provider for ``spec``."""
        if spec not in self._providers:
            self._providers[spec] = make_provider(spec)
        return self._providers[spec]

    async def aclose(self) -> None:
        """Close every provider built so far."""
        for provider in self._providers.values():
            await provider.aclose()
