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

Password checks run off the event loop (issue 37, item 2): scrypt costs about 0.13-0.16 s
of CPU, so ``authenticate`` answers a login it has to hash with an awaitable
(``broker.hooks.AuthVerdict``) and the broker holds that CONNECT alone while a
:class:`CheckPool` runs ``hashlib.scrypt`` (which releases the GIL) on at most ``workers``
threads, with at most ``max_pending`` checks waiting or running; a login beyond that bound is
refused at once with 0x88 Server unavailable (``AuthUnavailable``; 3.1.1 return code 3),
counted in ``$SYS/broker/connections/refused/auth_busy``.  Each successful login is
remembered as an HMAC-SHA256 of the password under a per-process random key: a client that
reconnects with the same password costs one HMAC, answered at once, not one scrypt.  Failed
logins always pay the full scrypt (no shortcut for guessing); the broker's per-address
back-off (``BrokerConfig.auth_failures``) stops a guesser from making it pay for them.

Only an ``authenticate`` that says True makes a user name *authenticated*; the ACL is asked
with the user name only then (``broker.hooks``, core/_connect.py).  An ACL file without a
password file therefore treats every client as anonymous (its ``user`` sections and ``%u``
patterns never match, unless another hook verifies user names), and says so in one line at
start.  See docs/security.md for the file formats and the broker-side requirements.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import hmac
import logging
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from broker._acl import AccessList, AclError
from broker._passwd import PasswordFile, PasswordFileError, Scrypt
from broker.hooks import AuthUnavailable, AuthVerdict, Hooks

if TYPE_CHECKING:
    from broker._broker import Broker

__all__ = [
    "AccessList",
    "AclError",
    "AuthUnavailable",
    "CheckPool",
    "FileAuth",
    "PasswordFile",
    "PasswordFileError",
    "Scrypt",
]

log = logging.getLogger("broker")

_T = TypeVar("_T")

#: threads hashing passwords at once (scrypt is CPU- and memory-bound: 16 MiB each at the
#: default cost; two leave the event loop a core on a 2-core machine)
DEFAULT_WORKERS = 2
#: password checks waiting or running at most; beyond it a login is refused 0x88 at once.
#: At 0.13 s a check on 2 threads, 32 are about 2 s of work: a client's CONNECT waits at
#: most that long for a verdict, well inside the default connect_timeout (30 s)
DEFAULT_MAX_PENDING = 32


class CheckPool:
    """Runs blocking checks (scrypt) on a few threads, bounded: at most ``workers`` at once and
    ``max_pending`` submitted and not finished; :meth:`submit` past the bound raises
    :class:`AuthUnavailable` at once (nothing queued).  O(1) per call.

    The threads start on first use; :meth:`close` stops them (pending work is cancelled).
    """

    __slots__ = ("_executor", "checks", "max_pending", "pending", "workers")

    def __init__(self, workers: int = DEFAULT_WORKERS, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        if workers < 1 or max_pending < workers:
            raise ValueError("CheckPool: workers >= 1 and max_pending >= workers")
        self.workers = workers
        self.max_pending = max_pending
        self.pending = 0
        self.checks = 0  # submitted so far (a test sees a remembered login cost no check)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def submit(self, fn: Callable[..., _T], *args: object) -> asyncio.Future[_T]:
        """Start ``fn(*args)`` on a thread; an asyncio future of its result (call on the loop)."""
        if self.pending >= self.max_pending:
            raise AuthUnavailable(f"{self.pending} password checks pending")
        executor = self._executor
        if executor is None:
            executor = self._executor = concurrent.futures.ThreadPoolExecutor(
                self.workers, thread_name_prefix="siftmq-auth"
            )
        self.pending += 1
        self.checks += 1
        future = asyncio.wrap_future(executor.submit(fn, *args))
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _future: object) -> None:
        self.pending -= 1

    def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


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
        workers: int = DEFAULT_WORKERS,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        self.password_file = None if password_file is None else Path(password_file)
        self.acl_file = None if acl_file is None else Path(acl_file)
        self.allow_anonymous = allow_anonymous
        self.params = params
        self._key = secrets.token_bytes(32)
        self._logged_in: dict[str, bytes] = {}
        self.passwords: PasswordFile | None = None
        self.acl: AccessList | None = None
        #: the threads that hash passwords (bounded; see the module docstring)
        self.pool = CheckPool(workers, max_pending)
        self.reload()

    def attach(self, broker: Broker) -> None:
        """Say once, when the broker is built, that an ACL without a password file trusts no
        user name: every client is anonymous to it unless another hook verifies names."""
        if self.acl is None or self.passwords is not None:
            return
        listeners = broker.config.effective_listeners()
        identity = [li for li in listeners if li.use_identity_as_username]
        if len(identity) == len(listeners):
            return  # every user name comes from a verified client certificate
        others = [type(h).__name__ for h in broker.hooks if h is not self and _overrides_authenticate(h)]
        unless = [f"one of {', '.join(others)} authenticates the name"] if others else []
        if identity:
            unless.append("it comes from a client certificate (use_identity_as_username)")
        log.warning(
            "ACL file %s without a password file: user names are not verified, so the ACL "
            "treats every client as anonymous ('user' sections and %%u patterns never match%s)",
            self.acl_file,
            f" unless {' or '.join(unless)}" if unless else "",
        )

    async def stop(self) -> None:
        self.pool.close()

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

    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> AuthVerdict:
        """Anonymous: ``allow_anonymous``; no password file: no opinion; a remembered login:
        True at once (one HMAC); else an awaitable of the scrypt check, run on :attr:`pool`
        (raises :class:`AuthUnavailable` when the pool is full)."""
        if username is None:
            return self.allow_anonymous
        passwords = self.passwords
        if passwords is None:
            return None
        if password is not None:
            known = self._logged_in.get(username)
            if known is not None and hmac.compare_digest(known, self._mac(username, password)):
                return True
        check = self.pool.submit(passwords.verify, username, password)
        return self._verified(passwords, username, password, check)

    async def _verified(
        self, passwords: PasswordFile, username: str, password: bytes | None, check: asyncio.Future[bool]
    ) -> bool:
        ok = await check
        if ok and password is not None and passwords is self.passwords:  # not reloaded meanwhile
            self._logged_in[username] = self._mac(username, password)
        return ok

    def authorize(self, client_id: str, username: str | None, action: str, topic: str) -> bool | None:
        acl = self.acl
        if acl is None:
            return None
        return acl.allows(username, client_id, action, topic)


def _overrides_authenticate(hook: Hooks) -> bool:
    return type(hook).authenticate is not Hooks.authenticate
