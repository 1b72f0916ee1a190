"""The cluster as a ``siftmq`` plugin (``broker.plugins``; entry point ``siftmq.plugins``).

``siftmq serve --cluster-listen HOST:PORT [--join HOST:PORT[,HOST:PORT...]]
--cluster-secret-file PATH`` (``[serve]`` keys ``cluster_listen``, ``join``,
``cluster_secret_file``, ``cluster_secret``, ``cluster_peer_expiry``,
``cluster_takeover_timeout``, ``cluster_link_queue`` (QoS 1/2 messages a peer's link
session may queue here), and ``cluster_refresh`` / ``cluster_failure_timeout``: how
often the membership is refreshed and how long an unanswered peer is kept) registers a
:class:`~cluster.ClusterNode` in the served broker; its node ID lives in ``--data-dir``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from broker._extras import Extra, require
from broker._files import shared_access
from broker.hooks import Hooks
from broker.plugins import ServeContext, Subparsers

__all__ = ["PLUGIN", "ClusterPlugin", "parse_address"]


def parse_address(text: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); ValueError with ``what`` otherwise."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what}: HOST:PORT expected, got {text!r}")
    return host.strip("[]"), int(port)


class ClusterPlugin:
    """The ``serve`` options of the broker network (docs/cluster.md)."""

    name = "cluster"
    serve_keys = frozenset(
        {
            "cluster_listen",
            "join",
            "cluster_secret_file",
            "cluster_secret",
            "cluster_peer_expiry",
            "cluster_takeover_timeout",
            "cluster_refresh",
            "cluster_failure_timeout",
            "cluster_link_queue",
        }
    )

    #: the ``[serve]`` keys without a flag (docs/config-reference.md is generated from this)
    serve_key_help: Mapping[str, str] = {
        "cluster_secret": "the cluster's shared secret inline (8 bytes or more; prefer cluster_secret_file)",
        "cluster_refresh": "seconds between refreshes of the membership (default 2)",
        "cluster_failure_timeout": "seconds a request of the overlay waits for a peer before the peer "
        "counts as failed (default 5)",
    }

    def add_commands(self, subparsers: Subparsers) -> None:
        del subparsers

    def add_serve_options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--cluster-listen",
            metavar="HOST:PORT",
            help="join a broker network: MQTT links (TCP) and the Kademlia overlay (UDP) on this port",
        )
        parser.add_argument(
            "--join",
            metavar="HOST:PORT[,HOST:PORT...]",
            help="cluster address(es) of running members to join through",
        )
        parser.add_argument(
            "--cluster-secret-file",
            metavar="PATH",
            help="file holding the cluster's shared secret (or env SIFTMQ_CLUSTER_SECRET)",
        )
        parser.add_argument(
            "--cluster-peer-expiry",
            type=int,
            default=None,
            metavar="SECONDS",
            help="how long a peer keeps this node's link session (and its QoS 1/2 messages) "
            "while the link is down (default 60)",
        )
        parser.add_argument(
            "--cluster-takeover-timeout",
            type=float,
            default=None,
            metavar="SECONDS",
            help="how long a CONNACK waits for the client's session to come from another node (default 2)",
        )

    def serve_hooks(self, ctx: ServeContext) -> Sequence[Hooks]:
        args, opts = ctx.args, ctx.options
        listen = args.cluster_listen or opts.get("cluster_listen")
        join = args.join or opts.get("join")
        if listen is None:
            if join:
                raise ValueError("--join needs --cluster-listen")
            return ()
        require(Extra.CLUSTER, "--cluster-listen")
        if isinstance(join, str):
            joined = join.split(",")
        elif isinstance(join, list):
            joined = [str(j) for j in join]
        else:
            joined = []
        addresses = [parse_address(j, "--join") for j in joined if j.strip()]
        secret = _secret(
            args.cluster_secret_file or opts.get("cluster_secret_file"), opts.get("cluster_secret")
        )
        expiry = args.cluster_peer_expiry or opts.get("cluster_peer_expiry") or 60
        if not isinstance(expiry, int) or expiry <= 0:
            raise ValueError("--cluster-peer-expiry must be a positive number of seconds")
        takeover = args.cluster_takeover_timeout
        if takeover is None:
            takeover = opts.get("cluster_takeover_timeout", 2.0)
        if isinstance(takeover, bool) or not isinstance(takeover, int | float) or takeover <= 0:
            raise ValueError("--cluster-takeover-timeout must be a positive number of seconds")
        refresh = _seconds(opts, "cluster_refresh", 2.0)
        failure = _seconds(opts, "cluster_failure_timeout", 5.0)
        link_queue = opts.get("cluster_link_queue", 1_000_000)
        if isinstance(link_queue, bool) or not isinstance(link_queue, int) or link_queue <= 0:
            raise ValueError("cluster_link_queue must be a positive number of messages")
        from cluster._node import AclClusterNode, ClusterNode

        acl = args.acl_file or opts.get("acl_file")
        return (
            (AclClusterNode if acl else ClusterNode)(
                parse_address(str(listen), "--cluster-listen"),
                addresses,
                secret,
                data_dir=ctx.data_dir,
                peer_expiry=expiry,
                takeover_timeout=float(takeover),
                refresh=refresh,
                rpc_timeout=failure,
                link_queue=link_queue,
            ),
        )


def _seconds(opts: Mapping[str, object], key: str, default: float) -> float:
    value = opts.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{key} must be a positive number of seconds")
    return float(value)


def _secret(path: object, inline: object) -> bytes:
    if path is not None:
        try:
            # whoever reads the secret can join as a peer, trusted with every message: a file
            # group or others may read is refused (docs/security.md, "Files on disk")
            shared = shared_access(str(path))
            if shared is not None:
                raise ValueError(f"--cluster-secret-file: {shared}")
            secret = Path(str(path)).read_bytes().strip()
        except OSError as exc:
            raise ValueError(f"--cluster-secret-file: {exc}") from None
    elif inline is not None:
        secret = str(inline).encode()
    else:
        secret = os.environ.get("SIFTMQ_CLUSTER_SECRET", "").encode()
    if len(secret) < 8:
        raise ValueError(
            "a cluster needs a shared secret of 8 bytes or more: --cluster-secret-file PATH "
            "(or SIFTMQ_CLUSTER_SECRET, or cluster_secret in [serve])"
        )
    return secret


PLUGIN = ClusterPlugin()
