"""argparse parsers that do not import :mod:`shutil` to be built (issue 42 item 1).

argparse makes a help formatter for every ``add_argument`` (to check the argument's
metavar) and each formatter asks ``shutil.get_terminal_size()`` for the width; importing
shutil imports ``bz2`` and ``lzma`` (0.6 MB resident in ``siftmq serve``, which never prints
help). :class:`WidthParser` gives each formatter the same width by the same rules (``COLUMNS``,
else the terminal's, else 80; minus 2) without them. The ``siftmq`` parsers derive from it
(``broker._cli.Parser``, the ``ctl`` parser).
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["WidthParser", "columns"]


def columns() -> int:
    """``shutil.get_terminal_size().columns`` (its rules) without importing shutil. O(1)."""
    try:
        width = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        width = 0
    if width <= 0:
        try:
            width = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            width = 0
    return width if width > 0 else 80


class WidthParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose formatters get their width from :func:`columns`."""

    def _get_formatter(self) -> argparse.HelpFormatter:
        # every HelpFormatter takes width (typeshed's protocol names prog only)
        return self.formatter_class(prog=self.prog, width=columns() - 2)  # type: ignore[call-arg]
