"""The public JSON Patch suite, run against steerflow's strict patch subset.

Every case is classified by a small, independent RFC 6902 reference applier in this file that also
notes where the subset is stricter than the RFC. The rules checked:

* a case the RFC expects to fail (``error``) must be refused;
* a case using something the subset forbids (``move``/``copy``/``test``, unknown or missing
  members, ``add`` onto an existing member, root ``add``/``remove``, root ``replace`` by a
  non-object) must be refused;
* every other case must produce exactly ``expected`` (compared type-exactly).

The per-class counts are pinned so a change in classification is visible.
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from steerflow.checkpoint._patch import PatchError, apply_patch

FIXTURES = Path(__file__).parent / "fixtures" / "json-patch-tests"


def _load() -> list[tuple[str, dict[str, Any], bool]]:
    """Load every case, noting which ones repeat a member name inside their raw JSON."""
    cases: list[tuple[str, dict[str, Any], bool]] = []
    for name in ("tests.json", "spec_tests.json"):
        seen_duplicate = [False]

        def hook(pairs: list[tuple[str, Any]], seen: list[bool] = seen_duplicate) -> dict[str, Any]:
            if len({k for k, _ in pairs}) != len(pairs):
                seen[0] = True
            obj = dict(pairs)
            if "patch" in obj and "doc" in obj:  # a whole case: children were decoded first
                obj["__duplicate__"], seen[0] = seen[0], False
            return obj

        text = (FIXTURES / name).read_text(encoding="utf-8")
        for i, case in enumerate(json.loads(text, object_pairs_hook=hook)):
            duplicate = case.pop("__duplicate__")
            cases.append((f"{name}#{i}", case, duplicate))
    return cases


CASES = _load()


class _RefusedError(Exception):
    pass


def _tokens(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise _RefusedError("bad pointer")
    if re.search(r"~(?![01])", path):
        raise _RefusedError("bad escape")
    if path == "":
        return []
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _index(tok: str, n: int, *, end: bool) -> int:
    if not re.fullmatch(r"0|[1-9][0-9]*", tok) or int(tok) > (n if end else n - 1):
        raise _RefusedError("bad index")
    return int(tok)


def _resolve(doc: Any, toks: list[str]) -> Any:
    for t in toks:
        if isinstance(doc, dict):
            if t not in doc:
                raise _RefusedError("missing")
            doc = doc[t]
        elif isinstance(doc, list):
            doc = doc[_index(t, len(doc), end=False)]
        else:
            raise _RefusedError("scalar parent")
    return doc


def _reference(doc: Any, patch: list[dict[str, Any]]) -> tuple[Any, set[str]]:
    """Apply ``patch`` with full RFC 6902 semantics; also report subset violations."""
    doc = copy.deepcopy(doc)
    why: set[str] = set()
    shapes = {"add": {"op", "path", "value"}, "replace": {"op", "path", "value"}}
    shapes |= {"remove": {"op", "path"}, "test": {"op", "path", "value"}}
    shapes |= {"move": {"op", "path", "from"}, "copy": {"op", "path", "from"}}
    for op in patch:
        name = op.get("op")
        if name not in shapes:
            raise _RefusedError("unknown op")
        if name in ("move", "copy", "test"):
            why.add("forbidden_op")
        if not shapes[name] <= set(op):
            raise _RefusedError("missing member")
        if set(op) - shapes[name]:
            why.add("unknown_member")
        toks = _tokens(op["path"])
        if name == "test":
            if json.dumps(_resolve(doc, toks), sort_keys=True) != json.dumps(
                op["value"], sort_keys=True
            ):
                raise _RefusedError("test failed")
            continue
        if name in ("move", "copy"):
            value = copy.deepcopy(_resolve(doc, _tokens(op["from"])))
            if name == "move":
                doc = _remove(doc, _tokens(op["from"]))
            doc = _add(doc, toks, value, why)
            continue
        if not toks:
            if name != "replace":
                why.add("root_add_or_remove")
            elif not isinstance(op["value"], dict):
                why.add("root_replace_non_object")
            if name == "remove":
                raise _RefusedError("root remove")
            doc = copy.deepcopy(op["value"])
            continue
        if name == "add":
            doc = _add(doc, toks, copy.deepcopy(op["value"]), why)
        elif name == "remove":
            doc = _remove(doc, toks)
        else:
            doc = _remove(doc, toks)
            doc = _add(doc, toks, copy.deepcopy(op["value"]), why)
    return doc, why


def _add(doc: Any, toks: list[str], value: Any, why: set[str]) -> Any:
    if not toks:
        why.add("root_add_or_remove")
        return value
    parent = _resolve(doc, toks[:-1])
    if isinstance(parent, dict):
        if toks[-1] in parent:
            why.add("add_existing_member")
        parent[toks[-1]] = value
    elif isinstance(parent, list):
        i = len(parent) if toks[-1] == "-" else _index(toks[-1], len(parent), end=True)
        parent.insert(i, value)
    else:
        raise _RefusedError("scalar parent")
    return doc


def _remove(doc: Any, toks: list[str]) -> Any:
    parent = _resolve(doc, toks[:-1])
    if isinstance(parent, dict):
        if toks[-1] not in parent:
            raise _RefusedError("missing")
        del parent[toks[-1]]
    elif isinstance(parent, list):
        del parent[_index(toks[-1], len(parent), end=False)]
    else:
        raise _RefusedError("scalar parent")
    return doc


def _exact(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


# What the subset's refusal message says for each reason (a guard against refusing a forbidden
# case for an unrelated accident). For combined reasons any one may be reported first.
_REASON_TEXT = {
    "add_existing_member": r"add would replace existing member",
    "root_add_or_remove": r"root (add|remove) is not allowed",
    "root_replace_non_object": r"root may only be replaced by an object",
}


def _classify(case: dict[str, Any]) -> str:
    try:
        result, why = _reference(case["doc"], case["patch"])
    except _RefusedError:
        assert "error" in case, "the reference refused a case the RFC accepts"
        return "rfc_error"
    if "error" in case:
        # The RFC says this fails but the permissive reference accepted it; such a case can
        # only be one the subset forbids anyway (checked by the caller).
        assert why, "reference accepted an RFC error case without a subset violation"
        return "rfc_error"
    if why:
        return "subset_forbids:" + "+".join(sorted(why))
    if "expected" in case:
        assert _exact(result) == _exact(case["expected"]), "reference disagrees with suite"
    return "allowed"


@pytest.mark.parametrize(("case_id", "case", "duplicate"), CASES, ids=[c[0] for c in CASES])
def test_case(case_id: str, case: dict[str, Any], duplicate: bool) -> None:
    kind = _classify(case)
    if duplicate:
        # A repeated member name is refused by the v3 loader before any patch is interpreted;
        # whatever a last-wins decoder kept must be refused by the subset as well.
        assert kind != "allowed"
    doc_before = _exact(case["doc"])
    if kind == "allowed":
        got = apply_patch(case["doc"], case["patch"])
        if "expected" in case:  # a case without one only has to apply cleanly
            assert _exact(got) == _exact(case["expected"])
    else:
        with pytest.raises(PatchError) as info:
            apply_patch(case["doc"], case["patch"])
        message = str(info.value)
        assert re.match(r"op \d+|patch", message), message
        for reason in kind.removeprefix("subset_forbids:").split("+"):
            if reason in _REASON_TEXT:
                assert re.search(_REASON_TEXT[reason], message), (reason, message)
    assert _exact(case["doc"]) == doc_before, "input document was mutated"


def test_classification_counts() -> None:
    counts = Counter(_classify(case) for _, case, _ in CASES)
    disabled = sum(1 for _, case, _ in CASES if case.get("disabled"))
    duplicates = sum(1 for _, _, dup in CASES if dup)
    print(dict(sorted(counts.items())), "disabled:", disabled, "duplicate-member:", duplicates)
    assert duplicates == 2
    assert sum(counts.values()) == len(CASES) == 112
    assert disabled == 4
    assert dict(counts) == {
        "allowed": 49,
        "rfc_error": 36,
        "subset_forbids:add_existing_member": 1,
        "subset_forbids:forbidden_op": 20,
        "subset_forbids:forbidden_op+unknown_member": 1,
        "subset_forbids:root_add_or_remove": 3,
        "subset_forbids:root_replace_non_object": 1,
        "subset_forbids:unknown_member": 1,
    }
