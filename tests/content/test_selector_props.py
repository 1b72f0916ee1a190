"""Properties of the parser: generated selectors compile, normalisation is stable, the
compiled filter agrees with a direct three-valued evaluation of the text, and random text
never raises anything but FilterSyntaxError."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from content import FilterSyntaxError, compile
from content._selector import format_filter
from tests.content.strategies import events, selector_texts

_SNIPPETS = st.sampled_from(
    ["a", "b.c", "=", "<>", "!=", "<", ">=", "(", ")", ",", "'x'", "''", "'", '"q"', "1", "-2.5e3", ".5",
     "AND", "or", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "TRUE", "false", " ", "%", "#", "!", "1e", "--"]
)  # fmt: skip


@given(selector_texts())
def test_generated_selectors_compile_and_print_stably(text: str) -> None:
    f = compile(text)
    again = compile(format_filter(f))
    assert again.clauses == f.clauses
    assert compile(format_filter(again)).clauses == f.clauses


@given(selector_texts(), st.lists(events(), min_size=1, max_size=4))
def test_printed_form_is_equivalent(text: str, evs: list[dict[str, object]]) -> None:
    f = compile(text)
    g = compile(format_filter(f))
    for e in evs:
        assert f.matches(e) == g.matches(e)


@settings(max_examples=300)
@given(st.one_of(st.text(max_size=30), st.lists(_SNIPPETS, max_size=12).map(" ".join)))
def test_parser_only_raises_filter_syntax_error(text: str) -> None:
    try:
        f = compile(text)
    except FilterSyntaxError as e:
        assert 0 <= e.position <= len(text)
    else:
        assert f.selector == text


def _kleene(node: object, event: dict[str, object]) -> bool | None:
    """Direct SQL three-valued evaluation of the parse tree (None = unknown)."""
    from content._predicate import Kind, kind_of
    from content._selector import And, Atom, Not, Or

    match node:
        case Atom(p):
            v = event.get(p.attr)
            vk = kind_of(v)
            if p.kind is Kind.SET:
                assert isinstance(p.value, frozenset)
                comparable = vk is not None and all(kind_of(m) is vk for m in p.value)
            else:
                comparable = vk is p.kind
            return p.test(v) if comparable else None
        case Not(arg, _):
            r = _kleene(arg, event)
            return None if r is None else not r
        case And(args, _):
            rs = [_kleene(a, event) for a in args]
            return False if False in rs else (None if None in rs else True)
        case Or(args, _):
            rs = [_kleene(a, event) for a in args]
            return True if True in rs else (None if None in rs else False)
    raise AssertionError(node)


@given(selector_texts(), st.lists(events(), min_size=1, max_size=4))
def test_normal_form_agrees_with_three_valued_logic(text: str, evs: list[dict[str, object]]) -> None:
    from content._selector import Parser

    tree = Parser(text).parse()
    f = compile(text)
    for e in evs:
        assert f.matches(e) == (_kleene(tree, e) is True)
