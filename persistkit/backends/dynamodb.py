"""The DynamoDB store: a checkpoint and its head's compare-and-swap in one transaction.

URL: ``dynamodb://TABLE?region=eu-west-1&endpoint_url=http://host:port&create=1``.
Credentials come from boto3's usual chain (environment, profile, instance role),
never from the URL. ``from_url`` also takes ``client=`` (your own boto3 DynamoDB
client) as a keyword, ``watch_interval`` (seconds between a kv watch's polls,
default 1) and ``kv_pending_timeout`` (seconds after which a pending kv batch larger
than one transaction is taken for crashed and aborted, default 10; see
``_dynamo_kvbatch``). The table must exist (``persistkit dynamodb create-table --url URL``), or
``create=1`` creates it (on-demand capacity) when it is missing; otherwise opening
the store raises a ``ConfigurationError`` naming the table and that command.

Table: partition key ``p`` (S), sort key ``s`` (S), no index; the item layout is in
``_dynamo_items``. IAM actions: ``dynamodb:DescribeTable``, ``GetItem``,
``BatchGetItem``, ``Query``, ``PutItem``, ``UpdateItem``, ``DeleteItem``,
``BatchWriteItem``, ``ConditionCheckItem`` (fenced writes), and ``CreateTable``
only for ``create=1``.

One ``write`` is ONE ``TransactWriteItems``: the row (``Put``, refused if its id
exists), the head (``Update`` conditional on ``hv = expected``, or on there being
no head), every blob (``Update ... SET v = if_not_exists(v, :v)``, so an existing
key keeps its bytes and never fails the transaction), the thread's registry entry
on a namespace's first write, and for ``write_fenced`` a ``ConditionCheck`` of the
lease token on the lease item. A failed condition cancels all of it; the
cancellation reasons (with the items as they are) say which: a stale fence is
``LeaseLostError``, a moved head ``ConflictError``, a reused id ``BackendError``.
Values over ``INLINE_MAX`` are chunked (chunk items written first, then the item
that points at them in the transaction); blobs that do not fit in one transaction
(100 actions, 4 MB) are written before it, so ``atomic_blobs`` is False.

The transaction carries a client request token (botocore sets one per call), so
botocore's retry of a write whose response was lost is idempotent; where it is not
(moto ignores the token; DynamoDB keeps it 10 minutes) the copy is cancelled by its
own head (``hc`` is this checkpoint, ``hv`` the new version) and the write stands, as a
larger kv batch's copies of its record and marks do (``_dynamo_kvbatch``). Throttling,
transaction conflicts and timeouts are ``BackendUnavailableError``, retried by
``persistkit._io``, which resolves an ambiguous write by reading the head back.
"""

from __future__ import annotations

import builtins
import contextlib
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlsplit

from .._errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    ConflictError,
    LeaseLostError,
    StoreClosedError,
)
from . import mask_url, unknown_options
from ._dynamo_items import (
    TXN_MAX_ACTIONS,
    TXN_MAX_BYTES,
    chunk_nonce,
    is_code,
    map_error,
    missing_table,
    n,
    num,
    pack,
    reasons,
    s,
    text,
)
from ._dynamo_kv import DynamoKv
from ._dynamo_leases import DynamoLeases
from ._dynamo_prune import DynamoPrune
from ._protocol import CheckpointRow, Head, ThreadedAsync
from ._s3_keys import _MAX_ID_BYTES, _b64, _prefix_seg, _seg, _thread_seg, _utf8

__all__ = ["DynamoBackend", "create_table"]

_OPTIONS = (
    "client", "endpoint_url", "region", "create", "watch_interval", "kv_pending_timeout", "timeout",
)  # fmt: skip
_MAX_CHECKPOINT_ID_BYTES = 800  # the sort key stops at 1024 bytes


def _flag(url: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    got = str(value).strip().lower()
    if got in ("1", "true", "yes", "on"):
        return True
    if got in ("0", "false", "no", "off", ""):
        return False
    raise ConfigurationError(
        f"DynamoDB option create={value!r} of {url!r} is not a flag: use create=1 or create=0"
    )


def _seconds(url: str, settings: Mapping[str, Any], name: str, default: float) -> float:
    if name not in settings:
        return default
    try:
        got = float(settings[name])
    except (TypeError, ValueError):
        got = -1.0
    if not 0 < got < float("inf"):
        raise ConfigurationError(
            f"DynamoDB option {name}={settings[name]!r} of {url!r} is not a number of seconds > 0"
        )
    return got


def make_client(endpoint_url: str | None, region: str | None, timeout: float = 30.0) -> Any:
    """A boto3 DynamoDB client: credentials from boto3's usual chain, ``timeout`` seconds a
    request may wait for its answer (botocore tries a request up to 4 times; the connect
    timeout is 5 s). A missing region or an endpoint that is not a URL is a
    ``ConfigurationError`` naming the option."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import NoRegionError

    config = Config(
        connect_timeout=min(5.0, timeout),
        read_timeout=timeout,
        retries={"mode": "standard", "max_attempts": 4},
    )
    try:
        return boto3.client(
            "dynamodb", endpoint_url=endpoint_url or None, region_name=region or None, config=config
        )
    except NoRegionError:
        raise ConfigurationError(
            "DynamoDB store: no AWS region: add ?region=… to the URL (e.g. "
            "dynamodb://TABLE?region=eu-west-1) or set AWS_DEFAULT_REGION"
        ) from None
    except ValueError as exc:  # botocore: "Invalid endpoint: ..."
        raise ConfigurationError(
            f"DynamoDB store: endpoint_url={endpoint_url!r} is not a URL ({exc}): give it as "
            "http://host:port (a local DynamoDB) or https://…, or leave it out for AWS itself"
        ) from None


def create_table(client: Any, table: str) -> bool:
    """Create the store's table (on-demand capacity) and wait until it is active.
    False when it existed already (another process may be creating it: waited for too)."""
    created = True
    try:
        client.create_table(
            TableName=table,
            KeySchema=[
                {"AttributeName": "p", "KeyType": "HASH"},
                {"AttributeName": "s", "KeyType": "RANGE"},
            ],
            AttributeDefinitions=[
                {"AttributeName": "p", "AttributeType": "S"},
                {"AttributeName": "s", "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )
    except Exception as exc:
        if not is_code(exc, "ResourceInUseException"):
            raise map_error(exc, f"creating table {table!r}", table) from exc
        created = False
    try:
        client.get_waiter("table_exists").wait(
            TableName=table, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
        )
    except Exception as exc:
        raise map_error(exc, f"waiting for table {table!r} to become active", table) from exc
    return created


def _without_create(url: str) -> str:
    """``url`` without its ``create`` option (the command that creates the table needs none)."""
    head, _, query = url.partition("?")
    kept = "&".join(p for p in query.split("&") if p and p.partition("=")[0] != "create")
    return f"{head}?{kept}" if kept else head


def _landed_before(exc: Exception, row: Mapping[str, Any], expected: int) -> bool:
    """Whether a cancelled write transaction met its own write: the client sent it again
    after it had landed (a lost response; DynamoDB dedupes by the request token, moto and
    a retry past the token's 10 minutes do not), so the write stands. Its own: the row
    item at its key holds this payload (a chunked one: this write's chunk nonce), and the
    head is that row at the version this write made. Another writer of the same id with
    other bytes is a conflict."""
    got = reasons(exc)
    if len(got) < 2 or any(r.get("Code") != "ConditionalCheckFailed" for r in got[:2]):
        return False
    found, head = got[0].get("Item") or {}, got[1].get("Item") or {}
    return (
        found.get("v") == row["v"]
        and text(head, "hc") == text(row, "cid")
        and num(head, "hv") == expected + 1
    )


class DynamoBackend(DynamoKv, DynamoPrune, DynamoLeases, ThreadedAsync):
    """Checkpoints in one DynamoDB table; see the module docstring for layout and guarantees."""

    schemes: ClassVar[tuple[str, ...]] = ("dynamodb",)
    atomic_blobs: ClassVar[bool] = False  # blobs that do not fit the transaction go first
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"fencing", "leases", "kv", "watch", "prune"}
    )

    def __init__(
        self,
        client: Any,
        table: str,
        *,
        url: str,
        owns_client: bool,
        watch_interval: float = 1.0,
        kv_pending_timeout: float = 10.0,
    ) -> None:
        self._client = client
        self._table = table
        self._owns_client = owns_client
        self._closed = False
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.url = url
        self._kv_setup(watch_interval, kv_pending_timeout)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> DynamoBackend:
        """Open ``dynamodb://TABLE``; options ``client``, ``endpoint_url``, ``region``, ``create``."""
        parts = urlsplit(url)
        if parts.scheme.lower() != "dynamodb" or not parts.netloc or parts.path.strip("/"):
            raise ConfigurationError(
                f"invalid DynamoDB URL {url!r}: expected 'dynamodb://TABLE?region=…'"
            )
        table = parts.netloc
        if (
            not (3 <= len(table) <= 255)
            or not all(c.isalnum() or c in "_.-" for c in table)
            or not table.isascii()
        ):
            raise ConfigurationError(
                f"invalid DynamoDB table name {table!r} in {url!r}: 3 to 255 characters of a-z, A-Z, 0-9, '_', '-', '.'"
            )
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        unknown = sorted(set(query) - set(_OPTIONS) | set(options) - set(_OPTIONS))
        if unknown or "client" in query:
            raise unknown_options(
                "DynamoDB", url, unknown or ["client"], _OPTIONS[1:], "client= (keyword only)"
            )
        settings = {**query, **{k: v for k, v in options.items() if k != "client"}}
        interval = _seconds(url, settings, "watch_interval", 1.0)
        pending_timeout = _seconds(url, settings, "kv_pending_timeout", 10.0)
        timeout = _seconds(url, settings, "timeout", 30.0)
        client = options.get("client")
        owns = client is None
        if client is None:
            client = make_client(settings.get("endpoint_url"), settings.get("region"), timeout)
        store = cls(
            client,
            table,
            url=url,
            owns_client=owns,
            watch_interval=interval,
            kv_pending_timeout=pending_timeout,
        )
        try:
            store._ensure_table(_flag(url, settings.get("create", False)))
        except BaseException:
            store.close()
            raise
        return store

    def _ensure_table(self, create: bool) -> None:
        from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError

        try:
            described = self._client.describe_table(TableName=self._table)
            if described.get("Table", {}).get("TableStatus", "ACTIVE") == "ACTIVE":
                return
        except (EndpointConnectionError, ConnectTimeoutError) as exc:
            if isinstance(exc, ConnectTimeoutError):  # slow, not absent: transient
                raise map_error(exc, f"opening table {self._table!r}", self._table) from exc
            endpoint = self._client.meta.endpoint_url
            if any(w in f"{exc} {exc.kwargs.get('error', '')}".lower() for w in ("refused", "reset")):
                # down or restarting: the first connect and the hundredth are the same outage
                raise BackendUnavailableError(
                    f"DynamoDB store {mask_url(self.url)!r}: nothing accepts connections at {endpoint} "
                    f"({exc}). The service is down or restarting, or the URL's endpoint_url is wrong: "
                    "safe to retry once it is up; if it persists, check endpoint_url and region"
                ) from exc
            raise BackendError(  # the host is unknown: not transient
                f"DynamoDB store {mask_url(self.url)!r}: nothing answers at {endpoint} ({exc}). "
                "Check the URL's endpoint_url (a local DynamoDB's host and port) and region"
            ) from None
        except Exception as exc:
            if not is_code(exc, "ResourceNotFoundException"):
                raise map_error(exc, f"describing table {self._table!r}", self._table) from exc
            if not create:
                raise missing_table(self._table, url=_without_create(mask_url(self.url))) from None
        create_table(self._client, self._table)  # creates it, or waits while it is created

    # -- plumbing ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the DynamoDB store {self.url!r} is closed; open a new one")

    def has_data(self) -> bool:
        """Whether any thread, lease or kv item is stored (the CLI never creates a store)."""
        self._check_open()
        resp = self._call(f"scanning {self._table!r}", "scan", Limit=1)
        return bool(resp.get("Items"))

    def _map(self, fn: Any, items: Sequence[Any]) -> builtins.list[Any]:
        if len(items) <= 1:
            return [fn(i) for i in items]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(16, thread_name_prefix="persistkit-dynamodb")
            pool = self._pool
        return list(pool.map(fn, items))

    def _row_sk(self, namespace: str, checkpoint_id: str) -> str:
        if len(_utf8(checkpoint_id)) > _MAX_CHECKPOINT_ID_BYTES:
            raise BackendError(
                f"DynamoDB store: checkpoint id {checkpoint_id[:40]!r}… is longer than "
                f"{_MAX_CHECKPOINT_ID_BYTES} UTF-8 bytes (a sort key stops at 1024); nothing was written"
            )
        return f"r!{_seg(namespace, 'n')}!{checkpoint_id}"

    def _blob_update(self, p: str, key: str, v: dict[str, Any], size: int) -> dict[str, Any]:
        return {
            "TableName": self._table,
            "Key": {"p": s(p), "s": s("b!" + key)},
            "UpdateExpression": "SET v = if_not_exists(v, :v), z = if_not_exists(z, :z)",
            "ExpressionAttributeValues": {":v": v, ":z": n(size)},
        }

    # -- heads ---------------------------------------------------------------------------

    def head(self, thread_id: str, namespace: str) -> Head | None:
        self._check_open()
        item = self._get(
            self._p(thread_id), "h!" + _seg(namespace, "n"), f"reading head of {thread_id!r}"
        )
        return None if item is None else Head(str(item["hc"]["S"]), num(item, "hv"))

    # -- writes ---------------------------------------------------------------------------

    def write(
        self,
        row: CheckpointRow,
        blobs: Mapping[str, bytes],
        expected_version: int,
        fence: int | None = None,
    ) -> Head:
        self._check_open()
        t, ns = row.thread_id, row.namespace
        p, nsseg = self._p(t), _seg(ns, "n")
        what = f"writing checkpoint of {t!r}"
        row_v, row_chunks = pack(p, row.payload)
        chunks = list(row_chunks)
        actions: builtins.list[dict[str, Any]] = []
        item = {
            "p": s(p), "s": s(self._row_sk(ns, row.checkpoint_id)), "cid": s(row.checkpoint_id),
            "rid": s(row.run_id) if row.run_id is not None else {"NULL": True},
            "par": s(row.parent_id) if row.parent_id is not None else {"NULL": True}, "v": row_v,
        }  # fmt: skip
        actions.append(
            {
                "Put": {
                    "TableName": self._table,
                    "Item": item,
                    "ConditionExpression": "attribute_not_exists(s)",
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            }
        )
        head: dict[str, Any] = {
            "TableName": self._table,
            "Key": {"p": s(p), "s": s("h!" + nsseg)},
            "UpdateExpression": "SET hv = :nv, hc = :c, tid = :t, nsn = :ns",
            "ExpressionAttributeValues": {
                ":nv": n(expected_version + 1),
                ":c": s(row.checkpoint_id),
                ":t": s(t),
                ":ns": s(ns),
            },
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        if expected_version == 0:
            head["ConditionExpression"] = "attribute_not_exists(hv)"
        else:
            head["ConditionExpression"] = "hv = :e"
            head["ExpressionAttributeValues"][":e"] = n(expected_version)
        actions.append({"Update": head})
        if fence is not None:
            actions.append({
                "ConditionCheck": {
                    "TableName": self._table, "Key": {"p": s(p), "s": s("l!" + nsseg)},
                    "ConditionExpression": "lt = :f", "ExpressionAttributeValues": {":f": n(fence)},
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            })  # fmt: skip
        if expected_version == 0:
            actions.append(
                {
                    "Put": {
                        "TableName": self._table,
                        "Item": {"p": s("T"), "s": s(_thread_seg(t)), "tid": s(t)},
                    }
                }
            )
        budget = TXN_MAX_BYTES - min(len(row.payload), TXN_MAX_BYTES)
        early: builtins.list[dict[str, Any]] = []
        for key, value in blobs.items():
            v, blob_chunks = pack(p, value)
            chunks += blob_chunks
            update = self._blob_update(p, key, v, len(value))
            inline = len(value) if not blob_chunks else 100
            if len(actions) < TXN_MAX_ACTIONS and inline <= budget:
                budget -= inline
                actions.append({"Update": update})
            else:
                early.append(update)
        if chunks:
            self._batch_write(chunks, [], f"writing chunks of {t!r}")
        if early:
            self._map(
                lambda u: self._call(
                    what, "update_item", **{k: v for k, v in u.items() if k != "TableName"}
                ),
                early,
            )
        try:
            self._transact(actions, what)
        except Exception as exc:
            if not _landed_before(exc, item, expected_version):
                raise self._refused(row, expected_version, fence, exc, row_chunks) from exc
        return Head(row.checkpoint_id, expected_version + 1)

    def _refused(
        self,
        row: CheckpointRow,
        expected: int,
        fence: int | None,
        exc: Exception,
        chunks: Sequence[dict[str, Any]],
    ) -> Exception:
        """The error for a cancelled write transaction (see the module docstring)."""
        got = reasons(exc)
        failed = [r.get("Code") == "ConditionalCheckFailed" for r in got] + [False] * 3
        if chunks:
            with contextlib.suppress(
                BackendError
            ):  # best effort: the row's own chunks are unreferenced
                self._batch_write(
                    [], [(c["p"]["S"], c["s"]["S"]) for c in chunks], "cleaning up a refused write"
                )
        if fence is not None and failed[2]:
            lease = got[2].get("Item") or {}
            return LeaseLostError(
                thread_id=row.thread_id,
                namespace=row.namespace,
                token=fence,
                found=num(lease, "lt"),
            )
        if failed[1]:
            found = got[1].get("Item") or {}
            return ConflictError(
                thread_id=row.thread_id,
                namespace=row.namespace,
                expected=expected,
                found=num(found, "hv"),
                found_checkpoint=text(found, "hc"),
            )
        if failed[0]:
            return BackendError(
                f"DynamoDB store: write on thread {row.thread_id!r}: checkpoint id {row.checkpoint_id!r} "
                "exists already (an id is never reused); nothing was written"
            )
        return map_error(exc, f"writing checkpoint of {row.thread_id!r}", self._table)

    def write_fenced(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int
    ) -> Head:
        return self.write(row, blobs, expected_version, fence)

    def put_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        self._check_open()
        p = self._p(thread_id)
        updates, chunks = [], []
        for key, value in blobs.items():
            v, more = pack(p, value)
            chunks += more
            updates.append(self._blob_update(p, key, v, len(value)))
        if chunks:
            self._batch_write(chunks, [], f"writing chunks of {thread_id!r}")
        what = f"writing blobs of {thread_id!r}"
        self._map(
            lambda u: self._call(
                what, "update_item", **{k: v for k, v in u.items() if k != "TableName"}
            ),
            updates,
        )

    # -- rows -----------------------------------------------------------------------------

    def _row(self, item: dict[str, Any], thread_id: str, namespace: str) -> CheckpointRow | None:
        payload = self._value(item["p"]["S"], item["v"])
        if payload is None:
            return None
        return CheckpointRow(
            thread_id,
            namespace,
            str(item["cid"]["S"]),
            text(item, "par"),
            text(item, "rid"),
            payload,
        )

    def get(self, thread_id: str, namespace: str, checkpoint_id: str) -> CheckpointRow | None:
        self._check_open()
        if len(_utf8(checkpoint_id)) > _MAX_CHECKPOINT_ID_BYTES:
            return None
        item = self._get(
            self._p(thread_id),
            self._row_sk(namespace, checkpoint_id),
            f"reading a checkpoint of {thread_id!r}",
        )
        return None if item is None else self._row(item, thread_id, namespace)

    def list(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[CheckpointRow]:
        self._check_open()
        if limit is not None and limit <= 0:
            return []
        prefix = f"r!{_seg(namespace, 'n')}!"
        what = f"listing checkpoints of {thread_id!r}"
        page = limit if limit is not None and run_id is None else None
        if before is None:
            items = self._query(self._p(thread_id), what, begins=prefix, forward=False, page=page)
        else:
            items = self._query(
                self._p(thread_id),
                what,
                between=(prefix, prefix + before),
                forward=False,
                page=page,
            )
        out: builtins.list[CheckpointRow] = []
        for item in items:
            cid = str(item["cid"]["S"])
            if (before is not None and cid >= before) or (
                run_id is not None and text(item, "rid") != run_id
            ):
                continue
            row = self._row(item, thread_id, namespace)
            if row is not None:  # None: pruned while being read
                out.append(row)
                if limit is not None and len(out) >= limit:
                    break
        return out

    # -- blobs ----------------------------------------------------------------------------

    def get_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        self._check_open()
        p = self._p(thread_id)
        found = self._batch_get([(p, "b!" + k) for k in keys], f"reading blobs of {thread_id!r}")
        out: dict[str, bytes] = {}
        for k in dict.fromkeys(keys):
            item = found.get((p, "b!" + k))
            value = None if item is None else self._value(p, item["v"])
            if value is not None:
                out[k] = value
        return out

    def scan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        self._check_open()
        if start >= stop:
            return {}
        p = self._p(thread_id)
        out: dict[str, bytes] = {}
        for item in self._query(
            p, f"reading blobs of {thread_id!r}", between=("b!" + start, "b!" + stop)
        ):
            k = str(item["s"]["S"])[2:]
            if start <= k < stop:
                value = self._value(p, item["v"])
                if value is not None:
                    out[k] = value
        return out

    # -- threads --------------------------------------------------------------------------

    def threads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        self._check_open()
        if limit is not None and limit <= 0:
            return []
        pseg = _prefix_seg(prefix)
        start = pseg
        if after is not None:
            raw = _utf8(after)
            # '"' sorts above the end of after's own key and below the whole alphabet
            start = max(
                start, _b64(raw) + '"' if len(raw) <= _MAX_ID_BYTES else _b64(raw[:_MAX_ID_BYTES])
            )
        out: builtins.list[str] = []
        group: builtins.list[str] = []  # real ids of long ids sharing their first 240 bytes
        group_head = ""

        def emit(ids: builtins.list[str]) -> bool:
            for tid in ids:
                if (
                    tid.startswith(prefix)
                    and (after is None or tid > after)
                    and (not out or tid != out[-1])
                ):
                    out.append(tid)
                    if limit is not None and len(out) >= limit:
                        return True
            return False

        for item in self._query("T", "listing threads", at_least=start):
            seg = str(item["s"]["S"])
            if not seg.startswith(pseg):
                break
            tid = str(item["tid"]["S"])
            head = seg.split(".", 1)[0]
            if group and head != group_head:
                if emit(sorted(group)):
                    return out
                group = []
            if "." in seg:
                group.append(tid)
                group_head = head
            elif emit([tid]):
                return out
        emit(sorted(group))
        return out

    def namespaces(self, thread_id: str) -> builtins.list[str]:
        self._check_open()
        items = self._query(self._p(thread_id), f"listing namespaces of {thread_id!r}", begins="h!")
        return sorted({str(item["nsn"]["S"]) for item in items})

    # -- maintenance ----------------------------------------------------------------------

    def rewrite(
        self, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]
    ) -> None:
        """Replace the value of existing rows and blobs, each conditional on the item still
        existing (one deleted meanwhile is not recreated); replaced chunks are deleted."""
        self._check_open()
        p = self._p(thread_id)
        jobs = [(self._row_sk(r.namespace, r.checkpoint_id), bytes(r.payload)) for r in rows]
        jobs += [("b!" + k, bytes(v)) for k, v in blobs.items()]
        self._map(lambda job: self._overwrite(p, *job), jobs)

    def _overwrite(self, p: str, sk: str, value: bytes) -> None:
        old = self._get(p, sk, "reading an item to rewrite it")
        if old is None:
            return
        v, chunks = pack(p, value)
        if chunks:
            self._batch_write(chunks, [], "writing chunks")
        try:
            self._client.update_item(
                TableName=self._table, Key={"p": s(p), "s": s(sk)}, UpdateExpression="SET v = :v",
                ConditionExpression="attribute_exists(s)", ExpressionAttributeValues={":v": v},
            )  # fmt: skip
        except Exception as exc:
            if not is_code(exc, "ConditionalCheckFailedException"):
                raise map_error(exc, f"rewriting {sk!r}", self._table) from exc
            return  # deleted meanwhile (delete_thread or prune won)
        self._drop_chunks(p, [old.get("v")])

    def _drop_chunks(self, p: str, values: Sequence[dict[str, Any] | None]) -> None:
        """Delete the chunk items of values that are no longer referenced."""
        keys: builtins.list[tuple[str, str]] = []
        for v in values:
            nonce = chunk_nonce(v)
            if nonce is not None:
                keys += [(p, str(c["s"]["S"])) for c in self._chunks(p, f"c!{nonce}!")]
        if keys:
            self._batch_write([], keys, "deleting chunks")

    # -- deletion and lifecycle -------------------------------------------------------------

    def delete_thread(self, thread_id: str) -> bool:
        self._check_open()
        p = self._p(thread_id)
        what = f"deleting thread {thread_id!r}"
        items = self._query(p, what)
        # heads first (Query order: b!, c!, h!, l!, r!): gather, then delete heads before the rest
        keys = [str(i["s"]["S"]) for i in items]
        gone = [
            k for k in keys if not k.startswith("l!")
        ]  # lease records stay: tokens keep growing
        found = any(k[:2] in ("h!", "r!", "b!") for k in keys)
        heads = [(p, k) for k in gone if k.startswith("h!")]
        self._batch_write([], [("T", _thread_seg(thread_id)), *heads], what)
        self._batch_write([], [(p, k) for k in gone if not k.startswith("h!")], what)
        return found

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._pool = self._pool, None
        self._kv_close()
        if pool is not None:
            pool.shutdown(wait=True)
        if self._owns_client:
            with contextlib.suppress(AttributeError):
                self._client.close()
