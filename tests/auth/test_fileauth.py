"""FileAuth as a hook object: opinions, login memo, reload.

A login FileAuth has to hash is answered with an awaitable (the scrypt runs on its thread
pool, issue 37); ``verdict`` awaits it, so these tests see the opinion either way.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from broker.auth import AclError, FileAuth, PasswordFileError
from broker.hooks import AuthVerdict
from tests.auth.helpers import FAST, write_passwords


async def verdict(answer: AuthVerdict) -> bool | None:
    return await answer if inspect.isawaitable(answer) else answer


def test_no_files_means_no_opinion_except_for_anonymous() -> None:
    closed, open_ = FileAuth(), FileAuth(allow_anonymous=True)
    assert closed.authenticate("c", None, None) is False
    assert open_.authenticate("c", None, None) is True
    assert closed.authenticate("c", "alice", b"pw") is None
    assert closed.authorize("c", "alice", "publish", "a") is None


async def test_authenticate_and_login_memo(tmp_path: Path) -> None:
    auth = FileAuth(password_file=write_passwords(tmp_path / "pw", {"alice": "pw1"}), params=FAST)
    first = auth.authenticate("c", "alice", b"pw1")
    assert inspect.isawaitable(first)  # not remembered yet: scrypt on the pool
    assert await first is True
    assert set(auth._logged_in) == {"alice"}
    assert auth.authenticate("c", "alice", b"pw1") is True  # memoised: one HMAC, answered at once
    # the memo never lets another password in
    assert await verdict(auth.authenticate("c", "alice", b"pw2")) is False
    assert await verdict(auth.authenticate("c", "alice", None)) is False
    assert await verdict(auth.authenticate("c", "bob", b"pw1")) is False
    assert auth.pool.checks == 4  # the memoised login was answered without the pool
    auth._check()
    await auth.stop()


async def test_reload_swaps_files_and_keeps_the_old_ones_on_error(tmp_path: Path) -> None:
    pw = write_passwords(tmp_path / "pw", {"alice": "old"})
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic write a/#\n")
    auth = FileAuth(password_file=pw, acl_file=acl, params=FAST)
    assert await verdict(auth.authenticate("c", "alice", b"old"))
    assert auth.authorize("c", "alice", "publish", "a/b")
    write_passwords(pw, {"alice": "new"})
    acl.write_text("user alice\ntopic write b/#\n")
    auth.reload()
    # the memo was dropped with the file
    assert await verdict(auth.authenticate("c", "alice", b"old")) is False
    assert await verdict(auth.authenticate("c", "alice", b"new")) is True
    assert auth.authorize("c", "alice", "publish", "a/b") is False
    assert auth.authorize("c", "alice", "publish", "b/c") is True
    acl.write_text("user alice\nbogus line\n")
    with pytest.raises(AclError, match="line 2"):
        auth.reload()
    assert auth.authorize("c", "alice", "publish", "b/c") is True  # previous ACL still in force
    pw.write_text("alice\n")
    with pytest.raises(PasswordFileError, match="line 1"):
        FileAuth(password_file=pw)
    auth._check()
    await auth.stop()
