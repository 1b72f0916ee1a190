"""siftmq's broker network (seed 001, ``001_6a6247c7b716f50f.txt``, sections 3-5).

A layer above :mod:`broker` (docs/architecture.md): brokers joined on a Kademlia overlay
(the ``kademlia`` package) form one MQTT cluster, and composite subscription groups are kept
by the alpha brokers closest to their GroupCode.  The routing logic is sans-IO so the live
cluster and the discrete-event simulator in ``benchmarks/`` drive the same code.
"""

__all__: list[str] = []
