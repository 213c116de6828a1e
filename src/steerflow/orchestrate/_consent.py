"""Consent for code-executing agent workers named by a plan file or playbook.

A shared plan file must not start code-editing agents (``claude-code/…``, ``codex/…``) on the
operator's machine by surprise: they run only with ``--allow-agent-workers`` or when the
operator named the same worker with ``--model`` on the command line.
"""

from __future__ import annotations

from steerflow.errors import UsageError
from steerflow.plan import SYNTHESIS_KEY, PlanFile

__all__ = ["AGENT_WORKER_PREFIXES", "check_agent_worker_consent", "worker_of"]

AGENT_WORKER_PREFIXES = ("claude-code/", "codex/")


def worker_of(spec: str | None) -> str | None:
    """The agent worker a model spec runs (``claude-code`` or ``codex``), else None."""
    if spec is None:
        return None
    for prefix in AGENT_WORKER_PREFIXES:
        if spec.strip().startswith(prefix):
            return prefix[:-1]
    return None


def check_agent_worker_consent(
    plan: PlanFile,
    source: str,
    *,
    model: str,
    given_model: str | None,
    allowed: bool,
) -> None:
    """Refuse (exit 2) a plan whose nodes would run an agent worker nobody consented to.

    ``model`` is the run's default model (``--model``, else the plan's); ``given_model`` is
    ``--model`` as typed. Consent is per worker (the executable that runs code), so
    ``--model claude-code/a`` also covers a role naming ``claude-code/b``.
    """
    if allowed:
        return
    consented = worker_of(given_model)
    role_models = {name: role.model for name, role in plan.roles.items() if role.model}
    # Where each worker spec comes from, and the planned nodes it would run. A role or default
    # model no planned node uses still counts: a spawned node may take that role.
    sources: dict[str, list[str]] = {}
    nodes: dict[str, list[str]] = {}
    candidates = [(model, "the plan's model")] + [
        (spec, f"role {name!r}") for name, spec in role_models.items()
    ]
    synthesis = plan.synthesis.model if plan.synthesis is not None else None
    if synthesis:
        candidates.append((synthesis, "the plan's synthesis"))
    for spec, origin in candidates:
        worker = worker_of(spec)
        if worker is not None and worker != consented:
            sources.setdefault(spec.strip(), []).append(origin)
            nodes.setdefault(spec.strip(), [])
    if not sources:
        return
    for entry in plan.plan:
        spec = role_models.get(entry.assignee or "", model).strip()
        if spec in nodes:
            nodes[spec].append(entry.agent_id)
    if synthesis and synthesis.strip() in nodes:
        nodes[synthesis.strip()].append(SYNTHESIS_KEY)
    parts = []
    for spec, origins in sources.items():
        ids = nodes[spec]
        shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
        who = f"node(s) {shown}" if ids else "no planned node (spawned nodes may use it)"
        parts.append(f"{spec!r} ({', '.join(origins)}) for {who}")
    raise UsageError(
        f"{source} names agent workers that execute code on this machine: "
        + "; ".join(parts)
        + ". Pass --allow-agent-workers, or give the worker with --model, to run them"
    )
