"""The SQLite store's prune capability (retention): a mixin of :class:`~persistkit.backends.sqlite.SQLiteBackend`.

``prune_rows`` is one ``BEGIN IMMEDIATE`` transaction: it reads the head (the newest
versioned row), deletes the asked rows below it by primary key, and drops the run
index entries (``pk_runs``) of runs left with no row. Nothing else changes: no
trigger fires on a delete, and the head cannot move back because its row is never
deleted. ``blob_sizes`` reads ``length(data)``, not the bytes.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._protocol import Backend
from ._prune import sorted_ids

__all__ = ["SQLitePrune"]

_HEAD_ID = """SELECT checkpoint_id FROM pk_checkpoints
    WHERE thread_id = ? AND namespace = ? AND version IS NOT NULL
    ORDER BY checkpoint_id DESC LIMIT 1"""
_DELETE_ROW = "DELETE FROM pk_checkpoints WHERE thread_id = ? AND namespace = ? AND checkpoint_id = ?"
_DROP_EMPTY_RUNS = """DELETE FROM pk_runs WHERE thread_id = ? AND namespace = ? AND NOT EXISTS (
    SELECT 1 FROM pk_checkpoints c WHERE c.thread_id = pk_runs.thread_id
      AND c.namespace = pk_runs.namespace AND c.checkpoint_id >= pk_runs.first_id
      AND c.run_id = pk_runs.run_id)"""
_DELETE_BLOB = "DELETE FROM pk_blobs WHERE thread_id = ? AND key = ?"
_BLOB_SIZES = "SELECT key, length(data) FROM pk_blobs WHERE thread_id = ?"


class SQLitePrune(Backend):
    """``prune_rows``, ``delete_blobs`` and ``blob_sizes`` of the SQLite store."""

    if TYPE_CHECKING:  # provided by SQLiteBackend

        def _conn(self) -> sqlite3.Connection: ...

        def _mapped(self, op: str, thread_id: str | None = None) -> contextlib.AbstractContextManager[None]: ...

        @staticmethod
        def _transaction(conn: sqlite3.Connection) -> contextlib.AbstractContextManager[None]: ...

    def prune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        ids = sorted_ids(checkpoint_ids)
        if not ids:
            return 0
        conn = self._conn()
        with self._mapped("prune_rows", thread_id), self._transaction(conn):
            head = conn.execute(_HEAD_ID, (thread_id, namespace)).fetchone()
            if head is None:
                return 0
            gone = [(thread_id, namespace, c) for c in ids if c < head[0]]
            deleted = conn.executemany(_DELETE_ROW, gone).rowcount if gone else 0
            if deleted:
                conn.execute(_DROP_EMPTY_RUNS, (thread_id, namespace))
        return max(deleted, 0)

    def delete_blobs(self, thread_id: str, keys: Sequence[str]) -> int:
        wanted = sorted(set(keys))
        if not wanted:
            return 0
        conn = self._conn()
        with self._mapped("delete_blobs", thread_id), self._transaction(conn):
            deleted = conn.executemany(_DELETE_BLOB, [(thread_id, k) for k in wanted]).rowcount
        return max(deleted, 0)

    def blob_sizes(self, thread_id: str) -> dict[str, int]:
        conn = self._conn()
        with self._mapped("blob_sizes", thread_id):
            return {k: int(n) for k, n in conn.execute(_BLOB_SIZES, (thread_id,))}
