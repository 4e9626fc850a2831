"""The S3 store's leases (``persistkit.coordination``), kept beside ``s3.py``.

``l/<T>!<N>``: the lease of (thread, namespace), JSON with token, data and version,
moved by PutObject with If-Match / If-None-Match like the head. S3 has no
transaction over two objects, so the fence lives on the head: a NEW holder, right
after its swap, seals the head (rewrites it with ``"f": <its token>``, If-Match),
which changes the head's ETag. A replaced holder's next conditional head write
then fails, and the head it reads back names a newer token: ``LeaseLostError``.
Renewals do not touch the head, so a holder's steps cost what they cost without
a lease.

A thread with no head yet is sealed too: the new holder creates a placeholder
head (``{"v": 0, "f": <token>}``, If-None-Match: *), so the old holder's own head
creation (If-None-Match: *) fails the same way, however long it paused between
its checks and that request. Every reader takes a placeholder for "no thread"
(``_s3_keys``); ``delete_thread`` removes it. A writer that finds no head at all
(the thread was deleted under a live lease) also reads the lease first, so a
holder replaced before the delete writes nothing.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

from .._errors import BackendUnavailableError, LeaseLostError
from ._protocol import CheckpointRow, LeaseRecord
from ._s3_keys import (
    _CONFLICT_CODES,
    _decode_head,
    _is_client_error,
    _map_error,
    _placeholder_body,
    _prefix_seg,
    _seg,
    _thread_seg,
)

if TYPE_CHECKING:
    from ._s3_keys import _HeadState

# The S3Backend these functions serve (s3.py imports this module, so not the reverse).
_S3 = Any

__all__ = ["check_fence", "check_first_fence", "listing", "read", "swap"]


def _key(b: _S3, thread_id: str, namespace: str) -> str:

    return f"{b._root}l/{_thread_seg(thread_id)}!{_seg(namespace, 'n')}"


def _decode(data: bytes) -> tuple[str, str, LeaseRecord]:
    d = json.loads(data)
    return str(d["thread"]), str(d["ns"]), LeaseRecord(int(d["t"]), base64.b64decode(d["d"]), int(d["v"]))


def read(b: _S3, thread_id: str, namespace: str) -> tuple[LeaseRecord, str] | None:
    """The lease record and its ETag, or None."""
    got = b._get_object(_key(b, thread_id, namespace), f"reading the lease of {thread_id!r}")
    return None if got is None else (_decode(got[0])[2], got[1])


def swap(b: _S3, thread_id: str, namespace: str, expected: int, token: int, data: bytes) -> bool:

    found = read(b, thread_id, namespace)
    if (found[0].version if found else 0) != expected:
        return False
    body = json.dumps(
        {"t": token, "d": base64.b64encode(bytes(data)).decode(), "v": expected + 1, "thread": thread_id, "ns": namespace}
    ).encode()
    condition = {"IfMatch": found[1]} if found else {"IfNoneMatch": "*"}
    try:
        b._client.put_object(Bucket=b._bucket, Key=_key(b, thread_id, namespace), Body=body, **condition)
    except Exception as exc:
        if _is_client_error(exc, _CONFLICT_CODES):
            return False
        raise _map_error(exc, f"swapping the lease of {thread_id!r}") from exc
    if token != (found[0].token if found else 0):
        _seal(b, thread_id, namespace, token)
    return True


def _seal(b: _S3, thread_id: str, namespace: str, token: int) -> None:
    """Rewrite the head with the new holder's token, or create a placeholder head sealed
    with it when there is none (its ETag changes or it appears: see the module docstring)."""

    key = b._head_key(thread_id, namespace)
    for _ in range(20):
        got = b._get_object(key, f"reading head of {thread_id!r}")
        if got is None:
            body, condition = _placeholder_body(token), {"IfNoneMatch": "*"}
        else:
            h = json.loads(got[0])
            if int(h.get("f", 0)) >= token:
                return
            h["f"] = token
            body, condition = json.dumps(h).encode("ascii"), {"IfMatch": got[1]}
        try:
            resp = b._client.put_object(Bucket=b._bucket, Key=key, Body=body, **condition)
            # the holder's next write builds on this head: spare it the GET
            b._remember_head(thread_id, namespace, _decode_head(body, str(resp.get("ETag", ""))))
            return
        except Exception as exc:
            if not _is_client_error(exc, _CONFLICT_CODES):
                raise _map_error(exc, f"sealing the head of {thread_id!r}") from exc
    raise BackendUnavailableError(f"S3 kept moving the head of {thread_id!r} while its lease was sealed")


def check_fence(row: CheckpointRow, fence: int, head: _HeadState | None) -> None:
    """Refuse a fenced write when the head was sealed by a newer holder."""
    if head is not None and head.fence > fence:
        raise LeaseLostError(thread_id=row.thread_id, namespace=row.namespace, token=fence, found=head.fence)


def check_first_fence(b: _S3, row: CheckpointRow, fence: int) -> None:
    """A write that finds no head at all (not even a placeholder: the thread was deleted
    under the lease) reads the lease, so a holder replaced before the delete writes nothing."""
    found = read(b, row.thread_id, row.namespace)
    if found is None or found[0].token != fence:
        raise LeaseLostError(
            thread_id=row.thread_id, namespace=row.namespace, token=fence, found=found[0].token if found else 0
        )


def listing(b: _S3, prefix: str) -> list[tuple[str, str, LeaseRecord]]:

    keys = list(b._list(f"{b._root}l/{_prefix_seg(prefix)}"))

    def fetch(key: str) -> tuple[str, str, LeaseRecord] | None:
        got = b._get_object(key, "listing leases")
        return None if got is None else _decode(got[0])

    found = [e for e in b._map(fetch, keys) if e is not None and e[0].startswith(prefix)]
    return sorted(found, key=lambda e: (e[0], e[1]))
