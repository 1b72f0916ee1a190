"""The composite-subscription language: tokenizer, parser, validation and canonical form.

Grammar (seed 001 section 1 writes subscriptions like ``(A|B)&C``; ``&`` binds tighter than
``|``; whitespace between tokens is ignored)::

    expression := or
    or         := and ( '|' and )*
    and        := unary ( '&' unary )*
    unary      := '(' or ')' | atom
    atom       := topic [ '[' selector ']' ]
    topic      := bare | '"' ( any character but '"' | '""' )* '"'
                       | "'" ( any character but "'" | "''" )* "'"
    bare       := one or more characters other than whitespace and  & | ( ) [ ] " '

A *topic* is an MQTT topic filter (checked by :func:`topics.validate_filter`); one that
contains a space, ``&``, ``|``, a parenthesis, a bracket or a quote is written quoted, the
quote character doubled inside (``"a b/(x)"``, ``'it''s/#'``).  A *selector* is the content
selector language of :func:`content.compile`; it ends at the first ``]`` outside its quoted
strings and names, so ``x[name = 'a]b']`` works.  Filters starting with ``$share/``,
``$filter/`` or ``$composite/`` are refused (use the bracket selector; shared and nested
composite atoms are not part of the language).

Canonical form (what :func:`parse` returns and :func:`canonical` prints):

* an atom's selector is replaced by its normal form (``content.compile`` then
  ``content.format_filter``), so ``a[x>1]`` and ``a[1 < x]`` are one atom; a selector whose
  normal form is always true is dropped;
* nested ``&`` in ``&`` and ``|`` in ``|`` are flattened (associativity), operands are sorted
  by their canonical text (commutativity) and duplicates removed (idempotence: ``A & A`` is
  ``A``); an operator left with one operand is that operand;
* printing: a bare topic when it needs no quotes, else double-quoted; operators with one space
  either side; every operand that is itself an operator is parenthesised (``(a | b) & c``).

``parse(canonical(t)) == parse(t)`` and ``canonical(canonical(t)) == canonical(t)``.  No other
law is applied (no distribution, no absorption: ``A | (A & B)`` stays as written).

Limits (each raises :class:`CompositeSyntaxError`): :data:`MAX_EXPRESSION_LENGTH` characters
of source and of canonical text, :data:`MAX_ATOMS` atoms written, :data:`MAX_DEPTH` nested
parentheses in the source and in the canonical text.

Parsing is O(length of the text) plus the selectors' compilation (cached by ``content``);
:func:`parse` caches its results (LRU), expressions being immutable values.
"""

from __future__ import annotations

import functools
import re

import content
import topics

__all__ = [
    "MAX_ATOMS",
    "MAX_DEPTH",
    "MAX_EXPRESSION_LENGTH",
    "Atom",
    "CompositeSyntaxError",
    "Expr",
    "Op",
    "canonical",
    "parse",
]

MAX_EXPRESSION_LENGTH = 65_535
"""Longest expression text (source and canonical), in characters."""
MAX_ATOMS = 32
"""Most atoms an expression may write."""
MAX_DEPTH = 16
"""Deepest nesting of parentheses (in the source and in the canonical text)."""

_REFUSED_PREFIXES = ("$share/", "$filter/", "$composite/")


class CompositeSyntaxError(ValueError):
    """An expression that cannot be parsed or validated; ``position`` is the character offset."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position

    def __reduce__(self) -> tuple[type[CompositeSyntaxError], tuple[str, int]]:
        return (CompositeSyntaxError, (str(self), self.position))


# ---------------------------------------------------------------- canonical expressions


class Atom:
    """A topic filter with an optional (normalised) content selector.

    ``text`` is the canonical text; equality and hashing go by it.  ``filter`` is the compiled
    selector (``None`` without one).
    """

    __slots__ = ("filter", "selector", "text", "topic")

    topic: str
    selector: str | None
    filter: content.Filter | None
    text: str

    def __init__(self, topic: str, selector: str | None = None) -> None:
        """``selector`` is compiled and replaced by its normal form (``FilterSyntaxError``
        propagates); ``topic`` is not validated here (the parser does it)."""
        flt: content.Filter | None = None
        if selector is not None:
            flt = content.compile(selector)
            if any(not clause for clause in flt.clauses):
                flt = None  # always true: the same as no selector
            else:
                selector = content.format_filter(flt)
                if len(flt.clauses) == 1:
                    selector = selector[1:-1]  # one conjunction: no parentheses needed
                flt = content.compile(selector)
        self.topic = topic
        self.selector = selector if flt is not None else None
        self.filter = flt
        text = _quote(topic)
        if self.selector is not None:
            text += "[" + self.selector + "]"
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Atom) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Atom({self.text!r})"

    def atoms(self) -> tuple[Atom, ...]:
        return (self,)


class Op:
    """``&`` or ``|`` over two or more distinct operands in canonical order.

    Build with :func:`make_op`, which flattens, sorts and removes duplicates.
    """

    __slots__ = ("op", "operands", "text")

    op: str
    operands: tuple[Expr, ...]
    text: str

    def __init__(self, op: str, operands: tuple[Expr, ...], text: str | None = None) -> None:
        """``text``, when given, must be what would be computed (the engine passes it when it
        rebuilds an expression over its interned operands)."""
        assert op in ("&", "|") and len(operands) >= 2
        self.op = op
        self.operands = operands
        if text is None:
            text = f" {op} ".join(f"({x.text})" if isinstance(x, Op) else x.text for x in operands)
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Op) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Op({self.text!r})"

    def atoms(self) -> tuple[Atom, ...]:
        """The distinct atoms, sorted by canonical text."""
        seen: dict[str, Atom] = {}
        stack: list[Expr] = [self]
        while stack:
            x = stack.pop()
            if isinstance(x, Atom):
                seen[x.text] = x
            else:
                stack.extend(x.operands)
        return tuple(seen[t] for t in sorted(seen))


Expr = Atom | Op


def make_op(op: str, operands: list[Expr]) -> Expr:
    """The canonical ``op`` over ``operands``: flattened, sorted by text, duplicates removed."""
    flat: dict[str, Expr] = {}
    for x in operands:
        if isinstance(x, Op) and x.op == op:
            for y in x.operands:
                flat[y.text] = y
        else:
            flat[x.text] = x
    if len(flat) == 1:
        return next(iter(flat.values()))
    return Op(op, tuple(flat[t] for t in sorted(flat)))


def depth(x: Expr) -> int:
    """Nested parentheses in the canonical text of ``x``."""
    if isinstance(x, Atom):
        return 0
    inner = [depth(y) + 1 for y in x.operands if isinstance(y, Op)]
    return max(inner, default=0)


_BARE = re.compile(r"""[^\s&|()\[\]"']+""")


def _quote(topic: str) -> str:
    if _BARE.fullmatch(topic):
        return topic
    return '"' + topic.replace('"', '""') + '"'


# ---------------------------------------------------------------- parser


class _Parser:
    """Recursive descent straight over the text (no token list); positions are offsets."""

    __slots__ = ("atoms", "depth", "i", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.depth = 0
        self.atoms = 0

    def error(self, message: str, pos: int | None = None) -> CompositeSyntaxError:
        p = self.i if pos is None else pos
        return CompositeSyntaxError(f"{message} at {p}", p)

    def skip(self) -> str:
        """Skip whitespace; the next character ('' at the end)."""
        text, n = self.text, len(self.text)
        i = self.i
        while i < n and text[i].isspace():
            i += 1
        self.i = i
        return text[i] if i < n else ""

    def describe(self) -> str:
        ch = self.skip()
        return "end of input" if not ch else repr(ch)

    def parse(self) -> Expr:
        if not self.skip():
            raise self.error("empty expression: expected an atom")
        x = self.parse_or()
        ch = self.skip()
        if ch:
            if ch == ")":
                raise self.error("unbalanced ')'")
            raise self.error(f"expected '&', '|' or end of input but found {ch!r}")
        return x

    def parse_or(self) -> Expr:
        first = self.i
        args = [self.parse_and()]
        while self.skip() == "|":
            self.i += 1
            args.append(self.parse_and())
        if len(args) == 1:
            return args[0]
        return self.combine("|", args, first)

    def parse_and(self) -> Expr:
        first = self.i
        args = [self.parse_unary()]
        while self.skip() == "&":
            self.i += 1
            args.append(self.parse_unary())
        if len(args) == 1:
            return args[0]
        return self.combine("&", args, first)

    def combine(self, op: str, args: list[Expr], first: int) -> Expr:
        x = make_op(op, args)
        if depth(x) > MAX_DEPTH:
            raise self.error(f"expression nested more than {MAX_DEPTH} levels deep", first)
        return x

    def parse_unary(self) -> Expr:
        ch = self.skip()
        if ch == "(":
            open_at = self.i
            self.i += 1
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise self.error(f"parentheses nested more than {MAX_DEPTH} levels deep", open_at)
            if self.skip() == ")":
                raise self.error("expected an atom inside '('")
            x = self.parse_or()
            if self.skip() != ")":
                raise self.error(f"expected ')' to close '(' at {open_at} but found {self.describe()}")
            self.i += 1
            self.depth -= 1
            return x
        if not ch:
            raise self.error("expected an atom but found end of input")
        if ch in "&|)]":
            raise self.error(f"expected an atom but found {ch!r}")
        if ch == "[":
            raise self.error("expected a topic filter before '['")
        return self.parse_atom()

    def parse_atom(self) -> Atom:
        text = self.text
        start = self.i
        self.atoms += 1
        if self.atoms > MAX_ATOMS:
            raise self.error(f"more than {MAX_ATOMS} atoms", start)
        ch = text[start]
        offsets: list[int] | None = None  # source offset of each character of a quoted topic
        if ch in "\"'":
            topic, offsets, self.i = _unquote(text, start)
        else:
            m = _BARE.match(text, start)
            assert m is not None
            topic, self.i = m.group(), m.end()
        _check_topic(topic, start, offsets)
        selector: str | None = None
        if self.skip() == "[":
            sel_at = self.i + 1
            end = _selector_end(text, self.i)
            selector = text[sel_at:end]
            self.i = end + 1
            if not selector.strip():
                raise self.error("empty selector inside '[ ]'", sel_at)
            try:
                atom = Atom(topic, selector)
            except content.FilterSyntaxError as exc:
                raise CompositeSyntaxError(
                    f"bad selector: {_strip_at(str(exc))} at {sel_at + exc.position}", sel_at + exc.position
                ) from None
        else:
            atom = Atom(topic)
        return atom


def _strip_at(message: str) -> str:
    """``content`` messages end with ``at N`` (selector-relative); drop it, we add ours."""
    return re.sub(r" at \d+$", "", message)


def _unquote(text: str, start: int) -> tuple[str, list[int], int]:
    """Read the quoted topic at ``start``; (topic, source offset per topic character, end)."""
    q = text[start]
    parts: list[str] = []
    offsets: list[int] = []
    i, n = start + 1, len(text)
    while True:
        j = text.find(q, i)
        if j < 0:
            raise CompositeSyntaxError(f"unterminated quoted topic filter starting at {start}", start)
        parts.append(text[i:j])
        offsets.extend(range(i, j))
        if j + 1 < n and text[j + 1] == q:
            parts.append(q)
            offsets.append(j)
            i = j + 2
            continue
        return "".join(parts), offsets, j + 1


def _check_topic(topic: str, start: int, offsets: list[int] | None) -> None:
    def at(p: int | None) -> int:
        if p is None:
            return start
        if offsets is None:
            return start + p
        return offsets[p] if p < len(offsets) else start

    for prefix in _REFUSED_PREFIXES:
        if topic.startswith(prefix):
            raise CompositeSyntaxError(
                f"topic filter {topic[:40]!r} starts with {prefix!r}, which an atom may not use at {start}",
                start,
            )
    try:
        topics.validate_filter(topic)
    except topics.InvalidTopic as exc:
        pos = at(exc.position)
        raise CompositeSyntaxError(f"bad topic filter: {exc} (at {pos})", pos) from None


def _selector_end(text: str, open_at: int) -> int:
    """Offset of the ']' closing the selector opened at ``open_at`` (quotes respected)."""
    i, n = open_at + 1, len(text)
    while i < n:
        ch = text[i]
        if ch == "]":
            return i
        if ch in "'\"":
            j = i + 1
            while True:
                j = text.find(ch, j)
                if j < 0:
                    what = "string" if ch == "'" else "quoted name"
                    raise CompositeSyntaxError(f"unterminated {what} in selector starting at {i}", i)
                if j + 1 < n and text[j + 1] == ch:
                    j += 2
                    continue
                break
            i = j + 1
            continue
        i += 1
    raise CompositeSyntaxError(f"'[' at {open_at} is never closed by ']'", open_at)


@functools.lru_cache(maxsize=4096)
def parse(text: str) -> Expr:
    """Parse, validate and canonicalise ``text``; raises :class:`CompositeSyntaxError`.

    O(len(text)) plus selector compilation; results are cached.
    """
    if not isinstance(text, str):
        raise TypeError(f"expression must be a str, not {type(text).__name__}")
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise CompositeSyntaxError(f"expression longer than {MAX_EXPRESSION_LENGTH} characters at 0", 0)
    x = _Parser(text).parse()
    if len(x.text) > MAX_EXPRESSION_LENGTH:
        raise CompositeSyntaxError(
            f"canonical form longer than {MAX_EXPRESSION_LENGTH} characters (selectors expand) at 0", 0
        )
    return x


def canonical(text: str) -> str:
    """The canonical text of ``text`` (see the module docstring)."""
    return parse(text).text
