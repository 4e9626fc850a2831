"""Durable streams (pk.emit, store.read_stream): the three figures of issue 38, each against a
floor measured in the same run.

    python3 dev.py bench streams
    .venv/bin/python bench/bench_streams.py [--seconds 2]     (PostgreSQL and Redis on loopback)

1. writer -> reader p99 at 2,000 events/s into one stream, on PostgreSQL and Redis: an event's
   emit to a live reader (another pk.connect of the store) yielding it. Floor: the store's own
   kv write -> watch hint -> kv read of one key, at the same rate.
2. events/s into one stream on PostgreSQL: one step emits as fast as it can, until its commit
   (which waits for the last batch). Floor: the same number of events as kv writes of batches
   of 256, straight to the backend.
3. the step path of a run that emits nothing: microseconds per step on SQLite, against the same
   run that emits one event per step (the cost a stream adds when used); the instructions per
   step of a run that emits nothing are bench/bench_cpu.py's figure (unchanged by the hook:
   docs/streams.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
import uuid

import _env  # noqa: F401 -- first: a missing package says how to run this script

import persistkit as pk
from persistkit.backends._protocol import KvOp

POSTGRES = os.environ.get("PERSISTKIT_BENCH_POSTGRES", "postgresql://127.0.0.1:5432/test")
REDIS = os.environ.get("PERSISTKIT_BENCH_REDIS", "redis://127.0.0.1:6379/0?volatile=true&prefix=pkbench:")
RATE = 2000


def _pace(n: int, rate: float, each) -> None:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for i in range(n):
        each(i)
        ahead = start + (i + 1) / rate - time.perf_counter()
        if ahead > 0:
            time.sleep(ahead)


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98] * 1000 if len(xs) > 1 else float("nan")


def latency(url: str, seconds: float) -> tuple[float, float]:
    """(p99 ms of emit -> reader, p99 ms of the floor)."""
    writer, reader = pk.connect(url), pk.connect(url)
    thread = f"bench-{uuid.uuid4().hex[:10]}"
    n = int(RATE * seconds)
    lags: list[float] = []
    ready = threading.Event()

    def follow() -> None:
        it = iter(reader.read_stream(thread, timeout=30))
        ready.set()
        for ev in it:
            if ev.kind == "event":
                lags.append(time.perf_counter() - ev.data)

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    ready.wait()
    time.sleep(0.3)  # the reader's first listing and its watch are in place

    @pk.checkpointed(name="bench.stream")
    def talk() -> None:
        _pace(n, RATE, lambda i: pk.emit(time.perf_counter()))

    with pk.resume(thread, store=writer):
        talk()
    t.join(30)
    # the floor: one kv write per event, a watcher that reads the key it is hinted
    backend, scope = reader.backend, f"bench_{uuid.uuid4().hex[:10]}"
    watch = backend.watch_open(scope)
    sent: dict[str, float] = {}
    floor: list[float] = []
    done = threading.Event()

    def watcher() -> None:
        while len(floor) < n and not done.is_set():
            for h in watch.hints(0.5):
                if h.key is not None and h.key in sent:
                    backend.kv_get(scope, h.key)
                    floor.append(time.perf_counter() - sent.pop(h.key))

    w = threading.Thread(target=watcher, daemon=True)
    w.start()

    def put(i: int) -> None:
        key = f"k{i}"
        sent[key] = time.perf_counter()
        writer.backend.kv_write(scope, [KvOp(key, 0, b"x")], keep=1)

    _pace(n, RATE, put)
    time.sleep(0.5)
    done.set()
    w.join(5)
    watch.close()
    writer.backend.kv_drop(scope)
    writer.delete_stream(thread)
    writer.close()
    reader.close()
    return p99(lags), p99(floor)


def throughput(url: str, n: int) -> tuple[float, float]:
    """(events/s through pk.emit until the step committed, events/s of the floor)."""
    store = pk.connect(url)
    thread = f"bench-{uuid.uuid4().hex[:10]}"

    @pk.checkpointed(name="bench.burst")
    def burst() -> None:
        for i in range(n):
            pk.emit(i)

    began = time.perf_counter()
    with pk.resume(thread, store=store):
        burst()
    ours = n / (time.perf_counter() - began)
    scope = f"bench_{uuid.uuid4().hex[:10]}"
    codec = store.codec
    began = time.perf_counter()
    for start in range(0, n, 256):
        data = codec.pack_tree({"e": [["e", 0.0, "0", 0, i] for i in range(start, min(n, start + 256))]})
        store.backend.kv_write(scope, [KvOp(f"b{start:012d}", 0, data)], keep=1)
    floor = n / (time.perf_counter() - began)
    store.backend.kv_drop(scope)
    store.delete_stream(thread)
    store.close()
    return ours, floor


def step_path(steps: int) -> tuple[float, float]:
    """(µs per step of a run that emits nothing, µs per step of one that emits once per step), SQLite."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        store = pk.connect(f"sqlite:///{tmp}/bench.db")
        for emits in (False, True):

            @pk.checkpointed(name=f"bench.step{int(emits)}")
            def step(i: int, emits: bool = emits) -> int:
                if emits:
                    pk.emit(i)
                return i

            thread = f"bench-{uuid.uuid4().hex[:10]}"
            began = time.perf_counter()
            with pk.resume(thread, store=store):
                for i in range(steps):
                    step(i)
            out.append((time.perf_counter() - began) / steps * 1e6)
        store.close()
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds of emitting per latency run")
    ap.add_argument("--events", type=int, default=50_000, help="events of the throughput run")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    print(f"1. writer -> reader at {RATE} events/s into one stream, p99 (target <= 20 ms)")
    for name, url in (("PostgreSQL", POSTGRES), ("Redis", REDIS)):
        ours, floor = latency(url, args.seconds)
        print(f"   {name:<11} {ours:7.2f} ms    floor (kv write -> watch -> read) {floor:6.2f} ms    {ours / floor:5.2f}x")
    ours, floor = throughput(POSTGRES, args.events)
    print("2. events/s into one stream on PostgreSQL (target >= 20,000)")
    print(f"   pk.emit      {ours:9,.0f}/s    floor (batches of 256 as kv writes) {floor:9,.0f}/s    {ours / floor:5.2f}x")
    quiet, loud = step_path(args.steps)
    print("3. the step path on SQLite, µs per step")
    print(f"   emits nothing {quiet:7.1f}    one emit per step {loud:7.1f}    {loud / quiet:5.2f}x  "
          "(instructions of the first: bench/bench_cpu.py)")


if __name__ == "__main__":
    main()
