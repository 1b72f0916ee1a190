"""Password files of salted, slow hashes (issue 7, item 2; the format of mosquitto_passwd).

One user a line, ``username:$scrypt$ln=14,r=8,p=1$<salt>$<hash>``:

* ``ln`` is log2 of the scrypt cost ``n``; ``r`` the block size; ``p`` the parallelism;
* ``<salt>`` 16 random bytes and ``<hash>`` the 32-byte ``hashlib.scrypt`` output, both in
  standard base64 without ``=`` padding.

Production default: ``n=2**14, r=8, p=1`` (16 MiB of memory, about 0.16 s per hash on the
shared 2-core build machine; the interactive-login parameters of RFC 7914 section 2).  No
seed document covers password storage; this follows mosquitto_passwd's file layout.  The
parameters travel with each line, so a file may mix costs and raising the default later
needs no migration.  ``Scrypt(log2_n=4)`` lowers the cost for tests only.

Blank lines and lines starting with ``#`` are ignored; anything else that does not parse
raises :class:`PasswordFileError` naming the file and the 1-based line number.  Verification
compares digests with ``hmac.compare_digest`` and, for an unknown user, still hashes against
a dummy entry so the time spent does not reveal which user names exist.

Files are written atomically (temporary file in the same directory, ``os.replace``) with
mode 0600.  Reading is O(lines); a lookup is one dict probe plus one scrypt.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PasswordEntry", "PasswordFile", "PasswordFileError", "Scrypt", "check_username"]

_SALT_BYTES = 16
_HASH_BYTES = 32
_LINE = re.compile(r"^\$scrypt\$ln=(\d{1,2}),r=(\d{1,3}),p=(\d{1,3})\$([A-Za-z0-9+/]+)\$([A-Za-z0-9+/]+)$")


class PasswordFileError(ValueError):
    """A malformed password file or user name; the message names the file and line."""


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


@dataclass(frozen=True, slots=True)
class Scrypt:
    """scrypt cost parameters: ``n = 2**log2_n``, block size ``r``, parallelism ``p``."""

    log2_n: int = 14
    r: int = 8
    p: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.log2_n <= 30 or not 1 <= self.r <= 255 or not 1 <= self.p <= 255:
            raise ValueError(f"scrypt parameters out of range: {self}")

    def derive(self, password: bytes, salt: bytes) -> bytes:
        """The raw 32-byte hash (time and memory grow linearly with ``n * r``)."""
        n = 1 << self.log2_n
        maxmem = 128 * self.r * (n + self.p + 2) + (1 << 20)
        return hashlib.scrypt(password, salt=salt, n=n, r=self.r, p=self.p, maxmem=maxmem, dklen=_HASH_BYTES)


@dataclass(frozen=True, slots=True)
class PasswordEntry:
    """One user's hash record: parameters, salt and derived key."""

    params: Scrypt
    salt: bytes
    digest: bytes

    @classmethod
    def create(cls, password: bytes, params: Scrypt | None = None) -> PasswordEntry:
        params = params or Scrypt()
        salt = secrets.token_bytes(_SALT_BYTES)
        return cls(params, salt, params.derive(password, salt))

    @classmethod
    def parse(cls, text: str) -> PasswordEntry:
        """Parse ``$scrypt$ln=..,r=..,p=..$salt$hash``; raises ValueError saying what is wrong."""
        m = _LINE.match(text)
        if m is None:
            raise ValueError("expected $scrypt$ln=<n>,r=<r>,p=<p>$<salt>$<hash>")
        try:
            params = Scrypt(int(m[1]), int(m[2]), int(m[3]))
            salt, digest = _unb64(m[4]), _unb64(m[5])
        except binascii.Error as exc:
            raise ValueError(f"bad base64: {exc}") from None
        if len(digest) != _HASH_BYTES or not salt:
            raise ValueError(f"hash must be {_HASH_BYTES} bytes and the salt non-empty")
        return cls(params, salt, digest)

    def encode(self) -> str:
        p = self.params
        return f"$scrypt$ln={p.log2_n},r={p.r},p={p.p}${_b64(self.salt)}${_b64(self.digest)}"

    def verify(self, password: bytes) -> bool:
        """Constant-time comparison of the derived key (one scrypt at this entry's cost)."""
        return hmac.compare_digest(self.params.derive(password, self.salt), self.digest)


def check_username(name: str) -> None:
    """User names are non-empty, have no ':' and no control characters (they key the file)."""
    if not name or ":" in name or any(ord(c) < 0x20 or c == "\x7f" for c in name):
        raise PasswordFileError(f"invalid user name {name!r}: non-empty, no ':' and no control characters")


class PasswordFile:
    """The users of one password file, in file order (a dict: O(1) lookup, O(n) load/save).

    ``PasswordFile.load(path)`` reads; ``set``/``delete`` change the in-memory copy;
    ``save(path)`` writes atomically; ``verify(user, password)`` checks a login.
    """

    __slots__ = ("_dummy", "entries", "params")

    def __init__(self, params: Scrypt | None = None) -> None:
        self.params = params or Scrypt()
        self.entries: dict[str, PasswordEntry] = {}
        self._dummy: PasswordEntry | None = None

    @classmethod
    def load(cls, path: str | os.PathLike[str], params: Scrypt | None = None) -> PasswordFile:
        """Read a file; raises PasswordFileError (with line number) or OSError."""
        with open(path, encoding="utf-8") as fh:
            return cls.parse(fh.read(), str(path), params)

    @classmethod
    def parse(cls, text: str, source: str = "<password file>", params: Scrypt | None = None) -> PasswordFile:
        pf = cls(params)
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, rest = line.partition(":")
            where = f"{source}, line {number}"
            if not sep:
                raise PasswordFileError(f"{where}: expected 'username:$scrypt$...', found no ':'")
            try:
                check_username(name)
            except PasswordFileError as exc:
                raise PasswordFileError(f"{where}: {exc}") from None
            if name in pf.entries:
                raise PasswordFileError(f"{where}: user {name!r} appears twice")
            try:
                pf.entries[name] = PasswordEntry.parse(rest)
            except ValueError as exc:
                raise PasswordFileError(f"{where}: user {name!r}: {exc}") from None
        pf._check()
        return pf

    def _check(self) -> None:
        for name, entry in self.entries.items():
            check_username(name)
            assert len(entry.digest) == _HASH_BYTES and entry.salt

    def dumps(self) -> str:
        return "".join(f"{name}:{entry.encode()}\n" for name, entry in self.entries.items())

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically, mode 0600 (a reader sees the old or the new file, never half)."""
        target = Path(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or Path("."))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(self.dumps())
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def set(self, username: str, password: str | bytes) -> None:
        """Add or replace a user with a fresh salt at this file's ``params``."""
        check_username(username)
        pw = password.encode("utf-8") if isinstance(password, str) else password
        self.entries[username] = PasswordEntry.create(pw, self.params)

    def delete(self, username: str) -> bool:
        """Remove a user; False when there was none."""
        return self.entries.pop(username, None) is not None

    def __contains__(self, username: object) -> bool:
        return username in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def verify(self, username: str, password: bytes | None) -> bool:
        """True iff the user exists and the password matches (unknown users cost the same)."""
        entry = self.entries.get(username)
        if entry is None:
            if self._dummy is None:
                self._dummy = PasswordEntry.create(secrets.token_bytes(16), self.params)
            self._dummy.verify(password or b"")
            return False
        if password is None:
            entry.verify(b"")
            return False
        return entry.verify(password)
