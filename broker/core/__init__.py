"""The sans-IO broker core: values (``_message``), routing (``_router``), sessions
(``_session``), the core's state transitions and delivery with flow control (``_core``), the
per-connection protocol machine (``_connection``), hooks (``_observers``) and durability
(``_journal``).  No sockets, no awaits: bytes and times in, bytes out (docs/architecture.md).
"""
