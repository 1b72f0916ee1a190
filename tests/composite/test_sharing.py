"""Decomposition with sharing and reference counts: seed 001 Fig. 3-5 (decomposeSub, a new
composite subscription adding entries only for what is not stored yet) and Fig. 7 (an element
is unsubscribed only when no other entry's Elements contains it)."""

from __future__ import annotations

from composite import CompositeEngine


def names(infos: tuple[object, ...]) -> set[str]:
    return {a.element for a in infos}  # type: ignore[attr-defined]


def test_fig4_fig5_new_subscription_shares_existing_atoms() -> None:
    eng = CompositeEngine()
    # Fig. 4's CSGT: B|C and D&E, each with two subscribers
    for key, expr in [("s59", "B|C"), ("s19", "B|C"), ("s37", "D&E"), ("s106", "D&E")]:
        eng.subscribe(key, expr)
    # one entry per composite subscription, its subscribers listed in it (Fig. 4's Subscribers)
    assert eng.elements() == {"B | C": 1, "B": 1, "C": 1, "D & E": 1, "D": 1, "E": 1}
    st = eng.stats()
    assert (st.subscriptions, st.subscribers, st.stored_entries) == (2, 4, 6)
    # Fig. 5: (A|B)&C arrives; decomposeSub gives {A|B, C}, A|B gives {A, B}
    change = eng.subscribe("s22", "(A|B)&C")
    assert names(change.added) == {"A"}  # B and C are indexed already
    assert not change.removed
    assert eng.elements() == {
        "B | C": 1,
        "B": 2,
        "C": 2,
        "D & E": 1,
        "D": 1,
        "E": 1,
        "(A | B) & C": 1,
        "A | B": 1,
        "A": 1,
    }
    st = eng.stats()
    assert (st.atoms, st.composite_elements, st.stored_entries) == (5, 4, 9)
    assert st.unshared_entries == 3 + 3 + 3 + 3 + 5
    eng._check()


def test_common_subexpression_is_stored_once() -> None:
    eng = CompositeEngine()
    eng.subscribe(1, "(A|B)&C")
    change = eng.subscribe(2, "(B|A)&D")
    assert names(change.added) == {"D"}
    refs = eng.elements()
    assert refs["A | B"] == 2 and refs["A"] == 1 and refs["B"] == 1
    assert eng.stats().stored_entries == 7  # (A|B)&C, (A|B)&D, A|B, A, B, C, D
    assert eng.stats().unshared_entries == 10
    eng._check()


def test_fig7_unsubscribe_keeps_what_others_use() -> None:
    eng = CompositeEngine()
    eng.subscribe(1, "(A|B)&C")
    eng.subscribe(2, "(A|B)&D")
    eng.subscribe(3, "C|E")
    change = eng.unsubscribe(1)
    assert change is not None and not change.removed  # A|B used by 2, C by C|E
    assert "(A | B) & C" not in eng.elements()
    assert eng.elements()["A | B"] == 1 and eng.elements()["C"] == 1
    change = eng.unsubscribe(2)
    assert change is not None and names(change.removed) == {"A", "B", "D"}
    assert eng.elements() == {"C | E": 1, "C": 1, "E": 1}
    change = eng.unsubscribe(3)
    assert change is not None and names(change.removed) == {"C", "E"}
    assert eng.elements() == {} and eng.atoms() == []
    assert eng.unsubscribe(3) is None
    eng._check()


def test_subscribers_of_one_expression_share_one_subscription() -> None:
    eng = CompositeEngine()
    eng.subscribe("x", "A&B", qos=1)
    change = eng.subscribe("y", "B & A", qos=2)
    assert change.added == () and change.removed == ()
    assert eng.elements() == {"A & B": 1, "A": 1, "B": 1}
    st = eng.stats()
    assert (st.subscriptions, st.subscribers, st.stored_entries, st.unshared_entries) == (1, 2, 3, 6)
    eng.unsubscribe("x")
    assert eng.elements() == {"A & B": 1, "A": 1, "B": 1}
    eng._check()


def test_same_expression_other_window_shares_elements_not_buffers() -> None:
    eng = CompositeEngine(window=10)
    eng.subscribe("x", "A&B")
    eng.subscribe("y", "A&B", window=20)
    assert eng.elements()["A & B"] == 2
    assert eng.stats().subscriptions == 2
    eng._check()


def test_repeated_atom_counts_each_parent_once() -> None:
    eng = CompositeEngine()
    eng.subscribe(1, "(A|B)&(A|C)")
    assert eng.elements() == {"(A | B) & (A | C)": 1, "A | B": 1, "A | C": 1, "A": 2, "B": 1, "C": 1}
    assert eng.stats().unshared_entries == 7
    eng._check()


def test_resubscribe_reports_the_net_change_of_atoms() -> None:
    eng = CompositeEngine()
    eng.subscribe("k", "A&B")
    change = eng.subscribe("k", "B&C")
    assert names(change.added) == {"C"} and names(change.removed) == {"A"}
    assert [a.element for a in eng.atoms()] == ["B", "C"]
    change = eng.subscribe("k", "B&C", qos=0)  # same subscription: only the QoS changes
    assert change.added == () and change.removed == ()
    eng._check()


def test_atom_ids_and_infos() -> None:
    eng = CompositeEngine()
    change = eng.subscribe(1, "'s/+'[t > 1] & s/x")
    by_name = {a.element: a for a in change.added}
    a = by_name["s/+[t > 1]"]
    assert (a.topic_filter, a.selector) == ("s/+", "t > 1")
    assert a.filter is not None and a.filter.matches({"t": 2})
    b = by_name["s/x"]
    assert (b.topic_filter, b.selector, b.filter) == ("s/x", None, None)
    assert eng.atom(a.id) is a and eng.atom(10**9) is None
    assert eng.atom_id("s/x") == b.id and eng.atom_id("nope") is None
    assert "s/+[t > 1] & s/x" in eng.elements()
    assert eng.atom_id("s/+[t > 1] & s/x") is None  # a composite element, not an atom
    assert eng.atoms() == sorted(change.added, key=lambda i: i.id)


def test_layering_imports_only_topics_and_content() -> None:
    """composite sits beside topics/content: importing it loads neither broker nor bridge."""
    import subprocess
    import sys

    code = (
        "import sys, composite; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('broker', 'bridge')); "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
