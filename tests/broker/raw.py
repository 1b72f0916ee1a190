"""A raw packet-level MQTT client for the broker tests.

``RawClient`` speaks MQTT through our own codec over an asyncio stream, so tests can send
exactly the packets a rule is about (and malformed bytes) and see exactly what comes back.
"""

from __future__ import annotations

import asyncio
import contextlib

from broker.packets import Connect, Decoder, Packet, encode

__all__ = ["TIMEOUT", "RawClient"]

TIMEOUT = 5.0


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, version: int) -> None:
        self.reader = reader
        self.writer = writer
        self.version = version
        self.decoder = Decoder(version, server=False)
        self.pending: list[Packet] = []

    @classmethod
    async def open(cls, port: int, version: int = 5) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, version)

    @classmethod
    async def connect(
        cls, port: int, client_id: str, version: int = 5, **kw: object
    ) -> tuple[RawClient, Packet]:
        c = await cls.open(port, version)
        c.send(Connect(client_id, protocol_level=version, **kw))  # type: ignore[arg-type]
        ack = await c.recv()
        return c, ack

    def send(self, packet: Packet) -> None:
        self.writer.write(encode(packet, self.version))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def recv(self, timeout: float = TIMEOUT) -> Packet:
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise ConnectionError("closed by the broker")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    async def closed(self, timeout: float = TIMEOUT) -> list[Packet]:
        """Read until the broker closes the connection; returns what came before."""
        got = list(self.pending)
        self.pending.clear()
        while True:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                self.writer.close()
                return got
            got.extend(self.decoder.feed(data))

    async def aclose(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
