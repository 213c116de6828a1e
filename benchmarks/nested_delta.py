"""Nested-delta size and capture cost as the enclosing container grows (ADR-0069 A2, checks 7-8).

For an enclosing list (``context["nested"]["entries"]``) and an enclosing object
(``context["nested"]["members"]``) of 1,000 / 10,000 / 100,000 entries, one fixed item is
appended (list) or inserted as an absent member (object). For each case this prints:

* ``line`` — the UTF-8 length of the journal line the writer would append (compact JSON,
  ``ensure_ascii=True``, trailing LF) and the bound ``E + U + P + 256`` it must not exceed;
* ``capture`` — median ``time.process_time`` of ``capture()`` for the mutation, and for an
  unchanged context (the discovery cost that remains O(context));
* ``peak`` — ``tracemalloc`` peak during one capture;
* ``copied`` — frozen container nodes that are new in the next baseline (not shared with the
  previous one) and the element references those nodes hold (a reference copy, not a deep copy);
* ``shared`` — whether every unchanged entry and sibling subtree is the *same object*;
* ``v2`` — the naive baseline: ``copy.deepcopy`` of the live context plus a full compact JSON
  encode (what a full snapshot per outcome costs), and a from-scratch ``freeze``.

Timings are informational only; nothing here asserts them.

Run: ``.venv/bin/python benchmarks/nested_delta.py [--repeat N] [--entries str|dict|both]``
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from steerflow.checkpoint._capture import Frozen, capture, freeze, to_jsonable
from steerflow.checkpoint._patch import apply_patch

SIZES = (1_000, 10_000, 100_000)
ITEM = "i" * 8192  # fixed new item (8,192 ASCII bytes, as in verification 1)
ENTRY = {"agent_id": "op-0", "status": "completed", "response": "r" * 8192}  # fixed outcome
GENERATION = "0123456789abcdef0123456789abcdef"
ENC: dict[str, Any] = {"ensure_ascii": True, "separators": (",", ":"), "allow_nan": False}


def _encode(value: object) -> bytes:
    return json.dumps(value, **ENC).encode("utf-8")


def _context(n: int, shape: str, entries: str) -> dict[str, Any]:
    def entry(i: int) -> object:
        return f"entry-{i:06d}" if entries == "str" else {"id": i, "text": f"entry-{i:06d}"}

    nested: dict[str, Any] = {"meta": {"owner": "bench", "tags": ["a", "b"]}}
    if shape == "list":
        nested["entries"] = [entry(i) for i in range(n)]
    else:
        nested["members"] = {f"k{i:06d}": entry(i) for i in range(n)}
    return {"nested": nested, "other": {"history": [{"step": i} for i in range(100)]}}


def _median_cpu(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.process_time()
        fn()
        samples.append(time.process_time() - start)
    return statistics.median(samples)


def _containers(node: Frozen, out: dict[int, Frozen]) -> dict[int, Frozen]:
    if isinstance(node, dict | tuple):
        out[id(node)] = node
        for child in node.values() if isinstance(node, dict) else node:
            _containers(child, out)
    return out


def _copied(old: Frozen, new: Frozen) -> tuple[int, int]:
    """Containers in ``new`` that ``old`` does not share, and the references they hold."""
    known = _containers(old, {})
    nodes = slots = 0
    stack = [new]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict | tuple) or id(node) in known:
            continue
        nodes += 1
        slots += len(node)
        stack.extend(node.values() if isinstance(node, dict) else node)
    return nodes, slots


def _shared(old: Any, new: Any, shape: str) -> bool:
    if new["other"] is not old["other"] or new["nested"]["meta"] is not old["nested"]["meta"]:
        return False
    if shape == "list":
        before, after = old["nested"]["entries"], new["nested"]["entries"]
        return all(a is b for a, b in zip(before, after, strict=False))
    before, after = old["nested"]["members"], new["nested"]["members"]
    return all(after[k] is v for k, v in before.items())


def run_case(n: int, shape: str, entries: str, repeat: int) -> dict[str, Any]:
    live = _context(n, shape, entries)
    baseline = freeze(live)
    unchanged_cpu = _median_cpu(lambda: capture(baseline, live), repeat)
    if shape == "list":
        live["nested"]["entries"].append(ITEM)
    else:
        live["nested"]["members"]["new-member"] = ITEM
    new, patch = capture(baseline, live)
    assert len(patch) == 1 and patch[0]["op"] == "add", patch
    assert json.dumps(apply_patch(json.loads(json.dumps(baseline)), patch)) == json.dumps(new)
    capture_cpu = _median_cpu(lambda: capture(baseline, live), repeat)
    tracemalloc.start()
    capture(baseline, live)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    record = {
        "version": 3,
        "generation": GENERATION,
        "seq": 2**63 - 1,  # the widest sequence number the format allows
        "kind": "op",
        "entry": ENTRY,
        "flow_context": {"patch": patch},
    }
    line = len(_encode(record)) + 1  # + LF
    bound = len(_encode(ENTRY)) + len(_encode(ITEM)) + len(_encode(patch[0]["path"])) + 256
    nodes, slots = _copied(baseline, new)

    naive_cpu = _median_cpu(lambda: _encode(copy.deepcopy(live)), max(1, repeat // 2))
    freeze_cpu = _median_cpu(lambda: freeze(live), max(1, repeat // 2))
    return {
        "case": f"{shape}/{entries}",
        "n": n,
        "line": line,
        "bound": bound,
        "ok": line <= bound,
        "capture_ms": capture_cpu * 1e3,
        "unchanged_ms": unchanged_cpu * 1e3,
        "peak_kib": peak / 1024,
        "nodes": nodes,
        "slots": slots,
        "shared": _shared(baseline, new, shape),
        "snapshot_bytes": len(_encode(to_jsonable(new))),
        "naive_ms": naive_cpu * 1e3,
        "freeze_ms": freeze_cpu * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timing samples per case")
    parser.add_argument("--entries", choices=("str", "dict", "both"), default="both")
    args = parser.parse_args()
    kinds = ("str", "dict") if args.entries == "both" else (args.entries,)
    header = (
        f"{'case':<12}{'entries':>9}{'line':>7}{'bound':>7}{'ok':>4}"
        f"{'capture':>10}{'unchanged':>11}{'peak':>10}{'copied':>14}{'shared':>8}"
        f"{'v2 bytes':>11}{'v2 copy+enc':>13}{'freeze':>9}"
    )
    print(header)
    print(
        f"{'':<12}{'':>9}{'B':>7}{'B':>7}{'':>4}{'ms cpu':>10}{'ms cpu':>11}{'KiB':>10}"
        f"{'nodes/refs':>14}{'':>8}{'B':>11}{'ms cpu':>13}{'ms cpu':>9}"
    )
    for shape in ("list", "object"):
        for entries in kinds:
            for n in SIZES:
                r = run_case(n, shape, entries, args.repeat)
                print(
                    f"{r['case']:<12}{r['n']:>9,}{r['line']:>7}{r['bound']:>7}"
                    f"{'yes' if r['ok'] else 'NO':>4}{r['capture_ms']:>10.2f}"
                    f"{r['unchanged_ms']:>11.2f}{r['peak_kib']:>10.1f}"
                    f"{str(r['nodes']) + '/' + str(r['slots']):>14}"
                    f"{'yes' if r['shared'] else 'NO':>8}{r['snapshot_bytes']:>11,}"
                    f"{r['naive_ms']:>13.2f}{r['freeze_ms']:>9.2f}"
                )
    print(
        "\ncopied = frozen containers new in the next baseline / element references they hold"
        " (reference copies; no unchanged entry is copied or re-normalized)."
        "\nv2 = one full snapshot: deepcopy of the live context + compact JSON encode."
    )


if __name__ == "__main__":
    main()
