"""What a child run costs (#39): a parent that starts one child and waits for its result
(``pk.start(...).result()``), against the same work as one step of the parent, measured in
the same run, on SQLite, PostgreSQL and Redis.

    .venv/bin/python bench/bench_children.py [--runs 40]

Each sample is one whole parent run (open, work, end record), timed from ``pk.resume``'s
entry to its exit. ``step``: the parent runs ``read_up(topic)`` itself. ``inline``: the parent
starts ``research(topic)`` (which runs ``read_up``) as a child run with ``executor="inline"``
(the child's run on its own thread, then the parent records its outcome). ``thread``: the
same with the default executor (a thread; the parent polls the child's records, a few ms
apart at first). Printed: p50 and p99 in ms and each p50 over ``step``'s p50. PostgreSQL:
``$PERSISTKIT_TEST_POSTGRES`` or 127.0.0.1:5432/test (a scratch schema); Redis:
``$PERSISTKIT_TEST_REDIS`` or 127.0.0.1:6379/0 (a scratch prefix); a store that cannot be
reached is skipped and said so.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from typing import Any

import _env  # noqa: F401 -- first: a missing package says how to run this script
from _scratch import TAG, scratch_stores

import persistkit as pk


@pk.checkpointed
def read_up(topic: str) -> str:
    return f"notes on {topic}"


@pk.register
def research(topic: str) -> str:
    return read_up(topic)


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def _sample(store: pk.Store, body: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    with pk.resume(f"bench-ch-{TAG}-{uuid.uuid4().hex[:8]}", store=store):
        body()
    return time.perf_counter() - t0


def measure(url: str, runs: int) -> dict[str, list[float]]:
    store = pk.connect(url)
    ways: dict[str, Callable[[], Any]] = {
        "step": lambda: read_up("pricing"),
        "inline": lambda: pk.start(research, "pricing", executor="inline").result(),
        "thread": lambda: pk.start(research, "pricing").result(),
    }
    out: dict[str, list[float]] = {k: [] for k in ways}
    for body in ways.values():  # warm-up: connections, tables, imports
        _sample(store, body)
    for _ in range(runs):  # interleaved, so a slow moment of the machine hits every way alike
        for name, body in ways.items():
            out[name].append(_sample(store, body))
    store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    args = ap.parse_args()
    print(f"a parent run with one child against one step, {args.runs} runs each (ms)")
    print(f"{'store':<12}{'way':<8}{'p50':>9}{'p99':>9}{'p50 / step':>12}")
    for name, url, drop in scratch_stores("ch"):
        try:
            got = measure(url, args.runs)
        finally:
            if drop is not None:
                drop()
        base = _pct(got["step"], 50)
        for way, xs in got.items():
            p50, p99 = _pct(xs, 50), _pct(xs, 99)
            print(f"{name:<12}{way:<8}{p50 * 1e3:>9.1f}{p99 * 1e3:>9.1f}{p50 / base:>11.1f}x")


if __name__ == "__main__":
    main()
