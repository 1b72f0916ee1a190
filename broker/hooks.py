"""What the broker reports about itself, and the hooks that receive it (public API).

The records (:class:`Publication`, :class:`Delivery`, :class:`SubscriptionChange`, ...) and the
calls of the broker's core (:class:`~broker.core._hooks.CoreHooks`: ``on_*``, ``authenticate``,
``authorize``, ``on_publish``, ...) are defined where the core calls them,
:mod:`broker.core._hooks` (its docstring tells how they are built and what they cost); this
module adds :class:`Hooks`, the class to subclass, with the broker's lifecycle calls
(``start``, ``attach``, ``ready``, ``stopping``, ``stop``), so the core imports nothing of the
app level (docs/architecture.md, "Layers").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.core import (
    DROP_REASONS,
    AuthRequest,
    AuthUnavailable,
    AuthVerdict,
    CompositeAction,
    CompositeChange,
    CompositeEventRecord,
    CompositeLoss,
    CoreHooks,
    Delivery,
    DeliveryEntry,
    DerivedMessage,
    Publication,
    PublishAction,
    PublishContext,
    PublishDecision,
    SubscriptionAction,
    SubscriptionChange,
)

if TYPE_CHECKING:
    from broker._broker import Broker

__all__ = [
    "DROP_REASONS",
    "AuthRequest",
    "AuthUnavailable",
    "AuthVerdict",
    "CompositeAction",
    "CompositeChange",
    "CompositeEventRecord",
    "CompositeLoss",
    "CoreHooks",
    "Delivery",
    "DeliveryEntry",
    "DerivedMessage",
    "Hooks",
    "Publication",
    "PublishAction",
    "PublishContext",
    "PublishDecision",
    "SubscriptionAction",
    "SubscriptionChange",
]


class Hooks(CoreHooks):
    """Observer and policy interface of the broker; subclass and override what you need.

    Every call of :class:`~broker.core._hooks.CoreHooks` (the records, ``authenticate``,
    ``authorize``, ``on_publish``; read its docstring), and the broker's lifecycle: ``start``
    runs before the listeners open and ``stop`` after they closed and every session was
    handled, so a hook can flush what it buffered.
    """

    async def start(self) -> None:
        """Called once when the broker starts."""

    async def stop(self) -> None:
        """Called once on graceful stop, after the last record was emitted."""

    async def stopping(self) -> None:
        """Called once when a graceful stop begins, before the listeners close and while the
        store is open: a hook that feeds the broker (the cluster's links) stops feeding it, so
        that nothing is acknowledged after the store closed."""

    def attach(self, broker: Broker) -> None:
        """Called once by the :class:`~broker.Broker` this hook is registered in, when it is
        built: a hook that acts on the broker (the cluster node) keeps the reference."""

    async def ready(self) -> None:
        """Called once when the broker serves (store restored, listeners open)."""
