"""Canonical JSON for checkpoint entries, and the ``result_digest`` of a response.

Canonical encoding
    ``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
    allow_nan=False)`` applied to the *normalized* value.  Normalizing turns tuples
    into lists, object keys into strings (the same spelling ``json.dumps`` would give
    them) and any value JSON cannot represent into ``str(value)``; it refuses NaN and
    infinities, and refuses two distinct keys that would collide once spelled as
    strings.  Because the writer stores the normalized response in the entry, a reader
    can recompute the digest from the stored ``response`` and compare.

Digest
    ``"blake2b:"`` followed by the hex of a 32-byte BLAKE2b hash of those canonical
    bytes.  It lives in the same file as the entry, so it notices accidental drift
    (a truncated or replaced value), not a deliberate edit.

Entry digest
    An entry's ``result_digest`` covers its response and, when the entry carries them,
    the members of :data:`COVERED_MEMBERS` (CONTRACT §10: ``spawned_ids``,
    ``artifacts``; an agent turn's ``turn``, ``controls``, ``next`` and
    ``conversation``; an escalation retry's attempt number ``escalation``; a call's
    ``usage``, what it cost, which a resume chain's budget adds up; the instruction a
    ``resume --from`` fork edited, ``instruction_edited``; a loop round's ``loop``, its
    round and what was decided after it; a typed node's ``output``, the validated
    structured value a resume hands its dependents).  An entry
    carrying ``turn`` or ``escalation`` (the :data:`IDENTITY_MARKERS`, written only since
    they were covered) is digested over its :data:`IDENTITY_MEMBERS` too: its label and
    instruction, the logical operation, the attempt it replaces and its model, which
    older entries carried uncovered.  An entry without any of them is digested exactly
    as before, over the response alone, so every digest already written stays valid;
    an entry with them is digested over ``{"response": ..., <member>: ...}``, so
    removing, adding or changing such a member (or the marker that makes the others
    covered) no longer matches.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any, TypeAlias

__all__ = [
    "COVERED_MEMBERS",
    "IDENTITY_MARKERS",
    "IDENTITY_MEMBERS",
    "JSON",
    "canonical_bytes",
    "entry_digest",
    "normalize",
    "result_digest",
]

JSON: TypeAlias = Any  # a plain tree of dict/list/str/int/float/bool/None

_DIGEST_PREFIX = "blake2b:"

#: Entry members covered by ``result_digest`` besides the response, when present.
COVERED_MEMBERS = (
    "spawned_ids",
    "artifacts",
    "turn",
    "controls",
    "next",
    "conversation",
    "escalation",
    "usage",
    "instruction_edited",
    "loop",
    "output",
)
#: Covered members that make :data:`IDENTITY_MEMBERS` covered as well.
IDENTITY_MARKERS = ("turn", "escalation")
#: What names an agent turn or an escalation retry; entries written before these were
#: covered carry them too, so they count only beside a marker (old digests still verify).
IDENTITY_MEMBERS = ("agent_id", "instruction", "spawn_id", "escalated_from", "parent_id", "model")


def _key(key: object) -> str:
    if isinstance(key, str):
        return key
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        if not math.isfinite(key):
            raise ValueError(f"non-finite number used as an object key: {key!r}")
        return repr(key)
    return str(key)


def normalize(value: object) -> JSON:
    """Return a fresh plain-JSON copy of ``value`` (see the module docstring)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"non-finite number cannot be stored: {value!r}")
        return value
    if isinstance(value, dict):
        out: dict[str, JSON] = {}
        for key, item in value.items():
            name = key if type(key) is str else _key(key)
            if name in out:
                raise ValueError(f"object keys collide once written as JSON: {name!r}")
            # Exact strings, ints and None are kept as they are (as the first test above
            # would): no call per member for the common entry fields (admission runs
            # on the event loop).
            kind = type(item)
            out[name] = item if kind is str or kind is int or item is None else normalize(item)
        return out
    if isinstance(value, (list, tuple)):
        return [normalize(item) for item in value]
    return str(value)


#: One encoder for every digest: ``json.dumps`` with these options builds one per call.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
)


def canonical_bytes(value: object) -> bytes:
    """The canonical JSON encoding of the normalized ``value``."""
    return _CANONICAL.encode(normalize(value)).encode("ascii")


def result_digest(response: object) -> str:
    """``"blake2b:<64 hex>"`` over the canonical JSON encoding of ``response``."""
    return _DIGEST_PREFIX + hashlib.blake2b(canonical_bytes(response), digest_size=32).hexdigest()


def entry_digest(entry: Mapping[str, object]) -> str:
    """The ``result_digest`` of a checkpoint entry (see the module docstring)."""
    covered = {name: entry[name] for name in COVERED_MEMBERS if name in entry}
    if not covered:
        return result_digest(entry.get("response"))
    if any(name in covered for name in IDENTITY_MARKERS):
        covered.update((name, entry[name]) for name in IDENTITY_MEMBERS if name in entry)
    return result_digest({"response": entry.get("response"), **covered})
