"""PostgreSQL migration 3 (no heads table; a version column and a runs table) on a
store the previous release created and wrote: it opens, reads and writes on.

The release's layout is built by its own migrations (1 and 2: shipped entries are
never edited), and its rows are the ones persistkit writes, stored the way that
release stored them (a ``heads`` row per thread, no version on the rows).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Annotated, Any

import pytest

psycopg = pytest.importorskip("psycopg")

import persistkit as pk  # noqa: E402
from persistkit import ConflictError  # noqa: E402
from persistkit.backends import CheckpointRow, Head  # noqa: E402
from persistkit.backends._postgres_sql import MIGRATIONS  # noqa: E402
from persistkit.backends.postgres import LATEST_VERSION, PostgresBackend  # noqa: E402


class Notes(pk.State, name="tests.schema3.Notes"):
    topic: str = ""
    lines: Annotated[list[str], pk.append] = []


@pk.checkpointed
def note(i: int) -> str:
    run = pk.current_run()
    assert run is not None
    run.state.lines.append(f"line {i}")
    return f"result {i}"


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    name = f"pkt3_{uuid.uuid4().hex[:10]}"
    yield name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _release_schema(conn: Any, schema: str) -> None:
    """The tables of the release before migration 3, as its migrations made them."""
    conn.execute(f'CREATE SCHEMA "{schema}"')
    conn.execute(
        f'CREATE TABLE "{schema}".migrations (version integer PRIMARY KEY, '
        "applied_at timestamptz NOT NULL DEFAULT now())"
    )
    for version, statements in MIGRATIONS[:2]:
        for statement in statements:
            conn.execute(statement.replace("{s}", f'"{schema}"'))
        conn.execute(f'INSERT INTO "{schema}".migrations (version) VALUES (%s)', (version,))


def _store_as_release(conn: Any, schema: str, rows: list[CheckpointRow], head: CheckpointRow, version: int) -> None:
    """``rows`` of one thread written the release's way: rows without a version, the head in ``heads``."""
    for r in rows:
        conn.execute(
            f'INSERT INTO "{schema}".checkpoints (thread_id, namespace, checkpoint_id, parent_id, run_id, payload) '
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (r.thread_id, r.namespace, r.checkpoint_id, r.parent_id, r.run_id, r.payload),
        )
    conn.execute(
        f'INSERT INTO "{schema}".heads (thread_id, namespace, checkpoint_id, version) VALUES (%s, %s, %s, %s)',
        (head.thread_id, head.namespace, head.checkpoint_id, version),
    )


def test_a_store_of_the_previous_release_opens_and_works_after_migration_3(
    postgres_url: str, schema: str
) -> None:
    # Two runs of a real agent, recorded by today's engine on a memory store: the
    # payload bytes do not depend on the store.
    source = pk.connect("memory://")
    with pk.resume("t", store=source, state=Notes, run_id="first") as run:
        run.state.topic = "migrations"
        for i in range(3):
            note(i)
    with pk.resume("t", store=source, state=Notes, run_id="second"):
        for i in range(3, 5):
            note(i)
    head = source.backend.head("t", "")
    assert head is not None
    rows = source.backend.list("t", "")
    source.close()

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        _release_schema(conn, schema)
        _store_as_release(conn, schema, rows, rows[0], head.version)

    url = f"{postgres_url}?schema={schema}"
    backend = PostgresBackend.from_url(url)  # migrates on open
    status = backend.migrate(check=True)
    assert (status.current, status.behind) == (LATEST_VERSION, False)
    assert backend.head("t", "") == Head(rows[0].checkpoint_id, head.version)
    assert backend.threads() == ["t"] and backend.namespaces("t") == [""]
    assert backend.list("t", "") == rows
    first = [r for r in rows if r.run_id == "first"]
    assert backend.list("t", "", run_id="first") == first and len(first) == 4  # 3 steps, its end
    # A writer that read the head before the migration and lost it to another: refused.
    stale = CheckpointRow("t", "", "ffffffffffffffffffffffff", rows[1].checkpoint_id, "x", b"p")
    with pytest.raises(ConflictError) as info:
        backend.write(stale, {}, head.version - 1)
    assert (info.value.found, info.value.found_checkpoint) == (head.version, rows[0].checkpoint_id)
    backend.close()

    # The thread resumes through the public API: state as stored, new steps on top.
    store = pk.connect(url)
    with pk.resume("t", store=store, state=Notes) as run:
        assert run.state.topic == "migrations"
        assert run.state.lines == [f"line {i}" for i in range(5)]
        assert note(5) == "result 5"
    with pk.resume("t", store=store, state=Notes, run_id="second") as again:
        assert [note(3), note(4)] == ["result 3", "result 4"]  # the recorded run replays
        assert len(again.replayed) == 2 and again.executed == []
    assert store.backend.head("t", "").version == head.version + 2  # type: ignore[union-attr]
    assert [r.run_id for r in store.backend.list("t", "", limit=2)][1] == run.run_id
    store.close()

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        tables = {r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        )}
        columns = {r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = 'checkpoints'", (schema,)
        )}
    assert "heads" not in tables and "runs" in tables
    assert "version" in columns and "created_at" not in columns


def test_versions_make_the_compare_and_swap(postgres_url: str, schema: str) -> None:
    """The head is the row with the highest version; a write at a version the thread
    does not have, or already has, inserts nothing and says what it found."""
    b = PostgresBackend.from_url(f"{postgres_url}?schema={schema}")
    rows = [CheckpointRow("v", "", f"{i:08d}", f"{i - 1:08d}" if i > 1 else None, "r", b"p") for i in (1, 2, 3)]
    assert b.write(rows[0], {}, 0) == Head("00000001", 1)
    with pytest.raises(ConflictError):  # a second first write
        b.write(rows[1], {}, 0)
    with pytest.raises(ConflictError) as ahead:  # a version the thread never had
        b.write(rows[1], {"k": b"v"}, 5)
    assert (ahead.value.found, ahead.value.found_checkpoint) == (1, "00000001")
    assert b.get_blobs("v", ["k"]) == {}
    assert b.write(rows[1], {}, 1) == Head("00000002", 2)
    assert b.write(rows[2], {}, 2) == Head("00000003", 3)
    assert b.head("v", "") == Head("00000003", 3)
    assert b.delete_thread("v") and b.head("v", "") is None and b.threads(prefix="v") == []
    b.close()
