"""The encodings the broker's core, its store and the cluster share, each defined once.

* The QoS 1/2 flow state of an outgoing message (MQTT 5 section 4.3): the same three ints are
  ``Outgoing.state`` in the core (:mod:`broker.core._session`), the ``outgoing.state`` column
  of the store (:mod:`broker.durability`) and the state of a message that moves with its
  session between cluster nodes (:mod:`cluster._moving`), so nothing translates between them.
  The numbers are the store's since its first schema (a database written by an older siftmq
  opens unchanged).  :class:`MessageState` names the same values as an enum (the store's
  records, :mod:`broker.store`); the core compares the plain ints (compiled: a ``Final`` int is
  a C constant).
* :data:`NEVER`: the Session Expiry Interval meaning "never expires" (MQTT 5 section
  3.1.2.11.2), which the core and the store's session rows both test.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["NEVER", "PUBLISH_SENT", "PUBREL_SENT", "QUEUED", "MessageState"]

#: queued for the client (no packet id yet)
QUEUED: Final = 0
#: PUBLISH sent (or about to be), waiting for PUBACK / PUBREC
PUBLISH_SENT: Final = 1
#: PUBREC received and PUBREL sent, waiting for PUBCOMP
PUBREL_SENT: Final = 2

#: Session Expiry Interval meaning "never expires" (MQTT 5 section 3.1.2.11.2)
NEVER: Final = 0xFFFFFFFF


class MessageState(enum.IntEnum):
    """Where an outgoing QoS 1/2 message is in its flow: :data:`QUEUED`, :data:`PUBLISH_SENT`
    or :data:`PUBREL_SENT` (``PUBREC_RECEIVED`` is its store-side name) as an enum."""

    QUEUED = QUEUED
    PUBLISH_SENT = PUBLISH_SENT
    PUBREC_RECEIVED = PUBREL_SENT  # PUBREL sent, waiting for PUBCOMP
    PUBREL_SENT = PUBREL_SENT  # an alias of PUBREC_RECEIVED: the core's name of the same state
