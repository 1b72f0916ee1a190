"""The shapes of the cluster's control messages, checked before any handler reads them (issue 37).

Control messages are JSON objects a node publishes to ``$cluster/ctl/<peer>`` (QoS 1), which
only the peer's verified link may read (docs/cluster.md, "Security").  A message a link
delivers is parsed here first (sans-IO: bytes in, a dict or :class:`BadControl` out): it
must be a JSON object whose ``t`` names a known kind, with every required field of that kind
present and of the expected JSON type (an integer is not a bool), and the optional ones
absent or of their type.  A field ``src`` (the sending node, where the kind has one) must be
the node whose link delivered the message: a node answers (``ret?``, ``fetch``) and hands
sessions over (``takeover``, ``fence``, ...) only to the node that asked.

Nested values (a session's subscriptions, a tail's messages, a table's rows) are the
handlers' to read: an error there is caught by :meth:`cluster._node.ClusterNode._control`,
counted and logged like a malformed message, and the link goes on.

``check`` costs O(size of the payload) (the JSON parse) plus O(fields of its kind).
"""

from __future__ import annotations

import json
from typing import Any, Final

__all__ = ["KINDS", "BadControl", "check"]

_STR: Final = (str,)
_INT: Final = (int,)
_BOOL: Final = (bool,)
_LIST: Final = (list,)
_DICT: Final = (dict,)
_ANY: Final = (object,)
_NUM: Final = (int, float)

#: kind -> (required fields, optional fields), each field name -> the JSON types it may have
KINDS: Final[dict[str, tuple[dict[str, tuple[type, ...]], dict[str, tuple[type, ...]]]]] = {
    # retained register (cluster._retained)
    "ret": ({"topic": _STR, "p": _STR, "q": _INT, "h": _INT, "o": _STR}, {"e": _INT}),
    "ret?": ({"src": _STR}, {}),
    # bans (cluster._node: a ban added or lifted on one node applies on every node)
    "ban": ({"k": _STR, "v": _STR, "rm": _BOOL, "s": _NUM}, {"x": _NUM, "r": _STR}),
    "ban?": ({"src": _STR}, {}),
    # session handovers (cluster._takeover)
    "takeover": ({"cid": _STR, "clean": _BOOL, "src": _STR}, {"rid": _STR, "peers": _LIST}),
    "none": ({"cid": _STR, "rid": _STR, "src": _STR}, {}),
    "session": (
        {"cid": _STR, "rid": _STR, "src": _STR, "subs": _LIST, "negatives": _LIST},
        {"composites": _LIST, "peers": _LIST},
    ),
    "fencereq": ({"rid": _STR, "src": _STR, "a": _STR}, {}),
    "fence": ({"rid": _STR, "src": _STR}, {}),
    "tail": (
        {"rid": _STR, "cid": _STR, "src": _STR, "messages": _LIST},
        {"qos2": _LIST, "fenced": _LIST},
    ),
    "more": ({"rid": _STR, "cid": _STR, "src": _STR, "messages": _LIST}, {}),
    # composite placement (cluster._placement, cluster._replicas)
    "sub": ({"expr": _STR, "src": _STR, "add": _BOOL}, {}),
    "ev": ({"expr": _STR, "body": _STR, "qos": _INT}, {}),
    "hb": ({"code": _INT, "digest": _ANY, "src": _STR}, {"m": _DICT}),
    "sync?": ({"expr": _STR, "src": _STR}, {}),
    "sync": ({"expr": _STR, "parts": _LIST, "seen": _LIST, "src": _STR}, {}),
    "fetch": ({"code": _INT, "src": _STR}, {}),
    "table": ({"code": _INT, "rows": _LIST}, {}),
}


class BadControl(ValueError):
    """A control message that is not of its kind's shape (the text says why)."""


def _typed(value: object, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types and object not in types:
        return False  # JSON true is not an integer here
    return isinstance(value, types)


def check(payload: bytes, sender: str) -> dict[str, Any]:
    """The control message in ``payload``, delivered by ``sender``'s link (or this node's
    own, for a message to itself), if it has its kind's shape; else :class:`BadControl`."""
    try:
        msg = json.loads(payload)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BadControl(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(msg, dict):
        raise BadControl(f"a JSON {type(msg).__name__}, not an object")
    kind = msg.get("t")
    shape = KINDS.get(kind) if isinstance(kind, str) else None
    if shape is None:
        raise BadControl(f"unknown kind {str(kind)[:20]!r}")
    required, optional = shape
    for name, types in required.items():
        if name not in msg:
            raise BadControl(f"{kind}: no {name!r}")
        if not _typed(msg[name], types):
            raise BadControl(f"{kind}: {name!r} is a {type(msg[name]).__name__}")
    for name, types in optional.items():
        value = msg.get(name)
        if value is not None and not _typed(value, types):
            raise BadControl(f"{kind}: {name!r} is a {type(value).__name__}")
    src = msg.get("src")
    if src is not None and src != sender:
        raise BadControl(f"{kind}: from node {sender[:8]} claiming to be {str(src)[:8]}")
    return msg
