"""The S3 store: checkpoints as objects, compare-and-swap by conditional writes.

URL: ``s3://bucket/prefix?endpoint_url=http://host:port&region=eu-west-1``.
Works with AWS S3 and S3-compatible servers (``endpoint_url``). ``from_url``
also accepts ``client=`` (your own boto3 S3 client), ``endpoint_url=`` and
``region=`` as keyword options; keywords win over the URL's query. The kv space
and watch (``_s3_kv``) take ``watch_interval`` (seconds between a watch's
listings, default 1) and ``kv_pending_timeout`` (seconds after which a pending
kv batch counts as crashed and may be aborted, default 10).

Layout under ``<prefix>/``
--------------------------
``h/<T>!<N>``
    The head of ``(thread, namespace)``: JSON with version, checkpoint id, the
    commit token of that checkpoint's row and the row's key. The ONLY mutable
    object. It is the commit point: it moves by ``PutObject`` with
    ``If-Match: <etag read>`` (``If-None-Match: *`` for a new head), so
    compare-and-swap holds without a lock service. A lost condition (412
    ``PreconditionFailed``, 409 ``ConditionalRequestConflict``, or 404 because
    the head vanished) is a ``ConflictError``. A *placeholder* head
    (``{"v": 0, "f": <lease token>}``, at most 64 bytes) marks a thread whose new
    lease holder has not written yet (``_s3_leases``); it is no thread to any
    reader, and listings skip it by its size.
``r/<T>!<N>!<C>!<R>!<token>!<prev>``
    One checkpoint row (small JSON header + payload), written BEFORE the head.
    ``token`` is random per write attempt and ``prev`` is the token of the
    head the write replaced (``0`` for the first). The committed rows form
    the chain ``head.token -> prev -> prev ...``; a row is visible only if it
    is on that chain. A row left by a lost CAS or by a crash between the row
    write and the head write has a token nobody points at, so it is never
    returned (``delete_thread`` removes it). ``<C>`` and ``<R>`` (checkpoint
    and run id) are in the key so ``list`` filters and sorts from one
    ``ListObjectsV2`` walk and fetches only the rows it returns. An EMPTY row
    object is a row pruned above a kept one (``_s3_prune``): it links the chain,
    and readers skip it. Pruned rows at the bottom of the chain are deleted.
``b/<T>!<key>``
    Blobs, written FIRST with ``If-None-Match: *`` (412 = the key exists =
    success, so an existing key keeps its original bytes).

``<T>`` encodes the thread id with an order-preserving base64 (UTF-8 bytes,
alphabet ``-0-9A-Z_a-z`` in ASCII order, no padding): any unicode is safe in
a key, S3's byte-order listing equals Python ``str`` order, and a thread-id
prefix maps to a key prefix, so ``threads(prefix=, after=, limit=)`` is a
ranged listing. Ids longer than 240 UTF-8 bytes (S3 keys stop at 1024 bytes)
become ``<base64 of the first 240 bytes>.<sha256>``; ``threads`` reads their
heads to learn and sort the real ids. ``!`` sorts below the whole alphabet,
so all keys of one thread come before the keys of any longer id.

Requests per ``write`` (measured in ``tests/test_s3.py``): one PUT per blob,
one PUT for the row, one conditional PUT for the head, plus one GET of the
head when this instance did not make the head it builds on (first write of
a thread, or another writer moved it). So ``2 + blobs`` in a steady loop.
``head`` is 1 GET; ``get`` of the head checkpoint 2 GETs; ``list`` 1 GET,
one LIST per 1000 rows of the namespace, one GET per returned row.

Conflicts and leftovers: before writing anything the writer checks the head
(cached from its own last write, else one GET), so an ordinary stale write
writes nothing. Two writers racing past that check both write blobs and a
row; the loser's row is invisible (not on the chain) and is deleted. The
blobs it created stay (``atomic_blobs = False``): deleting them could race a
third writer that found one present (412) and committed a reference to it,
and losing referenced data is worse than keeping unreferenced bytes, which
``delete_thread`` removes with the thread.

moto 5.2 (the test server) implements ``If-Match`` / ``If-None-Match`` on
PutObject, but checks the condition and stores the object in two steps
without a lock, so its server can, rarely, let two racing conditional writes
both succeed. AWS S3 evaluates the condition atomically (since 2024). The
race tests pass on moto in practice; a failure there is moto, not the store.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import json
import logging
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar
from urllib.parse import parse_qsl, urlsplit

from .._errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    ConflictError,
    StoreClosedError,
)
from . import _s3_leases, unknown_options
from ._protocol import CheckpointRow, Head, LeaseRecord, ThreadedAsync
from ._s3_keys import (
    _CONFLICT_CODES,
    _MAX_ID_BYTES,
    _PLACEHOLDER_MAX_BYTES,
    _b64,
    _decode_head,
    _decode_row,
    _encode_row,
    _HeadState,
    _is_client_error,
    _map_error,
    _prefix_seg,
    _replace,
    _RowRef,
    _run_seg,
    _seg,
    _thread_seg,
    _unb64,
    _utf8,
    _with_payload,
)
from ._s3_kv import S3Kv
from ._s3_prune import S3Prune

__all__ = ["S3Backend"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

_OPTIONS = ("client", "endpoint_url", "region", "watch_interval", "kv_pending_timeout")
_PARALLEL = 16  # requests one call runs side by side (listings, batches): the thread pool and the connection pool


def _seconds(url: str, name: str, value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise ConfigurationError(f"S3 option {name}={value!r} of {url!r} is not a number of seconds > 0")
    return seconds


class S3Backend(S3Kv, S3Prune, ThreadedAsync):
    """Checkpoints in S3 objects; see the module docstring for layout and guarantees."""

    schemes: ClassVar[tuple[str, ...]] = ("s3",)
    atomic_blobs: ClassVar[bool] = False  # blobs go first; a lost CAS leaves them unreferenced
    capabilities: ClassVar[frozenset[str]] = frozenset({"fencing", "leases", "kv", "watch", "prune"})

    def __init__(
        self,
        client: Any,
        bucket: str,
        prefix: str,
        *,
        url: str,
        owns_client: bool,
        watch_interval: float = 1.0,
        kv_pending_timeout: float = 10.0,
    ) -> None:
        self._client = client
        self._bucket = bucket
        self._root = prefix + "/" if prefix else ""
        self._owns_client = owns_client
        self._closed = False
        self._lock = threading.Lock()
        self._heads: dict[tuple[str, str], _HeadState] = {}  # heads this instance last saw
        self._pool: ThreadPoolExecutor | None = None
        self.url = url
        self._kv_setup(watch_interval, kv_pending_timeout)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3Backend:
        """Open ``s3://bucket/prefix``; options ``client``, ``endpoint_url``, ``region``."""
        parts = urlsplit(url)
        if parts.scheme.lower() != "s3" or not parts.netloc:
            raise ConfigurationError(f"invalid S3 URL {url!r}: expected 's3://bucket/prefix'")
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        unknown = sorted(set(query) - set(_OPTIONS) | set(options) - set(_OPTIONS))
        if unknown or "client" in query:
            raise unknown_options(
                "S3", url, unknown or ["client"], _OPTIONS[1:], "client= (keyword only)"
            )
        prefix = parts.path.strip("/")
        if len(_utf8(prefix)) > 200:
            raise ConfigurationError(f"S3 prefix of {url!r} is too long: at most 200 bytes")
        settings = {**query, **{k: v for k, v in options.items() if k != "client"}}
        client = options.get("client")
        owns = client is None
        if client is None:
            import boto3
            from botocore.config import Config

            config = Config(
                connect_timeout=5,
                read_timeout=60,
                retries={"mode": "standard", "max_attempts": 3},
                # as many pooled connections as _map runs requests side by side (botocore's
                # default 10 made every listing past ten keys open and drop new connections)
                max_pool_connections=_PARALLEL,
            )
            client = boto3.client(
                "s3",
                endpoint_url=settings.get("endpoint_url") or None,
                region_name=settings.get("region") or None,
                config=config,
            )
        timing = {name: _seconds(url, name, settings[name]) for name in _OPTIONS[3:] if name in settings}
        return cls(client, parts.netloc, prefix, url=url, owns_client=owns, **timing)

    # -- plumbing ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the S3 store {self.url!r} is closed; open a new one")

    def _call(self, what: str, op: str, **kwargs: Any) -> Any:
        try:
            return getattr(self._client, op)(Bucket=self._bucket, **kwargs)
        except Exception as exc:
            raise _map_error(exc, what) from exc

    def _map(self, fn: Callable[[_T], Any], items: Sequence[_T]) -> list[Any]:
        """``fn`` over ``items``, in parallel when there are several (boto3 clients are thread-safe)."""
        if len(items) <= 1:
            return [fn(i) for i in items]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(_PARALLEL, thread_name_prefix="persistkit-s3")
            pool = self._pool
        return list(pool.map(fn, items))

    def has_data(self) -> bool:
        """Whether any object lives under this store's prefix. A fresh store (or one whose
        threads were all deleted) has none, and neither has a mistyped prefix: the CLI,
        which never creates a store, says so instead of listing nothing."""
        self._check_open()
        resp = self._call(f"listing {self._root!r}", "list_objects_v2", Prefix=self._root, MaxKeys=1)
        return bool(resp.get("KeyCount") or resp.get("Contents"))

    def _get_object(self, key: str, what: str) -> tuple[bytes, str] | None:
        """Body and ETag of ``key``, or None when it does not exist."""
        try:
            resp = self._client.get_object(Bucket=self._bucket, Key=key)
            return resp["Body"].read(), str(resp.get("ETag", ""))
        except Exception as exc:
            if _is_client_error(exc, {"NoSuchKey"}):  # not NoSuchBucket: that is an error
                return None
            raise _map_error(exc, what) from exc

    def _list(self, prefix: str, start_after: str = "") -> Iterator[str]:
        """Keys under ``prefix`` in ascending order, page by page (continuation tokens)."""
        for key, _ in self._list_sized(prefix, start_after):
            yield key

    def _list_sized(self, prefix: str, start_after: str = "") -> Iterator[tuple[str, int]]:
        """``_list`` with each object's size."""
        for key, size, _ in self._list_objects(prefix, start_after):
            yield key, size

    def _list_objects(self, prefix: str, start_after: str = "") -> Iterator[tuple[str, int, str]]:
        """``_list`` with each object's size and ETag."""
        kwargs: dict[str, Any] = {"Prefix": prefix}
        if start_after:
            kwargs["StartAfter"] = start_after
        while True:
            resp = self._call(f"listing {prefix!r}", "list_objects_v2", **kwargs)
            for item in resp.get("Contents", ()):
                yield str(item["Key"]), int(item.get("Size", 0)), str(item.get("ETag", ""))
            if not resp.get("IsTruncated"):
                return
            kwargs["ContinuationToken"] = resp["NextContinuationToken"]

    def _list_heads(self, prefix: str, start_after: str = "") -> Iterator[str]:
        """Keys of the real heads under ``prefix``: placeholders (``_s3_keys``) are no thread."""
        for key, size in self._list_sized(prefix, start_after):
            if size > _PLACEHOLDER_MAX_BYTES:
                yield key

    def _put_new(self, key: str, body: bytes, what: str) -> bool:
        """Create ``key`` unless it exists. True when this call created it."""
        for _ in range(5):
            try:
                self._client.put_object(Bucket=self._bucket, Key=key, Body=body, IfNoneMatch="*")
                return True
            except Exception as exc:
                if _is_client_error(exc, {"PreconditionFailed"}):
                    return False
                # 409: a concurrent create of the same key is in flight; AWS says retry
                if not _is_client_error(exc, {"ConditionalRequestConflict"}):
                    raise _map_error(exc, what) from exc
        raise BackendUnavailableError(f"S3 kept reporting concurrent writes while {what}")

    def _delete_keys(self, keys: Sequence[str], what: str) -> None:
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = [{"Key": k} for k in keys[i : i + 1000]]
            resp = self._call(what, "delete_objects", Delete={"Objects": batch, "Quiet": True})
            if resp.get("Errors"):
                raise BackendError(f"S3 failed while {what}: {resp['Errors'][:3]}")

    # -- keys ---------------------------------------------------------------------------

    def _head_key(self, thread_id: str, namespace: str) -> str:
        return f"{self._root}h/{_thread_seg(thread_id)}!{_seg(namespace, 'n')}"

    def _rows_prefix(self, thread_id: str, namespace: str) -> str:
        return f"{self._root}r/{_thread_seg(thread_id)}!{_seg(namespace, 'n')}!"

    def _blob_prefix(self, thread_id: str) -> str:
        return f"{self._root}b/{_thread_seg(thread_id)}!"

    # -- heads ----------------------------------------------------------------------------

    def _read_head(self, thread_id: str, namespace: str) -> _HeadState | None:
        got = self._get_object(
            self._head_key(thread_id, namespace), f"reading head of {thread_id!r}"
        )
        cache_key = (thread_id, namespace)
        if got is None:
            with self._lock:
                self._heads.pop(cache_key, None)
            return None
        state = _decode_head(*got)
        self._remember_head(thread_id, namespace, state)
        return state

    def _remember_head(self, thread_id: str, namespace: str, state: _HeadState) -> None:
        with self._lock:
            self._heads[(thread_id, namespace)] = state

    def head(self, thread_id: str, namespace: str) -> Head | None:
        self._check_open()
        state = self._read_head(thread_id, namespace)
        return None if state is None or state.placeholder else Head(state.checkpoint_id, state.version)

    # -- writes ---------------------------------------------------------------------------

    def _conflict(
        self, row: CheckpointRow, expected: int, found: _HeadState | None
    ) -> ConflictError:
        if found is not None and found.placeholder:
            found = None
        return ConflictError(
            thread_id=row.thread_id,
            namespace=row.namespace,
            expected=expected,
            found=found.version if found else 0,
            found_checkpoint=found.checkpoint_id if found else None,
        )

    def write(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int | None = None
    ) -> Head:
        self._check_open()
        t, ns = row.thread_id, row.namespace
        with self._lock:
            base = self._heads.get((t, ns))
        if base is None or base.version != expected_version:
            # Our cache cannot vouch for the head: read it, and fail before writing anything.
            base = self._read_head(t, ns)
            if (base.version if base else 0) != expected_version:
                if fence is not None:
                    _s3_leases.check_fence(row, fence, base)
                raise self._conflict(row, expected_version, base)
        if base is not None and not base.placeholder and row.checkpoint_id <= base.checkpoint_id:
            # Row keys are unique per write, so a reused id is not refused by the put: refuse
            # any id that does not sort after the head (a reused one never does), as SQLite.
            raise BackendError(
                f"S3 store: write on thread {t!r}: checkpoint id {row.checkpoint_id!r} does not "
                f"sort after the thread's head {base.checkpoint_id!r} (an id is never reused, and "
                "each new id sorts after its parent's, as persistkit's own ids do); nothing was written"
            )
        if fence is not None:
            _s3_leases.check_fence(row, fence, base)
            if base is None:
                _s3_leases.check_first_fence(self, row, fence)
        self._write_blobs(t, blobs)
        token = secrets.token_hex(8)
        prev = base.token if base else "0"
        row_key = (
            f"{self._rows_prefix(t, ns)}{_seg(row.checkpoint_id, 'c')}!"
            f"{_run_seg(row.run_id)}!{token}!{prev}"
        )
        self._call(
            f"writing checkpoint of {t!r}", "put_object", Key=row_key, Body=_encode_row(row, blobs)
        )
        version = expected_version + 1
        sealed = max(base.fence if base else 0, fence or 0)  # a head keeps its lease seal
        body = json.dumps(
            {"v": version, "c": row.checkpoint_id, "t": token, "k": row_key, "thread": t, "ns": ns}
            | ({"f": sealed} if sealed else {})
        ).encode("ascii")
        condition = {"IfMatch": base.etag} if base else {"IfNoneMatch": "*"}
        head_key = self._head_key(t, ns)
        try:
            resp = self._client.put_object(
                Bucket=self._bucket, Key=head_key, Body=body, **condition
            )
        except Exception as exc:
            if not _is_client_error(exc, _CONFLICT_CODES):
                raise _map_error(exc, f"moving the head of {t!r}") from exc
            found = self._read_head(t, ns)
            self._clean_up_loser(row_key)
            if fence is not None:
                _s3_leases.check_fence(row, fence, found)
            raise self._conflict(row, expected_version, found) from exc
        state = _HeadState(version, row.checkpoint_id, token, row_key, str(resp.get("ETag", "")), sealed)
        with self._lock:
            self._heads[(t, ns)] = state
        return Head(row.checkpoint_id, version)

    def _write_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> list[str]:
        """Create the missing blobs; returns the keys this call created."""
        prefix = self._blob_prefix(thread_id)
        items = list(blobs.items())
        done = self._map(
            lambda kv: self._put_new(
                prefix + kv[0], kv[1], f"writing blob {kv[0]!r} of {thread_id!r}"
            ),
            items,
        )
        return [k for (k, _), made in zip(items, done, strict=True) if made]

    def _clean_up_loser(self, row_key: str) -> None:
        """Best effort: delete the row a write that lost its CAS left behind (it is off the chain).

        Its blobs stay: they are unreferenced content addresses, but another
        writer may have found one of them present and committed a reference to
        it in the meantime, so deleting them could lose data. Unreferenced blobs
        cost bytes only and go with ``delete_thread``.
        """
        try:
            self._delete_keys([row_key], "cleaning up after a lost compare-and-swap")
        except BackendError:
            # Leftovers are harmless (rows off the chain are never read); the conflict matters more.
            _log.warning("could not delete the leftover row of a lost S3 write: %s", row_key, exc_info=True)

    def put_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        self._check_open()
        self._write_blobs(thread_id, blobs)

    # -- rows -----------------------------------------------------------------------------

    def _chain(self, thread_id: str, namespace: str) -> tuple[_HeadState | None, list[_RowRef]]:
        """The head and its committed rows (newest version first): orphans and pruned rows
        (``_s3_prune``'s empty markers, which only link the chain) are skipped."""
        head, chain, _ = self._chain_refs(thread_id, namespace)
        return head, [r for r in chain if not r.pruned]

    def _chain_refs(
        self, thread_id: str, namespace: str
    ) -> tuple[_HeadState | None, list[_RowRef], list[_RowRef]]:
        """``_chain`` with the pruned markers on it, and the row objects off the chain. The
        walk ends below the oldest row left: a prune deletes a chain's oldest rows, and
        marks those above a kept one (``_s3_prune``)."""
        head = self._read_head(thread_id, namespace)
        if head is None or head.placeholder:
            return None, [], []
        prefix = self._rows_prefix(thread_id, namespace)
        by_token: dict[str, _RowRef] = {}
        for key, size, etag in self._list_objects(prefix):
            parts = key[len(prefix) :].split("!")
            if len(parts) != 4:
                continue
            cseg, rseg, token, prev = parts
            cid = (
                _unb64(cseg[1:]).decode("utf-8", "surrogatepass") if cseg.startswith("c") else None
            )
            by_token[token] = _RowRef(key, cid, rseg, token, prev, size == 0, etag)
        chain: list[_RowRef] = []
        token = head.token
        while token in by_token and len(chain) <= len(by_token):
            ref = by_token[token]
            chain.append(ref)
            token = ref.prev
        on = {r.token for r in chain}
        return head, chain, [r for t, r in by_token.items() if t not in on]

    def _fetch_rows(self, keys: Sequence[str]) -> list[CheckpointRow]:
        rows = self._fetch_some(keys)
        for key, row in zip(keys, rows, strict=True):
            if row is None:  # deleted under us (delete_thread racing this read)
                raise BackendError(f"checkpoint object {key!r} vanished while being read")
        return [r for r in rows if r is not None]

    def _fetch_some(self, keys: Sequence[str]) -> list[CheckpointRow | None]:
        """The rows at ``keys``; None for one deleted or marked pruned since it was listed."""

        def fetch(key: str) -> CheckpointRow | None:
            got = self._get_object(key, "reading a checkpoint")
            return None if got is None or not got[0] else _decode_row(got[0])[0]

        return self._map(fetch, keys)

    def get(self, thread_id: str, namespace: str, checkpoint_id: str) -> CheckpointRow | None:
        self._check_open()
        head = self._read_head(thread_id, namespace)
        if head is None or head.placeholder:
            return None
        if head.checkpoint_id == checkpoint_id:  # the common case: resume reads the head
            return self._fetch_rows([head.row_key])[0]
        for row in self.list(thread_id, namespace, before=None):
            if row.checkpoint_id == checkpoint_id:
                return row
        return None

    def list(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> list[CheckpointRow]:
        self._check_open()
        if limit is not None and limit <= 0:
            return []
        _, chain = self._chain(thread_id, namespace)
        if run_id is not None:
            want = _run_seg(run_id)
            chain = [r for r in chain if r.run_seg == want]
        chain = self._resolved(chain)
        chosen = sorted(chain, key=lambda r: r.checkpoint_id or "", reverse=True)
        if before is not None:
            chosen = [r for r in chosen if (r.checkpoint_id or "") < before]
        if limit is not None:
            chosen = chosen[:limit]
        # a row pruned since the listing is skipped: retention ran between the two requests
        rows = self._fetch_some([r.key for r in chosen])
        return [r for r in rows if r is not None and (run_id is None or r.run_id == run_id)]

    def _resolved(self, chain: builtins.list[_RowRef]) -> builtins.list[_RowRef]:
        """``chain`` without the refs whose key holds only a hash of a very long checkpoint
        id: for those, only the stored row knows the id (one GET each); pruned ones go."""
        unresolved = [r.key for r in chain if r.checkpoint_id is None and not r.pruned]
        if not unresolved:
            return chain
        ids = {k: r.checkpoint_id for k, r in zip(unresolved, self._fetch_some(unresolved), strict=True) if r}
        return [
            dataclasses.replace(r, checkpoint_id=ids[r.key]) if r.key in ids else r
            for r in chain
            if r.checkpoint_id is not None or r.pruned or r.key in ids
        ]

    # -- blobs ----------------------------------------------------------------------------

    def get_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        self._check_open()
        prefix = self._blob_prefix(thread_id)
        unique = list(dict.fromkeys(keys))
        got = self._map(
            lambda k: self._get_object(prefix + k, f"reading blob {k!r} of {thread_id!r}"), unique
        )
        return {k: g[0] for k, g in zip(unique, got, strict=True) if g is not None}

    def scan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        self._check_open()
        if start >= stop:
            return {}
        prefix = self._blob_prefix(thread_id)
        keys: builtins.list[str] = []
        # StartAfter is exclusive; starting after start[:-1] can only over-list, filtered below
        for key in self._list(prefix, prefix + start[:-1] if start else ""):
            k = key[len(prefix) :]
            if k >= stop:
                break
            if k >= start:
                keys.append(k)
        return self.get_blobs(thread_id, keys)

    # -- threads --------------------------------------------------------------------------

    def threads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        self._check_open()
        if limit is not None and limit <= 0:
            return []
        heads = f"{self._root}h/"
        start = ""
        if after is not None:
            raw = _utf8(after)
            # '"' sorts above '!' (end of after's own keys) and below the alphabet
            start = heads + (
                _b64(raw) + '"' if len(raw) <= _MAX_ID_BYTES else _b64(raw[:_MAX_ID_BYTES])
            )
        out: builtins.list[str] = []
        last: str | None = None
        group: builtins.list[str] = []  # head keys (below h/) of long ids sharing 240 bytes

        def emit(ids: Iterable[str]) -> bool:
            nonlocal last
            for tid in ids:
                if tid != last and tid.startswith(prefix) and (after is None or tid > after):
                    out.append(tid)
                    last = tid
                    if limit is not None and len(out) >= limit:
                        return True
            return False

        for key in self._list_heads(heads + _prefix_seg(prefix), start):
            rel = key[len(heads) :]
            tseg = rel.split("!", 1)[0]
            if group and not tseg.startswith(group[0].split(".", 1)[0] + "."):
                if emit(self._resolve_group(group)):
                    return out
                group = []
            if "." in tseg:
                group.append(rel)
            elif emit([_unb64(tseg).decode("utf-8", "surrogatepass")]):
                return out
        if group:
            emit(self._resolve_group(group))
        return out

    def _resolve_group(self, keys: builtins.list[str]) -> builtins.list[str]:
        """The real, sorted thread ids behind head keys of ids too long for a key."""
        heads = f"{self._root}h/"

        def thread_of(key: str) -> str | None:
            got = self._get_object(heads + key, "reading a head")
            return None if got is None else str(json.loads(got[0])["thread"])

        return sorted({t for t in self._map(thread_of, keys) if t is not None})

    def namespaces(self, thread_id: str) -> builtins.list[str]:
        """Namespaces with a head (rows are only visible through their head on S3)."""
        self._check_open()
        prefix = f"{self._root}h/{_thread_seg(thread_id)}!"
        found: set[str] = set()
        for key in self._list_heads(prefix):
            seg = key[len(prefix) :]
            if seg.startswith("n"):
                found.add(_unb64(seg[1:]).decode("utf-8", "surrogatepass"))
                continue
            got = self._get_object(key, f"reading a head of {thread_id!r}")  # a hashed long name
            if got is not None:
                found.add(str(json.loads(got[0])["ns"]))
        return sorted(found)

    # -- maintenance ----------------------------------------------------------------------

    def rewrite(
        self, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]
    ) -> None:
        """Overwrite existing row and blob objects in place, each conditional on the ETag
        just read, so an object deleted meanwhile (``delete_thread``) is not recreated."""
        self._check_open()
        jobs: builtins.list[tuple[str, Callable[[bytes, bytes], bytes], bytes]] = []
        by_ns: dict[str, builtins.list[CheckpointRow]] = {}
        for row in rows:
            by_ns.setdefault(row.namespace, []).append(row)
        for ns, wanted in by_ns.items():
            _, chain = self._chain(thread_id, ns)
            keys = {r.checkpoint_id: r.key for r in chain if r.checkpoint_id is not None}
            unresolved = [r.key for r in chain if r.checkpoint_id is None]
            for key, got in zip(unresolved, self._fetch_rows(unresolved), strict=True):
                keys[got.checkpoint_id] = key
            for row in wanted:
                if row.checkpoint_id in keys:
                    jobs.append((keys[row.checkpoint_id], _with_payload, bytes(row.payload)))
        prefix = self._blob_prefix(thread_id)
        jobs += [(prefix + k, _replace, bytes(v)) for k, v in blobs.items()]
        self._map(lambda job: self._overwrite(*job), jobs)

    def _overwrite(self, key: str, change: Callable[[bytes, bytes], bytes], new: bytes) -> None:
        got = self._get_object(key, "reading an object to rewrite it")
        if got is None or (change is _with_payload and not got[0]):
            return  # absent, or a row pruned since the listing: rewrite never creates
        body, etag = got
        try:
            self._client.put_object(
                Bucket=self._bucket, Key=key, Body=change(body, new), IfMatch=etag
            )
        except Exception as exc:
            # Changed or deleted since the read: a concurrent rewrite or delete won; skip.
            if not _is_client_error(exc, _CONFLICT_CODES):
                raise _map_error(exc, f"rewriting {key!r}") from exc

    # -- leases (persistkit.coordination): the logic is in _s3_leases -------------------------

    def lease_get(self, thread_id: str, namespace: str) -> LeaseRecord | None:
        self._check_open()
        found = _s3_leases.read(self, thread_id, namespace)
        return found[0] if found else None

    def lease_swap(self, thread_id: str, namespace: str, expected: int, token: int, data: bytes) -> bool:
        self._check_open()
        return _s3_leases.swap(self, thread_id, namespace, expected, token, data)

    def lease_list(self, *, prefix: str = "") -> builtins.list[tuple[str, str, LeaseRecord]]:
        self._check_open()
        return _s3_leases.listing(self, prefix)

    def write_fenced(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int
    ) -> Head:
        return self.write(row, blobs, expected_version, fence)

    # -- deletion and lifecycle -------------------------------------------------------------

    def delete_thread(self, thread_id: str) -> bool:
        self._check_open()
        tseg = _thread_seg(thread_id)
        found = False
        # heads first: the thread stops being listed before its rows go
        for kind in ("h", "r", "b"):
            listed = list(self._list_sized(f"{self._root}{kind}/{tseg}!"))
            if listed:
                # a placeholder head (a lease taken, nothing written) goes too, but is no thread
                found = found or kind != "h" or any(size > _PLACEHOLDER_MAX_BYTES for _, size in listed)
                self._delete_keys([k for k, _ in listed], f"deleting thread {thread_id!r}")
        with self._lock:
            for cache_key in [k for k in self._heads if k[0] == thread_id]:
                del self._heads[cache_key]
        return found

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        if self._owns_client:
            with contextlib.suppress(AttributeError):  # botocore < 1.33 has no close()
                self._client.close()
