"""The checker of a nemesis run's history (issue 30), in the spirit of Jepsen: properties over
the whole history, not assertions at points in time.

* **Lost**: an acknowledged QoS 1/2 message (``ack``) whose PUBLISH came after a subscriber's
  SUBACK (``sub``) and never reached that subscriber (``recv``), for the plain subscribers
  (every one must get it) and per shared group (one member must).  Subscribers are
  persistent sessions whose node may be killed and restarted with its store: their sessions
  stay alive, so nothing is excused.
* **Duplicates**: a QoS 2 message delivered more than once to one subscriber (or group) is a
  violation; QoS 1 duplicates are counted (at least once allows them).
* **Order**: per subscriber and publisher, a message ``a`` acknowledged before ``b`` was
  published (real-time order) whose first delivery comes after ``b``'s.  Messages a publisher
  resends after a reconnection may overtake each other (paho sends new messages before the
  old ones' resends: the client's order, not the broker's), so mere sequence inversions are
  not counted.
* **Unacknowledged** messages may arrive or not (counted).
* **Composite**: events of ``jc/a & jc/b`` doubled or pairing atoms of different rounds
  (violations of exactly-once merging), and acknowledged pairs without an event (counted:
  docs/composite.md lets events die with a core or across a cut).
* **Retained**: the final reads (``retained`` events, one fresh subscriber per node after the
  last heal): one retained message per read, the same value on every node, and that value is
  one that was published.
* **Stalls**: per publisher, the longest time between two acknowledgements, with the
  publisher's node healthy (not killed, stopped, isolated or in the smaller side).
* **Backlog after a heal**: per heal, the time to the first delivery of a message published
  during the fault on a node that was cut from the subscriber's node (when there is one).
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.nemesis._cluster import History


@dataclass
class Report:
    acked: int = 0
    published: int = 0
    lost: list[tuple[str, str]] = field(default_factory=list)  # (subscriber or group, payload)
    lost_shared: list[tuple[str, str]] = field(default_factory=list)
    qos2_duplicates: list[tuple[str, str, int]] = field(default_factory=list)
    qos1_duplicates: int = 0
    shared_duplicates: int = 0
    reorders: list[tuple[str, str, int, int]] = field(default_factory=list)
    unacked_delivered: int = 0
    retained_reads: dict[int, list[str]] = field(default_factory=dict)
    retained_problems: list[str] = field(default_factory=list)
    max_stall: dict[str, float] = field(default_factory=dict)
    composite_events: int = 0
    composite_doubled: int = 0
    composite_mispaired: list[str] = field(default_factory=list)
    #: of those, the pairs FIFO pairing makes of the order the brokers received the atoms in
    #: (a publisher's resends after a reconnection overtaken by its new messages)
    composite_publisher_order: int = 0
    #: events delivered again with DUP (the subscriber's QoS 1 session: at least once)
    composite_redelivered: int = 0
    composite_missing: int = 0  # acknowledged pairs whose event never came
    backlog_resumed: list[float] = field(default_factory=list)
    #: fault -> seconds from each heal until every node gave that cycle's retained value
    retained_converged: dict[str, list[float]] = field(default_factory=dict)
    retained_not_converged: list[int] = field(default_factory=list)  # cycles, within settle_s
    last_delivery_after_heal: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.lost_shared or self.qos2_duplicates or self.retained_problems)

    def summary(self) -> dict[str, Any]:
        return {
            "published": self.published,
            "acknowledged": self.acked,
            "lost (subscriber, message)": len(self.lost),
            "lost for a shared group": len(self.lost_shared),
            "QoS 2 duplicates": len(self.qos2_duplicates),
            "QoS 1 duplicates": self.qos1_duplicates,
            "shared-group duplicates": self.shared_duplicates,
            "reorders": len(self.reorders),
            "unacknowledged but delivered": self.unacked_delivered,
            "retained problems": self.retained_problems,
            "retained identical on every node after a heal (s, max)": round(
                max((x for v in self.retained_converged.values() for x in v), default=0.0), 2
            ),
            "retained convergence by fault (s, max)": {
                k: round(max(v), 2) for k, v in sorted(self.retained_converged.items())
            },
            "retained not converged within settle (cycles)": self.retained_not_converged,
            "longest ack gap of a healthy publisher (s)": round(max(self.max_stall.values(), default=0.0), 2),
            "backlog resumed after heal (s, max)": round(max(self.backlog_resumed, default=0.0), 2),
            "composite events": self.composite_events,
            "composite doubled": self.composite_doubled,
            "composite mispaired": len(self.composite_mispaired),
            "composite mispaired by the publishers' order": self.composite_publisher_order,
            "composite mispaired by the brokers": len(self.composite_mispaired)
            - self.composite_publisher_order,
            "composite redelivered with DUP (QoS 1, allowed)": self.composite_redelivered,
            "composite pairs acknowledged without event": self.composite_missing,
            "examples lost": self.lost[:5] + self.lost_shared[:5],
        }


def check(h: History, groups: dict[str, list[str]], published_retained: set[str]) -> Report:
    """``groups``: shared group name -> its members' client ids (their deliveries count once
    per group)."""
    r = Report()
    pubs = {f["payload"]: (t, f) for t, f in h.of("pub") if f.get("topic", "jep/").startswith("jep/")}
    acks = {f["payload"]: t for t, f in h.of("ack") if f["payload"] in pubs}
    r.published, r.acked = len(pubs), len(acks)
    subs = {f["client"]: (t, f) for t, f in h.of("sub") if not f["filter"].startswith("$composite/")}
    member_of = {m: g for g, ms in groups.items() for m in ms}
    got: dict[str, Counter[str]] = defaultdict(Counter)
    latest_pub: dict[tuple[str, str], tuple[float, int]] = {}  # (sub, publisher) -> newest delivered
    recvs = h.of("recv")
    _composite(h, r)
    recvs = [(t, f) for t, f in recvs if f["topic"].startswith("jep/") and f["topic"] != "jep/probe"]
    for _t, f in recvs:
        payload = f["payload"]
        key = member_of.get(f["client"], f["client"])
        got[key][payload] += 1
        if key == f["client"] and got[key][payload] == 1 and payload in pubs:
            pub, _, seq_s = payload.rpartition(":")
            t_pub = pubs[payload][0]
            newest = latest_pub.get((key, pub))
            acked_at = acks.get(payload)
            if newest is not None and acked_at is not None and newest[0] > acked_at:
                r.reorders.append((key, pub, int(seq_s), newest[1]))
            if newest is None or t_pub > newest[0]:
                latest_pub[key, pub] = (t_pub, int(seq_s))
    # which subscriber (or group) must have which acknowledged message
    since: dict[str, float] = {}
    for client, (t, _f) in subs.items():
        key = member_of.get(client, client)
        since[key] = min(t, since.get(key, t))
    for payload in acks:
        t_pub, f = pubs[payload]
        for key, t_sub in since.items():
            if t_sub >= t_pub:
                continue
            n = got[key][payload]
            shared = key in groups
            if n == 0:
                (r.lost_shared if shared else r.lost).append((key, payload))
            elif n > 1:
                if f["qos"] == 2:
                    r.qos2_duplicates.append((key, payload, n))
                elif shared:
                    r.shared_duplicates += n - 1
                else:
                    r.qos1_duplicates += n - 1
    r.unacked_delivered = sum(1 for key in got for p in got[key] if p not in acks)
    _retained(h, r, published_retained)
    _stalls(h, r)
    _backlog(h, r, recvs)
    return r


def _composite(h: History, r: Report) -> None:
    """The composite subscription ``jc/a & jc/b``: the publishers ``ca`` and ``cb`` publish
    ``ca:<k>`` and ``cb:<k>`` at the same rate, so the k-th event must pair ``ca:k`` with
    ``cb:k`` (docs/composite.md: oldest instances first) unless an atom was lost or doubled
    on the way; an event delivered twice is doubled, unless the second copy is a QoS 1
    redelivery of the subscriber's session (DUP: at least once, counted apart).

    A mispaired event is classified as the publishers' order when it pairs the n-th
    acknowledged ``ca`` with the n-th acknowledged ``cb``: a publisher acknowledged out of
    order (paho resends its unacknowledged messages after a reconnection behind the new ones)
    delivered its atoms to the brokers in that order, and FIFO pairing pairs what arrives in
    that order; no broker can pair them otherwise.  The others are the brokers'."""
    acked = {f["payload"] for _t, f in h.of("ack") if f["client"] in ("ca", "cb")}
    rank: dict[str, int] = {}  # payload -> its position in its publisher's acknowledgements
    for pub in ("ca", "cb"):
        times = sorted((t, f["payload"]) for t, f in h.of("ack") if f["client"] == pub)
        rank.update((p, i) for i, (_t, p) in enumerate(times))
    seen: Counter[tuple[str, ...]] = Counter()
    for _t, f in h.of("recv"):
        if not f["topic"].startswith("$composite/"):
            continue
        r.composite_events += 1
        try:
            parts = tuple(sorted(c["payload"] for c in json.loads(f["payload"])["components"]))
        except (ValueError, KeyError, TypeError):
            r.composite_mispaired.append(f["payload"][:80])
            continue
        if seen[parts] and f.get("dup"):  # the subscriber's session resent it: at least once
            r.composite_redelivered += 1
            continue
        seen[parts] += 1
        ks = {p.rpartition(":")[2] for p in parts}
        if len(ks) != 1:
            r.composite_mispaired.append("+".join(parts))
            ranks = {rank.get(p) for p in parts}
            if len(parts) == 2 and len(ranks) == 1 and None not in ranks:
                r.composite_publisher_order += 1
    r.composite_doubled = sum(n - 1 for n in seen.values())
    got = {p.rpartition(":")[2] for parts in seen for p in parts}
    pairs = {p.rpartition(":")[2] for p in acked if p.startswith("ca:")} & {
        p.rpartition(":")[2] for p in acked if p.startswith("cb:")
    }
    r.composite_missing = len(pairs - got)


def _retained(h: History, r: Report, published: set[str]) -> None:
    reads = h.of("retained")
    for _t, f in reads:
        r.retained_reads[f["node"]] = f["values"]
        if len(f["values"]) > 1:
            r.retained_problems.append(
                f"node {f['node']}: {len(f['values'])} retained messages {f['values']}"
            )
        for v in f["values"]:
            if v not in published:
                r.retained_problems.append(f"node {f['node']}: value {v!r} never published")
    finals = {tuple(v[-1:]) for v in r.retained_reads.values()}
    if published and len(finals) > 1:
        r.retained_problems.append(f"nodes disagree: {r.retained_reads}")
    for _t, f in h.of("retained_converged"):
        if f["after"] is None:
            r.retained_not_converged.append(f["cycle"])
        else:
            r.retained_converged.setdefault(f["fault"], []).append(f["after"])


def _faulted(h: History) -> list[tuple[float, float, set[int]]]:
    """(start, end, nodes not healthy) per fault."""
    faults = h.of("fault")
    heals = [t for t, _ in h.of("heal")]
    out = []
    for t, f in faults:
        end = next((x for x in heals if x >= t), float("inf"))
        out.append((t, end, set(f["unhealthy"])))
    return out


def _stalls(h: History, r: Report) -> None:
    faults = _faulted(h)
    by_pub: dict[str, list[float]] = defaultdict(list)
    node_of: dict[str, int] = {}
    for t, f in h.of("ack"):
        by_pub[f["client"]].append(t)
        node_of[f["client"]] = f["node"]
    for pub, times in by_pub.items():
        times.sort()
        gap = 0.0
        for a, b in itertools.pairwise(times):
            # a gap counts when the publisher's node was healthy throughout it
            if any(s < b and a < e and node_of[pub] in bad for s, e, bad in faults):
                continue
            gap = max(gap, b - a)
        r.max_stall[pub] = gap


def _backlog(h: History, r: Report, recvs: list[tuple[float, dict[str, Any]]]) -> None:
    """Per healed fault, the time from the heal to the first (and last) delivery of a message
    published during the fault across the cut (one pass over the deliveries: O(R log F))."""
    faults = sorted((s, e, bad) for s, e, bad in _faulted(h) if e != float("inf"))
    starts = [s for s, _e, _b in faults]
    pub_time = {f["payload"]: (t, f["node"]) for t, f in h.of("pub")}
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for t, f in recvs:
        pub = pub_time.get(f["payload"])
        if pub is None:
            continue
        k = bisect.bisect_right(starts, pub[0]) - 1
        if k < 0:
            continue
        s, e, bad = faults[k]
        if not (s <= pub[0] < e) or t < e or (pub[1] in bad) == (f["node"] in bad):
            continue
        first[k] = min(first.get(k, t), t)
        last[k] = max(last.get(k, t), t)
    for k, t in sorted(first.items()):
        e = faults[k][1]
        r.backlog_resumed.append(t - e)
        r.last_delivery_after_heal = max(r.last_delivery_after_heal, last[k] - e)
