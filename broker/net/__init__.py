"""The I/O adapters around the sans-IO core: listener admission (``_admission``, sans-IO), the
asyncio protocol of one connection (``_transport``), MQTT over WebSocket (``_websocket``),
the listening sockets with TLS (``_listeners``), and the small HTTP/1.1 server of ``/metrics``
and the dashboard (``_http``: a sans-IO request parser and its asyncio adapter).  Only this
package touches sockets.
"""
