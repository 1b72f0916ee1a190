"""Issue 39: ``JwtAuth``'s keys are read again by a reload (``Broker.reload``: SIGHUP to
``siftmq serve``, ``siftmq reload``) and when its JWKS file changes, with real signed tokens
presented by raw MQTT clients to a real ``Broker`` on port 0.  After the change a token
signed by the new key is accepted and one signed by the old key is refused; a file that does
not parse keeps the keys in use."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from broker import Broker
from broker.authn import JwtAuth
from broker.packets import ReasonCode
from tests.broker.test_reload import START, Serve, sighup
from tests.rawclient import RawClient
from tests.waiting import eventually

OLD, NEW = b"the-old-secret-of-at-least-32-bytes!!", b"the-new-secret-of-at-least-32-bytes!!"


def token(key: Any, alg: str = "HS256", kid: str | None = None) -> str:
    now = int(time.time())
    headers = None if kid is None else {"kid": kid}
    return jwt.encode({"username": "alice", "exp": now + 600}, key, alg, headers=headers)


async def login(port: int, tok: str) -> ReasonCode:
    c, ack = await RawClient.connect(port, "c1", username="alice", password=tok.encode())
    await c.close()
    return ack.reason_code


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwks(*keys: tuple[str, bytes]) -> str:
    return json.dumps({"keys": [{"kty": "oct", "kid": kid, "alg": "HS256", "k": b64(k)} for kid, k in keys]})


def replace(path: Path, text: str | bytes) -> None:
    """Write a new version of the file as deployment tools do (a new file renamed over it)."""
    tmp = path.with_suffix(".tmp")
    if isinstance(text, str):
        tmp.write_text(text)
    else:
        tmp.write_bytes(text)
    os.replace(tmp, path)


async def test_a_reload_reads_the_key_file_again(tmp_path: Path) -> None:
    key = tmp_path / "hs.key"
    key.write_bytes(OLD + b"\n")
    auth = JwtAuth(key, watch_interval=0)  # only the reload reads it
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0, auth_failures=0) as b:
        assert await login(b.port, token(OLD)) is ReasonCode.SUCCESS
        replace(key, NEW + b"\n")
        assert await login(b.port, token(NEW)) is ReasonCode.NOT_AUTHORIZED  # not read yet
        result = await b.reload()
        assert result.ok and any("JWT keys" in c for c in result.changed), result
        assert await login(b.port, token(NEW)) is ReasonCode.SUCCESS
        assert await login(b.port, token(OLD)) is ReasonCode.NOT_AUTHORIZED
        assert auth.reloads == 1


async def test_a_reload_of_a_bad_pem_fails_and_keeps_the_key(tmp_path: Path) -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    key = tmp_path / "es.pem"
    key.write_bytes(pem)
    auth = JwtAuth(key, algorithms=["ES256"], watch_interval=0)
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0, auth_failures=0) as b:
        replace(key, b"-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----\n")
        result = await b.reload()
        assert not result.ok and result.error is not None and str(key) in result.error
        assert await login(b.port, token(private, "ES256")) is ReasonCode.SUCCESS  # the old key
        assert b.reload_counters.failed == 1


async def test_a_changed_jwks_file_is_read_again_while_running(tmp_path: Path) -> None:
    path = tmp_path / "keys.jwks"
    path.write_text(jwks(("k1", OLD)))
    auth = JwtAuth(jwks_file=path, watch_interval=0.05)
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0, auth_failures=0) as b:
        assert await login(b.port, token(OLD, kid="k1")) is ReasonCode.SUCCESS
        replace(path, jwks(("k2", NEW)))  # the key rotated: k1 withdrawn, k2 published
        await eventually(lambda: auth.reloads == 1, timeout=10.0)
        assert await login(b.port, token(NEW, kid="k2")) is ReasonCode.SUCCESS
        assert await login(b.port, token(OLD, kid="k1")) is ReasonCode.NOT_AUTHORIZED
        # a broken version: logged, the keys stay; the next good one is read
        replace(path, "{not json")
        replace(path, "{still not json")
        assert await login(b.port, token(NEW, kid="k2")) is ReasonCode.SUCCESS
        replace(path, jwks(("k2", NEW), ("k3", OLD)))
        await eventually(lambda: auth.reloads == 2, timeout=10.0)
        assert await login(b.port, token(OLD, kid="k3")) is ReasonCode.SUCCESS
    assert auth._watcher is None  # stopped with the broker


def test_a_pem_with_hs_and_rs_algorithms_allowed_still_loads(tmp_path: Path) -> None:
    """A key file checked by any allowed algorithm: with HS256 and ES256 both allowed, a PEM
    public key loads (HS refuses it, ES takes it), as before the check existed."""
    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    key = tmp_path / "es.pem"
    key.write_bytes(pem)
    auth = JwtAuth(key, algorithms=["HS256", "ES256"], watch_interval=0)
    assert auth.keys() == 1


def test_the_watch_interval_from_serve_options(tmp_path: Path) -> None:
    from broker.authn import hooks_from_serve_options

    key = tmp_path / "hs.key"
    key.write_bytes(OLD)
    (auth,) = hooks_from_serve_options({"auth_jwt_key_file": str(key), "auth_jwt_watch_interval": 0.5})
    assert isinstance(auth, JwtAuth) and auth.watch_interval == 0.5
    (auth,) = hooks_from_serve_options({"auth_jwt_key_file": str(key)})
    assert isinstance(auth, JwtAuth) and auth.watch_interval == 5.0


async def test_sighup_to_siftmq_serve_reloads_the_jwt_key(tmp_path: Path) -> None:
    """``siftmq serve`` with ``[serve] auth_jwt_key_file`` (the watch off): after a new secret
    is written and ``siftmq reload`` sends SIGHUP, a token of the new secret is accepted and
    one of the old refused; the reload's log line names the JWT keys."""
    key = tmp_path / "jwt.key"
    key.write_bytes(OLD)
    config = tmp_path / "siftmq.toml"
    config.write_text(
        f'[broker]\nsys_interval = 0\nauth_failures = 0\n\n[serve]\nauth_jwt_key_file = "{key}"\n'
        "auth_jwt_watch_interval = 0\n"
    )
    data = tmp_path / "data"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker._cli", "serve", "--port", "0", "--no-bridge",
        "--config", str(config), "--data-dir", str(data),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    serve = Serve(proc)
    try:
        port = int((await serve.line(r"listening on 127\.0\.0\.1:(\d+) \(tcp\)", timeout=START))[1])
        assert await login(port, token(OLD)) is ReasonCode.SUCCESS
        replace(key, NEW)
        mark = len(serve.lines)
        await sighup(data)
        done = await serve.line(r"INFO +broker: reload: (.*)", mark)
        assert re.search(r"JWT keys .*jwt\.key \(1 key\(s\)\)", done[1]), done[1]
        assert await login(port, token(NEW)) is ReasonCode.SUCCESS
        assert await login(port, token(OLD)) is ReasonCode.NOT_AUTHORIZED
    finally:
        await serve.stop()
