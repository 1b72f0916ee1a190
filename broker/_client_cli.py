"""``siftmq pub`` and ``siftmq sub``: command-line clients that behave like mosquitto_pub /
mosquitto_sub (issue 19 item 2, issue 38 items 3 and 7; docs/reference.md, "Operations";
docs/operations.md, "Command-line clients", lists every remaining difference).

**Flags** are mosquitto's where they exist (``-h`` is the host, so help is ``--help`` only):
``-h -p -t -m -q -r -C -v -N -R -u -P -i -k -V -n -f -l -s -W -L -d -D --cafile
--will-topic --will-payload --will-qos --will-retain``, plus siftmq's content filter
(``--filter SELECTOR``: MQTT 5 user property ``filter``, MQTT 3.1.1
``$filter/<selector>/<topic>``) and composite subscriptions (``--composite NAME=EXPRESSION``:
``$composite/<name>`` with the user property ``composite`` on MQTT 5,
``$composite/<name>/<expression>`` on 3.1.1; docs/composite.md).  ``-V`` takes ``mqttv5``
(``5``, the default), ``mqttv311`` (``311``) and ``mqttv31`` (``31``).

**Design.**  Three phases, each with its own exit status:

1. *Plan* (:func:`_pub_plan`, :func:`_sub_plan`): every input is checked before a socket is
   opened, with the same code the broker uses: topic names and filters by
   :func:`topics.validate_topic` / :func:`topics.validate_filter`, selectors by
   :func:`content.compile` and composite expressions by :func:`composite.parse` (their errors
   carry the character position), ``$filter/`` and ``$composite/`` filters split the broker's
   way.  A bad input is one line ``siftmq pub: ...`` on stderr and exit status 2
   (:class:`_BadInput`).
2. *Session* (:class:`_Session`): paho-mqtt's client driven by :meth:`_Session.run`, a loop in
   the calling thread (no background thread whose exceptions would be lost).  Every refusal is
   one line naming the reason code and, on MQTT 5, the broker's reason string: a refused
   CONNACK exits with its reason code (as mosquitto's clients do), a failed SUBACK entry, a
   PUBACK / PUBREC error code or a connection the broker closed exits 1
   (:class:`_Refused`).  ``sub -W`` past its deadline exits 27 (mosquitto's
   ``MOSQ_ERR_TIMEOUT``).
3. Anything unforeseen is one line too, exit 1; its traceback only with ``-d``/``--debug``.

``-d`` prints the packets sent and received on stdout like mosquitto's clients (``Client
<id> sending CONNECT``, ``Client <id> received SUBACK``, ``Subscribed (mid: 1): 0``) from
paho's log.

Cost: the clients are not on the broker's hot path; a message printed by ``sub`` is O(size of
its payload), planning is O(length of the inputs).
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.plugins import Subparsers

__all__ = ["TIMEOUT_STATUS", "register"]

#: ``sub -W`` ran out of time: mosquitto_sub's status (libmosquitto's ``MOSQ_ERR_TIMEOUT``)
TIMEOUT_STATUS = 27
#: a bad input found before connecting
_BAD_INPUT_STATUS = 2
#: paho's log of a PUBLISH: "(d0, q1, r0, m1), 'b'a'', [properties=..., ]... (1 bytes)"
_PAHO_PUBLISH = re.compile(r"\((d\d, q\d, r\d, m\d+)\), '(.*)',(?: properties=.*,)? \.\.\. +\((\d+) bytes\)$")
#: paho's log of an acknowledgement: "(Mid: 1)"
_PAHO_MID = re.compile(r"\(Mid: (\d+)\)")
#: paho's reason code for a 3.1.1 CONNACK return code -> that return code
_V3_CONNACK = {0x84: 1, 0x85: 2, 0x88: 3, 0x86: 4, 0x87: 5}
_VERSIONS = {"mqttv5": 5, "5": 5, "mqttv311": 4, "311": 4, "mqttv31": 3, "31": 3}


class _BadInput(Exception):
    """An input refused before connecting: exit status 2."""


class _Refused(Exception):
    """The broker refused or dropped us; ``status`` is the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--help", action="help", help="show this help message and exit")
    p.add_argument("-h", "--host", default=None, help="broker host (default localhost)")
    p.add_argument("-p", "--port", type=int, default=None, help="broker port (default 1883, 8883 with TLS)")
    p.add_argument(
        "-L",
        "--url",
        default=None,
        help="mqtt(s)://[user[:password]@]host[:port]/topic instead of -h -p -u -P -t",
    )
    p.add_argument("-i", "--id", default="", help="client id (default: assigned by the broker)")
    p.add_argument("-k", "--keepalive", type=int, default=60, help="keep-alive seconds (default 60)")
    p.add_argument("-q", "--qos", type=int, choices=(0, 1, 2), default=0, help="QoS (default 0)")
    p.add_argument("-u", "--username", default=None, help="user name")
    p.add_argument("-P", "--pw", default=None, help="password")
    p.add_argument("--cafile", default=None, help="CA certificates: connect with TLS")
    p.add_argument(
        "-V",
        "--protocol-version",
        choices=tuple(_VERSIONS),
        default="mqttv5",
        help="MQTT version: mqttv5 (default), mqttv311 or mqttv31",
    )
    p.add_argument(
        "-d",
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,  # never overwrites a `siftmq --debug` given before the command
        help="print the packets sent and received (and a traceback on an internal error)",
    )
    p.add_argument(
        "-D",
        "--property",
        nargs="+",
        action="append",
        default=[],
        metavar="ARG",
        help="user property: -D KEY VALUE (mosquitto's form -D CMD user-property KEY VALUE too)",
    )
    p.add_argument("--will-topic", default=None, help="topic of the will (published if we vanish)")
    p.add_argument("--will-payload", default=None, help="payload of the will (default empty)")
    p.add_argument("--will-qos", type=int, choices=(0, 1, 2), default=0, help="QoS of the will")
    p.add_argument("--will-retain", action="store_true", help="the will is retained")


def register(subparsers: Subparsers) -> None:
    """Add ``pub`` and ``sub``."""
    pub = subparsers.add_parser("pub", add_help=False, help="publish a message (like mosquitto_pub)")
    _common(pub)
    pub.add_argument("-t", "--topic", default=None, help="topic to publish to")
    what = pub.add_mutually_exclusive_group(required=True)
    what.add_argument("-m", "--message", help="the payload")
    what.add_argument("-n", "--null-message", action="store_true", help="an empty payload")
    what.add_argument("-f", "--file", help="the payload is this file")
    what.add_argument("-l", "--stdin-line", action="store_true", help="one message per line of stdin")
    what.add_argument("-s", "--stdin-file", action="store_true", help="stdin as one message")
    pub.add_argument("-r", "--retain", action="store_true", help="retained message")
    pub.set_defaults(func=_pub)
    sub = subparsers.add_parser("sub", add_help=False, help="subscribe and print (like mosquitto_sub)")
    _common(sub)
    sub.add_argument("-t", "--topic", action="append", default=[], help="topic filter (repeatable)")
    sub.add_argument("-C", "--count", type=int, default=0, help="exit after this many messages")
    sub.add_argument("-v", "--verbose", action="store_true", help="print 'topic payload'")
    sub.add_argument("-N", "--no-eol", action="store_true", help="no newline after each message")
    sub.add_argument("-R", "--no-retained", action="store_true", help="skip retained (stale) messages")
    sub.add_argument(
        "-W", "--timeout", type=float, default=0, help=f"exit with status {TIMEOUT_STATUS} after this many s"
    )
    sub.add_argument("--filter", default=None, help="content filter (selector) on every topic")
    sub.add_argument(
        "--composite",
        action="append",
        default=[],
        metavar="NAME=EXPRESSION",
        help="composite subscription (docs/composite.md)",
    )
    sub.set_defaults(func=_sub)


# -- phase 1: plans (every input checked before connecting) ---------------------------------------


@dataclass(frozen=True, slots=True)
class _Will:
    topic: str
    payload: bytes
    qos: int
    retain: bool


@dataclass(frozen=True, slots=True)
class _Connection:
    """Where and how to connect (from -h -p -u -P -L --cafile -i -k -V and the will flags)."""

    host: str
    port: int
    tls: bool
    cafile: str | None
    username: str | None
    password: str | None
    client_id: str
    keepalive: int
    version: int  # 3, 4 or 5 (the protocol level)
    will: _Will | None
    user_properties: tuple[tuple[str, str], ...]
    debug: bool


@dataclass(frozen=True, slots=True)
class _Url:
    tls: bool
    username: str | None
    password: str | None
    host: str
    port: int | None
    topic: str | None


def _parse_url(url: str) -> _Url:
    """mosquitto's ``-L``: ``mqtt(s)://[user[:password]@]host[:port]/topic`` (split by hand:
    ``#`` in the topic is no URL fragment).  O(len(url))."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in {"mqtt", "mqtts"}:
        raise _BadInput(f"-L {url!r}: expected mqtt://[user[:password]@]host[:port]/topic (or mqtts://)")
    authority, slash, topic = rest.partition("/")
    userinfo, at, hostport = authority.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username, password = user, (pw if colon else None)
    host, port_text = hostport, ""
    if hostport.startswith("["):  # [IPv6]:port
        close = hostport.find("]")
        host, port_text = hostport[1:close], hostport[close + 1 :].removeprefix(":")
    elif ":" in hostport:
        host, _, port_text = hostport.rpartition(":")
    if not host:
        raise _BadInput(f"-L {url!r}: no host")
    port = None
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise _BadInput(f"-L {url!r}: port {port_text!r} is not a number 1-65535")
        port = int(port_text)
    return _Url(scheme == "mqtts", username, password, host, port, topic if slash and topic else None)


def _user_props(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    out = []
    for item in args.property:
        if len(item) == 4 and item[1] == "user-property":  # mosquitto: -D publish user-property K V
            out.append((item[2], item[3]))
        elif len(item) == 2:
            out.append((item[0], item[1]))
        else:
            raise _BadInput(
                f"-D {' '.join(item)}: expected -D KEY VALUE or -D COMMAND user-property KEY VALUE"
            )
    return tuple(out)


def _topic(flag: str, name: str) -> str:
    import topics

    try:
        topics.validate_topic(name)
    except topics.InvalidTopic as exc:
        raise _BadInput(f"{flag} {name!r}: {exc}") from None
    return name


def _with_position(message: str, position: int) -> str:
    """The parser's message, ending with its position (most already do: ``... at 6``)."""
    return message if message.endswith(f" at {position}") else f"{message} at {position}"


def _selector(where: str, text: str) -> None:
    """``where``: the flag and value shown before the error."""
    import content

    try:
        content.compile(text)
    except content.FilterSyntaxError as exc:
        raise _BadInput(f"{where}: bad selector: {_with_position(str(exc), exc.position)}") from None


def _expression(where: str, text: str) -> None:
    import composite

    try:
        composite.parse(text)
    except composite.CompositeSyntaxError as exc:
        raise _BadInput(f"{where}: bad expression: {_with_position(str(exc), exc.position)}") from None


def _filter(flag: str, f: str) -> None:
    """A SUBSCRIBE filter as the broker reads it: ``$composite/<name>[/<expression>]``,
    ``$filter/<selector>/<filter>``, ``$share/<group>/<filter>``, plain MQTT."""
    import topics
    from broker.core import COMPOSITE_PREFIX, split_composite, split_filter_prefix

    shown = f"{flag} {f!r}"
    if f.startswith(COMPOSITE_PREFIX):
        try:
            _, expression = split_composite(f)
        except ValueError as exc:
            raise _BadInput(f"{shown}: {exc}") from None
        if expression is not None:
            _expression(shown, expression)
        return
    try:
        selector, inner = split_filter_prefix(f)
    except ValueError as exc:
        raise _BadInput(f"{shown}: {exc}") from None
    if selector is not None:
        _selector(f"{shown}: selector {selector!r}", selector)
    try:
        topics.validate_filter(inner)
    except topics.InvalidTopic as exc:
        raise _BadInput(f"{shown}: {exc}") from None


def _connection(args: argparse.Namespace, url: _Url | None) -> _Connection:
    if args.url is not None and (args.host is not None or args.port is not None):
        raise _BadInput("-L gives the host and port: drop -h / -p")
    if not 0 <= args.keepalive <= 65535:
        raise _BadInput(f"-k {args.keepalive}: keep-alive must be 0-65535 seconds")
    if args.port is not None and not 0 < args.port < 65536:
        raise _BadInput(f"-p {args.port}: port must be 1-65535")
    tls = args.cafile is not None or (url is not None and url.tls)
    port = args.port if args.port is not None else (url.port if url is not None else None)
    will = None
    if args.will_topic is not None:
        payload = (args.will_payload or "").encode()
        will = _Will(_topic("--will-topic", args.will_topic), payload, args.will_qos, args.will_retain)
    elif args.will_payload is not None or args.will_qos or args.will_retain:
        raise _BadInput("--will-payload / --will-qos / --will-retain need --will-topic")
    version = _VERSIONS[args.protocol_version]
    client_id = args.id
    if version == 3 and not client_id:  # MQTT 3.1 has no assigned ids (1-23 characters)
        import secrets  # hashlib and OpenSSL: not when serve builds the parser

        client_id = f"siftmq-{secrets.token_hex(6)}"
    username = args.username if args.username is not None else (url.username if url else None)
    password = args.pw if args.pw is not None else (url.password if url else None)
    return _Connection(
        host=args.host or (url.host if url is not None else "localhost"),
        port=port if port is not None else (8883 if tls else 1883),
        tls=tls,
        cafile=args.cafile,
        username=username,
        password=password,
        client_id=client_id,
        keepalive=args.keepalive,
        version=version,
        will=will,
        user_properties=_user_props(args),
        debug=bool(getattr(args, "debug", False)),
    )


@dataclass(frozen=True, slots=True)
class _PubPlan:
    conn: _Connection
    topic: str
    payloads: tuple[bytes, ...]
    qos: int
    retain: bool


def _pub_plan(args: argparse.Namespace) -> _PubPlan:
    url = _parse_url(args.url) if args.url is not None else None
    if args.topic is not None and url is not None and url.topic is not None:
        raise _BadInput("-L gives the topic: drop -t")
    topic = args.topic if args.topic is not None else (url.topic if url is not None else None)
    if topic is None:
        raise _BadInput("a topic is needed: -t TOPIC or -L mqtt://host/TOPIC")
    conn = _connection(args, url)
    _topic("-t", topic)
    if args.message is not None:
        payloads: tuple[bytes, ...] = (args.message.encode(),)
    elif args.null_message:
        payloads = (b"",)
    elif args.file is not None:
        try:
            with open(args.file, "rb") as fh:
                payloads = (fh.read(),)
        except OSError as exc:
            raise _BadInput(f"-f {args.file!r}: {exc.strerror or exc}") from None
    elif args.stdin_file:
        payloads = (sys.stdin.buffer.read(),)
    else:
        payloads = tuple(line.rstrip(b"\n") for line in sys.stdin.buffer)
    return _PubPlan(conn, topic, payloads, args.qos, args.retain)


@dataclass(frozen=True, slots=True)
class _Subscription:
    topic_filter: str
    user_properties: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class _SubPlan:
    conn: _Connection
    subscriptions: tuple[_Subscription, ...]
    qos: int
    count: int
    timeout: float
    verbose: bool
    eol: bool
    retained: bool


def _sub_plan(args: argparse.Namespace) -> _SubPlan:
    url = _parse_url(args.url) if args.url is not None else None
    filters = list(args.topic)
    if url is not None and url.topic is not None:
        filters.insert(0, url.topic)
    if not filters and not args.composite:
        raise _BadInput("at least one -t TOPIC, -L mqtt://host/TOPIC or --composite is needed")
    if args.count < 0:
        raise _BadInput(f"-C {args.count}: the count must be positive")
    if args.timeout < 0:
        raise _BadInput(f"-W {args.timeout:g}: the timeout must be positive")
    conn = _connection(args, url)
    v5 = conn.version == 5
    if args.filter is not None:
        _selector(f"--filter {args.filter!r}", args.filter)
    subs: list[_Subscription] = []
    for f in filters:
        _filter("-t", f)
        if args.filter is None:
            subs.append(_Subscription(f, conn.user_properties))
        elif v5:
            subs.append(_Subscription(f, (*conn.user_properties, ("filter", args.filter))))
        else:
            subs.append(_Subscription(f"$filter/{args.filter}/{f}", conn.user_properties))
    for spec in args.composite:
        name, sep, expr = spec.partition("=")
        if not sep or not name or not expr:
            raise _BadInput(f"--composite {spec!r}: expected NAME=EXPRESSION")
        if "/" in name or "+" in name or "#" in name:
            raise _BadInput(f"--composite {spec!r}: the name is one topic level without '/', '+', '#'")
        _expression(f"--composite {spec!r}", expr)
        if v5:
            subs.append(_Subscription(f"$composite/{name}", (*conn.user_properties, ("composite", expr))))
        else:
            subs.append(_Subscription(f"$composite/{name}/{expr}", conn.user_properties))
    if not v5:
        subs = [_Subscription(s.topic_filter, ()) for s in subs]  # 3.1.1 has no properties
    return _SubPlan(
        conn,
        tuple(subs),
        args.qos,
        args.count,
        args.timeout,
        args.verbose,
        not args.no_eol,
        not args.no_retained,
    )


# -- phase 2: the session ----------------------------------------------------------------------


def _reason(rc: Any, props: Any = None) -> str:
    """``Name (0x87)`` plus the broker's reason string when it sent one."""
    text = f"{rc} (0x{int(getattr(rc, 'value', rc)):02x})"
    reason = getattr(props, "ReasonString", None) if props is not None else None
    return f"{text}: {reason}" if reason else text


def _properties(packet_type: int, pairs: Sequence[tuple[str, str]]) -> Any:
    """paho's ``Properties`` with these user properties, or None (its constructor is untyped)."""
    if not pairs:
        return None
    from paho.mqtt.properties import Properties

    cls: Any = Properties
    props = cls(packet_type)
    props.UserProperty = list(pairs)
    return props


def _paho_client_class() -> Any:
    """paho's ``Client`` with two additions: filters are checked by :func:`_filter` before (so
    paho's narrower check, which refuses ``$composite/n/a/# & b``, is off) and a PUBREC's error
    code is kept (paho ignores it and completes the flow; we report it)."""
    import paho.mqtt.client as mqtt

    class Client(mqtt.Client):
        #: packet id -> (reason code, properties) of a PUBREC with an error code
        pubrec_failures: dict[int, tuple[int, Any]]

        @staticmethod
        def _filter_wildcard_len_check(sub: bytes) -> Any:
            return mqtt.MQTT_ERR_SUCCESS

        def _handle_pubrec(self) -> Any:
            packet = bytes(self._in_packet["packet"])
            if self._protocol == mqtt.MQTTv5 and len(packet) > 2 and packet[2] >= 0x80:
                from paho.mqtt.packettypes import PacketTypes
                from paho.mqtt.properties import Properties

                props: Any = Properties(PacketTypes.PUBREC)  # type: ignore[no-untyped-call]
                if len(packet) > 3:
                    props.unpack(packet[3:])
                self.pubrec_failures[int.from_bytes(packet[:2], "big")] = (packet[2], props)
            return super()._handle_pubrec()

    return Client


@dataclass(slots=True)
class _Session:
    """One paho client, driven in this thread by :meth:`run`; callbacks record outcomes in
    ``failure`` (the first refusal), ``connected`` and ``closing``."""

    conn: _Connection
    client: Any = None
    client_id: str = ""
    connected: bool = False
    closing: bool = False
    closed: bool = False
    failure: _Refused | None = None
    on_ready: list[Callable[[], None]] = field(default_factory=list)

    def open(self) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        conn = self.conn
        protocol = {5: mqtt.MQTTv5, 4: mqtt.MQTTv311, 3: mqtt.MQTTv31}[conn.version]
        c = _paho_client_class()(
            CallbackAPIVersion.VERSION2,
            conn.client_id,
            protocol=protocol,
            clean_session=None if conn.version == 5 else True,
        )
        c.pubrec_failures = {}
        c.suppress_exceptions = False
        self.client = c
        self.client_id = conn.client_id or "(null)"
        if conn.username is not None:
            c.username_pw_set(conn.username, conn.password)
        if conn.tls:
            c.tls_set(ca_certs=conn.cafile)
        if conn.will is not None:
            w = conn.will
            c.will_set(w.topic, w.payload, w.qos, w.retain)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        if conn.debug:
            c.on_log = self._on_log
        try:
            c.connect(conn.host, conn.port, conn.keepalive)
        except OSError as exc:
            raise _Refused(f"cannot connect to {conn.host}:{conn.port}: {exc.strerror or exc}") from None

    def _on_log(self, _c: Any, _u: Any, _level: int, text: str) -> None:
        """paho's "Sending X (...)" / "Received X (...)" in mosquitto's words: "Client <id>
        sending X (details)" (CONNACK, SUBSCRIBE and a publisher's PUBACK / PUBCOMP are printed
        where their details are known: :meth:`_on_connect`, the subscriber, the publisher)."""
        verb, _, rest = text.partition(" ")
        if verb not in {"Sending", "Received"}:
            return
        packet, _, details = rest.partition(" ")
        sending = verb == "Sending"
        if packet in {"CONNACK", "SUBSCRIBE"} or (not sending and packet in {"PUBACK", "PUBCOMP"}):
            return
        who = f"Client {self.client_id} {verb.lower()} {packet}"
        if packet == "PUBLISH" and (m := _PAHO_PUBLISH.match(details)):
            flags, topic, size = m.groups()
            topic = topic[2:-1] if topic.startswith(("b'", 'b"')) else topic  # paho shows bytes
            self.say(f"{who} ({flags}, '{topic}', ... ({size} bytes))")
        elif (m := _PAHO_MID.match(details)) is not None:
            mid = m[1]
            if not sending:
                self.say(f"{who} (Mid: {mid})")
            else:
                self.say(f"{who} (m{mid}, rc0)" if packet in {"PUBACK", "PUBREC"} else f"{who} (m{mid})")
        else:
            self.say(who)

    def say(self, line: str) -> None:
        """A ``-d`` line on stdout, as mosquitto prints them."""
        if self.conn.debug:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def _on_connect(self, c: Any, _u: Any, _flags: Any, rc: Any, props: Any = None) -> None:
        assigned = getattr(props, "AssignedClientIdentifier", None) if props is not None else None
        if assigned:
            self.client_id = assigned
        code = int(rc.value) if self.conn.version == 5 else _V3_CONNACK.get(int(rc.value), int(rc.value))
        self.say(f"Client {self.client_id} received CONNACK ({code})")
        if rc.is_failure:
            # mosquitto's clients exit with the CONNACK's reason code (3.1.1: its return code)
            why = _reason(rc, props) if self.conn.version == 5 else f"{rc} (return code {code})"
            self.fail(f"connection refused: {why}", code or 1)
            return
        self.connected = True
        for ready in self.on_ready:
            ready()

    def _on_disconnect(self, _c: Any, _u: Any, _flags: Any, rc: Any, props: Any = None) -> None:
        self.closed = True
        if not self.closing and self.failure is None:
            why = _reason(rc, props) if rc.is_failure else "the broker closed the connection"
            self.fail(f"connection lost: {why}")

    def fail(self, message: str, status: int = 1) -> None:
        if self.failure is None:
            self.failure = _Refused(message, status)

    def run(self, done: Callable[[], bool], deadline: float | None = None) -> bool:
        """Drive the client until ``done()`` or a failure (raised); False when ``deadline``
        (``time.monotonic``) passed first."""
        import paho.mqtt.client as mqtt

        c = self.client
        while not done():
            if self.failure is not None:
                raise self.failure
            if deadline is not None and time.monotonic() >= deadline:
                return False
            wait = 0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))
            rc = c.loop(wait)
            if rc != mqtt.MQTT_ERR_SUCCESS and self.failure is None and not self.closing:
                self.fail(f"connection lost: {mqtt.error_string(rc)}")
        if self.failure is not None:
            raise self.failure
        return True

    def close(self) -> None:
        """Send DISCONNECT and wait (briefly) until it is written."""
        if self.client is None or self.closed:
            return
        self.closing = True
        self.client.disconnect()
        end = time.monotonic() + 5.0
        while not self.closed and time.monotonic() < end:
            if self.client.loop(0.05) != 0:
                break


def _pub_session(plan: _PubPlan) -> None:
    from paho.mqtt.packettypes import PacketTypes

    s = _Session(plan.conn)
    acked: dict[int, Any] = {}

    def on_publish(_c: Any, _u: Any, mid: int, rc: Any, props: Any = None) -> None:
        if plan.qos:  # as mosquitto: "received PUBACK (Mid: 1, RC:0)"
            ack = "PUBACK" if plan.qos == 1 else "PUBCOMP"
            s.say(f"Client {s.client_id} received {ack} (Mid: {mid}, RC:{int(getattr(rc, 'value', 0))})")
        failed = s.client.pubrec_failures.pop(mid, None)
        if failed is not None:
            from paho.mqtt.reasoncodes import ReasonCode

            code, pubrec = failed
            pubrec_rc = ReasonCode(PacketTypes.PUBREC, identifier=code)
            s.fail(f"PUBLISH refused (PUBREC): {_reason(pubrec_rc, pubrec)}")
        elif rc is not None and rc.is_failure:
            s.fail(f"PUBLISH refused: {_reason(rc, props)}")
        acked[mid] = rc

    s.open()
    s.client.on_publish = on_publish
    try:
        s.run(lambda: s.connected)
        v5 = plan.conn.version == 5
        props = _properties(PacketTypes.PUBLISH, plan.conn.user_properties) if v5 else None
        for payload in plan.payloads:
            info = s.client.publish(plan.topic, payload, plan.qos, plan.retain, properties=props)
            s.run(functools.partial(acked.__contains__, info.mid))
    finally:
        s.close()


def _sub_session(plan: _SubPlan) -> None:
    from paho.mqtt.packettypes import PacketTypes

    start = time.monotonic()
    s = _Session(plan.conn)
    received = [0]
    pending: dict[int, list[str]] = {}
    out = sys.stdout.buffer
    eol = b"\n" if plan.eol else b""

    def subscribe() -> None:
        for sub in plan.subscriptions:
            props = _properties(PacketTypes.SUBSCRIBE, sub.user_properties)
            _, mid = s.client.subscribe(sub.topic_filter, plan.qos, properties=props)
            pending[mid] = [sub.topic_filter]
            s.say(
                f"Client {s.client_id} sending SUBSCRIBE (Mid: {mid}, Topic: {sub.topic_filter}, "
                f"QoS: {plan.qos}, Options: 0x00)"
            )

    def on_subscribe(_c: Any, _u: Any, mid: int, codes: Any, props: Any = None) -> None:
        filters = pending.pop(mid, ["?"])
        s.say(f"Subscribed (mid: {mid}): " + ", ".join(str(int(rc.value)) for rc in codes))
        for f, rc in zip(filters, codes, strict=False):
            if rc.is_failure:
                s.fail(f"subscription to {f!r} refused: {_reason(rc, props)}")

    def on_message(_c: Any, _u: Any, msg: Any) -> None:
        if (plan.count and received[0] >= plan.count) or (msg.retain and not plan.retained):
            return
        line = msg.topic.encode() + b" " + msg.payload if plan.verbose else msg.payload
        out.write(line + eol)
        out.flush()
        received[0] += 1

    s.on_ready.append(subscribe)
    s.open()
    s.client.on_subscribe = on_subscribe
    s.client.on_message = on_message
    deadline = start + plan.timeout if plan.timeout else None
    try:
        finished = s.run(lambda: bool(plan.count) and received[0] >= plan.count, deadline)
        if not finished:
            raise _Refused(f"timed out after {plan.timeout:g} s (-W)", TIMEOUT_STATUS)
    except KeyboardInterrupt:
        pass
    finally:
        s.close()


# -- the commands --------------------------------------------------------------------------------


def _guarded(command: str, args: argparse.Namespace, body: Callable[[], None]) -> int:
    """Run ``body``: 0, or one line ``siftmq <command>: ...`` and the status (module docstring)."""
    try:
        body()
    except _BadInput as exc:
        return _say(command, str(exc), _BAD_INPUT_STATUS)
    except _Refused as exc:
        return _say(command, str(exc), exc.status)
    except Exception as exc:
        if getattr(args, "debug", False):
            traceback.print_exc()
        return _say(command, f"error: {type(exc).__name__}: {exc}", 1)
    return 0


def _say(command: str, message: str, status: int) -> int:
    print(f"siftmq {command}: {message}", file=sys.stderr)
    return status


def _pub(args: argparse.Namespace) -> int:
    return _guarded("pub", args, lambda: _pub_session(_pub_plan(args)))


def _sub(args: argparse.Namespace) -> int:
    return _guarded("sub", args, lambda: _sub_session(_sub_plan(args)))
