"""What ``siftmq analytics`` prints besides its results (issue 31 item 6): pyspark's
applyInPandasWithState made pandas print a FutureWarning from the Python worker on every run
(pyspark pads its output with an untyped empty DataFrame, bridge/_analytics.py).  The filter
for it must take exactly that warning from that module and nothing else; the real run's
stderr is checked by tests/bridge/test_bridge_standalone.py (the executor's log)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pandas as pd  # type: ignore[import-untyped]

import bridge._analytics as analytics


def _shown(message: str, category: type[Warning], module: str) -> bool:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        analytics._filter_pyspark_padding_warning()  # what the module does at import
        warnings.warn_explicit(message, category, "worker.py", 1, module=module)
    return bool(seen)


def test_the_filter_is_installed_at_import() -> None:
    """The worker imports the module and nothing else of ours: the import installs it (in a
    fresh interpreter, as the worker's; pytest resets the filters around each test)."""
    code = (
        "import warnings, bridge._analytics as a\n"
        "warnings.warn_explicit(a._PYSPARK_PADDING_WARNING, FutureWarning, 'worker.py', 1, module='pyspark.worker')\n"
        "warnings.warn_explicit('kept', FutureWarning, 'worker.py', 1, module='pyspark.worker')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "kept" in done.stderr
    assert analytics._PYSPARK_PADDING_WARNING not in done.stderr


def test_only_that_warning_from_pyspark_worker_is_filtered() -> None:
    text = analytics._PYSPARK_PADDING_WARNING + ". In a future version, ..."
    assert not _shown(text, FutureWarning, "pyspark.worker")
    assert _shown(text, FutureWarning, "myapp")  # a user's own concatenation still warns
    assert _shown(text, DeprecationWarning, "pyspark.worker")
    assert _shown("another FutureWarning", FutureWarning, "pyspark.worker")


def test_the_message_is_still_pandas_own() -> None:
    """The filtered text is what this pandas says (a pandas that rewords it would bring the
    warning back: this test names the change)."""
    data = pd.DataFrame({"t": pd.to_datetime(["2026-01-01"]), "n": [1]})
    pad = pd.DataFrame(dict.fromkeys(data.columns), index=[])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        pd.concat([data, pad], ignore_index=True)
    texts = [str(w.message) for w in seen if issubclass(w.category, FutureWarning)]
    assert not texts or any(t.startswith(analytics._PYSPARK_PADDING_WARNING) for t in texts)
