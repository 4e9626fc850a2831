"""Per-step write cost of the Redis store vs a raw SET of the same bytes, same server, same run.

    /tmp/pkvenv/bin/python bench/redis_write.py [redis://127.0.0.1:6379/0] [--steps 200]

Workload per step: one checkpoint with a 300-byte payload and one new 1 KB blob
(the "200 steps x 1 KB appended" workload), written with the head CAS. The
baseline SETs the same 1.3 KB per step under its own key. Prints microseconds
per step, the ratio, and the bytes Redis reports (MEMORY USAGE) for each. All
keys live under a unique prefix and are deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid

import redis

from persistkit.backends import CheckpointRow
from persistkit.backends.redis import RedisBackend


def _memory(client: redis.Redis, pattern: str) -> tuple[int, int]:
    keys = list(client.scan_iter(match=pattern, count=1000))
    return len(keys), sum(int(client.memory_usage(k, samples=0) or 0) for k in keys)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url", nargs="?", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    raw = redis.Redis.from_url(args.url)
    tag = uuid.uuid4().hex[:10]
    payload, blob = os.urandom(300), os.urandom(1024)

    def run_store(prefix: str) -> float:
        b = RedisBackend.from_url(f"{args.url}?volatile=true&prefix={prefix}")
        b.head("warm-up", "")
        parent = None
        t0 = time.perf_counter()
        for i in range(1, args.steps + 1):
            cid = f"{i:012d}"
            b.write(CheckpointRow("bench", "", cid, parent, "run-1", payload), {f"seg:{i:06d}": blob}, i - 1)
            parent = cid
        elapsed = time.perf_counter() - t0
        b.close()
        return elapsed / args.steps * 1e6

    def run_async(prefix: str) -> float:
        b = RedisBackend.from_url(f"{args.url}?volatile=true&prefix={prefix}")

        async def go() -> float:
            await b.ahead("warm-up", "")
            parent = None
            t0 = time.perf_counter()
            for i in range(1, args.steps + 1):
                cid = f"{i:012d}"
                row = CheckpointRow("bench", "", cid, parent, "run-1", payload)
                await b.awrite(row, {f"seg:{i:06d}": blob}, i - 1)
                parent = cid
            return (time.perf_counter() - t0) / args.steps * 1e6

        us = asyncio.run(go())
        b.close()
        return us

    def run_raw(prefix: str) -> float:
        raw.ping()
        t0 = time.perf_counter()
        for i in range(1, args.steps + 1):
            raw.set(f"{prefix}{i:06d}", payload + blob)
        return (time.perf_counter() - t0) / args.steps * 1e6

    store_us, async_us, raw_us = [], [], []
    prefixes = []
    try:
        for r in range(args.repeat):  # interleaved, medians: both see the same server state
            p = f"pkbench:{tag}:{r}:"
            prefixes.append(p)
            raw_us.append(run_raw(p + "raw:"))
            store_us.append(run_store(p + "store:"))
            async_us.append(run_async(p + "async:"))
        p = prefixes[0]
        n_store, bytes_store = _memory(raw, p + "store:*")
        n_raw, bytes_raw = _memory(raw, p + "raw:*")
        s, a, w = (statistics.median(x) for x in (store_us, async_us, raw_us))
        info = raw.info("server")
        print(f"redis {info['redis_version']} at {args.url}; {args.steps} steps x (300 B payload + 1 KB blob)")
        print(f"raw SET per step          : {w:8.1f} us")
        print(f"RedisBackend.write (sync) : {s:8.1f} us   ratio {s / w:.2f}x")
        print(f"RedisBackend.awrite       : {a:8.1f} us   ratio {a / w:.2f}x")
        print(
            f"bytes (MEMORY USAGE)      : store {bytes_store} B in {n_store} keys "
            f"({bytes_store / args.steps:.0f} B/step), raw SET {bytes_raw} B in {n_raw} keys "
            f"({bytes_raw / args.steps:.0f} B/step), ratio {bytes_store / bytes_raw:.2f}x"
        )
    finally:
        for p in prefixes:
            keys = list(raw.scan_iter(match=p + "*", count=1000))
            if keys:
                raw.delete(*keys)
        raw.close()


if __name__ == "__main__":
    main()
