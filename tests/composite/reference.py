"""Brute-force reference of the composite semantics of docs/composite.md, written from the
documentation and independently of the engine: every composite subscription holds real
per-atom deques; every offer first expires everything everywhere, then appends to every
subscription using the atom (dropping the oldest over the cap), then evaluates every such
subscription's expression recursively and consumes the maximal witness.  No sharing, no
cursors, no laziness.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

from composite import Atom, Component, Expr, Op, parse

Instance = tuple[float, Component]  # (arrival, component)
EventKey = tuple[object, ...]


def present_holds(expr: Expr, present: set[str]) -> bool:
    if isinstance(expr, Atom):
        return expr.text in present
    results = [present_holds(x, present) for x in expr.operands]
    return all(results) if expr.op == "&" else any(results)


def maximal_witness(expr: Expr, present: set[str]) -> set[str]:
    """Atoms consumed: all operands of '&', each satisfied operand of '|'."""
    if isinstance(expr, Atom):
        return {expr.text}
    out: set[str] = set()
    for x in expr.operands:
        if expr.op == "&" or present_holds(x, present):
            out |= maximal_witness(x, present)
    assert isinstance(expr, Op)
    return out


class RefSub:
    def __init__(self, expr: Expr, window: float, cap: int, partition: int = 0) -> None:
        self.expr = expr
        self.window = window
        self.cap = cap
        self.partition = partition
        self.subscribers: dict[Hashable, int] = {}
        self.buffers: dict[str, deque[Instance]] = {a.text: deque() for a in expr.atoms()}
        self.events = 0
        self.dropped = 0
        self.expired = 0


class Reference:
    def __init__(self, window: float, cap: int) -> None:
        self.window = window
        self.cap = cap
        self.clock = float("-inf")
        self.subs: dict[tuple[str, float, int, int], RefSub] = {}
        self.by_key: dict[Hashable, RefSub] = {}
        self.events = 0
        self.gone_dropped = 0
        self.gone_expired = 0

    def subscribe(
        self, key: Hashable, text: str, qos: int, window: float | None, cap: int | None, partition: int = 0
    ) -> None:
        """Keys share a composite subscription iff expression, window, cap and partition
        are equal."""
        expr = parse(text)
        w = float(self.window if window is None else window)
        k = self.cap if cap is None else cap
        skey = (expr.text, w, k, partition)
        old = self.by_key.pop(key, None)
        if old is not None:
            del old.subscribers[key]
            if not old.subscribers and old is not self.subs.get(skey):
                self._gone(old)
        sub = self.subs.get(skey)  # the same subscription keeps its buffers
        if sub is None:
            sub = self.subs[skey] = RefSub(expr, w, k, partition)
        sub.subscribers[key] = qos
        self.by_key[key] = sub

    def _gone(self, sub: RefSub) -> None:
        del self.subs[(sub.expr.text, sub.window, sub.cap, sub.partition)]
        self.gone_dropped += sub.dropped
        self.gone_expired += sub.expired

    def unsubscribe(self, key: Hashable) -> bool:
        sub = self.by_key.pop(key, None)
        if sub is None:
            return False
        del sub.subscribers[key]
        if not sub.subscribers:
            self._gone(sub)
        return True

    def advance(self, now: float) -> None:
        self.clock = max(self.clock, now)
        for sub in self.subs.values():
            limit = self.clock - sub.window
            for buf in sub.buffers.values():
                while buf and buf[0][0] < limit:
                    buf.popleft()
                    sub.expired += 1

    def offer(self, atom: str, component: Component, now: float) -> list[EventKey]:
        self.advance(now)
        users = [s for s in self.subs.values() if atom in s.buffers]
        for sub in users:
            buf = sub.buffers[atom]
            buf.append((self.clock, component))
            if len(buf) > sub.cap:
                buf.popleft()
                sub.dropped += 1
        out: list[EventKey] = []
        for sub in users:
            present = {a for a, buf in sub.buffers.items() if buf}
            if not present_holds(sub.expr, present):
                continue
            parts = []
            for a in sorted(maximal_witness(sub.expr, present)):
                t, c = sub.buffers[a].popleft()
                parts.append((t, a, c))
            parts.sort(key=lambda p: p[0])
            sub.events += 1
            self.events += 1
            qmin = min(c.qos for _, _, c in parts)
            out.append(
                (
                    sub.expr.text,
                    tuple(sorted((repr(k), min(q, qmin)) for k, q in sub.subscribers.items())),
                    tuple((a, c.topic, c.payload, c.qos, t) for t, a, c in parts),
                    parts[0][0],
                    parts[-1][0],
                )
            )
        return out
