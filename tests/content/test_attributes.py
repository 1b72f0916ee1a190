"""attributes(): JSON object payloads flattened to dotted paths; anything else -> {}."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from content import attributes


def test_flattening_and_types() -> None:
    doc = {"sensor": {"temp": 21.5, "ok": True, "deep": {"x": "y"}}, "id": 7, "n": None, "l": [1, 2], "e": {}}
    assert attributes(orjson.dumps(doc)) == {
        "sensor.temp": 21.5,
        "sensor.ok": True,
        "sensor.deep.x": "y",
        "id": 7,
    }
    out = attributes(b'{"b": true, "i": 1}')
    assert type(out["b"]) is bool
    assert type(out["i"]) is int


def test_non_objects_give_empty() -> None:
    for payload in (b"", b"[1, 2]", b"42", b'"s"', b"null", b"\xff\xfe", b"{", b"{'a': 1}", b"hello"):
        assert attributes(payload) == {}


def test_other_buffers() -> None:
    assert attributes(memoryview(b' {"a": 1}')) == {"a": 1}
    assert attributes(bytearray(b'{"a": "x"}')) == {"a": "x"}


def test_later_key_wins_on_collision() -> None:
    assert attributes(b'{"a.b": 1, "a": {"b": 2}}') == {"a.b": 2}


@given(st.binary(max_size=64))
def test_never_raises_on_bytes(payload: bytes) -> None:
    assert isinstance(attributes(payload), dict)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text("abc", min_size=1, max_size=2), inner, max_size=3)
    ),
    max_leaves=10,
)


def _expected(obj: object, prefix: str, out: dict[str, object]) -> None:
    assert isinstance(obj, dict)
    for k, v in obj.items():
        if isinstance(v, dict):
            _expected(v, prefix + k + ".", out)
        elif v is not None and not isinstance(v, list):
            out[prefix + k] = v


@given(st.dictionaries(st.text("abc", min_size=1, max_size=2), json_values, max_size=4))
def test_matches_a_reference_flattening(doc: dict[str, object]) -> None:
    expected: dict[str, object] = {}
    _expected(doc, "", expected)
    assert attributes(orjson.dumps(doc)) == expected
