"""The DynamoDB store's keys, value packing, error mapping and request plumbing.

Shared by ``dynamodb.py`` and its mixins (``_dynamo_kv``, ``_dynamo_prune``,
``_dynamo_leases``), which import this module and not each other.

Keys (one table, partition key ``p``, sort key ``s``, both strings)
-------------------------------------------------------------------
``p = "t" + <T>``: one partition per thread, ``<T>`` the thread id's
order-preserving base64 segment of the S3 store (``_s3_keys._thread_seg``: ids
over 240 UTF-8 bytes become ``<first 240 bytes>.<sha256>``). In it:

* ``h!<N>`` the head of namespace ``<N>`` (``_seg(ns, "n")``): ``hv`` version,
  ``hc`` checkpoint id;
* ``r!<N>!<checkpoint id>`` a row: ``run``, ``parent``, ``v`` the payload;
* ``b!<blob key>`` a blob: ``v``, ``z`` its size;
* ``l!<N>`` the lease: ``lt`` token, ``ld`` data, ``lv`` version;
* ``c!<nonce>!<i>`` a chunk of a value over ``INLINE_MAX`` bytes.

``p = "T"``, ``s = <T>``: the thread registry (``threads()`` is one ranged Query);
``p = "L"``, ``s = <T>!<N>``: the lease registry (``lease_list``); ``p = "k" +
scope``: a kv scope (``_dynamo_kv``). Every item keeps the real ids it stands for
(``thread``, ``ns``, ``key``), so a hashed long id costs no extra read.

Values (``v``): a map ``{"d": bytes}``, or for a value over ``INLINE_MAX`` bytes
(DynamoDB items stop at 400 KB) ``{"k": nonce, "n": chunks, "z": size}``, its
bytes in ``n`` chunk items written before the item that points at them. Chunks
are immutable and keyed by a random nonce, so two writers never mix theirs.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .._errors import BackendError, BackendUnavailableError, ConfigurationError

__all__ = ["INLINE_MAX", "b", "n", "pack", "s", "unpack"]

#: values above this many bytes are chunked (an item holds at most 400 KB with its keys)
INLINE_MAX = 350_000
#: a transaction holds at most 100 actions and 4 MB; keep a margin for keys and names
TXN_MAX_ACTIONS = 100
TXN_MAX_BYTES = 3_500_000

_TRANSIENT = {
    "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
    "InternalServerError", "ServiceUnavailable", "TransactionInProgressException",
    "LimitExceededException",
}  # fmt: skip
_TRANSIENT_REASONS = {
    "TransactionConflict",
    "ThrottlingError",
    "ProvisionedThroughputExceeded",
    "InternalServerError",
}

_FIXES = {
    "UnrecognizedClientException": "Check the AWS credentials (AWS_ACCESS_KEY_ID / profile) this process uses",
    "InvalidSignatureException": "Check the AWS secret key this process uses",
    "AccessDeniedException": "The credentials may not use this table: check the IAM policy (docs/backends.md lists the actions)",
}


def s(text: str) -> dict[str, Any]:
    return {"S": text}


def n(number: int) -> dict[str, Any]:
    return {"N": str(number)}


def b(data: bytes) -> dict[str, Any]:
    return {"B": bytes(data)}


def num(item: Mapping[str, Any], name: str, default: int = 0) -> int:
    got = item.get(name)
    return int(got["N"]) if got else default


def text(item: Mapping[str, Any], name: str) -> str | None:
    got = item.get(name)
    return None if got is None or "NULL" in got else str(got["S"])


# -- values ---------------------------------------------------------------------------


def pack(
    p: str, value: bytes, inline: int = INLINE_MAX
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``v`` attribute for ``value`` and the chunk items to write first (none if it is
    at most ``inline`` bytes)."""
    value = bytes(value)
    if len(value) <= inline:
        return {"M": {"d": b(value)}}, []
    nonce = secrets.token_hex(8)
    chunks = [
        {"p": s(p), "s": s(f"c!{nonce}!{i:05d}"), "d": b(value[off : off + INLINE_MAX])}
        for i, off in enumerate(range(0, len(value), INLINE_MAX))
    ]
    return {"M": {"k": s(nonce), "n": n(len(chunks)), "z": n(len(value))}}, chunks


def size_of(v: Mapping[str, Any]) -> int:
    m = v["M"]
    return len(m["d"]["B"]) if "d" in m else int(m["z"]["N"])


def chunk_nonce(v: Mapping[str, Any] | None) -> str | None:
    return None if v is None or "d" in v["M"] else str(v["M"]["k"]["S"])


def unpack(
    p: str, v: Mapping[str, Any], fetch: Callable[[str, str], list[dict[str, Any]]]
) -> bytes | None:
    """The bytes of a ``v`` attribute; ``fetch(p, prefix)`` queries the chunk items. None
    when a chunk is missing (the value was deleted while being read)."""
    m = v["M"]
    if "d" in m:
        return bytes(m["d"]["B"])
    nonce, count = m["k"]["S"], int(m["n"]["N"])
    parts = fetch(p, f"c!{nonce}!")
    if len(parts) != count:
        return None
    return b"".join(bytes(c["d"]["B"]) for c in parts)


# -- errors ---------------------------------------------------------------------------


def code_of(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def reasons(exc: BaseException) -> list[dict[str, Any]]:
    """The ``CancellationReasons`` of a cancelled transaction, one per action."""
    response = getattr(exc, "response", None)
    got = response.get("CancellationReasons") if isinstance(response, dict) else None
    return list(got or [])


def is_code(exc: BaseException, *codes: str) -> bool:
    from botocore.exceptions import ClientError

    return isinstance(exc, ClientError) and code_of(exc) in codes


def map_error(exc: Exception, what: str, table: str) -> BackendError | ConfigurationError:
    """The persistkit error for a botocore failure while doing ``what``."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionError,
        HTTPClientError,
        NoCredentialsError,
    )

    if isinstance(exc, ConnectionError | HTTPClientError):
        # a timeout after the request was sent is ambiguous: the store's callers resolve
        # a write by reading it back (persistkit._io), so it is transient here
        return BackendUnavailableError(f"DynamoDB unreachable while {what}: {exc}")
    if isinstance(exc, ClientError):
        code = code_of(exc)
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if (
            code in _TRANSIENT
            or status >= 500
            or {r.get("Code") for r in reasons(exc)} & _TRANSIENT_REASONS
        ):
            return BackendUnavailableError(
                f"DynamoDB is busy or unavailable ({code}) while {what}: {exc}"
            )
        if code == "ResourceNotFoundException":
            return missing_table(table, str(exc))
        fix = _FIXES.get(code, "")
        return BackendError(
            f"DynamoDB failed ({code}) while {what}: {exc}" + (f". {fix}" if fix else "")
        )
    if isinstance(exc, NoCredentialsError):
        return ConfigurationError(
            f"DynamoDB: no AWS credentials while {what}: give this process credentials the usual "
            "boto3 ways (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an instance or "
            "task role); a store URL never carries them"
        )
    if isinstance(exc, BotoCoreError):
        return BackendError(f"DynamoDB client failed while {what}: {exc}")
    return BackendError(f"DynamoDB failed while {what}: {type(exc).__name__}: {exc}")


def missing_table(table: str, detail: str = "", url: str | None = None) -> ConfigurationError:
    """The error for a table that does not exist; ``url`` (masked) is the store's own, so the
    command it suggests targets the same endpoint and region. ``missing_table`` is set on it
    (the CLI reports such a store as not found)."""
    where = url or f"dynamodb://{table}?region=…"
    error = ConfigurationError(
        f"the DynamoDB table {table!r} does not exist"
        + (f" ({detail})" if detail else "")
        + f". Create it with `persistkit dynamodb create-table --url '{where}'`, or open the "
        "store with ?create=1 (docs/backends.md lists its key schema and the IAM actions it needs)"
    )
    error.missing_table = table  # type: ignore[attr-defined]
    return error


# -- requests -------------------------------------------------------------------------


class DynamoCalls:
    """Request plumbing of the DynamoDB store: one client, one table, errors mapped."""

    _client: Any
    _table: str

    def _check_open(self) -> None:
        raise NotImplementedError

    def _p(self, thread_id: str) -> str:
        """The partition of a thread."""
        from ._s3_keys import _thread_seg

        return "t" + _thread_seg(thread_id)

    def _call(self, what: str, op: str, **kwargs: Any) -> Any:
        try:
            return getattr(self._client, op)(TableName=self._table, **kwargs)
        except Exception as exc:
            raise map_error(exc, what, self._table) from exc

    def _get(self, p: str, sk: str, what: str) -> dict[str, Any] | None:
        got = self._call(what, "get_item", Key={"p": s(p), "s": s(sk)}, ConsistentRead=True)
        item = got.get("Item")
        return dict(item) if item else None

    def _query(
        self,
        p: str,
        what: str,
        *,
        begins: str | None = None,
        between: tuple[str, str] | None = None,
        at_least: str | None = None,
        forward: bool = True,
        page: int | None = None,
        project: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Items of partition ``p`` in sort-key order (``forward``), page by page, strongly consistent."""
        values: dict[str, Any] = {":p": s(p)}
        cond = "p = :p"
        if begins:  # "" (every key) is no condition: a key value may not be empty
            cond += " AND begins_with(s, :b)"
            values[":b"] = s(begins)
        elif between is not None:
            cond += " AND s BETWEEN :lo AND :hi"
            values[":lo"], values[":hi"] = s(between[0]), s(between[1])
        elif at_least:  # "" (every key) is no condition: a key value may not be empty
            cond += " AND s >= :lo"
            values[":lo"] = s(at_least)
        kwargs: dict[str, Any] = {
            "KeyConditionExpression": cond,
            "ExpressionAttributeValues": values,
            "ConsistentRead": True,
            "ScanIndexForward": forward,
        }
        if page is not None:
            kwargs["Limit"] = page
        if project is not None:
            kwargs["ProjectionExpression"] = project
        while True:
            resp = self._call(what, "query", **kwargs)
            yield from resp.get("Items", ())
            last = resp.get("LastEvaluatedKey")
            if not last:
                return
            kwargs["ExclusiveStartKey"] = last

    def _chunks(self, p: str, prefix: str) -> list[dict[str, Any]]:
        return list(self._query(p, "reading a chunked value", begins=prefix))

    def _value(self, p: str, v: Mapping[str, Any]) -> bytes | None:
        return unpack(p, v, self._chunks)

    def _batch_get(
        self, keys: Sequence[tuple[str, str]], what: str
    ) -> dict[tuple[str, str], dict[str, Any]]:
        """The items at ``keys`` that exist, strongly consistent, 100 keys a request."""
        out: dict[tuple[str, str], dict[str, Any]] = {}
        unique = list(dict.fromkeys(keys))
        for i in range(0, len(unique), 100):
            request: dict[str, Any] = {
                self._table: {
                    "Keys": [{"p": s(p), "s": s(k)} for p, k in unique[i : i + 100]],
                    "ConsistentRead": True,
                }
            }
            for _ in range(50):
                try:
                    resp = self._client.batch_get_item(RequestItems=request)
                except Exception as exc:
                    raise map_error(exc, what, self._table) from exc
                for item in resp.get("Responses", {}).get(self._table, ()):
                    out[(item["p"]["S"], item["s"]["S"])] = item
                request = resp.get("UnprocessedKeys") or {}
                if not request:
                    break
            else:
                raise BackendUnavailableError(
                    f"DynamoDB kept leaving keys unprocessed while {what}"
                )
        return out

    def _batch_write(
        self, puts: Sequence[dict[str, Any]], deletes: Sequence[tuple[str, str]], what: str
    ) -> None:
        """Unconditional puts and deletes, 25 a request (not atomic: for chunks and cleanup)."""
        requests = [{"PutRequest": {"Item": item}} for item in puts]
        requests += [{"DeleteRequest": {"Key": {"p": s(p), "s": s(k)}}} for p, k in deletes]
        for i in range(0, len(requests), 25):
            pending: dict[str, Any] = {self._table: requests[i : i + 25]}
            for _ in range(50):
                try:
                    resp = self._client.batch_write_item(RequestItems=pending)
                except Exception as exc:
                    raise map_error(exc, what, self._table) from exc
                pending = resp.get("UnprocessedItems") or {}
                if not pending:
                    break
            else:
                raise BackendUnavailableError(
                    f"DynamoDB kept leaving writes unprocessed while {what}"
                )

    def _transact(self, actions: Sequence[dict[str, Any]], what: str) -> None:
        """One ``TransactWriteItems``; a cancellation for a failed condition is raised as the
        botocore error (the caller reads its reasons), every other failure is mapped."""
        try:
            self._client.transact_write_items(TransactItems=list(actions))
        except Exception as exc:
            if is_code(exc, "TransactionCanceledException") and any(
                r.get("Code") == "ConditionalCheckFailed" for r in reasons(exc)
            ):
                raise
            raise map_error(exc, what, self._table) from exc
