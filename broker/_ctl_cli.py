"""``siftmq ctl``: drive a running broker through its admin API (issue 39, item 2; docs/admin.md).

    siftmq ctl [--url http://HOST:PORT] [-u USER [-P PASSWORD]] VERB ...

``--url`` is the broker's ``--metrics-listen`` listener (default ``$SIFTMQ_URL`` or
``http://127.0.0.1:9464``).  The user (``-u``, default ``$SIFTMQ_USERNAME``) logs in with the
password of ``-P``, else of ``$SIFTMQ_PASSWORD``, else typed at a prompt when standard input
is a terminal (not echoed; ``getpass``), else none: a password on the command line is seen
by every local user in ``ps``, the environment and the prompt are not (mosquitto_ctrl's
reasoning for its options file). Verbs map one to one onto ``/api/v1/`` calls
(``broker._admin_routes.ROUTES``): ``clients list|show|kick``, ``subscriptions
list|add|remove``, ``retained list|show|delete``, ``publish``, ``bans list|add|remove``,
``users list|add|remove``, ``bridges list|show|reconnect``, ``acl list|add|remove``. A
state-changing call first reads the ``X-CSRF-Token`` of ``GET /api/v1/session`` (the
dashboard's CSRF rule) and sends it with a JSON body.

Output: the API's JSON answer, indented, on stdout. Errors are one line on stderr starting
``siftmq ctl:``: status 2 for a usage error, 1 for a call the broker refused (its JSON
error printed) or could not be reached. The HTTP client is the standard library's
``http.client`` (one short-lived connection per call: nothing here needs more).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlencode, urlsplit

from broker._argwidth import WidthParser
from broker.plugins import Subparsers

if TYPE_CHECKING:
    import http.client

__all__ = ["CtlError", "register", "run"]

DEFAULT_URL = "http://127.0.0.1:9464"
PROG = "siftmq ctl"


class CtlError(Exception):
    """A failed call: the one line to print (status 1)."""


class _Parser(WidthParser):
    """An argparse parser whose usage errors are one line ``siftmq ctl: ...`` and status 2
    (built without shutil: broker/_argwidth.py)."""

    def error(self, message: str) -> NoReturn:
        print(f"{PROG}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


class Client:
    """One admin API endpoint; ``call`` returns the decoded JSON or raises CtlError."""

    def __init__(self, url: str, user: str | None, password: str | None, timeout: float = 30.0) -> None:
        try:  # urlsplit and .port raise for '[::1' or ':99999' with no word of --url
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"--url {url!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--url must be http://HOST:PORT or https://HOST:PORT, not {url!r}")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = port or (443 if self.https else 80)
        self.timeout = timeout
        self.headers: dict[str, str] = {"Accept": "application/json"}
        if user is not None:
            import base64

            creds = f"{user}:{password or ''}".encode()
            self.headers["Authorization"] = "Basic " + base64.b64encode(creds).decode()
        self._csrf: str | None = None

    def _request(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str]
    ) -> tuple[int, Any]:
        import http.client  # at the first call: it imports ssl (OpenSSL), which serve does not need

        conn: http.client.HTTPConnection
        if self.https:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request(method, path, body=body, headers={**self.headers, **headers})
            resp = conn.getresponse()
            raw = resp.read()
        except OSError as exc:
            raise CtlError(f"cannot reach {self.host}:{self.port}: {exc}") from None
        except http.client.HTTPException as exc:
            raise CtlError(f"bad answer from {self.host}:{self.port}: {exc!r}") from None
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw) if raw else None
        except ValueError:
            text = raw.decode("utf-8", "replace").strip()[:200]
            return resp.status, {"error": text or f"HTTP {resp.status}"}

    def call(
        self, method: str, path: str, body: object = None, query: Mapping[str, Any] | None = None
    ) -> Any:
        q = {k: ("true" if v is True else "false" if v is False else v) for k, v in (query or {}).items()}
        target = "/api/v1" + path + ("?" + urlencode(q) if q else "")
        headers: dict[str, str] = {}
        data = None
        if method != "GET":
            if self._csrf is None:
                self._csrf = str(self.call("GET", "/session")["csrf"])
            headers = {"Content-Type": "application/json", "X-CSRF-Token": self._csrf}
            data = json.dumps(body).encode() if body is not None else b""
        status, answer = self._request(method, target, data, headers)
        if status >= 300:
            raise CtlError(f"{method} {target}: HTTP {status}: {json.dumps(answer)}")
        return answer


def register(subparsers: Subparsers) -> argparse.ArgumentParser:  # noqa: PLR0915 (one statement per option)
    """Add ``ctl`` to an argparse sub-parsers object; returns the new parser."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "ctl",
        help="drive a running broker through its admin API (--metrics-listen)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.__class__ = _Parser  # one-line usage errors (siftmq ctl: ...)
    p.add_argument(
        "--url",
        default=os.environ.get("SIFTMQ_URL", DEFAULT_URL),
        help=f"the broker's --metrics-listen URL (default $SIFTMQ_URL or {DEFAULT_URL})",
    )
    p.add_argument(
        "-u",
        "--username",
        default=os.environ.get("SIFTMQ_USERNAME"),
        help="user of the password file, a dashboard admin (default $SIFTMQ_USERNAME)",
    )
    p.add_argument(
        "-P",
        "--password",
        default=None,
        help="its password (default $SIFTMQ_PASSWORD, else asked when on a terminal; "
        "a password here is visible in ps)",
    )
    verbs = p.add_subparsers(dest="area", metavar="AREA", parser_class=_Parser)

    clients = verbs.add_parser("clients", help="list, show, kick clients").add_subparsers(
        dest="verb", metavar="VERB", parser_class=_Parser
    )
    c = clients.add_parser("list", help="list and search clients")
    c.add_argument("--prefix", help="client ids starting with this")
    c.add_argument("--username", dest="user_name", help="clients of this user")
    c.add_argument("--address", help="clients from this address or CIDR network")
    _paging(c)
    clients.add_parser("show", help="one client's session").add_argument("client_id")
    c = clients.add_parser("kick", help="disconnect a client")
    c.add_argument("client_id")
    c.add_argument("--discard", action="store_true", help="also end its session")

    subs = verbs.add_parser("subscriptions", help="list, add, remove subscriptions").add_subparsers(
        dest="verb", metavar="VERB", parser_class=_Parser
    )
    c = subs.add_parser("list", help="subscriptions of a client or for a filter")
    one = c.add_mutually_exclusive_group(required=True)
    one.add_argument("--client-id")
    one.add_argument("--filter")
    _paging(c)
    c = subs.add_parser("add", help="subscribe a session")
    c.add_argument("client_id")
    c.add_argument("filter")
    c.add_argument("-q", "--qos", type=int, choices=(0, 1, 2), default=0)
    c = subs.add_parser("remove", help="unsubscribe a session")
    c.add_argument("client_id")
    c.add_argument("filter")

    ret = verbs.add_parser("retained", help="list, show, delete retained messages").add_subparsers(
        dest="verb", metavar="VERB", parser_class=_Parser
    )
    c = ret.add_parser("list", help="retained messages a filter matches")
    c.add_argument("filter", nargs="?", default="#")
    _paging(c)
    ret.add_parser("show", help="one retained message").add_argument("topic")
    c = ret.add_parser("delete", help="delete the retained message of TOPIC (or every one --filter matches)")
    c.add_argument("topic", nargs="?")
    c.add_argument("--filter")

    c = verbs.add_parser("publish", help="publish a message as the broker")
    c.add_argument("-t", "--topic", required=True)
    c.add_argument("-m", "--message", default="", help="payload (text)")
    c.add_argument("-q", "--qos", type=int, choices=(0, 1, 2), default=0)
    c.add_argument("-r", "--retain", action="store_true")

    bans = verbs.add_parser("bans", help="list, add, remove bans").add_subparsers(
        dest="verb", metavar="VERB", parser_class=_Parser
    )
    bans.add_parser("list", help="the bans in force")
    c = bans.add_parser("add", help="ban a client id, user name, address or network")
    _selector(c)
    c.add_argument("--expiry", type=int, default=None, help="seconds the ban lasts (default: for ever)")
    c.add_argument("--reason", default=None)
    _selector(bans.add_parser("remove", help="lift a ban"))

    users = verbs.add_parser("users", help="list, add, remove users").add_subparsers(
        dest="verb", metavar="VERB", parser_class=_Parser
    )
    users.add_parser("list", help="users of the password file")
    c = users.add_parser("add", help="create a user or change its password")
    c.add_argument("name")
    c.add_argument("--password", dest="new_password", required=True, help="the user's password")
    users.add_parser("remove", help="delete a user").add_argument("name")

    bridges = verbs.add_parser("bridges", help="list, show, reconnect outbound bridges").add_subparsers(
        dest="verb", metavar="VERB", parser_class=_Parser
    )
    bridges.add_parser("list", help="every outbound bridge and its state")
    bridges.add_parser("show", help="one bridge").add_argument("name")
    bridges.add_parser("reconnect", help="drop a bridge's connections and connect again now").add_argument(
        "name"
    )

    acl = verbs.add_parser("acl", help="list, add, remove ACL rules").add_subparsers(
        dest="verb", metavar="VERB", parser_class=_Parser
    )
    acl.add_parser("list", help="the rules of the ACL file")
    for verb in ("add", "remove"):
        c = acl.add_parser(verb, help=f"{verb} a rule")
        who = c.add_mutually_exclusive_group()
        who.add_argument("--user", help="the user the rule is for (default: anonymous clients)")
        who.add_argument("--pattern", action="store_true", help="a pattern rule (%%u, %%c) for everyone")
        c.add_argument("--access", choices=("read", "write", "readwrite", "deny"), default="readwrite")
        c.add_argument("filter")
    p.set_defaults(func=run)
    return p


def _paging(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=int, default=None, help="rows per page (1..500, default 100)")
    p.add_argument("--after", default=None, help="the cursor 'next' of the previous page")


def _selector(p: argparse.ArgumentParser) -> None:
    one = p.add_mutually_exclusive_group(required=True)
    one.add_argument("--client-id")
    one.add_argument("--username", dest="user_name")
    one.add_argument("--address", help="an IP address or a CIDR network")


def _ban_of(args: argparse.Namespace) -> dict[str, str]:
    for kind, attr in (("client_id", "client_id"), ("username", "user_name"), ("address", "address")):
        value = getattr(args, attr)
        if value is not None:
            return {"kind": kind, "value": value}
    raise AssertionError("argparse requires one selector")


def _page(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    q = {k: v for k, v in extra.items() if v is not None}
    if args.limit is not None:
        q["limit"] = args.limit
    if args.after is not None:
        q["after"] = args.after
    return q


def dispatch(client: Client, args: argparse.Namespace) -> Any:  # noqa: C901, PLR0912 (one branch per verb)
    """Run one verb; returns the API's JSON answer."""
    area, verb = args.area, getattr(args, "verb", None)
    match area, verb:
        case "clients", "list":
            q = _page(args, prefix=args.prefix, username=args.user_name, address=args.address)
            return client.call("GET", "/clients", query=q)
        case "clients", "show":
            return client.call("GET", "/clients/" + _quote(args.client_id))
        case "clients", "kick":
            return client.call(
                "POST", "/clients/kick", {"client_id": args.client_id, "discard": args.discard}
            )
        case "subscriptions", "list":
            return client.call(
                "GET", "/subscriptions", query=_page(args, client_id=args.client_id, filter=args.filter)
            )
        case "subscriptions", "add":
            body = {"client_id": args.client_id, "filter": args.filter, "qos": args.qos}
            return client.call("POST", "/subscriptions", body)
        case "subscriptions", "remove":
            return client.call(
                "DELETE", "/subscriptions", query={"client_id": args.client_id, "filter": args.filter}
            )
        case "retained", "list":
            return client.call("GET", "/retained", query=_page(args, filter=args.filter))
        case "retained", "show":
            return client.call("GET", "/retained/message", query={"topic": args.topic})
        case "retained", "delete":
            if (args.topic is None) == (args.filter is None):
                raise _Usage("retained delete needs TOPIC or --filter FILTER (one of them)")
            q = {"topic": args.topic} if args.topic is not None else {"filter": args.filter}
            return client.call("DELETE", "/retained", query=q)
        case "publish", _:
            body = {"topic": args.topic, "payload": args.message, "qos": args.qos, "retain": args.retain}
            return client.call("POST", "/publish", body)
        case "bans", "list":
            return client.call("GET", "/bans")
        case "bans", "add":
            body = _ban_of(args)
            if args.expiry is not None:
                body["expiry"] = args.expiry
            if args.reason is not None:
                body["reason"] = args.reason
            return client.call("POST", "/bans", body)
        case "bans", "remove":
            return client.call("DELETE", "/bans", query=_ban_of(args))
        case "users", "list":
            return client.call("GET", "/users")
        case "users", "add":
            return client.call("POST", "/users", {"username": args.name, "password": args.new_password})
        case "users", "remove":
            return client.call("DELETE", "/users", query={"username": args.name})
        case "bridges", "list":
            return client.call("GET", "/bridges")
        case "bridges", "show":
            return client.call("GET", "/bridges/" + _quote(args.name))
        case "bridges", "reconnect":
            return client.call("POST", "/bridges/" + _quote(args.name) + "/reconnect")
        case "acl", "list":
            return client.call("GET", "/acl")
        case "acl", "add" | "remove":
            rule: dict[str, Any] = {"access": args.access, "filter": args.filter}
            if args.user is not None:
                rule["user"] = args.user
            if args.pattern:
                rule["pattern"] = True
            if verb == "add":
                return client.call("POST", "/acl", rule)
            return client.call("DELETE", "/acl", query=rule)
    raise _Usage(f"which {area or 'AREA'}? ({PROG} {area or ''} --help)".replace("  ", " "))


class _Usage(Exception):
    """A usage error found after parsing (status 2)."""


def _quote(part: str) -> str:
    """``part`` as one segment of the API's path; an empty one is a usage error (the path
    would name another endpoint: ``/bridges//reconnect``)."""
    from urllib.parse import quote

    if not part:
        raise _Usage("an empty name or client id")
    return quote(part, safe="")


def _password(args: argparse.Namespace) -> str | None:
    """The login's password: ``-P``, else ``$SIFTMQ_PASSWORD``, else asked on the terminal
    (when standard input is one), else None; None without a user."""
    if args.username is None or args.password is not None:
        return args.password  # type: ignore[no-any-return]
    from_env = os.environ.get("SIFTMQ_PASSWORD")
    if from_env is not None:
        return from_env
    if not sys.stdin.isatty():
        return None
    import getpass

    try:
        return getpass.getpass(f"{PROG}: password of {args.username}: ")
    except (EOFError, KeyboardInterrupt):
        raise _Usage("no password typed (-P, $SIFTMQ_PASSWORD or the prompt)") from None


def run(args: argparse.Namespace) -> int:
    """``siftmq ctl``: 0 on success, 1 for a refused or failed call, 2 for a usage error."""
    try:
        client = Client(args.url, args.username, _password(args))
        answer = dispatch(client, args)
    except (_Usage, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except CtlError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    json.dump(answer, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0
