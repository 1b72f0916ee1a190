"""Decomposition with sharing (seed 001 section 4.1-4.3, Fig. 3-7): the element table.

``decomposeSub`` (Fig. 6) splits a composite subscription along its syntax: ``(A|B)&C`` into
the composite element ``A|B`` and the atom ``C``, and ``A|B`` in turn into ``A`` and ``B``.
Here every *element* — an atom (:class:`AtomElement`, the paper's ``Asub`` in the AST) or a
composite element (:class:`OpElement`, a ``Csub`` in a CSGT) — is stored once, keyed by its
canonical text (:mod:`composite._syntax`), and carries a reference count: the number of
parents that use it, a parent being a composite element (each distinct operand counted once)
or a composite subscription whose root it is.  ``(A|B)&C`` and ``(A|B)&D`` therefore share
``A|B``, ``A`` and ``B`` (Fig. 5: an existing entry gains a user instead of a new entry).

:meth:`ElementTable.acquire` creates what is missing (a new atom is reported so the broker
indexes it) and :meth:`ElementTable.release` removes an element only when its count drops to
zero, then releases its operands (Fig. 7: "an element is unsubscribed only when it appears
in no other entry's Elements").  Both are O(number of elements created or removed + 1):
acquiring an existing element stops at it.

Shapes: a composite subscription is evaluated over its distinct atoms, numbered in canonical
order; its *shape* is the expression with atoms replaced by those numbers (``(0|1)&(2|3)``
for every subscription of the paper's workload).  :func:`shape_of` compiles a shape once into
a predicate ``sat(cursors, atoms, limit)`` that tests "atom i has a live buffered instance"
inline, and a function ``witness`` that lists the atoms an event consumes (the maximal
witness, docs/composite.md); both are generated Python, compiled once per shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import content
from composite._syntax import Atom, Expr, Op

__all__ = [
    "AtomElement",
    "AtomInfo",
    "ElementTable",
    "OpElement",
    "SatFn",
    "Shape",
    "WitFn",
    "shape_of",
    "tree_size",
]


class AtomInfo:
    """What the broker needs to index an atom: its id, canonical text, topic filter and
    selector (text and compiled filter, ``None`` without one).  Immutable."""

    __slots__ = ("element", "filter", "id", "selector", "topic_filter")

    id: int
    element: str
    topic_filter: str
    selector: str | None
    filter: content.Filter | None

    def __init__(self, atom_id: int, atom: Atom) -> None:
        self.id = atom_id
        self.element = atom.text
        self.topic_filter = atom.topic
        self.selector = atom.selector
        self.filter = atom.filter

    def __repr__(self) -> str:
        return f"AtomInfo({self.id}, {self.element!r})"


class AtomElement:
    """An atom stored once, with the shared log of the components offered to it.

    The log holds the components of sequence numbers ``start .. end-1`` (``comps``) and their
    arrival times (``arr``, non-decreasing); ``last`` is the newest arrival (-inf before the
    first).  ``groups`` are the per-(window, cap) user groups of :mod:`composite._engine`;
    ``kmax``/``wmax`` the largest cap and window among them (what the log must keep).
    """

    __slots__ = (
        "arr",
        "comps",
        "end",
        "expr",
        "groups",
        "info",
        "kmax",
        "last",
        "refs",
        "start",
        "text",
        "wmax",
    )

    def __init__(self, atom_id: int, expr: Atom) -> None:
        self.expr = expr
        self.text = expr.text
        self.info = AtomInfo(atom_id, expr)
        self.refs = 1
        self.start = 0
        self.end = 0
        self.arr: list[float] = []
        self.comps: list[Any] = []  # composite._event.Component
        self.last = float("-inf")
        self.groups: list[Any] = []  # composite._engine._Group
        self.kmax = 0
        self.wmax = 0.0


class OpElement:
    """A composite element (``&`` or ``|`` over distinct operand elements), stored once."""

    __slots__ = ("children", "expr", "refs")

    def __init__(self, expr: Op, children: tuple[AtomElement | OpElement, ...]) -> None:
        self.expr = expr
        self.children = children
        self.refs = 1


Element = AtomElement | OpElement


class ElementTable:
    """Every element by canonical text, with reference counts; atoms also by id."""

    __slots__ = ("atoms", "elements", "next_id")

    def __init__(self) -> None:
        self.elements: dict[str, Element] = {}
        self.atoms: dict[int, AtomElement] = {}
        self.next_id = 1

    def acquire(self, expr: Expr, added: list[AtomInfo]) -> Element:
        """One more use of ``expr``'s element, creating it (and its operands) if missing;
        atoms created are appended to ``added``.  O(elements created + 1)."""
        el = self.elements.get(expr.text)
        if el is not None:
            el.refs += 1
            return el
        if isinstance(expr, Atom):
            atom = AtomElement(self.next_id, expr)
            self.next_id += 1
            self.atoms[atom.info.id] = atom
            added.append(atom.info)
            new: Element = atom
        else:
            children = tuple(self.acquire(x, added) for x in expr.operands)
            # the stored expression is rebuilt over the stored operands: one object per element
            new = OpElement(Op(expr.op, tuple(c.expr for c in children), expr.text), children)
        self.elements[expr.text] = new
        return new

    def release(self, el: Element, removed: list[AtomInfo]) -> None:
        """One use fewer; an element whose count reaches zero is removed and releases its
        operands; removed atoms are appended to ``removed``.  O(elements removed + 1)."""
        el.refs -= 1
        if el.refs:
            return
        del self.elements[el.expr.text]
        if isinstance(el, AtomElement):
            del self.atoms[el.info.id]
            removed.append(el.info)
        else:
            for child in el.children:
                self.release(child, removed)

    def atom(self, text: str) -> AtomElement:
        el = self.elements[text]
        assert isinstance(el, AtomElement)
        return el

    def count_composites(self) -> int:
        return len(self.elements) - len(self.atoms)

    def _check(self, roots: Sequence[Element]) -> None:
        """Reference counts equal the uses by operands and roots; nothing unreachable."""
        uses: dict[str, int] = {}
        for el in self.elements.values():
            assert self.elements.get(el.expr.text) is el
            if isinstance(el, OpElement):
                assert len({c.expr.text for c in el.children}) == len(el.children)
                for c in el.children:
                    assert self.elements.get(c.expr.text) is c, "operand not in the table"
                    uses[c.expr.text] = uses.get(c.expr.text, 0) + 1
            else:
                assert self.atoms.get(el.info.id) is el
        for r in roots:
            assert self.elements.get(r.expr.text) is r, "root not in the table"
            uses[r.expr.text] = uses.get(r.expr.text, 0) + 1
        for text, el in self.elements.items():
            assert el.refs == uses.get(text, 0) > 0, f"refcount of {text!r}: {el.refs} != {uses.get(text, 0)}"
        assert len(self.atoms) == sum(isinstance(e, AtomElement) for e in self.elements.values())


def tree_size(expr: Expr) -> int:
    """Elements of ``expr``'s decomposition without sharing (operators + atom occurrences):
    7 for ``(A|B)&(C|D)``, the paper's m + n."""
    if isinstance(expr, Atom):
        return 1
    return 1 + sum(tree_size(x) for x in expr.operands)


# ---------------------------------------------------------------- shapes

Shape = int | tuple[str, tuple["Shape", ...]]
SatFn = Callable[[list[int], tuple[AtomElement, ...], float], bool]
WitFn = Callable[[list[int], tuple[AtomElement, ...], float], list[int]]

_CACHE: dict[str, tuple[SatFn, WitFn]] = {}


def _shape(expr: Expr, index: dict[str, int]) -> Shape:
    if isinstance(expr, Atom):
        return index[expr.text]
    return (expr.op, tuple(_shape(x, index) for x in expr.operands))


def _source(shape: Shape) -> str:
    if isinstance(shape, int):
        i = shape
        return f"(c[{i}] < a[{i}].end and a[{i}].last >= lim)"
    op, kids = shape
    return "(" + (" and " if op == "&" else " or ").join(_source(k) for k in kids) + ")"


def _present(shape: Shape) -> str:
    """Satisfaction over precomputed presence variables p0, p1, ..."""
    if isinstance(shape, int):
        return f"p{shape}"
    op, kids = shape
    return "(" + (" and " if op == "&" else " or ").join(_present(k) for k in kids) + ")"


def _leaves(shape: Shape) -> list[int]:
    if isinstance(shape, int):
        return [shape]
    return [i for k in shape[1] for i in _leaves(k)]


def _emit(shape: Shape, indent: str, lines: list[str]) -> None:
    """Statements appending the maximal witness of a satisfied ``shape`` to r."""
    if isinstance(shape, int):
        lines.append(f"{indent}r.append({shape})")
        return
    op, kids = shape
    for k in kids:
        if op == "&":
            _emit(k, indent, lines)
        elif isinstance(k, int):
            lines.append(f"{indent}if p{k}: r.append({k})")
        else:
            lines.append(f"{indent}if {_present(k)}:")
            _emit(k, indent + "    ", lines)


def _witness_source(shape: Shape) -> str:
    leaves = _leaves(shape)
    lines = ["def witness(c, a, lim):"]
    lines += [f"    x = a[{i}]; p{i} = c[{i}] < x.end and x.last >= lim" for i in sorted(set(leaves))]
    lines.append("    r = []")
    _emit(shape, "    ", lines)
    lines.append("    return sorted(set(r))" if len(set(leaves)) < len(leaves) else "    r.sort(); return r")
    return "\n".join(lines)


def shape_of(expr: Expr, atoms: Sequence[Atom]) -> tuple[SatFn, WitFn]:
    """The two compiled functions of ``expr``'s shape over ``atoms`` (generated Python from
    integers and the two operators only, cached per shape).

    ``sat(cursors, atom_elements, limit)`` is true iff the expression holds when atom i counts
    as present exactly when ``cursors[i] < atom.end`` (an unconsumed instance) and
    ``atom.last >= limit`` (the newest one is inside the window); it short-circuits.
    ``witness(cursors, atom_elements, limit)`` returns the sorted indices of the atoms a
    satisfied expression consumes: every operand of an ``&``, every satisfied operand of an
    ``|`` (the maximal witness).  O(size of the shape).
    """
    shape = _shape(expr, {a.text: i for i, a in enumerate(atoms)})
    key = repr(shape)
    fns = _CACHE.get(key)
    if fns is None:
        sat = eval(f"lambda c, a, lim: {_source(shape)}")
        scope: dict[str, Any] = {}
        exec(_witness_source(shape), scope)
        fns = _CACHE[key] = (sat, scope["witness"])
    return fns
