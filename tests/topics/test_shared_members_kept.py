"""``SubscriptionIndex.match`` reports a shared group's members without copying them per match.

``_match_shared`` built a new ``[(client id, options), ...]`` list of every matching group for
every matched topic, O(members) per message, although the router reads it only when the group
changed (``broker.core._shared.Groups.of``).  The index now keeps each group's list and hands out
the same object until the group changes; a change makes a new list (the one handed out before
stays as it was: a reader holding it sees a consistent snapshot).
"""

from __future__ import annotations

from topics import SubscriptionIndex


def test_the_members_list_is_kept_between_matches_and_made_again_after_a_change() -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    for i in range(256):
        ix.subscribe(f"w{i}", "$share/g/jobs/#", i)
    ix.subscribe("x", "$share/h/jobs/+", 1000)
    first = ix.match("jobs/1").shared
    second = ix.match("jobs/2").shared  # another topic, the same groups
    assert first.keys() == second.keys() == {("g", "jobs/#"), ("h", "jobs/+")}
    assert second[("g", "jobs/#")] is first[("g", "jobs/#")]  # not copied (on main: a new list)
    before = first[("g", "jobs/#")]
    assert before == [(f"w{i}", i) for i in range(256)]

    ix.subscribe("w5", "$share/g/jobs/#", 5000)  # new options for one member: the group changed
    changed = ix.match("jobs/3").shared[("g", "jobs/#")]
    assert changed is not before and changed[5] == ("w5", 5000)
    assert before[5] == ("w5", 5)  # the list handed out before is left as it was
    assert ix.match("jobs/3").shared[("h", "jobs/+")] is first[("h", "jobs/+")]  # the other kept

    ix.unsubscribe("w0", "$share/g/jobs/#")
    assert ix.match("jobs/4").shared[("g", "jobs/#")][0] == ("w1", 1)
    ix.unsubscribe("x", "$share/h/jobs/+")
    assert set(ix.match("jobs/4").shared) == {("g", "jobs/#")}
    ix.subscribe("y", "$share/h/jobs/+", 7)  # the group again, with another member
    assert ix.match("jobs/5").shared[("h", "jobs/+")] == [("y", 7)]
    ix._check()
