"""The ``siftmq`` data source without Spark: landing-zone offsets, and the MQTT publisher of the
sink against a real broker with real paho-mqtt subscribers (errors naming the row or option)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pyarrow as pa
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from bridge import Bridge, Kind
from bridge._landing import LandingFile, files_between, latest_offset, list_files, pack, read_files
from bridge._sink import KEY_PROPERTY, SinkError, SinkOptions, publish_batches
from broker import Broker
from broker.hooks import Hooks
from broker.hooks import SubscriptionAction as A
from tests.bridge.records import change, delivery, feed
from tests.waiting import eventually


def _commit(landing: Path, n: int, start: int = 0) -> None:
    with Bridge(landing) as b:
        for i in range(start, start + n):
            feed(b, delivery(i, 1.8e9 + i))


def test_offsets_select_each_file_once_across_writers(tmp_path: Path) -> None:
    land = str(tmp_path / "l")
    _commit(tmp_path / "l", 3)  # writer 1: one file
    first = latest_offset([land], Kind.DELIVERIES)
    assert [len(v) for v in first.values()] == [1]
    (writer1,) = list_files(land, Kind.DELIVERIES)
    _commit(tmp_path / "l", 4, 3)  # writer 2
    (tmp_path / "l" / "deliveries" / "by-hand.parquet").write_bytes(Path(writer1.path).read_bytes())
    (tmp_path / "l" / "deliveries" / ".part-x.parquet.tmp").write_bytes(b"half")
    second = latest_offset([land], Kind.DELIVERIES)
    new = files_between([land], Kind.DELIVERIES, first, second)
    assert len(new) == 2 and {f.tag for f in new} == set(second[land]) - set(first[land])
    old = files_between([land], Kind.DELIVERIES, None, first)
    assert len(old) == 1 and not set(new) & set(old)
    rows = sum(b.num_rows for b in read_files([f.path for f in new], Kind.DELIVERIES))
    assert rows == 4 + 3  # writer 2's file and the hand-copied one (writer 1's rows again)
    assert files_between([land], Kind.DELIVERIES, second, second) == []
    # a streaming source's cache of known files: the same listing, new files found
    known: dict[str, Any] = {}
    assert latest_offset([land], Kind.DELIVERIES, known) == second and len(known) == 3
    _commit(tmp_path / "l", 2, 7)  # writer 3
    third = latest_offset([land], Kind.DELIVERIES, known)
    assert third == latest_offset([land], Kind.DELIVERIES) and len(known) == 4
    assert files_between([land], Kind.DELIVERIES, second, third, known) == files_between(
        [land], Kind.DELIVERIES, second, third
    )
    assert latest_offset([str(tmp_path / "missing")], Kind.DELIVERIES) == {str(tmp_path / "missing"): {}}


def test_pack_and_conform_missing_columns(tmp_path: Path) -> None:
    _commit(tmp_path / "l", 2)
    f = list_files(str(tmp_path / "l"), Kind.DELIVERIES)
    assert pack(f * 3, max_partition_bytes=1) == [[f[0].path]] * 3
    assert pack(f * 3) == [[f[0].path] * 3]
    # runs of about equal bytes, in order, a multiple of min_partitions: no straggler task
    files = [LandingFile("l", "t", i, f"p{i}", 250_000) for i in range(20)]
    assert pack(files) == [[f"p{i}" for i in range(10)], [f"p{i}" for i in range(10, 20)]]
    assert [len(p) for p in pack(files, max_partition_bytes=1 << 20)] == [3, 4, 3, 3, 4, 3]
    assert [len(p) for p in pack(files, min_partitions=3)] == [7, 6, 7]
    uneven = [LandingFile("l", "t", i, f"p{i}", s) for i, s in enumerate([9 << 20, 1, 1, 1, 5 << 20])]
    assert pack(uneven) == [["p0"], ["p1", "p2", "p3", "p4"]]
    assert pack(files[:3], min_partitions=8) == [["p0"], ["p1"], ["p2"]]  # one file is one task
    # a subscription_changes file from before its node column: read with node null
    import pyarrow.parquet as pq

    table = pa.table({"time": pa.array([1], pa.timestamp("us", tz="UTC")), "client_id": ["c"]})
    (tmp_path / "l" / "subscription_changes").mkdir(exist_ok=True)
    pq.write_table(table, tmp_path / "l" / "subscription_changes" / "old.parquet")
    (batch,) = read_files(
        [str(tmp_path / "l" / "subscription_changes" / "old.parquet")], Kind.SUBSCRIPTION_CHANGES
    )
    assert batch.column("node").to_pylist() == [None] and batch.column("client_id").to_pylist() == ["c"]


def test_subscription_changes_carry_the_node(tmp_path: Path) -> None:
    with Bridge(tmp_path) as b:
        b.on_subscription_change(change(1.8e9, "c1", A.SUBSCRIBE, "a/#", 1))
    (batch,) = read_files(
        [f.path for f in list_files(str(tmp_path), Kind.SUBSCRIPTION_CHANGES)], Kind.SUBSCRIPTION_CHANGES
    )
    assert batch.column("node").to_pylist() == [None]  # a broker alone; a cluster node's id otherwise


def test_options_are_checked_against_the_columns() -> None:
    cols = ["device", "z"]
    url = "mqtt://127.0.0.1:1883"
    cases = {
        (("topic", "a/{x}"),): "{x} is not a column",
        (("topic", "a/+/{device}"),): "cannot contain '+'",
        (("url", "http://h"),): "must be mqtt://HOST:PORT",
        (("qos", "3"),): "qos='3' must be 0, 1 or 2",
        (("payload", "nope"),): "payload='nope' is not a column",
        (("properties", "z,nope"),): "'nope' is not a column",
        (("retain", "maybe"),): "retain='maybe' is not a boolean",
        (("expiry", "-1"),): "expiry='-1' is out of range",
    }
    for extra, message in cases.items():
        opts = {"url": url, "topic": "alerts/{device}", **dict(extra)}
        with pytest.raises(
            SinkError, match=message.replace("+", r"\+").replace("{", r"\{").replace("}", r"\}")
        ):
            SinkOptions.parse(opts, cols)
    o = SinkOptions.parse({"URL": "mqtts://h", "Topic": "a/{device}/{{x}}"}, cols)
    assert (o.host, o.port, o.tls, o.qos, o.retain) == ("h", 8883, True, 1, False)
    assert [c for _, c in o.topic_parts if c] == ["device"] and "".join(
        lit for lit, _ in o.topic_parts
    ) == "a//{x}"


class _Collector:
    """A paho-mqtt subscriber that keeps every message (topic, payload, user properties)."""

    def __init__(self, port: int, topic: str) -> None:
        self.got: list[tuple[str, bytes, dict[str, str]]] = []
        self.lock = threading.Lock()
        self.subscribed = threading.Event()
        c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        c.on_message = self._on_message
        c.on_subscribe = lambda *a: self.subscribed.set()
        c.on_connect = lambda client, *a: client.subscribe(topic, qos=1)
        c.connect("127.0.0.1", port)
        c.loop_start()
        self.client = c

    def _on_message(self, client: Any, userdata: Any, m: Any) -> None:
        props = dict(getattr(m.properties, "UserProperty", []))
        expiry = getattr(m.properties, "MessageExpiryInterval", None)
        if expiry is not None:
            props["expiry"] = str(expiry)
        with self.lock:
            self.got.append((m.topic, m.payload, props))

    def count(self) -> int:
        with self.lock:
            return len(self.got)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _batches(n: int) -> Iterator[pa.RecordBatch]:
    yield pa.RecordBatch.from_pydict(
        {"device": [f"d{i % 3}" for i in range(n)], "z": [float(i) for i in range(n)]}
    )


async def test_publisher_delivers_every_row_with_keys_properties_and_expiry() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        sub = _Collector(b.port, "alerts/#")
        await eventually(sub.subscribed.is_set)
        o = SinkOptions.parse(
            {
                "url": f"mqtt://127.0.0.1:{b.port}",
                "topic": "alerts/{device}",
                "properties": "device",
                "expiry": "60",
            },
            ["device", "z"],
        )
        got = await asyncio.to_thread(publish_batches, o, _batches(300), query_id="q1", batch_id=7)
        assert got == (0, 300)
        await eventually(lambda: sub.count() == 300)
        sub.close()
    keys = {p[KEY_PROPERTY] for _, _, p in sub.got}
    assert keys == {f"q1/7/0/{i}" for i in range(300)}
    assert all(p["device"] == t.split("/")[1] and p["expiry"] == "60" for t, _, p in sub.got)
    assert sorted(pay for _, pay, _ in sub.got)[0].startswith(b'{"device":"d0","z":0.0')
    # a re-run of the same task numbers the same rows the same way, whatever their order
    o2 = SinkOptions.parse({"url": "mqtt://127.0.0.1:1", "topic": "alerts/{device}"}, ["device", "z"])
    from bridge._sink import _messages

    forward = sorted(_messages(o2, _batches(300), "x"))
    rows = next(_batches(300))
    backward = sorted(_messages(o2, iter([rows.slice(150), rows.slice(0, 150)]), "x"))
    assert forward == backward


async def test_every_qos_and_a_refused_row() -> None:
    """QoS 2 (PUBREC, PUBREL, PUBCOMP) and QoS 0 through a window smaller than the rows (the
    packet ids wrap past the window), large payloads (several writes), every row once with its
    key; a PUBACK with an error reason code (an ACL refusing one topic) fails the task naming
    the row."""

    class DenyBad(Hooks):
        def authorize(self, client_id: str, username: str | None, action: str, topic: str) -> bool | None:
            return not (action == "publish" and topic == "out/bad")

    async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[DenyBad()]) as b:
        sub = _Collector(b.port, "out/#")
        await eventually(sub.subscribed.is_set)
        url = f"mqtt://127.0.0.1:{b.port}"
        for qos, n in (("2", 700), ("0", 500)):
            o = SinkOptions.parse(
                {"url": url, "topic": "out/{device}", "qos": qos, "max_inflight": "64"}, ["device", "z"]
            )
            got = await asyncio.to_thread(publish_batches, o, _batches(n), query_id=f"q{qos}", batch_id=0)
            assert got == (0, n)
        big = pa.RecordBatch.from_pydict({"device": [f"b{i}" for i in range(5)], "z": ["x" * 400_000] * 5})
        ob = SinkOptions.parse({"url": url, "topic": "out/{device}", "payload": "z"}, ["device", "z"])
        assert await asyncio.to_thread(publish_batches, ob, iter([big]), query_id="qb", batch_id=0) == (0, 5)
        await eventually(lambda: sub.count() == 1205)  # 2 MB: written in chunks of about 1 MiB
        keys = [p[KEY_PROPERTY] for _, _, p in sub.got]
        assert len(set(keys)) == 1205
        assert sorted(len(pay) for t, pay, _ in sub.got if t.startswith("out/b")) == [400_000] * 5
        assert {k for k in keys if k.startswith("q2/")} == {f"q2/0/0/{i}" for i in range(700)}
        bad = pa.RecordBatch.from_pydict({"device": ["a", "b", "bad", "c"], "z": [1.0, 2.0, 3.0, 4.0]})
        o1 = SinkOptions.parse({"url": url, "topic": "out/{device}"}, ["device", "z"])
        with pytest.raises(SinkError, match=r"the broker refused row 2 of the sorted rows: NOT_AUTHORIZED"):
            await asyncio.to_thread(publish_batches, o1, iter([bad]), query_id="q", batch_id=0)
        sub.close()


async def test_bad_rows_and_brokers_are_clear_errors() -> None:
    class Deny(Hooks):
        def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> bool | None:
            return False

    cols = ["device", "z"]
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, max_packet_size=2000) as b:
        url = f"mqtt://127.0.0.1:{b.port}"
        bad = pa.RecordBatch.from_pydict({"device": ["ok", "a#b"], "z": [1.0, 2.0]})
        o = SinkOptions.parse({"url": url, "topic": "alerts/{device}"}, cols)
        with pytest.raises(SinkError, match=r"row 1 .*gave 'alerts/a#b': a topic name cannot contain"):
            await asyncio.to_thread(publish_batches, o, iter([bad]), query_id="q", batch_id=0)
        null = pa.RecordBatch.from_pydict({"device": ["ok", None], "z": [1.0, 2.0]})
        with pytest.raises(
            SinkError, match=r"row 1 .*column 'device' of option topic='alerts/\{device\}' is null"
        ):
            await asyncio.to_thread(publish_batches, o, iter([null]), query_id="q", batch_id=0)
        big = pa.RecordBatch.from_pydict({"device": ["ok", "big"], "z": ["x", "y" * 5000]})
        ob = SinkOptions.parse({"url": url, "topic": "alerts/{device}", "payload": "z"}, cols)
        with pytest.raises(
            SinkError, match=r"topic 'alerts/big'.* exceeds the broker's maximum packet size of 2000"
        ):
            await asyncio.to_thread(publish_batches, ob, iter([big]), query_id="q", batch_id=0)
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[Deny()]) as b:
        od = SinkOptions.parse(
            {"url": f"mqtt://127.0.0.1:{b.port}", "topic": "t/{device}", "username": "u", "password": "p"},
            cols,
        )
        with pytest.raises(
            SinkError, match=r"refused the connection: not authorized \(options username/password"
        ):
            await asyncio.to_thread(publish_batches, od, _batches(3), query_id="q", batch_id=0)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    oc = SinkOptions.parse({"url": f"mqtt://127.0.0.1:{free}", "topic": "t/{device}"}, cols)
    with pytest.raises(SinkError, match=rf"cannot connect to mqtt://127.0.0.1:{free} \(option url\)"):
        await asyncio.to_thread(publish_batches, oc, _batches(3), query_id="q", batch_id=0)


# paho-mqtt 2.2 does not close the socket of a failed TLS handshake (client.py, _ssl_wrap_socket)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_publisher_over_tls(tmp_path: Path) -> None:
    from broker._config import BrokerConfig, Listener
    from tests.security.helpers import make_certs

    certs = make_certs(tmp_path)
    listeners = (
        Listener("tcp", "127.0.0.1", 0),
        Listener("tcp", "127.0.0.1", 0, str(certs.server_cert), str(certs.server_key)),
    )
    async with Broker(config=BrokerConfig(listeners=listeners, sys_interval=0)) as b:
        plain, mqtts = b.ports
        sub = _Collector(plain, "alerts/#")
        await eventually(sub.subscribed.is_set)
        o = SinkOptions.parse(
            {"url": f"mqtts://127.0.0.1:{mqtts}", "topic": "alerts/{device}", "tls_ca": str(certs.ca)},
            ["device", "z"],
        )
        assert await asyncio.to_thread(publish_batches, o, _batches(20), query_id="q", batch_id=0) == (0, 20)
        await eventually(lambda: sub.count() == 20)
        untrusted = SinkOptions.parse(
            {"url": f"mqtts://127.0.0.1:{mqtts}", "topic": "t/{device}"}, ["device", "z"]
        )
        with pytest.raises(SinkError, match=r"cannot connect to mqtts://.* \(option url\): .*certificate"):
            await asyncio.to_thread(publish_batches, untrusted, _batches(1), query_id="q", batch_id=0)
        sub.close()


def test_message_topics_follow_mqtt_matching() -> None:
    from bridge._writer import _TopicMatcher

    m = _TopicMatcher(("telemetry/#", "+/status", "exact/a"))
    assert [m(t) for t in ("telemetry", "telemetry/d1", "telemetry/d1/x", "d1/status", "exact/a")] == [
        True
    ] * 5
    assert [m(t) for t in ("x/telemetry", "d1/status/x", "exact/b", "$SYS/status")] == [False] * 4
    with pytest.raises(ValueError, match="a wildcard must fill a level"):
        _TopicMatcher(("a/b#",))


def test_a_schema_of_some_columns_reads_only_those() -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from bridge._datasource import SiftmqDataSource

    source = SiftmqDataSource({"kind": "deliveries", "path": "/x"})
    some = StructType([StructField("topic", StringType()), StructField("payload_size", LongType())])
    assert source.reader(some).plan.columns == ("topic", "payload_size")  # type: ignore[attr-defined]
    assert source.reader(source.schema()).plan.columns is None  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="column payload_size of deliveries is bigint, not string"):
        source.reader(StructType([StructField("payload_size", StringType())]))
    with pytest.raises(ValueError, match="nope"):
        source.reader(StructType([StructField("nope", StringType())]))
    named = SiftmqDataSource({"kind": "deliveries", "path": "/x", "columns": "topic"})
    with pytest.raises(ValueError, match="is not option columns='topic'"):
        named.reader(some)
    assert named.reader(named.schema()).plan.columns == ("topic",)  # type: ignore[attr-defined]
