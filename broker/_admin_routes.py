"""The admin API's route table and its OpenAPI 3.1 document (issue 39, item 1; docs/admin.md).

One :class:`Endpoint` per endpoint declares its method, path, parameters, JSON body schema
and the name of the :class:`broker._admin.Admin` method answering it; the server dispatches
with :data:`ROUTES` (:func:`find`) and :func:`openapi` builds the document served at
``/api/v1/openapi.json`` from the same tuple, so the two cannot drift apart.

Input checks are declared here too and applied before a handler runs (:func:`parse_query`,
:func:`parse_body`): a wrong type, a missing field, an unknown field or a value out of range
is a 400 with a JSON error naming the field. The schemas use a small subset of JSON Schema
(``type`` string/integer/boolean/object/array, ``enum``, ``minimum``/``maximum``,
``maxLength``, ``required``, ``additionalProperties: false``), checked by hand: O(size of the
input).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ROUTES", "BadInput", "Endpoint", "Param", "find", "openapi", "parse_body", "parse_query"]

PREFIX = "/api/v1"

_STR = {"type": "string", "maxLength": 65535}
_LIMIT = {"type": "integer", "minimum": 1, "maximum": 500}
_QOS = {"type": "integer", "minimum": 0, "maximum": 2}
_BAN_KIND = {"type": "string", "enum": ["client_id", "username", "address"]}
_ACCESS = {"type": "string", "enum": ["read", "write", "readwrite", "deny"]}


class BadInput(ValueError):
    """A request the declared schema refuses (answered 400)."""


@dataclass(frozen=True, slots=True)
class Param:
    """A query (or path) parameter with its JSON schema."""

    name: str
    schema: Mapping[str, Any]
    description: str = ""
    required: bool = False
    where: str = "query"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint: ``path`` may hold one ``{name}`` parameter that takes the rest of the
    path (percent-decoded, so it may hold ``/``) up to a fixed ``suffix`` after it
    (``/bridges/{name}/reconnect``)."""

    method: str
    path: str
    handler: str
    summary: str
    params: tuple[Param, ...] = ()
    body: Mapping[str, Any] | None = None
    tag: str = "admin"
    ok: int = 200
    prefix: str = field(init=False)
    tail: str | None = field(init=False)
    suffix: str = field(init=False)

    def __post_init__(self) -> None:
        head, brace, rest = self.path.partition("{")
        name, _, suffix = rest.partition("}")
        object.__setattr__(self, "prefix", head if brace else self.path)
        object.__setattr__(self, "tail", name if brace else None)
        object.__setattr__(self, "suffix", suffix)

    @property
    def changes(self) -> bool:
        """State-changing (the dashboard's CSRF rules apply)."""
        return self.method != "GET"


def _obj(required: tuple[str, ...], **props: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


_PAGE = (
    Param("limit", _LIMIT, "rows per page (default 100)"),
    Param("after", _STR, "cursor: the last key of the previous page"),
    Param("page", {"type": "integer", "minimum": 1}, "page number (1-based), instead of after"),
)
_CLIENT_ID = Param("client_id", _STR, "client id", required=True, where="path")
_NAME = Param("name", _STR, "the bridge's name", required=True, where="path")
_PROPERTIES = _obj(
    (),
    content_type=_STR,
    response_topic=_STR,
    correlation_data=_STR,
    message_expiry_interval={"type": "integer", "minimum": 0, "maximum": 4294967295},
    payload_format_indicator={"type": "integer", "minimum": 0, "maximum": 1},
    user_properties={"type": "array", "items": {"type": "array", "items": _STR}},
)
_BAN_BODY = _obj(
    ("kind", "value"),
    kind=_BAN_KIND,
    value=_STR,
    expiry={"type": "integer", "minimum": 1, "maximum": 10 * 365 * 86400},
    reason={"type": "string", "maxLength": 1000},
)
_ACL_FIELDS: dict[str, Mapping[str, Any]] = {
    "user": {"type": "string", "maxLength": 65535},
    "access": _ACCESS,
    "filter": _STR,
    "pattern": {"type": "boolean"},
}

ROUTES: tuple[Endpoint, ...] = (
    Endpoint("GET", PREFIX + "/openapi.json", "openapi", "this document", tag="meta"),
    Endpoint("GET", PREFIX + "/session", "session", "who you are and your X-CSRF-Token", tag="meta"),
    Endpoint(
        "GET",
        PREFIX + "/clients",
        "clients",
        "list and search clients (sessions), sorted by client id",
        (
            *_PAGE,
            Param("prefix", _STR, "client ids starting with this"),
            Param("username", _STR, "exact user name"),
            Param("address", _STR, "IP address or CIDR network of the connection"),
        ),
        tag="clients",
    ),
    Endpoint(
        "GET",
        PREFIX + "/clients/{client_id}",
        "client",
        "one client's session, subscriptions and in-flight counts",
        (_CLIENT_ID,),
        tag="clients",
    ),
    Endpoint(
        "POST",
        PREFIX + "/clients/kick",
        "kick",
        "disconnect a client (MQTT 5: 0x98); discard=true also ends its session",
        body=_obj(("client_id",), client_id=_STR, discard={"type": "boolean"}),
        tag="clients",
    ),
    Endpoint(
        "GET",
        PREFIX + "/subscriptions",
        "subscriptions",
        "subscriptions of one client, or of every client for one filter",
        (*_PAGE, Param("client_id", _STR), Param("filter", _STR, "exact topic filter")),
        tag="subscriptions",
    ),
    Endpoint(
        "POST",
        PREFIX + "/subscriptions",
        "subscribe",
        "add (or replace) a subscription of an existing session",
        body=_obj(("client_id", "filter"), client_id=_STR, filter=_STR, qos=_QOS),
        tag="subscriptions",
        ok=201,
    ),
    Endpoint(
        "DELETE",
        PREFIX + "/subscriptions",
        "unsubscribe",
        "remove one subscription of a session (exactly this filter)",
        (Param("client_id", _STR, required=True), Param("filter", _STR, required=True)),
        tag="subscriptions",
    ),
    Endpoint(
        "GET",
        PREFIX + "/retained",
        "retained",
        "retained messages matching a filter (the retained index), sorted by topic",
        (*_PAGE, Param("filter", _STR, "topic filter (default #)")),
        tag="retained",
    ),
    Endpoint(
        "GET",
        PREFIX + "/retained/message",
        "retained_one",
        "one retained message (payload as text and base64)",
        (Param("topic", _STR, required=True),),
        tag="retained",
    ),
    Endpoint(
        "DELETE",
        PREFIX + "/retained",
        "retained_delete",
        "delete the retained message of a topic, or every one a filter matches",
        (Param("topic", _STR), Param("filter", _STR)),
        tag="retained",
    ),
    Endpoint(
        "POST",
        PREFIX + "/publish",
        "publish",
        "publish a message as the broker",
        body=_obj(
            ("topic",),
            topic=_STR,
            payload={"type": "string", "maxLength": 65535},
            payload_base64={"type": "string", "maxLength": 65535},
            qos=_QOS,
            retain={"type": "boolean"},
            properties=_PROPERTIES,
        ),
        tag="publish",
    ),
    Endpoint("GET", PREFIX + "/bans", "bans", "the bans in force", tag="bans"),
    Endpoint(
        "POST",
        PREFIX + "/bans",
        "ban",
        "ban a client id, user name, address or CIDR network; matching clients are disconnected",
        body=_BAN_BODY,
        tag="bans",
        ok=201,
    ),
    Endpoint(
        "DELETE",
        PREFIX + "/bans",
        "unban",
        "lift a ban",
        (Param("kind", _BAN_KIND, required=True), Param("value", _STR, required=True)),
        tag="bans",
    ),
    Endpoint("GET", PREFIX + "/users", "users", "users of the password file", tag="users"),
    Endpoint(
        "POST",
        PREFIX + "/users",
        "user_set",
        "create a user or change its password (password file rewritten, effective at once)",
        body=_obj(("username", "password"), username=_STR, password={"type": "string", "maxLength": 1024}),
        tag="users",
        ok=201,
    ),
    Endpoint(
        "DELETE",
        PREFIX + "/users",
        "user_delete",
        "delete a user; its connected clients are disconnected",
        (Param("username", _STR, required=True),),
        tag="users",
    ),
    Endpoint(
        "GET",
        PREFIX + "/bridges",
        "bridges",
        "the outbound bridges (docs/bridging-out.md): connected, remote, queued, sent, received, "
        "dropped by reason, reconnects, last error, sorted by name",
        tag="bridges",
    ),
    Endpoint(
        "GET",
        PREFIX + "/bridges/{name}",
        "bridge",
        "one outbound bridge",
        (_NAME,),
        tag="bridges",
    ),
    Endpoint(
        "POST",
        PREFIX + "/bridges/{name}/reconnect",
        "bridge_reconnect",
        "close a bridge's connections and connect again now (no back-off wait; nothing is lost)",
        (_NAME,),
        tag="bridges",
    ),
    Endpoint("GET", PREFIX + "/acl", "acl", "the rules of the ACL file", tag="acl"),
    Endpoint(
        "POST",
        PREFIX + "/acl",
        "acl_add",
        "add a rule (user, anonymous when user is absent, or pattern)",
        body=_obj(("filter",), **_ACL_FIELDS),
        tag="acl",
        ok=201,
    ),
    Endpoint(
        "DELETE",
        PREFIX + "/acl",
        "acl_remove",
        "remove a rule (the same fields as when it was added)",
        tuple(
            Param(name, schema, required=name == "filter") if name != "pattern" else Param(name, schema)
            for name, schema in _ACL_FIELDS.items()
        ),
        tag="acl",
    ),
)


def _hit(ep: Endpoint, path: str) -> bool:
    """``path`` is ``ep``'s: its fixed path, or its prefix, a non-empty parameter and its
    suffix. O(len(path))."""
    if ep.tail is None:
        return path == ep.prefix
    end = len(path) - len(ep.suffix)
    return path.startswith(ep.prefix) and path.endswith(ep.suffix) and end > len(ep.prefix)


def find(method: str, path: str) -> tuple[Endpoint | None, str | None, tuple[str, ...]]:
    """(the endpoint, its tail path parameter, the methods the path has: for a 405's
    ``Allow``, empty when no endpoint has the path).  The most specific endpoint of the path
    takes it: a fixed path (``/clients/kick``) over ``/clients/{client_id}``, and an endpoint
    with a suffix (``/bridges/{name}/reconnect``) over ``/bridges/{name}``, whatever the
    method (``GET /bridges/x/reconnect`` is a 405, not the bridge ``x/reconnect``). O(routes)."""
    hits = [ep for ep in ROUTES if _hit(ep, path)]
    if any(ep.tail is None for ep in hits):
        hits = [ep for ep in hits if ep.tail is None]
    elif hits:
        longest = max(len(ep.suffix) for ep in hits)
        hits = [ep for ep in hits if len(ep.suffix) == longest]
    for ep in hits:
        if ep.method == method or (method == "HEAD" and ep.method == "GET"):
            return ep, None if ep.tail is None else path[len(ep.prefix) : len(path) - len(ep.suffix)], ()
    allowed: list[str] = []
    for ep in hits:
        allowed += ["GET", "HEAD"] if ep.method == "GET" else [ep.method]
    return None, None, tuple(dict.fromkeys(allowed))


def _check(name: str, schema: Mapping[str, Any], value: Any) -> Any:  # noqa: C901, PLR0912 (one branch per type)
    t = schema.get("type")
    if t == "string":
        if not isinstance(value, str):
            raise BadInput(f"{name}: expected a string")
        if len(value) > schema.get("maxLength", 1 << 30):
            raise BadInput(f"{name}: longer than {schema['maxLength']} characters")
    elif t == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadInput(f"{name}: expected an integer")
        if value < schema.get("minimum", value) or value > schema.get("maximum", value):
            if "maximum" not in schema:
                raise BadInput(f"{name}: must be at least {schema['minimum']}")
            raise BadInput(f"{name}: must be between {schema.get('minimum')} and {schema['maximum']}")
    elif t == "boolean":
        if not isinstance(value, bool):
            raise BadInput(f"{name}: expected true or false")
    elif t == "array":
        if not isinstance(value, list):
            raise BadInput(f"{name}: expected an array")
        return [_check(f"{name}[{i}]", schema["items"], v) for i, v in enumerate(value)]
    elif t == "object":
        if not isinstance(value, dict):
            raise BadInput(f"{name}: expected an object")
        props = schema["properties"]
        for key in value:
            if key not in props:
                raise BadInput(f"{name}: unknown field {str(key)[:60]!r}")
        for key in schema.get("required", ()):
            if key not in value:
                raise BadInput(f"{name}: missing field {key!r}")
        return {k: _check(f"{k}" if name == "body" else f"{name}.{k}", props[k], v) for k, v in value.items()}
    if "enum" in schema and value not in schema["enum"]:
        raise BadInput(f"{name}: one of {', '.join(schema['enum'])}")
    return value


def parse_query(ep: Endpoint, query: Mapping[str, str]) -> dict[str, Any]:
    """The endpoint's query parameters, converted and checked (BadInput)."""
    known = {p.name for p in ep.params if p.where == "query"}
    for key in query:
        if key not in known:
            raise BadInput(f"unknown query parameter {key[:60]!r}")
    out: dict[str, Any] = {}
    for p in ep.params:
        if p.where != "query":
            continue
        raw = query.get(p.name)
        if raw is None:
            if p.required:
                raise BadInput(f"missing query parameter {p.name!r}")
            continue
        value: Any = raw
        if p.schema.get("type") == "integer":
            try:
                value = int(raw)
            except ValueError:
                raise BadInput(f"{p.name}: expected an integer") from None
        elif p.schema.get("type") == "boolean":
            if raw not in ("true", "false"):
                raise BadInput(f"{p.name}: expected true or false")
            value = raw == "true"
        out[p.name] = _check(p.name, p.schema, value)
    return out


def parse_body(ep: Endpoint, body: Any) -> dict[str, Any]:
    """The endpoint's JSON body (already decoded), checked against its schema (BadInput)."""
    if ep.body is None:
        return {}
    checked: dict[str, Any] = _check("body", ep.body, body)
    return checked


_ERROR = {
    "description": "refused: the reason in error, details (if any) in detail",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {"error": {"type": "string"}, "detail": {}},
                "required": ["error"],
            }
        }
    },
}


def openapi(version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of :data:`ROUTES`. O(routes)."""
    paths: dict[str, dict[str, Any]] = {}
    for ep in ROUTES:
        op: dict[str, Any] = {
            "operationId": ep.handler,
            "summary": ep.summary,
            "tags": [ep.tag],
            "responses": {
                str(ep.ok): {"description": "done", "content": {"application/json": {"schema": {}}}},
                "400": _ERROR,
                "401": _ERROR,
                "403": _ERROR,
                "404": _ERROR,
            },
        }
        if ep.params:
            op["parameters"] = [
                {
                    "name": p.name,
                    "in": p.where,
                    "required": p.required or p.where == "path",
                    "description": p.description,
                    "schema": dict(p.schema),
                }
                for p in ep.params
            ]
        if ep.body is not None:
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": dict(ep.body)}}}
        if ep.changes:
            op["parameters"] = [
                *op.get("parameters", []),
                {
                    "name": "X-CSRF-Token",
                    "in": "header",
                    "required": True,
                    "description": "from GET /api/v1/session",
                    "schema": {"type": "string"},
                },
            ]
        paths.setdefault(ep.path, {})[ep.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "siftmq admin API",
            "version": version,
            "description": "Administration of a siftmq broker (docs/admin.md). State-changing calls need "
            "Content-Type: application/json and the X-CSRF-Token of GET /api/v1/session.",
        },
        "servers": [{"url": "/"}],
        "components": {"securitySchemes": {"basic": {"type": "http", "scheme": "basic"}}},
        "security": [{"basic": []}, {}],
        "paths": paths,
    }
