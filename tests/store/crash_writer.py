"""Child process of the crash test: writes records and prints each one after its commit signal.

Usage: ``python tests/store/crash_writer.py <data-dir> <threads>``.  Each thread loops: queue
an outgoing message and its thread's retained message, wait for ``Store.sync()``, then print
``<seq> <thread> <i>`` (a line on stdout = an acknowledged record).  It runs until killed.
"""

from __future__ import annotations

import sys
import threading

from broker.store import MessageRecord, MessageState, OutgoingRecord, Store


def main() -> None:
    store = Store.in_data_dir(sys.argv[1])
    out_lock = threading.Lock()

    def writer(t: int) -> None:
        i = 0
        while True:
            i += 1
            seq = store.next_seq()
            msg = MessageRecord(f"t/{t}", f"{t}:{i}".encode() * 8, 1, False)
            store.add_outgoing(OutgoingRecord(f"c{t}", seq, MessageState.QUEUED, None, msg, 1, False))
            store.set_retained(MessageRecord(f"r/{t}", str(i).encode(), 1, True))
            store.sync().result()
            with out_lock:
                sys.stdout.write(f"{seq} {t} {i}\n")
                sys.stdout.flush()

    threads = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(int(sys.argv[2]))]
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for th in threads:
        th.start()
    threads[0].join()


if __name__ == "__main__":
    main()
