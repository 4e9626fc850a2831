"""Raw access to each store's storage, bypassing persistkit: the tampering tools of
``test_integrity.py`` (sqlite3 on the file, psycopg on the tables, redis-py on the
keys, the memory store's dicts)."""

from __future__ import annotations

import copy
import sqlite3
from typing import Any
from urllib.parse import parse_qs, urlsplit

from persistkit.backends import CheckpointRow


class Raw:
    """Edits a store's storage directly, bypassing persistkit."""

    #: The head is not stored but read off the newest row: deleting the
    #: newest rows rewinds it rather than leaving it dangling (SQLite, PostgreSQL).
    derived_head = False

    def rows(self, t: str) -> list[tuple[str, str | None, str | None, bytes]]:
        raise NotImplementedError  # (checkpoint_id, parent_id, run_id, payload), oldest first

    def head(self, t: str) -> tuple[str, int]:
        raise NotImplementedError

    def set_head(self, t: str, cid: str, version: int) -> None:
        raise NotImplementedError

    def delete_row(self, t: str, cid: str) -> None:
        raise NotImplementedError

    def set_row(self, t: str, cid: str, column: str, value: Any) -> None:
        raise NotImplementedError

    def insert_row(self, t: str, cid: str, parent: str | None, run: str | None, payload: bytes) -> None:
        raise NotImplementedError

    def blobs(self, t: str) -> dict[str, bytes]:
        raise NotImplementedError

    def set_blob(self, t: str, key: str, data: bytes) -> None:
        raise NotImplementedError

    def snapshot(self, threads: list[str]) -> Any:
        raise NotImplementedError

    def restore(self, snap: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class MemoryRaw(Raw):
    def __init__(self, url: str) -> None:
        from persistkit.backends.memory import _NAMED

        self.data = _NAMED[url.partition("://")[2]]

    def rows(self, t: str) -> list[tuple[str, str | None, str | None, bytes]]:
        got = self.data.rows.get((t, ""), {})
        return [(r.checkpoint_id, r.parent_id, r.run_id, r.payload) for _, r in sorted(got.items())]

    def head(self, t: str) -> tuple[str, int]:
        h = self.data.heads[(t, "")]
        return h.checkpoint_id, h.version

    def set_head(self, t: str, cid: str, version: int) -> None:
        from persistkit.backends import Head

        self.data.heads[(t, "")] = Head(cid, version)

    def delete_row(self, t: str, cid: str) -> None:
        del self.data.rows[(t, "")][cid]

    def set_row(self, t: str, cid: str, column: str, value: Any) -> None:
        import dataclasses

        rows = self.data.rows[(t, "")]
        rows[cid] = dataclasses.replace(rows[cid], **{column: value})

    def insert_row(self, t: str, cid: str, parent: str | None, run: str | None, payload: bytes) -> None:
        self.data.rows.setdefault((t, ""), {})[cid] = CheckpointRow(t, "", cid, parent, run, payload)

    def blobs(self, t: str) -> dict[str, bytes]:
        return dict(self.data.blobs.get(t, {}))

    def set_blob(self, t: str, key: str, data: bytes) -> None:
        self.data.blobs[t][key] = data

    def snapshot(self, threads: list[str]) -> Any:
        return copy.deepcopy((self.data.heads, self.data.rows, self.data.blobs))

    def restore(self, snap: Any) -> None:
        self.data.heads, self.data.rows, self.data.blobs = copy.deepcopy(snap)


class SQLRaw(Raw):
    """SQLite and PostgreSQL: the same statements, different tables and placeholders."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        if kind == "sqlite":
            self.con: Any = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
            # No heads table: a thread's head is its newest row with a version.
            self.t = {"c": "pk_checkpoints", "b": "pk_blobs"}
            self.derived_head = True
            self.newest = "checkpoint_id"  # the head: the newest row that carries a version
            self.p = "?"
        else:
            import psycopg

            parts = urlsplit(url)
            schema = parse_qs(parts.query)["schema"][0]
            self.con = psycopg.connect(parts._replace(query="").geturl(), autocommit=True)
            # No heads table either (migration 3): the head is the row with the highest version.
            self.t = {"c": f"{schema}.checkpoints", "b": f"{schema}.blobs"}
            self.derived_head = True
            self.newest = "version"
            self.p = "%s"

    def _q(self, sql: str, *args: Any) -> list[Any]:
        cur = self.con.execute(sql.format(**self.t).replace("?", self.p), args)
        return list(cur.fetchall()) if cur.description else []

    def rows(self, t: str) -> list[tuple[str, str | None, str | None, bytes]]:
        got = self._q(
            "SELECT checkpoint_id, parent_id, run_id, payload FROM {c} WHERE thread_id = ? AND namespace = '' "
            "ORDER BY checkpoint_id", t)
        return [(a, b, c, bytes(d)) for a, b, c, d in got]

    def head(self, t: str) -> tuple[str, int]:
        if self.derived_head:
            (row,) = self._q("SELECT checkpoint_id, version FROM {c} WHERE thread_id = ? AND namespace = '' "
                             f"AND version IS NOT NULL ORDER BY {self.newest} DESC LIMIT 1", t)
        else:
            (row,) = self._q("SELECT checkpoint_id, version FROM {h} WHERE thread_id = ? AND namespace = ''", t)
        return row[0], int(row[1])

    def set_head(self, t: str, cid: str, version: int) -> None:
        if self.derived_head:
            # The head is the newest versioned row: unversion the rows after it, version it.
            self._q("UPDATE {c} SET version = NULL WHERE thread_id = ? AND namespace = '' "
                    "AND (checkpoint_id > ? OR version >= ?)", t, cid, version)
            self._q("UPDATE {c} SET version = ? WHERE thread_id = ? AND namespace = '' AND checkpoint_id = ?",
                    version, t, cid)
            return
        self._q("UPDATE {h} SET checkpoint_id = ?, version = ? WHERE thread_id = ? AND namespace = ''",
                cid, version, t)

    def delete_row(self, t: str, cid: str) -> None:
        self._q("DELETE FROM {c} WHERE thread_id = ? AND namespace = '' AND checkpoint_id = ?", t, cid)

    def set_row(self, t: str, cid: str, column: str, value: Any) -> None:
        assert column in ("payload", "parent_id", "run_id", "checkpoint_id")
        self._q(f"UPDATE {{c}} SET {column} = ? WHERE thread_id = ? AND namespace = '' AND checkpoint_id = ?",
                value, t, cid)

    def insert_row(self, t: str, cid: str, parent: str | None, run: str | None, payload: bytes) -> None:
        self._q("INSERT INTO {c} (thread_id, namespace, checkpoint_id, parent_id, run_id, payload) "
                "VALUES (?, '', ?, ?, ?, ?)", t, cid, parent, run, payload)

    def blobs(self, t: str) -> dict[str, bytes]:
        return {k: bytes(v) for k, v in self._q("SELECT key, data FROM {b} WHERE thread_id = ?", t)}

    def set_blob(self, t: str, key: str, data: bytes) -> None:
        self._q("UPDATE {b} SET data = ? WHERE thread_id = ? AND key = ?", data, t, key)

    def snapshot(self, threads: list[str]) -> Any:
        snap: dict[str, list[Any]] = {}
        for name, table in self.t.items():
            snap[name] = []
            for t in threads:
                snap[name] += self._q(f"SELECT * FROM {table} WHERE thread_id = ?", t)
        return threads, snap

    def restore(self, snap: Any) -> None:
        threads, rows = snap
        for name, table in self.t.items():
            for t in threads:
                self._q(f"DELETE FROM {table} WHERE thread_id = ?", t)
            for row in rows[name]:
                row = tuple(row)
                version = None
                if self.kind == "sqlite" and name == "c":
                    # An INSERT with a head version fires the store's compare-and-swap
                    # trigger; put the row back as a file restore would, then its version.
                    row, version = (*row[:6], None), row[6]
                marks = ", ".join([self.p] * len(row))
                self.con.execute(f"INSERT INTO {table} VALUES ({marks})", row)
                if version is not None:
                    self._q("UPDATE {c} SET version = ? WHERE thread_id = ? AND namespace = ? AND checkpoint_id = ?",
                            version, row[0], row[1], row[2])

    def close(self) -> None:
        self.con.close()


class RedisRaw(Raw):
    """The Redis layout of ``persistkit/backends/redis.py`` (row hash, id and run indexes, head hash)."""

    def __init__(self, url: str) -> None:
        import redis

        from persistkit.backends._redis_ops import Keys

        parts = urlsplit(url)
        self.r = redis.Redis.from_url(parts._replace(query="").geturl())
        self.k = Keys(parse_qs(parts.query)["prefix"][0], 0)

    def _n(self, t: str, kind: bytes) -> bytes:
        return self.k.ns(t, "", kind)

    def _row(self, t: str, cid: str) -> CheckpointRow:
        from persistkit.backends._redis_ops import _unpack

        return _unpack(t, "", cid, self.r.hget(self._n(t, b"r"), cid))

    def _put(self, row: CheckpointRow, old_run: str | None = None) -> None:
        from persistkit.backends._redis_ops import _b64, _pack

        cid = row.checkpoint_id.encode()
        self.r.hset(self._n(row.thread_id, b"r"), cid, _pack(row))
        self.r.zadd(self._n(row.thread_id, b"i"), {cid: 0})
        if old_run is not None:
            self.r.zrem(self._n(row.thread_id, b"u"), _b64(old_run) + b":" + cid)
        if row.run_id is not None:
            self.r.zadd(self._n(row.thread_id, b"u"), {_b64(row.run_id) + b":" + cid: 0})

    def rows(self, t: str) -> list[tuple[str, str | None, str | None, bytes]]:
        cids = sorted(c.decode() for c in self.r.hkeys(self._n(t, b"r")))
        return [(c, r.parent_id, r.run_id, r.payload) for c in cids for r in [self._row(t, c)]]

    def head(self, t: str) -> tuple[str, int]:
        h = self.r.hgetall(self._n(t, b"h"))
        return h[b"c"].decode(), int(h[b"v"])

    def set_head(self, t: str, cid: str, version: int) -> None:
        self.r.hset(self._n(t, b"h"), mapping={"c": cid, "v": version})

    def delete_row(self, t: str, cid: str) -> None:
        row = self._row(t, cid)
        self.r.hdel(self._n(t, b"r"), cid)
        self.r.zrem(self._n(t, b"i"), cid)
        if row.run_id is not None:
            from persistkit.backends._redis_ops import _b64

            self.r.zrem(self._n(t, b"u"), _b64(row.run_id) + b":" + cid.encode())

    def set_row(self, t: str, cid: str, column: str, value: Any) -> None:
        import dataclasses

        row = self._row(t, cid)
        self._put(dataclasses.replace(row, **{column: value}), old_run=row.run_id)

    def insert_row(self, t: str, cid: str, parent: str | None, run: str | None, payload: bytes) -> None:
        self._put(CheckpointRow(t, "", cid, parent, run, payload))

    def blobs(self, t: str) -> dict[str, bytes]:
        return {k.decode(): v for k, v in self.r.hgetall(self.k.thread(t) + b"b").items()}

    def set_blob(self, t: str, key: str, data: bytes) -> None:
        self.r.hset(self.k.thread(t) + b"b", key, data)

    def _keys(self, t: str) -> list[bytes]:
        return list(self.r.scan_iter(match=self.k.thread(t) + b"*"))

    def snapshot(self, threads: list[str]) -> Any:
        return threads, {key: self.r.dump(key) for t in threads for key in self._keys(t)}

    def restore(self, snap: Any) -> None:
        threads, dumps = snap
        for t in threads:
            for key in self._keys(t):
                self.r.delete(key)
        for key, data in dumps.items():
            self.r.restore(key, 0, data, replace=True)

    def close(self) -> None:
        self.r.close()


