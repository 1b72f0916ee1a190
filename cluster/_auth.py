"""Authentication of the links between the brokers of a cluster (docs/cluster.md, "Security").

A link is an MQTT 5 connection whose client id is ``$cluster/<node id>``; its password is a
token proving that the connecting broker knows the cluster's shared secret::

    <unix time>.<nonce hex>.<HMAC-SHA256(secret, "siftmq-cluster|" client id "|" time "|" nonce) hex>

The accepting broker checks the MAC in constant time, refuses a token older or newer than
:data:`WINDOW` seconds, and refuses a (client id, nonce) pair it already accepted inside the
window, so a captured token cannot be replayed.  (MQTT 5 enhanced authentication would make it
an interactive challenge; the broker does not implement AUTH exchanges, so the challenge is
the clock window plus the nonce cache.)  Without TLS on the cluster listener the traffic itself
is not encrypted: the secret authenticates, it does not hide.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from typing import Final

__all__ = ["WINDOW", "TokenChecker", "make_token"]

#: seconds a token stays valid either side of the verifier's clock
WINDOW: Final = 60.0
_MAX_SEEN: Final = 100_000


def _mac(secret: bytes, client_id: str, stamp: str, nonce: str) -> str:
    msg = f"siftmq-cluster|{client_id}|{stamp}|{nonce}".encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def make_token(secret: bytes, client_id: str, now: float | None = None) -> bytes:
    """A fresh password for ``client_id``'s CONNECT (O(1))."""
    stamp = str(int(time.time() if now is None else now))
    nonce = secrets.token_hex(12)
    return f"{stamp}.{nonce}.{_mac(secret, client_id, stamp, nonce)}".encode()


class TokenChecker:
    """Verifies tokens and remembers the nonces seen inside the window (bounded memory)."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()

    def check(self, client_id: str, token: bytes | None, now: float | None = None) -> str | None:
        """None when ``token`` is valid for ``client_id``, else why not (O(1) amortised)."""
        if token is None:
            return "no cluster token"
        now = time.time() if now is None else now
        try:
            stamp, nonce, mac = token.decode("ascii").split(".")
            when = int(stamp)
        except (UnicodeDecodeError, ValueError):
            return "malformed cluster token"
        if abs(now - when) > WINDOW:
            return "cluster token outside the clock window (clocks apart?)"
        if not hmac.compare_digest(mac, _mac(self.secret, client_id, stamp, nonce)):
            return "bad cluster token (wrong secret?)"
        seen = self._seen
        while seen and (len(seen) >= _MAX_SEEN or next(iter(seen.values())) < now - 2 * WINDOW):
            seen.popitem(last=False)
        key = (client_id, nonce)
        if key in seen:
            return "replayed cluster token"
        seen[key] = now
        return None
