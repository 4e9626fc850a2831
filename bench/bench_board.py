"""The board (issue 22): claim throughput, and a watch's write-to-delivery latency, per store.

    python3 dev.py bench board [--items 500] [--claimers 1,16] [--writes 100] [--watchers 1,10,100]
                               [--stores memory,sqlite,postgres,redis,s3] [--skip-claims] [--skip-watch]
    .venv/bin/python bench/bench_board.py [same options]   (a venv with pip install -e '.[bench]')

1. Claims: ``--items`` items under ``tasks/``; each claimer loops ``claim`` -> ``complete``
   until ``claim`` returns None; items per second from the start signal to the last
   complete, with 1 and 16 claimers (processes; threads on memory://, which lives in one
   process). Baseline, same run, same store: one process doing the two bare ``kv_write``
   round trips an item needs at the least (the claim's compare-and-swap and the delete),
   so the ratio is what the board's listing, envelope and read-before-write cost on top.
2. Watch latency: ``--writes`` puts of one key, 10-30 ms apart; each watcher
   (``board.watch("lat/*")``, its own watch) records when each version reached it; latency
   = the time the watcher first got that version or a later one - the time just before the
   put was issued; p50 and p99 over every (write, watcher) pair, with 1, 10 and 100
   watchers (up to 10 watcher processes, the rest as threads in them: on 2 cores the GIL
   and the scheduler are part of the number). Baseline, same
   run: the store's own hint (``backend.watch_open`` -> ``hints``, one watcher, bare
   ``kv_write``), i.e. NOTIFY / PUBLISH / the poll; the board adds a ``kv_get`` per hint.
   "coalesced": versions a watcher never saw because a later one overtook them (allowed).
   Goal (issue 22): p99 <= 10 ms on Redis and PostgreSQL.

PostgreSQL and Redis are used when reachable on their usual ports
(``$PERSISTKIT_BENCH_POSTGRES`` / ``$PERSISTKIT_BENCH_REDIS`` override); S3 is moto's
server in a subprocess (times are informational: moto is not S3). A store without the
``kv`` capability is skipped, saying so. The watches of one board in a process share one
feed of the store (one LISTEN connection on PostgreSQL, one subscription on Redis, one poll
on SQLite and S3), so 100 watchers in 10 processes are 10 feeds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import _env  # noqa: F401 -- first: a missing package says how to run this script

import persistkit as pk
from persistkit.backends._protocol import KvOp

HERE = Path(__file__).resolve()
POSTGRES = os.environ.get("PERSISTKIT_BENCH_POSTGRES", "postgresql://127.0.0.1:5432/test")
REDIS = os.environ.get("PERSISTKIT_BENCH_REDIS", "redis://127.0.0.1:6379/0")
BUCKET = "persistkit-bench"


# --- stores ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 server in its own process on a free loopback port (as tests/conftest.py)."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.05)
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        endpoint = f"http://127.0.0.1:{port}"
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def urls(names: list[str], tmp: Path, stack: ExitStack) -> dict[str, str]:
    out: dict[str, str] = {}
    tag = uuid.uuid4().hex[:8]
    for name in names:
        if name == "memory":
            out[name] = f"memory://bench-{tag}"
        elif name == "sqlite":
            out[name] = f"sqlite:///{tmp}/bench-{tag}.db"
        elif name == "postgres":
            out[name] = f"{POSTGRES}?schema=pkbench_board_{tag}"
        elif name == "redis":
            out[name] = f"{REDIS}?volatile=true&prefix=pkbench:{tag}:"
        elif name == "s3":
            try:
                endpoint = stack.enter_context(moto_server())
            except (ImportError, RuntimeError) as exc:
                print(f"  skipped s3: {exc}")
                continue
            out[name] = f"s3://{BUCKET}/{tag}?endpoint_url={endpoint}"
    return out


def usable(name: str, url: str) -> bool:
    try:
        with pk.connect(url) as store:
            if not store.backend.supports_kv:
                print(f"  skipped {name}: the store has no 'kv' capability")
                return False
        return True
    except pk.PersistkitError as exc:
        print(f"  skipped {name}: {exc}")
        return False


def drop_postgres_schema(url: str) -> None:
    import psycopg

    schema = url.split("schema=", 1)[1]
    with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(HERE), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# --- 1. claims -------------------------------------------------------------------------------


def claimer(url: str, board_name: str, go: Callable[[], None]) -> dict[str, float]:
    """Claim and complete until nothing is left; the count and when the last one finished."""
    store = pk.connect(url)
    board = store.board(board_name)
    board.list("tasks/", limit=1)  # warm: connections, schema
    go()
    n = 0
    while (claim := board.claim("tasks/", f"c{os.getpid()}-{threading.get_ident()}", lease_ttl=60)) is not None:
        claim.complete(results=None)
        n += 1
    end = time.time()
    store.close()
    return {"n": n, "end": end}


def seed(board: pk.Board, items: int) -> None:
    for start in range(0, items, 50):
        with board.batch() as b:
            for i in range(start, min(start + 50, items)):
                b.put(f"tasks/item-{i:05d}", {"n": i})


def primitive_items_per_s(store: pk.Store, items: int) -> float:
    """The floor: per item, the claim's compare-and-swap and the delete, as bare kv_write."""
    backend, scope = store.backend, f"floor-{uuid.uuid4().hex[:8]}"
    for i in range(items):
        backend.kv_write(scope, [KvOp(f"tasks/{i}", 0, b"item")], keep=10)
    t0 = time.perf_counter()
    for i in range(items):
        backend.kv_write(scope, [KvOp(f"tasks/{i}", 1, b"claimed")], keep=10)
        backend.kv_write(scope, [KvOp(f"tasks/{i}", 2, None)], keep=10)
    elapsed = time.perf_counter() - t0
    backend.kv_drop(scope)
    return items / elapsed


def run_claimers(name: str, url: str, board_name: str, count: int) -> tuple[int, float]:
    """(items completed, seconds from the go signal to the last complete)."""
    if name == "memory":  # one process: threads
        ready, start = threading.Barrier(count + 1), threading.Event()
        results: list[dict[str, float]] = []

        def go() -> None:
            ready.wait()
            start.wait()

        threads = [threading.Thread(target=lambda: results.append(claimer(url, board_name, go))) for _ in range(count)]
        for t in threads:
            t.start()
        ready.wait()
        t0 = time.time()
        start.set()
        for t in threads:
            t.join()
    else:
        procs = [child("--claimer", url, board_name) for _ in range(count)]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        t0 = time.time()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        failed = [p.returncode for p in procs if p.returncode]
        if failed:
            raise RuntimeError(f"{len(failed)} claimer processes failed")
    return int(sum(r["n"] for r in results)), max(r["end"] for r in results) - t0


def bench_claims(stores: dict[str, str], items: int, claimers: list[int]) -> None:
    print(f"\n1. claim throughput: {items} items, claim -> complete until none is left (items/s)")
    print("   floor: one process, the two bare kv_write round trips an item needs (claim CAS + delete)")
    head = "".join(f" {f'{c} claimer' + ('s' if c > 1 else ''):>12}" for c in claimers)
    print(f"   {'store':<9} {'floor':>9}{head} {'1 / floor':>10} {f'{claimers[-1]} / 1':>8}")
    for name, url in stores.items():
        store = pk.connect(url)
        n = max(50, items // 5) if name == "s3" else items
        floor = primitive_items_per_s(store, n)
        rates: list[float] = []
        for count in claimers:
            board = store.board(f"claims-{count}-{uuid.uuid4().hex[:6]}")
            seed(board, n)
            done, elapsed = run_claimers(name, url, board.name, count)
            left = len(board.list("tasks/"))
            if done != n or left:
                raise RuntimeError(f"{name}: {done} of {n} items completed, {left} left")
            rates.append(n / elapsed)
            board.clear()
        cols = "".join(f" {r:>12.0f}" for r in rates)
        note = f"   ({n} items on moto)" if n != items else ""
        print(f"   {name:<9} {floor:>9.0f}{cols} {rates[0] / floor:>9.2f}x {rates[-1] / rates[0]:>7.2f}x{note}")
        store.close()


# --- 2. watch latency --------------------------------------------------------------------------


def watch_group(url: str, board_name: str, kind: str, threads: int, last: int, ready: Callable[[], None]) -> list[list[tuple[int, float]]]:
    """``threads`` watchers, each with its own watch; every (version, delivery time) each saw,
    until it saw version ``last`` (or a minute went by)."""
    store = pk.connect(url)
    board = store.board(board_name)
    watches: list[Any] = [board.watch("lat/*") if kind == "board" else store.backend.watch_open(board_name) for _ in range(threads)]
    got: list[list[tuple[int, float]]] = [[] for _ in range(threads)]

    def run(i: int) -> None:
        watch, deadline = watches[i], time.monotonic() + 60
        while time.monotonic() < deadline and not (got[i] and got[i][-1][0] >= last):
            if kind == "board":
                change = watch.next(timeout=0.5)
                if change is not None:
                    got[i].append((change.version, time.time()))
            else:
                now = None
                for hint in watch.hints(0.5):
                    now = now or time.time()
                    if hint.key is not None:
                        got[i].append((hint.version, now))

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    ready()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for watch in watches:
        watch.close()
    store.close()
    return got


def measure_watch(name: str, url: str, kind: str, watchers: int, writes: int) -> tuple[list[float], int]:
    """(latencies in seconds, versions coalesced away)."""
    store = pk.connect(url)
    board = store.board(f"lat-{uuid.uuid4().hex[:8]}")
    board.put("lat/k", -1)  # the key exists: every watch then starts from version 1
    first, last = 2, writes + 1
    procs: list[subprocess.Popen[str]] = []
    results: list[list[tuple[int, float]]] = []
    if name == "memory":
        ready = threading.Barrier(2)
        runner = threading.Thread(target=lambda: results.extend(watch_group(url, board.name, kind, watchers, last, ready.wait)))
        runner.start()
        ready.wait()
    else:
        groups = min(watchers, 10)
        sizes = [watchers // groups + (1 if i < watchers % groups else 0) for i in range(groups)]
        procs = [child("--watchers", url, board.name, kind, str(size), str(last)) for size in sizes]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    time.sleep(0.2)  # the watchers' threads into their first wait
    issued: dict[int, float] = {}
    for v in range(first, last + 1):
        t = time.time()
        if kind == "board":
            got = board.put("lat/k", v)
        else:
            store.backend.kv_write(board.name, [KvOp("lat/k", v - 1, b"x")], keep=10)
            got = v
        assert got == v, (got, v)
        issued[v] = t
        time.sleep(random.uniform(0.01, 0.03))
    if name == "memory":
        runner.join()
    else:
        for p in procs:
            results.extend(json.loads(p.communicate()[0].strip().splitlines()[-1]))
            if p.returncode:
                raise RuntimeError(f"a watcher process failed ({p.returncode})")
    latencies, coalesced = [], 0
    for seen in results:
        versions = {v for v, _ in seen if v in issued}
        coalesced += len(issued) - len(versions)
        # every write counts, coalesced or not: it reached the watcher with the first
        # delivery of its version or a later one
        got = sorted((v, at) for v, at in seen if v in issued)
        for v, t in issued.items():
            later = [at for w, at in got if w >= v]
            if later:
                latencies.append(min(later) - t)
    board.clear()
    store.close()
    return latencies, coalesced


def bench_watch(stores: dict[str, str], writes: int, counts: list[int]) -> None:
    print(f"\n2. watch: write-to-delivery latency, {writes} puts of one key 10-30 ms apart (ms)")
    print("   baseline: the store's own hint to one watcher (watch_open -> hints, bare kv_write)")
    print(f"   {'store':<9} {'watchers':>8} {'p50':>8} {'p99':>8} {'coalesced':>10} {'base p50':>9} {'base p99':>9} {'p50/base':>9}")
    for name, url in stores.items():
        base, _ = measure_watch(name, url, "raw", 1, writes)
        b50, b99 = pct(base, 0.5), pct(base, 0.99)
        for count in counts:
            lat, coalesced = measure_watch(name, url, "board", count, writes)
            p50, p99 = pct(lat, 0.5), pct(lat, 0.99)
            print(
                f"   {name:<9} {count:>8} {p50 * 1e3:>8.2f} {p99 * 1e3:>8.2f} {coalesced:>10}"
                f" {b50 * 1e3:>9.2f} {b99 * 1e3:>9.2f} {p50 / b50:>8.2f}x"
            )


# --- main --------------------------------------------------------------------------------------


def child_main(argv: list[str]) -> int:
    """A claimer or a group of watchers, run by the parent as its own process."""

    def ready() -> None:
        print("ready", flush=True)

    if argv[0] == "--claimer":
        url, board_name = argv[1:3]

        def go() -> None:
            ready()
            sys.stdin.readline()

        print(json.dumps(claimer(url, board_name, go)), flush=True)
        return 0
    url, board_name, kind, threads, last = argv[1:6]
    print(json.dumps(watch_group(url, board_name, kind, int(threads), int(last), ready)), flush=True)
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("--claimer", "--watchers"):
        return child_main(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=500)
    ap.add_argument("--claimers", default="1,16")
    ap.add_argument("--writes", type=int, default=100)
    ap.add_argument("--watchers", default="1,10,100")
    ap.add_argument("--stores", default="memory,sqlite,postgres,redis,s3")
    ap.add_argument("--skip-claims", action="store_true")
    ap.add_argument("--skip-watch", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        stores = {n: u for n, u in urls(args.stores.split(","), Path(tmp), stack).items() if usable(n, u)}
        try:
            if not args.skip_claims:
                bench_claims(stores, args.items, [int(c) for c in args.claimers.split(",")])
            if not args.skip_watch:
                bench_watch(stores, args.writes, [int(c) for c in args.watchers.split(",")])
        finally:
            if "postgres" in stores:
                drop_postgres_schema(stores["postgres"])
            if "redis" in stores:
                import redis

                client = redis.Redis.from_url(REDIS)
                prefix = stores["redis"].split("prefix=", 1)[1]
                keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
                for i in range(0, len(keys), 500):
                    client.delete(*keys[i : i + 500])
                client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
