"""Count the stops on the path of one PUBLISH through the broker (issue 15).

Drives the sans-IO core of the checkout at ``--tree`` (pure Python: run it on a tree without
compiled extensions, e.g. a fresh ``git worktree``) with a publisher and a subscriber of one
topic (QoS 1, both on a persisted session with an in-memory store when ``--store``), then
traces one PUBLISH from ``Connection.received`` until the call returns with
``sys.setprofile``. It prints every Python-level call into the broker's modules (the
"stops"), how many times control crossed from one module to another (calls and returns),
and the modules visited. Run it on two checkouts to compare:

    git worktree add /tmp/pure-new HEAD && git worktree add /tmp/pure-old 82de39c
    .venv/bin/python scripts/publish_path.py --tree /tmp/pure-new
    .venv/bin/python scripts/publish_path.py --tree /tmp/pure-old
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any


def main() -> int:  # noqa: PLR0915 (a script: set-up, trace, report in order)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", required=True, help="checkout whose broker/ is traced (no .so files)")
    ap.add_argument("--store", action="store_true", help="persisted sessions with an in-memory store")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every stop")
    args = ap.parse_args()
    tree = Path(args.tree).resolve()
    if list((tree / "broker").rglob("*.so")):
        print(f"{tree}/broker has compiled extensions: the trace would not see them", file=sys.stderr)
        return 2
    sys.path.insert(0, str(tree))
    packets = importlib.import_module("broker.packets")
    config = importlib.import_module("broker._config")
    if (tree / "broker" / "_session.py").exists():  # the layout before issue 15
        core_mod = conn_mod = importlib.import_module("broker._session")
    else:
        core_mod = importlib.import_module("broker.core._core")
        conn_mod = importlib.import_module("broker.core._connection")
    cfg = config.BrokerConfig(sys_interval=0)
    core = core_mod.Core(cfg)
    if args.store:
        store_cls = _store_class(tree)
        store = store_cls(":memory:")
        if hasattr(core, "journal"):
            core.journal.store = store
        else:
            core.store = store
    out: list[bytes] = []

    def wire(cid: str, expiry: int) -> Any:
        c = conn_mod.Connection(core, out.append, lambda: None, 0.0, "trace")
        props = packets.Properties(session_expiry_interval=expiry) if expiry else packets.Properties()
        c.received([packets.Connect(cid, 5, keep_alive=0, properties=props)], 0.0)
        core.flush()
        return c

    expiry = 3600 if args.store else 0
    sub = wire("s", expiry)
    sub.received([packets.Subscribe(1, (packets.SubscriptionRequest("t", 1),))], 0.0)
    pub = wire("p", expiry)
    core.flush()
    msg = packets.Publish("t", b"x", 1, packet_id=1)
    pub.received([msg], 0.0)  # warm caches (routing plan on the second miss)
    pub.received([packets.Publish("t", b"x", 1, packet_id=2)], 0.0)
    core.flush()

    root = str(tree / "broker") + "/"
    stops: list[tuple[str, str]] = []

    def prof(frame: FrameType, event: str, _arg: object) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(root):
            mod = frame.f_code.co_filename[len(root) :]
            stops.append((mod, frame.f_code.co_name))

    sys.setprofile(prof)
    try:
        pub.received([packets.Publish("t", b"x", 1, packet_id=3)], 0.0)
        core.flush()
    finally:
        sys.setprofile(None)
    crossings = sum(1 for a, b in itertools.pairwise(stops) if a[0] != b[0])
    if args.verbose:
        for mod, fn in stops:
            print(f"  {mod}:{fn}")
    modules = Counter(m for m, _ in stops)
    print(f"tree {tree}  store {'on' if args.store else 'off'}")
    print(f"stops (calls into broker modules): {len(stops)}")
    print(f"module changes between consecutive stops: {crossings}")
    print("stops per module: " + ", ".join(f"{m} {n}" for m, n in modules.most_common()))
    return 0


def _store_class(tree: Path) -> Any:
    old = (tree / "broker" / "_store.py").exists()
    return importlib.import_module("broker._store" if old else "broker.durability._store").Store


if __name__ == "__main__":
    raise SystemExit(main())
