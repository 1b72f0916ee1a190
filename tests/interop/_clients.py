"""The clients of the interoperability matrix, each behind one interface: run a :class:`Job`.

A job is what one client does on one connection: connect (clean or not, with a will or not),
subscribe (optional: a filter, a QoS, a v5 ``filter`` user property), be *ready* (SUBACK
received), publish, wait for ``expect`` messages, then DISCONNECT or drop the connection
without one (``abort``, so that the broker publishes the will). :meth:`Client.start` starts a
job and returns a :class:`Running`: ``ready`` then ``result()`` (the messages received).

MQTT.js runs in one node process per test module (a job a line on its stdin); the command-line
clients (mosquitto_pub/sub, paho_c_pub/sub) are started per job;
a command-line client that cannot say when it is subscribed is *ready* when the broker holds
its subscription (``Env.subscribed``, a condition on the broker's state polled with a
deadline). The Python clients (paho-mqtt, aiomqtt, gmqtt) run in the test's process.

``Client.why_not(feature, version)`` is None when the client supports the feature, else the
reason, which the test reports as its skip and docs/broker.md's table repeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.waiting import eventually

HERE = Path(__file__).parent
TIMEOUT = 15.0


@dataclass(frozen=True, slots=True)
class Env:
    """Where the broker listens and how to see its state."""

    host: str
    tcp: int
    tls: int
    ws: int
    ca: Path
    subscribed: Callable[[str], bool]  # the client id holds a subscription
    connected: Callable[[str], bool]  # the client id has a live connection


@dataclass(frozen=True, slots=True)
class Job:
    endpoint: str  # "tcp" | "tls" | "ws"
    version: int  # 4 (3.1.1) | 5
    client_id: str
    clean: bool = True
    expiry: int = 0  # v5 session expiry (a persistent session)
    will: tuple[str, str] | None = None
    subscribe: tuple[str, int] | None = None
    selector: str | None = None  # v5 SUBSCRIBE user property "filter"
    expect: int = 0
    publish: tuple[tuple[str, str, int, bool], ...] = ()
    abort: bool = False


@dataclass(frozen=True, slots=True)
class Got:
    """A message as the client reports it (None: the client does not say)."""

    topic: str | None
    payload: str
    qos: int | None
    retain: bool | None


@dataclass
class Running:
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[list[Got]] | None = None

    async def wait_ready(self) -> None:
        """Ready, or the job's own failure (raised) if it ended first."""
        assert self.task is not None
        waiter = asyncio.ensure_future(self.ready.wait())
        await asyncio.wait({waiter, self.task}, timeout=TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():
            waiter.cancel()
            if self.task.done():
                self.task.result()  # the job's exception, if any
            raise AssertionError("the client never became ready")

    async def result(self) -> list[Got]:
        assert self.task is not None
        return await asyncio.wait_for(self.task, TIMEOUT * 2)


class Client:
    name = ""
    versions: tuple[int, ...] = (4, 5)

    def available(self) -> str | None:
        """None when the client is installed, else what is missing."""
        return None

    def why_not(self, feature: str, version: int) -> str | None:
        return None

    async def stop(self) -> None:
        """Release what the client keeps between jobs (before the event loop closes)."""

    def start(self, job: Job, env: Env) -> Running:
        run = Running()
        run.task = asyncio.ensure_future(self.run(job, env, run.ready))
        return run

    async def run(self, job: Job, env: Env, ready: asyncio.Event) -> list[Got]:
        raise NotImplementedError


# ---------------------------------------------------------------- MQTT.js (node)
class MqttJs(Client):
    name = "MQTT.js"

    def available(self) -> str | None:
        if shutil.which("node") is None:
            return "node not installed"
        if not (HERE / "node_modules" / "mqtt").is_dir():
            return "MQTT.js not installed (make interop-clients: npm ci in tests/interop)"
        return None

    async def run(self, job: Job, env: Env, ready: asyncio.Event) -> list[Got]:
        scheme, port = {"tcp": ("mqtt", env.tcp), "tls": ("mqtts", env.tls), "ws": ("ws", env.ws)}[
            job.endpoint
        ]
        spec = {
            "url": f"{scheme}://{env.host}:{port}" + ("/mqtt" if job.endpoint == "ws" else ""),
            "version": job.version,
            "client_id": job.client_id,
            "clean": job.clean,
            "expiry": job.expiry,
            "will": job.will,
            "subscribe": job.subscribe,
            "selector": job.selector,
            "expect": job.expect,
            "publish": job.publish,
            "abort": job.abort,
            "ca": str(env.ca) if job.endpoint == "tls" else None,
            "timeout": TIMEOUT,
        }
        proc = await self._node()
        assert proc.stdin is not None
        self._ids += 1
        spec["id"] = n = self._ids
        events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._jobs[n] = events
        proc.stdin.write(json.dumps(spec).encode() + b"\n")
        got: list[Got] = []
        try:
            while (event := await asyncio.wait_for(events.get(), TIMEOUT * 2))["event"] != "done":
                if event["event"] == "ready":
                    ready.set()
                elif event["event"] == "message":
                    got.append(Got(event["topic"], event["payload"], event["qos"], event["retain"]))
                else:
                    raise AssertionError(event)
        finally:
            del self._jobs[n]
        return got

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._jobs: dict[int, asyncio.Queue[dict[str, Any]]] = {}
        self._ids = 0

    async def _node(self) -> asyncio.subprocess.Process:
        """The node process of this event loop (started once: node and MQTT.js take about a
        second to start on a loaded machine, a job a few milliseconds)."""
        if self._proc is None:
            self._proc = await asyncio.create_subprocess_exec(
                "node",
                str(HERE / "mqttjs_job.mjs"),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            self._reader = asyncio.ensure_future(self._read(self._proc))
        return self._proc

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            event = json.loads(line)
            if (events := self._jobs.get(event.pop("id"))) is not None:
                events.put_nowait(event)
        for events in self._jobs.values():  # node ended: the jobs waiting fail now
            events.put_nowait({"event": "error", "message": "node exited"})

    async def stop(self) -> None:
        """End the node process (its stdin closed) before the event loop closes."""
        proc, self._proc = self._proc, None
        if proc is not None:
            assert proc.stdin is not None
            proc.stdin.close()
            await asyncio.wait_for(proc.wait(), TIMEOUT)
            if self._reader is not None:
                await self._reader


# ---------------------------------------------------------------- command-line clients
async def _subscriber_process(
    args: list[str], job: Job, env: Env, ready: asyncio.Event
) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    cond = env.subscribed if job.subscribe else env.connected
    try:
        await eventually(lambda: cond(job.client_id) or proc.returncode is not None, TIMEOUT)  # subscribed
    except TimeoutError:
        proc.kill()
        raise
    return proc


async def _run_publisher(args: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode == 0, (args, out.decode(errors="replace"))


class Mosquitto(Client):
    """mosquitto_pub / mosquitto_sub (libmosquitto, Debian's mosquitto-clients)."""

    name = "mosquitto_pub/sub"

    def available(self) -> str | None:
        if shutil.which("mosquitto_sub") is None:
            return "mosquitto-clients not installed (make interop-clients)"
        return None

    def why_not(self, feature: str, version: int) -> str | None:
        if feature == "websocket":
            return "mosquitto's clients have no WebSocket transport"
        return None

    def _common(self, job: Job, env: Env, cid: str) -> list[str]:
        args = ["-h", env.host, "-i", cid, "-V", "mqttv5" if job.version == 5 else "mqttv311"]
        if job.endpoint == "tls":
            args += ["-p", str(env.tls), "--cafile", str(env.ca)]
        else:
            args += ["-p", str(env.tcp)]
        return args

    async def run(self, job: Job, env: Env, ready: asyncio.Event) -> list[Got]:
        proc = None
        if job.subscribe or job.will or job.expect:
            args = ["mosquitto_sub", *self._common(job, env, job.client_id), "-F", "%t\t%q\t%r\t%p"]
            topic, qos = job.subscribe or ("$interop/none", 0)
            args += ["-t", topic, "-q", str(qos)]
            if not job.clean:
                args += ["-c"] + (["-x", str(job.expiry)] if job.version == 5 else [])
            if job.will:
                args += ["--will-topic", job.will[0], "--will-payload", job.will[1], "--will-qos", "1"]
            if job.selector:
                args += ["-D", "subscribe", "user-property", "filter", job.selector]
            if job.expect:
                args += ["-C", str(job.expect)]
            elif not job.abort:
                args += ["-E"]  # exit once subscribed (a persistent session's first part)
            proc = await _subscriber_process(args, job, env, ready)
        ready.set()
        for n, (topic, payload, qos, retain) in enumerate(job.publish):
            args = ["mosquitto_pub", *self._common(job, env, f"{job.client_id}-p{n}")]
            await _run_publisher(
                [*args, "-t", topic, "-m", payload, "-q", str(qos), *(["-r"] if retain else [])]
            )
        got: list[Got] = []
        if proc is not None:
            if job.abort:
                proc.send_signal(signal.SIGKILL)
            out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
            assert job.abort or proc.returncode == 0, err.decode(errors="replace")
            for line in out.decode().splitlines():
                topic, qos_text, retain_text, payload = line.split("\t", 3)
                got.append(Got(topic, payload, int(qos_text), retain_text == "1"))
        return got


class PahoC(Client):
    """paho_c_pub / paho_c_sub (Eclipse Paho C, Debian's paho.mqtt.c-examples)."""

    name = "Paho C (paho_c_pub/sub)"

    def available(self) -> str | None:
        if shutil.which("paho_c_sub") is None:
            return "paho.mqtt.c-examples not installed (make interop-clients)"
        return None

    def why_not(self, feature: str, version: int) -> str | None:
        if feature == "session":
            return "paho_c_sub always connects with a clean session"
        if feature == "filter" and version == 5:
            return "paho_c_sub sets no SUBSCRIBE user properties"
        return None

    def _common(self, job: Job, env: Env, cid: str) -> list[str]:
        url = {
            "tcp": f"tcp://{env.host}:{env.tcp}",
            "tls": f"ssl://{env.host}:{env.tls}",
            "ws": f"ws://{env.host}:{env.ws}/mqtt",
        }[job.endpoint]
        args = ["-c", url, "-i", cid, "-V", "5" if job.version == 5 else "311"]
        return args + (["--cafile", str(env.ca)] if job.endpoint == "tls" else [])

    async def run(self, job: Job, env: Env, ready: asyncio.Event) -> list[Got]:
        proc = None
        if job.subscribe or job.will or job.expect:
            topic, qos = job.subscribe or ("$interop/none", 0)
            args = ["paho_c_sub", *self._common(job, env, job.client_id), "-t", topic, "-q", str(qos)]
            if job.will:
                args += ["--will-topic", job.will[0], "--will-payload", job.will[1], "--will-qos", "1"]
            proc = await _subscriber_process(args, job, env, ready)
        ready.set()
        for n, (topic, payload, qos, retain) in enumerate(job.publish):
            args = ["paho_c_pub", *self._common(job, env, f"{job.client_id}-p{n}")]
            await _run_publisher(
                [*args, "-t", topic, "-m", payload, "-q", str(qos), *(["-r"] if retain else [])]
            )
        got: list[Got] = []
        if proc is not None:
            assert proc.stdout is not None
            # it prints each payload on a line and runs until stopped
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TIMEOUT):
                    while len(got) < job.expect:
                        line = (await proc.stdout.readline()).decode()
                        if not line:
                            break
                        got.append(Got(None, line.rstrip("\n"), None, None))
            proc.send_signal(signal.SIGKILL if job.abort else signal.SIGINT)
            await asyncio.wait_for(proc.wait(), TIMEOUT)
        return got


# ---------------------------------------------------------------- Python clients
def _tls(env: Env) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(env.ca))


class PahoPython(Client):
    name = "paho-mqtt (Python)"

    async def run(self, job: Job, env: Env, ready: asyncio.Event) -> list[Got]:
        import paho.mqtt.client as mqtt
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        loop = asyncio.get_running_loop()
        v5 = job.version == 5
        c = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=job.client_id,
            protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
            transport="websockets" if job.endpoint == "ws" else "tcp",
            **({} if v5 else {"clean_session": job.clean}),
        )
        if job.endpoint == "ws":
            c.ws_set_options(path="/mqtt")
        if job.endpoint == "tls":
            c.tls_set_context(_tls(env))
        if job.will:
            c.will_set(job.will[0], job.will[1], 1)
        got: list[Got] = []
        done = asyncio.Event()
        subacked = threading.Event()
        connected = threading.Event()

        def on_message(_c: Any, _u: Any, m: Any) -> None:
            got.append(Got(m.topic, m.payload.decode(), m.qos, bool(m.retain)))
            if len(got) >= job.expect:
                loop.call_soon_threadsafe(done.set)

        c.on_message = on_message
        c.on_connect = lambda *_a: connected.set()
        c.on_subscribe = lambda *_a: subacked.set()
        port = {"tcp": env.tcp, "tls": env.tls, "ws": env.ws}[job.endpoint]
        props = None
        if v5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = job.expiry
        # blocking (the TLS handshake too): in a thread, the broker runs on this loop
        clean_start = job.clean if v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY
        await asyncio.to_thread(c.connect, env.host, port, clean_start=clean_start, properties=props)
        c.loop_start()
        try:
            await asyncio.to_thread(connected.wait, TIMEOUT)
            if job.subscribe:
                sprops = None
                if job.selector:
                    sprops = Properties(PacketTypes.SUBSCRIBE)
                    sprops.UserProperty = ("filter", job.selector)
                c.subscribe(job.subscribe[0], job.subscribe[1], properties=sprops)
                assert await asyncio.to_thread(subacked.wait, TIMEOUT)
            ready.set()
            for topic, payload, qos, retain in job.publish:
                info = c.publish(topic, payload, qos, retain)
                await asyncio.to_thread(info.wait_for_publish, TIMEOUT)
            if job.expect:
                await asyncio.wait_for(done.wait(), TIMEOUT)
        finally:
            if job.abort:
                sock = c.socket()
                c.loop_stop()
                if sock is not None:
                    sock.close()  # no DISCONNECT
            else:
                c.disconnect()
                c.loop_stop()
        return got


class AioMqtt(Client):
    name = "aiomqtt"

    async def run(self, job: Job, env: Env, ready: asyncio.Event) -> list[Got]:
        import aiomqtt
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        v5 = job.version == 5
        props = None
        if v5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = job.expiry
        port = {"tcp": env.tcp, "tls": env.tls, "ws": env.ws}[job.endpoint]
        client = aiomqtt.Client(
            env.host,
            port,
            identifier=job.client_id,
            protocol=aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311,
            clean_session=None if v5 else job.clean,
            clean_start=job.clean if v5 else 3,
            properties=props,
            transport="websockets" if job.endpoint == "ws" else "tcp",
            websocket_path="/mqtt" if job.endpoint == "ws" else None,
            tls_context=_tls(env) if job.endpoint == "tls" else None,
            will=aiomqtt.Will(job.will[0], job.will[1], 1) if job.will else None,
        )
        got: list[Got] = []
        await client.__aenter__()
        try:
            if job.subscribe:
                sprops = None
                if job.selector:
                    sprops = Properties(PacketTypes.SUBSCRIBE)
                    sprops.UserProperty = ("filter", job.selector)
                await client.subscribe(job.subscribe[0], job.subscribe[1], properties=sprops)
            ready.set()
            for topic, payload, qos, retain in job.publish:
                await client.publish(topic, payload, qos, retain)
            if job.expect:
                async with asyncio.timeout(TIMEOUT):
                    async for m in client.messages:
                        assert isinstance(m.payload, bytes)
                        got.append(Got(str(m.topic), m.payload.decode(), m.qos, bool(m.retain)))
                        if len(got) >= job.expect:
                            break
        finally:
            if job.abort:
                sock = client._client.socket()
                if sock is not None:
                    # no DISCONNECT: the broker reads the end of the stream (a close() under
                    # paho's feet would leave its loop writing to a dead descriptor)
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(Exception):
                    await client.__aexit__(None, None, None)
            else:
                await client.__aexit__(None, None, None)
        return got


class GMqtt(Client):
    name = "gmqtt"

    def available(self) -> str | None:
        try:
            import gmqtt  # noqa: F401
        except ImportError:
            return "gmqtt not installed (the dev extra)"
        return None

    def why_not(self, feature: str, version: int) -> str | None:
        if feature == "websocket":
            return "gmqtt has no WebSocket transport"
        return None

    async def run(self, job: Job, env: Env, ready: asyncio.Event) -> list[Got]:
        import gmqtt
        from gmqtt.mqtt.constants import MQTTv50, MQTTv311

        v5 = job.version == 5
        kw: dict[str, Any] = {"session_expiry_interval": job.expiry} if v5 and job.expiry else {}
        will = gmqtt.Message(job.will[0], job.will[1], qos=1, will_delay_interval=0) if job.will else None
        c = gmqtt.Client(job.client_id, clean_session=job.clean, will_message=will, **kw)
        got: list[Got] = []
        done = asyncio.Event()
        subacked = asyncio.Event()

        def on_message(_c: Any, topic: str, payload: bytes, qos: int, properties: Any) -> int:
            got.append(Got(topic, payload.decode(), qos, bool(properties.get("retain", 0))))
            if len(got) >= job.expect:
                done.set()
            return 0

        c.on_message = on_message
        c.on_subscribe = lambda *_a: subacked.set()
        await c.connect(
            env.host,
            env.tls if job.endpoint == "tls" else env.tcp,
            ssl=_tls(env) if job.endpoint == "tls" else False,
            version=MQTTv50 if v5 else MQTTv311,
        )
        try:
            if job.subscribe:
                skw: dict[str, Any] = {"user_property": [("filter", job.selector)]} if job.selector else {}
                c.subscribe(job.subscribe[0], job.subscribe[1], **skw)
                await asyncio.wait_for(subacked.wait(), TIMEOUT)
            ready.set()
            for topic, payload, qos, retain in job.publish:
                c.publish(topic, payload, qos, retain)
            if job.expect:
                await asyncio.wait_for(done.wait(), TIMEOUT)
        finally:
            if job.abort:
                transport = c._connection._transport  # no DISCONNECT
                transport.abort()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(c.disconnect(), 1)
            else:
                await c.disconnect()
        return got


CLIENTS: tuple[Client, ...] = (MqttJs(), Mosquitto(), PahoC(), PahoPython(), AioMqtt(), GMqtt())

__all__ = ["CLIENTS", "TIMEOUT", "Client", "Env", "Got", "Job", "Running"]
