"""``siftmq serve`` (a subprocess) configured by the ``[serve]`` keys of ``broker.authn``:
a JWT key file from the TOML file, paho clients with a good and a forged token; a bad value is
one line and exit status 2."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jwt
import pytest

from broker._extras import MissingExtra
from broker.authn import HttpAuth
from tests.security.test_cli_auth import run, serve, try_connect

SECRET = b"a-test-secret-of-64-bytes-length-enough-for-HS512-and-the-rest!!"


def test_serve_with_a_jwt_key_from_the_serve_table(tmp_path: Path) -> None:
    key = tmp_path / "jwt.key"
    key.write_bytes(SECRET)
    conf = tmp_path / "siftmq.toml"
    conf.write_text(
        f'[serve]\nauth_jwt_key_file = "{key}"\nauth_jwt_algorithms = ["HS256"]\nauth_jwt_audience = "mqtt"\n'
    )
    exp = int(time.time()) + 600
    good = jwt.encode({"username": "alice", "aud": "mqtt", "exp": exp}, SECRET, "HS256")
    forged = jwt.encode({"username": "alice", "aud": "mqtt", "exp": exp}, SECRET[::-1], "HS256")
    with serve("--config", str(conf)) as ports:
        for version in (4, 5):
            assert try_connect(ports["tcp"], version, username="alice", password=good) == 0
            assert try_connect(ports["tcp"], version, username="alice", password=forged) == 135


def test_a_bad_auth_value_is_one_line_and_status_2(tmp_path: Path) -> None:
    conf = tmp_path / "siftmq.toml"
    conf.write_text(f'[serve]\nauth_jwt_key_file = "{tmp_path}/k"\nauth_jwt_algorithms = ["none"]\n')
    r = run("serve", "--port", "0", "--no-persistence", "--config", str(conf))
    assert r.returncode == 2
    assert "'none' is refused" in r.stderr


def test_without_the_auth_extra_building_a_backend_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp absent (``sys.modules`` entry None: ``find_spec`` finds nothing): one line naming
    ``pip install 'siftmq[auth]'``, an ImportError."""
    monkeypatch.setitem(sys.modules, "aiohttp", None)
    with pytest.raises(MissingExtra, match=r"HttpAuth needs the 'auth' extra \(aiohttp is not installed\): "
                       r"pip install 'siftmq\[auth\]'"):  # fmt: skip
        HttpAuth("http://127.0.0.1:1/auth")


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        ('auth_http_url = "ftp://auth.example/x"', "url must be http://"),
        ('auth_http_url = "auth.example/x"', "url must be http://"),
        ('auth_http_url = "http://a"\nauth_http_headers = {"X-Key" = "a\\nb"}', "header 'X-Key'"),
    ],
)
def test_an_unusable_auth_service_url_or_header_is_refused_at_start(
    tmp_path: Path, lines: str, said: str
) -> None:
    """Not found at the first CONNECT (every one refused 0x88 as if the service were down)."""
    conf = tmp_path / "siftmq.toml"
    conf.write_text(f"[serve]\n{lines}\n")
    r = run("serve", "--port", "0", "--no-persistence", "--config", str(conf))
    assert r.returncode == 2
    assert r.stderr.startswith("siftmq serve: HttpAuth: ") and said in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
