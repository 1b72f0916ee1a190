"""The one configuration schema (``broker._config.Option``): every option of ``BrokerConfig``,
``Listener``, ``[serve]`` and the plugins declares one, and a bad value from the embedding API
(``Broker(...)``, ``BrokerConfig(...)``) is the same one-line ``ConfigError`` as from the
TOML file or a flag (issue 38, item 2)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from broker import Broker
from broker._cli import load_plugins, serve_schema
from broker._config import BrokerConfig, ConfigError, Kind, Listener, load_toml, option_of


def test_every_field_and_serve_key_declares_its_option() -> None:
    for cls in (BrokerConfig, Listener):
        for f in dataclasses.fields(cls):
            assert option_of(cls, f.name).kind is not Kind.ANY, f.name
    schema = serve_schema(load_plugins())
    for plugin in load_plugins():
        assert plugin.serve_keys <= set(schema)
        declared = getattr(plugin, "serve_options", None)
        assert declared is not None, plugin.name  # no key of a plugin goes unchecked
        assert all(opt.kind is not Kind.ANY for opt in declared.values())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_inflight": "abc"}, 'max_inflight = "abc": expected an integer 1..65535 (messages)'),
        ({"port": 99999}, "port = 99999: expected an integer 0..65535"),
        ({"content_engine": "nope"}, 'content_engine = "nope": expected one of '),
        ({"metrics_listen": "9464"}, 'metrics_listen = "9464": expected HOST:PORT'),
        ({"sys_interval": True}, "sys_interval = true: expected a number >= 0 (seconds)"),
        ({"max_packet_size": 1.5}, "max_packet_size = 1.5: expected an integer 2..268435455 (bytes)"),
        ({"slow_consumer_policy": "wait"}, 'slow_consumer_policy = "wait": expected one of pace, drop'),
        ({"tick_interval": 0}, "tick_interval = 0: expected a number > 0 and <= 60 (seconds)"),
    ],
)
def test_a_bad_keyword_argument_of_broker_is_a_config_error(options: dict[str, object], message: str) -> None:
    """Before: ``Broker(max_inflight="abc")`` started, and every connection failed with a
    TypeError; ``content_engine="nope"`` was a KeyError deep in the router."""
    with pytest.raises(ConfigError) as caught:
        Broker(**options)
    assert str(caught.value).startswith(message)
    key = next(iter(options))
    assert (caught.value.key, caught.value.value) == (key, options[key])


def test_values_are_normalized_once_at_load(tmp_path: Path) -> None:
    cfg = BrokerConfig(sys_interval=3, refused_filters=["a/#"])  # type: ignore[arg-type]
    assert isinstance(cfg.sys_interval, float)
    assert cfg.refused_filters == ("a/#",)
    path = tmp_path / "c.toml"
    path.write_text("[broker]\nconnect-timeout = 5\nmax-inflight = 7\n")
    cfg = load_toml(path)
    assert (cfg.connect_timeout, cfg.max_inflight) == (5.0, 7)
    assert isinstance(cfg.connect_timeout, float)


def test_a_listener_is_checked_like_the_broker() -> None:
    with pytest.raises(ConfigError, match=r'kind = "udp": expected one of tcp, ws'):
        Listener(kind="udp")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"port = 65536: expected an integer 0..65535"):
        Listener(port=65536)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[[quotas]]\nclient_id = "x*"\nmessages_per_second = "ten"\n',
            'quota 1: messages_per_second = "ten": expected a number >= 0 (messages per second)',
        ),
        (
            '[[quotas]]\nmessages_per_second = 5\naction = "kick"\n',
            'quota 1: action = "kick": expected one of pace',
        ),
        (
            "[[quotas]]\nbytes_per_second = 5\nburst_seconds = 0\n",
            "quota 1: burst_seconds = 0: expected a number > 0",
        ),
        ('[[quotas]]\nclient = "x*"\n', "quota 1: unknown option 'client' (did you mean 'client_id'?)"),
        (
            '[[quotas]]\nclient_id = "x*"\n',
            "quota 1: a quota needs messages_per_second and/or bytes_per_second",
        ),
        ("[broker]\nmax_retained_bytes = -1\n", "max_retained_bytes = -1: expected an integer >= 0 (bytes)"),
    ],
)
def test_a_bad_quota_table_is_one_line_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    """``[[quotas]]`` tables are checked key by key like ``[[listeners]]`` (issue 39 merged with
    the schema of issue 38)."""
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ValueError) as caught:
        load_toml(path)
    assert str(caught.value).startswith(f"{path}: {message}")
    assert "\n" not in str(caught.value)


def test_quotas_from_toml_and_keywords_are_the_same_rules(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[broker]\nport = 0\n[[quotas]]\nclient-id = "a*"\nmessages-per-second = 5\n')
    from_file = load_toml(path).quotas
    from_kwargs = BrokerConfig(quotas=[{"client_id": "a*", "messages_per_second": 5.0}]).quotas  # type: ignore[list-item]
    assert from_file == from_kwargs
    assert from_file[0].client_id == "a*"
    assert from_file[0].messages_per_second == 5.0
