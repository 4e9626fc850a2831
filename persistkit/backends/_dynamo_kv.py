"""The DynamoDB store's versioned key-value space and watch (``kv``, ``watch``), a mixin of ``DynamoBackend``.

Layout: partition ``p = "k" + scope``
-------------------------------------
``l!<K>``
    The latest version of key ``<K>`` (``_s3_keys._thread_seg`` of the key: keys over
    240 UTF-8 bytes become ``<first 240 bytes>.<sha256>``; ``kk`` holds the real key):
    ``kv`` its version, ``v`` its value (absent for a tombstone).
``v!<K>!<version, 12 digits>``
    Every kept version, the latest included.
``x!<id>``
    The record of a batch larger than one transaction (``_dynamo_kvbatch``).

A batch that fits one ``TransactWriteItems`` (at most 50 keys and about 3.5 MB, 2
items a key) is ONE transaction: per key an ``Update`` of ``l!<K>`` conditional on
``kv = expected`` (``attribute_not_exists`` for 0) and on the key not being held by a
larger batch (no ``xb``), and a ``Put`` of the new version item. A failed condition
cancels all of it, and the reason's item is the key as it is: held by a batch, the
key is settled (or waited for while that batch is in flight) and the transaction
sent again; otherwise ``ConflictError(found=...)``. Then versions beyond ``keep`` are
trimmed: one Query of the key's versions at or below ``new - keep`` and a
``BatchWriteItem`` deleting them (and their chunks), only when ``new > keep``. A crash
between the two leaves extra old versions, readable and correct, trimmed by the key's
next write. A larger batch commits through a record (``_dynamo_kvbatch``), and every
read here sees a key held by one through its record (``_view``, ``_visible``).

Watch: DynamoDB Streams would push, but need a stream on the table and a reader
per shard; a watch instead Queries the scope's ``l!`` items every
``watch_interval`` seconds (option, default 1) and diffs versions: each key that
moved is a ``KvHint(key, version)``.
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Sequence
from typing import Any

from .._errors import ConflictError, StoreClosedError
from ._dynamo_items import INLINE_MAX, n, num, pack, reasons, s
from ._dynamo_kvbatch import BATCH_INLINE_MAX, DynamoKvBatch, fits_one_transaction
from ._dynamo_kvbatch import ver as _ver
from ._protocol import KvEntry, KvHint, KvOp, KvWatch
from ._s3_keys import _MAX_ID_BYTES, _b64, _prefix_seg, _thread_seg, _utf8

__all__ = ["DynamoKv"]


class DynamoKv(DynamoKvBatch):
    def _kv_setup(self, watch_interval: float, pending_timeout: float) -> None:
        self._batch_setup(pending_timeout)
        self._watch_interval = watch_interval
        self._watches: set[_DynamoWatch] = set()
        self._watch_lock = threading.Lock()

    def _kv_close(self) -> None:
        with self._watch_lock:
            watches, self._watches = set(self._watches), set()
        for w in watches:
            w.close()

    def _entry(self, p: str, key: str, version: int, item: dict[str, Any]) -> KvEntry:
        value = None if "v" not in item else self._value(p, item["v"])
        if "v" in item and value is None:  # chunks trimmed under us: the version is gone
            value = b""
        return KvEntry(key, version, value)

    def kv_get(self, scope: str, key: str, version: int | None = None) -> KvEntry | None:
        self._check_open()
        p, kseg = "k" + scope, _thread_seg(key)
        what = f"reading key {key!r} of {scope!r}"
        if version is None:
            item = self._get(p, "l!" + kseg, what)
            seen = None if item is None else self._view(p, item)
            return None if seen is None else self._entry(p, key, num(seen, "kv"), seen)
        if version < 1:
            return None
        item = self._get(p, f"v!{kseg}!{_ver(version)}", what)
        if item is None or not self._visible(p, item):
            return None
        return self._entry(p, key, version, item)

    def kv_history(
        self, scope: str, key: str, *, before: int | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        self._check_open()
        if limit is not None and limit <= 0:
            return []
        p, prefix = "k" + scope, f"v!{_thread_seg(key)}!"
        if before is not None and before <= 1:
            return []
        hi = prefix + (_ver(before - 1) if before is not None else "~")
        out: builtins.list[KvEntry] = []
        memo: dict[str, str] = {}
        for item in self._query(
            p, f"reading history of {key!r}", between=(prefix, hi), forward=False, page=limit
        ):
            if not self._visible(p, item, memo):
                continue  # a batch's version that is not committed (yet)
            out.append(self._entry(p, key, num(item, "kv"), item))
            if limit is not None and len(out) >= limit:
                break
        return out

    def kv_list(
        self, scope: str, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        self._check_open()
        if limit is not None and limit <= 0:
            return []
        p = "k" + scope
        pseg = "l!" + _prefix_seg(prefix)
        start = pseg
        if after is not None:
            raw = _utf8(after)
            start = max(
                start,
                "l!"
                + (_b64(raw) + '"' if len(raw) <= _MAX_ID_BYTES else _b64(raw[:_MAX_ID_BYTES])),
            )
        out: builtins.list[KvEntry] = []
        group: builtins.list[tuple[str, dict[str, Any]]] = []
        group_head = ""
        memo: dict[str, str] = {}

        def emit(items: builtins.list[tuple[str, dict[str, Any]]]) -> bool:
            for key, item in items:
                if "v" in item and key.startswith(prefix) and (after is None or key > after):
                    out.append(self._entry(p, key, num(item, "kv"), item))
                    if limit is not None and len(out) >= limit:
                        return True
            return False

        # Bounded above by the prefix's last key ("~" sorts after every segment character)
        # and paged, so a short listing (a claim reads 32) does not read the scope's
        # versions (``v!``, after ``l!``) or every later key; tombstones count toward a page.
        page = None if limit is None else min(max(2 * limit, 100), 1000)
        for item in self._query(p, f"listing {scope!r}", between=(start, pseg + "~"), page=page):
            seg = str(item["s"]["S"])
            if not seg.startswith(pseg):
                break
            key = str(item["kk"]["S"])
            seen = self._view(p, item, memo) or {}  # {}: no key yet (a batch's, not committed)
            head = seg.split(".", 1)[0]
            if group and head != group_head:
                if emit(sorted(group, key=lambda e: e[0])):
                    return out
                group = []
            if "." in seg:
                group.append((key, seen))
                group_head = head
            elif emit([(key, seen)]):
                return out
        emit(sorted(group, key=lambda e: e[0]))
        return out

    def kv_write(self, scope: str, ops: Sequence[KvOp], *, keep: int) -> None:
        self._check_open()
        if not ops:
            return
        p = "k" + scope
        one = fits_one_transaction([op.value for op in ops])
        packed: builtins.list[dict[str, Any] | None] = []
        chunks: builtins.list[dict[str, Any]] = []
        for op in ops:
            if op.value is None:
                packed.append(None)
            else:
                packed_value, more = pack(p, op.value, INLINE_MAX if one else BATCH_INLINE_MAX)
                packed.append(packed_value)
                chunks += more
        if chunks:
            self._batch_write(chunks, [], f"writing chunks of {scope!r}")
        if not one:
            self._write_batch(scope, ops, packed, keep)
            return
        actions: builtins.list[dict[str, Any]] = []
        for op, v in zip(ops, packed, strict=True):
            kseg, new = _thread_seg(op.key), op.expected + 1
            values: dict[str, Any] = {":nv": n(new), ":k": s(op.key)}
            version_item: dict[str, Any] = {
                "p": s(p),
                "s": s(f"v!{kseg}!{_ver(new)}"),
                "kk": s(op.key),
                "kv": n(new),
            }
            if v is None:
                expr = "SET kv = :nv, kk = :k REMOVE v"
            else:
                values[":v"] = v
                version_item["v"] = v
                expr = "SET kv = :nv, kk = :k, v = :v"
            update: dict[str, Any] = {
                "TableName": self._table,
                "Key": {"p": s(p), "s": s("l!" + kseg)},
                "UpdateExpression": expr,
                "ExpressionAttributeValues": values,
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
            if op.expected == 0:
                update["ConditionExpression"] = (
                    "attribute_not_exists(xb) AND attribute_not_exists(kv)"
                )
            else:
                update["ConditionExpression"] = "attribute_not_exists(xb) AND kv = :e"
                values[":e"] = n(op.expected)
            actions += [
                {"Update": update},
                {"Put": {"TableName": self._table, "Item": version_item}},
            ]
        while True:
            try:
                self._transact(actions, f"writing keys of {scope!r}")
                break
            except Exception as exc:
                got = reasons(exc)
                failed = [
                    (i, got[2 * i].get("Item") or {})
                    for i in range(len(ops))
                    if 2 * i < len(got) and got[2 * i].get("Code") == "ConditionalCheckFailed"
                ]
                if not failed:
                    raise
                i, item = failed[0]
                if "xb" not in item:  # the first failed key is not at its expected version
                    raise ConflictError(
                        key=ops[i].key,
                        namespace=scope,
                        expected=ops[i].expected,
                        found=num(item, "kv"),
                    ) from exc
                # held by a larger batch: settle it (or wait while it is in flight), then again
                if not self._settle(p, [it for _, it in failed if "xb" in it]):
                    time.sleep(0.05)
        self._trim(
            p,
            [(_thread_seg(op.key), op.expected + 1 - keep) for op in ops if op.expected + 1 > keep],
        )

    def kv_drop(self, scope: str) -> bool:
        self._check_open()
        p = "k" + scope
        items = list(self._query(p, f"dropping {scope!r}"))
        existed = any(
            str(i["s"]["S"]).startswith("l!") and self._view(p, i) is not None for i in items
        )
        self._batch_write([], [(p, str(i["s"]["S"])) for i in items], f"dropping {scope!r}")
        return existed

    def watch_open(self, scope: str) -> KvWatch:
        self._check_open()
        watch = _DynamoWatch(self, scope, self._watch_interval)
        with self._watch_lock:
            self._watches.add(watch)
        return watch

    def _kv_versions(self, scope: str) -> dict[str, int]:
        p, memo = "k" + scope, dict[str, str]()
        found = (
            self._view(p, i, memo)
            for i in self._query(p, f"watching {scope!r}", begins="l!", project="kk, kv, xb, xv")
        )
        return {str(i["kk"]["S"]): num(i, "kv") for i in found if i is not None}


class _DynamoWatch(KvWatch):
    """Polls the scope's latest-version items (see the module docstring)."""

    def __init__(self, store: DynamoKv, scope: str, interval: float) -> None:
        self._store = store
        self._scope = scope
        self._interval = interval
        self._closed = False
        self._seen = store._kv_versions(scope)
        self._next = time.monotonic() + interval

    def _poll(self) -> builtins.list[KvHint]:
        now = self._store._kv_versions(self._scope)
        hints = [KvHint(k, v) for k, v in now.items() if self._seen.get(k) != v]
        self._seen = now
        return hints

    def hints(self, timeout: float) -> builtins.list[KvHint]:
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            if self._closed:
                raise StoreClosedError("this DynamoDB kv watch is closed; open a new one")
            wait = self._next - time.monotonic()
            if wait > 0:
                if time.monotonic() + wait > deadline:
                    time.sleep(max(deadline - time.monotonic(), 0.0))
                    if time.monotonic() < self._next:
                        return []
                else:
                    time.sleep(wait)
            self._next = time.monotonic() + self._interval
            hints = self._poll()
            if hints or time.monotonic() >= deadline:
                return hints

    def close(self) -> None:
        self._closed = True
        with self._store._watch_lock:
            self._store._watches.discard(self)
