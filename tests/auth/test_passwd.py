"""Password files: format, hashing, verification, errors with line numbers, the CLI."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

import pytest

from broker._passwd import PasswordEntry, PasswordFile, PasswordFileError, Scrypt
from broker._passwd_cli import register
from tests.auth.helpers import FAST, write_passwords


def test_production_defaults_are_slow_hashes() -> None:
    assert Scrypt() == Scrypt(log2_n=14, r=8, p=1)
    assert PasswordFile().params == Scrypt()


def test_entry_round_trip_and_salting() -> None:
    a = PasswordEntry.create(b"secret", FAST)
    b = PasswordEntry.create(b"secret", FAST)
    assert a.salt != b.salt and a.digest != b.digest  # salted: same password, different hashes
    text = a.encode()
    assert text.startswith("$scrypt$ln=4,r=1,p=1$") and "=" not in text.split("$", 3)[3]
    back = PasswordEntry.parse(text)
    assert back == a
    assert back.verify(b"secret")
    assert not back.verify(b"Secret")
    assert not back.verify(b"")


def test_file_round_trip_mode_and_verify(tmp_path: Path) -> None:
    path = write_passwords(tmp_path / "pw", {"alice": "wonderland", "bob": "builder", "zoë": "ünïcode"})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    pf = PasswordFile.load(path)
    assert list(pf.entries) == ["alice", "bob", "zoë"]
    pf._check()
    assert pf.verify("alice", b"wonderland")
    assert pf.verify("zoë", "ünïcode".encode())
    assert not pf.verify("alice", b"builder")
    assert not pf.verify("alice", None)
    assert not pf.verify("mallory", b"wonderland")
    lines = path.read_text().splitlines()
    assert all(line.split(":", 1)[1].startswith("$scrypt$") for line in lines)


def test_comments_blank_lines_and_mixed_costs(tmp_path: Path) -> None:
    strong = PasswordEntry.create(b"pw1", Scrypt(log2_n=5, r=2, p=1))
    weak = PasswordEntry.create(b"pw2", FAST)
    pf = PasswordFile.parse(f"# users\n\n  a:{strong.encode()}  \nb:{weak.encode()}\n")
    assert pf.verify("a", b"pw1") and pf.verify("b", b"pw2")
    assert len(pf) == 2 and "a" in pf


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("alice", "line 3: expected 'username:$scrypt$...'"),
        (":$scrypt$ln=4,r=1,p=1$AAAA$AAAA", "line 3: invalid user name"),
        ("alice:plaintext", "line 3: user 'alice': expected $scrypt$"),
        ("alice:$scrypt$ln=4,r=1,p=1$AAAA$AAAA", "line 3: user 'alice': hash must be 32 bytes"),
        ("alice:$scrypt$ln=99,r=1,p=1$AAAA$AAAA", "line 3: user 'alice': scrypt parameters out of range"),
        ("alice:$scrypt$ln=4,r=1,p=1$A$AAAA", "line 3: user 'alice': bad base64"),
    ],
)
def test_malformed_lines_name_file_and_line(text: str, message: str) -> None:
    good = PasswordEntry.create(b"x", FAST).encode()
    with pytest.raises(
        PasswordFileError, match="^pw.txt, " + message.replace("$", r"\$").replace("(", r"\(")
    ):
        PasswordFile.parse(f"# header\nzed:{good}\n{text}\n", "pw.txt")


def test_duplicate_user_is_an_error() -> None:
    good = PasswordEntry.create(b"x", FAST).encode()
    with pytest.raises(PasswordFileError, match="line 2: user 'a' appears twice"):
        PasswordFile.parse(f"a:{good}\na:{good}\n")


def test_set_rejects_bad_names_and_delete() -> None:
    pf = PasswordFile(FAST)
    for bad in ("", "a:b", "tab\there"):
        with pytest.raises(PasswordFileError):
            pf.set(bad, "pw")
    pf.set("a", "pw")
    assert pf.delete("a") and not pf.delete("a") and len(pf) == 0


# ------------------------------------------------------------------ siftmq passwd


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="siftmq")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["passwd", *argv])
    return int(args.func(args))


def test_cli_create_batch_update_delete(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    assert cli("-b", str(path), "alice", "one") == 2  # no -c: file must exist
    assert cli("-c", "-b", str(path), "alice", "one") == 0
    assert cli("-b", str(path), "bob", "two") == 0
    pf = PasswordFile.load(path)
    assert pf.entries["alice"].params == Scrypt()  # the command always writes production hashes
    assert pf.verify("alice", b"one") and pf.verify("bob", b"two")
    assert cli("-D", str(path), "alice") == 0
    assert cli("-D", str(path), "alice") == 2
    assert list(PasswordFile.load(path).entries) == ["bob"]
    assert cli("-c", "-b", str(path), "carol", "three") == 0  # -c overwrites
    assert list(PasswordFile.load(path).entries) == ["carol"]


def test_cli_prompts_with_getpass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "pw"
    answers = iter(["typed", "typed", "first", "second"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    assert cli("-c", str(path), "dave") == 0
    assert PasswordFile.load(path).verify("dave", b"typed")
    assert cli(str(path), "dave") == 2  # the two entries differ: nothing written
    assert PasswordFile.load(path).verify("dave", b"typed")


def test_cli_argument_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pw"
    assert cli("-c", "-D", str(path), "a") == 2
    assert cli("-c", str(path), "a", "pw") == 2  # password argument without -b
    assert cli("-c", "-b", str(path), "a:b", "pw") == 2
    assert not path.exists()
    assert "siftmq passwd:" in capsys.readouterr().err
    path.write_text("broken line\n")
    assert cli("-b", str(path), "a", "pw") == 2
    assert "line 1" in capsys.readouterr().err
