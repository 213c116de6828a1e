"""Providers from other distributions: the ``steerflow.providers`` entry point group.

``--model acme/big`` with no built-in ``acme`` looks up the entry point named ``acme``; its
object is a factory called with the whole spec, returning a :class:`Provider`. The group is
read only here, and only for a prefix that is not built in, so no command pays for a scan
of installed distributions unless it names a plugin (decision 172).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from steerflow.errors import ProviderError, UsageError
from steerflow.providers._base import Provider, ProviderResponse

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = [
    "BUILTIN_NAMES",
    "ENTRY_POINT_GROUP",
    "checked_response",
    "planning_failure",
    "plugin_provider",
    "provider_label",
]

ENTRY_POINT_GROUP = "steerflow.providers"
#: Every name a ``--model`` spec reaches without a plugin; an entry point may not take one.
BUILTIN_NAMES = frozenset(
    {"echo", "script", "python", "openai", "anthropic", "claude-code", "codex"}
)


def _distribution(point: EntryPoint) -> str:
    dist = point.dist
    name = dist.metadata["Name"] if dist is not None else None
    return str(name) if name else "an unknown distribution"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _check_group(points: Iterable[EntryPoint]) -> None:
    """Refuse a distribution that registers a built-in name (it must not shadow one)."""
    for point in points:
        if point.name in BUILTIN_NAMES:
            raise UsageError(
                f"distribution {_distribution(point)!r} registers the built-in provider name "
                f"{point.name!r} in the {ENTRY_POINT_GROUP!r} entry point group "
                f"({point.value}); built-in providers cannot be shadowed: uninstall it or "
                "rename its entry point"
            )


def plugin_provider(vendor: str, spec: str) -> Provider | None:
    """The provider an installed plugin builds for ``spec``, or None if none is named ``vendor``.

    Raises:
        UsageError: One line naming the distribution and entry point: some distribution
            shadows a built-in name, two register ``vendor``, or the plugin's entry point
            does not import, its factory raises, or it returns something not a Provider.
    """
    # imported here: importlib.metadata (email, zipfile, csv) is not free at start-up
    from importlib.metadata import entry_points

    points = list(entry_points(group=ENTRY_POINT_GROUP))
    _check_group(points)
    named = [point for point in points if point.name == vendor]
    if not named:
        return None
    if len(named) > 1:
        dists = ", ".join(repr(_distribution(p)) for p in named)
        raise UsageError(
            f"model spec {spec!r}: distributions {dists} all register provider {vendor!r} "
            f"in {ENTRY_POINT_GROUP!r}; uninstall all but one"
        )
    (point,) = named
    where = (
        f"plugin {vendor!r} (entry point {point.value!r} of distribution {_distribution(point)!r})"
    )
    # SystemExit too: a plugin's sys.exit() must not end steerflow with its code (0 = success)
    try:
        factory = point.load()
    except (Exception, SystemExit) as exc:  # any import-time failure of someone else's package
        raise UsageError(f"model spec {spec!r}: {where} failed to load: {_one_line(exc)}") from None
    try:
        provider = factory(spec)
    except (Exception, SystemExit) as exc:
        raise UsageError(f"model spec {spec!r}: {where} raised {_one_line(exc)}") from None
    if not isinstance(provider, Provider):
        raise UsageError(
            f"model spec {spec!r}: {where} returned {type(provider).__name__}, "
            "not a steerflow.providers.Provider"
        )
    if not isinstance(getattr(provider, "spec", None), str):
        provider.spec = spec  # a factory that forgot it: run details name the spec
    return provider


def provider_label(provider: Provider) -> str:
    """How a message names ``provider``: its spec, and for a plugin its name and class.

    A provider wrapped for another executor (``RayProvider.inner``) is named by what it wraps.
    """
    inner = getattr(provider, "inner", None)
    if isinstance(inner, Provider):
        provider = inner
    spec = str(getattr(provider, "spec", "") or "?")
    cls = type(provider)
    where = f"{cls.__module__}.{cls.__qualname__}"
    vendor, sep, model = spec.partition("/")
    if sep and model and vendor not in BUILTIN_NAMES:
        return f"model spec {spec!r}: plugin {vendor!r} ({where})"
    if cls.__module__.startswith("steerflow."):
        return f"model spec {spec!r}"
    return f"model spec {spec!r} ({where})"


def checked_response(provider: Provider, value: object) -> ProviderResponse:
    """What ``provider.invoke`` returned, checked to be a :class:`ProviderResponse`.

    Raises:
        ProviderError: The node's one-line failure naming the provider and the type it
            should have returned.
    """
    if isinstance(value, ProviderResponse):
        return value
    raise ProviderError(
        f"{provider_label(provider)} returned {type(value).__name__} from invoke, not a "
        "steerflow.providers.ProviderResponse"
    )


def planning_failure(provider: Provider, exc: BaseException) -> ProviderError:
    """The run's one-line failure for a ``plan()`` that raised (a bug, not a bad reply)."""
    return ProviderError(f"{provider_label(provider)} raised {_one_line(exc)} while planning")
