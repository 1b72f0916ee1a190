"""Helpers of the auth tests: cheap scrypt parameters (tests only) and a password-file writer."""

from __future__ import annotations

from pathlib import Path

from broker._passwd import PasswordFile, Scrypt

FAST = Scrypt(log2_n=4, r=1, p=1)  # tests only: production default is Scrypt() = n 2**14, r 8, p 1


def write_passwords(path: Path, users: dict[str, str]) -> Path:
    pf = PasswordFile(FAST)
    for name, password in users.items():
        pf.set(name, password)
    pf.save(path)
    return path
