"""What a role asks a Ray cluster for, and whether any node of it can give that.

Pure functions over plain data (no ``ray`` import), so the rules are tested without a
cluster and refused before anything runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["DEFAULT_REQUEST", "describe_request", "ray_options", "request_of", "unplaceable"]

#: What Ray reserves for a task that asks for nothing (its own default: one CPU).
DEFAULT_REQUEST: dict[str, float] = {"CPU": 1.0}

#: Plan keys that Ray takes as keyword options, and the resource each one reserves.
_KEYWORDS = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}


def request_of(resources: Mapping[str, float] | None) -> dict[str, float]:
    """A role's ``resources`` as the node resources a call reserves (``CPU``, ``GPU``, ...)."""
    if resources is None:
        return dict(DEFAULT_REQUEST)
    out: dict[str, float] = {}
    if "num_cpus" not in resources:
        out["CPU"] = DEFAULT_REQUEST["CPU"]
    for key, amount in resources.items():
        out[_KEYWORDS.get(key, key)] = float(amount)
    return {name: amount for name, amount in out.items() if amount > 0}


def ray_options(resources: Mapping[str, float] | None) -> dict[str, Any]:
    """The ``.options(...)`` of one call of a role: Ray's keywords, custom ``resources``."""
    if not resources:
        return {}
    options: dict[str, Any] = {}
    custom: dict[str, float] = {}
    for key, amount in resources.items():
        if key == "memory":
            options["memory"] = int(amount)
        elif key in _KEYWORDS:
            options[key] = float(amount)
        else:
            custom[key] = float(amount)
    if custom:
        options["resources"] = custom
    return options


def describe_request(resources: Mapping[str, float] | None) -> str:
    """``{num_cpus: 1, side: 1}`` as the plan spelled it (Ray's default when it did not)."""
    if resources is None:
        return "Ray's default (num_cpus: 1)"
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in resources.items()) + "}"


def unplaceable(
    roles: Mapping[str | None, Mapping[str, float] | None],
    nodes: Iterable[Mapping[str, float]],
) -> list[tuple[str | None, str]]:
    """The roles no single node can ever hold one call of, each with what it lacks.

    ``nodes`` are the alive nodes' total resources: a call runs on one node, so a request
    is placeable only if one node has every resource it names, in that amount.
    """
    totals = [dict(n) for n in nodes]
    out: list[tuple[str | None, str]] = []
    for role, resources in roles.items():
        request = request_of(resources)
        if any(all(node.get(k, 0.0) >= v for k, v in request.items()) for node in totals):
            continue
        out.append((role, _shortfall(request, totals)))
    return out


def _shortfall(request: Mapping[str, float], nodes: list[dict[str, float]]) -> str:
    if not nodes:
        return "the cluster has no alive node"
    best = {k: max(node.get(k, 0.0) for node in nodes) for k in request}
    missing = [
        f"{k} {v:g} (most on one node: {best[k]:g})" for k, v in request.items() if best[k] < v
    ]
    if missing:
        return "no node has " + ", ".join(missing)
    return "no single node has all of it at once"
