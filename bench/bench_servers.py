"""persistkit on PostgreSQL, Redis and S3 against raw writes and peers, in one run.

    python3 dev.py bench servers [--rounds 5]
    .venv/bin/python bench/bench_servers.py [--rounds 5]   (a venv with pip install -e '.[bench]')

Workload (as bench_sqlite.py, whose ``messages``/``Chat``/``append_step`` it
reuses): an agent of 200 steps, each appending a 1 KB message to the state, in
one persistkit run. Server stores:

- PostgreSQL (``$PERSISTKIT_TEST_POSTGRES`` or 127.0.0.1:5432/test): persistkit
  vs the plainest baseline, ONE autocommit INSERT per step of the very bytes
  persistkit wrote for that step (its row payload and blobs, captured from an
  untimed run) into a table keyed by (thread, sequence), on a connection with
  persistkit's settings (autocommit, prepare_threshold=5) — target <= 1.2x;
  INSERT+COMMIT on a transactional connection is shown for information; vs
  LangGraph's PostgresSaver (a node looping 200 times) and vs DBOS (a workflow
  of 200 ``@DBOS.step`` calls returning the message), each in its own scratch
  schema of the same database. Rounds are interleaved; medians shown.
  Round trips per step come from libpq's protocol trace (client Sync/Query).
  Where a step's time goes: client CPU (``time.process_time``), server CPU
  (the serving backend process's ``/proc/<pid>/schedstat``, when the server
  runs on this machine) and the rest, waiting (commit flush, network, the
  scheduler). ``PGOPTIONS='-c synchronous_commit=off'`` models a server with
  fast commits for every connection alike.
- Redis (``$PERSISTKIT_TEST_REDIS`` or 127.0.0.1:6379/0): vs a raw SET of the
  same bytes per step, under a unique key prefix.
- S3: moto's server in a subprocess on a free loopback port (as the tests do);
  requests per step counted with a botocore event hook; times are informational
  (moto is not S3).
- Bytes stored per backend for one 200-step run vs the appended content, and a
  5 MB tool output on PostgreSQL with ``blobs=s3://...``: bytes in each store.

Everything it creates (schemas, Redis keys, the moto process) is removed at
the end. Benchmark-only packages: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import argparse
import base64
import json
import operator
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import _env  # noqa: F401 -- first: a missing package says how to run this script
import psycopg
import redis
from bench_sqlite import Chat, append_step, base64_texts, messages
from bench_sqlite import bench_persistkit as bench_sqlite_persistkit

import persistkit as pk
from persistkit.backends.postgres import PostgresBackend

STEPS = 200
PG_URL = os.environ.get("PERSISTKIT_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test")
REDIS_URL = os.environ.get("PERSISTKIT_TEST_REDIS", "redis://127.0.0.1:6379/0")
TAG = uuid.uuid4().hex[:8]
BUCKET = f"pkbench-{TAG}"
BIG_TOOL_OUTPUT = 5 * 1024 * 1024


def payloads(msgs: list[dict[str, str]]) -> list[bytes]:
    return [json.dumps(m).encode() for m in msgs]


# --- measuring helpers ----------------------------------------------------------------


def schema_bytes(admin: psycopg.Connection[Any], schema: str) -> int:
    """Heap + TOAST + indexes of every table in ``schema`` (pg_total_relation_size)."""
    row = admin.execute(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'm')",
        (schema,),
    ).fetchone()
    return int(row[0]) if row else 0


@contextmanager
def traced(conns: list[psycopg.Connection[Any]]) -> Iterator[list[int]]:
    """Count client round trips (Sync or simple Query messages) on ``conns``."""
    out = [0]
    with tempfile.TemporaryFile("w+") as trace:
        for c in conns:
            c.pgconn.trace(trace.fileno())
        try:
            yield out
        finally:
            for c in conns:
                c.pgconn.untrace()
        trace.flush()
        trace.seek(0)
        out[0] = sum(1 for line in trace if "\tF\t" in line and ("\tSync" in line or "\tQuery\t" in line))


def redis_bytes(client: redis.Redis, prefix: str) -> tuple[int, int]:
    keys = list(client.scan_iter(match=prefix + "*", count=1000))
    return len(keys), sum(int(client.memory_usage(k, samples=0) or 0) for k in keys)


def s3_bytes(client: Any, prefix: str) -> tuple[int, int]:
    n = size = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for obj in page.get("Contents", []):
            n += 1
            size += int(obj["Size"])
    return n, size


def server_cpu(conn: psycopg.Connection[Any]) -> int | None:
    """Nanoseconds the server process serving ``conn`` has spent on a CPU, or None
    when it is not readable from here (a remote server)."""
    try:
        with open(f"/proc/{conn.info.backend_pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class Costs:
    """Per-step client CPU and server CPU of each timed run of one subject."""

    def __init__(self) -> None:
        self.cpu: list[float] = []
        self.server: list[float] = []

    def measure(self, conn: psycopg.Connection[Any] | None, steps: int, body: Callable[[], float]) -> float:
        s0 = server_cpu(conn) if conn is not None else None
        c0 = time.process_time()
        wall = body()
        self.cpu.append((time.process_time() - c0) / steps)
        s1 = server_cpu(conn) if conn is not None else None
        if s0 is not None and s1 is not None:
            self.server.append((s1 - s0) / 1e9 / steps)
        return wall

    def medians(self) -> tuple[float, float | None]:
        return statistics.median(self.cpu), statistics.median(self.server) if self.server else None


class WriteTimer:
    """Wraps the store's backend writes to split a step into the store's write and the rest,
    and keeps the bytes each write stored (row payload and blobs) of the last run.

    Both ``write`` and ``write_fenced`` are wrapped: a run under a lease (the default
    ``busy="queue"``) commits through ``write_fenced``, one without through ``write``.
    A backend whose ``write_fenced`` calls its own ``write`` is timed once per commit."""

    def __init__(self, store: pk.Store) -> None:
        backend = store.backend
        self.total, self.calls = 0.0, 0
        self.per_run: list[float] = []
        self.written: list[bytes] = []
        depth = [0]

        def timed(inner: Callable[..., Any]) -> Callable[..., Any]:
            def write(row: Any, blobs: Any, expected: int, *fence: int) -> Any:
                if depth[0]:  # called by the outer write we are already timing
                    return inner(row, blobs, expected, *fence)
                self.written.append(row.payload + b"".join(blobs.values()))
                depth[0] += 1
                t0 = time.perf_counter()
                try:
                    return inner(row, blobs, expected, *fence)
                finally:
                    self.total += time.perf_counter() - t0
                    self.calls += 1
                    depth[0] -= 1

            return write

        backend.write = timed(backend.write)  # type: ignore[method-assign]
        backend.write_fenced = timed(backend.write_fenced)  # type: ignore[method-assign]

    def mark(self) -> None:
        """End of one run: record its mean write time per call."""
        if self.calls:
            self.per_run.append(self.total / self.calls)
        self.total, self.calls = 0.0, 0

    def median(self) -> float:
        if not self.per_run:
            raise RuntimeError("no write went through the wrapped backend: nothing to split")
        return statistics.median(self.per_run)


def run_persistkit(store: pk.Store, msgs: list[dict[str, str]], thread: str) -> float:
    """Mean seconds per step of one 200-step run (as bench_sqlite measures it)."""
    times: list[float] = []
    with pk.resume(thread, store=store, state=Chat):
        for m in msgs:
            t0 = time.perf_counter()
            append_step(m)
            times.append(time.perf_counter() - t0)
    return statistics.mean(times)


# --- PostgreSQL subjects ------------------------------------------------------------------


class PgRaw:
    """One INSERT per step of the bytes persistkit wrote for that step: autocommit (the
    baseline), or INSERT + COMMIT on a transactional connection (informational)."""

    def __init__(self, schema: str, data: list[bytes], *, autocommit: bool, spin: float = 0.0) -> None:
        self.schema, self.data, self.autocommit, self.spin = schema, data, autocommit, spin
        self.kind = ("log_ac" if autocommit else "log_tx") + ("_spin" if spin else "")
        # persistkit's own connection settings (backends/_postgres_async.py, AsyncAccess)
        self.conn = psycopg.connect(PG_URL, autocommit=autocommit, prepare_threshold=5)
        self.costs = Costs()
        self.n = 0

    def table(self) -> str:
        self.n += 1
        name = f'"{self.schema}".{self.kind}_{self.n}'
        with psycopg.connect(PG_URL, autocommit=True) as c:
            c.execute(f"CREATE TABLE {name} (thread text, seq int, data bytea, PRIMARY KEY (thread, seq))")
        return name

    def run(self) -> float:
        table = self.table()
        sql = f"INSERT INTO {table} VALUES (%s, %s, %s)".encode()
        cur = self.conn.cursor()

        def body() -> float:
            t0 = time.perf_counter()
            for i, d in enumerate(self.data):
                if self.spin:  # a client that works between writes, as an agent does
                    until = time.perf_counter() + self.spin
                    while time.perf_counter() < until:
                        pass
                cur.execute(sql, ("t", i, d))
                if not self.autocommit:
                    self.conn.commit()
            return (time.perf_counter() - t0) / len(self.data)

        return self.costs.measure(self.conn, len(self.data), body)

    def bytes_of_last(self, admin: psycopg.Connection[Any]) -> int:
        name = f'"{self.schema}".{self.kind}_{self.n}'
        return int(admin.execute("SELECT pg_total_relation_size(%s::regclass)", (name,)).fetchone()[0])  # type: ignore[index]

    def round_trips(self) -> float:
        table = self.table()
        with traced([self.conn]) as n:
            for i, d in enumerate(self.data):
                self.conn.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", ("t", i, d))
                if not self.autocommit:
                    self.conn.commit()
        return n[0] / len(self.data)

    def close(self) -> None:
        self.conn.close()


class PgPersistkit:
    def __init__(self, schema: str, msgs: list[dict[str, str]]) -> None:
        self.schema, self.msgs = schema, msgs
        self.store = pk.connect(f"{PG_URL}?schema={schema}")
        self.timer = WriteTimer(self.store)
        self.costs = Costs()
        self.n = 0

    def run(self) -> float:
        self.n += 1
        self.timer.written.clear()
        access = self.store.backend._sync.access  # type: ignore[attr-defined]
        conn = access._slot.conn if access._slot is not None else None  # the dedicated connection
        per_step = self.costs.measure(
            conn, len(self.msgs), lambda: run_persistkit(self.store, self.msgs, f"t{self.n}")
        )
        self.timer.mark()
        return per_step

    def step_bytes(self) -> list[bytes]:
        """What the last run's step writes stored (the end record left out)."""
        return self.timer.written[: len(self.msgs)]

    def round_trips(self) -> float:
        conn = psycopg.connect(PG_URL)
        store = pk.connect(PostgresBackend.from_connection(conn, schema=self.schema))
        thread = f"rt-{uuid.uuid4().hex[:8]}"
        warm = 10  # psycopg prepares a statement on its 5th use: one extra round trip, once
        with pk.resume(thread, store=store, state=Chat):
            for m in self.msgs[:warm]:
                append_step(m)
            with traced([conn]) as n:
                for m in self.msgs[warm:]:
                    append_step(m)
        store.close()
        conn.close()
        return n[0] / (len(self.msgs) - warm)

    def close(self) -> None:
        self.store.close()


class PgLangGraph:
    def __init__(self, schema: str, msgs: list[dict[str, str]]) -> None:
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.graph import END, START, StateGraph
        from psycopg.rows import dict_row
        from typing_extensions import TypedDict

        class S(TypedDict):
            messages: Annotated[list[dict[str, str]], operator.add]
            i: int

        def node(state: S) -> dict[str, Any]:
            return {"messages": [msgs[state["i"]]], "i": state["i"] + 1}

        g = StateGraph(S)
        g.add_node("step", node)
        g.add_edge(START, "step")
        g.add_conditional_edges("step", lambda s: END if s["i"] >= len(msgs) else "step")
        self.schema = schema
        with psycopg.connect(PG_URL, autocommit=True) as c:
            c.execute(f'CREATE SCHEMA "{schema}"')
        # PostgresSaver.from_conn_string's connection settings, plus our scratch schema.
        self.conn = psycopg.connect(
            PG_URL, autocommit=True, prepare_threshold=0, row_factory=dict_row,
            options=f"-c search_path={schema}",
        )
        saver = PostgresSaver(self.conn)
        saver.setup()
        self.app = g.compile(checkpointer=saver)
        self.steps, self.n = len(msgs), 0

    def _invoke(self) -> None:
        self.n += 1
        cfg = {"configurable": {"thread_id": f"t{self.n}"}, "recursion_limit": 10 * self.steps}
        self.app.invoke({"messages": [], "i": 0}, cfg)  # type: ignore[arg-type]

    def run(self) -> float:
        t0 = time.perf_counter()
        self._invoke()
        return (time.perf_counter() - t0) / self.steps

    def round_trips(self) -> float:
        with traced([self.conn]) as n:
            self._invoke()
        return n[0] / self.steps

    def close(self) -> None:
        self.conn.close()


class PgDBOS:
    """A DBOS workflow of 200 @DBOS.step calls, each returning the 1 KB message."""

    def __init__(self, schema: str, msgs: list[dict[str, str]]) -> None:
        import logging

        import sqlalchemy as sa
        from dbos import DBOS, SetWorkflowID

        self.schema = schema
        self.dbapi: list[psycopg.Connection[Any]] = []
        sa.event.listen(sa.engine.Engine, "connect", lambda c, _r: self.dbapi.append(c))
        sys_url = PG_URL.replace("postgresql://", "postgresql+psycopg://", 1)
        DBOS(config={
            "name": f"pkbench-{TAG}", "system_database_url": sys_url,
            "dbos_system_schema": schema, "log_level": "ERROR",
        })
        logging.getLogger("dbos").setLevel(logging.ERROR)

        @DBOS.step()
        def dbos_step(i: int) -> dict[str, str]:
            return msgs[i]

        @DBOS.workflow()
        def dbos_agent(n: int) -> int:
            return len([dbos_step(i) for i in range(n)])

        DBOS.launch()
        self.DBOS, self.SetWorkflowID, self.wf = DBOS, SetWorkflowID, dbos_agent
        self.steps, self.n = len(msgs), 0

    def _invoke(self) -> None:
        self.n += 1
        with self.SetWorkflowID(f"wf-{TAG}-{self.n}"):
            assert self.wf(self.steps) == self.steps

    def run(self) -> float:
        t0 = time.perf_counter()
        self._invoke()
        return (time.perf_counter() - t0) / self.steps

    def round_trips(self) -> float:
        with traced(list(self.dbapi)) as n:
            self._invoke()
        return n[0] / self.steps

    def close(self) -> None:
        self.DBOS.destroy(destroy_registry=True)


# --- S3 (moto server) ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


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
        while not _port_open(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("moto server did not start")
            time.sleep(0.05)
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


class ToolState(pk.State, name="bench.ToolState"):
    output: str = ""


@pk.checkpointed(name="tool")
def big_tool(output: str) -> None:
    run = pk.current_run()
    assert run is not None
    run.state.output = output


class ToolLog(pk.State, name="bench.ToolLog"):
    outputs: list[str] = []


@pk.checkpointed(name="tool_call")
def tool_call(output: str) -> str:
    return output


# --- the run --------------------------------------------------------------------------------


def interleave(cases: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Run every case once per round, in the same order each round; median per case."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, case in cases.items():
            samples[name].append(case())
    return {name: statistics.median(v) for name, v in samples.items()}


def row(label: str, per_step: float, ratio: float | None, trips: str, stored: int, content: int) -> str:
    r = f"{ratio:>8.2f}x" if ratio is not None else f"{'-':>9}"
    return f"  {label:<36}{per_step * 1e6:>9.0f}µs{r}{trips:>12}{stored:>14,}{stored / content:>9.2f}x"


def header(title: str, trips: str) -> None:
    print(f"\n{title}")
    print(f"  {'':<36}{'per step':>11}{'ratio':>9}{trips:>12}{'bytes stored':>14}{'÷ content':>10}")


def split(where: str, per_step: float, write: float, floor_name: str, floor: float) -> None:
    """Where a persistkit step's time goes: the store's one write vs everything else."""
    print(f"  persistkit step on {where} = backend.write {write * 1e6:.0f}µs "
          f"({write / floor:.2f}x {floor_name}) + engine {(per_step - write) * 1e6:.0f}µs "
          "(state diff, serialize, compress, hash, bookkeeping)")


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median shown)")
    args = parser.parse_args()
    started = time.perf_counter()
    msgs = messages(STEPS)
    data = payloads(msgs)
    content = sum(len(m["content"]) for m in msgs)
    targets: list[tuple[str, bool]] = []
    notes: list[str] = []
    schemas: list[str] = []
    rkeys = redis.Redis.from_url(REDIS_URL)
    rprefix = f"pkbench:{TAG}:"
    print(f"{STEPS} steps, each appending a 1 KB message ({content:,} bytes of content); "
          f"median of {args.rounds} interleaved rounds")

    admin = psycopg.connect(PG_URL, autocommit=True)
    try:
        # ---------------- PostgreSQL ----------------
        def scratch(kind: str) -> str:
            s = f"pkbench_{TAG}_{kind}"
            schemas.append(s)
            return s

        raw_schema = scratch("raw")
        admin.execute(f'CREATE SCHEMA "{raw_schema}"')
        pk_pg = PgPersistkit(scratch("pk"), msgs)
        # bytes of one 200-step run each: the first (untimed) run into an empty table/schema;
        # persistkit's also gives the baselines the bytes to insert, step by step
        stored: dict[str, int] = {}
        before = schema_bytes(admin, pk_pg.schema)
        pk_pg.run()
        stored["pk"] = schema_bytes(admin, pk_pg.schema) - before
        step_data = pk_pg.step_bytes()
        raw_ac = PgRaw(raw_schema, step_data, autocommit=True)
        raw_tx = PgRaw(raw_schema, step_data, autocommit=False)
        # Informational: the same INSERT with persistkit's client CPU per step spent spinning
        # before it. On a busy machine a client that works between writes waits longer for
        # each one (its process, and the server's, lose the CPU meanwhile): this row shows
        # how much of the gap that is, apart from anything persistkit does.
        raw_spin = PgRaw(raw_schema, step_data, autocommit=True, spin=pk_pg.costs.cpu[-1])
        subjects: dict[str, Any] = {"raw_ac": raw_ac, "raw": raw_tx, "raw_spin": raw_spin, "pk": pk_pg}
        try:
            subjects["lg"] = PgLangGraph(scratch("lg"), msgs)
        except ImportError as exc:
            notes.append(f"LangGraph PostgresSaver skipped: {exc} "
                         "(pip install langgraph langgraph-checkpoint-postgres)")
        dbos_version = ""
        try:
            from importlib.metadata import version

            dbos_version = version("dbos")
            subjects["dbos"] = PgDBOS(scratch("dbos"), msgs)
        except Exception as exc:  # not installed, or it cannot start here: say why
            notes.append(f"DBOS skipped: {type(exc).__name__}: {exc}")

        for key, subj in subjects.items():
            if key == "pk":
                continue
            if isinstance(subj, PgRaw):
                subj.run()
                stored[key] = subj.bytes_of_last(admin)
            else:
                before = schema_bytes(admin, subj.schema)
                subj.run()
                stored[key] = schema_bytes(admin, subj.schema) - before
        assert len(pk_pg.store.history("t1")) == STEPS + 1
        for subj in (raw_ac, raw_tx, raw_spin, pk_pg):  # the first runs above were untimed
            subj.costs.cpu.clear()
            subj.costs.server.clear()
        pg = interleave({k: s.run for k, s in subjects.items()}, args.rounds)
        trips = {k: s.round_trips() for k, s in subjects.items()}
        for s in subjects.values():
            s.close()

        base = pg["raw_ac"]
        labels = {
            "raw_ac": "(a) raw autocommit INSERT, same bytes",
            "raw": "(a') raw INSERT+COMMIT (info)",
            "raw_spin": "(a'') (a) after pk's client CPU (info)",
            "pk": "(b) persistkit, PostgreSQL",
            "lg": "(c) LangGraph PostgresSaver",
            "dbos": f"(d) DBOS {dbos_version}",
        }
        header("PostgreSQL (same database; own schema each)", "trips/step")
        for k in subjects:
            print(row(labels[k], pg[k], pg[k] / base, f"{trips[k]:.2f}", stored[k], content))
        split("PostgreSQL", pg["pk"], pk_pg.timer.median(), "the raw autocommit INSERT", pg["raw_ac"])
        print("  where a step goes: client CPU (process_time) + server CPU (its backend's schedstat) + waiting")
        for k, subj in (("raw_ac", raw_ac), ("raw_spin", raw_spin), ("pk", pk_pg)):
            cpu, srv = subj.costs.medians()
            wait = pg[k] - cpu - (srv or 0.0)
            print(f"    {labels[k]:<38} {pg[k] * 1e6:6.0f}µs = client {cpu * 1e6:4.0f}µs + server "
                  + (f"{srv * 1e6:4.0f}µs" if srv is not None else " n/a (remote)") + f" + waiting {wait * 1e6:4.0f}µs")
        sizes = admin.execute(
            f'SELECT (SELECT avg(octet_length(payload)) FROM "{pk_pg.schema}".checkpoints WHERE thread_id = %s), '
            f'(SELECT sum(octet_length(data)) FROM "{pk_pg.schema}".blobs WHERE thread_id = %s)',
            ("t1", "t1"),
        ).fetchone()
        assert sizes is not None
        blob_bytes = int(sizes[1] or 0) / STEPS  # appended items travel inside the row
        print(f"  persistkit writes per step: checkpoint row payload {float(sizes[0]):.0f} B + "
              f"blobs {blob_bytes:.0f} B + head update (raw: {len(data[0])} B)")
        # Incompressible messages (base64 of random bytes): bytes stored by one 200-step
        # run (its tables' growth: heap, TOAST, indexes) against the content and against
        # the raw table holding the same bytes persistkit wrote.
        b64 = [{"role": m["role"], "content": t} for m, t in zip(msgs, base64_texts(STEPS), strict=True)]
        b64_content = sum(len(m["content"]) for m in b64)
        pk64 = PgPersistkit(scratch("pk64"), b64)
        before = schema_bytes(admin, pk64.schema)
        pk64.run()
        pk64_bytes = schema_bytes(admin, pk64.schema) - before
        raw64 = PgRaw(raw_schema, pk64.step_bytes(), autocommit=True)
        raw64.kind = "log_b64"
        raw64.run()
        raw64_bytes = raw64.bytes_of_last(admin)
        pk64.close()
        raw64.close()
        print(f"  incompressible 1 KB messages: persistkit stores {pk64_bytes:,} B "
              f"({pk64_bytes / b64_content:.2f}x the content; the raw table of the same bytes "
              f"{raw64_bytes:,} B, {raw64_bytes / b64_content:.2f}x)")
        targets.append((f"PostgreSQL bytes ≤ 1.6x the raw table's, incompressible messages "
                        f"({pk64_bytes / raw64_bytes:.2f}x)", pk64_bytes / raw64_bytes <= 1.6))
        pk_ratio = pg["pk"] / base
        targets.append((f"PostgreSQL per step ≤ 1.2x one autocommit INSERT of its bytes ({pk_ratio:.2f}x)",
                        pk_ratio <= 1.2))
        targets.append((f"PostgreSQL: 1 round trip per step ({trips['pk']:.2f})", round(trips["pk"], 2) <= 1.0))
        for k, name in (("lg", "LangGraph PostgresSaver"), ("dbos", "DBOS")):
            if k in pg:
                print(f"  persistkit is {pg[k] / pg['pk']:.1f}x faster per step than {name} "
                      f"and stores {stored[k] / stored['pk']:.1f}x fewer bytes")

        # ---------------- Redis ----------------
        def redis_raw(prefix: str) -> float:
            rkeys.ping()
            t0 = time.perf_counter()
            for i, d in enumerate(data):
                rkeys.set(f"{prefix}{i:06d}", d)
            return (time.perf_counter() - t0) / len(data)

        pk_redis = pk.connect(f"{REDIS_URL}?volatile=true&prefix={rprefix}pk:")
        redis_timer = WriteTimer(pk_redis)
        rn = [0]

        def redis_pk() -> float:
            rn[0] += 1
            per_step = run_persistkit(pk_redis, msgs, f"t{rn[0]}")
            redis_timer.mark()
            return per_step

        # bytes: one untimed 200-step run each, under its own prefix
        redis_raw(f"{rprefix}raw0:")
        pk_once = pk.connect(f"{REDIS_URL}?volatile=true&prefix={rprefix}once:")
        run_persistkit(pk_once, msgs, "t")
        assert len(pk_once.history("t")) == STEPS + 1
        pk_once.close()
        _, raw_b = redis_bytes(rkeys, f"{rprefix}raw0:")
        _, pk_b = redis_bytes(rkeys, f"{rprefix}once:")
        rcount = [0]

        def redis_raw_round() -> float:
            rcount[0] += 1
            return redis_raw(f"{rprefix}raw{rcount[0]}:")

        rr = interleave({"raw": redis_raw_round, "pk": redis_pk}, args.rounds)
        pk_redis.close()
        header(f"Redis {rkeys.info('server')['redis_version']} (MEMORY USAGE)", "")
        print(row("(a) raw SET", rr["raw"], 1.0, "", raw_b, content))
        print(row("(b) persistkit, Redis", rr["pk"], rr["pk"] / rr["raw"], "", pk_b, content))
        split("Redis", rr["pk"], redis_timer.median(), "the raw SET", rr["raw"])

        # ---------------- S3 (moto) + offload ----------------
        try:
            s3_section(msgs, data, content, targets, schemas, admin)
        except Exception as exc:
            notes.append(f"S3 skipped: {type(exc).__name__}: {exc}")

        # ---------------- SQLite, for reference ----------------
        with tempfile.TemporaryDirectory() as d:
            times, sq_bytes, sq_store = bench_sqlite_persistkit(Path(d), msgs)
            sq_store.close()
        header("SQLite, for reference (bench_sqlite.py's persistkit run)", "")
        print(row("(b) persistkit, SQLite", statistics.mean(times), None, "", sq_bytes, content))
    finally:
        for s in schemas:
            admin.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')
        admin.close()
        keys = list(rkeys.scan_iter(match=rprefix + "*", count=1000))
        for i in range(0, len(keys), 500):
            rkeys.delete(*keys[i : i + 500])
        rkeys.close()

    for n in notes:
        print(f"\nnote: {n}")
    print(f"\n(run took {time.perf_counter() - started:.0f} s; scratch schemas, Redis keys and moto removed)\n")
    for label, ok in targets:
        print(f"  [{verdict(ok):>6}] {label}")
    return 0


def s3_section(
    msgs: list[dict[str, str]], data: list[bytes], content: int,
    targets: list[tuple[str, bool]], schemas: list[str], admin: psycopg.Connection[Any],
) -> None:
    import boto3

    with moto_server() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket=BUCKET)

        t0 = time.perf_counter()
        for i, d in enumerate(data):
            client.put_object(Bucket=BUCKET, Key=f"raw/{i:06d}", Body=d)
        raw_step = (time.perf_counter() - t0) / len(data)
        _, raw_b = s3_bytes(client, "raw/")

        store = pk.connect(f"s3://{BUCKET}/pk?endpoint_url={endpoint}")
        requests: list[str] = []
        store.backend._client.meta.events.register(  # type: ignore[attr-defined]
            "before-send.s3.*", lambda event_name, **_: requests.append(event_name)
        )
        times: list[float] = []
        with pk.resume("t", store=store, state=Chat):
            setup = len(requests)
            for m in msgs:
                t1 = time.perf_counter()
                append_step(m)
                times.append(time.perf_counter() - t1)
            in_steps = len(requests) - setup
        total = len(requests)
        assert len(store.history("t")) == STEPS + 1
        store.close()
        n_obj, pk_b = s3_bytes(client, "pk/")
        per_step = statistics.mean(times)
        kinds: dict[str, int] = {}
        for e in requests[setup : setup + in_steps]:
            op = e.rsplit(".", 1)[-1]
            kinds[op] = kinds.get(op, 0) + 1
        header("S3 (moto server over HTTP: times are informational)", "req/step")
        print(row("(a) raw PutObject", raw_step, 1.0, "1.00", raw_b, content))
        print(row("(b) persistkit, S3", per_step, per_step / raw_step, f"{in_steps / STEPS:.2f}", pk_b, content))
        mix = ", ".join(f"{k} {v / STEPS:.2f}" for k, v in sorted(kinds.items()))
        print(f"  persistkit requests per step: {mix}; whole run incl. open/close: {total} "
              f"requests, {n_obj} objects")

        # 5 MB tool output on PostgreSQL with blobs offloaded to S3: kept as a state value,
        # and appended to a list (where tool outputs usually go: inside the step's row)
        big = base64.b64encode(os.urandom(BIG_TOOL_OUTPUT * 3 // 4)).decode()  # incompressible text
        print(f"\nOffload: a {len(big) / 2**20:.1f} MB tool output, pk.connect(postgresql://…, blobs=s3://…)")
        for kind in ("value", "list"):
            schema = f"pkbench_{TAG}_offload_{kind}"
            schemas.append(schema)
            off = pk.connect(f"{PG_URL}?schema={schema}", blobs=f"s3://{BUCKET}/{kind}?endpoint_url={endpoint}")
            before = schema_bytes(admin, schema)
            if kind == "value":
                with pk.resume("t", store=off, state=ToolState):
                    big_tool(big)
                with pk.resume("t", store=off, state=ToolState) as run:
                    assert run.state.output == big
            else:
                with pk.resume("t", store=off, state=ToolLog) as run:
                    run.state.outputs.append(tool_call(big))
                    tool_call("next")  # the appended output travels in this step's row
                with pk.resume("t", store=off, state=ToolLog) as run:
                    assert run.state.outputs == [big]
            off.close()
            inline = admin.execute(
                f'SELECT (SELECT coalesce(sum(octet_length(data)), 0) FROM "{schema}".blobs), '
                f'(SELECT coalesce(sum(octet_length(payload)), 0) FROM "{schema}".checkpoints)'
            ).fetchone()
            assert inline is not None
            pg_total = schema_bytes(admin, schema) - before
            _, s3_b = s3_bytes(client, f"{kind}/")
            where = "in a state value" if kind == "value" else "appended to a list"
            print(f"  {where}: PostgreSQL blob column {inline[0]:,} B + checkpoint rows {inline[1]:,} B "
                  f"(tables incl. indexes/pages: {pg_total:,} B); S3: {s3_b:,} B (compressed)")
            targets.append((f"5 MB output {where} costs PostgreSQL a pointer "
                            f"(blobs + rows {inline[0] + inline[1]:,} B ≤ 4 KB)",
                            inline[0] + inline[1] <= 4096 and s3_b >= len(big) // 2))

if __name__ == "__main__":
    sys.exit(main())
