"""A raw MQTT client built on broker.packets, for exact-byte and malformed-input conformance tests.

``recv`` waits for the next packet with a timeout; ``barrier`` sends PINGREQ and returns every
packet that arrived before the PINGRESP (the broker handles a connection's packets in order, so a
message that was going to be delivered for earlier input shows up before the PINGRESP).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, ClassVar

from broker.packets import (
    Connack,
    Connect,
    Decoder,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    encode,
)

__all__ = ["TIMEOUT", "RawClient"]

TIMEOUT = 5.0


class RawClient:
    instances: ClassVar[list[RawClient]] = []  # see close_all (conftest fixtures call it after tests)

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, version: int) -> None:
        self.reader = reader
        self.writer = writer
        self.version = version
        self.decoder = Decoder(version, server=False)
        self.pending: list[Packet] = []
        self.next_id = 1
        self.loop = asyncio.get_running_loop()
        RawClient.instances.append(self)

    @classmethod
    async def close_all(cls) -> None:
        """Close every client opened on the running loop; forget the others (their loop, and
        with it their transport, is gone: a test that did not close its clients must not break
        the next test's teardown)."""
        loop = asyncio.get_running_loop()
        while cls.instances:
            c = cls.instances.pop()
            if c.loop is loop:
                await c.close()

    @classmethod
    async def open(cls, port: int, version: int = 5) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, version)

    @classmethod
    async def connect(
        cls, port: int, client_id: str, version: int = 5, **kw: Any
    ) -> tuple[RawClient, Connack]:
        c = await cls.open(port, version)
        c.send(Connect(client_id, protocol_level=version, **kw))
        ack = await c.recv()
        assert isinstance(ack, Connack), ack
        return c, ack

    def pid(self) -> int:
        p = self.next_id
        self.next_id = p % 65535 + 1
        return p

    def send(self, p: Packet) -> None:
        self.writer.write(encode(p, self.version))

    def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)

    async def recv(self, timeout: float = TIMEOUT) -> Packet:
        """The next packet; fails the test on timeout or when the connection closes first."""
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise ConnectionError("closed by the broker")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    async def recv_where(self, pred: Any, timeout: float = TIMEOUT) -> Packet:
        """The first packet satisfying ``pred``; the others stay queued, in order, for ``recv``."""
        skipped: list[Packet] = []
        try:
            while True:
                p = await self.recv(timeout)
                if pred(p):
                    return p
                skipped.append(p)
        finally:
            self.pending[:0] = skipped

    async def closed(self, timeout: float = TIMEOUT) -> list[Packet]:
        """Wait until the broker closes the connection; return the packets that came before."""
        got = list(self.pending)
        self.pending.clear()
        while True:
            try:
                data = await asyncio.wait_for(self.reader.read(65536), timeout)
            except ConnectionResetError:
                data = b""
            if not data:
                self.writer.close()
                return got
            got.extend(self.decoder.feed(data))

    async def barrier(self) -> list[Packet]:
        self.send(Pingreq())
        got: list[Packet] = []
        while True:
            p = await self.recv()
            if isinstance(p, Pingresp):
                return got
            got.append(p)

    async def subscribe(self, *subs: SubscriptionRequest | str, **kw: Any) -> Suback:
        reqs = tuple(SubscriptionRequest(s, 1) if isinstance(s, str) else s for s in subs)
        pid = self.pid()
        self.send(Subscribe(pid, reqs, **kw))
        ack = await self.recv_where(lambda p: isinstance(p, Suback))
        assert isinstance(ack, Suback) and ack.packet_id == pid, ack
        return ack

    async def unsubscribe(self, *filters: str) -> Unsuback:
        pid = self.pid()
        self.send(Unsubscribe(pid, filters))
        ack = await self.recv_where(lambda p: isinstance(p, Unsuback))
        assert isinstance(ack, Unsuback) and ack.packet_id == pid, ack
        return ack

    async def publish1(self, topic: str, payload: bytes = b"", **kw: Any) -> Puback:
        pid = self.pid()
        self.send(Publish(topic, payload, 1, packet_id=pid, **kw))
        ack = await self.recv_where(lambda p: isinstance(p, Puback))
        assert isinstance(ack, Puback) and ack.packet_id == pid, ack
        return ack

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
