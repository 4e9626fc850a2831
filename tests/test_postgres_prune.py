"""PostgreSQL prune (retention) beyond the shipped suite: the ``runs`` index that bounds
``list(run_id=...)`` after rows of a run were pruned, its first row included, and the
write path's memory of noted runs (``AsyncCore._noted``) across store instances."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg")

from persistkit.backends import CheckpointRow  # noqa: E402
from persistkit.backends.postgres import PostgresBackend  # noqa: E402


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    name = f"pkprune_{uuid.uuid4().hex[:10]}"
    yield name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def stores(postgres_url: str, schema: str) -> Iterator[tuple[PostgresBackend, PostgresBackend]]:
    """Two instances on one schema: as two processes, each with its own noted runs."""
    a = PostgresBackend.from_url(f"{postgres_url}?schema={schema}")
    b = PostgresBackend.from_url(f"{postgres_url}?schema={schema}")
    yield a, b
    a.close()
    b.close()


def _cid(n: int) -> str:
    return f"{n:024x}"


def _write(store: PostgresBackend, thread: str, n: int, run: str) -> str:
    store.write(CheckpointRow(thread, "", _cid(n), _cid(n - 1) if n > 1 else None, run, b"p%d" % n), {}, n - 1)
    return _cid(n)


def _runs(postgres_url: str, schema: str, thread: str) -> dict[str, str]:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        found = conn.execute(
            f'SELECT run_id, first_id FROM "{schema}".runs WHERE thread_id = %s AND namespace = %s', (thread, "")
        ).fetchall()
    return {run: first for run, first in found}


def _listed(store: PostgresBackend, thread: str, run: str) -> list[str]:
    return [r.checkpoint_id for r in store.list(thread, "", run_id=run)]


def test_a_pruned_first_row_keeps_the_run_listed(
    stores: tuple[PostgresBackend, PostgresBackend], postgres_url: str, schema: str
) -> None:
    store, _ = stores
    t = f"t-{uuid.uuid4().hex[:8]}"
    a = [_write(store, t, n, "A") for n in (1, 2, 3)]
    b = [_write(store, t, n, "B") for n in (4, 5)]
    assert store.prune_rows(t, "", [a[0], b[0]]) == 2  # the first row of each run
    # first_id still bounds each run's rows from below: nothing to change, nothing lost
    assert _runs(postgres_url, schema, t) == {"A": a[0], "B": b[0]}
    assert _listed(store, t, "A") == [a[2], a[1]]
    assert _listed(store, t, "B") == [b[1]]
    assert [r.checkpoint_id for r in store.list(t, "", run_id="A", before=a[2], limit=1)] == [a[1]]


def test_a_run_left_without_rows_loses_its_entry_and_its_later_rows_stay_listed(
    stores: tuple[PostgresBackend, PostgresBackend], postgres_url: str, schema: str
) -> None:
    writer, pruner = stores
    t = f"t-{uuid.uuid4().hex[:8]}"
    a = [_write(writer, t, n, "A") for n in (1, 2)]
    _write(writer, t, 3, "B")
    assert pruner.prune_rows(t, "", a) == 2
    assert set(_runs(postgres_url, schema, t)) == {"B"}  # the entry went with A's last row
    assert _listed(pruner, t, "A") == []
    # the writer noted run A before the prune (another process's memory): its next row of A
    # does not note A again, and list(run_id="A") still finds it, by a scan of the thread
    later = _write(writer, t, 4, "A")
    assert set(_runs(postgres_url, schema, t)) == {"B"}
    assert _listed(pruner, t, "A") == [later]
    assert _listed(writer, t, "A") == [later]
    # the pruning instance forgot what it had noted of the thread: its own next row notes the run
    _write(pruner, t, 5, "B")
    assert _runs(postgres_url, schema, t)["B"] == _cid(3)
    _write(pruner, t, 6, "C")
    pruner.prune_rows(t, "", [_cid(3), _cid(5)])
    assert set(_runs(postgres_url, schema, t)) == {"C"}
    _write(pruner, t, 7, "B")
    assert _runs(postgres_url, schema, t)["B"] == _cid(7)


def test_rows_without_a_run_and_other_namespaces(stores: tuple[PostgresBackend, PostgresBackend]) -> None:
    store, _ = stores
    t = f"t-{uuid.uuid4().hex[:8]}"
    for n in (1, 2, 3):
        store.write(CheckpointRow(t, "", _cid(n), None, None, b"x"), {}, n - 1)
        store.write(CheckpointRow(t, "sub", _cid(n), None, "A", b"x"), {}, n - 1)
    assert store.prune_rows(t, "", [_cid(1), _cid(2)]) == 2
    assert [r.checkpoint_id for r in store.list(t, "sub", run_id="A")] == [_cid(3), _cid(2), _cid(1)]


def test_async_prune_on_the_native_async_side(stores: tuple[PostgresBackend, PostgresBackend]) -> None:
    store, _ = stores
    t = f"t-{uuid.uuid4().hex[:8]}"

    async def main() -> Any:
        for n in (1, 2, 3):
            await store.awrite(CheckpointRow(t, "", _cid(n), None, "A", b"x"), {}, n - 1)
        await store.aput_blobs(t, {"v:a": b"abc", "v:b": b""})
        pruned = await store.aprune_rows(t, "", [_cid(1), _cid(2), _cid(3)])
        sizes = await store.ablob_sizes(t)
        deleted = await store.adelete_blobs(t, ["v:b", "v:c"])
        return pruned, sizes, deleted, [r.checkpoint_id for r in await store.alist(t, "", run_id="A")]

    assert store._async is not None  # the async side has its own core: no worker thread
    assert asyncio.run(main()) == (2, {"v:a": 3, "v:b": 0}, 1, [_cid(3)])


def test_prune_rows_is_never_prepared(postgres_url: str, schema: str) -> None:
    """A prepared prune could get a generic plan that joins rows and ids in nested loops
    (quadratic: see _PRUNE_SQL); the other statements are prepared as usual."""
    conn = psycopg.connect(postgres_url)
    store = PostgresBackend.from_connection(conn, schema=schema)
    try:
        t = f"t-{uuid.uuid4().hex[:8]}"
        for n in range(1, 20):
            _write(store, t, n, f"run{n % 3}")
        for n in range(1, 9):  # past psycopg's prepare threshold (5)
            assert store.prune_rows(t, "", [_cid(n)]) == 1
            assert store.blob_sizes(t) == {}
        prepared = [s for (s,) in conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()]
        assert not [s for s in prepared if "DELETE FROM" in s and ".checkpoints c USING h" in s]
        assert [s for s in prepared if "octet_length" in s]  # blob_sizes is (the threshold was passed)
        assert [r.checkpoint_id for r in store.list(t, "", run_id="run0")] == [_cid(n) for n in (18, 15, 12, 9)]
    finally:
        store.close()
        conn.close()
