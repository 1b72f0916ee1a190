"""HEMA and REIN / HCEM on the fleet benchmark's selector mix (issue 42 item 2, 100k).

benchmarks/bench_content_fleet.py's selectors join an equality on a string (the device
class, the site) or an ``IN`` list with numeric ranges, and ``alarm = FALSE``.  Before,
HEMA started most of its units in equality buckets and walked each bucket's units in Python
(and started the ``IN`` template's units at ``alarm = FALSE``, a bucket 95 % of the events
open), and REIN / HCEM left every string or boolean equality to a Python residual test of
the units that survived the negative search (~8,000 per event at 47,430 selectors).  Now
HEMA's equality-started units with numeric (or boolean) other nodes are one vectorised box
test, and REIN indexes string / boolean equality in bucket lists of codes.  Here: the engines
answer like brute force on the mix, the mix uses the new paths (these assertions fail on the
old engines), and the corner cases of both paths.
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path
from typing import Any

import pytest

import content
from content import HCEM, HEMA, REIN, BruteForce

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_content_fleet as bench

CONNECTIONS = 300
FILTERS = 10


def _fleet() -> dict[str, int]:
    """The distinct selectors of the first CONNECTIONS connections at x10 (id: order)."""
    sels: dict[str, int] = {}
    for c in range(CONNECTIONS):
        for k in range(FILTERS):
            sels.setdefault(bench.selector(c, k)[0], len(sels))
    return sels


def _events() -> list[dict[str, object]]:
    evs: list[dict[str, object]] = [dict(content.attributes(bench.payload(s, 1))) for s in range(-5, 120)]
    odd: list[dict[str, object]] = []
    for base in evs[:8]:
        odd += [
            {**base, "class": "unknown-class"},
            {**base, "class": 7},
            {k: v for k, v in base.items() if k != "class"},
            {**base, "alarm": 0},
            {**base, "alarm": True},
            {**base, "alarm": None},
            {**base, "site": ["site-01"]},
            {**base, "temp": math.nan},
            {**base, "temp": "95"},
        ]
    return evs + odd


def _churn(sels: dict[str, int]) -> tuple[list[int], list[tuple[int, str]]]:
    """A third of the selectors leave, some come back with other selectors."""
    back = [(sid, bench.selector(CONNECTIONS + sid, 1)[0]) for sid in range(0, len(sels), 7)]
    return list(sels.values())[::3], back


@functools.cache
def _brute_force() -> tuple[list[Any], list[Any]]:
    """Brute force's answers to the events, before and after the churn: the same for every
    engine, so computed once per worker (~1 s of CPU each, four engines)."""
    sels, evs, oracle = _fleet(), _events(), BruteForce()
    for text, sid in sels.items():
        oracle.add(sid, text)
    before = [oracle.match(e) for e in evs]
    gone, back = _churn(sels)
    for sid in gone:
        oracle.remove(sid)
    for sid, text in back:
        oracle.add(sid, text)
    return before, [oracle.match(e) for e in evs]


@pytest.mark.parametrize("name", ["hema", "rein", "hcem", "iccounting"])
def test_engines_answer_like_brute_force_on_the_fleet_mix(name: str) -> None:
    sels = _fleet()
    engine = content.ENGINES[name]()
    for text, sid in sels.items():
        engine.add(sid, text)
    evs = _events()
    want, want_after_churn = _brute_force()
    assert sum(map(len, want)) > 100
    assert [engine.match(e) for e in evs] == want
    assert engine.match_batch(evs) == want
    gone, back = _churn(sels)
    for sid in gone:
        engine.remove(sid)
    for sid, text in back:
        engine.add(sid, text)
    assert [engine.match(e) for e in evs] == want_after_churn
    engine._check()


def test_hema_matches_the_mix_in_one_box_test() -> None:
    """Every unit the mix starts at an equality is box-tested (none walked in Python), and
    no unit starts at ``alarm = FALSE``."""
    h = HEMA()
    for text, sid in _fleet().items():
        h.add(sid, text)
    starts = [u.start for u in h._units.values()]
    assert not any(s[0] == "hash" for s in starts), "an equality bucket walked in Python"
    boxed = [s for s in starts if s[0] == "hashbox"]
    assert len(boxed) > 0.95 * len(starts)
    assert {s[1] for s in boxed} == {"class", "site"}
    h._check()


def test_hema_walks_numeric_equality_starts() -> None:
    """A unit started at an equality on a number (seed 003's equalities: about one unit per
    bucket) is walked, not box-tested: boxed, it grew the box test every event pays (seed 003
    experiment 2 at 100k, 10 % slower per match); string and boolean starts stay boxed."""
    h = HEMA()
    h.add(1, "speed = 30 AND temp > 90")
    h.add(2, "mode IN (3, 4) AND temp > 90")
    h.add(3, "class = 'pump' AND temp > 90")
    assert h._units[h._units_of[1][0]].start[0] == "hash"
    assert h._units[h._units_of[2][0]].start[0] == "hash"
    assert h._units[h._units_of[3][0]].start[0] == "hashbox"
    assert h.match({"speed": 30, "mode": 4, "class": "pump", "temp": 95}) == {1, 2, 3}
    assert h.match({"speed": 31, "mode": 5, "class": "fan", "temp": 95}) == set()
    h._check()


def test_rein_indexes_string_and_boolean_equality() -> None:
    """Only the ``IN`` template keeps a residual predicate; the others are all indexed."""
    for engine in (REIN(), HCEM()):
        sels = _fleet()
        for text, sid in sels.items():
            engine.add(sid, text)
        with_residual = {engine._unit_sub[u] for u, r in enumerate(engine._residual) if r is not None}
        assert with_residual == {sid for text, sid in sels.items() if " IN (" in text}
        assert set(engine._cats) == {"class", "site", "alarm"}


def test_rein_codes_are_exact_and_released() -> None:
    for engine in (REIN(buckets=2), HCEM(buckets=2)):
        engine.add("pump", "class = 'pump' AND temp > 90")
        engine.add("one", "class = '1'")
        engine.add("true", "flag = TRUE")
        engine.add("false-and-x", "flag = FALSE AND x >= 0")
        engine.add("never", "class = 'pump' AND class = 'fan'")
        engine.add("or", "class = 'fan' OR flag = TRUE")
        assert engine.match({"class": "pump", "temp": 91}) == {"pump"}
        assert engine.match({"class": "pump", "temp": 90}) == set()
        assert engine.match({"class": 1}) == set()
        assert engine.match({"class": "1"}) == {"one"}
        assert engine.match({"flag": 1}) == set()
        assert engine.match({"flag": True}) == {"true", "or"}
        assert engine.match({"flag": False, "x": 0}) == {"false-and-x"}
        assert engine.match({"flag": False, "x": -1}) == set()
        assert engine.match({"class": "fan", "flag": "TRUE"}) == {"or"}
        assert engine.match_batch([{"class": "pump", "temp": 95}, {"flag": True}, {}]) == [
            {"pump"},
            {"true", "or"},
            set(),
        ]
        codes = engine._cats["class"]
        pump = codes.codes[(False, "pump")]
        engine.remove("pump")
        engine.remove("never")
        assert (False, "pump") not in codes.codes, "a literal no unit holds drops its code"
        engine.add("pump2", "class = 'pump'")
        assert codes.codes[(False, "pump")] > pump, "codes are never reused"
        assert engine.match({"class": "pump", "temp": 91}) == {"pump2"}
        engine._check()


def test_hema_boxes_booleans_apart_from_numbers() -> None:
    h, oracle = HEMA(), BruteForce()
    sels = {
        "pump": "class = 'pump' AND temp > 90 AND alarm = FALSE",
        "in": "class IN ('fan', 'pump') AND alarm = TRUE",
        "mixed": "class = 'pump' AND alarm = TRUE AND alarm > 0",
        "never": "class = 'pump' AND alarm = TRUE AND alarm = FALSE",
        "num": "class = 'pump' AND alarm = 1",
    }
    for sid, text in sels.items():
        h.add(sid, text)
        oracle.add(sid, text)
    boxed = {u.sid for u in h._units.values() if u.start[0] == "hashbox"}
    assert {"pump", "in", "never"} <= boxed
    h._check()
    values: list[object] = [True, False, 0, 1, 1.0, None, "true", math.nan]
    for alarm in values:
        for temp in (89, 91, math.nan, None):
            for cls in ("pump", "fan", 3):
                ev = {"class": cls, "temp": temp, "alarm": alarm}
                assert h.match(ev) == oracle.match(ev), ev
    for sid in sels:
        h.remove(sid)
        h._check()
    assert not h._hash_box and not h._boxes.boxes


def test_rein_in_residuals_keep_the_kind_rules() -> None:
    """``IN`` residuals over strings / booleans are set lookups; other kinds still fail."""

    class Name(str):
        __slots__ = ()

    for engine in (REIN(), HCEM()):
        engine.add("s", "c IN ('a', 'b') AND t > 1")
        engine.add("b", "f IN (TRUE) AND t > 1")
        engine.add("n", "c IN (1, 2) AND t > 1")
        assert engine.match({"c": "a", "t": 2}) == {"s"}
        assert engine.match({"c": Name("b"), "t": 2}) == {"s"}
        assert engine.match({"c": 1, "t": 2}) == {"n"}
        assert engine.match({"c": True, "t": 2}) == set()
        assert engine.match({"f": True, "t": 2}) == {"b"}
        assert engine.match({"f": 1, "t": 2}) == set()
        assert engine.match({"f": "TRUE", "t": 2}) == set()
        engine._check()
