"""The outbound bridge's hand-made PUBACK (``uplink._bridge._puback``, kept because the codec is
slower on the relay's path: benchmarks/bench_uplink_puback.py) is exactly what the protocol
codec encodes for a successful PUBACK, in MQTT 3.1.1 and 5, and what a real decoder reads back."""

from __future__ import annotations

import pytest

from broker.packets import Decoder, Puback, ReasonCode, encode
from uplink._bridge import _puback


@pytest.mark.parametrize("pid", [1, 2, 255, 256, 4242, 65534, 65535])
@pytest.mark.parametrize("version", [4, 5])
def test_puback_is_the_codecs_successful_puback(pid: int, version: int) -> None:
    wire = _puback(pid)
    assert wire == encode(Puback(pid), version)
    (packet,) = Decoder(version, server=True).feed(wire)
    assert isinstance(packet, Puback)
    assert packet.packet_id == pid and packet.reason_code is ReasonCode.SUCCESS
