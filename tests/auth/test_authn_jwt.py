"""Issue 39, item 2: ``broker.authn.JwtAuth`` with real signed tokens (PyJWT, keys made by
``cryptography`` in the test) presented by real MQTT clients (raw, over loopback) to a real
``Broker`` on port 0: the good token in, every bad one out (expired, not yet valid, wrong key,
wrong or ``none`` alg, wrong audience/issuer, another user's), and the claims' rules applied.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from broker import Broker
from broker.auth import CheckPool
from broker.authn import JwtAuth
from broker.packets import ReasonCode
from tests.rawclient import RawClient

ACCEPTED = (ReasonCode.SUCCESS, ReasonCode.NO_MATCHING_SUBSCRIBERS)
SECRET = b"a-test-secret-of-64-bytes-length-enough-for-HS512-and-the-rest!!"


def claims(**kw: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"username": "alice", "exp": now + 600, "iat": now, **kw}


def hs_key(tmp_path: Path) -> Path:
    path = tmp_path / "hs.key"
    path.write_bytes(SECRET + b"\n")
    return path


def hs(payload: dict[str, Any], key: bytes = SECRET, alg: str = "HS256") -> str:
    return jwt.encode(payload, key, alg)


async def login(
    port: int, token: str | bytes | None, username: str | None = "alice", version: int = 5
) -> Any:
    password = None if token is None else token.encode()
    c, ack = await RawClient.connect(port, "c1", version, username=username, password=password)
    await c.close()
    return ack.reason_code


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(payload: dict[str, Any]) -> str:
    """A token with ``alg: none`` (no signature), written by hand as an attacker would."""
    return f"{b64(json.dumps({'alg': 'none', 'typ': 'JWT'}).encode())}.{b64(json.dumps(payload).encode())}."


async def test_hs256_good_and_bad_tokens(tmp_path: Path) -> None:
    auth = JwtAuth(hs_key(tmp_path), algorithms=["HS256"], audience="siftmq", issuer="https://idp")
    good = {"aud": "siftmq", "iss": "https://idp"}
    now = int(time.time())
    deny, ok = ReasonCode.NOT_AUTHORIZED, ReasonCode.SUCCESS
    other_key = b"another-secret-of-64-bytes-length-enough-for-HS512-and-the-rest!"
    no_exp = {k: v for k, v in claims(**good).items() if k != "exp"}
    cases = [
        (hs(claims(**good)), "alice", ok),
        (hs(claims(**good)), None, ok),  # no user name: the token's
        (hs(claims(**good, exp=now - 60)), "alice", deny),  # expired
        (hs(claims(**good, nbf=now + 600)), "alice", deny),  # not yet valid
        (hs(no_exp), "alice", deny),  # exp is required
        (hs(claims(**good), other_key), "alice", deny),  # wrong key
        (hs(claims(**good), alg="HS512"), "alice", deny),  # alg not allowed
        (unsigned(claims(**good)), "alice", deny),  # alg none
        (hs(claims(aud="other", iss="https://idp")), "alice", deny),
        (hs(claims(aud="siftmq", iss="https://evil")), "alice", deny),
        (hs(claims(**good)), "mallory", deny),  # another user's token
        ("not.a.token", "alice", deny),
    ]
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0, auth_failures=0) as b:
        got = [await login(b.port, token, user) for token, user, _ in cases]
        assert got == [code for _, _, code in cases]
        assert auth.failures == len(cases) - 2
        # 3.1.1: the same refusal is return code 5
        assert await login(b.port, unsigned(claims(**good)), version=4) is ReasonCode.NOT_AUTHORIZED


def test_alg_none_and_unknown_algorithms_are_refused_when_built(tmp_path: Path) -> None:
    for algs in (["none"], ["HS256", "None"], [], ["XS999"]):
        with pytest.raises(ValueError, match="algorithms"):
            JwtAuth(hs_key(tmp_path), algorithms=algs)
    with pytest.raises(ValueError, match="exactly one"):
        JwtAuth(algorithms=["HS256"])


@pytest.mark.parametrize("offload", [False, True])
async def test_rs256_key_file_and_no_algorithm_confusion(tmp_path: Path, offload: bool) -> None:
    """An RS256 public key file: a token signed with the private key is in; a token HMAC-signed
    with the public key's PEM as secret (the classic confusion) and an ES256 one are out.
    The same verdicts with the verification on a CheckPool's threads (``offload``)."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (tmp_path / "rs.pem").write_bytes(pem)
    pool = CheckPool() if offload else None
    auth = JwtAuth(tmp_path / "rs.pem", algorithms=["RS256"], pool=pool)
    other = ec.generate_private_key(ec.SECP256R1())
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0, auth_failures=0) as b:
        assert await login(b.port, jwt.encode(claims(), private, "RS256")) is ReasonCode.SUCCESS
        # PyJWT refuses to HMAC with a PEM: forged by hand, the PEM bytes as the secret
        head, body = (b64(json.dumps(x).encode()) for x in ({"alg": "HS256", "typ": "JWT"}, claims()))
        sig = hmac.new(pem, f"{head}.{body}".encode(), hashlib.sha256).digest()
        forged = f"{head}.{body}.{b64(sig)}"
        assert await login(b.port, forged) is ReasonCode.NOT_AUTHORIZED
        assert await login(b.port, jwt.encode(claims(), other, "ES256")) is ReasonCode.NOT_AUTHORIZED
        assert auth.failures == 2
        assert pool is None or pool.checks == 3


async def test_es256_jwks_by_kid(tmp_path: Path) -> None:
    keys = {kid: ec.generate_private_key(ec.SECP256R1()) for kid in ("k1", "k2")}
    jwks = {"keys": []}
    for kid, key in keys.items():
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
        jwks["keys"].append({**jwk, "kid": kid, "alg": "ES256", "use": "sig"})
    (tmp_path / "jwks.json").write_text(json.dumps(jwks))
    auth = JwtAuth(jwks_file=tmp_path / "jwks.json", algorithms=["ES256"])
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0, auth_failures=0) as b:
        for kid, key in keys.items():
            token = jwt.encode(claims(), key, "ES256", headers={"kid": kid})
            assert await login(b.port, token) is ReasonCode.SUCCESS
        wrong = jwt.encode(claims(), keys["k1"], "ES256", headers={"kid": "k2"})
        assert await login(b.port, wrong) is ReasonCode.NOT_AUTHORIZED
        unknown = jwt.encode(claims(), keys["k1"], "ES256", headers={"kid": "k3"})
        assert await login(b.port, unknown) is ReasonCode.NOT_AUTHORIZED
        no_kid = jwt.encode(claims(), keys["k1"], "ES256")  # two keys: which one?
        assert await login(b.port, no_kid) is ReasonCode.NOT_AUTHORIZED


@pytest.mark.parametrize(
    "acl",
    [
        {"pub": ["out/%u/#"], "sub": ["in/%c/#"]},
        [
            {"permission": "allow", "action": "publish", "topic": "out/%u/#"},
            {"permission": "allow", "action": "subscribe", "topics": ["in/%c/#"]},
        ],
    ],
)
async def test_claims_become_the_clients_rules(tmp_path: Path, acl: object) -> None:
    auth = JwtAuth(hs_key(tmp_path))
    token = jwt.encode(claims(acl=acl), SECRET, "HS256").encode()
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0) as b:
        c, ack = await RawClient.connect(b.port, "c1", username="alice", password=token)
        try:
            assert ack.reason_code is ReasonCode.SUCCESS
            assert b.core.sessions["c1"].authenticated
            assert (await c.publish1("out/alice/x")).reason_code in ACCEPTED
            assert (await c.publish1("out/bob/x")).reason_code is ReasonCode.NOT_AUTHORIZED
            granted = await c.subscribe("in/c1/#", "in/c2/#")
            assert granted.reason_codes == (ReasonCode.GRANTED_QOS_1, ReasonCode.NOT_AUTHORIZED)
        finally:
            await c.close()
        # a token whose acl claim is malformed is refused, not half-applied
        bad = jwt.encode(claims(acl="everything"), SECRET, "HS256")
        assert await login(b.port, bad) is ReasonCode.NOT_AUTHORIZED


async def test_superuser_claim_sub_as_the_name_and_leeway(tmp_path: Path) -> None:
    """``is_superuser`` allows everything despite a narrow ``acl``; without a ``username``
    claim ``sub`` is the name; ``leeway`` accepts a token expired a moment ago, not longer."""
    auth = JwtAuth(hs_key(tmp_path), leeway=30)
    now = int(time.time())
    root = hs({"sub": "root", "exp": now + 600, "is_superuser": True, "acl": {"pub": ["x"]}})
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0, auth_failures=0) as b:
        c, ack = await RawClient.connect(b.port, "c1", username="root", password=root.encode())
        try:
            assert ack.reason_code is ReasonCode.SUCCESS
            assert (await c.publish1("any/topic")).reason_code in ACCEPTED
            assert (await c.subscribe("#")).reason_codes == (ReasonCode.GRANTED_QOS_1,)
        finally:
            await c.close()
        assert (
            await login(b.port, hs({"sub": "root", "exp": now + 600}), "alice") is ReasonCode.NOT_AUTHORIZED
        )
        assert await login(b.port, hs(claims(exp=now - 10))) is ReasonCode.SUCCESS  # within the leeway
        assert await login(b.port, hs(claims(exp=now - 120))) is ReasonCode.NOT_AUTHORIZED
