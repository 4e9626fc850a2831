"""PostgreSQL-specific behaviour the conformance suite cannot see: opening
options, user pools and connections, migrations, faults and multi-process writers.

Each test works in its own schema (dropped afterwards) or on unique thread ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg")
psycopg_pool = pytest.importorskip("psycopg_pool")

from persistkit import (  # noqa: E402
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    ConflictError,
    StoreClosedError,
)
from persistkit.backends import CheckpointRow, Head, open_backend  # noqa: E402
from persistkit.backends.postgres import LATEST_VERSION, PostgresBackend  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _tag() -> str:
    return uuid.uuid4().hex[:10]


def _row(thread: str, n: int, *, parent: str | None = None, payload: bytes = b"p") -> CheckpointRow:
    return CheckpointRow(thread, "", f"{n:08d}", parent, "run", payload)


def _hold_version(blocker: Any, schema: str, thread: str, version: int) -> None:
    """In ``blocker``'s open transaction, insert a row of ``thread`` at head version
    ``version``, as a concurrent writer's uncommitted write: a write of that version
    waits on the version index until the blocker commits or rolls back."""
    blocker.execute(
        f'INSERT INTO "{schema}".checkpoints (thread_id, namespace, checkpoint_id, payload, version) '
        "VALUES (%s, '', 'held', 'x', %s)",
        (thread, version),
    )


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    """A fresh schema name, dropped at teardown."""
    name = f"pkt_{_tag()}"
    yield name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def admin(postgres_url: str) -> Iterator[Any]:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        yield conn


def _url(base: str, schema: str, **params: str) -> str:
    query = "&".join([f"schema={schema}", *(f"{k}={v}" for k, v in params.items())])
    return f"{base}?{query}"


# -- opening ---------------------------------------------------------------------


def test_url_options_are_stripped_and_password_masked(postgres_url: str, schema: str) -> None:
    b = PostgresBackend.from_url(
        _url(postgres_url, schema, min_size="0", max_size="3", timeout="5", connect_timeout="5")
    )
    try:
        t = f"url-{_tag()}"
        assert b.write(_row(t, 1), {}, 0) == Head("00000001", 1)
        assert b.head(t, "") == Head("00000001", 1)
    finally:
        b.close()
    masked = PostgresBackend.from_url(
        "postgresql://u:s3cret@127.0.0.1:1/x?schema=s", migrate=False
    ).url
    assert "s3cret" not in masked and "$CRED{url_password}" in masked  # as errors show it


def test_libpq_query_values_reach_libpq_decoded(postgres_url: str, schema: str) -> None:
    """A percent-encoded space in a libpq option stays a space (urlencode's '+' is a literal '+' to libpq)."""
    b = PostgresBackend.from_url(_url(postgres_url, schema, options="-c%20statement_timeout%3D12345"))
    try:
        b.head(f"opt-{_tag()}", "")
        with b._sync.access.cursor() as cur:
            cur.execute("SHOW statement_timeout")
            assert cur.fetchone()[0] == "12345ms"
    finally:
        b.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pool_size": 3}, "accepted: schema, pgbouncer"),
        ({"pgbouncer": "maybe"}, "pgbouncer"),
        ({"schema": "bad-name;"}, "schema name"),
        ({"min_size": 5, "max_size": 2}, "min_size"),
        ({"timeout": 0}, "timeout"),
    ],
)
def test_bad_options_are_configuration_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        PostgresBackend.from_url("postgresql://127.0.0.1:1/x", migrate=False, **options)


def test_a_refused_connection_at_open_is_transient() -> None:
    # The first connect and the hundredth are the same outage (#34 3: a worker that opened its
    # store while PostgreSQL restarted failed its turn for good): retryable, naming what to check.
    with pytest.raises(BackendError, match=r"cannot connect.*host and port") as info:
        PostgresBackend.from_url("postgresql://127.0.0.1:1/x?connect_timeout=2")
    assert isinstance(info.value, BackendUnavailableError) and info.value.retryable
    assert "may or may not have committed" not in str(info.value)


def test_opened_by_scheme_through_the_registry(postgres_url: str, schema: str) -> None:
    b = open_backend(_url(postgres_url.replace("postgresql:", "postgres:"), schema))
    assert isinstance(b, PostgresBackend) and b.native_async
    b.close()
    with pytest.raises(StoreClosedError):
        b.head("t", "")


def _prepared_count(conn: Any) -> int:
    return int(conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0])


@pytest.mark.parametrize("pgbouncer", [False, True])
def test_pgbouncer_mode_prepares_nothing(postgres_url: str, schema: str, pgbouncer: bool) -> None:
    conn = psycopg.connect(postgres_url)
    b = PostgresBackend.from_connection(conn, schema=schema, pgbouncer=pgbouncer)
    t = f"pgb-{_tag()}"
    for n in range(1, 12):  # past psycopg's prepare threshold (5)
        b.write(_row(t, n), {f"k{n}": b"v"}, n - 1)
        assert b.head(t, "") == Head(f"{n:08d}", n)
    assert (_prepared_count(conn) == 0) is pgbouncer
    b.close()
    assert not conn.closed  # the user's connection stays open
    conn.close()


# -- user pools and connections ----------------------------------------------------


def test_user_sync_pool_keeps_its_settings(postgres_url: str, schema: str) -> None:
    from psycopg.rows import dict_row

    # Not autocommit, dict rows: the store must cope and leave both as they were.
    with psycopg_pool.ConnectionPool(
        postgres_url, min_size=1, max_size=2, kwargs={"row_factory": dict_row}, open=True
    ) as pool:
        b = PostgresBackend(pool=pool, schema=schema)
        t = f"pool-{_tag()}"
        b.write(_row(t, 1), {"a": b"1"}, 0)
        assert b.get_blobs(t, ["a"]) == {"a": b"1"}
        with pool.connection() as conn:
            assert conn.autocommit is False
            assert conn.execute("SELECT 1 AS x").fetchone() == {"x": 1}
        # The async side opens its own pool from the user pool's conninfo.
        assert asyncio.run(b.ahead(t, "")) == Head("00000001", 1)
        b.close()
        assert not pool.closed


def test_user_async_pool(postgres_url: str, schema: str) -> None:
    t = f"apool-{_tag()}"

    async def main() -> None:
        async with psycopg_pool.AsyncConnectionPool(
            postgres_url, min_size=1, max_size=2, open=False
        ) as pool:
            b = PostgresBackend(async_pool=pool, schema=schema)
            assert await b.awrite(_row(t, 1), {"a": b"1"}, 0) == Head("00000001", 1)
            assert await b.aget_blobs(t, ["a"]) == {"a": b"1"}
            assert b.head(t, "") == Head("00000001", 1)  # sync side: its own pool
            await b.aclose()
            assert not pool.closed

    asyncio.run(main())


def test_user_async_connection(postgres_url: str, schema: str) -> None:
    t = f"aconn-{_tag()}"

    async def main() -> None:
        conn = await psycopg.AsyncConnection.connect(postgres_url)
        b = PostgresBackend.from_connection(conn, schema=schema)
        results = await asyncio.gather(
            *(b.awrite(_row(t, 1, payload=bytes([i])), {}, 0) for i in range(3)),
            return_exceptions=True,
        )
        assert sum(isinstance(r, Head) for r in results) == 1, results
        assert (await b.amigrate(check=True)).behind is False
        with pytest.raises(ConfigurationError, match="async"):
            b.head(t, "")
        await b.aclose()
        assert not conn.closed
        await conn.close()

    asyncio.run(main())


def test_user_sync_connection_serves_async_from_a_thread(postgres_url: str, schema: str) -> None:
    with psycopg.connect(postgres_url) as conn:
        b = PostgresBackend.from_connection(conn, schema=schema)
        t = f"sconn-{_tag()}"
        assert asyncio.run(b.awrite(_row(t, 1), {}, 0)) == Head("00000001", 1)
        assert b.list(t, "")[0].checkpoint_id == "00000001"
        b.close()


# -- the store's own connections ---------------------------------------------------


def _sessions(admin: Any, app: str, settled: int | None = None) -> int:
    """Server sessions named ``app``; with ``settled``, waits (10 s at most) for
    that count, as a closed session leaves pg_stat_activity a moment later."""
    deadline = time.monotonic() + 10
    while True:
        n = int(
            admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
            ).fetchone()[0]
        )
        if settled is None or n == settled or time.monotonic() > deadline:
            return n
        time.sleep(0.01)


def test_one_thread_uses_one_dedicated_connection(
    postgres_url: str, schema: str, admin: Any
) -> None:
    app = f"pkded_{_tag()}"
    b = PostgresBackend.from_url(_url(postgres_url, schema, application_name=app), min_size=4)
    t = f"ded-{_tag()}"
    for n in range(10):
        b.write(_row(t, n + 1), {f"b{n}": b"x"}, n)
        assert b.head(t, "") == Head(f"{n + 1:08d}", n + 1)
    # The migration's connection is kept as the dedicated one; no pool was opened.
    assert _sessions(admin, app) == 1
    b.close()
    assert _sessions(admin, app, settled=0) == 0


@pytest.mark.parametrize("max_size", [1, 3])
def test_threads_that_find_it_busy_share_a_pool(
    postgres_url: str, schema: str, admin: Any, max_size: int
) -> None:
    app = f"pkbusy_{_tag()}"
    b = PostgresBackend.from_url(
        _url(postgres_url, schema, application_name=app), max_size=max_size
    )
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def writer(i: int) -> None:
        t = f"busy-{i}-{_tag()}"
        try:
            barrier.wait(timeout=30)
            for n in range(15):
                b.write(_row(t, n + 1), {}, n)
            assert b.head(t, "") == Head(f"{15:08d}", 15)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert errors == []
    assert 1 <= _sessions(admin, app) <= max_size  # the dedicated one + at most max_size - 1
    b.close()
    assert _sessions(admin, app, settled=0) == 0


def test_async_tasks_and_event_loops(postgres_url: str, schema: str, admin: Any) -> None:
    app = f"pkaloop_{_tag()}"
    url = _url(postgres_url, schema, application_name=app)
    t = f"aloop-{_tag()}"
    b = PostgresBackend.from_url(url, max_size=3)

    async def one_task(n: int) -> Head:
        return await b.awrite(_row(t, n + 1), {}, n)

    for k in range(3):  # a new event loop each time: each gets its own connection
        assert asyncio.run(one_task(k)) == Head(f"{k + 1:08d}", k + 1)
    # The connections of ended loops were closed when the next loop took over.
    assert _sessions(admin, app, settled=2) == 2  # the sync side's (migration) + the last loop's
    b.close()
    assert _sessions(admin, app, settled=0) == 0

    async def concurrent() -> None:
        c = PostgresBackend.from_url(url, max_size=3)
        # Tasks that find the loop's connection busy take the loop's pool.
        heads = await asyncio.gather(*(c.ahead(f"{t}-{i}", "") for i in range(8)))
        assert heads == [None] * 8
        assert await c.ahead(t, "") == Head("00000003", 3)
        await c.aclose()

    asyncio.run(concurrent())
    assert _sessions(admin, app, settled=0) == 0


class _StallingProxy:
    """A TCP proxy to the server that forwards its first ``forward`` connections and
    accepts later ones without ever answering: a connect that never completes."""

    def __init__(self, target: tuple[str, int], forward: int) -> None:
        import socket

        self._socket = socket
        self._target, self._left = target, forward
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[Any] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self._left <= 0:
                self.held.append(client)  # never answered
                continue
            self._left -= 1
            server = self._socket.create_connection(self._target)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: Any, dst: Any) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()

    def close(self) -> None:
        self.listener.close()
        for s in self.held:
            s.close()


def test_a_loop_that_ends_while_a_spare_connection_connects_ends(
    postgres_url: str, schema: str
) -> None:
    """asyncio.run() returns although a task of it was still connecting a spare
    connection (psycopg_pool's async pool, connecting in a background task, made
    the loop's shutdown wait for its retries forever)."""
    from urllib.parse import urlsplit

    parts = urlsplit(postgres_url)
    PostgresBackend.from_url(_url(postgres_url, schema)).close()  # tables made
    # The sync side's connection (opened to check the tables) and the loop's own go
    # through; the spare a second task needs never connects.
    proxy = _StallingProxy((parts.hostname or "127.0.0.1", parts.port or 5432), forward=2)
    url = _url(f"postgresql://{parts.netloc.split('@')[0].rsplit(':', 1)[0]}:{proxy.port}{parts.path}", schema)
    b = PostgresBackend.from_url(url, max_size=3, timeout=30)
    t = f"spare-{_tag()}"

    async def main() -> None:
        first = asyncio.create_task(b.ahead(t, ""))
        second = asyncio.create_task(b.ahead(t, ""))  # finds the connection busy
        assert await first is None
        await asyncio.sleep(0.2)
        assert not second.done()  # still connecting its spare; left behind

    finished = threading.Event()

    def run() -> None:
        asyncio.run(main())
        finished.set()

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(20)
    try:
        assert finished.is_set(), "asyncio.run() did not return: the loop's shutdown hangs"
        b.close()
    finally:
        proxy.close()


def test_cancelled_task_leaves_a_usable_store(postgres_url: str, schema: str) -> None:
    b = PostgresBackend.from_url(_url(postgres_url, schema), max_size=1)
    t = f"cancel-{_tag()}"
    b.write(_row(t, 1), {}, 0)

    async def main() -> None:
        with psycopg.connect(postgres_url) as blocker:
            # Another writer's uncommitted version 2 keeps the write inside its statement;
            # then cancel it.
            _hold_version(blocker, schema, t, 2)
            task = asyncio.create_task(b.awrite(_row(t, 2), {}, 1))
            done, _ = await asyncio.wait([task], timeout=0.5)
            assert not done
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            blocker.rollback()
        # The one connection (max_size=1) serves the next operations.
        assert await b.ahead(t, "") == Head("00000001", 1)
        assert await b.awrite(_row(t, 2), {}, 1) == Head("00000002", 2)
        await b.aclose()

    asyncio.run(main())


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_fork_child_opens_its_own_connection(postgres_url: str, schema: str) -> None:
    import os

    b = PostgresBackend.from_url(_url(postgres_url, schema))
    t = f"fork-{_tag()}"
    b.write(_row(t, 1), {}, 0)  # the parent's connection is open at fork
    pid = os.fork()
    if pid == 0:  # the child: writes through the inherited store, then leaves at once
        code = 1
        try:
            b.write(_row(t, 2), {}, 1)
            code = 0 if b.head(t, "") == Head("00000002", 2) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's session survived the child (which never closed it).
    assert b.write(_row(t, 3), {}, 2) == Head("00000003", 3)
    b.close()


# -- migrations --------------------------------------------------------------------


def _open_at_barrier(url: str, barrier: Any) -> None:
    barrier.wait(timeout=60)
    PostgresBackend.from_url(url).close()


def test_concurrent_migrations_from_many_processes(
    postgres_url: str, schema: str, admin: Any
) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(6)
    procs = [
        ctx.Process(target=_open_at_barrier, args=(_url(postgres_url, schema), barrier))
        for _ in range(6)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * 6
    versions = admin.execute(f'SELECT version FROM "{schema}".migrations').fetchall()
    assert versions == [(v,) for v in range(1, LATEST_VERSION + 1)]


def test_concurrent_migrations_from_many_threads(postgres_url: str, schema: str) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def open_one() -> None:
        try:
            barrier.wait(timeout=30)
            PostgresBackend.from_url(_url(postgres_url, schema)).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert errors == []


def test_migrate_check_reports_behind_then_current(postgres_url: str, schema: str) -> None:
    b = PostgresBackend.from_url(_url(postgres_url, schema), migrate=False)
    before = b.migrate(check=True)
    assert (before.current, before.target, before.behind) == (0, LATEST_VERSION, True)
    assert b.migrate(check=True).behind  # checking changed nothing
    done = b.migrate()
    assert done.applied == tuple(range(1, LATEST_VERSION + 1)) and not done.behind
    assert b.migrate().applied == ()
    assert b.migrate(check=True).behind is False
    b.close()


def test_missing_tables_say_how_to_migrate(postgres_url: str, schema: str) -> None:
    b = PostgresBackend.from_url(_url(postgres_url, schema), migrate=False)
    with pytest.raises(BackendError, match="persistkit migrate"):
        b.head("t", "")
    b.close()


def test_generated_sync_twin_is_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "unasync.py"), "--check"], capture_output=True
    )
    assert result.returncode == 0, result.stderr


# -- faults ------------------------------------------------------------------------


def _kill(admin: Any, app: str) -> int:
    killed = admin.execute(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name = %s",
        (app,),
    ).fetchone()[0]
    return int(killed)


def _write_through_faults(
    write: Callable[[int], Any], head: Callable[[], Head | None], kill: Callable[[], int]
) -> None:
    """20 writes, the connections killed before every 5th: the write after a
    kill fails as unavailable or succeeds, the one after that succeeds."""
    head()  # so that the store holds a connection to kill
    n = 0
    for i in range(20):
        if i % 5 == 0:
            assert kill() >= 1
        try:
            write(n)
            n += 1
        except BackendUnavailableError:
            # Not retried by the store; the caller resolves it by reading the head.
            current = head()
            assert (current.version if current else 0) == n
            write(n)  # the one after succeeds
            n += 1


def test_killed_connections_sync(postgres_url: str, schema: str, admin: Any) -> None:
    app = f"pkfault_{_tag()}"
    b = PostgresBackend.from_url(_url(postgres_url, schema, application_name=app), min_size=2)
    t = f"fault-{_tag()}"
    _write_through_faults(
        lambda n: b.write(_row(t, n + 1), {f"b{n}": b"x" * 100}, n),
        lambda: b.head(t, ""),
        lambda: _kill(admin, app),
    )
    assert b.head(t, "") == Head("00000020", 20)
    assert len(b.list(t, "")) == 20 and len(b.scan_blobs(t, "", "~")) == 20
    _kill(admin, app)
    assert b.head(t, "") == Head("00000020", 20)  # reads retry by themselves
    b.close()


def test_killed_connections_async(postgres_url: str, schema: str, admin: Any) -> None:
    app = f"pkfault_{_tag()}"
    b = PostgresBackend.from_url(_url(postgres_url, schema, application_name=app), min_size=2)
    t = f"afault-{_tag()}"

    async def main() -> None:
        for n in range(20):
            if n % 5 == 0:
                await b.ahead(t, "")  # make sure the async pool exists
                assert _kill(admin, app) >= 1
            try:
                await b.awrite(_row(t, n + 1), {}, n)
            except BackendUnavailableError:
                current = await b.ahead(t, "")
                assert (current.version if current else 0) == n
                await b.awrite(_row(t, n + 1), {}, n)
        assert await b.ahead(t, "") == Head("00000020", 20)
        assert len(await b.alist(t, "")) == 20
        await b.aclose()

    asyncio.run(main())


def test_killed_single_connection_is_reopened(postgres_url: str, schema: str, admin: Any) -> None:
    app = f"pkfault_{_tag()}"
    conn = psycopg.connect(postgres_url, application_name=app)
    b = PostgresBackend.from_connection(conn, schema=schema)
    t = f"cfault-{_tag()}"
    _write_through_faults(
        lambda n: b.write(_row(t, n + 1), {}, n), lambda: b.head(t, ""), lambda: _kill(admin, app)
    )
    assert len(b.list(t, "")) == 20
    b.close()
    conn.close()


def test_write_killed_in_flight_is_all_or_nothing(
    postgres_url: str, schema: str, admin: Any
) -> None:
    app = f"pkfault_{_tag()}"
    b = PostgresBackend.from_url(_url(postgres_url, schema, application_name=app))
    t = f"inflight-{_tag()}"
    b.write(_row(t, 1), {"a": b"1"}, 0)
    outcome: list[BaseException | Head] = []
    with psycopg.connect(postgres_url) as blocker:
        # Another writer's uncommitted version 2 keeps the write inside its statement.
        _hold_version(blocker, schema, t, 2)

        def write() -> None:
            try:
                outcome.append(b.write(_row(t, 2), {"b": b"2"}, 1))
            except BaseException as exc:
                outcome.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        deadline = time.monotonic() + 30
        while not admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock'",
            (app,),
        ).fetchone()[0]:
            assert time.monotonic() < deadline, "the write never blocked on the lock"
            time.sleep(0.01)
        assert _kill(admin, app) >= 1
        blocker.rollback()
    writer.join(timeout=30)
    assert len(outcome) == 1 and isinstance(outcome[0], BackendUnavailableError), outcome
    assert b.head(t, "") == Head("00000001", 1)
    assert b.get(t, "", "00000002") is None and b.get_blobs(t, ["b"]) == {}
    assert b.write(_row(t, 2), {"b": b"2"}, 1) == Head("00000002", 2)
    b.close()


# -- many writers on one thread across processes --------------------------------------


def _writer(url: str, thread: str, me: int, count: int, barrier: Any) -> None:
    b = PostgresBackend.from_url(url)
    barrier.wait(timeout=60)
    done = 0
    while done < count:
        head = b.head(thread, "")
        version = head.version if head else 0
        row = CheckpointRow(
            thread, "", f"{version + 1:08d}", head.checkpoint_id if head else None, f"w{me}", b"x"
        )
        try:
            b.write(row, {f"w{me}-{done}": b"b"}, version)
            done += 1
        except (ConflictError, BackendUnavailableError):
            continue
    b.close()


@pytest.mark.slow
def test_many_writers_across_processes_lose_nothing(postgres_url: str, schema: str) -> None:
    url = _url(postgres_url, schema)
    PostgresBackend.from_url(url).close()  # migrate once, outside the race
    t = f"race-{_tag()}"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_writer, args=(url, t, i, 25, barrier)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    assert [p.exitcode for p in procs] == [0] * 4
    b = PostgresBackend.from_url(url)
    assert b.head(t, "") == Head(f"{100:08d}", 100)
    rows = b.list(t, "")
    assert [r.checkpoint_id for r in rows] == [f"{n:08d}" for n in range(100, 0, -1)]
    # A linked chain: every row's parent is the row before it.
    assert all(
        r.parent_id
        == (f"{int(r.checkpoint_id) - 1:08d}" if r.checkpoint_id != "00000001" else None)
        for r in rows
    )
    runs = [r.run_id for r in rows]
    assert all(runs.count(f"w{i}") == 25 for i in range(4))
    assert len(b.scan_blobs(t, "", "~")) == 100
    b.close()


def test_transient_errors_speak_of_an_unknown_outcome_only_for_writes() -> None:
    from persistkit.backends._postgres_sql import map_error

    exc = psycopg.OperationalError("server closed the connection unexpectedly")
    read = map_error(exc, "reading the head", "t", "postgresql://h/db")
    write = map_error(exc, "write", "t", "postgresql://h/db", write=True)
    assert isinstance(read, BackendUnavailableError) and isinstance(write, BackendUnavailableError)
    assert "may or may not have committed" not in str(read) and "safe to retry" in str(read)
    assert "may or may not have committed" in str(write)
