"""Authentication and authorisation hooks: password file + ACL file (issue 7, item 2).

``FileAuth(password_file=..., acl_file=..., allow_anonymous=False)`` plugs into
``Broker(hooks=[...])`` through :class:`broker.hooks.Hooks`:

* ``authenticate`` -- a client without a user name gets ``allow_anonymous`` (True/False;
  the listener's own rule, ``Listener.anonymous`` in ``broker.net._listeners``, is applied
  before any hook, so ``siftmq serve`` builds this hook with ``allow_anonymous=True``);
  with a user name and a password file, True iff the password verifies (``broker._passwd``:
  salted scrypt, constant-time compare); with a user name and no password file, no opinion
  (None: the next hook or the broker's configuration decides).
* ``authorize`` -- with an ACL file, True/False from ``broker._acl`` for the actions
  ``"publish"`` (topic name), ``"subscribe"`` (topic filter, ``$share``/``$filter``
  unwrapped) and ``"receive"`` (topic name of a delivery, e.g. a retained message); without
  one, no opinion.

Both files are read when the hook is built (errors raise at once, with line numbers) and again
by :meth:`FileAuth.reload`, which swaps them in only when both parse.

scrypt costs tens of milliseconds and the hook interface is synchronous, so each
successful login is remembered as an HMAC-SHA256 of the password under a per-process
random key: a client that reconnects with the same password costs one HMAC, not one
scrypt.  Failed logins always pay the full scrypt (no shortcut for guessing).  See
docs/security.md for the file formats and the broker-side requirements.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from broker._acl import AccessList, AclError
from broker._passwd import PasswordFile, PasswordFileError, Scrypt
from broker.hooks import Hooks

__all__ = ["AccessList", "AclError", "FileAuth", "PasswordFile", "PasswordFileError", "Scrypt"]


class FileAuth(Hooks):
    """Password-file authentication and ACL authorisation as one broker hook.

    ``password_file``/``acl_file`` are paths (None: that part has no opinion).  ``params``
    are the scrypt parameters used when this object writes hashes (``add_user``); reading
    always uses the parameters stored on each line.
    """

    def __init__(
        self,
        password_file: str | os.PathLike[str] | None = None,
        acl_file: str | os.PathLike[str] | None = None,
        allow_anonymous: bool = False,
        *,
        params: Scrypt | None = None,
    ) -> None:
        self.password_file = None if password_file is None else Path(password_file)
        self.acl_file = None if acl_file is None else Path(acl_file)
        self.allow_anonymous = allow_anonymous
        self.params = params
        self._key = secrets.token_bytes(32)
        self._logged_in: dict[str, bytes] = {}
        self.passwords: PasswordFile | None = None
        self.acl: AccessList | None = None
        self.reload()

    def reload(self) -> None:
        """Re-read both files; on any error raise and keep the previous state."""
        passwords = None if self.password_file is None else PasswordFile.load(self.password_file, self.params)
        acl = None if self.acl_file is None else AccessList.load(self.acl_file)
        self.passwords, self.acl = passwords, acl
        self._logged_in = {}

    def _check(self) -> None:
        if self.passwords is not None:
            self.passwords._check()
            assert set(self._logged_in) <= set(self.passwords.entries)
        if self.acl is not None:
            self.acl._check()

    def _mac(self, username: str, password: bytes) -> bytes:
        return hmac.new(self._key, username.encode("utf-8") + b"\0" + password, hashlib.sha256).digest()

    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> bool | None:
        if username is None:
            return self.allow_anonymous
        passwords = self.passwords
        if passwords is None:
            return None
        if password is not None:
            known = self._logged_in.get(username)
            if known is not None and hmac.compare_digest(known, self._mac(username, password)):
                return True
        ok = passwords.verify(username, password)
        if ok and password is not None:
            self._logged_in[username] = self._mac(username, password)
        return ok

    def authorize(self, client_id: str, username: str | None, action: str, topic: str) -> bool | None:
        acl = self.acl
        if acl is None:
            return None
        return acl.allows(username, client_id, action, topic)
