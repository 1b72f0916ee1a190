"""The per-address back-off of failed logins (broker.core._backoff, sans-IO: explicit times)."""

from __future__ import annotations

import pytest

from broker.core._backoff import LoginBackoff, address_of


def test_k_failures_in_the_window_start_a_doubling_back_off_up_to_the_cap() -> None:
    b = LoginBackoff(failures=3, window=10.0, base=1.0, cap=4.0)
    assert b.failed("10.0.0.1", 0.0) == 0.0
    assert b.failed("10.0.0.1", 1.0) == 0.0
    assert b.blocked("10.0.0.1", 1.5) == 0.0
    assert b.failed("10.0.0.1", 2.0) == 1.0  # the third: blocked for base
    assert b.blocked("10.0.0.1", 2.5) == pytest.approx(0.5)
    assert b.blocked("10.0.0.2", 2.5) == 0.0  # per address
    assert b.blocked("10.0.0.1", 3.0) == 0.0
    periods = []
    t = 3.0
    for _ in range(4):
        for _ in range(3):
            got = b.failed("10.0.0.1", t)
        periods.append(got)
        t += got
    assert periods == [2.0, 4.0, 4.0, 4.0]  # doubled, then capped
    b._check()


def test_failures_outside_the_window_do_not_add_up() -> None:
    b = LoginBackoff(failures=3, window=10.0, base=1.0, cap=60.0)
    for t in (0.0, 11.0, 22.0, 33.0):
        assert b.failed("a", t) == 0.0
    assert b.failed("a", 34.0) == 0.0
    assert b.failed("a", 35.0) == 1.0  # three inside one window


def test_a_quiet_address_starts_again_from_base() -> None:
    b = LoginBackoff(failures=1, window=10.0, base=1.0, cap=8.0)
    assert [b.failed("a", t) for t in (0.0, 1.0, 3.0)] == [1.0, 2.0, 4.0]
    # last back-off ended at 7.0; quiet for the cap (8 s) afterwards: back to base
    assert b.failed("a", 15.0) == 1.0


def test_memory_is_bounded_least_recently_failed_first() -> None:
    b = LoginBackoff(failures=2, window=10.0, base=5.0, cap=5.0, addresses=3)
    for i in range(10):
        b.failed(f"10.0.0.{i}", 0.0)
    assert len(b) == 3
    assert b.failed("10.0.0.9", 1.0) == 5.0  # still remembered: its second failure blocks
    assert b.failed("10.0.0.0", 1.0) == 0.0  # forgotten: a first failure again
    b._check()


def test_off_and_invalid() -> None:
    off = LoginBackoff(failures=0)
    assert [off.failed("a", float(t)) for t in range(100)] == [0.0] * 100
    assert off.blocked("a", 1.0) == 0.0 and len(off) == 0
    with pytest.raises(ValueError):
        LoginBackoff(base=10.0, cap=1.0)


def test_address_of_peer_names() -> None:
    assert address_of(("127.0.0.1", 50000)) == "127.0.0.1"
    assert address_of(("::1", 50000, 0, 0)) == "::1"
    assert address_of("peer") == "peer"
