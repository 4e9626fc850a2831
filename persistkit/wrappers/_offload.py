"""Large blobs and rows go to a second backend; the primary keeps a small pointer.

``pk.connect("postgresql://...", blobs="s3://bucket/prefix", blob_threshold=...)``
wraps the primary store in :class:`OffloadBackend`. A 5 MB tool output then
costs the database a ~100-byte pointer instead of 5 MB, wherever it is: a
channel value or a big step result (blobs), or items appended to a list
channel, which travel inside the step's checkpoint row (payload key ``sg``).
A row whose payload is larger than the threshold is stored whole in the blob
backend under ``r:<sha256 of the payload>``, and the primary's row keeps its
ids, parent and run (so listing, run filters and the head CAS are unchanged)
with a pointer as its payload. Reads of rows (``get``, ``list``) fetch and
check offloaded payloads, a page of rows in one ``get_blobs``.

Write order: large blobs go to the blob backend first (``put_blobs``; keys
are immutable, so this is idempotent and safe to repeat), then the primary's
atomic ``write`` stores the checkpoint with pointers in their place. A crash
or a lost compare-and-swap in between leaves only unreferenced objects in the
blob backend; nothing becomes visible, because reads start at the primary.

Pointer format: ``b"\\x00PKREF1:" + <size> + b":" + <sha256 hex> + b":" + <key>``.
The codec's envelopes start with ``0x01`` or ``0x02``, and a blob that happens
to start with the marker is offloaded whatever its size, so an inline value in
the primary starting with the marker is always a pointer (rows alike). Reads check size
and hash: a missing or altered offloaded object is an ``IntegrityError`` that
names the thread and key. Data loss is never silent.

kv values (the shared space) above the threshold (or starting with the marker)
go the same way: the object is put first, under ``v:<sha256>`` in the blob
thread of the value's scope, ``__persistkit__kv:<scope>`` (:func:`kv_blob_thread`;
the blob store has no head there, so ``threads()`` never lists it), then the
primary's ``kv_write`` stores the pointer. Reads fetch and check the objects, a
page in one ``get_blobs``. Objects are content-addressed, so equal values of one
scope share one, and no version owns its object: a version pushed out by
``keep``, a delete, and a lost compare-and-swap all leave objects behind. They
stay until ``kv_drop`` of the scope deletes its blob thread (after the primary's
scope, so no pointer outlives its object; a write racing the drop may still
land a pointer whose object is gone, read as an ``IntegrityError``, as for
``delete_thread``).
"""

from __future__ import annotations

import builtins
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .._errors import ConfigurationError, IntegrityError
from ..backends._protocol import (
    RESERVED_THREAD,
    Backend,
    CheckpointRow,
    ForwardLeases,
    Head,
    KvEntry,
    KvOp,
)
from ._kv import ValueKv, kv_where
from ._options import MARKER

__all__ = ["DEFAULT_THRESHOLD", "KV_BLOB_THREAD", "OffloadBackend", "kv_blob_thread"]

DEFAULT_THRESHOLD = 256 * 1024
_MARKER = MARKER  # what the store holds in place of a value (the wrappers above offload know it too)


@dataclass(frozen=True, slots=True)
class _Ref:
    size: int
    sha256: str
    key: str


def _pointer(key: str, value: bytes) -> bytes:
    digest = hashlib.sha256(value).hexdigest()
    return _MARKER + f"{len(value)}:{digest}:{key}".encode("ascii")


def _rewritten_target(key: str, value: bytes) -> str:
    """Where ``rewrite`` puts new bytes of an offloaded blob: a fresh object, so the
    pointer swap in the primary is the only switch and no reader sees a mismatch."""
    return f"{key}.r{hashlib.sha256(value).hexdigest()[:16]}"


def _parse(thread_id: str, key: str, value: bytes) -> _Ref:
    try:
        size, digest, target = value[len(_MARKER) :].decode("ascii").split(":", 2)
        return _Ref(int(size), digest, target)
    except (UnicodeDecodeError, ValueError) as exc:
        raise IntegrityError(
            f"thread {thread_id!r}: blob {key!r} holds a malformed offload pointer"
        ) from exc


def _row_key(payload: bytes) -> str:
    return "r:" + hashlib.sha256(payload).hexdigest()


#: The blob thread of a kv scope is this plus the scope (reserved, as ``secrets._handlekey``'s).
KV_BLOB_THREAD = RESERVED_THREAD + "kv:"


def kv_blob_thread(scope: str) -> str:
    """The thread of the blob store that holds the offloaded kv values of ``scope``."""
    return KV_BLOB_THREAD + scope


def _kv_resolve(scope: str, entries: Sequence[KvEntry], fetched: Mapping[str, bytes]) -> builtins.list[KvEntry]:
    out: builtins.list[KvEntry] = []
    for e in entries:
        if e.value is None or not e.value.startswith(_MARKER):
            out.append(e)
            continue
        ref = _parse(kv_blob_thread(scope), e.key, e.value)
        value = fetched.get(ref.key)
        if value is None or len(value) != ref.size or hashlib.sha256(value).hexdigest() != ref.sha256:
            state = "is missing" if value is None else f"does not match its pointer ({len(value)} bytes, expected {ref.size})"
            raise IntegrityError(
                f"{kv_where(scope, e.key, e.version)} was offloaded to the blob store under thread "
                f"{kv_blob_thread(scope)!r} key {ref.key!r}, and that object {state}. Restore the blob "
                "store from a backup, or write the key again."
            )
        out.append(KvEntry(e.key, e.version, value))
    return out


class OffloadBackend(ForwardLeases, ValueKv, Backend):
    """``primary`` for everything; blobs above ``threshold`` bytes live in ``blobs``.

    Both are ordinary backends (typically SQL/Redis + S3). Blob keys are the
    same in both, per thread. ``delete_thread`` deletes from both.
    """

    # Large blobs reach the blob store before the primary's atomic write.
    atomic_blobs: ClassVar[bool] = False

    def __init__(
        self, primary: Backend, blobs: Backend, *, threshold: int = DEFAULT_THRESHOLD
    ) -> None:
        if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 0:
            raise ConfigurationError(f"blob_threshold must be a byte count >= 0, got {threshold!r}")
        self.primary = primary
        self.blobs = blobs
        self.threshold = threshold
        # native_async is a ClassVar on Backend; this wrapper is as native as its primary.
        setattr(self, "native_async", primary.native_async)  # noqa: B010
        self.url = f"{primary.url} (blobs: {blobs.url})"

    @property
    def inner(self) -> Backend:
        """The store this wraps, as every wrapper names it (the blob store is ``blobs``)."""
        return self.primary

    @classmethod
    def from_url(cls, url: str, **options: Any) -> OffloadBackend:
        """Not opened from a URL: use ``pk.connect(url, blobs="s3://...")``."""
        raise ConfigurationError(
            "OffloadBackend wraps two stores; open it with "
            "pk.connect('<primary url>', blobs='s3://bucket/prefix') or "
            "OffloadBackend(primary, blobs, threshold=...)"
        )

    # -- the decisions (no I/O), shared by the sync and async paths ---------------

    def _split(self, blobs: Mapping[str, bytes]) -> tuple[dict[str, bytes], dict[str, bytes]]:
        """(what the primary stores, what goes to the blob backend first)."""
        inline: dict[str, bytes] = {}
        large: dict[str, bytes] = {}
        for key, value in blobs.items():
            if len(value) > self.threshold or value.startswith(_MARKER):
                large[key] = value
                inline[key] = _pointer(key, value)
            else:
                inline[key] = value
        return inline, large

    def _split_row(self, row: CheckpointRow) -> tuple[CheckpointRow, dict[str, bytes]]:
        """(the row the primary stores, its payload for the blob backend if offloaded)."""
        payload = row.payload
        if len(payload) <= self.threshold and not payload.startswith(_MARKER):
            return row, {}
        key = _row_key(payload)
        pointer = CheckpointRow(
            row.thread_id, row.namespace, row.checkpoint_id, row.parent_id, row.run_id, _pointer(key, payload)
        )
        return pointer, {key: payload}

    def _split_rows(
        self, rows: Sequence[CheckpointRow]
    ) -> tuple[builtins.list[CheckpointRow], dict[str, bytes]]:
        out: builtins.list[CheckpointRow] = []
        large: dict[str, bytes] = {}
        for row in rows:
            stored, payload = self._split_row(row)
            out.append(stored)
            large.update(payload)
        return out, large

    @staticmethod
    def _row_refs(thread_id: str, rows: Sequence[CheckpointRow]) -> dict[str, _Ref]:
        """Offload pointers among ``rows``' payloads, by checkpoint id."""
        return {
            r.checkpoint_id: _parse(thread_id, f"row {r.checkpoint_id}", r.payload)
            for r in rows
            if r.payload.startswith(_MARKER)
        }

    @staticmethod
    def _resolve_rows(
        thread_id: str,
        rows: Sequence[CheckpointRow],
        refs: Mapping[str, _Ref],
        fetched: Mapping[str, bytes],
    ) -> builtins.list[CheckpointRow]:
        out: builtins.list[CheckpointRow] = []
        for row in rows:
            ref = refs.get(row.checkpoint_id)
            if ref is None:
                out.append(row)
                continue
            value = fetched.get(ref.key)
            if value is None or len(value) != ref.size or hashlib.sha256(value).hexdigest() != ref.sha256:
                state = "is missing" if value is None else f"does not match its pointer ({len(value)} bytes, expected {ref.size})"
                raise IntegrityError(
                    f"thread {thread_id!r}: checkpoint {row.checkpoint_id} (namespace {row.namespace!r}) "
                    f"was offloaded to the blob store under key {ref.key!r}, and that object {state}. "
                    "The checkpoint cannot be read; restore the blob store from a backup or fork the "
                    "thread from an earlier checkpoint."
                )
            out.append(
                CheckpointRow(row.thread_id, row.namespace, row.checkpoint_id, row.parent_id, row.run_id, value)
            )
        return out

    @staticmethod
    def _refs(thread_id: str, found: Mapping[str, bytes]) -> dict[str, _Ref]:
        return {k: _parse(thread_id, k, v) for k, v in found.items() if v.startswith(_MARKER)}

    @staticmethod
    def _resolve(
        thread_id: str,
        found: Mapping[str, bytes],
        refs: Mapping[str, _Ref],
        fetched: Mapping[str, bytes],
    ) -> dict[str, bytes]:
        out = dict(found)
        for key, ref in refs.items():
            value = fetched.get(ref.key)
            if value is None:
                raise IntegrityError(
                    f"thread {thread_id!r}: blob {key!r} was offloaded to the blob store "
                    f"under key {ref.key!r}, and that object is missing. The checkpoint "
                    "that references it cannot be restored; restore the blob store from "
                    "a backup or fork the thread from an earlier checkpoint."
                )
            if len(value) != ref.size or hashlib.sha256(value).hexdigest() != ref.sha256:
                raise IntegrityError(
                    f"thread {thread_id!r}: offloaded blob {key!r} (key {ref.key!r}) does "
                    f"not match its pointer ({len(value)} bytes, expected {ref.size})."
                )
            out[key] = value
        return out

    # -- writes ---------------------------------------------------------------------

    def write(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int) -> Head:
        inline, large = self._split(blobs)
        row, payload = self._split_row(row)
        if large or payload:
            self.blobs.put_blobs(row.thread_id, {**large, **payload})
        return self.primary.write(row, inline, expected_version)

    def put_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        inline, large = self._split(blobs)
        if large:
            self.blobs.put_blobs(thread_id, large)
        self.primary.put_blobs(thread_id, inline)

    async def awrite(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int
    ) -> Head:
        inline, large = self._split(blobs)
        row, payload = self._split_row(row)
        if large or payload:
            await self.blobs.aput_blobs(row.thread_id, {**large, **payload})
        return await self.primary.awrite(row, inline, expected_version)

    def lease_inner(self) -> Backend:
        return self.primary

    def write_fenced(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int) -> Head:
        inline, large = self._split(blobs)  # as write: big blobs and a big row go to the blob store
        row, payload = self._split_row(row)
        if large or payload:
            self.blobs.put_blobs(row.thread_id, {**large, **payload})
        return self.primary.write_fenced(row, inline, expected_version, fence)

    async def awrite_fenced(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int) -> Head:
        inline, large = self._split(blobs)
        row, payload = self._split_row(row)
        if large or payload:
            await self.blobs.aput_blobs(row.thread_id, {**large, **payload})
        return await self.primary.awrite_fenced(row, inline, expected_version, fence)

    async def aput_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        inline, large = self._split(blobs)
        if large:
            await self.blobs.aput_blobs(thread_id, large)
        await self.primary.aput_blobs(thread_id, inline)

    # -- kv values: big ones to the scope's blob thread first (ValueKv drives) ------------

    def _kv_split(self, ops: Sequence[KvOp]) -> tuple[builtins.list[KvOp], dict[str, bytes]]:
        """(the ops the primary stores, the objects for the blob store)."""
        stored: builtins.list[KvOp] = []
        large: dict[str, bytes] = {}
        for op in ops:
            v = op.value
            if v is None or (len(v) <= self.threshold and not v.startswith(_MARKER)):
                stored.append(op)
                continue
            key = "v:" + hashlib.sha256(v).hexdigest()
            large[key] = bytes(v)
            stored.append(KvOp(op.key, op.expected, _pointer(key, v)))
        return stored, large

    @staticmethod
    def _kv_wanted(scope: str, entries: Sequence[KvEntry]) -> builtins.list[str]:
        refs = {_parse(kv_blob_thread(scope), e.key, e.value).key for e in entries if e.value and e.value.startswith(_MARKER)}
        return sorted(refs)

    def _kv_seal(self, scope: str, ops: Sequence[KvOp]) -> builtins.list[KvOp]:
        stored, large = self._kv_split(ops)
        if large:
            self.blobs.put_blobs(kv_blob_thread(scope), large)
        return stored

    async def _akv_seal(self, scope: str, ops: Sequence[KvOp]) -> builtins.list[KvOp]:
        stored, large = self._kv_split(ops)
        if large:
            await self.blobs.aput_blobs(kv_blob_thread(scope), large)
        return stored

    def _kv_open(self, scope: str, entries: Sequence[KvEntry]) -> builtins.list[KvEntry]:
        wanted = self._kv_wanted(scope, entries)
        if not wanted:
            return list(entries)
        return _kv_resolve(scope, entries, self.blobs.get_blobs(kv_blob_thread(scope), wanted))

    async def _akv_open(self, scope: str, entries: Sequence[KvEntry]) -> builtins.list[KvEntry]:
        wanted = self._kv_wanted(scope, entries)
        if not wanted:
            return list(entries)
        return _kv_resolve(scope, entries, await self.blobs.aget_blobs(kv_blob_thread(scope), wanted))

    def kv_drop(self, scope: str) -> bool:
        # the primary first: once its pointers are gone nothing references the objects
        existed = self.primary.kv_drop(scope)
        self.blobs.delete_thread(kv_blob_thread(scope))
        return existed

    async def akv_drop(self, scope: str) -> bool:
        existed = await self.primary.akv_drop(scope)
        await self.blobs.adelete_thread(kv_blob_thread(scope))
        return existed

    # -- maintenance -------------------------------------------------------------------

    def _split_rewrite(
        self, existing: Mapping[str, bytes], blobs: Mapping[str, bytes]
    ) -> tuple[dict[str, bytes], dict[str, bytes]]:
        """(new primary bytes, new blob-store objects) for the keys the primary has."""
        inline: dict[str, bytes] = {}
        large: dict[str, bytes] = {}
        for key, value in blobs.items():
            if key not in existing:
                continue  # rewrite never creates a key
            if len(value) > self.threshold or value.startswith(_MARKER):
                target = _rewritten_target(key, value)
                large[target] = value
                digest = hashlib.sha256(value).hexdigest()
                inline[key] = _MARKER + f"{len(value)}:{digest}:{target}".encode("ascii")
            else:
                inline[key] = value
        return inline, large

    def rewrite(
        self, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]
    ) -> None:
        # The old offloaded object stays in the blob store (unreferenced) until
        # delete_thread: a reader holding the old pointer may still be fetching it.
        existing = self.primary.get_blobs(thread_id, list(blobs)) if blobs else {}
        inline, large = self._split_rewrite(existing, blobs)
        stored, payloads = self._split_rows(rows)
        if large or payloads:
            self.blobs.put_blobs(thread_id, {**large, **payloads})
        self.primary.rewrite(thread_id, stored, inline)

    async def arewrite(
        self, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]
    ) -> None:
        existing = await self.primary.aget_blobs(thread_id, list(blobs)) if blobs else {}
        inline, large = self._split_rewrite(existing, blobs)
        stored, payloads = self._split_rows(rows)
        if large or payloads:
            await self.blobs.aput_blobs(thread_id, {**large, **payloads})
        await self.primary.arewrite(thread_id, stored, inline)

    def namespaces(self, thread_id: str) -> builtins.list[str]:
        return self.primary.namespaces(thread_id)

    async def anamespaces(self, thread_id: str) -> builtins.list[str]:
        return await self.primary.anamespaces(thread_id)

    # -- blob reads -------------------------------------------------------------------

    def _fetch(self, thread_id: str, found: dict[str, bytes]) -> dict[str, bytes]:
        refs = self._refs(thread_id, found)
        if not refs:
            return found
        fetched = self.blobs.get_blobs(thread_id, sorted({r.key for r in refs.values()}))
        return self._resolve(thread_id, found, refs, fetched)

    async def _afetch(self, thread_id: str, found: dict[str, bytes]) -> dict[str, bytes]:
        refs = self._refs(thread_id, found)
        if not refs:
            return found
        keys = sorted({r.key for r in refs.values()})
        fetched = await self.blobs.aget_blobs(thread_id, keys)
        return self._resolve(thread_id, found, refs, fetched)

    def _fetch_rows(self, thread_id: str, rows: builtins.list[CheckpointRow]) -> builtins.list[CheckpointRow]:
        refs = self._row_refs(thread_id, rows)
        if not refs:
            return rows
        fetched = self.blobs.get_blobs(thread_id, sorted({r.key for r in refs.values()}))
        return self._resolve_rows(thread_id, rows, refs, fetched)

    async def _afetch_rows(
        self, thread_id: str, rows: builtins.list[CheckpointRow]
    ) -> builtins.list[CheckpointRow]:
        refs = self._row_refs(thread_id, rows)
        if not refs:
            return rows
        fetched = await self.blobs.aget_blobs(thread_id, sorted({r.key for r in refs.values()}))
        return self._resolve_rows(thread_id, rows, refs, fetched)

    def get_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        return self._fetch(thread_id, self.primary.get_blobs(thread_id, keys))

    def scan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        return self._fetch(thread_id, self.primary.scan_blobs(thread_id, start, stop))

    async def aget_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        return await self._afetch(thread_id, await self.primary.aget_blobs(thread_id, keys))

    async def ascan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        found = await self.primary.ascan_blobs(thread_id, start, stop)
        return await self._afetch(thread_id, found)

    # -- rows: the primary's, with offloaded payloads fetched --------------------------

    def get(self, thread_id: str, namespace: str, checkpoint_id: str) -> CheckpointRow | None:
        row = self.primary.get(thread_id, namespace, checkpoint_id)
        return None if row is None else self._fetch_rows(thread_id, [row])[0]

    def list(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[CheckpointRow]:
        rows = self.primary.list(thread_id, namespace, run_id=run_id, before=before, limit=limit)
        return self._fetch_rows(thread_id, rows)

    async def aget(
        self, thread_id: str, namespace: str, checkpoint_id: str
    ) -> CheckpointRow | None:
        row = await self.primary.aget(thread_id, namespace, checkpoint_id)
        return None if row is None else (await self._afetch_rows(thread_id, [row]))[0]

    async def alist(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[CheckpointRow]:
        rows = await self.primary.alist(
            thread_id, namespace, run_id=run_id, before=before, limit=limit
        )
        return await self._afetch_rows(thread_id, rows)

    # -- everything else is the primary's ----------------------------------------------

    def head(self, thread_id: str, namespace: str) -> Head | None:
        return self.primary.head(thread_id, namespace)

    def threads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        return self.primary.threads(prefix=prefix, after=after, limit=limit)

    async def ahead(self, thread_id: str, namespace: str) -> Head | None:
        return await self.primary.ahead(thread_id, namespace)

    async def athreads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        return await self.primary.athreads(prefix=prefix, after=after, limit=limit)

    # -- deletion and lifecycle ----------------------------------------------------------

    def delete_thread(self, thread_id: str) -> bool:
        # primary first: once its pointers are gone nothing can reference the blob objects
        in_primary = self.primary.delete_thread(thread_id)
        return self.blobs.delete_thread(thread_id) or in_primary

    async def adelete_thread(self, thread_id: str) -> bool:
        in_primary = await self.primary.adelete_thread(thread_id)
        return await self.blobs.adelete_thread(thread_id) or in_primary

    # -- prune (retention): the primary's rows, then the objects only they pointed to ------

    @property
    def supports_prune(self) -> bool:
        return self.primary.supports_prune and self.blobs.supports_prune

    def prune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        rows: builtins.list[CheckpointRow] = []  # the chain as stored: pointers, not payloads
        before = None
        while True:
            page = self.primary.list(thread_id, namespace, before=before, limit=500)
            rows.extend(page)
            if len(page) < 500:
                break
            before = page[-1].checkpoint_id
        deleted = self.primary.prune_rows(thread_id, namespace, checkpoint_ids)
        orphans = _row_objects(thread_id, rows, set(checkpoint_ids))
        if deleted and orphans:
            self.blobs.delete_blobs(thread_id, orphans)
        return deleted

    async def aprune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        rows: builtins.list[CheckpointRow] = []
        before = None
        while True:
            page = await self.primary.alist(thread_id, namespace, before=before, limit=500)
            rows.extend(page)
            if len(page) < 500:
                break
            before = page[-1].checkpoint_id
        deleted = await self.primary.aprune_rows(thread_id, namespace, checkpoint_ids)
        orphans = _row_objects(thread_id, rows, set(checkpoint_ids))
        if deleted and orphans:
            await self.blobs.adelete_blobs(thread_id, orphans)
        return deleted

    def delete_blobs(self, thread_id: str, keys: Sequence[str]) -> int:
        # primary first (its pointers), then the objects; a key may be in either
        in_primary = self.primary.delete_blobs(thread_id, keys)
        self.blobs.delete_blobs(thread_id, keys)
        return in_primary

    async def adelete_blobs(self, thread_id: str, keys: Sequence[str]) -> int:
        in_primary = await self.primary.adelete_blobs(thread_id, keys)
        await self.blobs.adelete_blobs(thread_id, keys)
        return in_primary

    def blob_sizes(self, thread_id: str) -> dict[str, int]:
        return _sizes(self.primary.blob_sizes(thread_id), self.blobs.blob_sizes(thread_id))

    async def ablob_sizes(self, thread_id: str) -> dict[str, int]:
        return _sizes(await self.primary.ablob_sizes(thread_id), await self.blobs.ablob_sizes(thread_id))

    def close(self) -> None:
        try:
            self.primary.close()
        finally:
            self.blobs.close()

    async def aclose(self) -> None:
        try:
            await self.primary.aclose()
        finally:
            await self.blobs.aclose()


def _row_objects(thread_id: str, rows: Sequence[CheckpointRow], doomed: set[str]) -> builtins.list[str]:
    """The blob-store objects of the offloaded payloads of the ``doomed`` rows (``rows``: the
    chain, newest first, as it was before the prune) that no row still there points to.
    The head's row and anything newer are never pruned, so they are never orphaned."""
    head = rows[0].checkpoint_id if rows else ""
    targets: dict[str, bool] = {}  # object key -> still pointed to
    for r in rows:
        if r.payload.startswith(_MARKER):
            key = _parse(thread_id, r.checkpoint_id, r.payload).key
            kept = r.checkpoint_id not in doomed or r.checkpoint_id >= head
            targets[key] = targets.get(key, False) or kept
    return sorted(k for k, kept in targets.items() if not kept)


def _sizes(primary: Mapping[str, int], objects: Mapping[str, int]) -> dict[str, int]:
    """Each blob key of the primary with the size of what it holds: the object's for an
    offloaded value (the primary holds its pointer)."""
    return {k: objects.get(k, n) for k, n in primary.items()}

