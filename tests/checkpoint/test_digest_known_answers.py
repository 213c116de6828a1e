"""Known answers for ``result_digest``: every checkpoint ever written carries these digests.

A change to the canonical encoding (key order, separators, escaping, key spelling) or to
the hash (algorithm, size, prefix) makes every older checkpoint fail its settle check, so
the exact bytes and digests are pinned here, written out by hand rather than recomputed.
"""

from __future__ import annotations

import hashlib

import pytest

from steerflow.checkpoint import result_digest
from steerflow.checkpoint._digest import canonical_bytes, normalize

KNOWN = [
    (
        None,
        b"null",
        "6bfb9a89e7917438ddb17fb73d74243df565eae70968b5a290cf5f3563d76bef",
    ),
    (
        "notes",
        b'"notes"',
        "3c1287a29ab74727b02354f4e23bc6792e289e70273bf69a82f908c54a2711d7",
    ),
    (
        "Grüße — 日本 🚀",
        b'"Gr\\u00fc\\u00dfe \\u2014 \\u65e5\\u672c \\ud83d\\ude80"',
        "109c869d67eee42189919ef96443ce60224fd6b6fd16f25dcd0914754b940df2",
    ),
    (
        {"b": [1, 2.5, {"z": None, "a": True}], "a": "x"},
        b'{"a":"x","b":[1,2.5,{"a":true,"z":null}]}',
        "dab43c52efb9b19af97eb773162a1cc0ecba13d5617d394057d341a4533f57cc",
    ),
    (
        [0.1, 1e300, -0.0, 1.0],
        b"[0.1,1e+300,-0.0,1.0]",
        "70621857d696ee86605054215f41423964746cd1407c3b7b57d9f7b8da77cd8c",
    ),
    (
        {True: "t", False: "f"},
        b'{"false":"f","true":"t"}',
        "d017028027e55c87f8f1d14ac5a244b4ded600324c70050dd877ee179ecfe96b",
    ),
    (
        {None: "n"},
        b'{"null":"n"}',
        "311099e789a08740dd69eb7d20c70fe9934b9b78a03898d5ae5566dd6c493b75",
    ),
    (
        {10: "ten", 2.5: "f", "a": 1},
        b'{"10":"ten","2.5":"f","a":1}',
        "60f0493fd02d48b9032b7aba39d213bb001e7d73f103b7c36e91f608fcb8a0bf",
    ),
    (
        {"ключ": "é"},
        b'{"\\u043a\\u043b\\u044e\\u0447":"\\u00e9"}',
        "5758315319631ba4e7d78b3b762a4fd9a34e0fa2751b277530fea49ad0174763",
    ),
    (
        ("a", ("b",)),
        b'["a",["b"]]',
        "4e44122c89867e3a9dd859f03141a063c66dd9e4377e2e4593216f5af4c16659",
    ),
    (
        {},
        b"{}",
        "c09da522dac261c3d2566230bed10d2f3ef13f8e7654576c12e857e07f786098",
    ),
]


@pytest.mark.parametrize(("value", "canonical", "hexdigest"), KNOWN)
def test_canonical_bytes_and_digest_are_pinned(
    value: object, canonical: bytes, hexdigest: str
) -> None:
    assert canonical_bytes(value) == canonical
    assert result_digest(value) == "blake2b:" + hexdigest
    # The pinned hex is a 32-byte BLAKE2b of exactly those bytes, nothing else mixed in.
    assert hashlib.blake2b(canonical, digest_size=32).hexdigest() == hexdigest


def test_digest_shape_is_prefix_and_64_lowercase_hex() -> None:
    digest = result_digest("x")
    prefix, _, hexpart = digest.partition(":")
    assert prefix == "blake2b"
    assert len(hexpart) == 64
    assert hexpart == hexpart.lower()
    int(hexpart, 16)


def test_key_normalisation_spells_keys_as_json_does() -> None:
    assert normalize({True: 1, False: 2, None: 3, 7: 4, 1.5: 5}) == {
        "true": 1,
        "false": 2,
        "null": 3,
        "7": 4,
        "1.5": 5,
    }
    assert list(normalize({"b": 1, "a": 2})) == ["b", "a"]  # normalize keeps order; encoding sorts


@pytest.mark.parametrize(
    "value",
    [{1: "int", "1": "str"}, {None: "none", "null": "str"}, {True: "bool", "true": "str"}],
)
def test_keys_that_collide_once_spelled_are_refused(value: dict[object, str]) -> None:
    with pytest.raises(ValueError, match="collide"):
        canonical_bytes(value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), {"a": [float("-inf")]}])
def test_non_finite_numbers_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match="non-finite"):
        result_digest(value)


def test_non_finite_key_is_refused() -> None:
    with pytest.raises(ValueError, match="non-finite number used as an object key"):
        canonical_bytes({float("nan"): 1})


def test_unknown_types_are_stored_as_their_text() -> None:
    class Opaque:
        def __str__(self) -> str:
            return "opaque!"

    assert normalize({"k": Opaque()}) == {"k": "opaque!"}
    assert result_digest(Opaque()) == result_digest("opaque!")


def test_keys_of_other_types_are_spelled_as_their_text() -> None:
    # json.dumps would refuse a tuple key; the writer stores its text instead, and readers
    # recompute the digest from that stored text, so the spelling is part of the format.
    assert normalize({(1, "a"): 1}) == {"(1, 'a')": 1}
    assert canonical_bytes({(1, "a"): 1}) == b"{\"(1, 'a')\":1}"
