"""The MQTT wire protocol, sans-IO: packets as values (``_values``, ``_record``), the encoder
(``_encode``) and the streaming decoder (``_decode``) with their shared tables (``_wire``).

Nothing here touches a socket, awaits, or knows about sessions: bytes in, packets out, and
back.  Imported through :mod:`broker.packets`.
"""
