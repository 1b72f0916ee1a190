"""A real Debian mosquitto as the remote of outbound bridges, and a paho subscriber on it.

mosquitto cannot bind port 0: :func:`free_port` picks a free loopback port and the
configuration names it.  :class:`Mosquitto` runs with persistence in its own directory, so
that a persistent subscriber's session and queue survive its restart (``stop`` sends
SIGTERM: mosquitto writes its database on the way out; ``user`` is the test's own, or
mosquitto started as root would switch to the user mosquitto, who cannot write the test's
directory).  :class:`Collector` is a paho client with a persistent session that records
every (topic, payload, retain) it receives, reconnecting by itself when mosquitto is back.
:func:`central` is the bridge the tests configure ("central", one loopback URL, a fast
back-off); :func:`down_remote` a remote with a collector's session on it, stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from tests.mosquitto import MOSQUITTO, free_port
from uplink import BridgeConfig, TopicRule

__all__ = [
    "MOSQUITTO",
    "Collector",
    "Cutter",
    "Mosquitto",
    "central",
    "down_remote",
    "free_port",
    "refusing_port",
]


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port where nothing listens, for as long as the ``with`` lasts: a socket is
    bound to it and kept open without ``listen``, so a connection to it is refused at once
    and no other socket (another test's listener, an outgoing connection's ephemeral port)
    can take the port meanwhile.  :func:`free_port` closes its socket: the port it returns
    is free only at that instant, and anything may listen there by the time a bridge
    connects (then the "unreachable" remote answers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def central(port: int, *rules: TopicRule, **fields: Any) -> BridgeConfig:
    """The bridge "central" to ``mqtt://127.0.0.1:<port>`` with ``rules``, reconnecting after
    0.05-0.2 s; ``fields``: any other :class:`uplink.BridgeConfig` field (or these two)."""
    return BridgeConfig(
        name="central",
        urls=(f"mqtt://127.0.0.1:{port}",),
        topics=rules,
        **{"backoff_min": 0.05, "backoff_max": 0.2, **fields},
    )


class Mosquitto:
    def __init__(self, tmp: Path, port: int | None = None, extra: str = "") -> None:
        self.dir = tmp
        self.port = port or free_port()
        self.conf = tmp / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
            f"persistence_location {tmp}/\nlog_dest file {tmp}/mosquitto.log\n"
            f"max_queued_messages 100000\nuser {getpass.getuser()}\n{extra}"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert MOSQUITTO is not None
        self.proc = subprocess.Popen(
            [MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        raise AssertionError(f"mosquitto did not listen on {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


class Collector:
    """A persistent QoS 1 (or ``qos``) subscriber at ``port`` recording what it receives
    (thread-safe)."""

    def __init__(
        self, port: int, topic_filter: str, client_id: str = "collector", v5: bool = True, qos: int = 1
    ) -> None:
        self.got: list[tuple[str, bytes, bool]] = []
        self.lock = threading.Lock()
        proto = paho.MQTTv5 if v5 else paho.MQTTv311
        self.c = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=None if v5 else False,
            protocol=proto,
        )
        self.c.reconnect_delay_set(1, 1)
        self.filter = topic_filter
        self.c.on_message = self._on_message
        self.c.on_connect = lambda c, *_: c.subscribe(self.filter, qos)
        self.subscribed = threading.Event()
        self.c.on_subscribe = lambda *_: self.subscribed.set()
        self.port = port
        self.v5 = v5

    def _on_message(self, _c: object, _u: object, msg: paho.MQTTMessage) -> None:
        with self.lock:
            self.got.append((msg.topic, bytes(msg.payload), bool(msg.retain)))

    def start(self) -> None:
        if self.v5:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = 3600
            self.c.connect("127.0.0.1", self.port, 30, clean_start=False, properties=props)
        else:
            self.c.connect("127.0.0.1", self.port, 30)
        self.c.loop_start()
        assert self.subscribed.wait(10), "no SUBACK"

    def stop(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()

    def messages(self) -> list[tuple[str, bytes, bool]]:
        with self.lock:
            return list(self.got)


class Cutter:
    """A loopback TCP relay (port 0) in front of a remote: :meth:`cut` drops every
    connection through it, as a network fault would, while the remote itself keeps running
    (its sessions and their QoS 2 state untouched)."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        self._writers += [writer, up_writer]

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        for w in self._writers:
            w.transport.abort()
        self._writers.clear()

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()


def down_remote(tmp: Path, qos: int = 1) -> tuple[Mosquitto, Collector]:
    """A mosquitto in ``tmp`` on which a 3.1.1 collector of ``central/#`` (``qos``) has its
    persistent session, then stopped: a bridge starts against a remote that is down, and
    what it forwards later reaches the collector (started again with the remote)."""
    remote = Mosquitto(tmp)
    remote.start()
    collector = Collector(remote.port, "central/#", v5=False, qos=qos)
    collector.start()
    remote.stop()
    return remote, collector
