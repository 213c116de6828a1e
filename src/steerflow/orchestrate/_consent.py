"""Consent for code a plan file or playbook would run on the operator's machine.

A shared plan file must not start code-editing agents (``claude-code/…``, ``codex/…``) on the
operator's machine by surprise: they run only with ``--allow-agent-workers`` or when the
operator named the same worker with ``--model`` on the command line. A plan entry's own
``model`` (issue 40) is checked as a role's is. A ``python:`` function
node imports and runs a module in this very process: it needs ``--allow-python``, or the
same spec given with ``--model`` (decision 171).
"""

from __future__ import annotations

from collections.abc import Callable

from steerflow.errors import UsageError
from steerflow.executor import import_until
from steerflow.plan import SYNTHESIS_KEY, PlanFile

__all__ = [
    "AGENT_WORKER_PREFIXES",
    "check_agent_worker_consent",
    "check_loop_consent",
    "check_python_consent",
    "worker_of",
]

AGENT_WORKER_PREFIXES = ("claude-code/", "codex/")
_PYTHON_PREFIX = "python:"


def worker_of(spec: str | None) -> str | None:
    """The agent worker a model spec runs (``claude-code`` or ``codex``), else None."""
    if spec is None:
        return None
    for prefix in AGENT_WORKER_PREFIXES:
        if spec.strip().startswith(prefix):
            return prefix[:-1]
    return None


def _function_of(spec: str | None) -> str | None:
    """The ``python:`` spec itself (consent is per function), else None."""
    if spec is None or not spec.strip().startswith(_PYTHON_PREFIX):
        return None
    return spec.strip()


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
    found = _unconsented(plan, model, worker_of, worker_of(given_model))
    if found:
        raise UsageError(
            f"{source} names agent workers that execute code on this machine: {found}. "
            "Pass --allow-agent-workers, or give the worker with --model, to run them"
        )


def check_python_consent(
    plan: PlanFile,
    source: str,
    *,
    model: str,
    given_model: str | None,
    allowed: bool,
) -> None:
    """Refuse (exit 2) a plan naming a ``python:`` function nobody consented to run.

    Same shape as :func:`check_agent_worker_consent`; consent by ``--model`` covers exactly
    the spec given, since each spec is different code.
    """
    if allowed:
        return
    found = _unconsented(plan, model, _function_of, _function_of(given_model))
    if found:
        raise UsageError(
            f"{source} names Python functions that run in this process: {found}. "
            "Pass --allow-python, or give the function with --model, to run them"
        )


def _unconsented(
    plan: PlanFile, model: str, runner: Callable[[str], str | None], consented: str | None
) -> str:
    """What ``plan`` would run without consent: one part per spec ("" when nothing).

    Each part names a spec whose runner is not ``consented``, where it comes from and the
    planned nodes it would serve.
    """
    role_models = {name: role.model for name, role in plan.roles.items() if role.model}
    # Where each spec comes from, and the planned nodes it would run. A role, escalation or
    # default model no planned node uses still counts: a spawned node may take that role.
    sources: dict[str, list[str]] = {}
    nodes: dict[str, list[str]] = {}
    candidates = [(model, "the plan's model")] + [
        (spec, f"role {name!r}") for name, spec in role_models.items()
    ]
    for name, role in plan.roles.items():
        candidates += [(spec, f"role {name!r} escalation") for spec in role.escalation]
    synthesis = plan.synthesis.model if plan.synthesis is not None else None
    if synthesis:
        candidates.append((synthesis, "the plan's synthesis"))
    # An entry's own model (issue 40) needs the same consent as a role's.
    candidates += [
        (entry.model, f"plan entry {entry.agent_id!r}") for entry in plan.plan if entry.model
    ]
    for spec, origin in candidates:
        ran = runner(spec)
        if ran is not None and ran != consented:
            sources.setdefault(spec.strip(), []).append(origin)
            nodes.setdefault(spec.strip(), [])
    if not sources:
        return ""
    for entry in plan.plan:
        spec = (entry.model or role_models.get(entry.assignee or "", model)).strip()
        if spec in nodes:
            nodes[spec].append(entry.agent_id)
    if synthesis and synthesis.strip() in nodes:
        nodes[synthesis.strip()].append(SYNTHESIS_KEY)
    parts = []
    for spec, origins in sources.items():
        origins = list(dict.fromkeys(origins))
        ids = nodes[spec]
        shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
        who = f"node(s) {shown}" if ids else "no planned node (spawned nodes may use it)"
        parts.append(f"{spec!r} ({', '.join(origins)}) for {who}")
    return "; ".join(parts)


def check_tool_consent(plan: PlanFile, source: str, *, allow_python: bool, allow_mcp: bool) -> None:
    """Refuse (exit 2) a plan whose tools run code nobody consented to (issue 39 item 1).

    ``python:`` tools run in this process (``--allow-python``); ``mcp:`` tools start the
    plan's MCP servers, which are commands of the plan's choosing (``--allow-mcp``).
    Every ``mcp:SERVER`` must also name a server the plan declares.
    """
    plan.check_mcp_servers()
    where: dict[str, list[str]] = {"python": [], "mcp": []}
    for entry in plan.plan:
        for spec in plan.tools_of(entry):
            kind = spec.split(":", 1)[0]
            if kind in where and spec not in where[kind]:
                where[kind].append(spec)
    if where["python"] and not allow_python:
        raise UsageError(
            f"{source} gives nodes Python tools that run in this process: "
            f"{', '.join(where['python'])}. Pass --allow-python to run them"
        )
    if (where["mcp"] or plan.mcp_servers) and not allow_mcp:
        servers = ", ".join(sorted(plan.mcp_servers)) or "none"
        raise UsageError(
            f"{source} starts MCP servers for its tools ({servers}): "
            f"{', '.join(where['mcp']) or 'declared, unused'}. Pass --allow-mcp to start them"
        )


def check_loop_consent(plan: PlanFile, source: str, *, allowed: bool) -> None:
    """Refuse (exit 2) a loop whose ``until`` calls a Python function nobody consented to.

    The function runs in this process after each round, as a function node would.
    """
    found = [loop.until.python for loop in plan.loops if loop.until.python is not None]
    if found and not allowed:
        raise UsageError(
            f"{source} ends loops with Python functions that run in this process: "
            f"{', '.join(str(spec) for spec in found)}. Pass --allow-python to run them"
        )
    for spec in found:  # a typo is found now, not after the first round was paid for
        import_until(str(spec))
