"""Discrete-event simulation of seed 001's network (issue 17 item 6): Figs 9-12.

Usage (from the repository root; hand-run, minutes):

    .venv/bin/python benchmarks/sim_cluster.py --fig all            # 1,024 nodes, alpha 10
    .venv/bin/python benchmarks/sim_cluster.py --fig 9 --quick      # small, for a smoke test

Ours: 1,024 :class:`cluster._groups.GroupNode` (the same sans-IO code a live node runs), one
process, messages delivered in FIFO order (one hop = one time step; order is all the
algorithm depends on).  A message is one ``Send``; a message to a failed node is sent and lost.
The two baselines of the paper are built here as models over the same node IDs, workload and
failures (``001_6a6247c7b716f50f.txt`` section 5):

* **static**: SIENA-style routing on an acyclic broker tree (a random recursive tree: node i
  attaches to a random earlier node).  Atom subscriptions travel hop by hop from the access
  node toward the atom's producer and stop at a broker that already forwarded that atom
  toward it (covering); atom events travel the reverse paths and merge where the paths of the
  two atoms toward a subscriber meet; a failed broker cuts everything behind it.
* **chord**: one node per group, the successor of the group's hash on a Chord ring of the
  same IDs; the subscription and its elements are sent to their group nodes (one message each
  once the lookup is cached; lookups route around failures) and element/composite events
  follow the reverse direction; a failed group node loses its group (no replica).

Workload: 100 atom kinds ``a0..a99``, each produced at one node (its information service);
composite subscriptions ``(X|Y)&(Z|W)`` over four distinct random kinds at random access nodes
(m = 3 composite parts, n = 4 atoms).  Results: JSON and PNG plots in ``docs/img/cluster/``.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import random
import sys
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cluster._groups import Deliver, GroupNode, Output, Send  # noqa: E402
from composite import canonical  # noqa: E402

IMG = ROOT / "docs" / "img" / "cluster"
KINDS = 100


def h160(text: str) -> int:
    return int.from_bytes(hashlib.sha1(text.encode()).digest(), "big")


# ---------------------------------------------------------------- network of GroupNodes
@dataclass
class Net:
    """1,024 GroupNodes, a global directory, a FIFO message pump."""

    n: int
    alpha: int
    seed: int
    ids: list[int] = field(default_factory=list)
    nodes: dict[int, GroupNode] = field(default_factory=dict)
    failed: set[int] = field(default_factory=set)  # crashed
    known_dead: set[int] = field(default_factory=set)  # what the directory already excludes
    messages: int = 0
    delivered: dict[tuple[int, str], list[tuple[int, ...]]] = field(default_factory=lambda: defaultdict(list))
    _closest: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    _producer: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        self.ids = sorted({rng.getrandbits(160) for _ in range(self.n)})
        while len(self.ids) < self.n:  # pragma: no cover - 160-bit collisions
            self.ids = sorted({*self.ids, rng.getrandbits(160)})
        for i in self.ids:
            self.nodes[i] = GroupNode(i, self.alpha, self.n * 4, self)
        pick = random.Random(self.seed + 1)
        self._producer = {f"a{k}": pick.choice(self.ids) for k in range(KINDS)}

    # Directory
    def closest(self, key: int, count: int) -> list[int]:
        k = (key, count)
        got = self._closest.get(k)
        if got is None:
            live = [i for i in self.ids if i not in self.known_dead]
            got = self._closest[k] = sorted(live, key=lambda m: m ^ key)[:count]
        return got

    def producer(self, atom: str) -> int:
        return self._producer[atom]

    # pump
    def run(self, src: int, outs: list[Output]) -> None:
        queue: deque[tuple[int, Output]] = deque((src, o) for o in outs)
        while queue:
            at, o = queue.popleft()
            if isinstance(o, Deliver):
                self.delivered[(at, o.sub)].append(o.events)
                continue
            assert isinstance(o, Send)
            self.messages += 1
            if o.dest in self.failed:
                continue
            queue.extend((o.dest, x) for x in self.nodes[o.dest].receive(at, o.msg))

    def fail(self, fraction: float, rng: random.Random) -> None:
        self.failed = set(rng.sample(self.ids, round(fraction * self.n)))

    def detect(self) -> None:
        """Every live node learns the failures (Kademlia's failed RPCs): re-elections."""
        self.known_dead = set(self.failed)
        self._closest.clear()
        for i in self.ids:
            if i in self.failed:
                continue
            node = self.nodes[i]
            for d in self.failed:
                self.run(i, node.node_down(d))
        for _ in range(2):  # heartbeats: new CSSU members fetch the table, cores re-elected
            for i in self.ids:
                if i not in self.failed:
                    self.run(i, self.nodes[i].tick())

    def clear_buffers(self) -> None:
        for node in self.nodes.values():
            for t in node.tables.values():
                for e in t.entries.values():
                    e.buffers.clear()

    def stored(self) -> int:
        return sum(node.stored_entries() for node in self.nodes.values())


def random_sub(rng: random.Random) -> tuple[str, tuple[str, str], tuple[str, str]]:
    a, b, c, d = (f"a{k}" for k in rng.sample(range(KINDS), 4))
    return canonical(f"({a}|{b})&({c}|{d})"), (a, b), (c, d)


# ---------------------------------------------------------------- baselines
class Tree:
    """The static topology: a random recursive tree over the node IDs."""

    def __init__(self, ids: list[int], seed: int) -> None:
        rng = random.Random(seed + 2)
        order = ids[:]
        rng.shuffle(order)
        self.parent: dict[int, int | None] = {order[0]: None}
        self.depth = {order[0]: 0}
        for i, node in enumerate(order[1:], 1):
            p = order[rng.randrange(i)]
            self.parent[node] = p
            self.depth[node] = self.depth[p] + 1

    def path(self, a: int, b: int) -> list[int]:
        """Nodes from ``a`` to ``b`` inclusive."""
        up_a, up_b = [a], [b]
        x, y = a, b
        while self.depth[x] > self.depth[y]:
            x = self.parent[x]  # type: ignore[assignment]
            up_a.append(x)
        while self.depth[y] > self.depth[x]:
            y = self.parent[y]  # type: ignore[assignment]
            up_b.append(y)
        while x != y:
            x = self.parent[x]  # type: ignore[assignment]
            y = self.parent[y]  # type: ignore[assignment]
            up_a.append(x)
            up_b.append(y)
        return up_a + up_b[-2::-1]


class Ring:
    """Chord placement: a group lives at the successor of its hash."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def successor(self, key: int, dead: set[int] = frozenset()) -> int:  # type: ignore[assignment]
        i = bisect.bisect_left(self.ids, key)
        for k in range(len(self.ids)):
            node = self.ids[(i + k) % len(self.ids)]
            if node not in dead:
                return node
        raise RuntimeError("all nodes dead")


# ---------------------------------------------------------------- Fig 9
def fig9(args: argparse.Namespace) -> dict[str, Any]:
    rates = [0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.10]
    out: dict[str, Any] = {"rates": rates, "ours_before": [], "ours_after": [], "static": [], "chord": []}
    for rate in rates:
        net = Net(args.nodes, args.alpha, args.seed)
        rng = random.Random(args.seed + 3)
        subs: dict[str, list[int]] = defaultdict(list)
        spec: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {}
        for _ in range(args.subs):
            cs, g1, g2 = random_sub(rng)
            node = rng.choice(net.ids)
            subs[cs].append(node)
            spec[cs] = (g1, g2)
            net.run(node, net.nodes[node].subscribe(cs))
        net.fail(rate, random.Random(args.seed + int(rate * 1000)))
        tree, ring = Tree(net.ids, args.seed), Ring(net.ids)
        trials = _trials(net, subs, spec, args.trials, rng)
        before = _celr_ours(net, trials)
        net.detect()
        after = _celr_ours(net, trials)
        static = _celr_static(net, tree, trials)
        chord = _celr_chord(net, ring, trials)
        for k, v in (("ours_before", before), ("ours_after", after), ("static", static), ("chord", chord)):
            out[k].append(v)
        print(
            f"fig 9 failure {rate:.1%}: ours before detection {before:.2%}, after {after:.2%}; "
            f"static {static:.2%}; chord {chord:.2%}",
            flush=True,
        )
    return out


Trial = tuple[str, str, str, list[int]]  # csub, atom 1, atom 2, live interested nodes


def _trials(
    net: Net,
    subs: dict[str, list[int]],
    spec: dict[str, tuple[tuple[str, str], tuple[str, str]]],
    count: int,
    rng: random.Random,
) -> list[Trial]:
    names = sorted(subs)
    trials: list[Trial] = []
    while len(trials) < count:
        cs = rng.choice(names)
        g1, g2 = spec[cs]
        a1 = [a for a in g1 if net.producer(a) not in net.failed]
        a2 = [a for a in g2 if net.producer(a) not in net.failed]
        interested = sorted({n for n in subs[cs] if n not in net.failed})
        if a1 and a2 and interested:  # a failed producer produces nothing; a failed node wants nothing
            trials.append((cs, rng.choice(a1), rng.choice(a2), interested))
    return trials


def _celr_ours(net: Net, trials: list[Trial]) -> float:
    missed = total = 0
    eid = 10**9
    for cs, x, y, interested in trials:
        net.clear_buffers()
        net.delivered.clear()
        eid += 2
        for atom, i in ((x, eid), (y, eid + 1)):
            p = net.producer(atom)
            net.run(p, net.nodes[p].publish_atom(atom, i))
        for node in interested:
            got = any({eid, eid + 1} <= set(ev) for ev in net.delivered.get((node, cs), ()))
            missed += not got
            total += 1
    return missed / total


def _celr_static(net: Net, tree: Tree, trials: list[Trial]) -> float:
    missed = total = 0
    for _cs, x, y, interested in trials:
        for node in interested:
            path = set(tree.path(net.producer(x), node)) | set(tree.path(net.producer(y), node))
            missed += bool(path & net.failed)
            total += 1
    return missed / total


def _celr_chord(net: Net, ring: Ring, trials: list[Trial]) -> float:
    missed = total = 0
    for cs, x, y, interested in trials:
        parts = cs.split(" & ")
        groups = {ring.successor(h160(cs)), *(ring.successor(h160(p.strip("()"))) for p in parts)}
        lost = bool(groups & net.failed)
        del x, y
        for _node in interested:
            missed += lost
            total += 1
    return missed / total


# ---------------------------------------------------------------- Fig 10
def fig10(args: argparse.Namespace) -> dict[str, Any]:
    steps = [5000, 10000, 20000, 30000, 40000, 50000] if not args.quick else [200, 400]
    net = Net(args.nodes, args.alpha, args.seed)
    tree = Tree(net.ids, args.seed)
    rng = random.Random(args.seed + 4)
    out: dict[str, Any] = {
        "subs": steps,
        "ours": [],
        "chord": [],
        "static": [],
        "formula_ours": [],
        "formula_base": [],
    }
    composite_parts: set[str] = set()
    atom_subs: set[str] = set()
    static_entries: set[tuple[int, str]] = set()
    done = 0
    for target in steps:
        while done < target:
            cs, g1, g2 = random_sub(rng)
            node = rng.choice(net.ids)
            net.run(node, net.nodes[node].subscribe(cs))
            composite_parts.update((cs, canonical(f"{g1[0]}|{g1[1]}"), canonical(f"{g2[0]}|{g2[1]}")))
            atom_subs.update((*g1, *g2))
            static_entries.add((node, cs))
            for a in (*g1, *g2):  # atom subscriptions stored along the path (covering stops them)
                for hop in tree.path(node, net.producer(a)):
                    if (hop, a) in static_entries:
                        break
                    static_entries.add((hop, a))
            done += 1
        ours = net.stored()
        chord = len(composite_parts) + len(atom_subs)
        out["ours"].append(ours)
        out["chord"].append(chord)
        out["static"].append(len(static_entries))
        out["formula_ours"].append(target * (args.alpha * 3 + 4))
        out["formula_base"].append(target * (3 + 4))
        print(
            f"fig 10 {target:,} subscriptions: ours {ours:,} entries, chord {chord:,}, "
            f"static {len(static_entries):,}; ours/chord {ours / chord:.1f}x",
            flush=True,
        )
    return out


# ---------------------------------------------------------------- Fig 11
def fig11(args: argparse.Namespace) -> dict[str, Any]:
    ks = list(range(2, 21, 2)) if not args.quick else [2, 4]
    net = Net(args.nodes, args.alpha, args.seed)
    tree, ring = Tree(net.ids, args.seed), Ring(net.ids)
    rng = random.Random(args.seed + 5)
    chord_state: set[tuple[int, str]] = set()  # (group node, element) already subscribed
    chord_parts: set[str] = set()
    static_fwd: set[tuple[int, str]] = set()
    out: dict[str, Any] = {"k": ks, "ours": [], "chord": [], "static": []}
    total = 0
    probe = 200 if not args.quick else 20

    def add(cs: str, g1: tuple[str, str], g2: tuple[str, str], node: int) -> tuple[int, int, int]:
        before = net.messages
        net.run(node, net.nodes[node].subscribe(cs))
        ours = net.messages - before
        chord = 1
        top = ring.successor(h160(cs))
        for part, atoms in ((canonical(f"{g1[0]}|{g1[1]}"), g1), (canonical(f"{g2[0]}|{g2[1]}"), g2)):
            if (top, part) not in chord_state:
                chord_state.add((top, part))
                chord += 1
                if part not in chord_parts:
                    chord_parts.add(part)
                    chord += len(atoms)
        static = 0
        for a in (*g1, *g2):
            for hop, nxt in zip(
                tree.path(node, net.producer(a)), tree.path(node, net.producer(a))[1:], strict=False
            ):
                if (hop, a) in static_fwd:
                    break
                static_fwd.add((hop, a))
                static += 1
                del nxt
        return ours, chord, static

    for k in ks:
        while total < k * args.nodes - probe:
            cs, g1, g2 = random_sub(rng)
            add(cs, g1, g2, rng.choice(net.ids))
            total += 1
        sums = [0, 0, 0]
        for _ in range(probe):
            cs, g1, g2 = random_sub(rng)
            for i, v in enumerate(add(cs, g1, g2, rng.choice(net.ids))):
                sums[i] += v
            total += 1
        for key, v in zip(("ours", "chord", "static"), sums, strict=True):
            out[key].append(v / probe)
        print(
            f"fig 11 k={k}: messages per composite subscription ours {sums[0] / probe:.1f}, "
            f"chord {sums[1] / probe:.1f}, static {sums[2] / probe:.1f}",
            flush=True,
        )
    return out


# ---------------------------------------------------------------- Fig 12
def fig12(args: argparse.Namespace) -> dict[str, Any]:
    counts = list(range(10, 101, 10)) if not args.quick else [10, 20]
    out: dict[str, Any] = {"subscribers": counts, "ours": [], "chord": [], "static": []}
    for n_subs in counts:
        net = Net(args.nodes, args.alpha, args.seed)
        tree = Tree(net.ids, args.seed)
        rng = random.Random(args.seed + 6 + n_subs)
        cs, g1, g2 = random_sub(rng)
        nodes = rng.sample(net.ids, n_subs)
        for node in nodes:
            net.run(node, net.nodes[node].subscribe(cs))
        net.delivered.clear()
        before = net.messages
        for atom, eid in ((g1[0], 1), (g2[0], 2)):
            p = net.producer(atom)
            net.run(p, net.nodes[p].publish_atom(atom, eid))
        ours = net.messages - before
        assert all(any({1, 2} <= set(ev) for ev in net.delivered[(n, cs)]) for n in nodes)
        chord = 2 + 2 + n_subs  # atoms -> element nodes -> composite node -> subscribers
        edges: set[tuple[int, int, str]] = set()
        pa, pc = net.producer(g1[0]), net.producer(g2[0])
        for node in nodes:
            path_a, path_c = tree.path(pa, node), tree.path(pc, node)
            on_c = set(path_c)
            m = next(x for x in path_a if x in on_c)  # where the two events meet toward node
            ia, ic = path_a.index(m), path_c.index(m)
            edges.update((u, v, "a") for u, v in pairwise(path_a[: ia + 1]))
            edges.update((u, v, "c") for u, v in pairwise(path_c[: ic + 1]))
            edges.update((u, v, "ac") for u, v in pairwise(path_a[ia:]))
        static = len(edges)
        for key, v in (("ours", ours), ("chord", chord), ("static", static)):
            out[key].append(v)
        print(
            f"fig 12 {n_subs} subscribers: messages ours {ours}, chord {chord}, static {static}", flush=True
        )
    return out


# ---------------------------------------------------------------- plots
def plot(results: dict[str, Any], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    specs = {
        "9": ("rates", "node failure rate", "CELR", ("ours_before", "ours_after", "static", "chord")),
        "10": ("subs", "composite subscriptions", "stored entries (AST + CSGT)", ("ours", "chord", "static")),
        "11": (
            "k",
            "composite subscriptions per node (k)",
            "messages per composite subscription",
            ("ours", "chord", "static"),
        ),
        "12": (
            "subscribers",
            "interested subscribers",
            "messages per composite event",
            ("ours", "chord", "static"),
        ),
    }
    for fig, r in results.items():
        xk, xl, yl, series = specs[fig]
        plt.figure(figsize=(5, 3.4))
        for s in series:
            plt.plot(r[xk], r[s], marker="o", label=s.replace("_", " "))
        plt.xlabel(xl)
        plt.ylabel(yl)
        plt.title(f"seed 001 Fig {fig} (simulated, {results.get('nodes', '')})".replace(" ()", ""))
        plt.legend()
        plt.tight_layout()
        plt.savefig(out_dir / f"fig{fig}.png", dpi=110)
        plt.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fig", default="all", help="9, 10, 11, 12 or all")
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--alpha", type=int, default=10)
    ap.add_argument("--subs", type=int, default=2000, help="composite subscriptions for Fig 9")
    ap.add_argument("--trials", type=int, default=300, help="composite events per failure rate (Fig 9)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    ap.add_argument("--out", default=str(IMG / "sim.json"))
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.subs, args.trials = min(args.nodes, 64), min(args.subs, 100), min(args.trials, 30)
        args.alpha = min(args.alpha, 4)
    figs = ["9", "10", "11", "12"] if args.fig == "all" else args.fig.split(",")
    run = {"9": fig9, "10": fig10, "11": fig11, "12": fig12}
    results: dict[str, Any] = {}
    for f in figs:
        t0 = time.perf_counter()
        results[f] = run[f](args)
        print(f"fig {f}: {time.perf_counter() - t0:.0f} s", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), **results}, indent=1))
    if not args.no_plots:
        plot(results, Path(args.out).parent)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
