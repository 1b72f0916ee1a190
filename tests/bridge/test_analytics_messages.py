"""What ``siftmq analytics`` prints besides its results (issue 31 item 6): pyspark's
applyInPandasWithState made pandas print a FutureWarning from the Python worker on every run
(pyspark pads its output with an untyped empty DataFrame, bridge/_analytics.py).  The filter
for it must take exactly that warning from that module and nothing else; the real run's
stderr is checked by tests/bridge/test_bridge_standalone.py (the executor's log).  The
driver's JVM starts with our log4j 2 configuration (Spark's banner and start-up WARNs)."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd  # type: ignore[import-untyped]
import pytest

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
        "w = lambda text: warnings.warn_explicit(text, FutureWarning, 'w.py', 1, module='pyspark.worker')\n"
        "w(a._PYSPARK_PADDING_WARNING)\n"
        "w('kept')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
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


def test_the_driver_starts_with_our_log_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark's default profile printed its banner, a log-level hint and the NativeCodeLoader
    WARN on every run before ``setLogLevel`` could apply; a user's SPARK_CONF_DIR wins."""
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    options = analytics._driver_log_options()
    assert options is not None and options.startswith("-Dlog4j2.configurationFile=file:")
    text = Path(options.removeprefix("-Dlog4j2.configurationFile=file:")).read_text()
    assert text == analytics._LOG4J2 and "rootLogger.level = warn" in text
    monkeypatch.setenv("SPARK_CONF_DIR", "/etc/spark")
    assert analytics._driver_log_options() is None
