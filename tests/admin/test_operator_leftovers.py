"""Operator leftovers of the admin API's review (issue 40 brief, item 4), over real HTTP and a
real ``siftmq serve``:

* the HTTP listener's own refusals (413, 501, 505, 431, 414, 400: sent before any handler
  runs) are JSON ``{"error": ...}`` like every other admin API error; so is ``/metrics``'s
  501 without prometheus-client;
* deleting the user one is logged in as, or the last dashboard admin, is a 409 and the
  password file is left as it was (the API cannot be locked out);
* a top-level table of the ``serve --config`` file that nobody reads is a warning naming it
  and the known tables, once; the plugins' own tables (uplink's ``[[bridges]]``) are not.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from broker import Broker
from broker.auth import FileAuth
from tests.admin.api import call
from tests.auth.helpers import FAST, write_passwords
from tests.dashboard import httpclient as http
from tests.serving import Serve

API = "/api/v1"
ADMIN = http.basic("admin", "adminpw")
OTHER = http.basic("root", "rootpw")


def _json_error(r: http.Reply, status: int) -> str:
    assert r.status == status, (r.status, r.body)
    assert r.headers["content-type"] == "application/json", r.headers
    text: str = r.json()["error"]
    assert text
    return text


# ---------------------------------------------------------------------------- JSON refusals
@pytest_asyncio.fixture
async def b() -> AsyncIterator[Broker]:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0") as broker:
        yield broker


HEAD = "Host: 127.0.0.1\r\nContent-Type: application/json"


@pytest.mark.parametrize(
    ("data", "status", "says"),
    [
        (f"POST {API}/publish HTTP/1.1\r\n{HEAD}\r\nContent-Length: 70000\r\n\r\n", 413, "over 65536 bytes"),
        (
            f"POST {API}/publish HTTP/1.1\r\n{HEAD}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            501,
            "Transfer-Encoding",
        ),
        (f"GET {API}/bans HTTP/2.0\r\n{HEAD}\r\n\r\n", 505, ""),
        (f"GET {API}/bans HTTP/1.1\r\n{HEAD}\r\nX-Pad: {'a' * 20000}\r\n\r\n", 431, "head over"),
        (f"GET {API}/{'a' * 5000} HTTP/1.1\r\n{HEAD}\r\n\r\n", 414, ""),
        (f"GET {API}/bans HTTP/1.1\r\n{HEAD}\r\nContent-Length: -5\r\n\r\n", 400, ""),
    ],
)
async def test_the_listeners_own_refusals_are_json(b: Broker, data: str, status: int, says: str) -> None:
    """Before: ``text/plain`` lines (``request body over 65536 bytes``), while every refusal of
    the API itself is ``{"error": ...}``: a client parsing the error as JSON failed."""
    assert b.metrics_port is not None
    r = await http.raw(b.metrics_port, data.encode())
    assert says in _json_error(r, status)
    assert (await call(b.metrics_port, "GET", API + "/bans")).status == 200  # still serving


async def test_metrics_501_without_prometheus_client_is_json(
    b: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.setitem(sys.modules, "prometheus_client.exposition", None)
    assert b.metrics_port is not None
    assert "siftmq[metrics]" in _json_error(await http.get(b.metrics_port, "/metrics"), 501)


# ---------------------------------------------------------------------------- no lock-out
def _auth(tmp_path: Path, users: dict[str, str]) -> FileAuth:
    return FileAuth(write_passwords(tmp_path / "passwd", users), None, params=FAST)


async def _admins(tmp_path: Path, users: dict[str, str], admins: tuple[str, ...]) -> Broker:
    return Broker(
        host="127.0.0.1",
        port=0,
        sys_interval=0,
        metrics_listen="127.0.0.1:0",
        hooks=[_auth(tmp_path, users)],
        dashboard_admins=admins,
    )


async def test_an_admin_cannot_delete_the_user_they_are_logged_in_as(tmp_path: Path) -> None:
    users = {"admin": "adminpw", "root": "rootpw", "alice": "alicepw"}
    async with await _admins(tmp_path, users, ("admin", "root")) as b:
        assert b.metrics_port is not None
        before = (tmp_path / "passwd").read_text()
        r = await call(b.metrics_port, "DELETE", API + "/users", query={"username": "admin"}, headers=ADMIN)
        assert "logged in as" in _json_error(r, 409)
        assert (tmp_path / "passwd").read_text() == before
        # another admin may delete it; then admin's own login is gone
        r = await call(b.metrics_port, "DELETE", API + "/users", query={"username": "admin"}, headers=OTHER)
        assert r.status == 200, r.body
        assert (await call(b.metrics_port, "GET", API + "/users", headers=ADMIN)).status == 401


async def test_the_last_dashboard_admin_cannot_be_deleted(tmp_path: Path) -> None:
    """Two admins delete each other at the same moment: the password file is rewritten one
    call at a time, and the second finds the caller's victim is the last admin left (409; or
    its login already fails, 401). One admin always remains."""
    users = {"admin": "adminpw", "root": "rootpw", "alice": "alicepw"}
    async with await _admins(tmp_path, users, ("admin", "root")) as b:
        p = b.metrics_port
        assert p is not None
        for who in (ADMIN, OTHER):  # both logins verified (and remembered) first
            assert (await call(p, "GET", API + "/users", headers=who)).status == 200
        one, two = await asyncio.gather(
            call(p, "DELETE", API + "/users", query={"username": "root"}, headers=ADMIN),
            call(p, "DELETE", API + "/users", query={"username": "admin"}, headers=OTHER),
        )
        assert sorted([one.status, two.status]) in ([200, 401], [200, 409]), (one.body, two.body)
        left = (tmp_path / "passwd").read_text()
        assert ("admin:" in left) != ("root:" in left), left
        # an admin with no password in the file does not count: ``ghost`` cannot log in
    users = {"admin": "adminpw", "alice": "alicepw"}
    (tmp_path / "passwd").unlink()
    async with await _admins(tmp_path, users, ("admin", "ghost")) as b:
        assert b.dashboard is not None
        before = (tmp_path / "passwd").read_text()
        # the rule itself, whoever calls (here: a caller that is no user of the file)
        with pytest.raises(Exception, match="last dashboard admin") as refused:
            await b.dashboard.admin.h_user_delete({"username": "admin"}, {}, None, "")
        assert getattr(refused.value, "status", None) == 409
        assert (tmp_path / "passwd").read_text() == before
        got = await b.dashboard.admin.h_user_delete({"username": "alice"}, {}, None, "")
        assert got.status == 200


# ---------------------------------------------------------------------------- config tables
def test_an_unknown_table_is_a_warning_naming_it_and_the_known_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from broker._cli import _load_config, load_plugins

    path = tmp_path / "c.toml"
    path.write_text(
        "[broker]\nport = 0\n\n[brokr]\nport = 1\n\n[serve]\nlog_level = 'INFO'\n\n"
        "[[bridge]]\nname = 'x'\n\n[[bridges]]\nname = 'edge'\nurl = 'mqtt://127.0.0.1:1'\n"
        "topics = [{pattern = 'a/#'}]\n"
    )
    with caplog.at_level(logging.WARNING):
        _load_config(path, load_plugins())
    lines = [r.getMessage() for r in caplog.records if "unknown table" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "[brokr]" in lines[0] and "[bridge]" in lines[1]
    for line in lines:
        assert str(path) in line and "[broker]" in line and "[bridges]" in line and "[serve]" in line


def test_a_top_level_key_beside_a_broker_table_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TOML puts the keys before the first table header at the top level: with a ``[broker]``
    table too, only ``[broker]`` is read and ``port`` here was ignored in silence."""
    from broker._cli import _load_config, load_plugins

    path = tmp_path / "c.toml"
    path.write_text("port = 1884\nrefused_filters = ['a/#']\n\n[broker]\nsys_interval = 0\n")
    with caplog.at_level(logging.WARNING):
        cfg, _ = _load_config(path, load_plugins())
    assert cfg.port == 1883  # not taken, and now said
    lines = [r.getMessage() for r in caplog.records if "top-level key" in r.getMessage()]
    assert len(lines) == 2 and "'port'" in lines[0] and "'refused_filters'" in lines[1], lines


def test_known_tables_and_broker_options_as_tables_are_not_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from broker._cli import _load_config, load_plugins

    path = tmp_path / "c.toml"
    # no [broker] table: top-level keys and tables named like options are the broker's options
    path.write_text(
        "port = 0\n[shared_subscription_group_strategy]\nalarms = 'sticky'\n"
        "[[listeners]]\nport = 0\n[[quotas]]\nmessages_per_second = 5\n[serve]\n"
    )
    with caplog.at_level(logging.WARNING):
        _load_config(path, load_plugins())
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "unknown table" in m or "top-level" in m], said


def test_serve_warns_once_about_an_unknown_table(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[broker]\nsys_interval = 0\n\n[dashbaord]\nenabled = true\n")
    s = Serve("--config", str(path), "--no-persistence", "--data-dir", str(tmp_path / "d"), "--no-bridge")
    try:
        s.port()
        assert s.stop() == 0
    finally:
        s.close()
    warned = [line for line in s.lines if "unknown table [dashbaord]" in line]
    assert len(warned) == 1, s.lines
    assert "WARNING" in warned[0] and "[broker]" in warned[0]
