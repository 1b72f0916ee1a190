"""``siftmq analytics``: the bridge's sub-command, registered by the broker's CLI.

``register(subparsers)`` adds ``analytics`` (run the Spark jobs over the landing zone;
``--once`` processes what is there and exits), ``analytics report`` (render the latest
results as one self-contained HTML page), ``analytics composite`` (the composite
subscriptions' view of the latest results, as text or ``--json``) and ``analytics alerts``
(the loop of issue 29: telemetry -> z-score -> alerts published to MQTT, ``bridge/_loop.py``).
Spark and matplotlib are imported only when the command runs, so ``siftmq --help`` stays fast,
and each command first checks that the ``spark`` extra is installed: without it, one line
naming ``pip install 'siftmq[spark]'`` and exit status 2 (``broker.ext.require``).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.ext import Extra, Kind, Option, flag_type, require

__all__ = ["DEFAULT_DATA_DIR", "register"]

DEFAULT_DATA_DIR = Path("siftmq-data")

#: Spark's interval strings of --window / --watermark ("10 seconds", "1 minute", "500 milliseconds")
_INTERVAL = re.compile(r"^\s*\d+(\.\d+)?\s+(millisecond|second|minute|hour|day|week)s?\s*$", re.IGNORECASE)


def _seconds(flag: str) -> Callable[[str], Any]:
    """argparse ``type=`` of a positive number of seconds (the schema's ``Option``)."""
    return flag_type(flag, Option(Kind.FLOAT, lo=0, lo_open=True, unit="seconds"))


def _interval(flag: str) -> Callable[[str], str]:
    """argparse ``type=`` of a Spark interval: checked here, not by a Spark error later."""

    def parse(text: str) -> str:
        if not _INTERVAL.match(text):
            raise argparse.ArgumentTypeError(
                f"{flag} {text}: expected NUMBER UNIT, e.g. '10 seconds', '1 minute'"
            )
        return text

    return parse


def _mqtt_url(text: str) -> str:
    if not text.startswith(("mqtt://", "mqtts://")):
        raise argparse.ArgumentTypeError(f"--url {text}: expected mqtt://HOST[:PORT] or mqtts://HOST[:PORT]")
    return text


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``analytics`` sub-command; it sets ``func`` (call ``args.func(args)``)."""
    p = subparsers.add_parser(
        "analytics",
        help="run the Spark analytics over the bridge's landing zone",
        description="Run the Spark Structured Streaming analytics over the landing zone "
        "(local Spark by default). 'siftmq analytics report' renders the latest results as HTML.",
    )
    _common(p)
    p.add_argument("--master", default="local[2]", help="Spark master URL (default: local[2])")
    p.add_argument("--once", action="store_true", help="process what is in the landing zone and exit")
    p.add_argument(
        "--window",
        type=_interval("--window"),
        default="10 seconds",
        help="event-time window length (default: 10 seconds)",
    )
    p.add_argument(
        "--watermark",
        type=_interval("--watermark"),
        default="30 seconds",
        help="how late a record may arrive (default: 30 seconds)",
    )
    p.add_argument(
        "--trigger",
        type=_seconds("--trigger"),
        default=0.5,
        help="seconds between micro-batches when not --once",
    )
    p.add_argument(
        "--summary-every",
        type=_seconds("--summary-every"),
        default=10.0,
        help="seconds between console summaries",
    )
    p.add_argument(
        "--results",
        default=None,
        help="comma-separated results to compute (default: all; e.g. topic_rate,top_topics)",
    )
    p.set_defaults(func=_run_analytics)
    sub = p.add_subparsers(dest="analytics_command", required=False)
    r = sub.add_parser("report", help="render the latest results as a self-contained HTML page")
    _common(r)
    r.add_argument("--html", type=Path, default=None, help="output file (default: OUTPUT/report.html)")
    r.add_argument("--include-sys", action="store_true", help="keep the broker's $SYS topics in 'Top topics'")
    r.set_defaults(func=_run_report)
    c = sub.add_parser(
        "composite",
        help="composite subscriptions in the latest results: events, time to completion, "
        "buffer occupancy, expiries, drops, changes",
    )
    _common(c)
    c.add_argument("--json", action="store_true", help="print the view as one JSON document")
    c.set_defaults(func=_run_composite)
    a = sub.add_parser(
        "alerts",
        help="the loop: score device telemetry (z-score over a window) and publish alerts to MQTT",
        description="Read telemetry/<device> messages landed by 'siftmq serve --bridge-messages "
        "telemetry/#' through format('siftmq'), flag readings whose z-score against the device's "
        "last --window seconds is at least --threshold, and publish them to alerts/<device>.",
    )
    _common(a)
    a.add_argument(
        "--url",
        type=_mqtt_url,
        default="mqtt://127.0.0.1:1883",
        help="broker for the alerts (mqtt:// or mqtts://)",
    )
    a.add_argument("--topic-prefix", default="telemetry/", help="telemetry topics are PREFIX<device>")
    a.add_argument("--field", default="value", help="the JSON field of the payload to score")
    a.add_argument(
        "--window", type=_seconds("--window"), default=60.0, help="seconds of history per device (default 60)"
    )
    a.add_argument(
        "--threshold",
        type=flag_type("--threshold", Option(Kind.FLOAT, lo=0, lo_open=True)),
        default=3.0,
        help="|z| that makes an alert (default 3)",
    )
    a.add_argument(
        "--min-readings",
        type=flag_type("--min-readings", Option(Kind.INT, lo=2)),
        default=5,
        help="history needed before scoring (default 5)",
    )
    a.add_argument("--alert-topic", default="alerts/{device}", help="topic template of the alerts")
    a.add_argument("--qos", type=int, choices=(0, 1, 2), default=1)
    a.add_argument("--trigger", type=_seconds("--trigger"), default=0.5, help="seconds between micro-batches")
    a.add_argument("--username", default=None)
    a.add_argument("--password", default=None)
    a.add_argument("--master", default="local[2]", help="Spark master URL (default: local[2])")
    a.set_defaults(func=_run_alerts)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--landing",
        action="append",
        default=None,
        help="landing zone directory or URI (default: siftmq-data/landing); repeat it to read "
        "several landing zones (one per cluster node) as one",
    )
    p.add_argument(
        "--output",
        default=str(DEFAULT_DATA_DIR / "analytics"),
        help="results and checkpoints directory (default: siftmq-data/analytics)",
    )


def _need_spark() -> None:
    """Raise ``MissingExtra`` when the ``spark`` extra is not installed: ``siftmq`` prints the
    one line naming ``pip install 'siftmq[spark]'`` after the command's name, status 2."""
    require(Extra.SPARK, "the Spark analytics")


def _run_analytics(args: argparse.Namespace) -> int:
    _need_spark()
    from bridge._analytics import run_cli

    return run_cli(
        landing=args.landing or [str(DEFAULT_DATA_DIR / "landing")],
        output=args.output,
        master=args.master,
        once=args.once,
        window=args.window,
        watermark=args.watermark,
        trigger=args.trigger,
        summary_every=args.summary_every,
        only=None if args.results is None else tuple(r.strip() for r in args.results.split(",") if r.strip()),
    )


def _run_alerts(args: argparse.Namespace) -> int:
    _need_spark()

    from bridge._analytics import spark_session
    from bridge._loop import LoopOptions, alerts_query

    landings = args.landing or [str(DEFAULT_DATA_DIR / "landing")]
    o = LoopOptions(
        url=args.url,
        topic_prefix=args.topic_prefix,
        field=args.field,
        window=args.window,
        threshold=args.threshold,
        min_readings=args.min_readings,
        alert_topic=args.alert_topic,
        qos=args.qos,
        trigger=args.trigger,
        username=args.username,
        password=args.password,
    )
    spark = spark_session(args.master, app_name="siftmq-alerts")
    query = alerts_query(spark, landings, str(Path(args.output) / "_checkpoints" / "alerts"), o)
    print(f"siftmq analytics alerts: {', '.join(landings)} -> {o.url} {o.alert_topic}", flush=True)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        pass
    finally:
        query.stop()
        spark.stop()
    if query.exception() is not None:
        print(f"siftmq analytics alerts: the query failed: {query.exception()}", file=sys.stderr)
        return 1
    return 0


def _run_report(args: argparse.Namespace) -> int:
    _need_spark()
    from bridge._report import write_report

    html = args.html if args.html is not None else Path(args.output) / "report.html"
    path = write_report(args.output, html, args.include_sys)
    print(f"report written to {path}")
    return 0


def _run_composite(args: argparse.Namespace) -> int:
    _need_spark()
    import json

    from bridge._composite import composite_summary, composite_view

    view = composite_view(args.output)
    if args.json:
        print(json.dumps(view, indent=2, sort_keys=True))
    else:
        print("\n".join(composite_summary(view, top_n=len(view["subscriptions"]))))
    return 0
