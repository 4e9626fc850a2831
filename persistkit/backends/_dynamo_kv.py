"""The DynamoDB store's versioned key-value space and watch (``kv``, ``watch``), a mixin of ``DynamoBackend``.

Layout: partition ``p = "k" + scope``
-------------------------------------
``l!<K>``
    The latest version of key ``<K>`` (``_s3_keys._thread_seg`` of the key: keys over
    240 UTF-8 bytes become ``<first 240 bytes>.<sha256>``; ``kk`` holds the real key):
    ``kv`` its version, ``v`` its value (absent for a tombstone).
``v!<K>!<version, 12 digits>``
    Every kept version, the latest included.

``kv_write`` is ONE ``TransactWriteItems`` for the whole batch: per key an
``Update`` of ``l!<K>`` conditional on ``kv = expected`` (``attribute_not_exists``
for 0) and a ``Put`` of the new version item. A failed condition cancels all of
it, and the reason's item is the key as it is (``ConflictError(found=...)``).
Then versions beyond ``keep`` are trimmed: one Query of the key's versions at or
below ``new - keep`` and a ``BatchWriteItem`` deleting them (and their chunks),
only when ``new > keep``. A crash between the two leaves extra old versions,
readable and correct, trimmed by the key's next write. A transaction holds at most
100 items, so a batch writes at most 50 keys (more is a ``ConfigurationError``).

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

from .._errors import ConfigurationError, ConflictError, StoreClosedError
from ._dynamo_items import DynamoCalls, chunk_nonce, n, num, pack, reasons, s
from ._protocol import KvEntry, KvHint, KvOp, KvWatch
from ._s3_keys import _MAX_ID_BYTES, _b64, _prefix_seg, _thread_seg, _utf8

__all__ = ["DynamoKv"]

_MAX_BATCH = 50


def _ver(version: int) -> str:
    return f"{version:012d}"


class DynamoKv(DynamoCalls):
    def _kv_setup(self, watch_interval: float) -> None:
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
            return None if item is None else self._entry(p, key, num(item, "kv"), item)
        if version < 1:
            return None
        item = self._get(p, f"v!{kseg}!{_ver(version)}", what)
        return None if item is None else self._entry(p, key, version, item)

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
        for item in self._query(
            p, f"reading history of {key!r}", between=(prefix, hi), forward=False, page=limit
        ):
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
            head = seg.split(".", 1)[0]
            if group and head != group_head:
                if emit(sorted(group, key=lambda e: e[0])):
                    return out
                group = []
            if "." in seg:
                group.append((key, item))
                group_head = head
            elif emit([(key, item)]):
                return out
        emit(sorted(group, key=lambda e: e[0]))
        return out

    def kv_write(self, scope: str, ops: Sequence[KvOp], *, keep: int) -> None:
        self._check_open()
        if not ops:
            return
        if len(ops) > _MAX_BATCH:
            raise ConfigurationError(
                f"a kv batch of {len(ops)} keys is too large for the DynamoDB store: a transaction "
                f"holds at most 100 items, so at most {_MAX_BATCH} keys a batch; split the batch"
            )
        p = "k" + scope
        actions: builtins.list[dict[str, Any]] = []
        chunks: builtins.list[dict[str, Any]] = []
        for op in ops:
            kseg, new = _thread_seg(op.key), op.expected + 1
            values: dict[str, Any] = {":nv": n(new), ":k": s(op.key)}
            version_item: dict[str, Any] = {
                "p": s(p),
                "s": s(f"v!{kseg}!{_ver(new)}"),
                "kk": s(op.key),
                "kv": n(new),
            }
            if op.value is None:
                expr = "SET kv = :nv, kk = :k REMOVE v"
            else:
                v, more = pack(p, op.value)
                chunks += more
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
                update["ConditionExpression"] = "attribute_not_exists(kv)"
            else:
                update["ConditionExpression"] = "kv = :e"
                values[":e"] = n(op.expected)
            actions += [
                {"Update": update},
                {"Put": {"TableName": self._table, "Item": version_item}},
            ]
        if chunks:
            self._batch_write(chunks, [], f"writing chunks of {scope!r}")
        try:
            self._transact(actions, f"writing keys of {scope!r}")
        except Exception as exc:
            got = reasons(exc)
            for i, op in enumerate(ops):
                if 2 * i < len(got) and got[2 * i].get("Code") == "ConditionalCheckFailed":
                    found = got[2 * i].get("Item") or {}
                    raise ConflictError(
                        key=op.key, namespace=scope, expected=op.expected, found=num(found, "kv")
                    ) from exc
            raise
        self._trim(
            p,
            [(_thread_seg(op.key), op.expected + 1 - keep) for op in ops if op.expected + 1 > keep],
        )

    def _trim(self, p: str, cuts: Sequence[tuple[str, int]]) -> None:
        """Delete the versions at or below each cut (and their chunks)."""
        gone: builtins.list[tuple[str, str]] = []
        for kseg, cut in cuts:
            prefix = f"v!{kseg}!"
            for item in self._query(
                p, "trimming old versions", between=(prefix, prefix + _ver(cut))
            ):
                gone.append((p, str(item["s"]["S"])))
                nonce = chunk_nonce(item.get("v"))
                if nonce is not None:
                    gone += [(p, str(c["s"]["S"])) for c in self._chunks(p, f"c!{nonce}!")]
        if gone:
            self._batch_write([], gone, "trimming old versions")

    def kv_drop(self, scope: str) -> bool:
        self._check_open()
        p = "k" + scope
        keys = [(p, str(i["s"]["S"])) for i in self._query(p, f"dropping {scope!r}")]
        self._batch_write([], keys, f"dropping {scope!r}")
        return any(k.startswith("l!") for _, k in keys)

    def watch_open(self, scope: str) -> KvWatch:
        self._check_open()
        watch = _DynamoWatch(self, scope, self._watch_interval)
        with self._watch_lock:
            self._watches.add(watch)
        return watch

    def _kv_versions(self, scope: str) -> dict[str, int]:
        return {
            str(i["kk"]["S"]): num(i, "kv")
            for i in self._query("k" + scope, f"watching {scope!r}", begins="l!", project="kk, kv")
        }


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
