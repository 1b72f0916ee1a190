"""Access control lists per user and client (issue 7, item 2; mosquitto's acl_file format).

File format (one rule a line; ``#`` comments and blank lines ignored)::

    topic [read|write|readwrite|deny] <filter>    # before any 'user' line: anonymous clients
    user <name>                                   # starts the rules of one user
    topic [read|write|readwrite|deny] <filter>    # ... rules of that user
    pattern [read|write|readwrite|deny] <filter>  # every client, %u = user name, %c = client id

The access word may be left out (``readwrite``); the filter is the rest of the line and must
be a valid MQTT topic filter (``pattern`` filters after substitution).  ``deny`` is
mosquitto's explicit refusal and wins over any grant.  A pattern whose ``%u``/``%c`` value
is missing (anonymous client) or contains ``+``, ``#`` or ``/`` is skipped for that client,
so a client cannot widen its rights by choosing a client id such as ``#``.

Decisions (default deny once an ACL is loaded), all through ``topics`` -- topic matching is
never re-implemented here (seed 002: topicIncludes / topicOverlaps, ``topics._match``):

* publish to topic T: some write rule ``matches(rule, T)`` and no deny rule matches T;
* subscribe to filter F: F's inner filter (``$share/<group>/F`` and ``$filter/<selector>/F``
  are unwrapped) is allowed when one read rule ``includes(rule, F)`` -- every topic F can
  ever match is readable -- and no deny rule ``overlaps`` F.  A filter covered only by the
  union of several read rules is refused (conservative);
* receive topic T (``"receive"``, a delivery): some read rule matches T, no deny rule does.

Because a subscription is only granted when a read rule includes its whole filter, every
retained message the filter selects is readable under the ACL that granted it.  After the
ACL is reloaded that is no longer guaranteed, so the broker must also ask ``"receive"``
before delivering retained messages (docs/security.md).

Cost: parsing is O(lines).  ``rules_for(user, client)`` compiles one client's rules once
(cached per identity); a decision is O(rules of that client) ``topics`` calls, and publish
and receive decisions are memoised per client in a bounded dict, so a steady publisher pays
one dict probe per PUBLISH.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

import topics
from broker.core import SHARE_PREFIX, split_filter_prefix

__all__ = ["Access", "AccessList", "AclError", "AclRule", "ClientRules", "inner_filter"]

_CACHE_LIMIT = 4096  # entries per memo dict before it is cleared


class AclError(ValueError):
    """A malformed ACL file; the message names the file and the 1-based line."""


class Access(enum.Flag):
    """What a rule grants (``DENY`` refuses and wins)."""

    READ = enum.auto()
    WRITE = enum.auto()
    DENY = enum.auto()
    READWRITE = READ | WRITE


_ACCESS_WORDS = {
    "read": Access.READ,
    "write": Access.WRITE,
    "readwrite": Access.READWRITE,
    "deny": Access.DENY,
}


@dataclass(frozen=True, slots=True)
class AclRule:
    """One ``topic``/``pattern`` line: access, filter, whether it is a pattern, source line."""

    access: Access
    filter: str
    pattern: bool
    line: int

    def expand(self, username: str | None, client_id: str) -> str | None:
        """The filter for one client (patterns substituted); None when the rule cannot apply."""
        f = self.filter
        if not self.pattern:
            return f
        if "%u" in f:
            if username is None or not _safe(username):
                return None
            f = f.replace("%u", username)
        if "%c" in f:
            if not _safe(client_id):
                return None
            f = f.replace("%c", client_id)
        return f


def _safe(value: str) -> bool:
    return bool(value) and "+" not in value and "#" not in value and "/" not in value


def inner_filter(topic_filter: str) -> str:
    """Unwrap ``$filter/<selector>/`` and ``$share/<group>/`` (in any order, once each).

    Raises ValueError for a malformed prefix (no topic filter after it).
    """
    f = topic_filter
    for _ in range(2):
        if f.startswith("$filter/"):
            f = split_filter_prefix(f)[1]
        elif f.startswith(SHARE_PREFIX):
            parts = f.split("/", 2)
            if len(parts) < 3 or not parts[2]:
                raise ValueError(f"{topic_filter!r}: $share/<group>/<filter> expected")
            f = parts[2]
    return f


class ClientRules:
    """One client's expanded rules with memoised publish/receive decisions.

    Memory O(rules + memo); ``may_publish``/``may_receive`` are O(1) when memoised, else
    O(rules) ``topics.matches`` calls; ``may_subscribe`` is O(rules) ``includes``/``overlaps``.
    """

    __slots__ = ("_published", "_received", "deny", "read", "write")

    def __init__(self, read: tuple[str, ...], write: tuple[str, ...], deny: tuple[str, ...]) -> None:
        self.read = read
        self.write = write
        self.deny = deny
        self._published: dict[str, bool] = {}
        self._received: dict[str, bool] = {}

    def _check(self) -> None:
        for f in (*self.read, *self.write, *self.deny):
            topics.validate_filter(f)
        for t, ok in self._published.items():
            assert ok == self._decide(self.write, t)
        for t, ok in self._received.items():
            assert ok == self._decide(self.read, t)

    def _decide(self, grants: tuple[str, ...], topic: str) -> bool:
        matches = topics.matches
        for d in self.deny:
            if matches(d, topic):
                return False
        return any(matches(g, topic) for g in grants)

    def may_publish(self, topic: str) -> bool:
        memo = self._published
        ok = memo.get(topic)
        if ok is None:
            ok = self._decide(self.write, topic)
            if len(memo) >= _CACHE_LIMIT:
                memo.clear()
            memo[topic] = ok
        return ok

    def may_receive(self, topic: str) -> bool:
        memo = self._received
        ok = memo.get(topic)
        if ok is None:
            ok = self._decide(self.read, topic)
            if len(memo) >= _CACHE_LIMIT:
                memo.clear()
            memo[topic] = ok
        return ok

    def may_subscribe(self, topic_filter: str) -> bool:
        try:
            f = inner_filter(topic_filter)
            topics.validate_filter(f)
        except ValueError:
            return False
        overlaps = topics.overlaps
        for d in self.deny:
            if overlaps(d, f):
                return False
        includes = topics.includes
        return any(includes(g, f) for g in self.read)


class AccessList:
    """A parsed ACL file: anonymous rules, per-user rules, patterns.

    ``rules_for(username, client_id)`` is cached per identity (bounded); build a new
    ``AccessList`` to reload (instances are never mutated after parsing).
    """

    __slots__ = ("_cache", "anonymous", "patterns", "users")

    def __init__(self) -> None:
        self.anonymous: list[AclRule] = []
        self.users: dict[str, list[AclRule]] = {}
        self.patterns: list[AclRule] = []
        self._cache: dict[tuple[str | None, str], ClientRules] = {}

    @classmethod
    def load(cls, path: str | Path) -> AccessList:
        """Read an ACL file; raises AclError (with line number) or OSError."""
        with open(path, encoding="utf-8") as fh:
            return cls.parse(fh.read(), str(path))

    @classmethod
    def parse(cls, text: str, source: str = "<acl file>") -> AccessList:
        acl = cls()
        current: list[AclRule] = acl.anonymous
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{source}, line {number}"
            keyword, _, rest = line.partition(" ")
            rest = rest.strip()
            match keyword:
                case "user":
                    if not rest:
                        raise AclError(f"{where}: 'user' needs a user name")
                    current = acl.users.setdefault(rest, [])
                case "topic" | "pattern":
                    rule = _parse_rule(keyword == "pattern", rest, number, where)
                    (acl.patterns if rule.pattern else current).append(rule)
                case _:
                    raise AclError(f"{where}: unknown keyword {keyword!r} (expected user, topic or pattern)")
        acl._check()
        return acl

    def _check(self) -> None:
        for rule in (*self.anonymous, *self.patterns, *(r for rs in self.users.values() for r in rs)):
            probe = rule.expand("u", "c") if rule.pattern else rule.filter
            assert probe is not None
            topics.validate_filter(probe)
        for (user, client), rules in self._cache.items():
            rules._check()
            assert rules.read == self._compile(user, client).read

    def _compile(self, username: str | None, client_id: str) -> ClientRules:
        own = self.anonymous if username is None else self.users.get(username, [])
        read: list[str] = []
        write: list[str] = []
        deny: list[str] = []
        for rule in (*own, *self.patterns):
            f = rule.expand(username, client_id)
            if f is None:
                continue
            try:
                topics.validate_filter(f)
            except topics.InvalidTopic:
                continue  # a substituted value made the filter invalid (e.g. too long)
            if Access.DENY in rule.access:
                deny.append(f)
            if Access.READ in rule.access:
                read.append(f)
            if Access.WRITE in rule.access:
                write.append(f)
        return ClientRules(tuple(read), tuple(write), tuple(deny))

    def rules_for(self, username: str | None, client_id: str) -> ClientRules:
        key = (username, client_id)
        rules = self._cache.get(key)
        if rules is None:
            rules = self._compile(username, client_id)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = rules
        return rules

    def allows(self, username: str | None, client_id: str, action: str, topic: str) -> bool:
        """``action`` is "publish", "subscribe" or "receive"; anything else is refused."""
        rules = self.rules_for(username, client_id)
        match action:
            case "publish":
                return rules.may_publish(topic)
            case "subscribe":
                return rules.may_subscribe(topic)
            case "receive":
                return rules.may_receive(topic)
            case _:
                return False


def _parse_rule(pattern: bool, rest: str, number: int, where: str) -> AclRule:
    word, _, tail = rest.partition(" ")
    access = _ACCESS_WORDS.get(word)
    if access is None:
        access, f = Access.READWRITE, rest
    else:
        f = tail.strip()
    if not f:
        raise AclError(f"{where}: missing topic filter")
    probe = f.replace("%u", "u").replace("%c", "c") if pattern else f
    try:
        topics.validate_filter(probe)
    except topics.InvalidTopic as exc:
        raise AclError(f"{where}: invalid topic filter {f!r}: {exc}") from None
    return AclRule(access, f, pattern, number)
