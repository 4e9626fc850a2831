"""Per-write cost of the PostgreSQL store vs raw psycopg on the same database.

    python bench/pg_write.py [postgresql://127.0.0.1:5432/test] [--writes 200] [--rounds 5]

Workload: ``--writes`` checkpoints on one thread, each with a 300 B payload
and one new 1 KB blob. Baselines write the same bytes into one table:
``INSERT`` + ``commit()`` on a default (transactional) psycopg connection,
and a single autocommit ``INSERT`` (the baseline: the plainest write, on a
connection with the store's settings). Rounds are interleaved and the median
round is reported, with the client's own CPU time per write (``process_time``:
what the driver, pool and store layers cost here, apart from the server) and
the server's (the serving backend's ``/proc/<pid>/schedstat``, when the server
runs on this machine; ``-`` otherwise).
Round trips are counted from libpq's protocol trace (client ``Sync``
messages). Everything runs in a scratch schema, dropped at the end.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from persistkit.backends import CheckpointRow
from persistkit.backends.postgres import PostgresBackend

PAYLOAD = os.urandom(300)
BLOB = os.urandom(1024)


Sample = tuple[float, float, float]  # seconds per write: wall, client CPU, server CPU (nan: unknown)


def server_ns(conn: psycopg.Connection[Any]) -> float:
    """Nanoseconds on CPU of the server process serving ``conn`` (nan if not readable here)."""
    try:
        with open(f"/proc/{conn.info.backend_pid}/schedstat") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return math.nan


def bench_store(url: str, schema: str, writes: int) -> Sample:
    b = PostgresBackend.from_url(f"{url}?schema={schema}")
    t = f"bench-{uuid.uuid4().hex}"
    b.head(t, "")  # warm the connection
    conn = b._sync.access._slot.conn  # type: ignore[union-attr]  # the store's dedicated connection
    assert conn is not None
    srv, start, cpu = server_ns(conn), time.perf_counter(), time.process_time()
    parent = None
    for n in range(writes):
        cid = f"{n + 1:08d}"
        b.write(CheckpointRow(t, "", cid, parent, "run", PAYLOAD), {f"b{n}": BLOB}, n)
        parent = cid
    elapsed, cpu, srv = time.perf_counter() - start, time.process_time() - cpu, server_ns(conn) - srv
    b.close()
    return elapsed / writes, cpu / writes, srv / 1e9 / writes


def bench_raw(url: str, schema: str, writes: int, *, autocommit: bool) -> Sample:
    # the store's connection settings (autocommit, prepared after 5 uses)
    with psycopg.connect(url, autocommit=autocommit, prepare_threshold=5) as conn:
        t = uuid.uuid4().hex
        cur = conn.cursor()
        sql = f'INSERT INTO "{schema}".raw (thread_id, id, payload, blob) VALUES (%s, %s, %s, %s)'.encode()
        srv, start, cpu = server_ns(conn), time.perf_counter(), time.process_time()
        for n in range(writes):
            cur.execute(sql, (t, n, PAYLOAD, BLOB))
            if not autocommit:
                conn.commit()
        elapsed, cpu, srv = time.perf_counter() - start, time.process_time() - cpu, server_ns(conn) - srv
        return elapsed / writes, cpu / writes, srv / 1e9 / writes


def round_trips(url: str, schema: str, writes: int) -> float:
    """Client round trips per store write, from libpq's trace of one connection."""
    conn = psycopg.connect(url)
    b = PostgresBackend.from_connection(conn, schema=schema)
    t = f"rt-{uuid.uuid4().hex}"
    b.write(CheckpointRow(t, "", "00000000", None, None, PAYLOAD), {}, 0)
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        for n in range(writes):
            b.write(
                CheckpointRow(t, "", f"{n + 1:08d}", None, "r", PAYLOAD), {f"b{n}": BLOB}, n + 1
            )
        conn.pgconn.untrace()
        trace.seek(0)
        syncs = sum(1 for line in trace if "\tF\t" in line and "\tSync" in line)
    b.close()
    conn.close()
    return syncs / writes


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url", nargs="?", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    schema = f"pkbench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.url, autocommit=True) as admin:
        PostgresBackend.from_url(f"{args.url}?schema={schema}").close()  # creates the schema
        admin.execute(
            f'CREATE TABLE "{schema}".raw (thread_id text, id int, payload bytea, blob bytea, '
            "PRIMARY KEY (thread_id, id))"
        )
        try:
            cases: dict[str, Callable[[], Sample]] = {
                "persistkit write (1 statement)": lambda: bench_store(
                    args.url, schema, args.writes
                ),
                "raw INSERT + COMMIT": lambda: bench_raw(
                    args.url, schema, args.writes, autocommit=False
                ),
                "raw autocommit INSERT": lambda: bench_raw(
                    args.url, schema, args.writes, autocommit=True
                ),
            }
            results: dict[str, list[Sample]] = {name: [] for name in cases}
            for _ in range(args.rounds):
                for name, case in cases.items():
                    results[name].append(case())
            trips = round_trips(args.url, schema, args.writes)
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
    medians = {
        name: tuple(statistics.median(s[i] for s in samples) * 1e6 for i in (0, 1, 2))
        for name, samples in results.items()
    }
    ours = medians["persistkit write (1 statement)"][0]
    base = medians["raw autocommit INSERT"][0]
    print(f"{args.writes} writes x {args.rounds} rounds, 300 B payload + 1 KB blob, median round")
    for name, (us, cpu, srv) in medians.items():
        server = "-" if math.isnan(srv) else f"{srv:6.1f}"
        print(
            f"  {name:32s} {us:8.1f} us/write   {us / base:.2f}x the autocommit INSERT   "
            f"client CPU {cpu:6.1f}   server CPU {server} us/write"
        )
    print(f"  persistkit write / autocommit INSERT: {ours / base:.2f}x")
    print(f"  round trips per persistkit write: {trips:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
