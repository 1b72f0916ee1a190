"""The writer's transactions never separate a composite journal row from the store writes of
the composite events its offer produced (``_store._batches``; docs/composite.md, "What
persists"): the components an event consumed and the event's stored messages commit together.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.durability._store import _batches, _Op


@st.composite
def op_lists(draw: st.DrawFn) -> list[_Op]:
    """Plain operations with composite rows in between, each claiming 0..6 writes before it."""
    ops: list[_Op] = []
    for _ in range(draw(st.integers(0, 60))):
        if draw(st.integers(0, 3)) == 0:
            writes = draw(st.integers(0, 6))
            ops.append(("composite", (len(ops), 1, 0.0, "t", b"", 0, "t", writes)))
        else:
            ops.append(("dropped", ("c", len(ops))))
    return ops


@given(op_lists(), st.integers(1, 12))
def test_batches_keep_each_span_whole(ops: list[_Op], max_batch: int) -> None:
    batches = _batches(ops, max_batch)
    assert [op for b in batches for op in b] == ops  # everything, in order, once
    assert all(batches) or ops == []
    where: list[int] = []  # batch number of each operation
    for n, b in enumerate(batches):
        where += [n] * len(b)
    for i, (name, args) in enumerate(ops):
        if name == "composite":
            lo = max(0, i - args[7])
            assert len(set(where[lo : i + 1])) == 1, (i, args[7], [len(b) for b in batches])
    # a batch is longer than max_batch only to hold a span that would have been cut
    for n, b in enumerate(batches):
        if len(b) > max_batch:
            end = where.index(n) + len(b) - 1
            assert ops[end][0] == "composite" and ops[end][1][7] > 0


def test_small_lists_are_one_batch() -> None:
    ops: list[_Op] = [("dropped", ("c", 1)), ("composite", (1, 1, 0.0, "t", b"", 0, "t", 1))]
    assert _batches(ops, 10) == [ops]
    assert _batches([], 10) == []  # an empty round commits nothing
