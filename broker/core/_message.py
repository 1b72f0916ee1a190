"""The core's names for the values of :mod:`broker.values` (their one home is
:mod:`broker.values._message`; this module keeps the core's import lines short)."""

from __future__ import annotations

from broker.values import (
    FILTER_PREFIX,
    INTERNAL_CLIENT_PREFIXES,
    INTERNAL_PREFIXES,
    PEER_PREFIX,
    RESERVED_PREFIXES,
    SHARE_PREFIX,
    Message,
    Route,
    SubOptions,
    split_filter_prefix,
    split_share,
)

__all__ = [
    "FILTER_PREFIX",
    "INTERNAL_CLIENT_PREFIXES",
    "INTERNAL_PREFIXES",
    "PEER_PREFIX",
    "RESERVED_PREFIXES",
    "SHARE_PREFIX",
    "Message",
    "Route",
    "SubOptions",
    "split_filter_prefix",
    "split_share",
]
