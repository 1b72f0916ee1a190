"""siftmq's MQTT load generator (issue 8): multi-process, uvloop, raw ``asyncio.Protocol`` sockets.

It speaks MQTT itself (``_codec``) so it can measure any broker, runs one worker process per
load core (``_worker``), and describes the issue-8 scenarios as picklable plans
(``_scenarios``, ``_plan``). ``benchmarks/bench_brokers.py`` drives it against siftmq, amqtt,
iotcore and mosquitto in one run.
"""

from ._codec import Block, connect, make_payload, puback, publish, subscribe, unsubscribe
from ._plan import ClientSpec, GroupSpec, RetainedSpec, WorkerPlan, WorkerResult
from ._scenarios import SCENARIOS, Scenario
from ._worker import worker_main

__all__ = [
    "SCENARIOS",
    "Block",
    "ClientSpec",
    "GroupSpec",
    "RetainedSpec",
    "Scenario",
    "WorkerPlan",
    "WorkerResult",
    "connect",
    "make_payload",
    "puback",
    "publish",
    "subscribe",
    "unsubscribe",
    "worker_main",
]
