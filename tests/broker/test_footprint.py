"""The light paths stay light (issue 42 item 1): what ``siftmq serve`` imports before it serves.

``siftmq serve`` runs in a subprocess under ``python -X importtime``, which prints one line per
module imported; the test waits for the broker's "listening on" line, stops it (SIGTERM) and
reads every module the process imported from start to exit. The heavy libraries must not be
among them unless their feature is used: numpy only with a content filter (the engine is made
at the first one), pyarrow / numpy / pandas only when the bridge writes its first table,
kademlia only with --cluster-listen,
the uplink's MQTT client (paho) only with [[bridges]], prometheus_client only with --metrics-listen, h11 only
with an HTTP listener, pyspark only for Spark commands, websockets only with a ws listener.
No timing: a regression test of the import graph (docs/performance.md "Footprint").

The light broker (``--no-bridge --no-persistence``) also leaves the standard library's heavy
modules for their first use (issue 42 item 1, :data:`LIGHT_DEFERRED`): OpenSSL (``ssl``,
``hashlib``: asyncio's own ``import ssl`` included, ``broker/_sslhook.py``), SQLite, the
entry-point machinery of ``importlib.metadata`` (email, zipfile, csv), TOML, the admin
client's ``http.client``, ``shutil``'s compressors. Those tests read ``sys.modules`` of the
serving process at its exit (``-X importtime`` also lists an import that was only attempted),
and check that TLS still works once ``ssl`` comes late, on both event loops.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as paho

import content
from broker.plugins import GROUP, entry_point_values
from tests.security.helpers import Certs, make_certs
from tests.serving import Serve

DEADLINE = 60.0  # generous: the suite's workers share the machine

HEAVY = ("pyarrow", "numpy", "pandas", "pyspark", "kademlia", "prometheus_client", "h11")
_SERVE = (sys.executable, "-X", "importtime", "-m", "broker._cli", "serve", "--port", "0")
_IMPORT = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)\s*$")


def _serve_imports(
    tmp_path: Path, *options: str, during: Callable[[int, int], None] | None = None
) -> tuple[set[str], str]:
    """Top-level packages imported by ``siftmq serve --port 0 <options>`` until it stopped, and
    its log.  ``during(port, pid)`` runs once it listens, before it is stopped."""
    proc = subprocess.Popen(
        [*_SERVE, "--data-dir", str(tmp_path / "data"), *options],
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert proc.stderr is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    try:
        while True:  # until the broker listens (or exits, or the deadline)
            line = lines.get(timeout=DEADLINE)
            if line is None:
                raise AssertionError("serve exited before listening:\n" + "".join(seen[-30:]))
            seen.append(line)
            if "listening on" in line:
                break
        if during is not None:
            m = re.search(r"listening on [\d.]+:(\d+)", "".join(seen))
            assert m is not None, seen[-5:]
            during(int(m.group(1)), proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE) == 0
        while (line := lines.get(timeout=DEADLINE)) is not None:
            seen.append(line)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    full = {m.group(1) for line in seen if (m := _IMPORT.match(line))}
    modules = {name.split(".")[0] for name in full} | {name for name in full if name.startswith("uplink.")}
    log = "".join(line for line in seen if not line.startswith("import time:"))
    assert "broker" in modules and "asyncio" in modules  # the hook did report the imports
    return modules, log


def test_light_serve_imports_no_heavy_library(tmp_path: Path) -> None:
    modules, _ = _serve_imports(tmp_path, "--no-bridge", "--no-persistence")
    assert not modules & {*HEAVY, "websockets"}, sorted(modules & {*HEAVY, "websockets"})
    # the uplink plugin is loaded (importlib.import_module: -X importtime does not list it,
    # test_light_serve_defers_the_heavy_standard_modules checks it), its bridges (an MQTT
    # client, 2.4 MB) only with [[bridges]]
    assert not modules & {"uplink._bridge", "uplink._hook", "paho"}, sorted(modules)


def test_default_serve_loads_the_bridge_libraries_only_to_write(tmp_path: Path) -> None:
    """With the bridge on (the spark extra is a dev dependency), nothing written: no pyarrow."""
    modules, log = _serve_imports(tmp_path)
    assert "bridge on" in log, log
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def _deliver_and_wait_for_the_landing(tmp_path: Path) -> Callable[[int, int], None]:
    """A subscriber and a publisher (paho), one QoS 1 message, then wait until the bridge's
    deliveries file is committed."""

    def run(port: int, pid: int) -> None:
        got = threading.Event()
        sub = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="fp-sub")
        sub.on_message = lambda *_: got.set()
        sub.connect("127.0.0.1", port)
        sub.loop_start()
        try:
            sub.subscribe("fp/t", qos=1)[0]
            pub = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="fp-pub")
            pub.connect("127.0.0.1", port)
            pub.loop_start()
            deadline = time.monotonic() + DEADLINE
            try:
                while not got.is_set():  # until the subscription is in place and delivered to
                    assert time.monotonic() < deadline, "no delivery"
                    pub.publish("fp/t", b"x", qos=1).wait_for_publish(DEADLINE)
                    got.wait(0.2)
            finally:
                pub.loop_stop()
                pub.disconnect()
        finally:
            sub.loop_stop()
            sub.disconnect()
        deliveries = tmp_path / "data" / "landing" / "deliveries"
        while not list(deliveries.glob("*.parquet")):  # the bridge's first commit
            assert time.monotonic() < deadline, "the bridge wrote nothing"
            time.sleep(0.05)

    return run


def test_default_serve_keeps_the_bridge_libraries_out_of_the_broker_after_writing(tmp_path: Path) -> None:
    """The defaults write through the bridge's writer process (bridge/_writerproc.py): after its
    first file, the broker's own process has still imported no numpy, pyarrow or pandas."""
    modules, log = _serve_imports(tmp_path, during=_deliver_and_wait_for_the_landing(tmp_path))
    assert "writer process" in log, log
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def test_thread_writer_loads_the_bridge_libraries_in_the_broker(tmp_path: Path) -> None:
    """The control: ``--bridge-writer thread`` loads them in the broker at the first write
    (the test above would see them if the writer process did not keep them out)."""
    modules, _ = _serve_imports(
        tmp_path, "--bridge-writer", "thread", during=_deliver_and_wait_for_the_landing(tmp_path)
    )
    assert {"numpy", "pyarrow"} <= modules


def test_content_engines_are_imported_at_first_use() -> None:
    """``import content`` lists every engine without importing one (numpy); a lookup imports
    it and gives the class of that name, as the dict ENGINES was."""
    code = (
        "import sys, content\n"
        "assert 'numpy' not in sys.modules, 'numpy imported with content'\n"
        "assert 'content._hema' not in sys.modules\n"
        "names = list(content.ENGINES)\n"
        "assert len(content.ENGINES) == len(names) == 11 and 'hema' in content.ENGINES\n"
        "assert 'nope' not in content.ENGINES\n"
        "assert content.ENGINES['hema'] is content.HEMA and 'content._hema' in sys.modules\n"
        "print(' '.join(names))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [
        "brute-force",
        "counting",
        "iccounting",
        "rabased",
        "hema",
        "rein",
        "hcem",
        "betree",
        "poset",
        "tama",
        "htree",
    ]
    assert all(content.ENGINES[name].name == name for name in content.ENGINES)
    assert dict(content.ENGINES)["tama"] is content.TAMA


#: standard-library and own modules the light broker defers to their first use (issue 42 item 1)
LIGHT_DEFERRED = frozenset(
    {
        "ssl",
        "_ssl",
        "hashlib",
        "_hashlib",
        "hmac",
        "secrets",
        "sqlite3",
        "_sqlite3",
        "importlib.metadata",
        "email",
        "zipfile",
        "csv",
        "tempfile",
        "tomllib",
        "difflib",
        "http.client",
        "shutil",
        "bz2",
        "lzma",
        "getpass",
        "unicodedata",
        "encodings.idna",
        "broker.auth",
        "broker._passwd",
        "cluster._auth",
        "bridge._jar",
        # the other commands' modules: `siftmq serve` builds the serve command's parser alone
        "broker._client_cli",
        "broker._ctl_cli",
        "broker._backup_cli",
        "broker._passwd_cli",
        "bridge._cli",
        # the composite engine: made at the first composite subscription
        "composite",
        "broker._composite_saver",
        # orjson (with json, uuid, platform, datetime it imports): at the first JSON payload
        # a selector reads, the JSON log format, a bans file, a store's record with properties
        "orjson",
        "datetime",
        "uuid",
        # the HTTP / JWT authentication: with an auth_* key of [serve]
        "broker.authn",
        "broker._acl",
        # shared subscriptions' random and hashed strategies: at their first pick
        "random",
        "zlib",
        # the uplink's [[bridges]] schema: with --config
        "uplink._config",
        # session 18: the composite subscriptions' broker side, made at the first one
        # (Core.composite), and the store's modules, imported with a store
        *("broker.core._composite", "broker.core._composite_log", "broker.core._atom_ids"),
        *("broker.durability._records", "broker.durability._store", "broker.durability._schema"),
        # the loop's executor (a thread): only to read a bans file that exists
        "concurrent.futures.thread",
    }
)

#: python -c: ``siftmq`` whose ``sys.modules`` at exit goes to the file named by $SIFTMQ_MODULES
#: (one name a line; then whether asyncio's sslproto holds the ssl module that was imported)
_DUMP = (
    "import atexit, os, sys\n"
    "def dump():\n"
    "    proto = sys.modules.get('asyncio.sslproto')\n"
    "    linked = proto is not None and getattr(proto, 'ssl', None) is sys.modules.get('ssl')\n"
    "    with open(os.environ['SIFTMQ_MODULES'], 'w') as f:\n"
    "        f.write('\\n'.join([*sys.modules, f'ssl-linked={linked}']))\n"
    "atexit.register(dump)\n"
    "from broker._cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _served_modules(tmp_path: Path, *flags: str, during: Callable[[Serve], None] | None = None) -> set[str]:
    """Every module ``siftmq serve --port 0 FLAGS`` imported from start to its exit (SIGTERM
    once it listens, after ``during``), and ``ssl-linked=...``."""
    out = tmp_path / "modules.txt"
    command = (sys.executable, "-c", _DUMP)
    with Serve(*flags, env={"SIFTMQ_MODULES": str(out)}, command=command, cwd=tmp_path) as s:
        s.port("tcp", DEADLINE)
        if during is not None:
            during(s)
        assert s.stop(DEADLINE) == 0, s.lines[-20:]
    return set(out.read_text().split("\n"))


def test_light_serve_defers_the_heavy_standard_modules(tmp_path: Path) -> None:
    """On asyncio's loop (uvloop imports ssl itself) the light broker serves without OpenSSL,
    SQLite, importlib.metadata, ... (on main: ssl through asyncio, sqlite3, hashlib, email, ...)."""
    modules = _served_modules(tmp_path, "--no-bridge", "--no-persistence", "--no-uvloop")
    assert "asyncio" in modules and "broker._broker" in modules  # the dump is the serving process's
    assert not modules & LIGHT_DEFERRED, sorted(modules & LIGHT_DEFERRED)
    # the plugins are loaded (their serve options), not what they use only when configured
    assert {"uplink._plugin", "cluster._plugin", "bridge._plugin"} <= modules
    assert not modules & {"uplink._bridge", "uplink._hook", "paho", "kademlia"}, sorted(modules)
    assert "email" not in {m.split(".")[0] for m in modules}


#: what a light broker makes only at its first composite subscription (``Core.composite``) or
#: with a store (session 18: ~0.5 MB of its idle 25 MB with the store's records)
MADE_LATE = frozenset(
    {
        "broker.core._composite",
        "broker.core._composite_log",
        "broker.core._atom_ids",
        "composite",
        "broker.durability._records",
        "broker.durability._store",
        "broker.durability._schema",
    }
)


def test_light_serve_makes_composites_and_store_modules_late(tmp_path: Path) -> None:
    """A light broker that served a subscriber (QoS 1 round trip) imported none of
    :data:`MADE_LATE`; one whose client then makes a composite subscription (the first on a
    broker started without any) gets its event, and only then has the composite modules (on
    main the core built its composite subscriptions and imported the store's records at
    start)."""
    (tmp_path / "plain").mkdir()
    plain = _served_modules(tmp_path / "plain", "--no-bridge", "--no-persistence", during=_round_trip)
    assert "broker._broker" in plain
    assert not plain & MADE_LATE, sorted(plain & MADE_LATE)
    (tmp_path / "composite").mkdir()
    late = _served_modules(
        tmp_path / "composite", "--no-bridge", "--no-persistence", during=_composite_round_trip
    )
    assert {"broker.core._composite", "composite"} <= late
    assert not late & {"broker.durability._records", "broker.durability._store"}, sorted(late)


def _composite_round_trip(s: Serve) -> None:
    """A paho client subscribes ``$composite/pair/fp/a & fp/b`` (QoS 1) on a broker that has
    no composite subscription, publishes ``fp/a`` and ``fp/b``, and gets the event."""
    got: queue.Queue[paho.MQTTMessage] = queue.Queue()
    subscribed = threading.Event()
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="fp-composite")
    c.on_message = lambda _c, _u, m: got.put(m)
    c.on_subscribe = lambda _c, _u, _m, codes, _p: subscribed.set()
    c.connect("127.0.0.1", s.port("tcp", DEADLINE))
    c.loop_start()
    try:
        c.subscribe("$composite/pair/fp/a & fp/b", qos=1)
        assert subscribed.wait(DEADLINE)
        c.publish("fp/a", b"1", qos=1).wait_for_publish(DEADLINE)
        c.publish("fp/b", b"2", qos=1).wait_for_publish(DEADLINE)
        m = got.get(timeout=DEADLINE)
        assert m.topic == "$composite/pair"
        doc = json.loads(m.payload)
        assert doc["expression"] == "fp/a & fp/b"
        assert sorted(p["topic"] for p in doc["components"]) == ["fp/a", "fp/b"]
    finally:
        c.disconnect()
        c.loop_stop()


def test_composite_sys_values_before_the_first_composite_subscription() -> None:
    """``$SYS/broker/composite/...`` of a core that never made its composite subscriptions
    are the counters of new ones: the same topics, zero (``NO_COMPOSITES_SYS``)."""
    from broker._config import BrokerConfig
    from broker.core import Core

    core = Core(BrokerConfig(sys_interval=0))
    before = {k: v for k, v in core.sys_values(0.0).items() if "/composite/" in k}
    assert core.composite_if_made is None  # reading $SYS made nothing
    made = core.composite
    assert core.composite_if_made is made and core.composite is made
    assert before == made.sys_values() == dict.fromkeys(made.sys_values(), "0")
    assert len(before) == 6


def _tls_round_trip(certs: Certs) -> Callable[[Serve], None]:
    """A paho client over the TLS listener: CONNECT, SUBSCRIBE, PUBLISH QoS 1, the message back."""
    return lambda s: _paho_round_trip(s, "tcp+tls", certs)


def _tls_flags(tmp_path: Path) -> tuple[tuple[str, ...], Certs]:
    """A CA and certificates in ``tmp_path``/certs, and the flags of a TLS listener with them."""
    (tmp_path / "certs").mkdir()
    certs = make_certs(tmp_path / "certs")
    return (
        "--tls-port",
        "0",
        "--tls-cert",
        str(certs.server_cert),
        "--tls-key",
        str(certs.server_key),
    ), certs


def test_tls_listener_loads_ssl_late_on_asyncio_loop(tmp_path: Path) -> None:
    """``ssl`` imported after asyncio (the TLS listener's context) is handed to asyncio's
    modules: a TLS client's round trip works on asyncio's loop, whose TLS is sslproto's."""
    tls, certs = _tls_flags(tmp_path)
    flags = ("--no-bridge", "--no-persistence", "--no-uvloop", *tls)
    modules = _served_modules(tmp_path, *flags, during=_tls_round_trip(certs))
    assert {"ssl", "_ssl"} <= modules
    assert "ssl-linked=True" in modules


def test_tls_listener_on_uvloop(tmp_path: Path) -> None:
    """A light broker with a TLS listener keeps uvloop by default (it loads OpenSSL anyway,
    and uvloop's TLS is faster): uvloop imports ssl (through the hook) before the broker
    starts, TLS works the same."""
    tls, certs = _tls_flags(tmp_path)
    modules = _served_modules(
        tmp_path, "--no-bridge", "--no-persistence", *tls, during=_tls_round_trip(certs)
    )
    assert {"ssl", "uvloop"} <= modules
    assert "ssl-linked=True" in modules


def _round_trip(s: Serve) -> None:
    """A paho client on the plain-TCP listener: SUBSCRIBE, PUBLISH QoS 1, the message back."""
    _paho_round_trip(s, "tcp", None)


def _paho_round_trip(s: Serve, listener: str, certs: Certs | None) -> None:
    """A paho client on ``listener`` (with ``certs``' client context over TLS): CONNECT,
    SUBSCRIBE, PUBLISH QoS 1, the message back."""
    got: queue.Queue[bytes] = queue.Queue()
    payload = f"over {listener}".encode()
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"fp-{listener}")
    if certs is not None:
        c.tls_set_context(certs.client_context())
    c.on_message = lambda _c, _u, m: got.put(m.payload)
    c.on_subscribe = lambda _c, _u, _m, _rc, _p: c.publish("fp/loop", payload, qos=1)
    c.connect("127.0.0.1", s.port(listener, DEADLINE))
    c.loop_start()
    try:
        c.subscribe("fp/loop", qos=1)
        assert got.get(timeout=DEADLINE) == payload
    finally:
        c.disconnect()
        c.loop_stop()


def test_light_serve_runs_on_asyncio_loop_by_default(tmp_path: Path) -> None:
    """The light broker (no store, no plugin's hooks) serves on asyncio's own loop unless
    ``--uvloop``: uvloop's import brings OpenSSL (~6.5 MB of the 25 MB target). With a store
    the default stays uvloop, and ``--no-uvloop`` still turns it off there (on main the light
    broker ran on uvloop and there was no ``--uvloop``)."""

    def served(name: str, *flags: str) -> set[str]:
        (tmp_path / name).mkdir()
        return _served_modules(tmp_path / name, *flags, during=_round_trip)

    light = served("light", "--no-bridge", "--no-persistence")
    assert "broker._broker" in light and "uvloop" not in light and "ssl" not in light
    forced = served("forced", "--no-bridge", "--no-persistence", "--uvloop")
    assert {"uvloop", "ssl"} <= forced
    stored = served("stored", "--no-bridge")
    assert "uvloop" in stored and "sqlite3" in stored
    off = served("off", "--no-bridge", "--no-uvloop")
    assert "uvloop" not in off and "sqlite3" in off


def test_ssl_hook_links_asyncio_at_the_first_import() -> None:
    """broker._sslhook alone: asyncio imported without ssl, then ``import ssl`` by anyone gives
    asyncio's modules the module (and sslproto's SSLAgainErrors), also after a ``find_spec``
    that loaded nothing; the finder is gone after."""
    code = (
        "import sys\n"
        "from broker._sslhook import import_asyncio_without_ssl\n"
        "import_asyncio_without_ssl()\n"
        "import asyncio, asyncio.sslproto as sp, asyncio.base_events as be, asyncio.selector_events as se\n"
        "assert 'ssl' not in sys.modules and sp.ssl is None and be.ssl is None\n"
        "assert not hasattr(sp, 'SSLAgainErrors')\n"
        "import importlib.util\n"
        "assert importlib.util.find_spec('ssl') is not None and 'ssl' not in sys.modules\n"
        "import ssl\n"
        "assert sp.ssl is ssl and be.ssl is ssl and se.ssl is ssl\n"
        "assert sp.SSLAgainErrors == (ssl.SSLWantReadError, ssl.SSLSyscallError)\n"
        "assert not any(type(f).__name__ == '_SslFinder' for f in sys.meta_path)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr


def test_plugin_entry_points_match_importlib_metadata() -> None:
    """The entry-point scan of broker.plugins gives what importlib.metadata gives, in order,
    for siftmq's group and for groups with many entries (console_scripts, pytest11)."""
    from importlib.metadata import entry_points

    for group in (GROUP, "console_scripts", "pytest11"):
        expected = [(ep.name, ep.value) for ep in entry_points(group=group)]
        assert entry_point_values(group) == expected, group
    assert {name for name, _ in entry_point_values(GROUP)} >= {"bridge", "cluster", "uplink"}


def test_cluster_and_bridge_names_load_at_first_use() -> None:
    """``siftmq serve`` imports ``cluster`` and ``bridge`` for their plugins without their
    hashlib / zipfile modules; their public names still load on use, also after the package's
    submodules were imported (a submodule becomes a package attribute)."""
    code = (
        "import sys, cluster, bridge\n"
        "assert 'cluster._auth' not in sys.modules and 'bridge._jar' not in sys.modules\n"
        "import cluster._overlay, cluster._node, bridge._jar\n"
        "from cluster import ClusterNode, RouteChange, RouteTable, TokenChecker, load_node_id, make_token\n"
        "from bridge import spark_jar, with_spark_jar\n"
        "assert make_token is sys.modules['cluster._auth'].make_token\n"
        "assert spark_jar is bridge._jar.spark_jar\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr


def test_plugin_entry_points_inside_a_zip_on_sys_path(tmp_path: Path) -> None:
    """A distribution in a zip file on ``sys.path`` (importlib.metadata reads inside zips; the
    scan does not): the scan asks importlib.metadata, and the zip's plugin is found."""
    import zipfile

    archive = tmp_path / "plugins.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zipped_plugin-1.0.dist-info/METADATA", "Name: zipped-plugin\nVersion: 1.0\n")
        z.writestr("zipped_plugin-1.0.dist-info/entry_points.txt", f"[{GROUP}]\nzipped = zmod:PLUGIN\n")
    code = (
        "import sys\n"
        "from broker.plugins import GROUP, entry_point_values\n"
        "print(dict(entry_point_values(GROUP))['zipped'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(archive)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env)
    assert out.returncode == 0 and out.stdout == "zmod:PLUGIN\n", out.stderr


def test_serve_parses_its_own_command_alone(tmp_path: Path) -> None:
    """``siftmq serve`` builds the serve command's parser alone (the other commands' modules
    stay unimported, :data:`LIGHT_DEFERRED`); its help, a top-level flag before the command
    and its usage errors are what they were, and the full parser still lists every command."""
    run = [sys.executable, "-m", "broker._cli"]
    done = subprocess.run(
        [*run, "serve", "--help"], capture_output=True, text=True, check=False, cwd=tmp_path
    )
    assert done.returncode == 0 and "--no-uvloop" in done.stdout and "--tls-port" in done.stdout, done.stderr
    bad = subprocess.run(
        [*run, "--debug", "serve", "--port", "x"], capture_output=True, text=True, check=False, cwd=tmp_path
    )
    last = bad.stderr.strip().splitlines()[-1]
    assert bad.returncode == 2 and last == "siftmq serve: --port x: expected an integer 0..65535", bad.stderr
    assert "Traceback" in bad.stderr  # --debug before the command is still honoured
    full = subprocess.run([*run, "--help"], capture_output=True, text=True, check=False, cwd=tmp_path)
    assert full.returncode == 0
    commands = ("serve", "pub", "sub", "passwd", "backup", "ctl", "analytics")
    assert all(name in full.stdout for name in commands)


def test_vbi_table_is_filled_at_first_use() -> None:
    """The variable byte integers below 16384 come from a table filled at each length's first
    use (built whole at import it was 16,256 two-byte objects, ~0.7 MB of every broker): a
    fresh broker's table is nearly empty, and every entry is the encoding (MQTT 5 1.5.5)."""
    code = (
        "import broker, broker.protocol._wire as w\n"
        "print(sum(b is not None for b in w.VBI_TABLE))\n"
        "assert all(w.vbi(n) == w.vbi_slow(n) for n in range(16384))\n"
        "assert all(w.VBI_TABLE[n] == w.vbi_slow(n) for n in range(16384))\n"
        "assert w.vbi(127) == b'\\x7f' and w.vbi(128) == b'\\x80\\x01' and w.vbi(16383) == b'\\xff\\x7f'\n"
        "assert w.vbi(16384) == b'\\x80\\x80\\x01' and w.vbi(268_435_455) == b'\\xff\\xff\\xff\\x7f'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) < 64  # before: 16,384 (a tuple built at import)


def test_shared_random_strategy_draws_as_random_random() -> None:
    """The random strategy's generator is made at its first pick (``random`` imported then):
    a seeded policy still picks exactly ``int(random.Random(seed).random() * n)`` in turn."""
    import random

    from broker.core._shared import Members, SharedPolicy, Strategy
    from broker.values import SubOptions

    opts = SubOptions(1, False, False, 0, None, None, "jobs/#")
    for seed, n in ((7, 3), (0, 1), (2**32, 6)):
        group = Members.of([(str(i), opts) for i in range(n)])
        policy = SharedPolicy(Strategy.RANDOM, seed=seed)
        reference = random.Random(seed)
        assert [policy.pick(("g", "jobs/#"), group, None, "t") for _ in range(50)] == [
            int(reference.random() * n) for _ in range(50)
        ]
