"""The in-process store: the reference implementation of the store protocol.

Short on purpose: one lock, plain dicts, every method a few lines. When the
protocol's docstrings leave a question open, this file is the answer.

URLs
----
``memory://``
    A fresh private store, gone when the backend is garbage-collected.
``memory://NAME``
    A process-wide store shared by every backend opened with the same NAME
    (so two instances see the same data). Closing an instance does not clear
    the shared data; it lives as long as the process.
"""

from __future__ import annotations

# builtins.list: inside the class body, `list` names the list() method.
import builtins
import dataclasses
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import parse_qsl

from .._errors import (
    BackendError,
    ConfigurationError,
    ConflictError,
    LeaseLostError,
    StoreClosedError,
)
from . import unknown_options
from ._protocol import (
    CheckpointRow,
    Head,
    KvEntry,
    KvHint,
    KvOp,
    KvWatch,
    LeaseRecord,
    ThreadedAsync,
)
from ._prune import sorted_ids

__all__ = ["MemoryBackend"]


class _Data:
    """The storage behind one private or named store; every access holds ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.leases: dict[tuple[str, str], LeaseRecord] = {}
        self.heads: dict[tuple[str, str], Head] = {}
        self.rows: dict[tuple[str, str], dict[str, CheckpointRow]] = {}
        self.blobs: dict[str, dict[str, bytes]] = {}
        # kv: scope -> key -> its kept versions, oldest first (the last is the latest)
        self.kv: dict[str, dict[str, builtins.list[KvEntry]]] = {}
        self.watches: dict[str, weakref.WeakSet[_MemoryWatch]] = {}


class _MemoryWatch(KvWatch):
    """Hints of one scope's writes, appended by the writer under the store's lock."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._ready = threading.Condition()
        self._pending: dict[str, int] = {}
        self._closed = False

    def notify(self, hints: builtins.list[KvHint]) -> None:
        with self._ready:
            for h in hints:
                if h.key is not None:
                    self._pending[h.key] = max(h.version, self._pending.get(h.key, 0))
            self._ready.notify_all()

    def hints(self, timeout: float) -> builtins.list[KvHint]:
        with self._ready:
            if self._closed:
                raise StoreClosedError(f"this watch on {self._url!r} was closed; open a new one")
            if not self._pending:
                self._ready.wait_for(lambda: self._pending or self._closed, timeout=max(timeout, 0.0))
            found = [KvHint(k, v) for k, v in self._pending.items()]
            self._pending.clear()
            return found

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()


_NAMED: dict[str, _Data] = {}
_NAMED_LOCK = threading.Lock()


class MemoryBackend(ThreadedAsync):
    """Checkpoints in dicts. Not durable: for tests, examples and as the reference."""

    schemes: ClassVar[tuple[str, ...]] = ("memory",)
    capabilities: ClassVar[frozenset[str]] = frozenset({"fencing", "leases", "kv", "watch", "prune"})

    def __init__(self, data: _Data | None = None, url: str = "memory://") -> None:
        self._data = data if data is not None else _Data()
        self._closed = False
        self.url = url

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MemoryBackend:
        """``memory://`` (private) or ``memory://NAME`` (shared in this process). No options."""
        if options:
            raise unknown_options("memory", url, options, ())
        scheme, sep, name = url.partition("://")
        if scheme.lower() != "memory" or not sep:
            raise ConfigurationError(
                f"not a memory URL: {url!r}; use 'memory://' or 'memory://NAME'"
            )
        if "?" in name or "#" in name:
            query = name.partition("?")[2].partition("#")[0]
            given = [k for k, _ in parse_qsl(query, keep_blank_values=True)] or [name]
            raise unknown_options("memory", url, given, (), "use 'memory://' or 'memory://NAME'")
        if not name:
            return cls(_Data(), url)
        with _NAMED_LOCK:
            data = _NAMED.setdefault(name, _Data())
        return cls(data, url)

    def _open(self) -> _Data:
        if self._closed:
            raise StoreClosedError(f"the store {self.url!r} was closed; open a new one")
        return self._data

    # -- writes ----------------------------------------------------------------

    def write(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int) -> Head:
        return self._write(row, blobs, expected_version, None)

    def write_fenced(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int
    ) -> Head:
        return self._write(row, blobs, expected_version, fence)

    def _write(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int | None
    ) -> Head:
        d = self._open()
        # Copy before taking the lock: bytearray/memoryview inputs become bytes
        # the caller can no longer mutate (a row of bytes, the engine's, is kept as it is).
        if type(row.payload) is not bytes:
            row = dataclasses.replace(row, payload=bytes(row.payload))
        copied = {k: bytes(v) for k, v in blobs.items()}
        key = (row.thread_id, row.namespace)
        with d.lock:  # the lease check and the write: one atomic step
            if fence is not None:
                lease = d.leases.get(key)
                if lease is None or lease.token != fence:
                    raise LeaseLostError(
                        thread_id=row.thread_id, namespace=row.namespace, token=fence, found=lease.token if lease else 0
                    )
            current = d.heads.get(key)
            found = current.version if current else 0
            if found != expected_version:
                raise ConflictError(
                    thread_id=row.thread_id,
                    namespace=row.namespace,
                    expected=expected_version,
                    found=found,
                    found_checkpoint=current.checkpoint_id if current else None,
                )
            rows = d.rows.setdefault(key, {})
            if row.checkpoint_id in rows:
                raise BackendError(
                    f"thread {row.thread_id!r}: checkpoint {row.checkpoint_id} already exists; "
                    "checkpoint ids are never reused"
                )
            self._put(d, row.thread_id, copied)
            rows[row.checkpoint_id] = row
            head = Head(row.checkpoint_id, expected_version + 1)
            d.heads[key] = head
            return head

    def put_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        d = self._open()
        copied = {k: bytes(v) for k, v in blobs.items()}
        with d.lock:
            self._put(d, thread_id, copied)

    @staticmethod
    def _put(d: _Data, thread_id: str, blobs: dict[str, bytes]) -> None:
        if not blobs:
            return
        stored = d.blobs.setdefault(thread_id, {})
        for k, v in blobs.items():
            stored.setdefault(k, v)  # existing keys keep their bytes

    # -- reads -----------------------------------------------------------------

    def head(self, thread_id: str, namespace: str) -> Head | None:
        d = self._open()
        with d.lock:
            return d.heads.get((thread_id, namespace))

    def head_row(self, thread_id: str, namespace: str) -> tuple[Head, CheckpointRow] | None:
        d = self._open()
        with d.lock:
            head = d.heads.get((thread_id, namespace))
            return (head, d.rows[(thread_id, namespace)][head.checkpoint_id]) if head is not None else None

    def get(self, thread_id: str, namespace: str, checkpoint_id: str) -> CheckpointRow | None:
        d = self._open()
        with d.lock:
            return d.rows.get((thread_id, namespace), {}).get(checkpoint_id)

    def list(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> list[CheckpointRow]:
        d = self._open()
        with d.lock:
            rows = [*d.rows.get((thread_id, namespace), {}).values()]
        rows.sort(key=lambda r: r.checkpoint_id, reverse=True)
        picked = [
            r
            for r in rows
            if (run_id is None or r.run_id == run_id)
            and (before is None or r.checkpoint_id < before)
        ]
        return picked if limit is None else picked[: max(limit, 0)]

    def get_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        d = self._open()
        with d.lock:
            stored = d.blobs.get(thread_id, {})
            return {k: stored[k] for k in keys if k in stored}

    def scan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        d = self._open()
        with d.lock:
            stored = d.blobs.get(thread_id, {})
            return {k: v for k, v in sorted(stored.items()) if start <= k < stop}

    def threads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        d = self._open()
        with d.lock:
            ids = {t for t, _ in d.heads}
        picked = sorted(t for t in ids if t.startswith(prefix) and (after is None or t > after))
        return picked if limit is None else picked[: max(limit, 0)]

    def namespaces(self, thread_id: str) -> builtins.list[str]:
        d = self._open()
        with d.lock:
            found = {ns for t, ns in d.heads if t == thread_id}
            found |= {ns for (t, ns), rows in d.rows.items() if t == thread_id and rows}
        return sorted(found)

    # -- maintenance -------------------------------------------------------------

    def rewrite(
        self, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]
    ) -> None:
        d = self._open()
        new_rows = [(r.namespace, r.checkpoint_id, bytes(r.payload)) for r in rows]
        new_blobs = {k: bytes(v) for k, v in blobs.items()}
        with d.lock:
            for ns, cid, payload in new_rows:
                stored = d.rows.get((thread_id, ns), {})
                old = stored.get(cid)
                if old is not None:  # parent and run id stay the stored ones
                    stored[cid] = dataclasses.replace(old, payload=payload)
            kept = d.blobs.get(thread_id, {})
            for k, v in new_blobs.items():
                if k in kept:
                    kept[k] = v

    # -- deletion and lifecycle ------------------------------------------------

    def delete_thread(self, thread_id: str) -> bool:
        d = self._open()
        with d.lock:
            keys = [k for k in d.heads if k[0] == thread_id]
            keys += [k for k in d.rows if k[0] == thread_id and k not in d.heads]
            existed = bool(keys) or thread_id in d.blobs
            for k in keys:
                d.heads.pop(k, None)
                d.rows.pop(k, None)
            d.blobs.pop(thread_id, None)
            return existed

    # -- prune (retention) ------------------------------------------------------------

    def prune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        d = self._open()
        with d.lock:
            head = d.heads.get((thread_id, namespace))
            rows = d.rows.get((thread_id, namespace), {})
            gone = [c for c in sorted_ids(checkpoint_ids) if c in rows and head is not None and c < head.checkpoint_id]
            for c in gone:
                del rows[c]
            return len(gone)

    def delete_blobs(self, thread_id: str, keys: Sequence[str]) -> int:
        d = self._open()
        with d.lock:
            stored = d.blobs.get(thread_id, {})
            return sum(stored.pop(k, None) is not None for k in set(keys))

    def blob_sizes(self, thread_id: str) -> dict[str, int]:
        d = self._open()
        with d.lock:
            return {k: len(v) for k, v in d.blobs.get(thread_id, {}).items()}

    def close(self) -> None:
        """Mark this instance closed. The data of a named store stays for other instances."""
        self._closed = True

    # -- leases ------------------------------------------------------------------

    def lease_get(self, thread_id: str, namespace: str) -> LeaseRecord | None:
        d = self._open()
        with d.lock:
            return d.leases.get((thread_id, namespace))

    def lease_swap(self, thread_id: str, namespace: str, expected: int, token: int, data: bytes) -> bool:
        d = self._open()
        with d.lock:
            current = d.leases.get((thread_id, namespace))
            if (current.version if current else 0) != expected:
                return False
            d.leases[(thread_id, namespace)] = LeaseRecord(token, bytes(data), expected + 1)
            return True

    def lease_list(self, *, prefix: str = "") -> builtins.list[tuple[str, str, LeaseRecord]]:
        d = self._open()
        with d.lock:
            return sorted((t, ns, rec) for (t, ns), rec in d.leases.items() if t.startswith(prefix))


    # -- kv ------------------------------------------------------------------------

    def kv_get(self, scope: str, key: str, version: int | None = None) -> KvEntry | None:
        d = self._open()
        with d.lock:
            kept = d.kv.get(scope, {}).get(key)
            if not kept:
                return None
            if version is None:
                return kept[-1]
            return next((e for e in kept if e.version == version), None)

    def kv_history(
        self, scope: str, key: str, *, before: int | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        d = self._open()
        with d.lock:
            kept = [*d.kv.get(scope, {}).get(key, ())]
        picked = [e for e in reversed(kept) if before is None or e.version < before]
        return picked if limit is None else picked[: max(limit, 0)]

    def kv_list(
        self, scope: str, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        d = self._open()
        with d.lock:
            latest = [kept[-1] for kept in d.kv.get(scope, {}).values() if kept]
        picked = sorted(
            (e for e in latest if e.value is not None and e.key.startswith(prefix) and (after is None or e.key > after)),
            key=lambda e: e.key,
        )
        return picked if limit is None else picked[: max(limit, 0)]

    def kv_write(self, scope: str, ops: Sequence[KvOp], *, keep: int) -> None:
        d = self._open()
        entries = [KvEntry(op.key, op.expected + 1, None if op.value is None else bytes(op.value)) for op in ops]
        with d.lock:
            space = d.kv.get(scope, {})
            for op in ops:
                kept = space.get(op.key)
                found = kept[-1].version if kept else 0
                if found != op.expected:
                    raise ConflictError(key=op.key, namespace=scope, expected=op.expected, found=found)
            space = d.kv.setdefault(scope, space)
            for entry in entries:
                kept = space.setdefault(entry.key, [])
                kept.append(entry)
                del kept[: max(len(kept) - max(keep, 1), 0)]
            watches = [*d.watches.get(scope, ())]
        hints = [KvHint(e.key, e.version) for e in entries]
        for w in watches:
            w.notify(hints)

    def kv_drop(self, scope: str) -> bool:
        d = self._open()
        with d.lock:
            return bool(d.kv.pop(scope, None))

    def watch_open(self, scope: str) -> KvWatch:
        d = self._open()
        watch = _MemoryWatch(self.url)
        with d.lock:
            d.watches.setdefault(scope, weakref.WeakSet()).add(watch)
        return watch
