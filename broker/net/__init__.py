"""The I/O adapters around the sans-IO core: listener admission (``_admission``, sans-IO), the
asyncio protocol of one connection (``_transport``), MQTT over WebSocket (``_websocket``),
the listening sockets with TLS (``_listeners``), and the small HTTP/1.1 server of ``/metrics``
and the dashboard (``_http``: h11 parsing behind a sans-IO connection, and its asyncio adapter
with separate caps for unauthenticated connections and event streams).  Only this
package touches sockets.

This module is the package's public seam (docs/architecture.md, "Seams"). Who may use it: the
rest of the ``broker`` package (``broker._broker`` opens and closes the listeners, the
metrics endpoint, the dashboard and the admin API serve HTTP through it, ``siftmq reload``
re-reads TLS files), never the ``_``-modules (``tests/test_layers.py``). Stable: the names
below, within a release.

Every name is imported from its home module at its first use (PEP 562, as :mod:`broker`
does): importing the package costs nothing and a name loads only the module that defines it,
so this seam changes no import order. Cost: a dictionary lookup at a name's first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker._extras import lazy_names

if TYPE_CHECKING:
    from broker.net._accept import connection_capacity, descriptor_limit, raise_descriptor_limit
    from broker.net._admission import ConnectionLimits
    from broker.net._http import (
        HttpLimits,
        HttpServer,
        HttpStats,
        Request,
        Response,
        parse_listen,
        serve_http,
    )
    from broker.net._listeners import (
        OpenListener,
        TlsReload,
        close_listeners,
        open_listener,
        open_listeners,
        prepare_tls_reload,
        wait_closed,
    )
    from broker.net._transport import MQTTProtocol

__all__ = [
    "ConnectionLimits",
    "HttpLimits",
    "HttpServer",
    "HttpStats",
    "MQTTProtocol",
    "OpenListener",
    "Request",
    "Response",
    "TlsReload",
    "close_listeners",
    "connection_capacity",
    "descriptor_limit",
    "open_listener",
    "open_listeners",
    "parse_listen",
    "prepare_tls_reload",
    "raise_descriptor_limit",
    "serve_http",
    "wait_closed",
]

#: public name -> the module that defines it (imported at the name's first use)
_LAZY = {
    "connection_capacity": "broker.net._accept",
    "descriptor_limit": "broker.net._accept",
    "raise_descriptor_limit": "broker.net._accept",
    "ConnectionLimits": "broker.net._admission",
    "HttpLimits": "broker.net._http",
    "HttpServer": "broker.net._http",
    "HttpStats": "broker.net._http",
    "Request": "broker.net._http",
    "Response": "broker.net._http",
    "parse_listen": "broker.net._http",
    "serve_http": "broker.net._http",
    "OpenListener": "broker.net._listeners",
    "TlsReload": "broker.net._listeners",
    "close_listeners": "broker.net._listeners",
    "open_listener": "broker.net._listeners",
    "open_listeners": "broker.net._listeners",
    "prepare_tls_reload": "broker.net._listeners",
    "wait_closed": "broker.net._listeners",
    "MQTTProtocol": "broker.net._transport",
}

__getattr__ = lazy_names("broker.net", _LAZY)
