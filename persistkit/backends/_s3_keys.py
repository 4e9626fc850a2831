"""The S3 store's key encoding, record format and error mapping, shared by ``s3.py``
and its leases (``_s3_leases.py``), which import this module and not each other."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from .._errors import BackendError, BackendUnavailableError, ConfigurationError
from ._protocol import CheckpointRow

_STD = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_SORTED = "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"
_TO_SORTED = str.maketrans(_STD, _SORTED)
_FROM_SORTED = str.maketrans(_SORTED, _STD)
_MAX_ID_BYTES = 240  # a multiple of 3, so the truncated part encodes to whole characters
_MAX_SEG = 96  # longer namespace/checkpoint/run segments are replaced by a hash
_ROW_MAGIC = b"PKS3ROW1\n"
# a lost condition, a concurrent conditional write (AWS), or the head deleted meanwhile
_CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey"}
_TRANSIENT_CODES = {
    "SlowDown", "RequestTimeout", "RequestTimeTooSkewed", "ServiceUnavailable",
    "InternalError", "Throttling", "ThrottlingException", "RequestLimitExceeded",
}  # fmt: skip


# -- key encoding ---------------------------------------------------------------


def _b64(data: bytes) -> str:
    """Order-preserving, key-safe base64 (no padding)."""
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=").translate(_TO_SORTED)


def _unb64(text: str) -> bytes:
    std = text.translate(_FROM_SORTED)
    return base64.urlsafe_b64decode(std + "=" * (-len(std) % 4))


def _utf8(text: str) -> bytes:
    # surrogatepass: Python str may hold lone surrogates; their bytes still sort by code point
    return text.encode("utf-8", "surrogatepass")


def _digest(text: str) -> str:
    return "." + _b64(hashlib.sha256(_utf8(text)).digest())


def _thread_seg(thread_id: str) -> str:
    raw = _utf8(thread_id)
    if len(raw) <= _MAX_ID_BYTES:
        return _b64(raw)
    return _b64(raw[:_MAX_ID_BYTES]) + _digest(thread_id)


def _seg(text: str, tag: str) -> str:
    """A key segment for namespace/checkpoint/run ids; ``tag`` keeps kinds apart."""
    enc = tag + _b64(_utf8(text))
    return enc if len(enc) <= _MAX_SEG else _digest(text)


def _run_seg(run_id: str | None) -> str:
    return "*" if run_id is None else _seg(run_id, "r")


def _prefix_seg(prefix: str) -> str:
    """The key prefix shared by every thread id starting with ``prefix``."""
    raw = _utf8(prefix)
    if len(raw) > _MAX_ID_BYTES:
        return _b64(raw[:_MAX_ID_BYTES]) + "."
    # only the characters fully determined by the prefix's bits
    return _b64(raw)[: len(raw) * 8 // 6]


# -- records --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _HeadState:
    version: int  # 0: a placeholder (see below), which every reader takes for "no thread"
    checkpoint_id: str
    token: str
    row_key: str
    etag: str
    fence: int = 0  # the lease token the head was sealed with (persistkit.coordination)

    @property
    def placeholder(self) -> bool:
        return self.version == 0


# A placeholder head, ``{"v": 0, "f": <lease token>}``, is what a new lease holder seals
# when the thread has no head yet (``_s3_leases``): it exists only so that the old
# holder's ``If-None-Match: *`` head creation fails. Its body is at most 64 bytes and a
# real head's is over 100 (two 16-hex tokens, a row key, the ids), so a listing tells
# them apart by ``Size`` without reading each head (``threads``, ``namespaces``).
_PLACEHOLDER_MAX_BYTES = 64


def _placeholder_body(fence: int) -> bytes:
    body = json.dumps({"v": 0, "f": fence}).encode("ascii")
    if len(body) > _PLACEHOLDER_MAX_BYTES:  # a token of 50 digits: nothing issues those
        raise BackendError(f"S3 store: lease token {fence} is too large to seal a head with")
    return body


def _decode_head(data: bytes, etag: str) -> _HeadState:
    h = json.loads(data)
    if int(h["v"]) == 0:
        return _HeadState(0, "", "0", "", etag, int(h["f"]))
    return _HeadState(int(h["v"]), str(h["c"]), str(h["t"]), str(h["k"]), etag, int(h.get("f", 0)))


@dataclass(frozen=True, slots=True)
class _RowRef:
    key: str
    checkpoint_id: str | None  # None when the key holds only a hash of it
    run_seg: str
    token: str
    prev: str
    pruned: bool = False  # an empty object: a row pruned above a kept one (``_s3_prune``)
    etag: str = ""


def _encode_row(row: CheckpointRow, blob_keys: Iterable[str]) -> bytes:
    header = {
        "thread": row.thread_id,
        "ns": row.namespace,
        "id": row.checkpoint_id,
        "parent": row.parent_id,
        "run": row.run_id,
        "blobs": sorted(blob_keys),
    }
    return _ROW_MAGIC + json.dumps(header).encode("ascii") + b"\n" + row.payload


def _decode_row(data: bytes) -> tuple[CheckpointRow, list[str]]:
    if not data.startswith(_ROW_MAGIC):
        raise BackendError("an S3 checkpoint object has an unknown format")
    header_end = data.index(b"\n", len(_ROW_MAGIC))
    h = json.loads(data[len(_ROW_MAGIC) : header_end])
    row = CheckpointRow(
        h["thread"], h["ns"], h["id"], h["parent"], h["run"], data[header_end + 1 :]
    )
    return row, list(h["blobs"])


def _with_payload(stored: bytes, payload: bytes) -> bytes:
    """A stored row object with its payload replaced (header: ids, links, blob list kept)."""
    return stored[: stored.index(b"\n", len(_ROW_MAGIC)) + 1] + payload


def _replace(stored: bytes, new: bytes) -> bytes:
    return new


# -- error mapping ----------------------------------------------------------------


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _status(exc: BaseException) -> int:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return 0


# Errors that retrying cannot fix, and what to fix instead.
_FIXES = {
    "NoSuchBucket": "The bucket does not exist: check the bucket name in the store URL "
    "(s3://BUCKET/prefix) and its endpoint_url/region, or create the bucket",
    "InvalidAccessKeyId": "Check the AWS credentials (AWS_ACCESS_KEY_ID / profile) this process uses",
    "SignatureDoesNotMatch": "Check the AWS secret key this process uses",
    "AccessDenied": "The credentials may not use this bucket and prefix: check the IAM policy",
}


def _map_error(exc: Exception, what: str) -> BackendError | ConfigurationError:
    """The persistkit error for a botocore failure while doing ``what``: a bucket that does
    not exist is a wrong URL (``ConfigurationError``), as a missing PostgreSQL database is."""
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

    if isinstance(exc, ConnectionError | HTTPClientError):
        return BackendUnavailableError(f"S3 unreachable while {what}: {exc}")
    if isinstance(exc, ClientError):
        code = _error_code(exc)
        if _status(exc) >= 500 or code in _TRANSIENT_CODES:
            return BackendUnavailableError(f"S3 is unavailable ({code}) while {what}: {exc}")
        fix = _FIXES.get(code, "")
        if code == "NoSuchBucket":
            return ConfigurationError(f"S3 failed ({code}) while {what}: {exc}. {fix}")
        return BackendError(f"S3 failed ({code}) while {what}: {exc}" + (f". {fix}" if fix else ""))
    return BackendError(f"S3 failed while {what}: {exc}")


def _is_client_error(exc: Exception, codes: set[str]) -> bool:
    from botocore.exceptions import ClientError

    return isinstance(exc, ClientError) and _error_code(exc) in codes
