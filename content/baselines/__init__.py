"""Research baselines: the engines that exist to reproduce the papers' comparisons.

The product engines (``counting``, ``iccounting``, ``rabased``, ``hema``, ``rein``, ``hcem``
and the brute-force oracle) live in :mod:`content`; a broker is configured with one of them.
The four engines here are the baselines the seed papers measure against (docs/content.md,
"Research baselines"):

* :class:`BETree` (``betree``): BE-Tree, the index-based baseline of seed 003;
* :class:`Poset` (``poset``): the covering-poset (Siena-style) baseline of seed 003;
* :class:`TAMA` (``tama``) and :class:`HTree` (``htree``): seed 004's baselines.

Who may use it: :data:`content.ENGINES` lists them under the same names as the product
engines (``ENGINES["betree"]``), and ``content.BETree`` etc. still resolve, so benchmarks and
the model tests reach them the way they reach any engine. They give exactly the answers of
every other engine (the Hypothesis model tests compare each with brute force) and are kept
correct, but they are tuned only as far as a fair comparison needs; nothing in the broker
imports them. Stable: the class names and ``Engine`` interface, as for every engine.

Each class is imported at its first use (PEP 562, as :mod:`content` does): they need numpy.
Cost: one dictionary lookup and the module's import at a name's first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from content.baselines._betree import BETree
    from content.baselines._htree import HTree
    from content.baselines._poset import Poset
    from content.baselines._tama import TAMA

__all__ = ["TAMA", "BETree", "HTree", "Poset"]

#: class name -> its module, imported at the class's first use
_CLASSES: dict[str, str] = {
    "BETree": "content.baselines._betree",
    "Poset": "content.baselines._poset",
    "TAMA": "content.baselines._tama",
    "HTree": "content.baselines._htree",
}


def __getattr__(name: str) -> type:
    """A baseline engine class, imported at its first use (PEP 562). O(1) after the first."""
    home = _CLASSES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls: type = getattr(importlib.import_module(home), name)
    globals()[name] = cls
    return cls
