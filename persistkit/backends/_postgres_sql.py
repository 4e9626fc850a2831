"""The PostgreSQL store's SQL, migrations and error mapping: the one copy of each.

Both the hand-written async core (``_postgres_async.py``) and its generated
sync twin (``_postgres_sync.py``) execute only the statements defined here.
Every statement is schema-qualified (never ``search_path``), so it behaves
the same behind PgBouncer in transaction mode and on a user's own pool.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg_pool

from .._errors import BackendError, BackendUnavailableError, ConfigurationError, StoreClosedError

__all__ = [
    "LATEST_VERSION",
    "MIGRATIONS",
    "MigrationStatus",
    "Queries",
    "Shared",
    "is_connection_failure",
    "map_error",
    "reused_id",
    "validate_schema",
]

log = logging.getLogger("persistkit.postgres")

_SCHEMA_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

# Versioned, append-only: never edit a shipped entry, add a new version instead.
# Every text column is COLLATE "C" so ranges and ORDER BY compare code points
# (UTF-8 bytes), the same order as Python's ``str`` comparison.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (
        1,
        (
            """CREATE TABLE IF NOT EXISTS {s}.heads (
                thread_id text COLLATE "C" NOT NULL,
                namespace text COLLATE "C" NOT NULL,
                checkpoint_id text COLLATE "C" NOT NULL,
                version bigint NOT NULL,
                PRIMARY KEY (thread_id, namespace))""",
            """CREATE TABLE IF NOT EXISTS {s}.checkpoints (
                thread_id text COLLATE "C" NOT NULL,
                namespace text COLLATE "C" NOT NULL,
                checkpoint_id text COLLATE "C" NOT NULL,
                parent_id text COLLATE "C",
                run_id text COLLATE "C",
                payload bytea NOT NULL,
                created_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (thread_id, namespace, checkpoint_id))""",
            # list(run_id=...) walks one run newest-first without a sort.
            """CREATE INDEX IF NOT EXISTS checkpoints_run_idx
                ON {s}.checkpoints (thread_id, namespace, run_id, checkpoint_id DESC)""",
            """CREATE TABLE IF NOT EXISTS {s}.blobs (
                thread_id text COLLATE "C" NOT NULL,
                key text COLLATE "C" NOT NULL,
                data bytea NOT NULL,
                PRIMARY KEY (thread_id, key))""",
        ),
    ),
    # 2: leases (persistkit.coordination). Rows, not advisory locks: a session lock
    # belongs to a connection, which a pool hands to other callers (and PgBouncer
    # in transaction mode to other clients), and dies with it; a row with a
    # version survives both and carries the fencing token the writes check.
    (
        2,
        (
            """CREATE TABLE IF NOT EXISTS {s}.leases (
                thread_id text COLLATE "C" NOT NULL,
                namespace text COLLATE "C" NOT NULL,
                token bigint NOT NULL,
                data bytea NOT NULL,
                version bigint NOT NULL,
                PRIMARY KEY (thread_id, namespace))""",
        ),
    ),
    # 3: no heads table. A row carries the head version it creates; the head of
    # (thread, namespace) is its row with the highest version, found through a
    # unique index on (thread, namespace, version), which is also the
    # compare-and-swap: of two writers of one version the second finds the
    # first's index entry and inserts nothing. A step was an UPDATE of the head
    # (a new heap tuple and a dead one per step, vacuumed later) plus the row
    # insert with two index entries; it is now the row insert alone. The run
    # index (thread, namespace, run_id, checkpoint_id: ~100 bytes a row, the
    # largest part of the store after the payloads) gives way to a table
    # holding each run's first checkpoint id, which bounds a scan of the
    # primary key (as SQLite's schema 2), and created_at repeats the record's
    # own time ("t" in the payload), which the API reads. The old head row takes
    # the head's version; older rows keep none and are never a head. Processes
    # of an older persistkit cannot write after this: stop them before migrating.
    (
        3,
        (
            "ALTER TABLE {s}.checkpoints ADD COLUMN IF NOT EXISTS version bigint",
            """UPDATE {s}.checkpoints c SET version = h.version FROM {s}.heads h
                WHERE c.thread_id = h.thread_id AND c.namespace = h.namespace
                  AND c.checkpoint_id = h.checkpoint_id""",
            """CREATE UNIQUE INDEX IF NOT EXISTS checkpoints_version_idx
                ON {s}.checkpoints (thread_id, namespace, version)""",
            """CREATE TABLE IF NOT EXISTS {s}.runs (
                thread_id text COLLATE "C" NOT NULL,
                namespace text COLLATE "C" NOT NULL,
                run_id text COLLATE "C" NOT NULL,
                first_id text COLLATE "C" NOT NULL,
                PRIMARY KEY (thread_id, namespace, run_id))""",
            """INSERT INTO {s}.runs (thread_id, namespace, run_id, first_id)
                SELECT thread_id, namespace, run_id, min(checkpoint_id) FROM {s}.checkpoints
                WHERE run_id IS NOT NULL GROUP BY thread_id, namespace, run_id
                ON CONFLICT DO NOTHING""",
            "DROP INDEX IF EXISTS {s}.checkpoints_run_idx",
            "DROP TABLE IF EXISTS {s}.heads",
            "ALTER TABLE {s}.checkpoints DROP COLUMN IF EXISTS created_at",
        ),
    ),
    # 4: the kv space (store.board(); persistkit/backends/_postgres_kv.py). New tables
    # only, so a database of an older persistkit migrates in place and its processes
    # keep running. kv_keys holds each key's latest version (the row a compare-and-swap
    # updates, and what a listing walks in key order), kv_versions every kept version
    # (the latest included), kv_grants the per-role grants row-level security reads
    # (empty and unused until grant_board_access enables it).
    (
        4,
        (
            """CREATE TABLE IF NOT EXISTS {s}.kv_keys (
                scope text COLLATE "C" NOT NULL,
                key text COLLATE "C" NOT NULL,
                version bigint NOT NULL,
                live boolean NOT NULL,
                PRIMARY KEY (scope, key))""",
            """CREATE TABLE IF NOT EXISTS {s}.kv_versions (
                scope text COLLATE "C" NOT NULL,
                key text COLLATE "C" NOT NULL,
                version bigint NOT NULL,
                value bytea,
                PRIMARY KEY (scope, key, version))""",
            """CREATE TABLE IF NOT EXISTS {s}.kv_grants (
                role text COLLATE "C" NOT NULL,
                scope text COLLATE "C" NOT NULL,
                mode text COLLATE "C" NOT NULL CHECK (mode IN ('read', 'write')),
                pattern text COLLATE "C" NOT NULL,
                PRIMARY KEY (role, scope, mode, pattern))""",
            # A kv write is one statement on an autocommit connection; when not every op
            # moved its key, this makes the statement fail (SQLSTATE PKC01), which rolls
            # all of it back, notifications included: one round trip, not BEGIN/COMMIT.
            """CREATE OR REPLACE FUNCTION {s}.kv_all_moved(moved bigint, wanted bigint)
                RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
                BEGIN
                    IF moved <> wanted THEN
                        RAISE EXCEPTION 'kv write: % of % keys were at their expected version', moved, wanted
                            USING ERRCODE = 'PKC01';
                    END IF;
                    RETURN moved;
                END $$""",
        ),
    ),
)
LATEST_VERSION = MIGRATIONS[-1][0]

# A write is one INSERT of the row carrying the version it creates: it inserts
# only if the head is at the expected version (the thread's newest version is
# the expected one, or for version 1 no versioned row exists), and the unique
# index on the version makes a concurrent writer of the same version wait for the
# first one, then fail with a unique violation, which the core reads as "the
# head moved" (a reused checkpoint id, with the head where the writer expected
# it, is told apart by reading the head). No ON CONFLICT: a speculative insertion
# checks every unique index before inserting and logs its confirmation, work a
# step does not need. The blob and run inserts select FROM the row's insert, so
# when it inserted nothing they insert nothing (data-modifying CTEs always run).
# One statement on an autocommit connection is one transaction and one round trip.
#
# Measured on the server (200-800 writes of 1 KB on one thread, server CPU per
# write): one CASE on the expected version instead of two statements made
# PostgreSQL plan the statement anew at every execution (~150 us); an EXISTS of
# the expected version grew with the thread's rows (150 -> 500 us at 800 rows),
# where the newest version read by a backward index step does not; and the runs
# insert, even one that finds its key and writes nothing, costs ~20% of the
# statement (one more table and index opened and locked), so the core leaves it
# out once it noted the run (see AsyncCore.write).
_FIRST = """NOT EXISTS (SELECT 1 FROM {s}.checkpoints
        WHERE thread_id = %(t)s::text AND namespace = %(ns)s::text AND version IS NOT NULL)"""
_NEXT = """(SELECT version FROM {s}.checkpoints
        WHERE thread_id = %(t)s::text AND namespace = %(ns)s::text AND version IS NOT NULL
        ORDER BY version DESC LIMIT 1) = %(expected)s::bigint"""
_CP = """
cp AS (
    INSERT INTO {s}.checkpoints (thread_id, namespace, checkpoint_id, parent_id, run_id, payload, version)
    SELECT %(t)s::text, %(ns)s::text, %(cid)s::text, %(parent)s::text, %(run)s::text,
           %(payload)s::bytea, %(expected)s::bigint + 1
    WHERE {at_head}{fenced}
    RETURNING version
)"""
# A run's first write notes it (first_id bounds list(run_id=...)); NOT EXISTS, not
# ON CONFLICT, for the reason above.
_RUN = """,
rn AS (
    INSERT INTO {s}.runs (thread_id, namespace, run_id, first_id)
    SELECT %(t)s::text, %(ns)s::text, %(run)s::text, %(cid)s::text FROM cp
    WHERE %(run)s::text IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {s}.runs
        WHERE thread_id = %(t)s::text AND namespace = %(ns)s::text AND run_id = %(run)s::text)
)"""
_BLOBS = """,
bl AS (
    INSERT INTO {s}.blobs (thread_id, key, data)
    SELECT %(t)s::text, b.key, b.data
    FROM cp, unnest(%(keys)b::text[], %(datas)b::bytea[]) AS b(key, data)
    ON CONFLICT (thread_id, key) DO NOTHING
)"""
_RESULT = """
SELECT version FROM cp"""
# A run's end record that gives its lease up with it (Backend.write_fenced_swap): the
# lease row's compare-and-swap selects FROM the row's insert, so it swaps only when the
# row landed; the fence above locked that lease row, which the same transaction may update.
_SWAP = """,
swap AS (
    UPDATE {s}.leases SET token = %(fence)s::bigint, data = %(ldata)s::bytea, version = version + 1
    WHERE thread_id = %(t)s::text AND namespace = %(ns)s::text AND version = %(lversion)s::bigint
      AND EXISTS (SELECT 1 FROM cp)
    RETURNING version
)"""
_SWAP_RESULT = """
SELECT version, EXISTS (SELECT 1 FROM swap) FROM cp"""

# Fenced writes (leases): the lease row is read FOR SHARE in the same statement as
# the row's insert, so a takeover (an UPDATE of that row) cannot commit between
# the check and the write, and a takeover that committed first leaves the fence
# empty (READ COMMITTED re-checks a locked row): the row then inserts nothing.
_FENCE = """fence AS (
    SELECT 1 FROM {s}.leases
    WHERE thread_id = %(t)s::text AND namespace = %(ns)s::text AND token = %(fence)s::bigint
    FOR SHARE
),"""


def _write(*, fenced: bool, first: bool, run: bool, blobs: bool, swap: bool = False) -> str:
    """The write statement for one case (a fenced write; the thread's first version;
    noting the run; new blobs: most steps write none, and then bind no arrays; a fenced
    write that swaps the lease record too)."""
    cp = _CP.replace("{at_head}", _FIRST if first else _NEXT)
    cp = cp.replace("{fenced}", "\n      AND EXISTS (SELECT 1 FROM fence)" if fenced else "")
    return (
        "WITH " + (_FENCE if fenced else "") + cp
        + (_RUN if run else "") + (_BLOBS if blobs else "")
        + (_SWAP + _SWAP_RESULT if swap else _RESULT)
    )


#: Keys of Queries.writes: (fenced, first, run, blobs, swap). A first write always notes
#: its run; only a fenced write swaps the lease.
WRITE_CASES = tuple(
    (fenced, first, run, blobs, swap)
    for fenced in (False, True)
    for first in (False, True)
    for run in (False, True)
    for blobs in (False, True)
    for swap in (False, True)
    if (run or not first) and (fenced or not swap)
)

_LEASE_SQL = {
    "lease_get": """SELECT token, data, version FROM {s}.leases
    WHERE thread_id = %(t)s::text AND namespace = %(ns)s::text""",
    "lease_create": """INSERT INTO {s}.leases (thread_id, namespace, token, data, version)
    VALUES (%(t)s::text, %(ns)s::text, %(token)s::bigint, %(data)s::bytea, 1)
    ON CONFLICT (thread_id, namespace) DO NOTHING RETURNING version""",
    "lease_swap": """UPDATE {s}.leases SET token = %(token)s::bigint, data = %(data)s::bytea,
    version = version + 1
    WHERE thread_id = %(t)s::text AND namespace = %(ns)s::text AND version = %(expected)s::bigint
    RETURNING version""",
    "lease_list": """SELECT thread_id, namespace, token, data, version FROM {s}.leases
    WHERE thread_id >= %(prefix)s::text AND starts_with(thread_id, %(prefix)s::text)
    ORDER BY thread_id, namespace""",
}

_SQL = {
    "put_blobs": """INSERT INTO {s}.blobs (thread_id, key, data)
    SELECT %(t)s::text, b.key, b.data FROM unnest(%(keys)b::text[], %(datas)b::bytea[]) AS b(key, data)
    ON CONFLICT (thread_id, key) DO NOTHING""",
    "head": """SELECT checkpoint_id, version FROM {s}.checkpoints
    WHERE thread_id = %(t)s::text AND namespace = %(ns)s::text AND version IS NOT NULL
    ORDER BY version DESC LIMIT 1""",
    "head_row": """SELECT checkpoint_id, version, parent_id, run_id, payload FROM {s}.checkpoints
    WHERE thread_id = %(t)s::text AND namespace = %(ns)s::text AND version IS NOT NULL
    ORDER BY version DESC LIMIT 1""",
    "get": """SELECT parent_id, run_id, payload FROM {s}.checkpoints
    WHERE thread_id = %(t)s::text AND namespace = %(ns)s::text AND checkpoint_id = %(cid)s::text""",
    "get_blobs": """SELECT key, data FROM {s}.blobs
    WHERE thread_id = %(t)s::text AND key = ANY(%(keys)s::text[])""",
    "scan_blobs": """SELECT key, data FROM {s}.blobs
    WHERE thread_id = %(t)s::text AND key >= %(start)s::text AND key < %(stop)s::text""",
    # starts_with() makes the prefix literal (no LIKE wildcards); ">= prefix"
    # gives the primary-key index a lower bound.
    # A loose index scan of the primary key: one seek per thread listed, not a read
    # of every row of every thread (PostgreSQL before 18 has no skip scan).
    "threads": """WITH RECURSIVE t(id) AS (
        (SELECT thread_id FROM {s}.checkpoints
         WHERE thread_id >= %(prefix)s::text AND (%(after)s::text IS NULL OR thread_id > %(after)s::text)
         ORDER BY thread_id LIMIT 1)
        UNION ALL
        SELECT (SELECT thread_id FROM {s}.checkpoints WHERE thread_id > t.id ORDER BY thread_id LIMIT 1)
        FROM t WHERE t.id IS NOT NULL AND starts_with(t.id, %(prefix)s::text)
    )
    SELECT id FROM t WHERE id IS NOT NULL AND starts_with(id, %(prefix)s::text)
    LIMIT %(limit)s::bigint""",
    "namespaces": """SELECT DISTINCT namespace FROM {s}.checkpoints WHERE thread_id = %(t)s::text""",
    # Maintenance (key rotation): one statement, so rows and blobs change in one
    # transaction; UPDATE only, so rows or keys that do not exist are not created.
    "rewrite": """WITH r AS (
    UPDATE {s}.checkpoints c SET payload = v.payload
    FROM unnest(%(nss)s::text[], %(cids)s::text[], %(payloads)b::bytea[]) AS v(ns, cid, payload)
    WHERE c.thread_id = %(t)s::text AND c.namespace = v.ns AND c.checkpoint_id = v.cid
    RETURNING 1),
    b AS (
    UPDATE {s}.blobs o SET data = v.data
    FROM unnest(%(keys)s::text[], %(datas)b::bytea[]) AS v(key, data)
    WHERE o.thread_id = %(t)s::text AND o.key = v.key
    RETURNING 1)
    SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM b)""",
    "delete_thread": """WITH r AS (DELETE FROM {s}.runs WHERE thread_id = %(t)s::text RETURNING 1),
    c AS (DELETE FROM {s}.checkpoints WHERE thread_id = %(t)s::text RETURNING 1),
    b AS (DELETE FROM {s}.blobs WHERE thread_id = %(t)s::text RETURNING 1)
    SELECT (SELECT count(*) FROM c) + (SELECT count(*) FROM b)""",
    # Migrations: one transaction, serialized per schema by an advisory lock
    # (transaction-scoped, so it is also safe behind PgBouncer).
    "lock": "SELECT pg_advisory_xact_lock(1885302132, hashtext(%(schema)s::text))",
    # Plain catalog scans, not to_regclass(): those answer from a cache that
    # waiting on the advisory lock does not refresh, so a process that waited
    # for another's migration would not see its tables (found by the test).
    "probe": """SELECT
    EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %(schema)s::text),
    EXISTS (SELECT 1 FROM pg_catalog.pg_class c
            JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = %(schema)s::text AND c.relname = 'migrations')""",
    "create_schema": "CREATE SCHEMA IF NOT EXISTS {s}",
    "create_migrations": """CREATE TABLE IF NOT EXISTS {s}.migrations (
    version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())""",
    "current_version": "SELECT coalesce(max(version), 0) FROM {s}.migrations",
    "record_version": "INSERT INTO {s}.migrations (version) VALUES (%(version)s::integer)",
}

_LIST = """SELECT checkpoint_id, parent_id, run_id, payload FROM {s}.checkpoints
    WHERE thread_id = %(t)s::text AND namespace = %(ns)s::text{run}{before}
    ORDER BY checkpoint_id DESC LIMIT %(limit)s::bigint"""
# A run's rows are at or after its first checkpoint (ids sort in write order): the
# runs table bounds the primary-key scan (no index on run_id). A pruned first row
# leaves first_id a lower bound still. A run with no entry is scanned from the
# thread's first row: prune_rows drops the entry of a run left without rows, and a
# core that noted the run (AsyncCore._noted, in any process) writes its later rows
# without noting it again, so a missing entry must not hide them (slower, not wrong).
_LIST_RUN = """ AND run_id = %(run)s::text AND checkpoint_id >= coalesce((SELECT first_id FROM {s}.runs
      WHERE thread_id = %(t)s::text AND namespace = %(ns)s::text AND run_id = %(run)s::text), '')"""

# Retention (the prune capability; persistkit/backends/_prune.py). prune_rows is ONE
# statement: the head (the newest versioned row, read as the write reads it), the
# asked rows below the head's checkpoint id deleted by primary key, and the runs
# entries of runs the deletion left without rows. Data-modifying CTEs share one
# snapshot, so "left without rows" is read as: the run's rows outside d (an anti-join
# over the thread's rows, one pass, not one scan per run). A concurrent writer's new
# row is above the head read here, so it is never deleted; one of a run whose entry
# goes at the same moment is still listed (see _LIST_RUN). The core runs it unprepared
# (prepare=False): once psycopg prepares a statement (its 5th run on a connection),
# PostgreSQL may switch to a generic plan, which guesses one row for d and joins the
# thread's rows against it in nested loops: measured on a 100,000-row thread, 3,000
# ids took 20 s and 20,000 ids 105 s, against 0.4 s planned per call with the ids
# known (hash joins). The anti-join reads every row of the thread once (~100 ms per
# 100,000 rows): retention's cost, not a step's.
_PRUNE_SQL = {
    "prune_rows": """WITH h AS (
    SELECT checkpoint_id FROM {s}.checkpoints
    WHERE thread_id = %(t)s::text AND namespace = %(ns)s::text AND version IS NOT NULL
    ORDER BY version DESC LIMIT 1
),
d AS (
    DELETE FROM {s}.checkpoints c USING h, unnest(%(ids)s::text[]) AS x(id)
    WHERE c.thread_id = %(t)s::text AND c.namespace = %(ns)s::text
      AND c.checkpoint_id = x.id AND c.checkpoint_id < h.checkpoint_id
    RETURNING c.checkpoint_id, c.run_id
),
kept AS (
    SELECT DISTINCT c.run_id FROM {s}.checkpoints c
    WHERE c.thread_id = %(t)s::text AND c.namespace = %(ns)s::text
      AND c.run_id IN (SELECT run_id FROM d)
      AND NOT EXISTS (SELECT 1 FROM d WHERE d.checkpoint_id = c.checkpoint_id)
),
r AS (
    DELETE FROM {s}.runs u
    WHERE u.thread_id = %(t)s::text AND u.namespace = %(ns)s::text
      AND u.run_id IN (SELECT run_id FROM d)
      AND NOT EXISTS (SELECT 1 FROM kept WHERE kept.run_id = u.run_id)
)
SELECT count(*) FROM d""",
    "delete_blobs": """DELETE FROM {s}.blobs b USING unnest(%(keys)s::text[]) AS x(key)
    WHERE b.thread_id = %(t)s::text AND b.key = x.key""",
    # octet_length of a bytea reads its header, not the (possibly TOASTed) bytes.
    "blob_sizes": """SELECT key, octet_length(data) FROM {s}.blobs WHERE thread_id = %(t)s::text""",
}


def validate_schema(schema: object) -> str:
    """``schema`` if it is a plain identifier; anything else is a ``ConfigurationError``."""
    if not isinstance(schema, str) or not _SCHEMA_RE.fullmatch(schema):
        raise ConfigurationError(
            f"invalid PostgreSQL schema name {schema!r}: use 1-63 letters, digits and "
            "underscores, not starting with a digit (e.g. 'persistkit')"
        )
    return schema


class Queries:
    """Every statement, rendered once for one schema (bytes: psycopg sends them as is)."""

    def __init__(self, schema: str) -> None:
        quoted = '"' + validate_schema(schema) + '"'
        self.schema = schema
        self.quoted_schema = quoted

        def render(text: str) -> bytes:
            return text.replace("{s}", quoted).encode()

        self.writes = {
            case: render(_write(fenced=case[0], first=case[1], run=case[2], blobs=case[3], swap=case[4]))
            for case in WRITE_CASES
        }
        self.put_blobs = render(_SQL["put_blobs"])
        self.head = render(_SQL["head"])
        self.get = render(_SQL["get"])
        self.head_row = render(_SQL["head_row"])
        self.get_blobs = render(_SQL["get_blobs"])
        self.scan_blobs = render(_SQL["scan_blobs"])
        self.threads = render(_SQL["threads"])
        self.delete_thread = render(_SQL["delete_thread"])
        self.namespaces = render(_SQL["namespaces"])
        self.rewrite = render(_SQL["rewrite"])
        self.lock = render(_SQL["lock"])
        self.probe = render(_SQL["probe"])
        self.create_schema = render(_SQL["create_schema"])
        self.create_migrations = render(_SQL["create_migrations"])
        self.current_version = render(_SQL["current_version"])
        self.record_version = render(_SQL["record_version"])
        self.lease = {name: render(text) for name, text in _LEASE_SQL.items()}
        self.prune = {name: render(text) for name, text in _PRUNE_SQL.items()}
        self.migrations = tuple(
            (version, tuple(render(s) for s in statements)) for version, statements in MIGRATIONS
        )
        # Four static variants rather than "(x IS NULL OR ...)" so each one
        # gets a plan that uses the right index.
        self.list = {
            (run, before): render(
                _LIST.replace("{run}", _LIST_RUN if run else "").replace(
                    "{before}", " AND checkpoint_id < %(before)s::text" if before else ""
                )
            )
            for run in (False, True)
            for before in (False, True)
        }


@dataclass(frozen=True, slots=True)
class MigrationStatus:
    """What :meth:`PostgresBackend.migrate` found or did.

    ``current`` is the database schema version after the call (before it, with
    ``check=True``, which changes nothing); ``target`` the version this
    persistkit needs; ``applied`` the versions this call applied.
    """

    schema: str
    current: int
    target: int
    applied: tuple[int, ...] = ()

    @property
    def behind(self) -> bool:
        """True when the database needs ``persistkit migrate`` before this code can use it."""
        return self.current < self.target

    @property
    def ahead(self) -> bool:
        """True when a newer persistkit migrated the database (this code still runs on it)."""
        return self.current > self.target


class Shared:
    """State both cores of one store see: its SQL, URL and open/migrated flags."""

    def __init__(self, queries: Queries, url: str, *, migrate: bool) -> None:
        self.queries = queries
        self.url = url
        # False until migrations ran (or were found current), when migrate=True.
        self.needs_migration = migrate
        self.closed = False

    def check_open(self) -> None:
        if self.closed:
            raise StoreClosedError(
                f"the PostgreSQL store {self.url} was closed; open a new one with pk.connect(...)"
            )


# Class 54 (program limit exceeded, e.g. a key too large for an index) will
# fail again however often it is retried, although psycopg files it under
# OperationalError.
_PERMANENT_CLASSES = ("54",)
# Transient whatever psycopg's class: serialization failure, deadlock.
_TRANSIENT_STATES = frozenset({"40001", "40P01"})


def is_connection_failure(exc: BaseException, conn: psycopg.BaseConnection[Any] | None) -> bool:
    """Whether ``exc`` means a connection (not a statement) failed, so that the
    pool's idle connections may be dead too and a read may be retried at once.
    A pool timeout is not: the server is unreachable and retrying would wait again."""
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg_pool.PoolClosed):
        return False
    if conn is not None and (conn.broken or conn.closed):
        return True
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) and not getattr(
        exc, "sqlstate", None
    )


def reused_id(row: Any, url: str) -> BackendError:
    """A write refused although the head was at the expected version: its checkpoint
    id is one the thread already has (the insert hit the primary key)."""
    return BackendError(
        f"PostgreSQL store {url}: write of thread {row.thread_id!r}: checkpoint id "
        f"{row.checkpoint_id!r} already exists in namespace {row.namespace!r}, so nothing was "
        "written; give each checkpoint a new id (persistkit's own ids are unique)"
    )


def map_error(
    exc: psycopg.Error, action: str, thread_id: str | None, url: str, *, write: bool = False
) -> BackendError:
    """The persistkit error for a driver error; the caller raises it ``from exc``.

    ``write``: the operation was a write that is not idempotent, so a connection lost
    around it leaves its outcome unknown (only then does the message say so)."""
    where = f" of thread {thread_id!r}" if thread_id is not None else ""
    state = exc.sqlstate or ""
    detail = f"{type(exc).__name__}: {str(exc).strip() or 'no message'}"
    if state in _TRANSIENT_STATES or (
        isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
        and not state.startswith(_PERMANENT_CLASSES)
    ):
        advice = (
            "It is safe to retry; the write may or may not have committed, so read the head (or the kv key) first."
            if write
            else "The operation is idempotent: it is safe to retry."
        )
        return BackendUnavailableError(
            f"PostgreSQL store {url}: {action}{where} failed with a transient error ({detail}). {advice}"
        )
    if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
        return BackendError(
            f"PostgreSQL store {url}: {action}{where} failed because persistkit's tables are "
            f"missing ({detail}). Run `persistkit migrate {url}` or open the store with migrate=True."
        )
    return BackendError(f"PostgreSQL store {url}: {action}{where} failed ({detail})")
