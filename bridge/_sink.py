"""Rows to MQTT messages: the publishing half of the ``siftmq`` Spark data source (issue 29).

Runs in Spark's Python workers (executors); no pyspark import except ``TaskContext``.  One MQTT 5
connection per task, made and closed by paho-mqtt; the task's PUBLISH packets are encoded
and its acknowledgements decoded in bulk with the broker's sans-IO codec (``broker.packets``)
on paho's socket, a chunk of packets per ``send`` (:class:`_Flight`).

**Options** (:meth:`SinkOptions.parse`, checked on the driver when the query starts, so a
wrong option fails the query before any row is published): ``url`` (``mqtt://HOST:PORT``,
``mqtts://`` for TLS; required), ``topic`` (a template: ``{column}`` is replaced by the row's
value, ``{{``/``}}`` are braces; required), ``payload`` (a column: binary as is, string as
UTF-8, anything else as JSON; default: the row as a JSON object), ``qos`` (0/1/2, default 1),
``retain`` (default false), ``username``, ``password``, ``properties`` (comma-separated columns
sent as MQTT 5 user properties, name = column; a null value is not sent), ``expiry`` (MQTT 5
message expiry interval, seconds), ``tls_ca``/``tls_cert``/``tls_key`` (PEM files; the
system's CAs when ``tls_ca`` is absent), ``tls_insecure`` (do not check the host name),
``client_id`` (prefix of the connection's client id, default ``siftmq-sink``), ``timeout``
(seconds without progress before a task gives up, default 30), ``max_inflight`` (QoS 1/2
messages awaiting their acknowledgement, default 1000; the broker's receive maximum caps it).

**Idempotency key.**  Every message carries the MQTT 5 user property ``siftmq-key`` =
``<query id>/<batch id>/<partition>/<row>``: the streaming query's id (kept in its checkpoint,
the same after a restart; a batch write has a fresh id per write), the micro-batch id (0 for
a batch write), the task's partition and the row's number in it.  So that a re-run numbers the
same rows the same way whatever order Spark hands them over in (a shuffle does not guarantee
one), a task first builds all its messages and sorts them by (topic, payload, user
properties), then numbers them; identical messages are interchangeable.  A subscriber drops a
message whose key it has seen (or all of a batch it has completed).

**Delivery: at least once** (QoS 1/2; QoS 0 is at most once).  A task connects, checks every
row (topic, payload size against the broker's maximum packet size from its CONNACK), publishes,
and returns only when the broker has acknowledged every message; then Spark commits the batch.
A task that fails (invalid row, broker down, credentials refused, connection lost, no
acknowledgement within ``timeout``) raises :class:`SinkError` naming the row or the option:
Spark retries the task (``spark.task.maxFailures``: 1 on ``local[N]``, 4 on a cluster), and
when the retries are used up the streaming query fails with that error and its checkpoint has
the batch in its offset log but not in its commit log; started again it re-runs that batch and
re-publishes it, with the same keys.  A row whose topic or payload is invalid fails its task
before any of that task's rows is published.  What a subscriber sees when an executor or the
driver dies mid-batch is in docs/bridge.md ("Writing to MQTT from Spark").
"""

from __future__ import annotations

import contextlib
import json
import string
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa

__all__ = ["KEY_PROPERTY", "SinkError", "SinkOptions", "publish_batches"]

KEY_PROPERTY = "siftmq-key"

_MAX_TOPIC_BYTES = 65_535


class SinkError(RuntimeError):
    """A row or an option the sink cannot publish, or a broker that does not take it."""


def _bool(options: dict[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise SinkError(f"siftmq sink: option {name}={value!r} is not a boolean (true/false)")


def _number(options: dict[str, str], name: str, default: float | None, lo: float, hi: float) -> float | None:
    value = options.get(name)
    if value is None:
        return default
    try:
        n = float(value)
    except ValueError:
        raise SinkError(f"siftmq sink: option {name}={value!r} is not a number") from None
    if not lo <= n <= hi:
        raise SinkError(f"siftmq sink: option {name}={value!r} is out of range [{lo:g}, {hi:g}]")
    return n


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """The sink's options, checked against the DataFrame's columns (module docstring)."""

    url: str
    host: str
    port: int
    tls: bool
    topic: str
    topic_parts: tuple[tuple[str, str | None], ...]  # (literal, column or None)
    columns: tuple[str, ...]
    payload: str | None
    qos: int
    retain: bool
    username: str | None
    password: str | None
    properties: tuple[str, ...]
    expiry: int | None
    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None
    tls_insecure: bool
    client_id: str
    timeout: float
    max_inflight: int

    @staticmethod
    def parse(raw: dict[str, str], columns: Sequence[str]) -> SinkOptions:
        o = {k.lower(): v for k, v in raw.items()}
        cols = tuple(columns)
        url = o.get("url")
        if not url:
            raise SinkError("siftmq sink: option 'url' is required (mqtt://HOST:PORT or mqtts://HOST:PORT)")
        parts = urlsplit(url)
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise SinkError(f"siftmq sink: option url={url!r} must be mqtt://HOST:PORT or mqtts://HOST:PORT")
        try:
            port = parts.port or (8883 if parts.scheme == "mqtts" else 1883)
        except ValueError:
            raise SinkError(f"siftmq sink: option url={url!r} has an invalid port") from None
        template = o.get("topic")
        if not template:
            raise SinkError("siftmq sink: option 'topic' is required (a template such as alerts/{device})")
        topic_parts: list[tuple[str, str | None]] = []
        try:
            for literal, field, spec, conv in string.Formatter().parse(template):
                if field is not None and (spec or conv or field == "" or field not in cols):
                    raise SinkError(
                        f"siftmq sink: option topic={template!r}: {{{field}}} is not a column "
                        f"(columns: {', '.join(cols)})"
                    )
                if any(c in literal for c in "+#\x00"):
                    raise SinkError(
                        f"siftmq sink: option topic={template!r}: a topic name cannot contain '+', '#' or NUL"
                    )
                topic_parts.append((literal, field))
        except ValueError as e:
            raise SinkError(f"siftmq sink: option topic={template!r}: {e}") from None
        payload = o.get("payload")
        if payload is not None and payload not in cols:
            raise SinkError(
                f"siftmq sink: option payload={payload!r} is not a column (columns: {', '.join(cols)})"
            )
        props = tuple(p.strip() for p in o.get("properties", "").split(",") if p.strip())
        for p in props:
            if p not in cols:
                raise SinkError(
                    f"siftmq sink: option properties: {p!r} is not a column (columns: {', '.join(cols)})"
                )
        qos = o.get("qos", "1")
        if qos not in ("0", "1", "2"):
            raise SinkError(f"siftmq sink: option qos={qos!r} must be 0, 1 or 2")
        username = o.get("username")
        password = o.get("password")
        if password is not None and username is None:
            raise SinkError("siftmq sink: option 'password' needs option 'username'")
        expiry = _number(o, "expiry", None, 0, 2**32 - 1)
        timeout = _number(o, "timeout", 30.0, 0.1, 86_400.0)
        inflight = _number(o, "max_inflight", 1000, 1, 65_535)
        assert timeout is not None and inflight is not None
        return SinkOptions(
            url=url,
            host=parts.hostname,
            port=port,
            tls=parts.scheme == "mqtts",
            topic=template,
            topic_parts=tuple(topic_parts),
            columns=cols,
            payload=payload,
            qos=int(qos),
            retain=_bool(o, "retain", False),
            username=username,
            password=password,
            properties=props,
            expiry=None if expiry is None else int(expiry),
            tls_ca=o.get("tls_ca"),
            tls_cert=o.get("tls_cert"),
            tls_key=o.get("tls_key"),
            tls_insecure=_bool(o, "tls_insecure", False),
            client_id=o.get("client_id", "siftmq-sink"),
            timeout=timeout,
            max_inflight=int(inflight),
        )


def _json_default(v: Any) -> Any:
    if isinstance(v, datetime | date):
        return v.isoformat()
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, bytes | bytearray):
        return v.decode("utf-8", "replace")
    raise TypeError(f"{type(v).__name__} is not JSON serialisable")


def _text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, datetime | date):
        return v.isoformat()
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return json.dumps(v, default=_json_default)


def _topic_error(topic: str) -> str | None:
    if not topic:
        return "the topic is empty"
    if "+" in topic or "#" in topic:
        return "a topic name cannot contain the wildcards '+' or '#'"
    if "\x00" in topic:
        return "a topic name cannot contain NUL"
    if len(topic.encode("utf-8", "surrogatepass")) > _MAX_TOPIC_BYTES:
        return f"the topic is longer than {_MAX_TOPIC_BYTES} bytes"
    return None


_Message = tuple[str, bytes, tuple[tuple[str, str], ...]]


def _messages(o: SinkOptions, batches: Iterator[pa.RecordBatch], where: str) -> list[_Message]:
    """Every row of the task as (topic, payload, user properties), checked (module docstring)."""
    out: list[_Message] = []
    used = {c for _, c in o.topic_parts if c is not None} | set(o.properties)
    if o.payload is not None:
        used.add(o.payload)
    row = 0
    for batch in batches:
        n = batch.num_rows
        cols = {c: batch.column(c).to_pylist() for c in used}
        whole = batch.to_pylist() if o.payload is None else None
        for i in range(n):
            topic_chunks = []
            for literal, col in o.topic_parts:
                topic_chunks.append(literal)
                if col is not None:
                    v = cols[col][i]
                    if v is None:
                        raise SinkError(
                            f"siftmq sink: row {row + i} ({where}): column {col!r} of option "
                            f"topic={o.topic!r} is null"
                        )
                    topic_chunks.append(_text(v))
            topic = "".join(topic_chunks)
            problem = _topic_error(topic)
            if problem is not None:
                raise SinkError(
                    f"siftmq sink: row {row + i} ({where}): option topic={o.topic!r} gave "
                    f"{topic[:200]!r}: {problem}"
                )
            if whole is not None:
                payload = json.dumps(whole[i], default=_json_default, separators=(",", ":")).encode()
            else:
                assert o.payload is not None
                v = cols[o.payload][i]
                if v is None:
                    raise SinkError(
                        f"siftmq sink: row {row + i} ({where}): payload column {o.payload!r} is null"
                    )
                payload = v if isinstance(v, bytes) else _text(v).encode()
            props = tuple((p, _text(cols[p][i])) for p in o.properties if cols[p][i] is not None)
            out.append((topic, payload, props))
        row += n
    return out


_CONNACK_HINTS = {
    134: "the broker refused the credentials (options username/password)",
    135: "the broker refused the connection: not authorized (options username/password, client_id)",
    4: "the broker refused the credentials (options username/password)",
    5: "the broker refused the connection: not authorized (options username/password)",
}


class _Flight:
    """Sans-IO: a task's messages as PUBLISH packets through a window of unacknowledged ones.

    :meth:`next_chunk` encodes the next messages the window admits (at most ``CHUNK`` of them
    and about ``CHUNK_BYTES``, with the PUBRELs due) as one ``bytes``; :meth:`feed` takes
    bytes from the broker and counts the acknowledgements (QoS 1: PUBACK; QoS 2: PUBREC
    answered with PUBREL, then PUBCOMP; QoS 0: a message counts once written).  Packet ids
    cycle through 1..65,535, skipping ones in flight (the window is at most 65,535).  An
    error reason code is a failure naming the row."""

    CHUNK = 256
    CHUNK_BYTES = 1 << 20

    def __init__(self, o: SinkOptions, messages: list[_Message], key_prefix: str, window: int) -> None:
        from broker.packets import Decoder

        self.o, self.messages, self.key_prefix = o, messages, key_prefix
        self.window = window if o.qos > 0 else len(messages)
        self.inflight: dict[int, int] = {}  # packet id -> row
        self.decoder = Decoder(version=5, server=False)
        self.pending_rel: list[bytes] = []
        self.sent = 0
        self.acked = 0
        self.next_pid = 1
        self.failures: list[tuple[int, str]] = []
        self.lost: str | None = None

    def finished(self) -> bool:
        return self.acked >= len(self.messages) or bool(self.failures) or self.lost is not None

    def more_to_send(self) -> bool:
        return self.sent < len(self.messages) and len(self.inflight) < self.window

    def next_chunk(self) -> bytes:
        from broker.packets import Properties, encode_publish

        o, messages, qos, inflight = self.o, self.messages, self.o.qos, self.inflight
        parts = self.pending_rel
        self.pending_rel = []
        stop = min(len(messages), self.sent + min(self.window - len(inflight), self.CHUNK))
        size = 0
        for i in range(self.sent, stop):
            if size > self.CHUNK_BYTES:
                stop = i  # large payloads: the rest in the next chunk
                break
            topic, payload, props = messages[i]
            pid = None
            if qos:
                while self.next_pid in inflight:  # a window <= 65,535 always leaves a free id
                    self.next_pid = self.next_pid % 65_535 + 1
                pid = self.next_pid
                self.next_pid = pid % 65_535 + 1
                inflight[pid] = i
            user = ((KEY_PROPERTY, f"{self.key_prefix}/{i}"), *props)
            properties = Properties(message_expiry_interval=o.expiry, user_properties=user)
            parts.append(encode_publish(topic, payload, qos, o.retain, False, pid, properties, 5))
            size += len(parts[-1])
        self.sent = max(self.sent, stop)
        if qos == 0:
            self.acked = self.sent
        return b"".join(parts)

    def feed(self, data: bytes) -> None:
        from broker.packets import Disconnect, Puback, Pubcomp, Pubrec, Pubrel, encode

        for pkt in self.decoder.feed(data):
            if isinstance(pkt, Pubrec) and pkt.reason_code < 0x80:
                self.pending_rel.append(encode(Pubrel(pkt.packet_id), 5))
            elif isinstance(pkt, Puback | Pubcomp | Pubrec):
                row = self.inflight.pop(pkt.packet_id, -1)
                if row < 0:
                    continue  # not in flight: nothing else is expected on this connection
                self.acked += 1
                if pkt.reason_code >= 0x80:
                    self.failures.append((row, pkt.reason_code.name))
            elif isinstance(pkt, Disconnect):
                self.lost = f"the broker disconnected: {pkt.reason_code.name}"


class _Publisher:
    """One paho-mqtt MQTT 5 connection that publishes a task's messages and waits for acks.

    Driven from the task's thread (no paho loop thread).  paho connects (TLS, credentials,
    the CONNACK's maximum packet size and receive maximum) and disconnects; :meth:`publish`
    writes the PUBLISH packets to paho's socket itself, encoded with the broker's codec
    (:class:`_Flight`).  The window of unacknowledged QoS 1/2 messages is the sink's
    (``max_inflight``, capped by the broker's receive maximum).  History: paho's own queue of
    messages beyond its in-flight limit was scanned on every acknowledgement (50,000 queued
    rows took 30 s), and its per-message path cost 50 us of CPU per row; both gone."""

    def __init__(self, o: SinkOptions, client_id: str) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.o = o
        self._connack: Any = None
        self._max_packet: int | None = None
        self._window = o.max_inflight
        self._lost: str | None = None
        self._acked = 0
        self._failures: list[tuple[int, str]] = []
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        if o.username is not None:
            c.username_pw_set(o.username, o.password)
        if o.tls:
            c.tls_set(ca_certs=o.tls_ca, certfile=o.tls_cert, keyfile=o.tls_key)
            if o.tls_insecure:
                c.tls_insecure_set(True)
        c.max_inflight_messages_set(0)  # no limit in paho: the window is ours
        c.max_queued_messages_set(0)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        self.client = c
        try:
            c.connect(o.host, o.port, keepalive=60, clean_start=True)
        except Exception as e:
            raise SinkError(f"siftmq sink: cannot connect to {o.url} (option url): {e}") from None
        if not self._loop_until(lambda: self._connack is not None):
            self.close()
            why = self._lost or f"no CONNACK within {o.timeout:g} s (option timeout)"
            raise SinkError(f"siftmq sink: cannot connect to {o.url} (option url): {why}")
        rc: Any = self._connack
        if rc.is_failure:
            self.close()
            hint = _CONNACK_HINTS.get(int(rc.value), "the broker refused the connection")
            raise SinkError(f"siftmq sink: {hint}: {rc} ({o.url})")

    def _loop_until(self, done: Callable[[], bool]) -> bool:
        """Run the client's loop until ``done()``, the connection is lost, or ``timeout``
        seconds pass without an acknowledgement; True if ``done()``."""
        progress, deadline = self._acked, time.monotonic() + self.o.timeout
        while not done():
            if self._lost is not None:
                return False
            rc = self.client.loop(timeout=0.05)
            if rc != 0 and self._lost is None:
                self._lost = f"connection lost: {rc}"
            if self._acked > progress:
                progress, deadline = self._acked, time.monotonic() + self.o.timeout
            elif time.monotonic() >= deadline:
                return False
        return True

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        self._connack = rc
        size = getattr(props, "MaximumPacketSize", None) if props is not None else None
        self._max_packet = int(size) if size else None
        receive_max = getattr(props, "ReceiveMaximum", None) if props is not None else None
        if receive_max:
            self._window = min(self._window, int(receive_max))

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        if self._lost is None:
            self._lost = f"connection lost: {rc}"

    def check_sizes(self, messages: list[_Message], key_len: int, where: str) -> None:
        """Refuse a message larger than the broker's maximum packet size (from its CONNACK)."""
        limit = self._max_packet
        if limit is None:
            return
        fixed = 16 + key_len + len(KEY_PROPERTY) + (5 if self.o.expiry is not None else 0)
        for i, (topic, payload, props) in enumerate(messages):
            size = (
                fixed
                + len(topic.encode())
                + len(payload)
                + sum(5 + len(k) + len(v.encode()) for k, v in props)
            )
            if size > limit:
                raise SinkError(
                    f"siftmq sink: row {i} of the sorted rows ({where}, topic {topic!r}): a message of "
                    f"{size} bytes (payload {len(payload)}) exceeds the broker's maximum packet size "
                    f"of {limit} bytes"
                )

    def publish(self, messages: list[_Message], key_prefix: str) -> None:
        """Publish ``messages`` (numbered from 0 under ``key_prefix``) and wait for every
        acknowledgement.

        paho-mqtt made the connection (CONNECT/CONNACK, TLS, credentials) and closes it; the
        messages themselves are written to its socket (``Client.socket()``) in chunks of
        PUBLISH packets and the acknowledgements read back in bulk, both through
        :class:`_Flight` and the broker's compiled sans-IO codec: paho's per-message path (a
        ``MQTTMessage``, two ``send`` calls, a ``ReasonCode`` and a ``Properties`` per PUBACK)
        cost about 35 us per row, most of a task's CPU (docs/lab/performance-bridge.md)."""
        import select

        from broker.packets import MalformedPacket

        o, n = self.o, len(messages)
        sock: Any = self.client.socket()
        if sock is None:
            self._raise(self._lost or "connection lost before publishing", n)
        flight = _Flight(o, messages, key_prefix, self._window)
        sock.settimeout(o.timeout)  # blocking with a timeout: a recv that times out is "no progress"
        try:
            while not flight.finished():
                out = flight.next_chunk()
                if out:
                    sock.sendall(out)
                    if flight.more_to_send() and not (
                        (o.tls and sock.pending()) or select.select([sock], [], [], 0)[0]
                    ):
                        continue  # no acknowledgement waiting: keep filling the window
                if flight.finished():
                    break
                data = sock.recv(1 << 16)
                if not data:
                    flight.lost = "connection lost: closed by the broker"
                    break
                flight.feed(data)
        except TimeoutError:
            pass  # reported below: no acknowledgement within the timeout
        except MalformedPacket as e:
            flight.lost = f"a malformed packet from the broker: {e}"
        except OSError as e:
            flight.lost = f"connection lost: {e}"
        finally:
            with contextlib.suppress(OSError):
                sock.setblocking(False)  # as paho keeps it, for its DISCONNECT
        self._acked = flight.acked
        if flight.failures:
            row, why = flight.failures[0]
            self._raise(f"the broker refused row {row} of the sorted rows: {why}", n)
        if flight.acked < n:
            self._raise(flight.lost or f"no acknowledgement for {o.timeout:g} s (option timeout)", n)

    def _raise(self, why: str, n: int) -> None:
        raise SinkError(
            f"siftmq sink: {why} ({self.o.url}; {self._acked} of {n} messages of this task acknowledged; "
            "a re-run publishes them again with the same keys)"
        )

    def close(self) -> None:
        try:
            self.client.disconnect()
            self.client.loop(timeout=0.01)
        except Exception:  # the connection may be gone already: nothing left to release
            pass


def publish_batches(
    o: SinkOptions, batches: Iterator[pa.RecordBatch], *, query_id: str | None, batch_id: int | None
) -> tuple[int, int]:
    """Publish one task's rows; returns (partition, rows).  ``query_id``/``batch_id`` None: the
    streaming query's, from the task's local properties."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    attempt = ctx.attemptNumber() if ctx is not None else 0
    if query_id is None:
        query_id = (ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None) or "-"
    if batch_id is None:
        raw = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        batch_id = int(raw) if raw else 0
    where = f"query {query_id}, batch {batch_id}, partition {partition}"
    messages = _messages(o, batches, where)
    if not messages:
        return partition, 0
    messages.sort()
    key_prefix = f"{query_id}/{batch_id}/{partition}"
    client_id = f"{o.client_id}-{query_id[:8]}-{batch_id}-{partition}-{attempt}"
    pub = _Publisher(o, client_id)
    try:
        pub.check_sizes(messages, len(key_prefix) + 8, where)
        pub.publish(messages, key_prefix)
    finally:
        pub.close()
    return partition, len(messages)
