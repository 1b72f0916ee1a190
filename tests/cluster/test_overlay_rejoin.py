"""A member that stopped answering comes back at its first answer (issue 30; cluster._overlay):
two real Kademlia overlays on loopback UDP.  B stops (its socket closes); A's refresh finds it
silent and drops it from the routing table, keeping it among the lost nodes; B starts again
on its port; A's probes of lost nodes reach it, and A re-admits it and says so
(``on_member``) without any refresh: before, only the next refresh's lookups found it, after
waiting out the failure timeout for every seed still unreachable."""

from __future__ import annotations

import asyncio
import secrets
import socket

from cluster._overlay import Overlay
from tests.waiting import eventually

SECRET = b"overlay-test-secret"


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_lost_member_is_probed_and_readmitted_at_its_first_answer() -> None:
    a_id, b_id = secrets.token_bytes(20), secrets.token_bytes(20)
    a = Overlay(a_id, SECRET, rpc_timeout=0.3, probe_every=0.05)
    b = Overlay(b_id, SECRET, rpc_timeout=0.3, probe_every=0.05)
    port_a, port_b = _free_udp_port(), _free_udp_port()
    joined: list[bytes] = []
    a.on_member = joined.append
    await a.start("127.0.0.1", port_a, [])
    try:
        await b.start("127.0.0.1", port_b, [("127.0.0.1", port_a)])
        await eventually(lambda: b_id in a.members())
        assert joined == [b_id]
        b.stop()
        await a.refresh()  # B's ping goes unanswered: dropped, and lost
        assert b_id not in a.members()
        assert b_id in a.lost
        b = Overlay(b_id, SECRET, rpc_timeout=0.3, probe_every=0.05)
        await b.start("127.0.0.1", port_b, [])  # back, knowing nobody: only A's probes find it
        await eventually(lambda: b_id in a.members())
        assert joined == [b_id, b_id]
        assert b_id not in a.lost
    finally:
        a.stop()
        b.stop()
        await asyncio.sleep(0)  # the cancelled probe loops end


async def test_a_member_back_by_its_own_request_is_dropped_again_when_silent() -> None:
    """B comes back by contacting A (not through A's probes, which are slow here); when B goes
    silent again, A's next refresh drops it again (a member must not stay in the table because
    it was once lost)."""
    a_id, b_id = secrets.token_bytes(20), secrets.token_bytes(20)
    a = Overlay(a_id, SECRET, rpc_timeout=0.3, probe_every=3600)
    port_a, port_b = _free_udp_port(), _free_udp_port()
    await a.start("127.0.0.1", port_a, [])
    b = Overlay(b_id, SECRET, rpc_timeout=0.3)
    try:
        await b.start("127.0.0.1", port_b, [("127.0.0.1", port_a)])
        await eventually(lambda: b_id in a.members())
        b.stop()
        await a.refresh()
        assert b_id not in a.members() and b_id in a.lost
        b = Overlay(b_id, SECRET, rpc_timeout=0.3)
        await b.start("127.0.0.1", port_b, [("127.0.0.1", port_a)])  # B's bootstrap asks A
        await eventually(lambda: b_id in a.members())
        assert b_id not in a.lost
        b.stop()
        await a.refresh()
        assert b_id not in a.members()
    finally:
        a.stop()
        b.stop()
        await asyncio.sleep(0)
