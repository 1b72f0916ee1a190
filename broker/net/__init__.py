"""The I/O adapters around the sans-IO core: listener admission (``_admission``, sans-IO), the
asyncio protocol of one connection (``_transport``), MQTT over WebSocket (``_websocket``) and
the listening sockets with TLS (``_listeners``).  Only this package touches sockets.
"""
