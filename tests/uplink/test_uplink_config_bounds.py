"""Numbers of a ``[[bridges]]`` table out of range are refused at load, naming the key.

Before, ``connect_timeout = nan`` (or -1) loaded, then every connection attempt failed with
an empty error and the broker's stop logged a traceback; ``keep_alive`` above 65535 and
``session_expiry`` above 2**32-1 loaded and could not be encoded in a CONNECT.
"""

from __future__ import annotations

import pytest

from uplink import parse_bridges


def _bridge(**opts: object) -> list[dict[str, object]]:
    return [{"name": "a", "url": "mqtt://127.0.0.1:1", "topics": [{"pattern": "x/#"}], **opts}]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("connect_timeout", float("nan")),
        ("connect_timeout", -1),
        ("connect_timeout", 0),
        ("connect_timeout", float("inf")),
        ("backoff_max", float("inf")),
        ("backoff_min", float("nan")),
        ("keep_alive", 65536),
        ("session_expiry", 2**32),
    ],
)
def test_out_of_range_numbers_are_refused(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"bridges\[0\]: .*{key}"):
        parse_bridges(_bridge(**{key: value}))


def test_edge_values_still_load() -> None:
    (b,) = parse_bridges(
        _bridge(connect_timeout=0.5, keep_alive=65535, session_expiry=2**32 - 1, backoff_max=30)
    )
    assert (b.connect_timeout, b.keep_alive, b.session_expiry) == (0.5, 65535, 2**32 - 1)


@pytest.mark.parametrize(
    ("opts", "key"),
    [
        ({"keyfile": "/k.pem"}, "keyfile needs certfile"),
        ({"protocol": "3.1.1", "password": "pw"}, "password needs username"),
    ],
)
def test_half_given_credentials_are_refused(opts: dict[str, object], key: str) -> None:
    # before: a keyfile without certfile was ignored in silence; a 3.1.1 CONNECT with a
    # password and no username is a protocol violation the remote closes the link on
    with pytest.raises(ValueError, match=rf"bridges\[0\]: {key}"):
        parse_bridges(_bridge(**opts))


def test_a_password_without_username_loads_with_mqtt_5() -> None:
    (b,) = parse_bridges(_bridge(password="pw"))
    assert b.password == "pw" and b.username is None
