"""The loop (issue 29): device telemetry -> Spark -> anomaly alerts -> back to the devices.

Devices publish JSON telemetry (``{"value": 21.5}``) on ``telemetry/<device>``; the broker's
bridge lands those messages whole (``siftmq serve --bridge-messages 'telemetry/#'``,
``Bridge(messages=[...])``); :func:`alerts_query` reads them with
``spark.readStream.format("siftmq").option("kind", "messages")``, scores each reading against
the same device's readings of the previous ``window`` seconds (z-score: ``(value - mean) /
stddev``, population standard deviation, once the device has ``min_readings`` readings in the
window and a non-zero deviation) and publishes every reading with ``|z| >= threshold`` through
``writeStream.format("siftmq")`` to ``alerts/<device>`` (the alert row as JSON: device, time,
value, mean, stddev, z, readings).  A device subscribed to its alert topic receives it.

The scoring is a stateful operator (``applyInPandasWithState``, append mode): the state of a
device is its readings of the last ``window`` seconds of event time (the broker's receipt time
of each reading), so an alert is emitted in the micro-batch that reads the reading -- no
watermark to wait for.  Readings of one device are scored in event-time order within a
micro-batch; a reading older than the device's state is scored against the state as it is.
Checkpointed: a restarted job resumes from its checkpoint and re-publishes an unfinished
batch's alerts with the same idempotency keys (``bridge/_sink.py``).

A reading whose payload is not a JSON object with a numeric ``field`` has a null value: it is
not scored and does not enter the device's history (a policy, documented in docs/bridge.md).
See docs/bridge.md ("The loop") for the command and the measured delay.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd  # type: ignore[import-untyped]

# the Python worker imports this module to unpickle the scorer: the same filter of pyspark's
# padding FutureWarning as the analytics' stateful operator (bridge/_analytics.py)
from bridge._analytics import _filter_pyspark_padding_warning

_filter_pyspark_padding_warning()

__all__ = ["LoopOptions", "alerts_query", "score"]

_ALERT_SCHEMA = (
    "device STRING, time TIMESTAMP, value DOUBLE, mean DOUBLE, stddev DOUBLE, z DOUBLE, readings INT"
)
_STATE_SCHEMA = "readings STRING"


@dataclass(frozen=True, slots=True)
class LoopOptions:
    """What :func:`alerts_query` reads, how it scores, and where it publishes."""

    url: str  # the broker the alerts go to (mqtt:// or mqtts://)
    topic_prefix: str = "telemetry/"  # telemetry topics are <prefix><device>
    field: str = "value"  # the JSON field scored
    window: float = 60.0  # seconds of a device's history a reading is scored against
    threshold: float = 3.0  # |z| at or above which a reading is an alert
    min_readings: int = 5  # history needed before scoring
    alert_topic: str = "alerts/{device}"
    qos: int = 1
    trigger: float = 0.5  # seconds between micro-batches
    username: str | None = None
    password: str | None = None


def score(
    history: list[tuple[float, float]], t: float, value: float, o: LoopOptions
) -> tuple[float, float, float, int] | None:
    """(mean, stddev, z, readings) of ``value`` at ``t`` against ``history`` ((time, value)
    pairs within the window), or None when it is not an alert."""
    n = len(history)
    if n < o.min_readings:
        return None
    mean = sum(v for _, v in history) / n
    std = math.sqrt(sum((v - mean) ** 2 for _, v in history) / n)
    if std == 0.0:
        return None
    z = (value - mean) / std
    return (mean, std, z, n) if abs(z) >= o.threshold else None


def _scorer(o: LoopOptions) -> Any:
    def apply(key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        device = key[0]
        history: list[tuple[float, float]] = (
            [(float(t), float(v)) for t, v in json.loads(state.get[0])] if state.exists else []
        )
        frames = [p for p in pdfs if len(p)]
        out = []
        if frames:
            pdf = pd.concat(frames).sort_values("time", kind="stable")
            for ts, value in zip(pdf["time"], pdf["value"], strict=True):
                if value is None or (isinstance(value, float) and math.isnan(value)):
                    continue
                t = ts.timestamp()
                history = [(ht, hv) for ht, hv in history if ht > t - o.window]
                hit = score(history, t, float(value), o)
                if hit is not None:
                    mean, std, z, n = hit
                    out.append((device, ts, float(value), mean, std, z, n))
                history.append((t, float(value)))
        state.update((json.dumps(history),))
        yield pd.DataFrame(out, columns=["device", "time", "value", "mean", "stddev", "z", "readings"])

    return apply


def alerts_query(
    spark: Any, landing: str | list[str], checkpoint: str, o: LoopOptions, source: str = "siftmq"
) -> Any:
    """Start the loop's streaming query (returns the ``StreamingQuery``).  It reads with
    ``format(source)`` (``siftmq``: the JVM provider when the session has its jar, else the
    Python source; ``siftmq_python``: the Python source) and publishes with the Python sink,
    ``format("siftmq_python")``, directly: through the JVM provider each micro-batch would be a
    batch write of its own, planned anew (docs/lab/performance-bridge.md, "Session 12")."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout
    from pyspark.sql.types import StructType

    from bridge import Kind, register, spark_schema

    register(spark)
    paths = [landing] if isinstance(landing, str) else landing
    prefix = o.topic_prefix
    used = ("time", "topic", "payload")  # Spark prunes no column of a Python source: say which
    full = spark_schema(Kind.MESSAGES)
    readings = (
        spark.readStream.format(source)
        .schema(StructType([full[c] for c in used]))  # given: no Python process asked for it
        .option("kind", "messages")
        .option("columns", ",".join(used))
        .option("paths", json.dumps(paths))
        .load()
        .where(F.col("topic").startswith(prefix))
        .select(
            F.col("time"),
            F.substring(F.col("topic"), len(prefix) + 1, 65_535).alias("device"),
            F.get_json_object(F.col("payload").cast("string"), f"$.{o.field}").cast("double").alias("value"),
        )
        .where(F.col("device") != "")
    )
    alerts = readings.groupBy("device").applyInPandasWithState(
        _scorer(o), _ALERT_SCHEMA, _STATE_SCHEMA, "append", GroupStateTimeout.NoTimeout
    )
    writer = (
        alerts.writeStream.format("siftmq_python")
        .queryName("siftmq_alerts")
        .outputMode("append")
        .option("checkpointLocation", checkpoint)
        .option("url", o.url)
        .option("topic", o.alert_topic)
        .option("qos", str(o.qos))
        .trigger(processingTime=f"{o.trigger} seconds")
    )
    if o.username is not None:
        writer = writer.option("username", o.username)
    if o.password is not None:
        writer = writer.option("password", o.password)
    return writer.start()
