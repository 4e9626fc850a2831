"""The S3 store's versioned key-value space and watch (``kv``, ``watch``), a mixin of ``S3Backend``.

Layout under ``<prefix>/``
--------------------------
``kv/<scope>/<K>!<version>``
    One IMMUTABLE object per version of a key: a JSON header line (key, version,
    transaction id or null, tombstone flag) and the value. ``<K>`` is the key's
    order-preserving segment (``_s3_keys._thread_seg``: keys longer than 240 UTF-8
    bytes become ``<first 240 bytes>.<sha256>`` and their real key is read from the
    header) and ``<version>`` is zero-padded to 12 digits, so a ``ListObjectsV2`` of
    ``kv/<scope>/`` returns keys in code-point order and each key's versions oldest
    first: the last object of a key is its newest version.
``kvt/<scope>/<id>``
    The record of a multi-key batch: its status (``pending``, ``committed``,
    ``aborted``) and its ops. Moved only by ``PutObject`` with ``If-Match``.

Single-key writes (the common case)
-----------------------------------
Version ``n + 1`` is created with ``If-None-Match: *``, so of two writers from ``n``
exactly one creates it (the other gets 412: ``ConflictError``). Versions are dense:
before the PUT the writer lists the key's objects (one LIST) and checks that ``n`` is
the newest committed version (``0``: no object). Requests: LIST + PUT, plus one
``DeleteObjects`` when versions beyond ``keep`` go, plus one GET of the newest object's
header when this instance did not write it (its status is then cached by ETag).
``kv_get``: LIST + GET (an object this instance has not seen is read whole, header
and value at once); ``kv_get(version=)``: one GET; ``kv_list``: the LISTs of the range
plus one GET per key (in parallel, 16 at a time).

The conditions are evaluated atomically by AWS S3; moto (the test server) is run by
``tests/moto_s3.py``, which serializes conditional requests for the same reason as for
the heads (see ``s3.py``).

Multi-key batches (all or nothing)
----------------------------------
S3 has no transaction over two objects, so a batch commits through its record:

1. list every key (in parallel) and check its expected version: a stale op raises
   ``ConflictError`` before anything is written;
2. PUT the record ``kvt/<scope>/<id>`` with status ``pending``;
3. create the keys' version objects, each header naming ``<id>`` (``If-None-Match``,
   or ``If-Match`` over the object of an aborted batch in that slot), ONE BY ONE in
   key order: two batches over the same keys race for the same first slot, so one
   of them wins (in parallel each could take one key and both would lose);
4. flip the record to ``committed`` with ``If-Match`` its ETag: the commit point;
5. trim versions beyond ``keep`` (one ``DeleteObjects`` for all keys).

A reader that meets a version object of a ``pending`` or ``aborted`` (or missing)
record takes it for absent and reads the version below, so nothing of a batch is
visible before step 4 and all of it is after. A slot lost in step 3 flips the record
to ``aborted`` (``If-Match``) and raises ``ConflictError`` (its ``found`` is the key's
committed version, which equals ``expected`` when the slot is held by a batch still in
flight). A record found ``pending`` for longer than ``kv_pending_timeout`` (seconds,
option, default 10; age by the server's clock, ``Date`` minus ``Last-Modified``, or by
how long this instance has seen it pending) belongs to a crashed or stalled writer: a
reader or writer flips it to ``aborted``. A stalled writer's own flip to ``committed``
then fails and it raises ``ConflictError``; nothing of it was ever visible. A writer
that meets a young pending batch on one of its keys waits for it to settle (polls its
record every 50 ms); readers never wait. Committed and aborted are final, so both are
cached per instance. Requests per batch of N keys: N LISTs, N + 2 PUTs, one
``DeleteObjects`` when something is trimmed; a reader of a batch's version pays one
extra GET of its record, once per instance.

Leftovers, all harmless: a crash between a write and its trim leaves versions beyond
``keep`` (readable, correct history; the key's next write trims them).
The objects of an aborted batch stay in their slots, invisible, until the next writer
of each slot replaces them (``If-Match`` on the aborted object): they are not deleted
because a delete cannot be made conditional on the object still being the aborted
one, and a writer may already have replaced it. Batch records (a few hundred bytes
each) stay until ``kv_drop``.

Watch
-----
S3 cannot push: a watch lists ``kv/<scope>/`` and ``kvt/<scope>/`` every
``watch_interval`` seconds (option, default 1) and diffs the listing against the last
one: each key whose newest object changed is a ``KvHint(key, version)`` (LIST only, no
GET; a hashed long key or a record that changed status is a ``KvHint(None)``, "list
again", since a batch becomes visible when its record flips).
"""

from __future__ import annotations

import builtins
import json
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from .._errors import BackendError, BackendUnavailableError, ConflictError, StoreClosedError
from ._protocol import KvEntry, KvHint, KvOp, KvWatch
from ._s3_keys import (
    _CONFLICT_CODES,
    _MAX_ID_BYTES,
    _b64,
    _is_client_error,
    _map_error,
    _prefix_seg,
    _thread_seg,
    _unb64,
    _utf8,
)

__all__ = ["S3Kv"]

_MAGIC = b"PKS3KV1\n"
_VDIGITS = 12
_HEADER_READ = 16384  # a header (a key of 1024 escaped characters at most) fits in this
_COMMITTED, _PENDING, _ABORTED = "committed", "pending", "aborted"


@dataclass(frozen=True, slots=True)
class _Obj:
    """One listed version object."""

    name: str
    version: int
    etag: str


def _encode(key: str, version: int, txn: str | None, value: bytes | None) -> bytes:
    header = json.dumps({"k": key, "v": version, "t": txn, "d": value is None}).encode("ascii")
    return _MAGIC + header + b"\n" + (value or b"")


def _decode(data: bytes) -> tuple[str, int, str | None, bytes | None]:
    if not data.startswith(_MAGIC):
        raise BackendError("an S3 kv object has an unknown format (not written by persistkit?)")
    end = data.index(b"\n", len(_MAGIC))
    h = json.loads(data[len(_MAGIC) : end])
    return str(h["k"]), int(h["v"]), h["t"], None if h["d"] else data[end + 1 :]


class S3Kv:
    """kv_* and watch_open of ``S3Backend`` (see the module docstring)."""

    if TYPE_CHECKING:
        _client: Any
        _bucket: str
        _root: str
        _lock: threading.Lock
        url: str

        def _check_open(self) -> None: ...
        def _call(self, what: str, op: str, **kwargs: Any) -> Any: ...
        def _map(self, fn: Any, items: Sequence[Any]) -> builtins.list[Any]: ...
        def _delete_keys(self, keys: Sequence[str], what: str) -> None: ...

    def _kv_setup(self, watch_interval: float, pending_timeout: float) -> None:
        self._watch_interval = watch_interval
        self._pending_timeout = pending_timeout
        self._known: dict[str, str] = {}  # ETag of a version object -> its txn ("" = single write)
        self._settled: dict[str, str] = {}  # txn id -> committed/aborted, seen (both are final)
        self._seen_pending: dict[str, float] = {}  # txn id -> when this instance first saw it pending
        self._gates: dict[str, threading.RLock] = {}  # txn id -> held while its record is read

    # -- names -----------------------------------------------------------------------

    def _kv_base(self, scope: str) -> str:
        return f"{self._root}kv/{scope}/"

    def _kv_prefix(self, scope: str, key: str) -> str:
        return f"{self._kv_base(scope)}{_thread_seg(key)}!"

    def _txn_name(self, scope: str, txn: str) -> str:
        return f"{self._root}kvt/{scope}/{txn}"

    # -- low-level reads ---------------------------------------------------------------

    def _kv_listing(self, prefix: str, start_after: str = "") -> builtins.list[tuple[str, str]]:
        """(name, ETag) of every object under ``prefix``, ascending."""
        return list(self._kv_pages(prefix, start_after))

    def _kv_pages(self, prefix: str, start_after: str = "") -> Iterator[tuple[str, str]]:
        """``_kv_listing`` page by page, so a caller that has enough stops listing."""
        kwargs: dict[str, Any] = {"Prefix": prefix}
        if start_after:
            kwargs["StartAfter"] = start_after
        while True:
            resp = self._call(f"listing {prefix!r}", "list_objects_v2", **kwargs)
            for o in resp.get("Contents", ()):
                yield str(o["Key"]), str(o.get("ETag", ""))
            if not resp.get("IsTruncated"):
                return
            kwargs["ContinuationToken"] = resp["NextContinuationToken"]

    def _versions(self, scope: str, key: str) -> builtins.list[_Obj]:
        prefix = self._kv_prefix(scope, key)
        return [_Obj(n, int(n[len(prefix) :]), e) for n, e in self._kv_listing(prefix)]

    def _fetch(self, name: str, *, header_only: bool = False) -> tuple[bytes, str] | None:
        extra = {"Range": f"bytes=0-{_HEADER_READ - 1}"} if header_only else {}
        try:
            resp = self._client.get_object(Bucket=self._bucket, Key=name, **extra)
            return resp["Body"].read(), str(resp.get("ETag", ""))
        except Exception as exc:
            if _is_client_error(exc, {"NoSuchKey", "InvalidRange"}):
                return None
            raise _map_error(exc, f"reading kv object {name!r}") from exc

    def _txn_of(self, obj: _Obj) -> str | None:
        """The txn id of a version object ("" for a single write), None if it vanished."""
        with self._lock:
            known = self._known.get(obj.etag)
        if known is not None:
            return known
        got = self._fetch(obj.name, header_only=True)
        if got is None:
            return None
        txn = _decode(got[0])[2] or ""
        self._remember(got[1], txn)
        return txn

    def _remember(self, etag: str, txn: str) -> None:
        with self._lock:
            if len(self._known) > 100_000:
                self._known.clear()
            self._known[etag] = txn

    def _txn_status(self, scope: str, txn: str) -> str:
        """The status of a batch record; a pending one older than the timeout is aborted here."""
        if not txn:
            return _COMMITTED
        with self._lock:
            if txn in self._settled:
                return self._settled[txn]
            if len(self._gates) > 10_000:
                self._gates.clear()
            gate = self._gates.setdefault(txn, threading.RLock())
        with gate:  # parallel readers of one batch's keys read its record once
            with self._lock:
                if txn in self._settled:
                    return self._settled[txn]
            return self._read_status(scope, txn)

    def _read_status(self, scope: str, txn: str) -> str:
        name = self._txn_name(scope, txn)
        try:
            resp = self._client.get_object(Bucket=self._bucket, Key=name)
        except Exception as exc:
            if _is_client_error(exc, {"NoSuchKey"}):
                return _ABORTED  # records go only with kv_drop: its objects are leftovers
            raise _map_error(exc, f"reading kv batch record {name!r}") from exc
        record = json.loads(resp["Body"].read())
        status = str(record["s"])
        if status != _PENDING:
            self._note_settled(txn, status)
        elif self._age(txn, resp) > self._pending_timeout:
            return self._flip(scope, txn, record, str(resp.get("ETag", "")), _ABORTED)
        return status

    def _age(self, txn: str, resp: Any) -> float:
        """How long a record has been pending: by the server's clock, or by this instance's watch."""
        now = time.monotonic()
        with self._lock:
            first = self._seen_pending.setdefault(txn, now)
        server = 0.0
        try:
            date = resp["ResponseMetadata"]["HTTPHeaders"]["date"]
            server = (parsedate_to_datetime(date) - resp["LastModified"]).total_seconds()
        except (KeyError, TypeError, ValueError):
            pass
        return max(now - first, server)

    def _flip(self, scope: str, txn: str, record: dict[str, Any], etag: str, status: str) -> str:
        """Move a record to ``status`` (If-Match ``etag``); the status it has afterwards."""
        body = json.dumps(record | {"s": status}).encode("ascii")
        try:
            self._client.put_object(Bucket=self._bucket, Key=self._txn_name(scope, txn), Body=body, IfMatch=etag)
        except Exception as exc:
            if not _is_client_error(exc, _CONFLICT_CODES):
                raise _map_error(exc, f"settling kv batch {txn!r}") from exc
            with self._lock:
                self._seen_pending.pop(txn, None)
            return self._txn_status(scope, txn)  # someone else settled it first
        self._note_settled(txn, status)
        return status

    def _note_settled(self, txn: str, status: str) -> None:
        with self._lock:
            self._seen_pending.pop(txn, None)
            self._gates.pop(txn, None)
            if len(self._settled) > 100_000:
                self._settled.clear()
            self._settled[txn] = status

    def _settle(self, scope: str, objs: builtins.list[_Obj]) -> tuple[int, int]:
        """(index in ``objs`` of the newest committed version or -1, its version or 0):
        objects of pending or aborted batches above it are skipped."""
        for i in range(len(objs) - 1, -1, -1):
            txn = self._txn_of(objs[i])
            if txn is not None and self._txn_status(scope, txn) == _COMMITTED:
                return i, objs[i].version
        return -1, 0

    # -- reads ---------------------------------------------------------------------------

    def _entry(self, name: str) -> KvEntry | None:
        got = self._fetch(name)
        if got is None:
            return None
        key, version, txn, value = _decode(got[0])
        self._remember(got[1], txn or "")
        return KvEntry(key, version, value)

    def _latest_once(self, scope: str, objs: builtins.list[_Obj]) -> KvEntry | None:
        """The newest committed version among ``objs`` (None: none, or one vanished)."""
        for obj in reversed(objs):
            with self._lock:
                txn = self._known.get(obj.etag)
            entry: KvEntry | None = None
            if txn is None:  # status unknown: read the whole object (header and value) at once
                got = self._fetch(obj.name)
                if got is None:
                    return None
                key, version, read_txn, value = _decode(got[0])
                txn = read_txn or ""
                self._remember(got[1], txn)
                entry = KvEntry(key, version, value)
            if self._txn_status(scope, txn) == _COMMITTED:
                return entry or self._entry(obj.name)
        return None

    def _latest(self, scope: str, prefix: str, objs: builtins.list[_Obj]) -> KvEntry | None:
        """``_latest_once``, listing the key again when its objects moved meanwhile (a write
        trimmed the version this read chose): None only for a listing that held still."""
        for _ in range(50):
            found = self._latest_once(scope, objs)
            if found is not None or not objs:
                return found
            again = [_Obj(n, int(n[len(prefix) :]), e) for n, e in self._kv_listing(prefix)]
            if again == objs:
                return None
            objs = again
        raise BackendUnavailableError(f"S3 kv key under {prefix!r} kept changing while being read; retry")

    def kv_get(self, scope: str, key: str, version: int | None = None) -> KvEntry | None:
        self._check_open()
        prefix = self._kv_prefix(scope, key)
        if version is not None:
            if version <= 0:
                return None
            # a kept committed version, or a pending/aborted batch's object in the top slot
            got = self._fetch(f"{prefix}{version:0{_VDIGITS}d}")
            if got is None:
                return None
            k, v, txn, value = _decode(got[0])
            self._remember(got[1], txn or "")
            return KvEntry(k, v, value) if self._txn_status(scope, txn or "") == _COMMITTED else None
        return self._latest(scope, prefix, self._versions(scope, key))

    def kv_history(
        self, scope: str, key: str, *, before: int | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        self._check_open()
        if limit is not None and limit <= 0:
            return []
        objs = self._versions(scope, key)
        idx, _ = self._settle(scope, objs)
        picked = [o for o in reversed(objs[: idx + 1]) if before is None or o.version < before]
        picked = picked if limit is None else picked[:limit]
        return [e for e in self._map(lambda o: self._entry(o.name), picked) if e is not None]

    def kv_list(
        self, scope: str, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        self._check_open()
        if limit is not None and limit <= 0:
            return []
        base = self._kv_base(scope)
        start = ""
        if after is not None:
            raw = _utf8(after)
            # '"' sorts above '!' (end of after's own objects) and below the alphabet
            start = base + (_b64(raw) + '"' if len(raw) <= _MAX_ID_BYTES else _b64(raw[:_MAX_ID_BYTES]))
        out: builtins.list[KvEntry] = []
        chunk = max(min(limit or 64, 256), 16)

        def resolve(units: builtins.list[builtins.list[tuple[str, builtins.list[_Obj]]]]) -> bool:
            """Add the live entries of complete ``units`` to ``out``; True once ``limit`` is reached."""
            groups = [group for unit in units for group in unit]
            found = self._map(lambda g: self._latest(scope, f"{base}{g[0]}!", g[1]), groups)
            # units are in key order; inside a unit of hashed long keys only the values know it
            for e in sorted((e for e in found if e is not None), key=lambda e: _utf8(e.key)):
                if e.value is not None and e.key.startswith(prefix) and (after is None or e.key > after):
                    out.append(e)
                    if limit is not None and len(out) >= limit:
                        return True
            return False

        # A unit is one key's objects, or those of every hashed long key sharing its first
        # 240 bytes (their order is only known from the values); units complete in key order,
        # resolved a chunk at a time, so a listing with a limit stops early.
        units: builtins.list[builtins.list[tuple[str, builtins.list[_Obj]]]] = []
        last_unit = ""
        for name, etag in self._kv_pages(base + _prefix_seg(prefix), start):
            seg, _, ver = name[len(base) :].rpartition("!")
            obj = _Obj(name, int(ver), etag)
            if units and units[-1][-1][0] == seg:
                units[-1][-1][1].append(obj)
                continue
            unit = seg.split(".", 1)[0] + "." if "." in seg else seg
            if units and unit == last_unit and unit.endswith("."):
                units[-1].append((seg, [obj]))
                continue
            if len(units) >= chunk:  # a new unit starts, so all before it are complete
                if resolve(units):
                    return out
                units = []
            units.append([(seg, [obj])])
            last_unit = unit
        resolve(units)
        return out

    # -- writes --------------------------------------------------------------------------

    def _plan(self, scope: str, op: KvOp) -> tuple[builtins.list[_Obj], str | None]:
        """The key's objects and the condition to create ``op.expected + 1`` with: None for
        If-None-Match, else the ETag of an aborted object in that slot. Waits for a young
        pending batch on the key; raises ConflictError when ``op.expected`` is not the newest."""
        while True:
            objs = self._versions(scope, op.key)
            idx, latest = self._settle(scope, objs)
            if latest != op.expected:
                raise ConflictError(key=op.key, namespace=scope, expected=op.expected, found=latest)
            above = objs[idx + 1 :]
            if not above:
                return objs, None
            txn = self._txn_of(above[0])
            if txn is None:
                continue  # vanished under us (replaced or dropped): look again
            status = self._txn_status(scope, txn)
            if status == _ABORTED:
                if len(above) > 1:  # only the slot above the newest version is ever written
                    raise BackendError(
                        f"S3 kv key {op.key!r} of scope {scope!r} has versions above an aborted batch's "
                        f"({[o.version for o in above]}): not written by this store; kv_drop the scope"
                    )
                return objs, above[0].etag
            if status == _COMMITTED:
                continue  # committed between the two reads: the listing is stale
            time.sleep(0.05)  # a batch in flight on this key: wait for it to settle

    def _create(self, name: str, body: bytes, etag: str | None, what: str) -> str | None:
        """Create ``name`` (or replace the aborted object ``etag``); its ETag, None if taken."""
        condition = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
        for _ in range(5):
            try:
                resp = self._client.put_object(Bucket=self._bucket, Key=name, Body=body, **condition)
                return str(resp.get("ETag", ""))
            except Exception as exc:
                if _is_client_error(exc, {"PreconditionFailed", "NoSuchKey"}):
                    return None
                if not _is_client_error(exc, {"ConditionalRequestConflict"}):  # AWS says: retry
                    raise _map_error(exc, what) from exc
        raise BackendUnavailableError(f"S3 kept reporting concurrent writes while {what}")

    def _found(self, scope: str, key: str) -> int:
        return self._settle(scope, self._versions(scope, key))[1]

    def kv_write(self, scope: str, ops: Sequence[KvOp], *, keep: int) -> None:
        self._check_open()
        if not ops:
            return
        keep = max(keep, 1)
        plans = self._map(lambda op: self._plan_or_conflict(scope, op), list(ops))
        for plan in plans:
            if isinstance(plan, ConflictError):
                raise plan  # the first stale op, in op order; nothing was written
        txn = secrets.token_hex(12) if len(ops) > 1 else None
        record: dict[str, Any] = {}
        record_etag = ""
        if txn is not None:
            record = {"s": _PENDING, "ops": [[op.key, op.expected + 1] for op in ops]}
            created = self._create(
                self._txn_name(scope, txn), json.dumps(record).encode("ascii"), None, "recording a kv batch"
            )
            if created is None:
                raise BackendError("S3 store: a kv batch record id was taken (random ids collide?); retry")
            record_etag = created

        def create(item: tuple[KvOp, tuple[builtins.list[_Obj], str | None]]) -> str | None:
            op, (_, slot) = item
            version = op.expected + 1
            body = _encode(op.key, version, txn, None if op.value is None else bytes(op.value))
            etag = self._create(
                f"{self._kv_prefix(scope, op.key)}{version:0{_VDIGITS}d}", body, slot, f"writing kv key {op.key!r}"
            )
            if etag is not None:
                self._remember(etag, txn or "")
            return etag

        # One by one in name order for a batch: two batches over the same keys race for the
        # same first slot, so one of them wins (in parallel each could take a key and both lose).
        items = sorted(zip(ops, plans, strict=True), key=lambda it: _utf8(it[0].key))
        made: dict[str, str] = {}
        lost: builtins.list[KvOp] = []
        for item in items:
            etag = create(item)
            if etag is None:
                lost.append(item[0])
                break
            made[item[0].key] = etag
        if txn is not None and not lost and self._flip(scope, txn, record, record_etag, _COMMITTED) != _COMMITTED:
            lost = [ops[0]]  # aborted as stalled by another instance before the commit
        if lost:
            if txn is not None:
                # Its objects stay: once the record says aborted, the next writer of a slot
                # may replace the object there (If-Match), and a delete cannot be made
                # conditional on the object still being ours.
                self._flip(scope, txn, record, record_etag, _ABORTED)
            op = lost[0]
            raise ConflictError(key=op.key, namespace=scope, expected=op.expected, found=self._found(scope, op.key))
        old = [o.name for op, (objs, _) in zip(ops, plans, strict=True) for o in objs if o.version <= op.expected + 1 - keep]
        if old:
            self._delete_keys(old, f"removing kv versions beyond keep={keep}")

    def _plan_or_conflict(self, scope: str, op: KvOp) -> tuple[builtins.list[_Obj], str | None] | ConflictError:
        try:
            return self._plan(scope, op)
        except ConflictError as exc:
            return exc

    def kv_drop(self, scope: str) -> bool:
        self._check_open()
        names = [n for n, _ in self._kv_listing(self._kv_base(scope))]
        records = [n for n, _ in self._kv_listing(f"{self._root}kvt/{scope}/")]
        if names or records:
            self._delete_keys(names + records, f"dropping kv scope {scope!r}")
        return bool(names)

    def watch_open(self, scope: str) -> KvWatch:
        self._check_open()
        return _S3Watch(self, scope, self._watch_interval)


class _S3Watch(KvWatch):
    """Polls the scope's listing every ``interval`` seconds and diffs it (see the module docstring)."""

    def __init__(self, store: S3Kv, scope: str, interval: float) -> None:
        self._store = store
        self._scope = scope
        self._interval = interval
        self._lock = threading.Lock()
        self._closed = False
        self._last, self._records = self._snapshot()
        self._polled = time.monotonic()
        self._lost = False  # a poll failed: the next good one says "list again"

    def _snapshot(self) -> tuple[dict[str, tuple[int, str]], dict[str, str]]:
        base = self._store._kv_base(self._scope)
        tops: dict[str, tuple[int, str]] = {}
        for name, etag in self._store._kv_listing(base):
            seg, _, ver = name[len(base) :].rpartition("!")
            tops[seg] = (int(ver), etag)  # ascending: the last one wins
        records = dict(self._store._kv_listing(f"{self._store._root}kvt/{self._scope}/"))
        return tops, records

    def _poll(self) -> builtins.list[KvHint]:
        tops, records = self._snapshot()
        self._polled = time.monotonic()
        hints: builtins.list[KvHint] = []
        relist = any(self._records.get(n, e) != e for n, e in records.items())
        for seg, top in tops.items():
            if self._last.get(seg) != top:
                if "." in seg:
                    relist = True
                else:
                    hints.append(KvHint(_unb64(seg).decode("utf-8", "surrogatepass"), top[0]))
        relist = relist or self._lost or any(seg not in tops for seg in self._last)  # a dropped scope
        self._last, self._records, self._lost = tops, records, False
        return [KvHint(None), *hints] if relist else hints

    def hints(self, timeout: float) -> builtins.list[KvHint]:
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._lock:
            while True:
                if self._closed:
                    raise StoreClosedError(f"this watch on {self._store.url!r} was closed; open a new one")
                self._store._check_open()
                now = time.monotonic()
                if now >= self._polled + self._interval:
                    try:
                        found = self._poll()
                    except BackendUnavailableError:
                        # S3 unreachable for now: poll again next interval, then say "list again"
                        self._lost, self._polled = True, now
                        continue
                    if found:
                        return found
                    continue
                if now >= deadline:
                    return []
                time.sleep(min(self._polled + self._interval, deadline) - now)

    def close(self) -> None:
        self._closed = True
