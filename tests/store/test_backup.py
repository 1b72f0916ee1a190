"""``siftmq backup``: a consistent copy of the store of a running broker, which a new broker
restores from (docs/operations.md, "Backup and restore")."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
from pathlib import Path

import aiomqtt

from broker import Broker
from broker._cli import main
from tests.waiting import next_message


async def test_a_backup_taken_while_serving_restores_retained_messages_and_sessions(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    dest = tmp_path / "backup.db"
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=str(data / "broker.db")) as b:
        async with aiomqtt.Client("127.0.0.1", b.port, identifier="keeper", clean_session=False) as c:
            await c.subscribe("kept/#", qos=1)
        async with aiomqtt.Client("127.0.0.1", b.port) as p:
            # QoS 1: the PUBACK comes after the store's commit
            await p.publish("r/1", b"retained", qos=1, retain=True)
            await p.publish("kept/1", b"queued", qos=1)
        # the broker is serving (and its writer thread holds the database open) while we copy
        rc = await asyncio.to_thread(main, ["backup", "--data-dir", str(data), str(dest)])
        assert rc == 0
    assert not [p.name for p in os.scandir(tmp_path) if p.name.endswith(".partial")]
    restored = tmp_path / "restored"
    restored.mkdir()
    shutil.copyfile(dest, restored / "broker.db")
    async with (
        Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=str(restored / "broker.db")) as b,
        aiomqtt.Client("127.0.0.1", b.port, identifier="keeper", clean_session=False) as c,
    ):
        msg = await next_message(c)  # the queued message of the persistent session
        assert (str(msg.topic), msg.payload) == ("kept/1", b"queued")
        await c.subscribe("r/#")
        msg = await next_message(c)
        assert (str(msg.topic), msg.payload, msg.retain) == ("r/1", b"retained", True)


def test_backup_reports_a_missing_store_and_a_bad_destination(tmp_path: Path) -> None:
    assert main(["backup", "--data-dir", str(tmp_path / "nothing"), str(tmp_path / "b.db")]) == 2
    assert not (tmp_path / "b.db").exists()
    db = tmp_path / "broker.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        con.execute("INSERT INTO schema_version VALUES (2)")
    con.close()
    assert main(["backup", "--db", str(db), str(tmp_path / "no" / "such" / "dir" / "b.db")]) == 2
    assert main(["backup", "--db", str(db), str(tmp_path / "b.db")]) == 0
    with sqlite3.connect(tmp_path / "b.db") as con:
        assert con.execute("SELECT version FROM schema_version").fetchone() == (2,)
    con.close()
