"""Seed 001's sans-IO group routing (cluster/_groups.py) driven by an in-test network.

Unit tests of GroupCode and CSSU, the subscribe/decompose/forward path of Fig 6, heartbeats
repairing a diverged copy, core re-election after a failure, TimeExpired deletion (Fig 7), and
a model-based test: random subscribe/unsubscribe/publish/fail sequences over 16 nodes compared
with a brute-force reference of which access nodes must receive each composite event."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import defaultdict, deque
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster._groups import (
    Deliver,
    GroupNode,
    Heartbeat,
    Output,
    Send,
    cssu,
    decompose,
    group_code,
)
from composite import canonical

ROOT = Path(__file__).resolve().parents[2]


class Net:
    """A small network: global directory, FIFO pump, failures."""

    def __init__(self, n: int, alpha: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.ids = sorted(rng.sample(range(1, 2**16), n))
        self.alpha = alpha
        self.dead: set[int] = set()
        self.known_dead: set[int] = set()
        self.nodes = {i: GroupNode(i << 144, alpha, 64, self) for i in self.ids}
        self.nodes = {g.id: g for g in self.nodes.values()}
        self.ids = sorted(self.nodes)
        self.delivered: dict[tuple[int, str], list[tuple[int, ...]]] = defaultdict(list)
        self.sent = 0

    def closest(self, key: int, count: int) -> list[int]:
        live = [i for i in self.ids if i not in self.known_dead]
        return sorted(live, key=lambda m: m ^ key)[:count]

    def producer(self, atom: str) -> int:
        return self.ids[int(atom[1:]) % len(self.ids)]

    def run(self, src: int, outs: list[Output]) -> None:
        q: deque[tuple[int, Output]] = deque((src, o) for o in outs)
        while q:
            at, o = q.popleft()
            if isinstance(o, Deliver):
                self.delivered[(at, o.sub)].append(o.events)
                continue
            assert isinstance(o, Send)
            self.sent += 1
            if o.dest not in self.dead:
                q.extend((o.dest, x) for x in self.nodes[o.dest].receive(at, o.msg))

    def detect(self) -> None:
        self.known_dead = set(self.dead)
        for i in self.ids:
            if i not in self.dead:
                for d in self.dead:
                    self.run(i, self.nodes[i].node_down(d))
        for _ in range(2):
            self.tick()

    def tick(self) -> None:
        for i in self.ids:
            if i not in self.dead:
                self.run(i, self.nodes[i].tick())

    def check(self) -> None:
        for i in self.ids:
            if i not in self.dead:
                self.nodes[i]._check()


def test_group_code_follows_definition_1() -> None:
    for text in ("a0 | a1", "(a0 | a1) & a2", "x"):
        code = group_code(text, 1000)
        h = code * 1000 // 2**160  # floor(2^n h / groupNum) * groupNum / 2^n ~ h - 1 .. h
        assert 0 <= h <= 1000
        assert code == group_code(text, 1000)  # stable
    # canonical texts make equal subscriptions one group
    assert group_code(canonical("(a1|a0)&a2"), 64) == group_code(canonical("a2 & (a0 | a1)"), 64)


def test_cssu_is_the_alpha_closest_by_xor_core_first() -> None:
    members = [0b0001, 0b0100, 0b0111, 0b1000, 0b1111]
    assert cssu(0b0110, members, 3) == [0b0001, 0b0100, 0b0111]  # xors 0111, 0010, 0001
    assert cssu(0b1110, members, 2) == [0b1000, 0b1111]


def test_decompose_gives_the_top_operands() -> None:
    assert decompose("(a0 | a1) & (a2 | a3)") == ("&", ("a0 | a1", "a2 | a3"))
    assert decompose("a0 | a1") == ("|", ("a0", "a1"))
    assert decompose("a5") == ("", ())


def test_subscription_is_replicated_decomposed_and_matched() -> None:
    net = Net(16, 3)
    access = net.ids[5]
    cs = canonical("(a1|a2)&(a3|a4)")
    net.run(access, net.nodes[access].subscribe(cs))
    holders = [i for i in net.ids if any(cs in t.entries for t in net.nodes[i].tables.values())]
    assert holders == sorted(net.closest(group_code(cs, 64), 3))  # alpha copies, on its CSSU
    cores = [i for i in holders if next(iter(net.nodes[i].tables.values())).in_core]
    assert cores == [min(holders)]
    net.check()
    for atom, eid in (("a2", 1), ("a4", 2)):
        p = net.producer(atom)
        net.run(p, net.nodes[p].publish_atom(atom, eid))
    assert net.delivered[(access, cs)] == [(1, 2)]


def test_or_completes_on_any_branch_and_and_waits_for_all() -> None:
    net = Net(12, 3, seed=3)
    access = net.ids[0]
    cs = canonical("a1 & a2")
    net.run(access, net.nodes[access].subscribe(cs))
    p1 = net.producer("a1")
    net.run(p1, net.nodes[p1].publish_atom("a1", 7))
    net.run(p1, net.nodes[p1].publish_atom("a1", 8))
    assert not net.delivered
    p2 = net.producer("a2")
    net.run(p2, net.nodes[p2].publish_atom("a2", 9))
    assert net.delivered[(access, cs)] == [(7, 9)]  # the oldest buffered instance pairs first


def test_core_failure_reelects_and_resubscribes() -> None:
    net = Net(16, 3, seed=1)
    access = net.ids[2]
    cs = canonical("(a1|a2)&a3")
    net.run(access, net.nodes[access].subscribe(cs))
    core = net.closest(group_code(cs, 64), 3)[0]
    assert core != access
    net.dead.add(core)
    p = net.producer("a1")
    net.run(p, net.nodes[p].publish_atom("a1", 1))
    net.run(net.producer("a3"), net.nodes[net.producer("a3")].publish_atom("a3", 2))
    assert not net.delivered.get((access, cs))  # before detection: the core's events are lost
    net.detect()
    net.check()
    net.run(p, net.nodes[p].publish_atom("a1", 3))
    net.run(net.producer("a3"), net.nodes[net.producer("a3")].publish_atom("a3", 4))
    assert net.delivered[(access, cs)] == [(3, 4)]


def test_heartbeat_repairs_a_diverged_copy_by_logic_timer() -> None:
    net = Net(10, 3, seed=2)
    cs = canonical("a1 | a2")
    a, b = net.ids[0], net.ids[1]
    net.run(a, net.nodes[a].subscribe(cs))
    members = net.closest(group_code(cs, 64), 3)
    lagging = net.nodes[members[-1]]
    t = lagging.tables[group_code(cs, 64)]
    del t.entries[cs]  # a lost SUBSCRIBE
    net.dead.add(members[-1])
    net.run(b, net.nodes[b].subscribe(cs))  # missed as well
    net.dead.discard(members[-1])
    net.tick()  # heartbeats: digest mismatch -> fetch -> merge
    repaired = lagging.tables[group_code(cs, 64)].entries[cs]
    assert repaired.subscribers == {a, b}
    assert isinstance(Heartbeat(1, 2, b""), Heartbeat)


def test_unsubscribe_expires_the_entry_and_releases_elements() -> None:
    net = Net(12, 3, seed=4)
    access = net.ids[3]
    cs = canonical("(a1|a2)&a3")
    net.run(access, net.nodes[access].subscribe(cs))
    net.run(access, net.nodes[access].unsubscribe(cs))
    for _ in range(10):  # TimeExpired passes the threshold (3) for the entry, then its elements
        net.tick()
    assert not any(n.tables for n in net.nodes.values())
    assert not any(n.ast for n in net.nodes.values())
    net.check()


@settings(max_examples=25)
@given(st.data())
def test_model_random_operations_match_brute_force(data: st.DataObject) -> None:
    net = Net(16, 3, seed=data.draw(st.integers(0, 50)))
    subs: dict[str, set[int]] = defaultdict(set)  # reference: csub -> access nodes
    eid = 0
    for _ in range(data.draw(st.integers(1, 12))):
        kind = data.draw(st.sampled_from(["sub", "sub", "unsub", "event", "fail"]))
        if kind == "sub":
            atoms = data.draw(
                st.lists(st.sampled_from([f"a{i}" for i in range(6)]), min_size=3, max_size=3, unique=True)
            )
            cs = canonical(f"({atoms[0]}|{atoms[1]})&{atoms[2]}")
            node = data.draw(st.sampled_from([i for i in net.ids if i not in net.dead]))
            if node not in subs[cs]:
                subs[cs].add(node)
                net.run(node, net.nodes[node].subscribe(cs))
        elif kind == "unsub" and any(ns - net.dead for ns in subs.values()):
            cs = data.draw(st.sampled_from(sorted(c for c, ns in subs.items() if ns - net.dead)))
            node = data.draw(st.sampled_from(sorted(subs[cs] - net.dead)))
            subs[cs].discard(node)
            net.run(node, net.nodes[node].unsubscribe(cs))
        elif kind == "fail" and len(net.dead) < 2:  # fewer than alpha: no CSSU can vanish
            victim = data.draw(st.sampled_from(net.ids))
            net.dead.add(victim)
            net.detect()
        elif kind == "event" and any(subs.values()):
            cs = data.draw(st.sampled_from(sorted(c for c, ns in subs.items() if ns)))
            _op, operands = decompose(cs)
            x, y = (data.draw(st.sampled_from(decompose(o)[1] or (o,))) for o in operands)
            if net.producer(x) in net.dead or net.producer(y) in net.dead:
                continue
            for n in net.nodes.values():
                for t in n.tables.values():
                    for e in t.entries.values():
                        e.buffers.clear()
            net.delivered.clear()
            eid += 2
            net.run(net.producer(x), net.nodes[net.producer(x)].publish_atom(x, eid))
            net.run(net.producer(y), net.nodes[net.producer(y)].publish_atom(y, eid + 1))
            for node in subs[cs] - net.dead:
                got = net.delivered.get((node, cs), [])
                assert any({eid, eid + 1} <= set(ev) for ev in got), (cs, node)
        net.check()


def test_simulator_smoke() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "sim_cluster.py"),
            "--quick",
            "--no-plots",
            "--out",
            "/dev/null",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "fig 9 failure 10.0%" in out.stdout
    assert "fig 12 20 subscribers" in out.stdout
