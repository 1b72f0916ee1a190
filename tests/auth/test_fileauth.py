"""FileAuth as a hook object: opinions, login memo, reload."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.auth import AclError, FileAuth, PasswordFileError
from tests.auth.helpers import FAST, write_passwords


def test_no_files_means_no_opinion_except_for_anonymous() -> None:
    closed, open_ = FileAuth(), FileAuth(allow_anonymous=True)
    assert closed.authenticate("c", None, None) is False
    assert open_.authenticate("c", None, None) is True
    assert closed.authenticate("c", "alice", b"pw") is None
    assert closed.authorize("c", "alice", "publish", "a") is None


def test_authenticate_and_login_memo(tmp_path: Path) -> None:
    auth = FileAuth(password_file=write_passwords(tmp_path / "pw", {"alice": "pw1"}), params=FAST)
    assert auth.authenticate("c", "alice", b"pw1") is True
    assert set(auth._logged_in) == {"alice"}
    assert auth.authenticate("c", "alice", b"pw1") is True  # memoised: HMAC compare, no scrypt
    assert auth.authenticate("c", "alice", b"pw2") is False  # the memo never lets another password in
    assert auth.authenticate("c", "alice", None) is False
    assert auth.authenticate("c", "bob", b"pw1") is False
    auth._check()


def test_reload_swaps_files_and_keeps_the_old_ones_on_error(tmp_path: Path) -> None:
    pw = write_passwords(tmp_path / "pw", {"alice": "old"})
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic write a/#\n")
    auth = FileAuth(password_file=pw, acl_file=acl, params=FAST)
    assert auth.authenticate("c", "alice", b"old") and auth.authorize("c", "alice", "publish", "a/b")
    write_passwords(pw, {"alice": "new"})
    acl.write_text("user alice\ntopic write b/#\n")
    auth.reload()
    assert auth.authenticate("c", "alice", b"old") is False  # the memo was dropped with the file
    assert auth.authenticate("c", "alice", b"new") is True
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
