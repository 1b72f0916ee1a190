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
from typing import cast

from broker.ext import ConfigError, Extra, Kind, Option, require, shared_access, split_hostport
from broker.hooks import Hooks
from broker.plugins import ServeContext, Subparsers

__all__ = ["PLUGIN", "ClusterPlugin", "parse_address"]


def parse_address(text: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); ConfigError (a ValueError) naming
    ``what`` otherwise."""
    address = split_hostport(text)
    if address is None:
        raise ConfigError(what, text, Option(Kind.HOSTPORT).expected)
    return address


def _seconds_option() -> Option:
    return Option(Kind.FLOAT, lo=0, lo_open=True, unit="seconds")


class ClusterPlugin:
    """The ``serve`` options of the broker network (docs/cluster.md)."""

    name = "cluster"
    #: the ``[serve]`` keys, checked at load like every option (``broker.ext.Option``)
    serve_options: Mapping[str, Option] = {
        "cluster_listen": Option(Kind.HOSTPORT),
        "join": Option(Kind.HOSTPORTS),
        "cluster_secret_file": Option(Kind.PATH),
        "cluster_secret": Option(Kind.STR),
        "cluster_peer_expiry": Option(Kind.INT, lo=1, unit="seconds"),
        "cluster_takeover_timeout": _seconds_option(),
        "cluster_refresh": _seconds_option(),
        "cluster_failure_timeout": _seconds_option(),
        "cluster_link_queue": Option(Kind.INT, lo=1, unit="messages"),
    }
    serve_keys = frozenset(serve_options)

    #: the ``[serve]`` keys without a flag (docs/config-reference.md is generated from this)
    serve_key_help: Mapping[str, str] = {
        "cluster_secret": "the cluster's shared secret inline (8 bytes or more; prefer cluster_secret_file)",
        "cluster_refresh": "seconds between refreshes of the membership (default 2)",
        "cluster_link_queue": "QoS 1/2 messages a peer's link session may queue here (default 1,000,000)",
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
            default=None,
            metavar="SECONDS",
            help="how long a peer keeps this node's link session (and its QoS 1/2 messages) "
            "while the link is down (default 60)",
        )
        parser.add_argument(
            "--cluster-takeover-timeout",
            default=None,
            metavar="SECONDS",
            help="how long a CONNACK waits for the client's session to come from another node (default 2)",
        )

    def serve_hooks(self, ctx: ServeContext) -> Sequence[Hooks]:
        args, opts = ctx.args, ctx.options  # opts: checked at load against serve_options
        listen = args.cluster_listen or opts.get("cluster_listen")
        join = args.join or opts.get("join")
        if listen is None:
            if join:
                raise ValueError("--join needs --cluster-listen")
            return ()
        require(Extra.CLUSTER, "--cluster-listen")
        items = [join] if isinstance(join, str) else list(cast("Sequence[str]", join or ()))
        joined = [part for item in items for part in item.split(",")]
        addresses = [parse_address(j.strip(), "--join" if args.join else "join") for j in joined if j.strip()]
        secret = _secret(
            args.cluster_secret_file or opts.get("cluster_secret_file"), opts.get("cluster_secret")
        )
        expiry = _given(args.cluster_peer_expiry, opts.get("cluster_peer_expiry", 60))
        takeover = _given(args.cluster_takeover_timeout, opts.get("cluster_takeover_timeout", 2.0))
        refresh = opts.get("cluster_refresh", 2.0)
        failure = opts.get("cluster_failure_timeout", 5.0)
        link_queue = opts.get("cluster_link_queue", 1_000_000)
        assert isinstance(expiry, int) and isinstance(link_queue, int)
        assert (
            isinstance(takeover, float | int)
            and isinstance(refresh, float | int)
            and isinstance(failure, float | int)
        )
        from cluster._node import AclClusterNode, ClusterNode

        acl = args.acl_file or opts.get("acl_file")
        return (
            (AclClusterNode if acl else ClusterNode)(
                parse_address(str(listen), "--cluster-listen" if args.cluster_listen else "cluster_listen"),
                addresses,
                secret,
                data_dir=ctx.data_dir,
                peer_expiry=expiry,
                takeover_timeout=float(takeover),
                refresh=float(refresh),
                rpc_timeout=float(failure),
                link_queue=link_queue,
            ),
        )


def _given(flag: object, key: object) -> object:
    """The flag's value (checked by ``siftmq serve`` against the key's Option) when given,
    else the ``[serve]`` key's (checked at load) or its default."""
    return key if flag is None else flag


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
