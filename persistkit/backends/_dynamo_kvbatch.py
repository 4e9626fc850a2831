"""The DynamoDB store's kv batches larger than one transaction, committed through a record.

A kv batch that fits one ``TransactWriteItems`` (100 actions, about 4 MB: at most 50
keys, 2 items a key) is that one transaction (``_dynamo_kv``). A larger one commits
all or nothing through a batch record, as the S3 store's batches do (``_s3_kv``).

Items (partition ``p = "k" + scope``)
-------------------------------------
``x!<id>``
    The record of batch ``<id>``: ``st`` ``pending``, ``committed`` or ``aborted``
    (moved only by conditional writes from ``pending``), ``ts`` the writer's clock at
    its creation (ms), ``nk`` its number of keys. Records stay until ``kv_drop``.
``l!<K>`` held by a batch
    Also ``xb`` (the batch id), ``xv`` (the key's new version) and ``xn`` (its new
    value; absent: a delete), beside the key's committed ``kv`` and ``v``.
``v!<K>!<version>`` written by a batch
    Also ``xb``.

Steps
-----
1. read every key (``BatchGetItem``): a key held by a settled batch is settled first
   (below), a key held by a batch in flight is waited for (50 ms polls); a key not at
   its expected version raises ``ConflictError`` for the first such op, nothing written;
2. create the record ``pending`` (``PutItem``);
3. in transactions of up to 100 actions, in the order of the keys' segments: per key
   an ``Update`` of ``l!<K>`` setting ``xb``/``xv``/``xn``, conditional on ``kv`` being
   the expected version and on no ``xb``, and a ``Put`` of the version item with
   ``xb``. A failed condition aborts the batch: ``ConflictError``;
4. flip the record to ``committed``, conditional on ``pending``: the commit point;
5. per key, move ``xv``/``xn`` into ``kv``/``v`` and remove the mark (conditional on
   ``xb`` being this batch; transactions of up to 100, one by one where a condition
   fails because another writer did it first), then trim versions beyond ``keep``.

Every read sees a held key through its batch's record: ``committed``, the key is at
``xv``/``xn``; otherwise at ``kv``/``v`` (absent when it has no ``kv``), and a version
item with ``xb`` exists only if its batch committed. So nothing of a batch is visible
before step 4 and all of it is after. A writer (a single transaction's condition
fails on ``xb``, or step 1 meets it) settles a held key: completes it (step 5 for that
key) when the batch committed, removes the mark (and the batch's version item and
chunks) when it aborted, waits while it is pending and young. A record ``pending``
for longer than ``kv_pending_timeout`` (seconds, option, default 10; by the writer's
clock in ``ts`` or by how long this instance has seen it pending, the longer) belongs
to a crashed or stalled writer: a reader or writer flips it to ``aborted``; the
stalled writer's own flip then fails and it raises ``ConflictError``. A clock behind
by more than the timeout makes batches look old early: they are aborted (and retried
by their writers), never half visible. Readers never wait. Committed and aborted are
final and cached per instance.

In such a batch a value over ``BATCH_INLINE_MAX`` (32 KB) is chunked: a held latest
item carries its committed value (up to 350 KB) beside ``xn``, and an item stops at
400 KB. A crash before any key was marked leaves a ``pending`` record no one reads.

Two batches over shared keys mark them in the same order, so the one that holds the
first shared key wins and the other aborts (two batches never each hold a key the
other waits for). Requests for N keys: ceil(N/100) ``BatchGetItem``, one ``PutItem``,
about N/50 transactions, one ``UpdateItem``, about N/100 transactions, and the trim
(one Query a key past ``keep``, then ``BatchWriteItem``).
"""

from __future__ import annotations

import builtins
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._errors import BackendError, ConflictError
from ._dynamo_items import (
    INLINE_MAX,
    TXN_MAX_ACTIONS,
    TXN_MAX_BYTES,
    DynamoCalls,
    chunk_nonce,
    is_code,
    map_error,
    n,
    num,
    reasons,
    s,
)
from ._protocol import KvOp
from ._s3_keys import _thread_seg

__all__ = ["BATCH_INLINE_MAX", "DynamoKvBatch", "fits_one_transaction", "ver"]

_log = logging.getLogger(__name__)

PENDING, COMMITTED, ABORTED = "pending", "committed", "aborted"
_KEY_BYTES = 6_000  # a key's names and attributes in a transaction (a key is <= 4 KB of UTF-8)
#: a held latest item carries its committed value (up to INLINE_MAX) beside the batch's new
#: one, and an item stops at 400 KB: a batch's values above this many bytes are chunked
BATCH_INLINE_MAX = 32_000

Item = dict[str, Any]


def ver(version: int) -> str:
    return f"{version:012d}"


def _weight(v: Mapping[str, Any] | None) -> int:
    """Bytes a packed value adds to a request (a chunked one is a short pointer)."""
    return len(v["M"]["d"]["B"]) if v is not None and "d" in v["M"] else 100


def fits_one_transaction(values: Sequence[bytes | None]) -> bool:
    """Whether a batch writing these values is one transaction (2 items a key)."""
    inline = (len(v) if v is not None and len(v) <= INLINE_MAX else 100 for v in values)
    return (
        2 * len(values) <= TXN_MAX_ACTIONS
        and sum(2 * (w + _KEY_BYTES) for w in inline) <= TXN_MAX_BYTES
    )


def _groups(costs: Sequence[tuple[int, int]]) -> builtins.list[builtins.list[int]]:
    """Indices of ``costs`` (actions, bytes) cut in order into transactions that fit."""
    out: builtins.list[builtins.list[int]] = []
    actions = size = 0
    for i, (a, b) in enumerate(costs):
        if not out or actions + a > TXN_MAX_ACTIONS or size + b > TXN_MAX_BYTES:
            out.append([])
            actions = size = 0
        out[-1].append(i)
        actions, size = actions + a, size + b
    return out


class DynamoKvBatch(DynamoCalls):
    """Batch records, held keys and the reads' view of them (see the module docstring)."""

    if TYPE_CHECKING:  # the DynamoBackend method these use

        def _map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> builtins.list[Any]: ...

    def _batch_setup(self, pending_timeout: float) -> None:
        self._pending_timeout = pending_timeout
        self._settled: dict[str, str] = {}  # batch id -> committed/aborted (both final)
        self._seen_pending: dict[str, float] = {}  # batch id -> when first seen pending
        self._batch_lock = threading.Lock()

    # -- records ------------------------------------------------------------------------

    def _status(self, p: str, bid: str, memo: dict[str, str] | None = None) -> str:
        """The status of batch ``bid``; a pending one older than the timeout is aborted here."""
        with self._batch_lock:
            known = self._settled.get(bid)
        if known is not None:
            return known
        if memo is not None and bid in memo:
            return memo[bid]
        record = self._get(p, "x!" + bid, "reading a kv batch record")
        if record is None:  # records go only with kv_drop: its marks are leftovers
            status = ABORTED
        else:
            status = str(record["st"]["S"])
            if status == PENDING and self._age(bid, record) > self._pending_timeout:
                status = self._flip(p, bid, ABORTED)
        if status == PENDING:
            if memo is not None:
                memo[bid] = status
        else:
            self._note(bid, status)
        return status

    def _age(self, bid: str, record: Item) -> float:
        now = time.monotonic()
        with self._batch_lock:
            if len(self._seen_pending) > 10_000:
                self._seen_pending.clear()
            first = self._seen_pending.setdefault(bid, now)
        return max(now - first, time.time() - num(record, "ts") / 1000)

    def _note(self, bid: str, status: str) -> None:
        with self._batch_lock:
            self._seen_pending.pop(bid, None)
            if len(self._settled) > 100_000:
                self._settled.clear()
            self._settled[bid] = status

    def _flip(self, p: str, bid: str, status: str) -> str:
        """Move a pending record to ``status``; the status it has afterwards."""
        try:
            self._client.update_item(
                TableName=self._table,
                Key={"p": s(p), "s": s("x!" + bid)},
                UpdateExpression="SET st = :to",
                ConditionExpression="st = :pending",
                ExpressionAttributeValues={":to": s(status), ":pending": s(PENDING)},
            )
        except Exception as exc:
            if not is_code(exc, "ConditionalCheckFailedException"):
                raise map_error(exc, f"settling kv batch {bid!r}", self._table) from exc
            record = self._get(p, "x!" + bid, "reading a kv batch record")
            status = ABORTED if record is None else str(record["st"]["S"])
        self._note(bid, status)
        return status

    # -- what readers see -------------------------------------------------------------------

    def _view(self, p: str, item: Item, memo: dict[str, str] | None = None) -> Item | None:
        """A latest item as committed: a held key through its batch's record; None: no key."""
        if "xb" in item and self._status(p, str(item["xb"]["S"]), memo) == COMMITTED:
            view: Item = {k: item[k] for k in ("p", "s", "kk") if k in item}
            view["kv"] = item["xv"]
            if "xn" in item:
                view["v"] = item["xn"]
            return view
        if "kv" not in item:
            return None
        return {k: v for k, v in item.items() if k not in ("xb", "xv", "xn")}

    def _visible(self, p: str, item: Item, memo: dict[str, str] | None = None) -> bool:
        """Whether a version item is committed (one written by a batch: its batch is)."""
        return "xb" not in item or self._status(p, str(item["xb"]["S"]), memo) == COMMITTED

    # -- settling held keys (writers) -------------------------------------------------------

    def _finish_update(self, p: str, sk: str, bid: str, new: int, v: Any) -> Item:
        """The ``UpdateItem`` that moves a committed batch's value into a latest item."""
        values: Item = {":b": s(bid), ":nv": n(new)}
        expr = "SET kv = :nv REMOVE v, xb, xv, xn"
        if v is not None:
            expr = "SET kv = :nv, v = :v REMOVE xb, xv, xn"
            values[":v"] = v
        return {
            "TableName": self._table,
            "Key": {"p": s(p), "s": s(sk)},
            "UpdateExpression": expr,
            "ConditionExpression": "xb = :b",
            "ExpressionAttributeValues": values,
        }

    def _update_if(self, update: Item) -> bool:
        """One conditional ``UpdateItem``; False when its condition failed."""
        try:
            self._client.update_item(**update)
            return True
        except Exception as exc:
            if is_code(exc, "ConditionalCheckFailedException"):
                return False
            raise map_error(exc, "settling a kv batch's key", self._table) from exc

    def _unmark(self, p: str, sk: str, bid: str, item: Item) -> None:
        """Remove an aborted batch's mark from a latest item, then its version item and chunks."""
        done = self._update_if(
            {
                "TableName": self._table,
                "Key": {"p": s(p), "s": s(sk)},
                "UpdateExpression": "REMOVE xb, xv, xn",
                "ConditionExpression": "xb = :b",
                "ExpressionAttributeValues": {":b": s(bid)},
            }
        )
        if not done:
            return  # settled by someone else
        try:
            self._client.delete_item(
                TableName=self._table,
                Key={"p": s(p), "s": s(f"v!{sk[2:]}!{ver(num(item, 'xv'))}")},
                ConditionExpression="xb = :b",
                ExpressionAttributeValues={":b": s(bid)},
            )
        except Exception as exc:  # a writer took the slot since: it is theirs now
            if not is_code(exc, "ConditionalCheckFailedException"):
                raise map_error(exc, "removing an aborted kv batch's version", self._table) from exc
        nonce = chunk_nonce(item.get("xn"))
        if nonce is not None:
            gone = [(p, str(c["s"]["S"])) for c in self._chunks(p, f"c!{nonce}!")]
            self._batch_write([], gone, "removing an aborted kv batch's chunks")

    def _settle(self, p: str, held: Sequence[Item]) -> bool:
        """Settle the keys ``held`` by batches: complete committed ones, unmark aborted ones.
        False when every one belongs to a batch still in flight (the caller waits)."""
        memo: dict[str, str] = {}
        todo = [(it, self._status(p, str(it["xb"]["S"]), memo)) for it in held]
        todo = [(it, st) for it, st in todo if st != PENDING]

        def one(job: tuple[Item, str]) -> None:
            it, st = job
            sk, bid = str(it["s"]["S"]), str(it["xb"]["S"])
            if st == COMMITTED:
                self._update_if(self._finish_update(p, sk, bid, num(it, "xv"), it.get("xn")))
            else:
                self._unmark(p, sk, bid, it)

        self._map(one, todo)
        return bool(todo)

    # -- a batch larger than one transaction -------------------------------------------------

    def _write_batch(
        self, scope: str, ops: Sequence[KvOp], packed: Sequence[Item | None], keep: int
    ) -> None:
        p, what = "k" + scope, f"writing a batch of {len(ops)} keys of {scope!r}"
        segs = [_thread_seg(op.key) for op in ops]
        latest = [(p, "l!" + k) for k in segs]
        while True:  # 1. every key settled and at its expected version
            got = self._batch_get(latest, what)
            held = [it for it in got.values() if "xb" in it]
            if not held:
                break
            if not self._settle(p, held):
                time.sleep(0.05)
        for op, key in zip(ops, latest, strict=True):
            found = num(got.get(key) or {}, "kv")
            if found != op.expected:
                raise ConflictError(key=op.key, namespace=scope, expected=op.expected, found=found)
        bid = secrets.token_hex(12)
        record = {
            "p": s(p),
            "s": s("x!" + bid),
            "st": s(PENDING),
            "ts": n(int(time.time() * 1000)),
            "nk": n(len(ops)),
        }
        try:  # 2. the record; its id is fresh, so a failed condition is the client's retry of
            # a put that had landed (its response lost)
            self._client.put_item(
                TableName=self._table, Item=record, ConditionExpression="attribute_not_exists(s)"
            )
        except Exception as exc:
            if not is_code(exc, "ConditionalCheckFailedException"):
                raise map_error(exc, what, self._table) from exc
        order = sorted(range(len(ops)), key=lambda i: segs[i])
        try:
            self._mark(p, scope, bid, [(ops[i], segs[i], packed[i]) for i in order])
            if self._flip(p, bid, COMMITTED) != COMMITTED:  # 4. the commit point
                raise ConflictError(  # aborted as stalled by another writer meanwhile
                    key=ops[0].key,
                    namespace=scope,
                    expected=ops[0].expected,
                    found=self._found(p, latest[0][1]),
                )
        except Exception:
            if not self._abandon(p, bid, segs):
                raise
        try:  # 5. readers see the batch through its record already: a failure here is tidying
            finals = [
                self._finish_update(p, "l!" + k, bid, op.expected + 1, v)
                for op, k, v in zip(ops, segs, packed, strict=True)
            ]
            for group in _groups([(1, _weight(v) + _KEY_BYTES) for v in packed]):
                self._finish([finals[i] for i in group], what)
            self._trim(
                p,
                [
                    (k, op.expected + 1 - keep)
                    for op, k in zip(ops, segs, strict=True)
                    if op.expected + 1 > keep
                ],
            )
        except BackendError:
            _log.warning(
                "kv batch %s of %r committed, but moving its values into place failed; the next "
                "writer of each key does it",
                bid,
                scope,
                exc_info=True,
            )

    def _mark(
        self, p: str, scope: str, bid: str, held: Sequence[tuple[KvOp, str, Item | None]]
    ) -> None:
        """3. hold every key for the batch, a transaction at a time (see the module docstring)."""
        for group in _groups([(2, 2 * (_weight(v) + _KEY_BYTES)) for _, _, v in held]):
            actions: builtins.list[Item] = []
            for op, kseg, v in (held[i] for i in group):
                new = op.expected + 1
                values: Item = {":b": s(bid), ":nv": n(new), ":k": s(op.key)}
                expr = "SET xb = :b, xv = :nv, kk = :k"
                if v is not None:
                    expr += ", xn = :v"
                    values[":v"] = v
                cond = "attribute_not_exists(xb) AND "
                if op.expected == 0:
                    cond += "attribute_not_exists(kv)"
                else:
                    cond += "kv = :e"
                    values[":e"] = n(op.expected)
                version: Item = {
                    "p": s(p),
                    "s": s(f"v!{kseg}!{ver(new)}"),
                    "kk": s(op.key),
                    "kv": n(new),
                    "xb": s(bid),
                }
                if v is not None:
                    version["v"] = v
                update = {
                    "TableName": self._table,
                    "Key": {"p": s(p), "s": s("l!" + kseg)},
                    "UpdateExpression": expr,
                    "ConditionExpression": cond,
                    "ExpressionAttributeValues": values,
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
                actions += [
                    {"Update": update},
                    {"Put": {"TableName": self._table, "Item": version}},
                ]
            try:
                self._transact(actions, f"writing keys of {scope!r}")
            except Exception as exc:
                got = reasons(exc)
                if any((r.get("Item") or {}).get("xb", {}).get("S") == bid for r in got):
                    # our own mark: the client retried a transaction that had landed (its
                    # response lost); all or nothing, so the whole group is held already
                    continue
                for j, i in enumerate(group):
                    if 2 * j < len(got) and got[2 * j].get("Code") == "ConditionalCheckFailed":
                        op, kseg = held[i][0], held[i][1]
                        seen = self._view(p, got[2 * j].get("Item") or {})
                        raise ConflictError(
                            key=op.key,
                            namespace=scope,
                            expected=op.expected,
                            found=num(seen or {}, "kv"),
                        ) from exc
                raise

    def _found(self, p: str, sk: str) -> int:
        item = self._get(p, sk, "reading a kv key")
        seen = None if item is None else self._view(p, item)
        return num(seen or {}, "kv")

    def _abandon(self, p: str, bid: str, segs: Sequence[str]) -> bool:
        """After a failure in steps 3-4: abort the batch and remove its marks. True when it
        turns out committed (the commit's response was lost): the write stands."""
        try:
            if self._flip(p, bid, ABORTED) == COMMITTED:
                return True
            items = self._batch_get([(p, "l!" + k) for k in segs], "removing a kv batch's marks")
            mine = [it for it in items.values() if it.get("xb", {}).get("S") == bid]
            self._map(lambda it: self._unmark(p, str(it["s"]["S"]), bid, it), mine)
        except BackendError:
            _log.warning(
                "could not abort kv batch %s; it is aborted once it is old", bid, exc_info=True
            )
        return False

    def _finish(self, updates: Sequence[Item], what: str) -> None:
        """Apply ``updates`` as one transaction, or one by one where another writer did some."""
        try:
            self._transact([{"Update": u} for u in updates], what)
        except Exception as exc:
            if not reasons(exc):
                raise
            self._map(self._update_if, list(updates))

    def _trim(self, p: str, cuts: Sequence[tuple[str, int]]) -> None:
        """Delete the versions at or below each cut (and their chunks)."""
        gone: builtins.list[tuple[str, str]] = []
        for kseg, cut in cuts:
            prefix = f"v!{kseg}!"
            for item in self._query(
                p, "trimming old versions", between=(prefix, prefix + ver(cut))
            ):
                gone.append((p, str(item["s"]["S"])))
                nonce = chunk_nonce(item.get("v"))
                if nonce is not None:
                    gone += [(p, str(c["s"]["S"])) for c in self._chunks(p, f"c!{nonce}!")]
        if gone:
            self._batch_write([], gone, "trimming old versions")
