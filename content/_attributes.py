"""Attribute extraction: the event a content filter sees for one publish (docs/reference.md, "content").

A payload that is a JSON object becomes a flat mapping from dotted paths to scalar values
(seed 000, Definition 1: an attribute is <type, name, value>; here the type is the Python
type of the value)::

    {"sensor": {"temp": 21.5, "ok": true}, "id": "x"}
    -> {"sensor.temp": 21.5, "sensor.ok": True, "id": "x"}

Kept: ``int``, ``float``, ``str``, ``bool``.  Skipped: ``null`` (SQL's unknown: a filter on
it behaves as on a missing attribute) and arrays (the language has no operator on lists).
An empty object contributes nothing.  If a key itself contains a dot and collides with a
nested path, the one that comes later in the document wins.  Anything that is not a JSON
object (invalid UTF-8 or JSON, a top-level array or scalar, nesting deeper than orjson's
limit) yields ``{}``; this function never raises.  Integers beyond 64 bits come back as
floats (orjson's behaviour).

Cost: one ``orjson.loads`` (C) plus O(number of values) for the flattening; a payload whose
first non-blank byte is not ``{`` is rejected without parsing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from content._predicate import Scalar

__all__ = ["attributes"]

_BLANK = b" \t\r\n"


def attributes(payload: bytes | bytearray | memoryview) -> dict[str, Scalar]:
    """The flattened attributes of a JSON-object payload, ``{}`` for anything else."""
    try:
        if isinstance(payload, memoryview):
            payload = payload.tobytes()
        head = payload.lstrip(_BLANK)[:1]
        if head != b"{":
            return {}
        doc = _loads(payload)
    except Exception:  # orjson.JSONDecodeError, TypeError/AttributeError for odd inputs
        return {}
    if not isinstance(doc, dict):
        return {}
    out: dict[str, Scalar] = {}
    _flatten(doc, "", out)
    return out


def _first_loads(payload: bytes | bytearray) -> Any:
    """``orjson.loads``, orjson imported at the first JSON payload a selector reads (a broker
    without content filters does not load it, issue 42 item 1); ``_loads`` is then
    ``orjson.loads`` itself (one global lookup per payload, as ``orjson.loads`` was)."""
    global _loads  # noqa: PLW0603 -- the first call replaces itself by orjson.loads
    import orjson

    _loads = orjson.loads
    return orjson.loads(payload)


_loads: Callable[[bytes | bytearray], Any] = _first_loads

_SCALAR_TYPES = frozenset({str, int, float, bool})  # orjson returns exactly these types


def _flatten(obj: dict[str, Any], prefix: str, out: dict[str, Scalar]) -> None:
    scalar = _SCALAR_TYPES
    for key, value in obj.items():
        t = type(value)
        if t in scalar:
            out[prefix + key] = value
        elif t is dict:
            _flatten(value, prefix + key + ".", out)
