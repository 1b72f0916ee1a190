"""Reading the analytics' results back (pyarrow + pandas, no Spark): :func:`results`.

The Spark jobs (``bridge/_analytics.py``, ``bridge/_composite.py``) write each result ``name``
in update mode as ``OUTPUT/<name>/batch=<id>/`` (``foreachBatch``, overwrite per batch id, so a
re-run batch replaces its own files); for each key of :data:`RESULT_KEYS` the row of the latest
committed batch wins.  A result never written (an output from before the result existed) reads
as an empty DataFrame.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd  # type: ignore[import-untyped]
import pyarrow.dataset as ds

__all__ = ["COMPOSITE_KEYS", "RESULT_KEYS", "results"]

_SUB = ("expression", "window", "max_buffer")

#: keys of the composite results (a composite subscription is (expression, window, max_buffer))
COMPOSITE_KEYS: dict[str, tuple[str, ...]] = {
    "composite_subscriptions": _SUB,
    "composite_overall": ("scope",),
    "composite_losses": (*_SUB, "element"),
    "composite_churn": (*_SUB, "action"),
}

RESULT_KEYS: dict[str, tuple[str, ...]] = {
    "topic_rate": ("window_start", "topic"),
    "subscriber_rate": ("window_start", "subscriber_id"),
    "node_rate": ("window_start", "node"),
    "churn": ("window_start", "action"),
    "latency": ("window_start",),
    "fanout": ("deliveries",),
    "top_topics": ("topic",),
    "filter_selectivity": ("subscriber_id", "subscription_filter", "content_filter"),
    "active_filters": (),  # delta events: every row counts
    **COMPOSITE_KEYS,  # bridge/_composite.py
}


def results(output: str | Path, name: str) -> pd.DataFrame:
    """The latest result ``name`` as pandas: per key, the row of the latest micro-batch."""
    path = Path(output) / name
    for attempt in range(5):
        try:
            files = _committed_files(path)
            if not files:
                return pd.DataFrame()
            table = ds.dataset(
                files,
                format="parquet",
                partitioning=ds.partitioning(flavor="hive"),
                partition_base_dir=str(path),
            ).to_table()
            break
        except FileNotFoundError:  # a batch was being re-written (overwrite) while we read
            if attempt == 4:
                raise
    pdf: pd.DataFrame = table.to_pandas()
    if pdf.empty:
        return pdf
    keys = list(RESULT_KEYS[name])
    if keys:
        pdf = pdf.sort_values("batch", kind="stable").drop_duplicates(keys, keep="last")
    return pdf.drop(columns=["batch"]).reset_index(drop=True)


def _committed_files(path: Path) -> list[str]:
    """Data files of committed batches: ``batch=<id>/part-*.parquet``, skipping Spark's
    ``_temporary`` directories and hidden or ``_`` files of a batch still being written."""
    if not path.is_dir():
        return []
    files: list[str] = []
    for batch in os.scandir(path):
        if not batch.name.startswith("batch=") or not batch.is_dir():
            continue
        try:
            names = os.listdir(batch.path)
        except FileNotFoundError:
            continue
        if "_SUCCESS" not in names:  # the batch's write job has not committed yet
            continue
        files.extend(
            os.path.join(batch.path, n) for n in names if n.endswith(".parquet") and n[0] not in "._"
        )
    return sorted(files)
