"""Model-based test of the bridge's batched buffering: hook calls -> committed rows.

The reference expands every ``on_deliveries`` call by brute force (one delivery row per entry,
one publication row when ``routes >= 0``); the machine interleaves calls, flushes, small roll
sizes and a tight bound, and after each flush compares the committed rows with the reference's
accepted rows, and the drop counters with the calls the reference refused.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pyarrow.dataset as ds
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from bridge import Bridge, Kind
from broker import Message
from broker.hooks import DeliveryEntry
from broker.packets import NO_PROPERTIES
from tests.bridge.records import NO_COMPOSITE
from tests.budget import examples

T0 = 1_800_000_000.0
MAX_PENDING = 12

entries = st.lists(
    st.tuples(
        st.sampled_from(["s1", "s2", "s3"]),
        st.sampled_from(["a/#", "a/+"]),
        st.sampled_from([None, "v > 1"]),
        st.integers(0, 2),
        st.booleans(),
    ),
    max_size=4,
)


class BridgeMachine(RuleBasedStateMachine):
    WRITER = "thread"

    @initialize(roll=st.integers(1, 8))
    def setup(self, roll: int) -> None:
        self.dir = Path(tempfile.mkdtemp())
        self.bridge = Bridge(self.dir, roll_bytes=96 * roll, max_pending=MAX_PENDING, writer=self.WRITER)
        self.deliveries: Counter[tuple[object, ...]] = Counter()
        self.publications: Counter[tuple[object, ...]] = Counter()
        self.pending = 0  # rows accepted since the last flush
        self.dropped = {"deliveries": 0, "publications": 0}
        self.next_id = 0

    @rule(fan=entries, routes=st.integers(-1, 5), pub=st.sampled_from([None, "p"]), latency=st.integers(0, 9))
    def call(self, fan: list[DeliveryEntry], routes: int, pub: str | None, latency: int) -> None:
        self.next_id += 1
        i, t = self.next_id, T0 + self.next_id
        msg = Message(f"a/{i % 3}", bytes(i % 7), 1, False, NO_PROPERTIES, pub, i, t - latency / 1000)
        rows = len(fan) + (routes >= 0)
        if self.pending < MAX_PENDING:
            self.pending += rows
            for sub, sf, cf, qos, ret in fan:
                self.deliveries[i, pub, sub, msg.topic, sf, cf, qos, ret, i % 7, latency] += 1
            if routes >= 0:
                self.publications[i, pub, msg.topic, i % 7, 1, False, routes] += 1
        else:
            self.dropped["deliveries"] += len(fan)
            self.dropped["publications"] += routes >= 0
        self.bridge.on_deliveries(t, msg, fan, routes)

    @precondition(lambda self: hasattr(self, "bridge"))
    @rule()
    def flush(self) -> None:
        self.bridge.flush()
        self.pending = 0
        d = ds.dataset(self.dir / Kind.DELIVERIES.value, format="parquet").to_table().to_pylist()
        got = Counter(
            (
                r["message_id"],
                r["publisher_id"],
                r["subscriber_id"],
                r["topic"],
                r["subscription_filter"],
                r["content_filter"],
                r["qos"],
                r["retained"],
                r["payload_size"],
                round(r["latency"] * 1000),
            )
            for r in d
        )
        assert got == self.deliveries
        p = ds.dataset(self.dir / Kind.PUBLICATIONS.value, format="parquet").to_table().to_pylist()
        cols = ("message_id", "publisher_id", "topic", "payload_size", "qos", "retained", "deliveries")
        assert Counter(tuple(r[c] for c in cols) for r in p) == self.publications
        for r in d + p:
            assert r["time"].timestamp() == T0 + r["message_id"]
        s = self.bridge.stats()
        assert s.written == {
            "deliveries": self.deliveries.total(),
            "publications": self.publications.total(),
            "subscription_changes": 0,
            **NO_COMPOSITE,
        }

    @precondition(lambda self: hasattr(self, "bridge"))
    @invariant()
    def consistent(self) -> None:
        self.bridge._check()
        s = self.bridge.stats()
        assert {k: s.dropped[k] for k in self.dropped} == self.dropped

    def teardown(self) -> None:
        if hasattr(self, "bridge"):
            self.bridge.close()  # the writer process (writer="process") ends
        if hasattr(self, "dir"):
            shutil.rmtree(self.dir, ignore_errors=True)


BridgeMachine.TestCase.settings = settings(max_examples=examples(80), stateful_step_count=20, deadline=None)
test_bridge_model = BridgeMachine.TestCase


class ProcessBridgeMachine(BridgeMachine):
    """The same model with the writer in its own process (``siftmq serve``'s default): what is
    committed, counted and dropped must not depend on where the files are written."""

    WRITER = "process"


# fewer examples: each starts a writer process (an interpreter loading pyarrow)
ProcessBridgeMachine.TestCase.settings = settings(max_examples=8, stateful_step_count=20, deadline=None)
test_bridge_model_writer_process = ProcessBridgeMachine.TestCase
