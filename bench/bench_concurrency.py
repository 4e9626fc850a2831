"""Concurrency limits (#40): what a slot adds to a turn, against the same turn without one.

    .venv/bin/python bench/bench_concurrency.py [--turns 200] [--rounds 5] [--stores sqlite,postgres,redis]

One process runs ``--turns`` short turns one after the other (each a new thread, one step),
without ``concurrency=`` and with ``concurrency=("tenant", key, 5)`` (uncontended: one turn at
a time), interleaved round by round; prints the median wall time of a turn of each kind, the
difference (the slot's cost: taking it, a read and a compare-and-swap of the key's record, and
giving it up, the same) and the ratio. No figure here is asserted anywhere: they depend on the
machine. PostgreSQL and Redis are used when reachable (``$PERSISTKIT_BENCH_POSTGRES`` /
``$PERSISTKIT_BENCH_REDIS`` override).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import _env  # noqa: F401 -- first: a missing package says how to run this script

import persistkit as pk

POSTGRES = os.environ.get("PERSISTKIT_BENCH_POSTGRES", "postgresql://127.0.0.1:5432/test")
REDIS = os.environ.get("PERSISTKIT_BENCH_REDIS", "redis://127.0.0.1:6379/0")


@pk.checkpointed(name="bench.reply")
def reply(i: int) -> int:
    return i


def turns(store: pk.Store, n: int, limit: bool, tag: str) -> float:
    """Median seconds of one turn."""
    times = []
    for i in range(n):
        extra = {"concurrency": ("tenant", f"bench-{tag}", 5)} if limit else {}
        t0 = time.perf_counter()
        with pk.resume(f"bench-{tag}-{limit}-{i}", store=store, **extra):
            reply(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def urls(names: list[str], tmp: Path) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    known = {
        "memory": f"memory://bench-{tag}",
        "sqlite": f"sqlite:///{tmp}/bench-{tag}.db",
        "postgres": f"{POSTGRES}?schema=pkbench_conc_{tag}",
        "redis": f"{REDIS}?volatile=true&prefix=pkbench:{tag}:",
    }
    return {n: known[n] for n in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stores", default="sqlite,postgres,redis")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"a turn (one step) without and with a concurrency slot, median of {args.turns} turns x {args.rounds} rounds")
        print(f"{'store':<10} {'no slot µs':>11} {'slot µs':>9} {'slot adds µs':>13} {'ratio':>6}")
        for name, url in urls(args.stores.split(","), Path(tmp)).items():
            try:
                store = pk.connect(url)
            except pk.PersistkitError as exc:
                print(f"{name:<10} skipped: {exc}")
                continue
            tag = uuid.uuid4().hex[:6]
            turns(store, 20, False, tag)  # warm up: schema, connections, statement caches
            turns(store, 20, True, tag)
            plain, slot = [], []
            for r in range(args.rounds):
                plain.append(turns(store, args.turns, False, f"{tag}{r}"))
                slot.append(turns(store, args.turns, True, f"{tag}{r}"))
            a, b = statistics.median(plain) * 1e6, statistics.median(slot) * 1e6
            print(f"{name:<10} {a:>11.0f} {b:>9.0f} {b - a:>13.0f} {b / a:>5.2f}x")
            store.close()


if __name__ == "__main__":
    main()
