"""Shared rate limits (#40) on PostgreSQL and Redis: the cost of a draw, and many processes
held to one rate.

    python3 dev.py bench limits [--draws 300] [--procs 16] [--seconds 20] [--rate 50]
    .venv/bin/python bench/bench_limits.py

1. The cost of one draw (``store.limits.acquire`` on a limit that never makes it wait: one
   kv read and one compare-and-swap write) against one bare ``kv_get`` round trip and one
   bare compare-and-swap ``kv_write`` of the same store, measured in the same run: p50 in µs,
   and the draw over the round trip and over the two calls it is made of.
2. ``--procs`` worker processes (``tests/limits_worker.py``) share ``rate/s`` (burst 5) for
   ``--seconds``; a fake provider (a log file of call times) answers 429 to a call with more
   than ``rate + burst`` calls in the second up to it. Two workers are SIGKILLed (at 25% and
   50% of the time) and one is SIGSTOPped at 40% and continued at 75%. Printed: the calls
   made within the window against ``rate x seconds``, the provider's 429s, and the calls
   refused with ``pk.RateLimitedError``.

PostgreSQL: ``$PERSISTKIT_TEST_POSTGRES`` or 127.0.0.1:5432/test (a scratch schema);
Redis: ``$PERSISTKIT_TEST_REDIS`` or 127.0.0.1:6379/0 (a scratch prefix); a store that
cannot be reached is skipped and said so.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from bisect import bisect_left
from pathlib import Path
from typing import Any

import _env  # noqa: F401 -- first: a missing package says how to run this script
from _scratch import TAG, scratch_stores

import persistkit as pk
from persistkit.backends._protocol import KvOp
from persistkit.flow._limits import SCOPE

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "limits_worker.py"
BURST = 5


def draw_cost(url: str, n: int) -> tuple[float, float, float]:
    """(p50 of a draw, of a bare kv_get, of a bare compare-and-swap kv_write), in seconds."""
    store = pk.connect(url)
    name = f"bench-{TAG}"
    store.limits.set(name, rate="1000000/s", burst=1_000_000)
    for _ in range(20):  # warm: connections, the cached declaration
        store.limits.acquire(name)
    draws, rts, writes = [], [], []
    floor = f"floor-{TAG}"
    for version in range(n):
        t0 = time.perf_counter()
        store.limits.acquire(name)
        draws.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        store.backend.kv_get(SCOPE, "none")
        rts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        store.backend.kv_write(SCOPE, [KvOp(floor, version, b'{"t":0}')], keep=1)
        writes.append(time.perf_counter() - t0)
    store.backend.kv_write(SCOPE, [KvOp(floor, n, None)], keep=1)
    store.limits.delete(name)
    store.close()
    return statistics.median(draws), statistics.median(rts), statistics.median(writes)


def fleet(url: str, procs: int, seconds: float, rate: int) -> dict[str, Any]:
    name = f"fleet-{TAG}"
    with pk.connect(url) as store:
        store.limits.set(name, rate=f"{rate}/s", burst=BURST, timeout=30)
    log = Path(tempfile.mkdtemp()) / "provider.log"
    log.touch()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    workers = [
        subprocess.Popen([sys.executable, str(WORKER), url, name, str(log)], env=env)
        for _ in range(procs)
    ]
    while log.read_text().count(" ready\n") < procs:  # every worker imported and connected
        if any(p.poll() is not None for p in workers):
            raise SystemExit("a worker died before it was ready")
        time.sleep(0.02)
    start = time.time() + 0.2
    end = start + seconds
    (log.parent / "go.tmp").write_text(f"{start} {end}")
    (log.parent / "go.tmp").rename(f"{log}.go")
    plan = [
        (0.25, workers[0], signal.SIGKILL),
        (0.40, workers[2], signal.SIGSTOP),
        (0.50, workers[1], signal.SIGKILL),
        (0.75, workers[2], signal.SIGCONT),
    ]
    try:
        for at, proc, sig in plan:
            time.sleep(max(0.0, start + at * seconds - time.time()))
            proc.send_signal(sig)
        for p in workers[1:]:
            p.wait(timeout=seconds + 120)
    finally:
        for p in workers:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait()
    calls, limited = [], 0
    for line in log.read_text().splitlines():
        parts = line.split()
        if parts[1] == "ready":
            continue
        if len(parts) == 2:
            calls.append(float(parts[1]))
        elif parts[1] == "limited":
            limited += 1
    calls.sort()
    too_many = sum(
        1 for i, t in enumerate(calls) if i - bisect_left(calls, t - 1.0) + 1 > rate + BURST
    )
    inside = sum(1 for t in calls if start <= t < end)
    with pk.connect(url) as store:
        store.limits.delete(name)
    return {
        "calls": inside,
        "expected": rate * seconds,
        "429": too_many,
        "limited": limited,
        "all": len(calls),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=300)
    ap.add_argument(
        "--procs", type=int, default=16, help="worker processes (0: the draw's cost only)"
    )
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=int, default=50)
    args = ap.parse_args()
    found = scratch_stores("limits", sqlite=False)
    print(
        f"one draw against one kv_get round trip and one kv_write (compare-and-swap), p50 of {args.draws} (µs)"
    )
    print(
        f"{'store':<12}{'draw':>8}{'kv_get':>8}{'kv_write':>10}{'draw / kv_get':>15}{'draw / (get + write)':>22}"
    )
    results = []
    for name, url, drop in found:
        try:
            draw, rt, wr = draw_cost(url, args.draws)
            print(
                f"{name:<12}{draw * 1e6:>8.0f}{rt * 1e6:>8.0f}{wr * 1e6:>10.0f}{draw / rt:>14.2f}x{draw / (rt + wr):>21.2f}x",
                flush=True,
            )
            if args.procs:
                results.append((name, fleet(url, args.procs, args.seconds, args.rate)))
        finally:
            drop()
    if not results:
        return
    print(
        f"\n{args.procs} processes sharing {args.rate}/s (burst {BURST}) for {args.seconds:g} s; "
        "2 SIGKILLed (25%, 50%), 1 SIGSTOPped (40% to 75%)"
    )
    print(
        f"{'store':<12}{'calls':>8}{'expected':>10}{'ratio':>8}{'429s':>7}{'RateLimitedError':>18}"
    )
    for name, r in results:
        print(
            f"{name:<12}{r['calls']:>8}{r['expected']:>10.0f}{r['calls'] / r['expected']:>8.3f}"
            f"{r['429']:>7}{r['limited']:>18}"
        )


if __name__ == "__main__":
    main()
