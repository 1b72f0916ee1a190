"""A shared group's members behind an unreachable node are skipped by one rule, whether the
group's members carry content filters or not.

``Router._route_shared`` has two branches: a group without content filters takes its reachable
members from :class:`broker.core._shared.Groups` (kept per group), a group whose members carry
content filters filters its candidates per message and then drops the unreachable ones.  The
second branch repeated the rule inline; both now call :func:`broker.core._shared.reachable`.
These tests route the same messages through a plain group and a content-filtered one (the
filter passes every message) and check both pick the same members in the same turns: while
one member's node is down (skipped), while every member is unreachable (every member again,
in turn), and once the node is back.
"""

from __future__ import annotations

import pytest

from broker.core._router import Router
from broker.packets import NO_PROPERTIES, SubscriptionRequest
from broker.values import PEER_PREFIX, Message

FAR = PEER_PREFIX + "n1"  # another node's link: a member behind it is unreachable while n1 is down
MEMBERS = (FAR, "b", "c")


def _router(selector: str | None) -> Router:
    router = Router()
    for cid in MEMBERS:
        got = router.subscribe(cid, {}, SubscriptionRequest("$share/g/jobs/#", 1), selector, None)
        assert got.code.value < 0x80, got
    return router


def _picks(router: Router, n: int) -> list[str]:
    out = []
    for i in range(n):
        routes = router.route(Message.create(f"jobs/{i}", b'{"n": 1}', 1, False, NO_PROPERTIES, "p", 0.0))
        assert len(routes) == 1, routes  # one member of the group
        out.append(routes[0].client_id)
    return out


@pytest.mark.parametrize("selector", [None, "n > 0"])
def test_plain_and_content_filtered_groups_skip_the_same_unreachable_members(selector: str | None) -> None:
    router = _router(selector)
    router.unavailable = {FAR}
    got = _picks(router, 12)
    assert FAR not in got and got.count("b") == got.count("c") == 6, got
    router.unavailable = {FAR, "b", "c"}  # nobody reachable: every member again, in turn
    assert sorted(set(_picks(router, 6))) == sorted(MEMBERS)
    router.unavailable = set()  # n1 is back
    assert FAR in _picks(router, 3)
    failing = Message.create("jobs/x", b'{"n": 0}', 1, False, NO_PROPERTIES, "p", 0.0)
    assert (router.route(failing) == []) is (selector is not None)  # the filtered branch ran


def test_both_branches_pick_the_same_members_in_the_same_turns() -> None:
    plain, selective = _router(None), _router("n > 0")
    for unavailable in ({FAR}, {FAR, "b", "c"}, {"c"}, set()):
        plain.unavailable = selective.unavailable = unavailable
        assert _picks(plain, 9) == _picks(selective, 9), unavailable
