"""``store.send`` -> ``pk.receive`` latency on PostgreSQL, Redis and SQLite (#39), against one
kv read of the same store measured in the same run.

    python3 dev.py bench messages [--messages 200]
    .venv/bin/python bench/bench_messages.py [--messages 200]

A run waits in ``pk.receive(topic, timeout=30)`` (polling the store: a few ms apart at
first, at most 25 ms); a sender in another thread, with its own store object (as another
process would have), sends message ``i`` once the run took message ``i - 1``, after a
random pause of 0-50 ms (so the poll's back-off is caught at every phase). The latency is
the time from the start of ``send`` to ``receive``'s return in the run, which includes the
receive's own record (a step checkpoint). Printed: p50 and p99 in ms, the p50 of ``send``
alone (one read and one atomic kv write: a commit), and p50 over the p50 of one ``kv_get``
round trip. PostgreSQL: ``$PERSISTKIT_TEST_POSTGRES`` or
127.0.0.1:5432/test (a scratch schema); Redis: ``$PERSISTKIT_TEST_REDIS`` or
127.0.0.1:6379/0 (a scratch prefix); a store that cannot be reached is skipped and said so.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

import _env  # noqa: F401 -- first: a missing package says how to run this script
from _scratch import TAG, scratch_stores

import persistkit as pk
from persistkit.coordination._inbox import inbox_scope


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def measure(url: str, n: int) -> tuple[list[float], list[float], list[float]]:
    run_store, sender = pk.connect(url), pk.connect(url)
    thread = f"bench-msg-{TAG}"
    sent_at: dict[int, float] = {}
    send_took: list[float] = []
    got_at: dict[int, float] = {}
    took = threading.Event()

    def send_all() -> None:
        for i in range(n):
            time.sleep(random.random() * 0.05)
            sent_at[i] = time.perf_counter()
            sender.send(thread, i, topic="bench")
            send_took.append(time.perf_counter() - sent_at[i])
            took.wait(30)
            took.clear()

    feeder = threading.Thread(target=send_all)
    feeder.start()
    with pk.resume(thread, store=run_store):
        for _ in range(n):
            i = pk.receive("bench", timeout=30)
            got_at[i] = time.perf_counter()
            took.set()
    feeder.join()
    backend = sender.backend
    rt = []
    for _ in range(50):
        t0 = time.perf_counter()
        backend.kv_get(inbox_scope(thread), "none")  # a point read in the inbox's scope
        rt.append(time.perf_counter() - t0)
    run_store.close()
    sender.close()
    return [got_at[i] - sent_at[i] for i in range(n)], rt, send_took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200)
    args = ap.parse_args()
    print(f"send -> receive latency, {args.messages} messages each (ms)")
    print(f"{'store':<12}{'p50':>9}{'p99':>9}{'send p50':>10}{'kv_get p50':>12}{'p50 / kv_get':>14}")
    for name, url, drop in scratch_stores("msg"):
        try:
            lat, rt, sends = measure(url, args.messages)
        finally:
            if drop is not None:
                drop()
        p50, p99, r50 = _pct(lat, 50) * 1e3, _pct(lat, 99) * 1e3, statistics.median(rt) * 1e3
        s50 = statistics.median(sends) * 1e3
        print(f"{name:<12}{p50:>9.1f}{p99:>9.1f}{s50:>10.1f}{r50:>12.2f}{p50 / r50:>13.1f}x")


if __name__ == "__main__":
    main()
