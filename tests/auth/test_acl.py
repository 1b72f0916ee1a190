"""ACL files: parsing, errors with line numbers, %u/%c, publish/subscribe/receive decisions."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import topics
from broker._acl import Access, AccessList, AclError, AclRule, inner_filter

ACL = """\
# anonymous clients
topic read public/#
topic deny public/secret

user alice
topic readwrite home/alice/#
topic read sensors/+/temp
topic write commands/lamp

user bob
topic sensors/#
topic deny sensors/private/#

pattern write clients/%c/status
pattern read users/%u/inbox/#
pattern readwrite shared/%u/%c
"""


@pytest.fixture
def acl() -> AccessList:
    a = AccessList.parse(ACL, "acl.conf")
    a._check()
    return a


def test_parse_sections(acl: AccessList) -> None:
    assert acl.anonymous == [
        AclRule(Access.READ, "public/#", False, 2),
        AclRule(Access.DENY, "public/secret", False, 3),
    ]
    assert [r.filter for r in acl.users["alice"]] == ["home/alice/#", "sensors/+/temp", "commands/lamp"]
    assert acl.users["bob"][0].access == Access.READWRITE  # access word left out
    assert [r.filter for r in acl.patterns] == ["clients/%c/status", "users/%u/inbox/#", "shared/%u/%c"]


def test_publish_needs_a_matching_write_rule(acl: AccessList) -> None:
    ok = acl.allows
    assert ok("alice", "c1", "publish", "home/alice/kitchen/light")
    assert ok("alice", "c1", "publish", "commands/lamp")
    assert not ok("alice", "c1", "publish", "sensors/x/temp")  # read only
    assert not ok("alice", "c1", "publish", "home/bob/x")
    assert ok("bob", "c2", "publish", "sensors/a/b")
    assert not ok("bob", "c2", "publish", "sensors/private/x")  # deny wins
    assert not ok(None, "anon", "publish", "public/news")  # anonymous: read only
    assert not ok("mallory", "m", "publish", "home/alice/x")  # unknown user: patterns only


def test_subscribe_needs_a_read_rule_that_includes_the_filter(acl: AccessList) -> None:
    ok = acl.allows
    assert ok("alice", "c1", "subscribe", "home/alice/#")
    assert ok("alice", "c1", "subscribe", "home/alice/+/light")
    assert ok("alice", "c1", "subscribe", "sensors/+/temp")
    assert ok("alice", "c1", "subscribe", "sensors/kitchen/temp")
    assert not ok("alice", "c1", "subscribe", "sensors/#")  # wider than sensors/+/temp
    assert not ok("alice", "c1", "subscribe", "#")
    assert not ok("alice", "c1", "subscribe", "commands/lamp")  # write only
    assert ok("bob", "c2", "subscribe", "sensors/public/#")
    assert not ok("bob", "c2", "subscribe", "sensors/#")  # overlaps the denied sensors/private/#
    assert not ok("bob", "c2", "subscribe", "sensors/+/x")  # overlaps sensors/private/x
    assert ok(None, "anon", "subscribe", "public/news/#")
    assert not ok(None, "anon", "subscribe", "public/#")  # overlaps the denied public/secret
    assert not ok("alice", "c1", "subscribe", "home/alice/#/x")  # invalid filter


def test_shared_and_content_filtered_subscriptions_use_the_inner_filter(acl: AccessList) -> None:
    ok = acl.allows
    assert ok("alice", "c1", "subscribe", "$share/g/home/alice/#")
    assert not ok("alice", "c1", "subscribe", "$share/g/home/#")
    assert ok("alice", "c1", "subscribe", "$filter/temp > 20/sensors/+/temp")
    assert ok("alice", "c1", "subscribe", "$filter/name = 'a/b'/sensors/+/temp")  # '/' inside quotes
    assert not ok("alice", "c1", "subscribe", "$filter/temp > 20/sensors/#")
    assert ok("alice", "c1", "subscribe", "$share/g/$filter/x = 1/home/alice/a")
    assert not ok("alice", "c1", "subscribe", "$filter/x = 1")  # no filter after the selector
    assert not ok("alice", "c1", "subscribe", "$share/g")
    assert inner_filter("$share/g/$filter/x = 1/a/+") == "a/+"
    assert inner_filter("$filter/x = 1/$share/g/a/#") == "a/#"


def test_receive_checks_a_topic_name_against_read_rules(acl: AccessList) -> None:
    ok = acl.allows
    assert ok("alice", "c1", "receive", "sensors/hall/temp")
    assert not ok("alice", "c1", "receive", "commands/lamp")
    assert ok(None, "anon", "receive", "public/a")
    assert not ok(None, "anon", "receive", "public/secret")
    assert not ok("alice", "c1", "delete", "home/alice/x")  # unknown action: refused


def test_wildcard_rules_never_grant_dollar_topics() -> None:
    acl = AccessList.parse("user admin\ntopic readwrite #\nuser ops\ntopic read $SYS/#\n")
    assert acl.allows("admin", "c", "subscribe", "a/b/#")
    assert not acl.allows("admin", "c", "subscribe", "$SYS/#")
    assert not acl.allows("admin", "c", "publish", "$SYS/broker/uptime")
    assert acl.allows("ops", "c", "subscribe", "$SYS/broker/+")
    assert not acl.allows("ops", "c", "subscribe", "#")


def test_patterns_substitute_user_and_client(acl: AccessList) -> None:
    ok = acl.allows
    assert ok("mallory", "dev-7", "publish", "clients/dev-7/status")
    assert not ok("mallory", "dev-7", "publish", "clients/dev-8/status")
    assert ok("mallory", "dev-7", "subscribe", "users/mallory/inbox/#")
    assert not ok("mallory", "dev-7", "subscribe", "users/alice/inbox/#")
    assert ok("alice", "x", "publish", "shared/alice/x") and ok("alice", "x", "subscribe", "shared/alice/x")
    assert not ok("alice", "x", "publish", "shared/alice/y")
    # %c applies to anonymous clients, %u never does
    assert ok(None, "anon-1", "publish", "clients/anon-1/status")
    assert not ok(None, "anon-1", "subscribe", "users/%u/inbox/#")
    assert not ok(None, "anon-1", "publish", "shared/%u/anon-1")


@pytest.mark.parametrize("evil", ["#", "+", "a/b", ""])
def test_wildcards_in_ids_never_widen_a_pattern(acl: AccessList, evil: str) -> None:
    assert not acl.allows(evil or None, "c", "subscribe", f"users/{evil}/inbox/#")
    assert not acl.allows("u", evil, "publish", f"clients/{evil}/status")
    assert not acl.allows("u", evil, "publish", "clients/other/status")
    assert acl.rules_for("u", evil).write == ()


def test_memoised_decisions_agree_with_fresh_ones(acl: AccessList) -> None:
    for _ in range(2):
        assert acl.allows("alice", "c1", "publish", "home/alice/x")
        assert not acl.allows("alice", "c1", "publish", "home/bob/x")
        assert acl.allows("alice", "c1", "receive", "sensors/a/temp")
    assert acl.rules_for("alice", "c1") is acl.rules_for("alice", "c1")
    acl._check()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("topic", "line 2: missing topic filter"),
        ("topic read", "line 2: missing topic filter"),
        ("topic read a/#/b", "line 2: invalid topic filter 'a/#/b'"),
        ("pattern write a/%u#", "line 2: invalid topic filter 'a/%u#'"),
        ("user", "line 2: 'user' needs a user name"),
        ("group admins", "line 2: unknown keyword 'group'"),
    ],
)
def test_malformed_lines_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(AclError, match="^acl.conf, " + message):
        AccessList.parse(f"topic read a\n{text}\n", "acl.conf")


def test_load_from_file(tmp_path: Path) -> None:
    path = tmp_path / "acl"
    path.write_text(ACL)
    assert AccessList.load(path).allows("alice", "c", "publish", "commands/lamp")


LEVELS = st.sampled_from(["a", "b", "$x", "+", "#"])
TOPIC_LEVELS = st.sampled_from(["a", "b", "$x", ""])


def filters() -> st.SearchStrategy[str]:
    def valid(levels: list[str]) -> bool:
        return "#" not in levels[:-1]

    return st.lists(LEVELS, min_size=1, max_size=4).filter(valid).map("/".join)


@given(
    rules=st.lists(st.tuples(st.sampled_from(["read", "deny", "write"]), filters()), max_size=5),
    sub=filters(),
    probes=st.lists(st.lists(TOPIC_LEVELS, min_size=1, max_size=5).map("/".join), max_size=20),
)
def test_granted_subscriptions_only_see_readable_topics(
    rules: list[tuple[str, str]], sub: str, probes: list[str]
) -> None:
    """Soundness of includes/overlaps: a granted filter never matches an unreadable topic."""
    acl = AccessList.parse("user u\n" + "".join(f"topic {a} {f}\n" for a, f in rules))
    if acl.allows("u", "c", "subscribe", sub):
        for t in probes:
            if topics.matches(sub, t):
                assert acl.allows("u", "c", "receive", t), (sub, t)
    for t in probes:
        expect = any(a == "write" and topics.matches(f, t) for a, f in rules) and not any(
            a == "deny" and topics.matches(f, t) for a, f in rules
        )
        assert acl.allows("u", "c", "publish", t) == expect
