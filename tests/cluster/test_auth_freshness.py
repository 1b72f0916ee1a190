"""The sans-IO freshness of cluster messages (cluster._auth; issue 37, item 2): link tokens and
overlay datagrams round-trip, and tampered, stale, replayed, redirected or unbound ones are
refused and counted by reason."""

from __future__ import annotations

import secrets

import pytest
import umsgpack

from cluster._auth import (
    WINDOW,
    ZERO_ID,
    DatagramGuard,
    NonceCache,
    Opened,
    Refusal,
    TokenChecker,
    datagram_key,
    make_token,
    seal,
)

SECRET = b"unit-cluster-secret"
A, B, C = (bytes([i]) * 20 for i in (1, 2, 3))
T0 = 1_800_000_000.0


def request(name: str, sender: bytes, *args: object) -> bytes:
    """An rpcudp request body as kademlia sends it."""
    return b"\x00" + secrets.token_bytes(20) + umsgpack.packb([name, (sender, *args)])


def reply_to(req: bytes, value: object) -> bytes:
    return b"\x01" + req[1:21] + umsgpack.packb(value)


# ---------------------------------------------------------------- link tokens
def test_a_token_round_trips_once_at_its_destination_only() -> None:
    client = f"$cluster/{A.hex()}"
    at_b, at_c = TokenChecker(SECRET, B.hex(), since=0), TokenChecker(SECRET, C.hex(), since=0)
    token = make_token(SECRET, client, B.hex(), now=T0)
    assert at_c.check(client, token, T0 + 1) == "cluster token for another node (replayed from another link?)"
    assert at_b.check(client, token, T0 + 1) is None
    assert at_b.check(client, token, T0 + 2) == "replayed cluster token"
    assert at_c.refused[Refusal.WRONG_DESTINATION] == 1
    assert at_b.refused[Refusal.REPLAYED] == 1


def test_tampered_stale_and_foreign_tokens_are_refused() -> None:
    client = f"$cluster/{A.hex()}"
    at_b = TokenChecker(SECRET, B.hex(), since=0)
    good = make_token(SECRET, client, B.hex(), now=T0).decode()
    sender, dest, stamp, nonce, mac = good.split(".")
    redirected = f"{sender}.{C.hex()}.{stamp}.{nonce}.{mac}".encode()  # dest rewritten
    later = f"{sender}.{dest}.{int(stamp) + 1000}.{nonce}.{mac}".encode()
    assert at_b.check(client, redirected, T0) == "bad cluster token (wrong secret?)"
    assert at_b.check(client, later, T0) == "bad cluster token (wrong secret?)"
    # another member's valid token under this client id
    other = make_token(SECRET, f"$cluster/{C.hex()}", B.hex(), now=T0)
    assert at_b.check(client, other, T0) == "bad cluster token (wrong secret?)"
    assert at_b.check(client, make_token(b"other-secret", client, B.hex(), now=T0), T0) is not None
    for late in (T0 + WINDOW + 1, T0 - WINDOW - 1):
        assert (
            at_b.check(client, good.encode(), late)
            == "cluster token outside the clock window (clocks apart?)"
        )
    assert at_b.check(client, b"1.2.3", T0) == "malformed cluster token"
    assert at_b.check(client, None, T0) == "no cluster token"
    assert at_b.refused == {
        Refusal.MALFORMED: 2,
        Refusal.BAD_MAC: 4,
        Refusal.WRONG_DESTINATION: 0,
        Refusal.STALE: 2,
        Refusal.REPLAYED: 0,
        Refusal.UNSOLICITED: 0,
    }
    assert at_b.check(client, good.encode(), T0) is None  # none of that consumed it


def test_the_nonce_cache_is_bounded_and_forgetting_never_lets_a_replay_in() -> None:
    cache = NonceCache(window=WINDOW, limit=3)
    for i in range(3):
        assert cache.admit(A, bytes([i]), T0 + i, T0 + i) is None
    assert cache.admit(A, b"\x03", T0 + 3, T0 + 3) is None  # the oldest (stamp T0) forgotten
    assert len(cache) == 3
    assert cache.admit(A, b"\x00", T0, T0 + 3) is Refusal.STALE  # not newer than the floor
    assert cache.admit(A, b"\x02", T0 + 2, T0 + 3) is Refusal.REPLAYED
    # pairs past the window leave on their own
    assert cache.admit(A, b"\x09", T0 + 2 * WINDOW, T0 + 2 * WINDOW) is None
    assert len(cache) == 1


# ---------------------------------------------------------------- overlay datagrams
def guards() -> tuple[DatagramGuard, DatagramGuard, DatagramGuard]:
    key = datagram_key(SECRET)
    return DatagramGuard(key, A, since=0), DatagramGuard(key, B, since=0), DatagramGuard(key, C, since=0)


def test_a_request_and_its_reply_round_trip_once() -> None:
    a, b, c = guards()
    req = request("find_node", A, C)
    sealed = a.request(req, B, T0)
    opened = b.open(sealed, T0 + 0.5)
    assert isinstance(opened, Opened)
    assert (opened.sender, opened.body, opened.first_contact) == (A, req, False)
    assert b.open(sealed, T0 + 1) is Refusal.REPLAYED  # replayed to the same node
    assert c.open(sealed, T0 + 1) is Refusal.WRONG_DESTINATION  # replayed to another
    answer = b.reply(reply_to(req, []), opened, T0 + 0.6)
    assert a.pending() == 1
    back = a.open(answer, T0 + 0.7)
    assert isinstance(back, Opened) and back.sender == B
    assert a.pending() == 0
    assert a.open(answer, T0 + 0.8) is Refusal.REPLAYED
    assert (
        b.refused[Refusal.REPLAYED],
        c.refused[Refusal.WRONG_DESTINATION],
        a.refused[Refusal.REPLAYED],
    ) == (1, 1, 1)


def test_tampered_foreign_and_stale_datagrams_are_refused() -> None:
    a, b, _ = guards()
    sealed = a.request(request("ping", A), B, T0)
    for i in (0, 20, 40, len(sealed) - 1):  # tag, sender, destination, body
        tampered = bytearray(sealed)
        tampered[i] ^= 1
        assert b.open(bytes(tampered), T0) is Refusal.BAD_MAC
    foreign = DatagramGuard(datagram_key(b"another-secret"), A, since=0).request(request("ping", A), B, T0)
    assert b.open(foreign, T0) is Refusal.BAD_MAC
    assert b.open(b"\x00" * 30, T0) is Refusal.MALFORMED
    assert b.open(sealed, T0 + WINDOW + 1) is Refusal.STALE
    assert b.open(sealed, T0 - WINDOW - 1) is Refusal.STALE
    assert isinstance(b.open(sealed, T0 + WINDOW - 1), Opened)  # fresh enough, first time
    assert b.refused[Refusal.BAD_MAC] == 5
    assert b.refused[Refusal.STALE] == 2


def test_the_zero_destination_is_for_a_first_contact_ping_only() -> None:
    a, b, c = guards()
    ping = a.request(request("ping", A), ZERO_ID, T0)
    opened = b.open(ping, T0)
    assert isinstance(opened, Opened) and opened.first_contact
    assert isinstance(c.open(ping, T0), Opened)  # any node answers it (and admits nobody)
    for name in ("find_node", "store", "stun"):
        assert b.open(a.request(request(name, A, C), ZERO_ID, T0), T0) is Refusal.WRONG_DESTINATION
    # the answer comes from B, whose id A learns from it: bound to the ping all the same
    answer = b.reply(reply_to(opened.body, B), opened, T0)
    assert isinstance(a.open(answer, T0), Opened)


def test_a_reply_is_bound_to_its_request() -> None:
    a, b, c = guards()
    key = datagram_key(SECRET)
    first = request("ping", A)
    asked = b.open(a.request(first, B, T0), T0)
    assert isinstance(asked, Opened)
    # a reply with that RPC id but another nonce than the request's (a captured reply of
    # another exchange, re-sealed by a member): unsolicited
    wrong_nonce = seal(key, B, A, reply_to(first, B), now=T0, reply_to=secrets.token_bytes(12))
    assert a.open(wrong_nonce, T0) is Refusal.UNSOLICITED
    # the right binding but from a node that was not asked
    from_c = seal(key, C, A, reply_to(first, C), now=T0, reply_to=asked.nonce)
    assert a.open(from_c, T0) is Refusal.UNSOLICITED
    # after the request timed out, its reply is unsolicited too
    a.forget(first[1:21], T0 + 5)
    assert a.open(b.reply(reply_to(first, B), asked, T0), T0) is Refusal.UNSOLICITED
    # a request claiming to answer something
    bogus = seal(key, B, A, request("ping", B), now=T0, reply_to=asked.nonce)
    assert a.open(bogus, T0) is Refusal.MALFORMED
    assert a.refused[Refusal.UNSOLICITED] == 3
    assert c.pending() == 0


@pytest.mark.parametrize("limit", [2, 5])
def test_pending_requests_are_bounded(limit: int) -> None:
    a = DatagramGuard(datagram_key(SECRET), A, limit=limit, since=0)
    for _ in range(limit + 3):
        a.request(request("ping", A), B, T0)
    assert a.pending() == limit
    a.forget(b"none", T0 + WINDOW + 1)  # the ones older than the window go
    assert a.pending() == 0


def test_nothing_stamped_before_a_checker_started_is_accepted() -> None:
    """The nonces seen by a node's previous life are gone: what was captured before its
    restart is stale to the new one, even inside the window."""
    client = f"$cluster/{A.hex()}"
    token = make_token(SECRET, client, B.hex(), now=T0)
    restarted = TokenChecker(SECRET, B.hex(), since=T0 + 5)
    assert restarted.check(client, token, T0 + 6) == "cluster token outside the clock window (clocks apart?)"
    assert restarted.check(client, make_token(SECRET, client, B.hex(), now=T0 + 6), T0 + 6) is None
    a = DatagramGuard(datagram_key(SECRET), A, since=0)
    sealed = a.request(request("ping", A), B, T0)
    assert DatagramGuard(datagram_key(SECRET), B, since=T0 + 5).open(sealed, T0 + 6) is Refusal.STALE
