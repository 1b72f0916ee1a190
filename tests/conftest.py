"""Suite-wide settings.  Hypothesis: no per-example deadline (machines are noisy; timing is
measured by benchmarks, never by tests); CI derandomizes so a run is reproducible.

The JVMs the suite starts (local Spark, a standalone master, worker and executor) run with
the client compiler only and the serial collector: over the suite's tiny inputs they spend
most of their CPU in C2 compiler and GC threads, and on 2 cores with xdist those threads
take the other worker's core (the standalone test went from 92 to 60 s, a Spark module from
68 to 55 s). They also skip the verification of the byte code of the class path's classes
(Spark's jars, from the pyspark wheel; the JDK's own classes are never verified): a local
Spark session's start and first queries took 6.9-7.1 s of JVM CPU instead of 8.0-8.2 s
(docs/development.md, "Suite time"). Only the suite does this; `siftmq analytics` keeps the
JVM's defaults.

Scheduling (xdist, ``--dist loadfile`` in the Makefile): each test file is one unit of work,
except that the files using the session-scoped ``spark`` fixture are one unit together: one
worker starts one Spark session instead of each worker starting its own; the longest units
(``LONGEST_UNITS``) are handed out first."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci" if os.environ.get("CI") else "default")

os.environ.setdefault(
    "JAVA_TOOL_OPTIONS",
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote",
)


# the files whose tests use the session-scoped ``spark`` fixture (tests/bridge/conftest.py);
# pytest_collection_modifyitems refuses a run where this list is out of date
SPARK_SESSION_FILES = frozenset(
    {
        "tests/bridge/test_bridge_composite.py",
        "tests/bridge/test_bridge_datasource.py",
        "tests/bridge/test_bridge_end_to_end.py",
        "tests/bridge/test_bridge_loop.py",
        "tests/bridge/test_bridge_spark.py",
        "tests/bridge/test_docs_spark.py",
    }
)


#: the units of work that take longest (wall time, mostly waiting for JVMs and for cluster
#: failure detection), longest first.  xdist hands out units in order of their number of
#: tests, which put the one-test standalone-Spark file (about a minute) last, after every
#: other unit had finished: the run then waited for it on one worker while the other idled.
#: Sending these first lets the short units fill in around them.  A stale entry costs time,
#: never correctness.  The list: every unit above ~6 s in a run of the whole suite on four
#: workers at a load of ~5 (about 3 s on a quiet machine; session 19, docs/development.md,
#: "Suite time"), longest first, except that the two Spark units lead: each starts JVMs whose
#: start-up overlaps best with the other workers' short units.  What is left are the units
#: with few tests, which xdist sends last, and among them one-scenario cluster and fault
#: files that wait seconds on failure detection: a run of session 19 ended with
#: ``tests/cluster/test_composite_replicas.py`` and ``test_composite_restart.py`` (17 s) on
#: one worker after the three others had run out of work (the list of session 16 missed them).
LONGEST_UNITS = (
    "tests/bridge/test_bridge_standalone.py",
    "spark-session",
    "tests/cli/test_pubsub_mosquitto.py",
    "tests/cluster/test_cluster_handover.py",
    "tests/content/test_ic_index.py",
    "tests/content/test_poset.py",
    "tests/bridge/test_bridge_worker_python.py",
    "tests/content/test_engines_model.py",
    "tests/cluster/test_cluster_processes.py",
    "tests/benchmarks/test_content_fleet.py",
    "tests/cluster/test_partitions.py",
    "tests/content/test_hema.py",
    "tests/content/test_betree.py",
    "tests/cluster/test_live_cluster.py",
    "tests/packaging/test_wheel.py",
    "tests/broker/test_broker_gc_freeze.py",
    "tests/bridge/test_bridge_writer_process.py",
    "tests/auth/test_auth_offloop.py",
    "tests/admin/test_ctl.py",
    "tests/broker/test_footprint.py",
    "tests/fault/test_composite_kill.py",
    "tests/bridge/test_bridge_model.py",
    "tests/interop/test_interop_matrix.py",
    "tests/topics/test_topics_index_model.py",
    "tests/nemesis/test_nemesis.py",
    "tests/broker/test_codec.py",
    "tests/store/test_store_model.py",
    "tests/test_docs_examples.py",
    "tests/test_layers.py",
    "tests/broker/test_quotas.py",
    "tests/broker/test_client_cli.py",
    "tests/bridge/test_writer_grouped_commits.py",
    "tests/broker/test_composite_broker_model.py",
    "tests/auth/test_authn_http.py",
    "tests/admin/test_admin_api.py",
    "tests/security/test_cli_auth.py",
    "tests/cluster/test_composite_restart.py",
    "tests/content/test_baselines004.py",
    "tests/cluster/test_composite_replicas.py",
    "tests/cli/test_pubsub_bad_input.py",
    "tests/composite/test_syntax.py",
    "tests/fault/test_restart_storm.py",
    "tests/uplink/test_uplink_mosquitto.py",
    "tests/cluster/test_cluster_sessions.py",
    "tests/content/test_fleet_mix.py",
    "tests/bridge/test_writer_transport.py",
    "tests/broker/test_http_listener.py",
)


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True)  # a hook of xdist: unknown to a run without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``loadfile``, except that the Spark-session files are one unit of work."""
    from xdist.scheduler import LoadFileScheduling

    class _Scheduling(LoadFileScheduling):
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            file = _file(nodeid)
            return "spark-session" if file in SPARK_SESSION_FILES else file

        def _assign_work_unit(self, node: object) -> None:
            if not self._ordered:  # the first assignment: the longest units go out first
                self._ordered = True
                for unit in reversed(LONGEST_UNITS):
                    if unit in self.workqueue:
                        self.workqueue.move_to_end(unit, last=False)
            super()._assign_work_unit(node)

    return _Scheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    stale = {
        _file(item.nodeid) for item in items if "spark" in getattr(item, "fixturenames", ())
    } - SPARK_SESSION_FILES
    if stale:
        raise pytest.UsageError(f"tests/conftest.py: add {sorted(stale)} to SPARK_SESSION_FILES")


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to test stale compiled modules: a mypyc extension shadows its edited source.
    A collection alone (``--collect-only``: the Makefile's ``$(TESTPYC)``, which writes the
    suite's byte code beside the mypyc build) runs no test, so it is not refused."""
    if config.option.collectonly:
        return
    from broker._build import stale_modules

    stale = stale_modules()
    if stale:
        pytest.exit(f"compiled modules older than their source: {', '.join(stale)}; run `make build`", 2)
