"""siftmq's broker network (seed 001, ``001_6a6247c7b716f50f.txt``, sections 3-5).

A layer above :mod:`broker` (docs/architecture.md, docs/cluster.md): brokers joined on a
Kademlia overlay (the ``kademlia`` package, :mod:`cluster._overlay`) form one MQTT cluster.
Each broker keeps one MQTT 5 link to every other (:mod:`cluster._link`), holds there the
aggregated subscriptions of its own clients (:mod:`cluster._routes`, sans-IO), and routes
what arrives over a link to its local sessions only (:mod:`cluster._node`).  Composite
subscription groups are kept by the alpha brokers closest to their GroupCode
(:mod:`cluster._groups`, sans-IO, driven live and by the simulator in ``benchmarks/``).

The overlay needs the ``cluster`` extra (kademlia), which a broker-only install lacks, and the
``siftmq`` plugin (:mod:`cluster._plugin`) is imported through this package: so
``ClusterNode`` and ``load_node_id`` are loaded on first use (PEP 562), and using one without
the extra raises :class:`broker.ext.MissingExtra` naming ``pip install 'siftmq[cluster]'``.

Seam (docs/architecture.md, "Seams"): this module is the package's public face, for users
(``ClusterNode``, ``load_node_id``, the route table and token helpers); ``siftmq`` reaches
the plugin through its entry point. Nothing outside ``cluster`` imports its ``_``-modules, and
the cluster imports from ``broker`` only public modules (:mod:`broker.ext` for the broker's
state it moves between nodes: sessions, messages, routes; :mod:`broker.hooks`,
:mod:`broker.packets`, :mod:`broker.plugins`), checked by ``tests/test_layers.py``. Stable:
the names in ``__all__``, within a release.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.ext import Extra, lazy_names

if TYPE_CHECKING:
    from cluster._auth import TokenChecker, make_token
    from cluster._node import ClusterNode
    from cluster._overlay import load_node_id
    from cluster._routes import RouteChange, RouteTable

__all__ = ["ClusterNode", "RouteChange", "RouteTable", "TokenChecker", "load_node_id", "make_token"]

#: the public names that need kademlia, and their modules
_OVERLAY = {"ClusterNode": "cluster._node", "load_node_id": "cluster._overlay"}
#: the public names that need no extra, imported at first use too: ``siftmq serve`` imports this
#: package for its plugin, and cluster._auth imports hashlib (OpenSSL, issue 42 item 1)
_PLAIN = {
    "TokenChecker": "cluster._auth",
    "make_token": "cluster._auth",
    "RouteChange": "cluster._routes",
    "RouteTable": "cluster._routes",
}
__getattr__ = lazy_names("cluster", _OVERLAY, Extra.CLUSTER, plain=_PLAIN)
