"""``siftmq pub`` and ``siftmq sub``: command-line clients like mosquitto_pub / mosquitto_sub
(issue 19, item 2; CONTRACT.md, "Operations").

The flags are mosquitto's where they exist (``-h`` is the host, so help is ``--help`` only):
``-h -p -t -m -q -r -C -v -u -P -i -k -V -n -l -s -W --cafile -D``, plus siftmq's content
filter (``--filter SELECTOR``: MQTT 5 user property ``filter``, MQTT 3.1.1
``$filter/<selector>/<topic>``) and composite subscriptions (``--composite NAME=EXPRESSION``:
``$composite/<name>`` with the user property ``composite`` on MQTT 5,
``$composite/<name>/<expression>`` on 3.1.1; docs/composite.md). They are thin wrappers
around paho-mqtt's client; exit status 0 on success, 1 on bad arguments or a refused or
failed connection (the reason is printed), as mosquitto's clients do.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable
from typing import Any

from broker.plugins import Subparsers

__all__ = ["register"]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--help", action="help", help="show this help message and exit")
    p.add_argument("-h", "--host", default="localhost", help="broker host (default localhost)")
    p.add_argument("-p", "--port", type=int, default=1883, help="broker port (default 1883)")
    p.add_argument("-i", "--id", default="", help="client id (default: assigned)")
    p.add_argument("-k", "--keepalive", type=int, default=60, help="keep-alive seconds (default 60)")
    p.add_argument("-q", "--qos", type=int, choices=(0, 1, 2), default=0, help="QoS (default 0)")
    p.add_argument("-u", "--username", default=None, help="user name")
    p.add_argument("-P", "--pw", default=None, help="password")
    p.add_argument("--cafile", default=None, help="CA certificates: connect with TLS")
    p.add_argument(
        "-V",
        "--protocol-version",
        choices=("mqttv311", "mqttv5", "311", "5"),
        default="mqttv5",
        help="MQTT version (default mqttv5)",
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


def register(subparsers: Subparsers) -> None:
    """Add ``pub`` and ``sub``."""
    pub = subparsers.add_parser("pub", add_help=False, help="publish a message (like mosquitto_pub)")
    _common(pub)
    pub.add_argument("-t", "--topic", required=True, help="topic to publish to")
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
    sub.add_argument("-W", "--timeout", type=float, default=0, help="exit after this many seconds")
    sub.add_argument("--filter", default=None, help="content filter (selector) on every topic")
    sub.add_argument(
        "--composite",
        action="append",
        default=[],
        metavar="NAME=EXPRESSION",
        help="composite subscription (docs/composite.md)",
    )
    sub.set_defaults(func=_sub)


def _v5(args: argparse.Namespace) -> bool:
    return str(args.protocol_version).endswith("5")


def _user_props(args: argparse.Namespace) -> list[tuple[str, str]]:
    out = []
    for item in args.property:
        if len(item) == 4 and item[1] == "user-property":  # mosquitto: -D publish user-property K V
            out.append((item[2], item[3]))
        elif len(item) == 2:
            out.append((item[0], item[1]))
        else:
            raise ValueError(f"-D {' '.join(item)}: expected -D KEY VALUE")
    return out


def _client(args: argparse.Namespace, on_connect: Callable[..., None]) -> Any:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    v5 = _v5(args)
    c = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        args.id,
        protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
        clean_session=None if v5 else True,
    )
    if args.username is not None:
        c.username_pw_set(args.username, args.pw)
    if args.cafile is not None:
        c.tls_set(ca_certs=args.cafile)
    c.on_connect = on_connect
    return c


def _connect(c: Any, args: argparse.Namespace) -> str | None:
    """Connect; the error text, or None."""
    try:
        c.connect(args.host, args.port, args.keepalive)
    except (OSError, ValueError) as exc:
        return f"Error: {exc}"
    return None


def _properties(packet_type: int) -> Any:
    """paho's ``Properties`` (its constructor is untyped)."""
    from paho.mqtt.properties import Properties

    cls: Any = Properties
    return cls(packet_type)


def _pub(args: argparse.Namespace) -> int:
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes

    try:
        user = _user_props(args)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.message is not None:
        payloads = [args.message.encode()]
    elif args.null_message:
        payloads = [b""]
    elif args.file is not None:
        with open(args.file, "rb") as fh:
            payloads = [fh.read()]
    elif args.stdin_file:
        payloads = [sys.stdin.buffer.read()]
    else:
        payloads = [line.rstrip(b"\n") for line in sys.stdin.buffer]
    ready = threading.Event()
    refused: list[str] = []

    def on_connect(_c: Any, _u: Any, _f: Any, rc: Any, _p: Any = None) -> None:
        if rc.is_failure:
            refused.append(f"Connection error: {rc}")
        ready.set()

    c = _client(args, on_connect)
    err = _connect(c, args)
    if err is not None:
        print(err, file=sys.stderr)
        return 1
    c.loop_start()
    try:
        if not ready.wait(10) or refused:
            print(refused[0] if refused else "Error: no CONNACK", file=sys.stderr)
            return 1
        props = None
        if user and _v5(args):
            props = _properties(PacketTypes.PUBLISH)
            props.UserProperty = user
        for payload in payloads:
            info = c.publish(args.topic, payload, args.qos, args.retain, properties=props)
            info.wait_for_publish(10)
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                print(f"Error: publish failed ({mqtt.error_string(info.rc)})", file=sys.stderr)
                return 1
    finally:
        c.disconnect()
        c.loop_stop()
    return 0


def _subscriptions(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """(filter, properties) per SUBSCRIBE to send."""
    from paho.mqtt.packettypes import PacketTypes

    v5 = _v5(args)
    user = _user_props(args)
    out: list[tuple[str, Any]] = []
    for t in args.topic:
        pairs = list(user)
        topic = t
        if args.filter is not None:
            if v5:
                pairs.append(("filter", args.filter))
            else:
                topic = f"$filter/{args.filter}/{t}"
        out.append((topic, pairs))
    for spec in args.composite:
        name, sep, expr = spec.partition("=")
        if not sep or not name or not expr:
            raise ValueError(f"--composite {spec!r}: expected NAME=EXPRESSION")
        if v5:
            out.append((f"$composite/{name}", [*user, ("composite", expr)]))
        else:
            out.append((f"$composite/{name}/{expr}", list(user)))
    result = []
    for topic, pairs in out:
        props = None
        if pairs and v5:
            props = _properties(PacketTypes.SUBSCRIBE)
            props.UserProperty = pairs
        result.append((topic, props))
    return result


def _sub(args: argparse.Namespace) -> int:
    if not args.topic and not args.composite:
        print("Error: at least one -t topic or --composite is needed", file=sys.stderr)
        return 1
    try:
        subs = _subscriptions(args)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    done = threading.Event()
    failed: list[str] = []
    received = [0]
    out = sys.stdout

    def on_connect(c: Any, _u: Any, _f: Any, rc: Any, _p: Any = None) -> None:
        if rc.is_failure:
            failed.append(f"Connection error: {rc}")
            done.set()
            return
        for topic, props in subs:
            c.subscribe(topic, args.qos, properties=props)

    def on_subscribe(_c: Any, _u: Any, _mid: Any, codes: Any, _p: Any = None) -> None:
        bad = [rc for rc in codes if rc.is_failure]
        if bad:
            failed.append(f"Subscription refused: {bad[0]}")
            done.set()

    def on_message(_c: Any, _u: Any, msg: Any) -> None:
        text = msg.payload.decode("utf-8", "replace")
        out.write(f"{msg.topic} {text}\n" if args.verbose else f"{text}\n")
        out.flush()
        received[0] += 1
        if args.count and received[0] >= args.count:
            done.set()

    c = _client(args, on_connect)
    c.on_subscribe = on_subscribe
    c.on_message = on_message
    err = _connect(c, args)
    if err is not None:
        print(err, file=sys.stderr)
        return 1
    c.loop_start()
    try:
        done.wait(args.timeout or None)
    except KeyboardInterrupt:
        pass
    finally:
        c.disconnect()
        c.loop_stop()
    if failed:
        print(failed[0], file=sys.stderr)
        return 1
    if args.timeout and args.count and received[0] < args.count:
        print(f"Timed out after {args.timeout:g} s", file=sys.stderr)
        return 27  # mosquitto_sub's exit status for -W
    return 0
