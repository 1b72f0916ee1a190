"""The QoS 2 packet identifiers this node received from each peer and not yet released
(issue 30, finding 6): exactly once across a link must outlive the link object and the
process.

A link receives a peer's QoS 2 PUBLISH, injects it, and answers PUBREC; the id stays
"received" until the peer's PUBREL.  A PUBLISH resent under a received id is the same message
(MQTT 4.3.3): it is answered PUBREC and not injected again.  The set used to live in the
:class:`~cluster._link.PeerLink` object, which the node throws away when the peer leaves the
membership (a partition longer than the failure timeout): the peer's resend after the heal
was then injected twice.  It also died with the process (the documented hole of
docs/cluster.md).  Here the sets are kept per peer for the node's life and, with a data
directory, in an append-only file ``<data_dir>/cluster-qos2`` (``+ <peer> <id>`` when the
PUBREC leaves, ``- <peer> <id>`` on PUBREL, ``0 <peer>`` when the peer's session is new),
compacted when it is read at start and when it grew beyond a few times the live ids.

The order is the one that never loses: an id is written to the file once the local store made
its message durable (from the store's signal, whether or not the link is still there to send
the PUBREC), and before the PUBREC is written.  A crash between the store's commit and that
write can deliver the message twice (the peer resends it, its PUBREC never left); a crash
after it cannot.  The write is an ``os.write`` to an ``O_APPEND``
descriptor (it survives ``kill -9``; like the store's own commits it is not an ``fsync``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

__all__ = ["ReceivedQos2"]

log = logging.getLogger("siftmq.cluster")

_FILE = "cluster-qos2"


class ReceivedQos2:
    """Per-peer sets of received QoS 2 ids, persisted in ``data_dir`` when there is one."""

    def __init__(self, data_dir: Path | None) -> None:
        self._ids: dict[str, set[int]] = {}
        self._path = None if data_dir is None else data_dir / _FILE
        self._fd: int | None = None
        self._lines = 0
        if self._path is not None:
            self._load(self._path)
            self._compact()

    def of(self, peer: str) -> set[int]:
        """The live set of ``peer`` (read it; change it only through this object)."""
        return self._ids.setdefault(peer, set())

    def add(self, peer: str, pid: int) -> None:
        self.of(peer).add(pid)
        self._write(f"+ {peer} {pid}\n")

    def discard(self, peer: str, pid: int) -> None:
        ids = self.of(peer)
        if pid in ids:
            ids.discard(pid)
            self._write(f"- {peer} {pid}\n")

    def clear(self, peer: str) -> None:
        ids = self.of(peer)
        if ids:
            ids.clear()
            self._write(f"0 {peer}\n")

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _load(self, path: Path) -> None:
        try:
            text = path.read_text("ascii", errors="replace")
        except FileNotFoundError:
            return
        for line in text.splitlines():
            parts = line.split()
            try:
                if len(parts) == 3 and parts[0] == "+":
                    self.of(parts[1]).add(int(parts[2]))
                elif len(parts) == 3 and parts[0] == "-":
                    self.of(parts[1]).discard(int(parts[2]))
                elif len(parts) == 2 and parts[0] == "0":
                    self.of(parts[1]).clear()
            except ValueError:
                continue  # a torn last line (killed mid-write): that id's PUBREC never left
        held = sum(len(s) for s in self._ids.values())
        if held:
            log.info("cluster: %d received QoS 2 id(s) of peers restored", held)

    def _compact(self) -> None:
        """Rewrite the file with the live ids only (atomically: a new file renamed)."""
        path = self._path
        if path is None:
            return
        self.close()
        tmp = path.with_suffix(".tmp")
        lines = [f"+ {peer} {pid}\n" for peer, ids in sorted(self._ids.items()) for pid in sorted(ids)]
        tmp.write_text("".join(lines), "ascii")
        tmp.replace(path)
        self._lines = len(lines)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def _write(self, line: str) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, line.encode("ascii"))
        except OSError as exc:  # the file is a copy of the memory: the node keeps working
            log.warning("cluster: %s: %s (received QoS 2 ids kept in memory only)", self._path, exc)
            self.close()
            return
        self._lines += 1
        if (
            self._lines % 1000 == 0
            and self._lines > 10_000
            and self._lines > 4 * sum(len(s) for s in self._ids.values())
        ):
            self._compact()
