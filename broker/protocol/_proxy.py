"""The PROXY protocol header, versions 1 and 2 (HAProxy's specification), parsed sans-IO.

A load balancer that terminates or forwards TCP for the broker (HAProxy, AWS NLB, nginx
``proxy_protocol on``) sends one header before the client's bytes, naming the client's real
address.  A listener with ``proxy_protocol = true`` (``broker._config.Listener``) expects it
first; :class:`ProxyParser` takes the connection's first bytes in any split and answers with
the parsed :class:`ProxyHeader` and the bytes after it (the start of the MQTT or WebSocket
stream), None while the header is incomplete, or raises :class:`ProxyError`.

* **v1** (text): ``PROXY TCP4|TCP6 <src> <dst> <sport> <dport>\\r\\n`` or ``PROXY UNKNOWN
  ...\\r\\n``, 107 bytes at most.  Addresses are checked with :mod:`ipaddress` (the family must
  match), ports are decimal 0..65535.
* **v2** (binary): the 12-byte signature ``\\r\\n\\r\\n\\0\\r\\nQUIT\\n``, version/command byte
  (``0x20`` LOCAL, ``0x21`` PROXY), family/protocol byte (``0x11`` TCP over IPv4, ``0x21`` TCP
  over IPv6, ``0x00`` unspecified), a 16-bit length, the addresses, then TLVs (skipped).  At
  most :data:`MAX_V2` bytes after the fixed 16.

``LOCAL`` (v2: the balancer's own health check), ``UNKNOWN`` (v1) and an unspecified family
keep the connection's own address (``source`` None).  A header that is not one of these is
an error: the caller closes the connection (a client without a balancer in front cannot
spoof an address through a proxy listener's first bytes unless it can reach the listener:
docs/security.md, "PROXY protocol").  Cost: O(header) once per connection; nothing after it.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

__all__ = [
    "MAX_V1",
    "MAX_V2",
    "SIGNATURE",
    "ProxyError",
    "ProxyHeader",
    "ProxyParser",
    "encode_v1",
    "encode_v2",
]

#: the v2 signature: 12 bytes no MQTT or HTTP stream starts with
SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
#: longest v1 header, CRLF included (the specification's 107)
MAX_V1 = 107
#: longest v2 address block + TLVs accepted (the length field allows 65535; balancers send
#: 12 to a few hundred bytes: more is refused rather than buffered)
MAX_V2 = 2048
_V1_PREFIX = b"PROXY "
_PORTS = struct.Struct("!HH")


class ProxyError(ValueError):
    """A malformed PROXY header (or none where one is required)."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A parsed header: ``source``/``destination`` as ``(address, port)``, None for LOCAL /
    UNKNOWN / an unspecified family (the connection's own address applies)."""

    version: int
    source: tuple[str, int] | None = None
    destination: tuple[str, int] | None = None


def _port(text: bytes) -> int:
    if not text.isdigit() or len(text) > 5 or int(text) > 65535:
        raise ProxyError(f"PROXY v1: bad port {text[:8]!r}")
    return int(text)


def _address(text: bytes, version: int) -> str:
    try:
        ip = ipaddress.ip_address(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ProxyError(f"PROXY v1: bad address {text[:48]!r}") from None
    if ip.version != version:
        raise ProxyError(f"PROXY v1: {text[:48]!r} is not an IPv{version} address")
    return str(ip)


def _v1(line: bytes) -> ProxyHeader:
    """One v1 line without its CRLF."""
    parts = line.split(b" ")
    if len(parts) < 2 or parts[0] != b"PROXY":
        raise ProxyError("PROXY v1: malformed header")
    if parts[1] == b"UNKNOWN":
        return ProxyHeader(1)
    family = {b"TCP4": 4, b"TCP6": 6}.get(parts[1])
    if family is None:
        raise ProxyError(f"PROXY v1: unknown protocol {parts[1][:16]!r}")
    if len(parts) != 6:
        raise ProxyError("PROXY v1: expected PROXY TCPn SRC DST SPORT DPORT")
    src, dst = _address(parts[2], family), _address(parts[3], family)
    return ProxyHeader(1, (src, _port(parts[4])), (dst, _port(parts[5])))


def _v2(head: bytes, body: bytes) -> ProxyHeader:
    """A v2 header: ``head`` its fixed 16 bytes, ``body`` the addresses and TLVs."""
    ver_cmd, fam = head[12], head[13]
    if ver_cmd >> 4 != 2:
        raise ProxyError(f"PROXY v2: version {ver_cmd >> 4}")
    command = ver_cmd & 0x0F
    if command == 0:  # LOCAL: the balancer's own connection (health check)
        return ProxyHeader(2)
    if command != 1:
        raise ProxyError(f"PROXY v2: unknown command {command}")
    if fam == 0x00:  # UNSPEC: no address given
        return ProxyHeader(2)
    if fam == 0x11:  # TCP over IPv4
        if len(body) < 12:
            raise ProxyError("PROXY v2: IPv4 addresses cut short")
        sport, dport = _PORTS.unpack_from(body, 8)
        src, dst = str(ipaddress.IPv4Address(body[0:4])), str(ipaddress.IPv4Address(body[4:8]))
        return ProxyHeader(2, (src, sport), (dst, dport))
    if fam == 0x21:  # TCP over IPv6
        if len(body) < 36:
            raise ProxyError("PROXY v2: IPv6 addresses cut short")
        sport, dport = _PORTS.unpack_from(body, 32)
        src, dst = str(ipaddress.IPv6Address(body[0:16])), str(ipaddress.IPv6Address(body[16:32]))
        return ProxyHeader(2, (src, sport), (dst, dport))
    raise ProxyError(f"PROXY v2: unsupported family/protocol 0x{fam:02x} (TCP over IPv4/IPv6 expected)")


class ProxyParser:
    """Collects a connection's first bytes until the PROXY header is complete.

    :meth:`feed` returns ``(header, rest)`` once, None while more bytes are needed, or raises
    :class:`ProxyError`.  Buffers at most ``16 + MAX_V2`` bytes.
    """

    __slots__ = ("buffer",)

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, data: bytes) -> tuple[ProxyHeader, bytes] | None:
        buf = self.buffer + data if self.buffer else data
        self.buffer = buf
        if SIGNATURE.startswith(buf[:12]):
            if len(buf) < 16:
                return None
            (length,) = struct.unpack_from("!H", buf, 14)
            if length > MAX_V2:
                raise ProxyError(f"PROXY v2: {length} bytes of addresses and TLVs (at most {MAX_V2})")
            if len(buf) < 16 + length:
                return None
            self.buffer = b""
            return _v2(buf[:16], buf[16 : 16 + length]), buf[16 + length :]
        if _V1_PREFIX.startswith(buf[:6]):
            end = buf.find(b"\r\n", 0, MAX_V1)
            if end < 0:
                if len(buf) >= MAX_V1:
                    raise ProxyError(f"PROXY v1: no CRLF within {MAX_V1} bytes")
                return None
            self.buffer = b""
            return _v1(buf[:end]), buf[end + 2 :]
        raise ProxyError("no PROXY protocol header (the listener requires one)")


def encode_v1(header: ProxyHeader) -> bytes:
    """The v1 line of ``header`` (UNKNOWN without addresses). O(1)."""
    if header.source is None or header.destination is None:
        return b"PROXY UNKNOWN\r\n"
    (src, sport), (dst, dport) = header.source, header.destination
    family = "TCP6" if ":" in src else "TCP4"
    return f"PROXY {family} {src} {dst} {sport} {dport}\r\n".encode("ascii")


def encode_v2(header: ProxyHeader, tlvs: bytes = b"") -> bytes:
    """The v2 bytes of ``header`` (LOCAL without addresses), ``tlvs`` appended as they are."""
    if header.source is None or header.destination is None:
        return SIGNATURE + bytes((0x20, 0x00)) + struct.pack("!H", len(tlvs)) + tlvs
    (src, sport), (dst, dport) = header.source, header.destination
    a, b = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    body = a.packed + b.packed + _PORTS.pack(sport, dport) + tlvs
    fam = 0x21 if a.version == 6 else 0x11
    return SIGNATURE + bytes((0x21, fam)) + struct.pack("!H", len(body)) + body
