"""Retained messages as one converging register per topic (issue 30, finding 3).

Before, each node kept the last retained message it happened to see, and every new link
subscription fetched the peers' copies, which overwrote the local one and were delivered to
local subscribers: after a partition nodes disagreed, a node's value flipped from read to
read, a fresh subscriber got two or three retained messages for one topic, and subscribers
already subscribed got retained-flagged copies.

Now (the rule of Dynamo-style registers, last writer wins):

* every retained publication by a local client (or a will) gets a **stamp** ``(hlc, origin)``
  from this node's hybrid logical clock (milliseconds of wall time, never behind a stamp seen
  before, +1 when the wall clock did not move) and its node ID: a total order, ties broken by
  the node ID, identical on every node;
* it is sent as a control message (``t: ret``, QoS 1 over the links, kept in the peers' link
  sessions while they are unreachable) to every member; a node stores a retained message only
  when its stamp is above the one it holds for the topic (an empty payload is a stamped
  deletion, a tombstone);
* the copies forwarded on the data path keep going to current subscribers as before but are
  no longer stored, and the retained messages a peer sends for a new link subscription are
  ignored: retained messages reach a subscriber only from its own node's store, on SUBSCRIBE,
  one per topic (MQTT 3.3.1.3);
* when a link comes up the node asks the peer for its whole register (``t: ret?``), which
  repairs what a session that expired, a restart or a join missed;
* a peer's value is checked before it is used (issue 37): a stamp more than
  :data:`MAX_AHEAD_MS` ahead of this node's wall clock is refused (counted, not observed by
  the clock, not stored: a forged stamp far in the future would otherwise win every later
  write and, persisted, outlive restarts), and a topic that is not a valid topic name, or
  names the broker's ``$`` topics, a QoS other than 0-2, a payload that is not base64 or a
  negative expiry make the message malformed (:class:`cluster._control.BadControl`).

Every node therefore holds every retained message of the cluster (full replication: fine for
the retained sets MQTT deployments keep, O(retained) per link connection), and after a heal
all nodes hold the value with the largest stamp once the queued control messages and the sync
have crossed.  The stamps are kept in ``<data_dir>/cluster-retained`` (append-only, compacted
at start) so that a restarted node neither loses nor resurrects a value; messages restored
from the store without a stamp count as the oldest.  Message properties other than the
payload, QoS and message expiry are not carried (documented in docs/cluster.md).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import enum
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import topics
from broker.ext import open_private, write_private
from cluster._auth import WINDOW
from cluster._control import BadControl

__all__ = ["MAX_AHEAD_MS", "Hlc", "Received", "RetainedRegister", "Stamp"]

log = logging.getLogger("siftmq.cluster")

Stamp = tuple[int, str]  # (hybrid logical clock in ms, origin node id)
ZERO: Stamp = (0, "")
_FILE = "cluster-retained"
#: a peer's retained stamp may be this far ahead of this node's wall clock (ms): the clock
#: skew the cluster tolerates anyway (its tokens' window, :data:`cluster._auth.WINDOW`) plus
#: 5 s of transit and scheduling; a stamp further ahead is refused (docs/cluster.md, "Security")
MAX_AHEAD_MS: Final = int(WINDOW * 1000) + 5_000


class Received(enum.Enum):
    """What became of a peer's retained value (:meth:`RetainedRegister.receive`)."""

    APPLIED = "applied"  # its stamp won: stored here
    STALE = "stale"  # ours is newer: ignored
    AHEAD = "ahead"  # its stamp is beyond MAX_AHEAD_MS of our clock: refused


class Hlc:
    """A hybrid logical clock in milliseconds (``wall``: the clock, for tests)."""

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self.wall = wall
        self.last = 0

    def tick(self) -> int:
        self.last = max(self.last + 1, int(self.wall() * 1000))
        return self.last

    def observe(self, t: int) -> None:
        self.last = max(self.last, t)


class RetainedRegister:
    """The stamps of this node's retained topics, and the control messages that converge them.

    ``store(topic, payload, qos, expiry)``: set (or, empty payload, delete) the local retained
    message without delivering it.  Persisted in ``data_dir`` when there is one.
    """

    def __init__(
        self,
        me: str,
        data_dir: Path | None,
        store: Callable[[str, bytes, int, int | None], None],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.me = me
        self.clock = Hlc(wall)
        self.stamps: dict[str, Stamp] = {}
        self._store = store
        self._path = None if data_dir is None else data_dir / _FILE
        self._fd: int | None = None
        self.applied = 0  # remote values stored here
        self.stale = 0  # remote values older than ours (ignored)
        self.ahead = 0  # remote values stamped too far ahead of our clock (refused)
        if self._path is not None:
            self._load(self._path)
            self._compact()

    # ------------------------------------------------------------ local writes
    def local(self, topic: str, payload: bytes, qos: int, expiry: int | None) -> dict[str, Any]:
        """A local client's retained publication: stamped; the control message to send to
        every peer."""
        stamp = (self.clock.tick(), self.me)
        self._set(topic, stamp)
        return _message(topic, payload, qos, expiry, stamp)

    # ------------------------------------------------------------ remote writes
    def receive(self, msg: dict[str, Any]) -> Received:
        """A peer's ``ret`` message (of the shape :func:`cluster._control.check` checked):
        stored if its stamp wins and is not too far ahead; :class:`BadControl` if a value is
        out of its range. O(topic length + payload)."""
        topic, payload, qos, expiry, stamp = _values(msg)
        if stamp[0] > int(self.clock.wall() * 1000) + MAX_AHEAD_MS:
            self.ahead += 1
            return Received.AHEAD
        self.clock.observe(stamp[0])
        if stamp <= self.stamps.get(topic, ZERO):
            self.stale += 1
            return Received.STALE
        self._set(topic, stamp)
        self._store(topic, payload, qos, expiry)
        self.applied += 1
        return Received.APPLIED

    def dump(self, held: Callable[[str], tuple[bytes, int, int | None] | None]) -> list[dict[str, Any]]:
        """``ret`` messages for every stamped topic (``held(topic)``: the local retained
        message's payload, QoS and remaining expiry, None for a deleted one)."""
        out = []
        for topic, stamp in self.stamps.items():
            got = held(topic)
            payload, qos, expiry = got if got is not None else (b"", 0, None)
            out.append(_message(topic, payload, qos, expiry, stamp))
        return out

    # ------------------------------------------------------------ persistence
    def _set(self, topic: str, stamp: Stamp) -> None:
        self.stamps[topic] = stamp
        if self._fd is not None:
            try:
                os.write(self._fd, f"{stamp[0]} {stamp[1]} {topic}\n".encode())
            except OSError as exc:
                log.warning("cluster: %s: %s (retained stamps kept in memory only)", self._path, exc)
                self.close()

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _load(self, path: Path) -> None:
        try:
            text = path.read_text("utf-8", errors="replace")
        except FileNotFoundError:
            return
        for line in text.splitlines():
            parts = line.split(" ", 2)
            if len(parts) != 3:
                continue
            try:
                stamp = (int(parts[0]), parts[1])
            except ValueError:
                continue
            if stamp > self.stamps.get(parts[2], ZERO):
                self.stamps[parts[2]] = stamp
                self.clock.observe(stamp[0])

    def _compact(self) -> None:
        path = self._path
        if path is None:
            return
        self.close()
        text = "".join(f"{h} {o} {t}\n" for t, (h, o) in sorted(self.stamps.items()))
        write_private(path, text.encode())  # 0600 whatever the umask (broker/_files.py)
        self._fd = open_private(path, os.O_WRONLY | os.O_APPEND)


def _values(msg: dict[str, Any]) -> tuple[str, bytes, int, int | None, Stamp]:
    """(topic, payload, QoS, expiry, stamp) of a ``ret`` message, each in its range, else
    :class:`BadControl`."""
    topic: str = msg["topic"]
    try:
        topics.validate_topic(topic)
    except topics.InvalidTopic as exc:
        raise BadControl(f"ret: {str(exc)[:80]}") from None
    if topic.startswith("$"):
        raise BadControl(f"ret: a broker topic {topic[:40]!r}")
    qos: int = msg["q"]
    if qos not in (0, 1, 2):
        raise BadControl(f"ret: QoS {qos}")
    expiry: int | None = msg.get("e")
    if expiry is not None and expiry < 0:
        raise BadControl(f"ret: expiry {expiry}")
    h: int = msg["h"]
    if h < 0:
        raise BadControl(f"ret: stamp {h}")
    try:
        payload = base64.b64decode(msg["p"], validate=True)
    except (binascii.Error, ValueError):
        raise BadControl("ret: payload not base64") from None
    return topic, payload, qos, expiry, (h, msg["o"])


def _message(topic: str, payload: bytes, qos: int, expiry: int | None, stamp: Stamp) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "t": "ret",
        "topic": topic,
        "p": base64.b64encode(payload).decode(),
        "q": qos,
        "h": stamp[0],
        "o": stamp[1],
    }
    if expiry is not None:
        msg["e"] = expiry
    return msg
