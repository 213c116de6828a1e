"""Read plan files and playbooks, with errors that name the file, line and field."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from steerflow._values import shown
from steerflow.errors import InvalidValueError, PlanValidationError, UsageError
from steerflow.plan._model import ITEM_TAGS, MAX_PLAN_ENTRIES, PlanFile

__all__ = [
    "ReactivePolicy",
    "bundled_playbooks",
    "find_playbook",
    "load_plan_file",
    "parse_plan",
    "parse_reactive",
]

_PLAYBOOK_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class ReactivePolicy:
    """Which emitting roles may spawn new operations.

    ``enabled`` False means no spawn is ever accepted; ``roles`` None means
    every role may spawn; otherwise only operations whose assignee is listed.
    """

    enabled: bool
    roles: frozenset[str] | None = None
    spec: str = "off"

    def allows(self, assignee: str | None) -> bool:
        """True if an operation with this assignee may spawn."""
        if not self.enabled:
            return False
        return self.roles is None or (assignee is not None and assignee in self.roles)


def parse_reactive(spec: str | bool | None, *, name: str = "--reactive") -> ReactivePolicy:
    """Parse ``--reactive off|all|ROLE[,ROLE...]``; a refusal names ``name``."""
    if spec is None or spec is False:
        return ReactivePolicy(enabled=False, spec="off")
    if spec is True:
        return ReactivePolicy(enabled=True, spec="all")
    text = spec.strip()
    lowered = text.lower()
    if lowered in {"off", "false", "no", "0", "none", ""}:
        return ReactivePolicy(enabled=False, spec="off")
    if lowered in {"all", "true", "yes", "on", "1"}:
        return ReactivePolicy(enabled=True, spec="all")
    roles = [r.strip() for r in text.split(",")]
    if any(not r for r in roles):
        raise InvalidValueError(name, f"{shown(spec)}: empty role name in the list")
    return ReactivePolicy(enabled=True, roles=frozenset(roles), spec=",".join(roles))


def parse_plan(
    data: object,
    *,
    source: str,
    text: str | None = None,
    max_entries: int | None = MAX_PLAN_ENTRIES,
) -> PlanFile:
    """Validate already-decoded plan data; errors name ``source`` and the field.

    A plan with more than ``max_entries`` entries is refused whole (``None``: no limit):
    cutting it would drop entries and the edges that point at them.
    """
    if not isinstance(data, dict):
        raise PlanValidationError(f"{source}: a plan must be a mapping with a 'plan' list")
    entries = data.get("plan")
    if max_entries is not None and isinstance(entries, list) and len(entries) > max_entries:
        raise PlanValidationError(
            f"{source}: the plan has {len(entries)} entries, more than the limit of "
            f"{max_entries}; raise it with --max-plan-entries N"
        )
    try:
        return PlanFile.model_validate(data)
    except ValidationError as exc:
        raise PlanValidationError(_describe(exc, source=source, text=text)) from None


def load_plan_file(path: Path, *, max_entries: int | None = MAX_PLAN_ENTRIES) -> PlanFile:
    """Read and validate a YAML or JSON plan file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"plan file not found: {str(path)!r}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read plan file {str(path)!r}: {exc}") from None
    return parse_plan_text(text, source=str(path), max_entries=max_entries)


def parse_plan_text(
    text: str, *, source: str, max_entries: int | None = MAX_PLAN_ENTRIES
) -> PlanFile:
    """Decode YAML/JSON text and validate it as a plan."""
    try:
        if text.lstrip().startswith("{"):
            data = json.loads(text, object_pairs_hook=_unique_pairs)
        else:
            data = yaml.load(text, Loader=_UniqueKeyLoader)
    except _DuplicateKeyError as exc:
        raise PlanValidationError(
            f"{source}: invalid JSON: duplicate key {exc.args[0]!r}"
        ) from None
    except RecursionError:
        # Both decoders recurse per nesting level: a file nested past the stack is bad
        # input (exit 2), not a crash.
        raise PlanValidationError(f"{source}: invalid plan: nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise PlanValidationError(f"{source}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PlanValidationError(f"{source}{where}: invalid YAML: {problem}") from None
    return parse_plan(data, source=source, text=text, max_entries=max_entries)


class _DuplicateKeyError(ValueError):
    """A JSON object names one member twice (``args[0]``: the name)."""


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(key)
        out[key] = value
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load`` that refuses a repeated key instead of keeping the last one.

    A repeated ``plan:`` or ``instruction:`` would otherwise drop what the author wrote
    first without a word. Keys brought in by a ``<<`` merge may still be overridden; a
    sequence or mapping used as a key is left to the base class, which refuses it.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(
                key_node, yaml.ScalarNode
            ):
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    problem=f"duplicate key {key!r}", problem_mark=key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def bundled_playbooks() -> list[str]:
    """Names of the playbooks shipped with the package."""
    root = resources.files("steerflow.plan") / "playbooks"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def find_playbook(
    name: str, *, home: Path, max_entries: int | None = MAX_PLAN_ENTRIES
) -> tuple[PlanFile, str]:
    """Find a playbook by name: ``<home>/playbooks/NAME.yaml``, then the bundled ones.

    Returns the validated playbook and where it was found.
    """
    if not _PLAYBOOK_NAME.match(name):
        raise UsageError(f"invalid playbook name {name!r}: use letters, digits, '_', '.', '-'")
    own = home / "playbooks" / f"{name}.yaml"
    if own.is_file():
        return load_plan_file(own, max_entries=max_entries), str(own)
    bundled = resources.files("steerflow.plan") / "playbooks" / f"{name}.yaml"
    if bundled.is_file():
        source = f"<bundled playbook {name}>"
        text = bundled.read_text(encoding="utf-8")
        return parse_plan_text(text, source=source, max_entries=max_entries), source
    available = ", ".join(bundled_playbooks()) or "none"
    raise UsageError(
        f"playbook {name!r} not found in {str(own.parent)!r} or bundled playbooks ({available})"
    )


def _describe(exc: ValidationError, *, source: str, text: str | None) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(part for part in err["loc"] if part not in ITEM_TAGS)
        if not loc and (entry := re.search(r"plan\[(\d+)\]", str(err["msg"]))):
            loc = ("plan", int(entry.group(1)))  # whole-plan checks name the entry they refuse
        field = _format_loc(loc)
        line = _line_of(text, loc) if text is not None else None
        where = f"{source}:{line}" if line else source
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        lines.append(f"{where}: {field or '<root>'}: {msg}")
    return "invalid plan:\n  " + "\n  ".join(lines)


# Union members pydantic names in a location; the user wrote a field, not a type.
_TYPE_LABELS = frozenset(
    {"str", "bool", "constrained-str", "Dependency", "function-after[_graph_is_sound(), PlanFile]"}
)


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _TYPE_LABELS:
            continue
        else:
            out += ("." if out else "") + str(part)
    return out


def _line_of(text: str, loc: tuple[Any, ...]) -> int | None:
    """Best-effort 1-based line of the YAML/JSON node at ``loc``."""
    try:
        node: Any = yaml.compose(text)
    except (yaml.YAMLError, RecursionError):  # the composer recurses deeper than json.loads
        return None
    line = None
    for part in loc:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            match = [(k, v) for k, v in node.value if getattr(k, "value", None) == part]
            if not match:
                break
            key, node = match[0]
            line = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            continue
    return line
