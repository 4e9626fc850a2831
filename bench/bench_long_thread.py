"""A long-lived worker's turns on one thread: does a turn cost more as its thread grows?

    python3 dev.py bench long_thread [--turns 1200] [--stores sqlite,postgres]
    .venv/bin/python bench/bench_long_thread.py [same options]   (a venv with pip install -e '.[bench]')

One process, one store object (a worker that lives across turns). Two threads, turns
taken alternately, each turn ``with pk.resume(thread, run_id=<new id>):`` and one
checkpointed step:

* ``list``: the step's 200-byte reply appended to ``run.state["messages"]`` (a chat);
* ``scalar``: the same reply kept as ``run.state["last"]`` (the state does not grow).

Printed per store: the median turn of each kind over the first and the last 100 turns,
and the list turn as a multiple of the scalar turn of the same window (measured side by
side, so a busy machine moves both). Issue #37: a turn that only appends should not pay
for the whole history, so the list turn's multiple at the end stays close to the one at
the start (it grew from 1.4x to 4x over 1,200 turns before the store kept the segments
its runs read: ``state/_segments.py``).

PostgreSQL is used when reachable (``$PERSISTKIT_BENCH_POSTGRES`` overrides
``postgresql://127.0.0.1:5432/test``); every run uses a fresh schema, dropped after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid

import _env  # noqa: F401 -- first: a missing package says how to run this script

import persistkit as pk

POSTGRES = os.environ.get("PERSISTKIT_BENCH_POSTGRES", "postgresql://127.0.0.1:5432/test")
WINDOW = 100


@pk.checkpointed(name="bench.reply")
def reply(i: int) -> str:
    return f"reply {i} " + "x" * 200


def turn(store: pk.Store, thread: str, i: int, kind: str) -> float:
    t0 = time.perf_counter()
    with pk.resume(thread, store=store, run_id=f"turn-{i}") as run:
        text = reply(i)
        if kind == "list":
            run.state.setdefault("messages", []).append(text)
        else:
            run.state["last"] = text
    return time.perf_counter() - t0


def measure(url: str, turns: int) -> dict[str, list[float]]:
    store = pk.connect(url)
    times: dict[str, list[float]] = {"list": [], "scalar": []}
    tag = uuid.uuid4().hex[:8]
    try:
        for i in range(turns):
            for kind in ("list", "scalar") if i % 2 == 0 else ("scalar", "list"):
                times[kind].append(turn(store, f"{kind}-{tag}", i, kind))
    finally:
        store.close()
    return times


def report(name: str, times: dict[str, list[float]]) -> None:
    def ms(kind: str, part: slice) -> float:
        return statistics.median(times[kind][part]) * 1000

    first, last = slice(0, WINDOW), slice(-WINDOW, None)
    turns = len(times["list"])
    print(f"{name}: {turns} turns a thread")
    for label, part in ((f"first {WINDOW}", first), (f"last {WINDOW}", last)):
        lst, sc = ms("list", part), ms("scalar", part)
        print(f"  {label:>9}: list {lst:6.2f} ms, scalar {sc:6.2f} ms, list / scalar {lst / sc:4.2f}x")
    growth = (ms("list", last) / ms("scalar", last)) / (ms("list", first) / ms("scalar", first))
    print(f"  the list turn's multiple, last / first window: {growth:4.2f}x (flat: 1.00x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=1200)
    parser.add_argument("--stores", default="sqlite,postgres")
    args = parser.parse_args()
    if args.turns < 2 * WINDOW:
        parser.error(f"--turns must be at least {2 * WINDOW}")
    for name in args.stores.split(","):
        if name == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                report("SQLite (WAL, synchronous=NORMAL)", measure(f"sqlite:///{tmp}/bench.db", args.turns))
        elif name == "postgres":
            schema = f"bench_long_thread_{uuid.uuid4().hex[:8]}"
            try:
                import psycopg

                psycopg.connect(POSTGRES, connect_timeout=3).close()
            except Exception as exc:  # any failure: skip, saying why
                print(f"PostgreSQL: skipped ({POSTGRES} not reachable: {exc})")
                continue
            try:
                report("PostgreSQL", measure(f"{POSTGRES}?schema={schema}", args.turns))
            finally:
                with psycopg.connect(POSTGRES, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        else:
            parser.error(f"unknown store {name!r}: sqlite or postgres")


if __name__ == "__main__":
    main()
