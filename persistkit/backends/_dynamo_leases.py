"""The DynamoDB store's leases (``persistkit.coordination``), a mixin of ``DynamoBackend``.

The lease of (thread, namespace) is the item ``l!<N>`` in the thread's partition
(``lt`` token, ``ld`` data, ``lv`` version), moved by one conditional write
(``lv = :expected``; ``attribute_not_exists(lv)`` for the first record, which
also registers it under ``p = "L"`` for ``lease_list``, in one transaction).
Records are never deleted: ``delete_thread`` leaves them, so tokens keep growing.

The fence: a fenced write's transaction carries a ``ConditionCheck`` of
``lt = :fence`` on this item beside the head's compare-and-swap, so the token
is checked in the same atomic operation that moves the head (one request).

A swap whose response was lost (a timeout after the request was sent, which
botocore retries) comes back as a failed condition; the item the failure returns
(``ReturnValuesOnConditionCheckFailure``) tells whether it was our own write.
"""

from __future__ import annotations

import builtins
from typing import Any

from ._dynamo_items import DynamoCalls, b, is_code, map_error, n, num, s
from ._protocol import LeaseRecord
from ._s3_keys import _prefix_seg, _seg, _thread_seg

__all__ = ["DynamoLeases"]


class DynamoLeases(DynamoCalls):
    def lease_get(self, thread_id: str, namespace: str) -> LeaseRecord | None:
        self._check_open()
        item = self._get(
            self._p(thread_id), "l!" + _seg(namespace, "n"), f"reading the lease of {thread_id!r}"
        )
        return None if item is None else _record(item)

    def lease_swap(
        self, thread_id: str, namespace: str, expected: int, token: int, data: bytes
    ) -> bool:
        self._check_open()
        p, sk = self._p(thread_id), "l!" + _seg(namespace, "n")
        what = f"swapping the lease of {thread_id!r}"
        values = {
            ":t": n(token),
            ":d": b(data),
            ":nv": n(expected + 1),
            ":tid": s(thread_id),
            ":ns": s(namespace),
        }
        update: dict[str, Any] = {
            "TableName": self._table,
            "Key": {"p": s(p), "s": s(sk)},
            "UpdateExpression": "SET lt = :t, ld = :d, lv = :nv, tid = :tid, nsn = :ns",
            "ExpressionAttributeValues": values,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        try:
            if expected == 0:
                update["ConditionExpression"] = "attribute_not_exists(lv)"
                registry = {
                    "Put": {
                        "TableName": self._table,
                        "Item": {
                            "p": s("L"), "s": s(_thread_seg(thread_id) + "!" + _seg(namespace, "n")),
                            "tid": s(thread_id), "nsn": s(namespace),
                        },
                    }
                }  # fmt: skip
                self._client.transact_write_items(TransactItems=[{"Update": update}, registry])
            else:
                update["ConditionExpression"] = "lv = :e"
                values[":e"] = n(expected)
                self._client.update_item(**update)
            return True
        except Exception as exc:
            failed, old = _failed_item(exc)
            if not failed:
                raise map_error(exc, what, self._table) from exc
            # our own earlier attempt (a retried request) already made this record?
            return (
                old is not None
                and num(old, "lv") == expected + 1
                and num(old, "lt") == token
                and bytes(old.get("ld", {}).get("B", b"")) == bytes(data)
            )

    def lease_list(self, *, prefix: str = "") -> builtins.list[tuple[str, str, LeaseRecord]]:
        self._check_open()
        entries = [
            (str(item["tid"]["S"]), str(item["nsn"]["S"]))
            for item in self._query("L", "listing leases", begins=_prefix_seg(prefix))
            if str(item["tid"]["S"]).startswith(prefix)
        ]
        keys = [(self._p(t), "l!" + _seg(ns, "n")) for t, ns in entries]
        found = self._batch_get(keys, "listing leases")
        out = [
            (t, ns, _record(found[k]))
            for (t, ns), k in zip(entries, keys, strict=True)
            if k in found
        ]
        return sorted(out, key=lambda e: (e[0], e[1]))


def _record(item: dict[str, Any]) -> LeaseRecord:
    return LeaseRecord(num(item, "lt"), bytes(item.get("ld", {}).get("B", b"")), num(item, "lv"))


def _failed_item(exc: Exception) -> tuple[bool, dict[str, Any] | None]:
    """Whether ``exc`` is a failed condition, and the item it returned (None: there was none)."""
    from ._dynamo_items import reasons

    if is_code(exc, "ConditionalCheckFailedException"):
        item = getattr(exc, "response", {}).get("Item")
        return True, dict(item) if item else None
    if is_code(exc, "TransactionCanceledException"):
        got = reasons(exc)
        if got and got[0].get("Code") == "ConditionalCheckFailed":
            item = got[0].get("Item")
            return True, dict(item) if item else None
    return False, None
