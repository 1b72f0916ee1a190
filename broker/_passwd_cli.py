"""``siftmq passwd``: manage a password file like mosquitto_passwd (issue 7, item 2).

    siftmq passwd [-c] [-b] [-D] FILE USER [PASSWORD]

``-c`` creates (or overwrites) FILE; without it FILE must exist.  ``-b`` takes PASSWORD
from the command line (batch mode; it is then visible in the process list and the shell
history); otherwise the password is asked twice with ``getpass``.  ``-D`` deletes USER.
Hashes use the production scrypt parameters of :class:`broker._passwd.Scrypt`; the file is
replaced atomically with mode 0600.  ``register(subparsers)`` adds the sub-command to the
``siftmq`` parser (``broker._cli``).
"""

from __future__ import annotations

import argparse
import sys

from broker.plugins import Subparsers

__all__ = ["register", "run"]


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``passwd`` to an argparse sub-parsers object; returns the new parser."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "passwd",
        help="manage a password file (like mosquitto_passwd)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("-c", dest="create", action="store_true", help="create FILE (overwrites an existing one)")
    p.add_argument(
        "-b", dest="batch", action="store_true", help="batch mode: PASSWORD is given on the command line"
    )
    p.add_argument("-D", dest="delete", action="store_true", help="delete USER from FILE")
    p.add_argument("file", metavar="FILE", help="password file")
    p.add_argument("user", metavar="USER", help="user name")
    p.add_argument("password", metavar="PASSWORD", nargs="?", default=None, help="password (with -b)")
    p.set_defaults(func=run)
    return p


def _fail(message: str) -> int:
    print(f"siftmq passwd: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:  # noqa: PLR0912 (one branch per mosquitto_passwd mode)
    """Execute ``siftmq passwd`` with parsed arguments; returns the exit status."""
    if args.create and args.delete:
        return _fail("-c and -D cannot be combined")
    if args.password is not None and not args.batch:
        return _fail("a PASSWORD argument needs -b")
    if args.batch and args.password is None and not args.delete:
        return _fail("-b needs a PASSWORD argument")
    # here, not when the parser is built: hashlib and OpenSSL (issue 42 item 1)
    from broker._passwd import PasswordFile, PasswordFileError, check_username

    try:
        check_username(args.user)
    except PasswordFileError as exc:
        return _fail(str(exc))
    if args.create:
        pf = PasswordFile()
    else:
        try:
            pf = PasswordFile.load(args.file)
        except FileNotFoundError:
            return _fail(f"{args.file}: no such file (use -c to create it)")
        except (OSError, PasswordFileError) as exc:
            return _fail(str(exc))
    if args.delete:
        if not pf.delete(args.user):
            return _fail(f"user {args.user!r} not found in {args.file}")
    else:
        password = args.password
        if password is None:
            import getpass

            try:
                password = getpass.getpass("Password: ")
                again = getpass.getpass("Reenter password: ")
            except (EOFError, KeyboardInterrupt):
                return _fail("no password given")
            if password != again:
                return _fail("passwords do not match")
        if not password:
            return _fail("empty password")
        pf.set(args.user, password)
    try:
        pf.save(args.file)
    except OSError as exc:
        return _fail(f"cannot write {args.file}: {exc}")
    return 0
