"""The public seams (docs/architecture.md, "Seams") resolve every name they list, to the object
its home module defines, and load lazily.

``tests/test_layers.py`` checks on the source that no package imports another's ``_``-modules;
this checks at run time that what the seams offer instead is there: a lazy seam whose map
names the wrong module fails only at a name's first use, which the type checker does not see.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from tests.test_layers import _origin

#: the public modules that re-export names of private modules (lazily or not)
SEAMS = (
    "broker",
    "broker.ext",
    "broker.core",
    "broker.net",
    "broker.durability",
    "broker.protocol",
    "broker.values",
    "broker.packets",
    "broker.store",
    "content",
    "content.baselines",
)


@pytest.mark.parametrize("seam", SEAMS)
def test_every_name_of_a_seam_is_the_object_its_home_defines(seam: str) -> None:
    module = importlib.import_module(seam)
    names = module.__all__
    assert names, f"{seam} offers nothing"
    wrong = []
    traced = 0
    for name in names:
        value = getattr(module, name)
        home = _origin(seam, name)
        if home is None:
            continue  # defined in the seam itself (or a third-party name)
        traced += 1
        expected = getattr(importlib.import_module(home), name)
        if value is not expected:
            wrong.append(f"{seam}.{name} is not {home}.{name}")
    # a seam re-exports: if no name traces to a home, the check above compared nothing
    assert traced, f"{seam}: none of its names traced to the module that defines it"
    assert not wrong, "\n".join(wrong)


def test_importing_a_seam_loads_nothing_behind_it() -> None:
    """``import broker.ext`` (and the subpackages' seams) import no core module, and a name
    loads its own home only: the seams change no import order."""
    code = (
        "import sys, broker.ext, broker.core, broker.net, broker.durability, content.baselines\n"
        "heavy = ('broker.core._core', 'broker.core._session', 'broker.net._transport',\n"
        "         'broker.durability._store', 'broker._broker', 'content.baselines._betree')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "from broker.ext import Option\n"
        "print('broker._config' in sys.modules, 'broker.core._core' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[]", "True False"]
