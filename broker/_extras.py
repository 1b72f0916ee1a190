"""The optional extras of the ``siftmq`` distribution, and the one clear error when one is missing.

``pip install siftmq`` installs the broker alone (MQTT, content filters, composite
subscriptions, persistence, TLS/WebSocket, the CLI); the rest comes with extras
(``pyproject.toml``, docs/operations.md "Installing"):

- ``spark``: the bridge to Spark, ``siftmq analytics`` and its report (pyspark, pyarrow,
  pandas, matplotlib);
- ``cluster``: the broker network (kademlia);
- ``metrics``: the Prometheus text at ``/metrics`` of ``--metrics-listen`` (prometheus-client;
  the dashboard on the same listener needs no extra);
- ``auth``: the HTTP and JWT authentication backends (``broker.authn``: aiohttp, PyJWT,
  cryptography);
- ``all``: every one of them.

A feature that needs an extra asks :func:`require` before it imports anything of it; when a
module of the extra is absent it raises :class:`MissingExtra`, whose text is one line naming
the ``pip install`` command, and the CLI prints it and exits with status 2 (docs/reference.md,
"Packaging"). The check is ``importlib.util.find_spec`` of each top-level module: nothing is
imported, so asking costs microseconds and never loads Spark.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from enum import Enum

__all__ = ["Extra", "MissingExtra", "available", "missing_module", "require"]


class Extra(Enum):
    """An optional extra; its value is the name used in ``pip install 'siftmq[NAME]'``."""

    SPARK = "spark"
    CLUSTER = "cluster"
    METRICS = "metrics"
    AUTH = "auth"


#: the top-level modules each extra brings (the import names of its PyPI distributions)
MODULES: dict[Extra, tuple[str, ...]] = {
    Extra.SPARK: ("pyspark", "pyarrow", "pandas", "matplotlib"),
    Extra.CLUSTER: ("kademlia",),
    Extra.METRICS: ("prometheus_client",),
    Extra.AUTH: ("aiohttp", "jwt", "cryptography"),
}


class MissingExtra(ImportError):
    """A feature was asked for whose extra is not installed (``str()`` is the one line to print)."""

    def __init__(self, extra: Extra, feature: str, module: str) -> None:
        self.extra = extra
        self.feature = feature
        super().__init__(
            f"{feature} needs the '{extra.value}' extra ({module} is not installed): "
            f"pip install 'siftmq[{extra.value}]'",
            name=module,
        )


def missing_module(extra: Extra) -> str | None:
    """The first module of ``extra`` that is not installed (None: the extra is complete)."""
    for module in MODULES[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken parent package or a spec-less module
            found = False
        if not found:
            return module
    return None


def available(extra: Extra) -> bool:
    """Whether every module of ``extra`` is installed."""
    return missing_module(extra) is None


def require(extra: Extra, feature: str) -> None:
    """Raise :class:`MissingExtra` when ``extra`` is not installed (``feature`` names what
    needed it, e.g. ``"siftmq analytics"`` or ``"--cluster-listen"``)."""
    module = missing_module(extra)
    if module is not None:
        raise MissingExtra(extra, feature, module)


def lazy_names(
    package: str,
    homes: Mapping[str, str],
    extra: Extra | None = None,
    *,
    plain: Mapping[str, str] | None = None,
) -> Callable[[str], object]:
    """A package's ``__getattr__`` (PEP 562): each public name in ``homes`` (name -> module)
    is imported from its module on first use, after :func:`require` of ``extra`` when given,
    and kept in the package so that the next use is an ordinary attribute.  ``plain``: the
    package's names that need no extra (imported at first use too), for a package whose
    names need ``extra`` only in part (``bridge``: Spark; ``cluster``: kademlia).  O(1) per
    first use of a name, plus its import."""
    free: Mapping[str, str] = plain or {}

    def __getattr__(name: str) -> object:
        home = free.get(name)
        if home is None:
            home = homes.get(name)
            if home is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            if extra is not None:
                require(extra, f"{package}.{name}")
        value = getattr(importlib.import_module(home), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
