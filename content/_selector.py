"""The selector language: tokenizer, recursive-descent parser and normalisation to DNF.

Grammar (docs/reference.md, "content"; keywords case-insensitive)::

    selector   := or
    or         := and ( OR and )*
    and        := unary ( AND unary )*
    unary      := NOT unary | '(' or ')' | comparison
    comparison := ident cmp literal | literal cmp ident
                | ident [NOT] BETWEEN literal AND literal
                | ident [NOT] IN '(' literal ( ',' literal )* ')'
                | ident [NOT] LIKE 'pattern' [ ESCAPE 'c' ]
    cmp        := '=' | '<>' | '!=' | '<' | '<=' | '>' | '>='
    ident      := name ( '.' segment )*  |  "quoted name" (a doubled " escapes it)
    literal    := [+|-] integer | [+|-] float (1.5, .5, 1e-3) | 'string' ('' escapes) | TRUE | FALSE

Normalisation (what :func:`compile` returns, see :mod:`content._predicate` for the semantics):

* ``NOT`` is pushed into the atoms with the negated operators (De Morgan holds in SQL's
  Kleene logic, and a negated atom is false on unknown, so the result is exact);
* ``BETWEEN`` becomes two bounds, ``NOT BETWEEN`` their negation (``<`` or ``>``);
* ``IN`` lists are split by literal kind (``x IN (1, 'a')`` is ``x IN (1) OR x IN ('a')``,
  and ``NOT IN`` the conjunction of the negations, which SQL makes unknown = false for a
  mixed list); a one-member list is ``=`` (``<>`` when negated);
* ``LIKE`` patterns are classified: ``'abc%'`` prefix, ``'%abc'`` suffix, ``'%abc%'``
  substring, no wildcard ``=``, anything else a general pattern; ``ESCAPE`` is accepted when
  the result is one of the first four forms (a general pattern cannot hold a literal % or _);
* the formula is expanded to a disjunction of conjunctions; identical predicates and
  conjunctions are stored once (seed 000, Theorem 2), a conjunction that is a superset of
  another is dropped (absorption) and one that needs two kinds of the same attribute (never
  true) is dropped.

Limits (each raises :class:`FilterSyntaxError`): :data:`MAX_SELECTOR_LENGTH` characters,
:data:`MAX_DEPTH` nested parentheses/NOTs, :data:`MAX_CLAUSES` conjunctions in the normal
form or in any intermediate product while expanding it.

:func:`compile` caches its results (``functools.lru_cache``): the broker compiles the same
selectors again and again, and a :class:`~content._filter.Filter` is immutable.
:func:`format_filter` prints a filter back as selector text (normalisation is stable:
``compile(format_filter(compile(s)))`` has the same clauses).
"""

from __future__ import annotations

import enum
import functools
import math
import re
from dataclasses import dataclass

from content._filter import Clause, Filter
from content._predicate import Kind, Op, Predicate, Scalar, Value, kind_of

__all__ = [
    "MAX_CLAUSES",
    "MAX_DEPTH",
    "MAX_SELECTOR_LENGTH",
    "FilterSyntaxError",
    "compile",
    "format_filter",
]

MAX_CLAUSES = 256
"""Most conjunctions a filter's DNF (or any intermediate product) may have."""
MAX_DEPTH = 64
"""Deepest nesting of parentheses and NOTs."""
MAX_SELECTOR_LENGTH = 65536
"""Longest selector text, in characters."""


class FilterSyntaxError(ValueError):
    """A selector that cannot be parsed; ``position`` is the character offset."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position

    def __reduce__(self) -> tuple[type[FilterSyntaxError], tuple[str, int]]:
        return (FilterSyntaxError, (str(self), self.position))


# ---------------------------------------------------------------- tokenizer


class Tok(enum.Enum):
    IDENT = "identifier"
    NUMBER = "number"
    STRING = "string"
    CMP = "comparison"
    LPAREN = "'('"
    RPAREN = "')'"
    COMMA = "','"
    KEYWORD = "keyword"
    EOF = "end of input"


KEYWORDS = frozenset({"AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "TRUE", "FALSE"})


@dataclass(frozen=True, slots=True)
class Token:
    kind: Tok
    text: str  # source text (keywords upper-cased, identifiers unquoted)
    pos: int
    value: Scalar | None = None

    def describe(self) -> str:
        if self.kind is Tok.EOF:
            return "end of input"
        return repr(self.text)


_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*(?:\.[A-Za-z0-9_$]+)*")
_SPACE = re.compile(r"\s+")
_CMP_OPS = ("<>", "!=", "<=", ">=", "=", "<", ">")


def tokenize(text: str) -> list[Token]:  # noqa: C901, PLR0912 (one case per token class)
    """Split ``text`` into tokens; O(len(text))."""
    out: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            m = _SPACE.match(text, i)
            assert m is not None
            i = m.end()
            continue
        if ch == "(":
            out.append(Token(Tok.LPAREN, ch, i))
            i += 1
        elif ch == ")":
            out.append(Token(Tok.RPAREN, ch, i))
            i += 1
        elif ch == ",":
            out.append(Token(Tok.COMMA, ch, i))
            i += 1
        elif ch in "'\"":
            j, s = _quoted(text, i)
            if ch == "'":
                out.append(Token(Tok.STRING, text[i:j], i, s))
            else:
                if not s:
                    raise FilterSyntaxError(f"empty quoted name at {i}", i)
                out.append(Token(Tok.IDENT, s, i))
            i = j
        elif ch.isdigit() or ch in "+-.":
            m = _NUMBER.match(text, i)
            if m is None:
                raise FilterSyntaxError(f"unexpected character {ch!r} at {i}", i)
            lit = m.group()
            j = m.end()
            if j < n and (text[j].isalnum() or text[j] in "_$."):
                raise FilterSyntaxError(f"malformed number {text[i : j + 1]!r} at {i}", i)
            value: Scalar = float(lit) if any(c in lit for c in ".eE") else int(lit)
            out.append(Token(Tok.NUMBER, lit, i, value))
            i = j
        elif ch in "<>=!":
            for op in _CMP_OPS:
                if text.startswith(op, i):
                    out.append(Token(Tok.CMP, op, i))
                    i += len(op)
                    break
            else:
                raise FilterSyntaxError(f"unexpected character {ch!r} (did you mean '<>'?) at {i}", i)
        else:
            m = _IDENT.match(text, i)
            if m is None:
                raise FilterSyntaxError(f"unexpected character {ch!r} at {i}", i)
            word = m.group()
            if word.upper() in KEYWORDS:
                up = word.upper()
                val: Scalar | None = {"TRUE": True, "FALSE": False}.get(up)
                out.append(Token(Tok.KEYWORD, up, i, val))
            else:
                out.append(Token(Tok.IDENT, word, i))
            i = m.end()
    out.append(Token(Tok.EOF, "", n))
    return out


def _quoted(text: str, start: int) -> tuple[int, str]:
    """Scan a quoted string or name starting at ``start``; the quote doubled escapes itself."""
    q = text[start]
    parts: list[str] = []
    i = start + 1
    n = len(text)
    while True:
        j = text.find(q, i)
        if j < 0:
            what = "string" if q == "'" else "quoted name"
            raise FilterSyntaxError(f"unterminated {what} starting at {start}", start)
        parts.append(text[i:j])
        if j + 1 < n and text[j + 1] == q:
            parts.append(q)
            i = j + 2
            continue
        return j + 1, "".join(parts)


# ---------------------------------------------------------------- syntax tree


@dataclass(frozen=True, slots=True)
class Atom:
    pred: Predicate


@dataclass(frozen=True, slots=True)
class Not:
    arg: Node
    pos: int


@dataclass(frozen=True, slots=True)
class And:
    args: tuple[Node, ...]
    pos: int


@dataclass(frozen=True, slots=True)
class Or:
    args: tuple[Node, ...]
    pos: int


Node = Atom | Not | And | Or

_FLIP = {"=": "=", "<>": "<>", "!=": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_CMP_TO_OP = {"=": Op.EQ, "<>": Op.NE, "!=": Op.NE, "<": Op.LT, "<=": Op.LE, ">": Op.GT, ">=": Op.GE}


class Parser:
    """Recursive descent over the token list; each method documents its production."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = tokenize(text)
        self.i = 0
        self.depth = 0

    def cur(self) -> Token:
        return self.toks[self.i]

    def advance(self) -> Token:
        t = self.toks[self.i]
        if t.kind is not Tok.EOF:
            self.i += 1
        return t

    def keyword(self, word: str) -> bool:
        t = self.cur()
        if t.kind is Tok.KEYWORD and t.text == word:
            self.i += 1
            return True
        return False

    def error(self, message: str, tok: Token | None = None) -> FilterSyntaxError:
        t = tok or self.cur()
        return FilterSyntaxError(f"{message} at {t.pos}", t.pos)

    def parse(self) -> Node:
        if self.cur().kind is Tok.EOF:
            raise self.error("empty selector: expected a condition")
        node = self.parse_or()
        if self.cur().kind is not Tok.EOF:
            t = self.cur()
            if t.kind is Tok.RPAREN:
                raise self.error("unbalanced ')'")
            raise self.error(f"expected AND, OR or end of input but found {t.describe()}")
        return node

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"selector nested more than {MAX_DEPTH} levels deep")

    def parse_or(self) -> Node:
        first = self.cur().pos
        args = [self.parse_and()]
        while self.keyword("OR"):
            args.append(self.parse_and())
        return args[0] if len(args) == 1 else Or(tuple(args), first)

    def parse_and(self) -> Node:
        first = self.cur().pos
        args = [self.parse_unary()]
        while self.keyword("AND"):
            args.append(self.parse_unary())
        return args[0] if len(args) == 1 else And(tuple(args), first)

    def parse_unary(self) -> Node:
        t = self.cur()
        if t.kind is Tok.KEYWORD and t.text == "NOT":
            self.advance()
            self.enter()
            arg = self.parse_unary()
            self.depth -= 1
            return Not(arg, t.pos)
        if t.kind is Tok.LPAREN:
            self.advance()
            self.enter()
            if self.cur().kind is Tok.RPAREN:
                raise self.error("expected a condition inside '('")
            node = self.parse_or()
            self.depth -= 1
            if self.cur().kind is not Tok.RPAREN:
                raise self.error(f"expected ')' to close '(' at {t.pos} but found {self.cur().describe()}")
            self.advance()
            return node
        return self.parse_comparison()

    def literal(self, after: str) -> tuple[Scalar, Token]:
        t = self.cur()
        if t.kind in (Tok.NUMBER, Tok.STRING) or (t.kind is Tok.KEYWORD and t.text in ("TRUE", "FALSE")):
            self.advance()
            assert t.value is not None
            return t.value, t
        raise self.error(f"expected a value after {after} but found {t.describe()}")

    def parse_comparison(self) -> Node:
        t = self.cur()
        if t.kind is Tok.IDENT:
            self.advance()
            return self.parse_predicate(t.text, t)
        if t.kind in (Tok.NUMBER, Tok.STRING) or (t.kind is Tok.KEYWORD and t.text in ("TRUE", "FALSE")):
            value, _ = self.literal("start")
            op = self.cur()
            if op.kind is not Tok.CMP:
                raise self.error(
                    f"expected a comparison operator after the value {t.text!r} but found {op.describe()}"
                )
            self.advance()
            rhs = self.cur()
            if rhs.kind is not Tok.IDENT:
                if rhs.kind in (Tok.NUMBER, Tok.STRING) or rhs.text in ("TRUE", "FALSE"):
                    raise self.error("a comparison needs an attribute name on one side, not two values")
                raise self.error(f"expected an attribute name after {op.text!r} but found {rhs.describe()}")
            self.advance()
            return Atom(self.comparison(rhs.text, _FLIP[op.text], value, op, t))
        raise self.error(f"expected a condition but found {t.describe()}")

    def parse_predicate(self, attr: str, at: Token) -> Node:
        t = self.cur()
        if t.kind is Tok.CMP:
            self.advance()
            if self.cur().kind is Tok.IDENT:
                raise self.error(
                    f"comparing two attributes ({attr!r} and {self.cur().text!r}) is not supported"
                )
            value, vt = self.literal(repr(t.text))
            return Atom(self.comparison(attr, t.text, value, t, vt))
        negated = self.keyword("NOT")
        w = self.cur()
        if w.kind is Tok.KEYWORD and w.text == "BETWEEN":
            self.advance()
            low, lt = self.literal("BETWEEN")
            if not self.keyword("AND"):
                raise self.error(
                    f"expected AND after the lower bound of BETWEEN but found {self.cur().describe()}"
                )
            high, ht = self.literal("BETWEEN ... AND")
            for v, vt in ((low, lt), (high, ht)):
                if kind_of(v) is Kind.BOOL:
                    raise self.error("BETWEEN needs numbers or strings, not booleans", vt)
            if kind_of(low) is not kind_of(high):
                raise self.error("BETWEEN bounds must both be numbers or both be strings", ht)
            node: Node = And(
                (Atom(Predicate.of(attr, Op.GE, low)), Atom(Predicate.of(attr, Op.LE, high))), w.pos
            )
        elif w.kind is Tok.KEYWORD and w.text == "IN":
            self.advance()
            node = self.parse_in(attr, w)
        elif w.kind is Tok.KEYWORD and w.text == "LIKE":
            self.advance()
            node = Atom(self.parse_like(attr, w))
        elif negated:
            raise self.error(f"expected BETWEEN, IN or LIKE after NOT but found {w.describe()}")
        else:
            raise self.error(f"expected a comparison operator after {attr!r} but found {w.describe()}")
        return Not(node, w.pos) if negated else node

    def comparison(self, attr: str, cmp: str, value: Scalar, op_tok: Token, value_tok: Token) -> Predicate:
        op = _CMP_TO_OP[cmp]
        if isinstance(value, bool) and op not in (Op.EQ, Op.NE):
            raise self.error(f"booleans can only be compared with = or <>, not {op_tok.text!r}", op_tok)
        return Predicate.of(attr, op, value)

    def parse_in(self, attr: str, at: Token) -> Node:
        if self.cur().kind is not Tok.LPAREN:
            raise self.error(f"expected '(' after IN but found {self.cur().describe()}")
        self.advance()
        members: list[Scalar] = []
        while True:
            v, _ = self.literal("'(' or ','" if members else "'('")
            members.append(v)
            if self.cur().kind is Tok.COMMA:
                self.advance()
                continue
            if self.cur().kind is Tok.RPAREN:
                self.advance()
                break
            raise self.error(f"expected ',' or ')' in the IN list but found {self.cur().describe()}")
        by_kind: dict[Kind, set[Scalar]] = {}
        for v in members:
            k = kind_of(v)
            assert k is not None
            by_kind.setdefault(k, set()).add(v)
        parts: list[Node] = []
        for k in (Kind.NUM, Kind.STR, Kind.BOOL):
            vals = by_kind.get(k)
            if vals is None:
                continue
            if len(vals) == 1:
                parts.append(Atom(Predicate.of(attr, Op.EQ, next(iter(vals)))))
            else:
                parts.append(Atom(Predicate(attr, Op.IN, frozenset(vals), Kind.SET)))
        return parts[0] if len(parts) == 1 else Or(tuple(parts), at.pos)

    def parse_like(self, attr: str, at: Token) -> Predicate:
        t = self.cur()
        if t.kind is not Tok.STRING:
            raise self.error(f"expected a 'pattern' after LIKE but found {t.describe()}")
        self.advance()
        assert isinstance(t.value, str)
        escape: str | None = None
        if self.keyword("ESCAPE"):
            e = self.cur()
            if e.kind is not Tok.STRING or not isinstance(e.value, str) or len(e.value) != 1:
                raise self.error("expected a one-character string after ESCAPE")
            self.advance()
            escape = e.value
        return like_predicate(attr, t.value, escape, t.pos)


def like_predicate(  # noqa: C901, PLR0912 (one case per LIKE pattern shape)
    attr: str, pattern: str, escape: str | None, pos: int
) -> Predicate:
    """Classify a LIKE pattern (see the module docstring)."""
    # segments: str (literal run) or "%" / "_" wildcard markers, as (is_wild, text)
    segs: list[tuple[bool, str]] = []
    lit: list[str] = []
    has_escaped_wild = False
    i = 0
    n = len(pattern)
    while i < n:
        ch = pattern[i]
        if escape is not None and ch == escape:
            if i + 1 >= n:
                raise FilterSyntaxError(f"LIKE pattern ends with the escape character at {pos}", pos)
            nxt = pattern[i + 1]
            if nxt in "%_":
                has_escaped_wild = True
            lit.append(nxt)
            i += 2
            continue
        if ch in "%_":
            if lit:
                segs.append((False, "".join(lit)))
                lit = []
            if not (ch == "%" and segs and segs[-1] == (True, "%")):
                segs.append((True, ch))
        else:
            lit.append(ch)
        i += 1
    if lit:
        segs.append((False, "".join(lit)))
    wild = [s for w, s in segs if w]
    lits = [s for w, s in segs if not w]
    if not wild:
        return Predicate.of(attr, Op.EQ, "".join(lits))
    if "_" not in wild and len(lits) <= 1:
        text = lits[0] if lits else ""
        shape = tuple(w for w, _ in segs)
        match shape:
            case (True,):
                return Predicate.of(attr, Op.PREFIX, "")
            case (False, True):
                return Predicate.of(attr, Op.PREFIX, text)
            case (True, False):
                return Predicate.of(attr, Op.SUFFIX, text)
            case (True, False, True):
                return Predicate.of(attr, Op.CONTAINS, text)
            case _:
                pass
    if has_escaped_wild:
        raise FilterSyntaxError(
            "a LIKE pattern with an escaped % or _ must be of the form "
            f"'abc%', '%abc', '%abc%' or 'abc' at {pos}",
            pos,
        )
    return Predicate.of(attr, Op.LIKE, "".join(s for _, s in segs))


# ---------------------------------------------------------------- DNF

_Conj = frozenset[Predicate]


def _pred_kind(p: Predicate) -> Kind:
    if p.kind is Kind.SET:
        assert isinstance(p.value, frozenset)
        k = kind_of(next(iter(p.value)))
        assert k is not None
        return k
    return p.kind


def _satisfiable(c: _Conj) -> bool:
    kinds: dict[str, Kind] = {}
    for p in c:
        k = _pred_kind(p)
        if kinds.setdefault(p.attr, k) is not k:
            return False
    return True


def _limit(count: int, pos: int) -> None:
    if count > MAX_CLAUSES:
        raise FilterSyntaxError(
            f"filter too complex: its normal form needs more than {MAX_CLAUSES} alternatives "
            f"(OR branches) at {pos}",
            pos,
        )


def _absorb(clauses: set[_Conj]) -> list[_Conj]:
    kept: list[_Conj] = []
    for c in sorted(clauses, key=len):
        if not any(k <= c for k in kept):
            kept.append(c)
    return kept


def _dnf(node: Node, neg: bool) -> list[_Conj]:
    """Disjunction of conjunctions of ``node`` (negated when ``neg``), absorbed."""
    match node:
        case Atom(pred):
            return [frozenset((pred.negate() if neg else pred,))]
        case Not(arg, _):
            return _dnf(arg, not neg)
        case And(args, pos) | Or(args, pos):
            conjunctive = isinstance(node, And) != neg
            parts = [_dnf(a, neg) for a in args]
            if not conjunctive:
                out = {c for part in parts for c in part}
                _limit(len(out), pos)
                return _absorb(out)
            acc: list[_Conj] = [frozenset()]
            for part in parts:
                if len(acc) * len(part) > MAX_CLAUSES * 16:
                    _limit(len(acc) * len(part), pos)
                prod = {a | b for a in acc for b in part}
                prod = {c for c in prod if _satisfiable(c)}
                _limit(len(prod), pos)
                acc = _absorb(prod)
            return acc
    raise AssertionError(node)


def _vkey(v: Value) -> tuple[object, ...]:
    if isinstance(v, frozenset):
        return tuple(sorted(_vkey(m) for m in v))
    if isinstance(v, bool):
        return (2, v)
    if isinstance(v, str):
        return (1, v)
    return (0, v)


def _pkey(p: Predicate) -> tuple[object, ...]:
    return (p.attr, p.op.value, p.kind.value, _vkey(p.value))


def normalise(node: Node) -> tuple[Clause, ...]:
    """The canonical DNF: predicates and clauses sorted, duplicates and absorbed clauses gone."""
    conjs = _dnf(node, False)
    clauses = [tuple(sorted(c, key=_pkey)) for c in conjs]
    clauses.sort(key=lambda cl: [_pkey(p) for p in cl])
    return tuple(clauses)


@functools.lru_cache(maxsize=8192)
def compile(selector: str) -> Filter:
    """Parse and normalise ``selector``; raises :class:`FilterSyntaxError` (with ``.position``)."""
    if not isinstance(selector, str):
        raise TypeError(f"selector must be a str, not {type(selector).__name__}")
    if len(selector) > MAX_SELECTOR_LENGTH:
        raise FilterSyntaxError(f"selector longer than {MAX_SELECTOR_LENGTH} characters at 0", 0)
    node = Parser(selector).parse()
    return Filter(selector, normalise(node))


# ---------------------------------------------------------------- printing


def _ident(name: str) -> str:
    m = _IDENT.fullmatch(name)
    if m is not None and name.upper() not in KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def _literal(v: Scalar) -> str:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    if isinstance(v, float):
        if math.isinf(v):
            return "1e999" if v > 0 else "-1e999"
        return repr(v)
    return str(v)


def _like(attr: str, neg: bool, before: str, text: str, after: str) -> str:
    kw = "NOT LIKE" if neg else "LIKE"
    if any(c in text for c in "%_\\"):
        esc = "".join("\\" + c if c in "%_\\" else c for c in text)
        return f"{attr} {kw} {_literal(before + esc + after)} ESCAPE '\\'"
    return f"{attr} {kw} {_literal(before + text + after)}"


def format_predicate(p: Predicate) -> str:
    """Selector text for one predicate (parses back to the same predicate)."""
    a = _ident(p.attr)
    v = p.value
    match p.op:
        case Op.EQ | Op.NE | Op.LT | Op.LE | Op.GT | Op.GE:
            assert not isinstance(v, frozenset)
            return f"{a} {p.op.value} {_literal(v)}"
        case Op.IN | Op.NOT_IN:
            assert isinstance(v, frozenset)
            kw = "IN" if p.op is Op.IN else "NOT IN"
            members = ", ".join(_literal(m) for m in sorted(v, key=_vkey))
            return f"{a} {kw} ({members})"
        case Op.LIKE | Op.NOT_LIKE:
            assert isinstance(v, str)
            return f"{a} {'LIKE' if p.op is Op.LIKE else 'NOT LIKE'} {_literal(v)}"
    assert isinstance(v, str)
    neg = p.op in (Op.NOT_PREFIX, Op.NOT_SUFFIX, Op.NOT_CONTAINS)
    if p.op in (Op.PREFIX, Op.NOT_PREFIX):
        return _like(a, neg, "", v, "%")
    if p.op in (Op.SUFFIX, Op.NOT_SUFFIX):
        return _like(a, neg, "%", v, "")
    return _like(a, neg, "%", v, "%")


def format_filter(f: Filter) -> str:
    """The normal form of ``f`` as selector text; a filter with no clause prints as an
    unsatisfiable selector, one with an empty clause is not expressible (ValueError)."""
    if not f.clauses:
        return "x = 0 AND x = 'never'"
    if any(not c for c in f.clauses):
        raise ValueError("a filter with an always-true clause has no selector text")
    return " OR ".join("(" + " AND ".join(format_predicate(p) for p in c) + ")" for c in f.clauses)
