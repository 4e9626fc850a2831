"""Leases: what a held lease costs per step, and many writers on one thread with and without them.

    python3 dev.py bench lease [--steps 300] [--rounds 7] [--writers 16] [--runs 100]
                               [--stores memory,sqlite,postgres,redis] [--skip-writers]
    .venv/bin/python bench/bench_lease.py [same options]   (a venv with pip install -e '.[bench]')

1. Per-step cost: one block runs ``--steps`` steps (each appends ~200 bytes to a
   list), with a lease held (the default, ``busy="queue"``) and without
   (``busy=None``), interleaved round by round; the median time of the steps
   (taking and releasing the lease are outside the timed loop, and printed on
   their own). The target is <= 1.1x: a held lease adds nothing to a step but
   the fence in its one write (the heartbeat runs on its own timer).
2. ``--writers`` processes each do ``--runs`` read-modify-write runs on ONE
   thread (append an item to the state's list): today's loop (``busy=None``, a
   run_id per run, retried on ``ConflictError``) against ``busy="queue"`` (no
   retry loop at all). Prints wall time, the retries, and whether every item
   landed exactly once.

PostgreSQL and Redis are used when reachable on their usual ports
(``$PERSISTKIT_BENCH_POSTGRES`` / ``$PERSISTKIT_BENCH_REDIS`` override).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import _env  # noqa: F401 -- first: a missing package says how to run this script

import persistkit as pk

HERE = Path(__file__).resolve()
POSTGRES = os.environ.get("PERSISTKIT_BENCH_POSTGRES", "postgresql://127.0.0.1:5432/test")
REDIS = os.environ.get("PERSISTKIT_BENCH_REDIS", "redis://127.0.0.1:6379/0")


@pk.checkpointed(name="bench.append")
def append(i: int) -> int:
    run = pk.current_run()
    assert run is not None
    run.state.setdefault("log", []).append({"i": i, "text": "x" * 200})
    return i


def per_step(store: pk.Store, steps: int, busy: str | None) -> tuple[float, float, float]:
    """(wall seconds per step inside the block, this process's CPU seconds per step,
    seconds to enter and leave the block)."""
    thread = f"bench-{uuid.uuid4().hex}"
    t0 = time.perf_counter()
    block = pk.resume(thread, store=store, busy=busy)
    block.__enter__()
    t1, c1 = time.perf_counter(), time.process_time()
    for i in range(steps):
        append(i)
    t2, c2 = time.perf_counter(), time.process_time()
    block.__exit__(None, None, None)
    t3 = time.perf_counter()
    return (t2 - t1) / steps, (c2 - c1) / steps, (t1 - t0) + (t3 - t2)


def urls(names: list[str], tmp: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    tag = uuid.uuid4().hex[:8]
    for name in names:
        if name == "sqlite":
            out[name] = f"sqlite:///{tmp}/bench-{tag}.db"
        elif name == "memory":
            out[name] = f"memory://bench-{tag}"
        elif name == "postgres":
            out[name] = f"{POSTGRES}?schema=pkbench_lease_{tag}"
        elif name == "redis":
            out[name] = f"{REDIS}?volatile=true&prefix=pkbench:{tag}:"
    return out


def reachable(url: str) -> bool:
    try:
        pk.connect(url).close()
        return True
    except pk.PersistkitError as exc:
        print(f"  skipped {url.split('?')[0]}: {exc}")
        return False


def bench_steps(stores: dict[str, str], steps: int, rounds: int) -> None:
    print(f"\n1. per-step cost, {steps} steps a block, median of {rounds} interleaved rounds")
    print("   (wall time of a step, and the client process's CPU time: steadier on a shared machine)")
    print(f"   {'store':<10} {'no lease':>10} {'lease held':>10} {'ratio':>6} {'cpu none':>9} {'cpu lease':>9} {'ratio':>6} {'take+release':>13}")
    for name, url in stores.items():
        store = pk.connect(url)
        per_step(store, 20, None)  # warm up: schema, connections, statement caches
        per_step(store, 20, "queue")
        got: dict[str | None, list[tuple[float, float, float]]] = {None: [], "queue": []}
        for r in range(rounds):
            for busy in (None, "queue") if r % 2 else ("queue", None):
                got[busy].append(per_step(store, steps, busy))
        a, b = (statistics.median(x[0] for x in got[k]) for k in (None, "queue"))
        ca, cb = (statistics.median(x[1] for x in got[k]) for k in (None, "queue"))
        extra = statistics.median(x[2] for x in got["queue"]) - statistics.median(x[2] for x in got[None])
        print(
            f"   {name:<10} {a * 1e6:>7.0f} us {b * 1e6:>7.0f} us {b / a:>5.2f}x"
            f" {ca * 1e6:>6.0f} us {cb * 1e6:>6.0f} us {cb / ca:>5.2f}x {extra * 1e3:>10.2f} ms"
        )
        store.close()


def writer(url: str, thread: str, runs: int, mode: str, name: str) -> None:
    """One writer process: ``runs`` read-modify-write runs; prints its retry count."""

    @pk.checkpointed(name="bench.add")
    def add(item: str) -> None:
        run = pk.current_run()
        assert run is not None
        run.state.setdefault("items", []).append(item)

    store = pk.connect(url)
    retries = 0
    for i in range(runs):
        item = f"{name}:{i}"
        if mode == "queue":
            with pk.resume(thread, store=store, busy="queue", lease_ttl=10):
                add(item)
            continue
        attempt = 0
        while True:  # today's loop: a fresh run_id per attempt, retried on conflict
            attempt += 1
            try:
                with pk.resume(thread, store=store, busy=None, run_id=f"{item}:{attempt}"):
                    add(item)
                break
            except pk.ConflictError:
                retries += 1
    store.close()
    print(json.dumps({"retries": retries}))


def bench_writers(stores: dict[str, str], writers: int, runs: int) -> None:
    print(f"\n2. {writers} processes x {runs} read-modify-write runs on one thread")
    print(f"   {'store':<10} {'mode':<28} {'seconds':>8} {'retries':>8}  items")
    for name, url in stores.items():
        if name == "memory":
            continue
        times: dict[str, float] = {}
        for mode, label in (("retry", "busy=None + ConflictError retry"), ("queue", 'busy="queue"')):
            thread = f"writers-{mode}-{uuid.uuid4().hex[:8]}"
            t0 = time.perf_counter()
            procs = [
                subprocess.Popen(
                    [sys.executable, str(HERE), "--writer", url, thread, str(runs), mode, f"w{i}"],
                    stdout=subprocess.PIPE, text=True,
                )
                for i in range(writers)
            ]
            outs = [p.communicate()[0] for p in procs]
            elapsed = time.perf_counter() - t0
            times[mode] = elapsed
            failed = [p.returncode for p in procs if p.returncode]
            retries = sum(json.loads(o.strip().splitlines()[-1])["retries"] for o in outs if o.strip())
            with pk.connect(url) as store:
                items = store.get_state(thread).get("items", [])
            want = {f"w{i}:{n}" for i in range(writers) for n in range(runs)}
            ok = sorted(items) == sorted(want)
            status = "exact" if ok else f"WRONG ({len(items)} items, {len(set(items))} distinct)"
            if failed:
                status += f", {len(failed)} writers failed"
            print(f"   {name:<10} {label:<28} {elapsed:>8.1f} {retries:>8}  {status}")
        print(f"   {name:<10} {'queue / retry loop':<28} {times['queue'] / times['retry']:>7.2f}x")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--writer":
        url, thread, runs, mode, name = sys.argv[2:7]
        writer(url, thread, int(runs), mode, name)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--stores", default="memory,sqlite,postgres,redis")
    ap.add_argument("--skip-writers", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stores = {n: u for n, u in urls(args.stores.split(","), Path(tmp)).items() if reachable(u)}
        bench_steps(stores, args.steps, args.rounds)
        if not args.skip_writers:
            bench_writers(stores, args.writers, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
