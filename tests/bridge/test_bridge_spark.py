"""Spark analytics over a landing zone written by the bridge: exact counts, restart, report."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bridge import Bridge
from bridge._analytics import console_summary, results, selectivity, start_queries
from bridge._cli import register
from bridge._report import render_report, write_report
from broker.hooks import SubscriptionAction as A
from tests.bridge.records import change, delivery, feed, publication

pytestmark = pytest.mark.spark

T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC, a multiple of 10 s
N = 600  # messages; message i is at T0 + i / 20 (30 s), on topic t/(i % 3)


def _write_landing(landing: Path, lo: int, hi: int) -> None:
    with Bridge(landing) as b:
        for i in range(lo, hi):
            t = T0 + i / 20
            fanout = i % 4
            feed(b, publication(i, t, topic=f"t/{i % 3}", fanout=fanout))
            for s in range(fanout):
                feed(
                    b,
                    delivery(
                        i, t, topic=f"t/{i % 3}", subscriber=f"s{s}", cf="x > 1" if s == 2 else None, sf="t/#"
                    ),
                )


def _run(spark: Any, landing: Path, output: Path, only: tuple[str, ...] | None = None) -> None:
    queries = start_queries(spark, landing, output, once=True, only=only)
    for q in queries:
        q.awaitTermination()
        assert q.exception() is None


@pytest.fixture(scope="module")
def analysed(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("analysed")
    _write_landing(root / "landing", 0, N)
    with Bridge(root / "landing") as b:
        b.on_subscription_change(change(T0, "s0", A.SUBSCRIBE, "t/#", 1))
        b.on_subscription_change(change(T0 + 1, "s1", A.SUBSCRIBE, "t/#", 1))
        b.on_subscription_change(change(T0 + 2, "s2", A.SUBSCRIBE, "t/+", 1, cf="x > 1"))
        b.on_subscription_change(change(T0 + 12, "s1", A.PARTIAL_UNSUBSCRIBE, "t/1", 2))
        b.on_subscription_change(change(T0 + 13, "s1", A.UNSUBSCRIBE, "t/#", 1))
        b.on_subscription_change(change(T0 + 25, "s0", A.SESSION_END, None, 0))
    _run(spark, root / "landing", root / "out")
    return root / "out"


def _expected_deliveries(lo: int, hi: int) -> int:
    return sum(i % 4 for i in range(lo, hi))


def test_deliveries_per_topic_and_window_are_exact(analysed: Path) -> None:
    rate = results(analysed, "topic_rate")
    got = {(r.window_start.timestamp(), r.topic): r.deliveries for r in rate.itertuples()}
    want: dict[tuple[float, str], int] = {}
    for i in range(N):
        key = (T0 + (i // 200) * 10, f"t/{i % 3}")
        want[key] = want.get(key, 0) + i % 4
    assert got == want
    per_sub = results(analysed, "subscriber_rate").groupby("subscriber_id")["deliveries"].sum().to_dict()
    assert per_sub == {"s0": sum(1 for i in range(N) if i % 4 >= 1), "s1": N // 2, "s2": N // 4}


def test_fanout_top_topics_latency_and_selectivity(analysed: Path) -> None:
    fan = results(analysed, "fanout").set_index("deliveries")["messages"].to_dict()
    assert fan == {0: N // 4, 1: N // 4, 2: N // 4, 3: N // 4}
    top = results(analysed, "top_topics").set_index("topic")
    assert top["messages"].to_dict() == {"t/0": 200, "t/1": 200, "t/2": 200}
    assert int(top["deliveries"].sum()) == _expected_deliveries(0, N)
    lat = results(analysed, "latency")
    assert int(lat["deliveries"].sum()) == _expected_deliveries(0, N)
    assert (lat["p50"] <= lat["p99"]).all() and (lat["max"] <= 0.0100001).all()
    sel = selectivity(analysed)
    assert sel[["subscriber_id", "content_filter", "deliveries", "candidates"]].values.tolist() == [
        ["s2", "x > 1", N // 4, N]
    ]
    assert sel["selectivity"].iloc[0] == pytest.approx(0.25)
    summary = console_summary(analysed)
    assert f"deliveries={_expected_deliveries(0, N)} messages={N}" in summary


def test_churn_and_active_subscriptions_per_filter(analysed: Path) -> None:
    churn = results(analysed, "churn")
    got = {(r.window_start.timestamp(), r.action): r.changes for r in churn.itertuples()}
    assert got == {
        (T0, "subscribe"): 3,
        (T0 + 10, "partial_unsubscribe"): 1,
        (T0 + 10, "unsubscribe"): 1,
        (T0 + 20, "session_end"): 1,
    }
    active = results(analysed, "active_filters").sort_values("time")
    final = active.groupby(["topic_filter"])["delta"].sum().to_dict()
    assert final == {"t/#": 0, "t/+": 1}  # s0 ended its session, s1 unsubscribed; s2 remains
    peak = active[active["topic_filter"] == "t/#"]["delta"].cumsum().max()
    assert peak == 2


def test_restart_resumes_from_checkpoint_exactly_once(spark: Any, tmp_path: Path) -> None:
    """Two runs over a growing landing zone, and a re-run with nothing new: every record is
    counted exactly once."""
    only = ("top_topics", "fanout")
    _write_landing(tmp_path / "landing", 0, 300)
    _run(spark, tmp_path / "landing", tmp_path / "out", only)
    assert int(results(tmp_path / "out", "top_topics")["messages"].sum()) == 300
    _write_landing(tmp_path / "landing", 300, 700)
    _run(spark, tmp_path / "landing", tmp_path / "out", only)
    _run(spark, tmp_path / "landing", tmp_path / "out", only)  # nothing new: no double count
    top = results(tmp_path / "out", "top_topics")
    assert int(top["messages"].sum()) == 700
    assert int(top["deliveries"].sum()) == _expected_deliveries(0, 700)
    assert int(results(tmp_path / "out", "fanout")["messages"].sum()) == 700


def test_report_renders_every_section(analysed: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    html_path = tmp_path / "report.html"
    args = parser.parse_args(["analytics", "report", "--output", str(analysed), "--html", str(html_path)])
    assert args.func(args) == 0
    page = html_path.read_text(encoding="utf-8")
    assert f'id="total-deliveries">{_expected_deliveries(0, N)}<' in page
    assert f'id="total-messages">{N}<' in page
    for title in (
        "Message rate per topic",
        "Fan-out",
        "Subscription churn",
        "Active subscriptions",
        "Broker latency",
    ):
        assert f'<img alt="{title}' in page
    assert page.count("data:image/png;base64,") == 5
    assert "http://" not in page and "https://" not in page  # self-contained
    assert "x &gt; 1" in page  # the selectivity table, escaped
    assert '<h2>Composite subscriptions</h2><p class="empty">no composite data</p>' in page


def test_report_opens_in_headless_chromium(analysed: Path, tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("headless Chromium is not installed (make chromium installs it)")
    html_path = write_report(analysed, tmp_path / "report.html")
    profile = tmp_path / "profile"
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        f"--user-data-dir={profile}",
    ]
    dom = subprocess.run(
        [*cmd, "--dump-dom", html_path.as_uri()], capture_output=True, text=True, timeout=120, check=True
    )
    assert "siftmq analytics" in dom.stdout and dom.stdout.count("<img") == 5
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*cmd, f"--screenshot={shot}", "--window-size=1000,2400", html_path.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 10_000


def test_analytics_cli_options() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["analytics", "--once", "--master", "spark://h:7077", "--landing", "L", "--output", "O"]
    )
    assert args.once and args.master == "spark://h:7077" and args.landing == ["L"] and args.output == "O"
    assert args.func.__name__ == "_run_analytics"
    assert parser.parse_args(["analytics"]).master == "local[2]"
    assert parser.parse_args(["analytics", "--results", "top_topics,churn"]).results == "top_topics,churn"


def test_analytics_results_option_names_the_results(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker._cli",
            "analytics",
            "--once",
            "--results",
            "top_topics,nope",
            "--landing",
            str(tmp_path),
            "--output",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "option --results: nope (results: topic_rate, subscriber_rate" in done.stderr


def test_report_leaves_sys_topics_out_of_top_topics_unless_asked(spark: Any, tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    with Bridge(landing) as b:
        for i in range(6):
            feed(b, publication(i, T0 + i, topic="app/x", fanout=1))
            feed(b, delivery(i, T0 + i, topic="app/x", subscriber="s0", sf="app/#"))
        for i in range(6, 10):
            feed(b, publication(i, T0 + i, topic="$SYS/broker/uptime", fanout=0))
    _run(spark, landing, tmp_path / "out", ("top_topics", "topic_rate", "fanout"))
    plain = render_report(tmp_path / "out")
    assert "<td>app/x</td>" in plain and "$SYS/broker/uptime" not in plain
    assert 'id="total-messages">6<' in plain
    with_sys = render_report(tmp_path / "out", include_sys=True)
    assert "<td>$SYS/broker/uptime</td>" in with_sys


def test_analytics_without_java_says_so(tmp_path: Path) -> None:
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(tmp_path / "no-java-here")
    (tmp_path / "l").mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker._cli",
            "analytics",
            "--once",
            "--landing",
            str(tmp_path / "l"),
            "--output",
            str(tmp_path / "o"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "needs Java 17" in done.stderr
