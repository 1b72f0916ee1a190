"""The I/O adapters around the sans-IO core: listener admission (``_admission``, sans-IO), the
asyncio protocol of one connection (``_transport``), MQTT over WebSocket (``_websocket``),
the listening sockets with TLS (``_listeners``), and the small HTTP/1.1 server of ``/metrics``
and the dashboard (``_http``: h11 parsing behind a sans-IO connection, and its asyncio adapter
with separate caps for unauthenticated connections and event streams).  Only this
package touches sockets.
"""
