"""Hypothesis strategies producing valid packets of every type for MQTT 3.1.1 and 5.0.

A packet drawn for version 4 uses only what a 3.1.1 wire can carry (no properties, 3.1.1
return codes), so ``decode(encode(p)) == p`` holds exactly for both versions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st

from broker.packets import (
    NO_PROPERTIES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
)
from broker.protocol import _decode, _wire

__all__ = ["client_packets", "packets_for", "server_packets", "text"]

text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)
u16 = st.integers(0, 0xFFFF)
u16_nz = st.integers(1, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
binary = st.binary(max_size=16)

_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "1": st.integers(0, 1),
    "2": u16_nz,
    "4": u32,
    "s": text,
    "b": binary,
}


def properties(ptype: int, *, server: bool = True) -> st.SearchStrategy[Properties]:
    """Properties allowed in ``ptype`` (0 = will properties)."""
    opt: dict[str, st.SearchStrategy[Any]] = {}
    for _pid, (field, kind, allowed, _values) in _wire.PROPS.items():
        if ptype not in allowed:
            continue
        if kind == "p":
            opt[field] = st.lists(st.tuples(text, text), max_size=3).map(tuple)
        elif kind == "v":
            if ptype == 3 and server:
                continue
            n = 3 if ptype == 3 else 1
            opt[field] = st.lists(st.integers(1, 268_435_455), min_size=1, max_size=n).map(tuple)
        elif field == "maximum_packet_size":
            opt[field] = st.integers(1, 0xFFFFFFFF)
        else:
            opt[field] = _VALUES[kind]
    return st.fixed_dictionaries({}, optional=opt).map(_build)


def _build(kw: dict[str, Any]) -> Properties:
    if "authentication_method" not in kw:
        kw.pop("authentication_data", None)  # data without a method is a protocol error
    return Properties(**kw)


def _props(v: int, ptype: int, *, server: bool = True) -> st.SearchStrategy[Properties]:
    return properties(ptype, server=server) if v == 5 else st.just(NO_PROPERTIES)


def _codes(allowed: frozenset[int]) -> st.SearchStrategy[ReasonCode]:
    return st.sampled_from(sorted(allowed)).map(ReasonCode)


@st.composite
def connects(draw: st.DrawFn, v: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(text),
            draw(binary),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            draw(_props(v, 0)),
        )
    username = draw(st.none() | text)
    password = draw(st.none() | binary) if (username is not None or v == 5) else None
    return Connect(
        draw(text),
        v,
        draw(st.booleans()),
        draw(u16),
        will,
        username,
        password,
        draw(_props(v, 1)),
        "MQIsdp" if v == 3 else "MQTT",
    )


@st.composite
def publishes(draw: st.DrawFn, v: int, server: bool) -> Publish:
    qos = draw(st.integers(0, 2))
    props = draw(_props(v, 3, server=server))
    topic = draw(text)
    if not topic and v == 5 and props.topic_alias is None:
        topic = "t"
    return Publish(
        topic,
        draw(st.binary(max_size=64)),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(u16_nz) if qos else None,
        props,
    )


@st.composite
def subscribes(draw: st.DrawFn, v: int) -> Subscribe:
    def req(d: st.DrawFn) -> SubscriptionRequest:
        f = d(text)
        if v != 5:
            return SubscriptionRequest(f, d(st.integers(0, 2)))
        no_local = d(st.booleans()) and not f.startswith("$share/")
        return SubscriptionRequest(f, d(st.integers(0, 2)), no_local, d(st.booleans()), d(st.integers(0, 2)))

    subs = draw(st.lists(st.composite(req)(), min_size=1, max_size=4))
    return Subscribe(draw(u16_nz), tuple(subs), draw(_props(v, 8)))


def _ack_codes(v: int, allowed: frozenset[int]) -> st.SearchStrategy[ReasonCode]:
    return _codes(allowed) if v == 5 else st.just(ReasonCode.SUCCESS)


def server_packets(v: int) -> st.SearchStrategy[Packet]:
    """Valid client-to-server packets (what a broker's Decoder accepts) for version ``v``."""
    acks = [
        st.builds(cls, u16_nz, _ack_codes(v, codes), _props(v, t))
        for cls, t, codes in (
            (Puback, 4, _decode._PUBACK_CODES),
            (Pubrec, 5, _decode._PUBACK_CODES),
            (Pubrel, 6, _decode._PUBREL_CODES),
            (Pubcomp, 7, _decode._PUBREL_CODES),
        )
    ]
    out: list[st.SearchStrategy[Packet]] = [
        publishes(v, True),
        *acks,
        subscribes(v),
        st.builds(Unsubscribe, u16_nz, st.lists(text, min_size=1, max_size=4).map(tuple), _props(v, 10)),
        st.just(Pingreq()),
    ]
    if v == 5:
        dprops = properties(14).map(lambda p: dataclasses.replace(p, server_reference=None))
        out.append(st.builds(Disconnect, _codes(_decode._DISCONNECT_CODES), dprops))
        out.append(st.builds(Auth, _codes(_decode._AUTH_CODES), properties(15)))
    else:
        out.append(st.just(Disconnect()))
    return st.one_of(out)


def client_packets(v: int) -> st.SearchStrategy[Packet]:
    """Valid server-to-client packets for version ``v`` (what a client's Decoder accepts)."""
    v3_connack = st.sampled_from(sorted(set(_decode._V3_CONNACK_IN.values())))
    v3_suback = st.sampled_from(sorted(set(_decode._V3_SUBACK_IN.values())))
    if v == 5:
        connack = st.builds(Connack, st.booleans(), _codes(_decode._CONNACK_CODES), properties(2))
    else:
        connack = st.builds(lambda sp, c: Connack(sp and c == 0, c, NO_PROPERTIES), st.booleans(), v3_connack)
    acks = [
        st.builds(cls, u16_nz, _ack_codes(v, codes), _props(v, t, server=False))
        for cls, t, codes in (
            (Puback, 4, _decode._PUBACK_CODES),
            (Pubrec, 5, _decode._PUBACK_CODES),
            (Pubrel, 6, _decode._PUBREL_CODES),
            (Pubcomp, 7, _decode._PUBREL_CODES),
        )
    ]
    suback_codes = _codes(_decode._SUBACK_CODES) if v == 5 else v3_suback
    out: list[st.SearchStrategy[Packet]] = [
        connack,
        publishes(v, False),
        *acks,
        st.builds(Suback, u16, st.lists(suback_codes, max_size=4).map(tuple), _props(v, 9, server=False)),
        st.builds(
            Unsuback,
            u16,
            st.lists(_codes(_decode._UNSUBACK_CODES), max_size=4).map(tuple) if v == 5 else st.just(()),
            _props(v, 11, server=False),
        ),
        st.just(Pingresp()),
    ]
    if v == 5:
        out.append(st.builds(Disconnect, _codes(_decode._DISCONNECT_CODES), properties(14, server=False)))
        out.append(st.builds(Auth, _codes(_decode._AUTH_CODES), properties(15, server=False)))
    else:
        out.append(st.just(Disconnect()))
    return st.one_of(out)


def packets_for(v: int) -> st.SearchStrategy[tuple[Connect, list[Packet]]]:
    """A CONNECT then a list of client packets: one valid client-to-server stream."""
    return st.tuples(connects(v), st.lists(server_packets(v), max_size=6))
