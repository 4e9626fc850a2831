"""The store's handle key: what names detected secrets' handles the same way in every process.

A handle's tag is a keyed hash of the secret (``$CRED{openai-<tag>}``). With a
per-process key the same key got a different handle in each process, and a
handle written by a crashed process could never be matched to the value
registered in the next one. The key therefore lives in the store: 32 random
bytes in a blob of a reserved thread (``HANDLE_THREAD``, blob ``HANDLE_BLOB``),
created by the first process that needs it. Blob writes keep existing bytes
(every backend's ``put_blobs`` is first-writer-wins: ``INSERT … ON CONFLICT DO
NOTHING``, ``HSETNX``, S3 ``If-None-Match``), so racing processes read back one
key. The reserved thread has no head, so ``threads()`` never lists it.

It goes through the store's wrappers like any blob: sealed with AES-256-GCM
when the store is encrypted, tagged when integrity is on, kept in the primary
store with ``blobs=`` (it is far below any offload threshold). A store-wide key
rotation re-seals it (``wrappers._encryption.STORE_THREADS``); with the sealing
key retired, a handle it named that nothing else resolves is an ``IntegrityError``
naming that key id (:func:`retired_key_error`).

Who can read it: whoever reads the store, unless the store is encrypted. A
keyed hash is only as secret as its key, so :func:`store_key` also says
whether the key is *protected* (encrypted at rest); the redactor uses an
unprotected key only for secrets that cannot be guessed (machine-made tokens),
see ``Redactor._key_for``.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import TYPE_CHECKING

from .._errors import IntegrityError, PersistkitError
from ..backends._protocol import RESERVED_THREAD

if TYPE_CHECKING:
    from ..backends import Backend

__all__ = ["HANDLE_BLOB", "HANDLE_THREAD", "retired_key_error", "store_key"]

HANDLE_THREAD = RESERVED_THREAD
HANDLE_BLOB = "k:handle-key"
_MAGIC = b"pk-handle-key\x01"
_log = logging.getLogger("persistkit")
_lock = threading.Lock()
_cache: weakref.WeakKeyDictionary[Backend, tuple[bytes, bool] | None] = weakref.WeakKeyDictionary()
_retired: weakref.WeakKeyDictionary[Backend, IntegrityError] = weakref.WeakKeyDictionary()


def _protected(backend: Backend) -> bool:
    """Whether blobs of ``backend`` are encrypted at rest (a wrapper in the stack that
    declares ``encrypts_at_rest``, as ``wrappers._encryption.EncryptedBackend`` does)."""
    seen = 0
    node: object = backend
    while node is not None and seen < 16:
        if getattr(type(node), "encrypts_at_rest", False) is True:
            return True
        node = getattr(node, "inner", None) or getattr(node, "_inner", None) or getattr(node, "primary", None)
        seen += 1
    return False


def _read(backend: Backend) -> bytes | None:
    raw = backend.get_blobs(HANDLE_THREAD, [HANDLE_BLOB]).get(HANDLE_BLOB)
    if raw is None:
        return None
    raw = bytes(raw)
    if not raw.startswith(_MAGIC) or len(raw) != len(_MAGIC) + 32:
        raise PersistkitError(f"the store's handle key (thread {HANDLE_THREAD!r}, blob {HANDLE_BLOB!r}) is malformed")
    return raw[len(_MAGIC) :]


def store_key(backend: Backend) -> tuple[bytes, bool] | None:
    """``(key, protected)`` of the store behind ``backend``, created on first use; None
    when the store cannot give one (a failure is logged, and the caller falls back to a
    per-process key: handles of this process are then not the same in others).

    A key sealed with an encryption key id that is not in the ring is also remembered
    (:func:`retired_key_error`): a handle it named and nothing else resolves is then an
    ``IntegrityError`` naming that key id, not a ``SecretResolutionError``."""
    with _lock:
        if backend in _cache:
            return _cache[backend]
        try:
            key = _read(backend)
            if key is None:
                backend.put_blobs(HANDLE_THREAD, {HANDLE_BLOB: _MAGIC + os.urandom(32)})
                key = _read(backend)
            if key is None:
                raise PersistkitError("the handle key just written could not be read back")
            found: tuple[bytes, bool] | None = (key, _protected(backend))
        except IntegrityError as exc:
            if getattr(exc, "missing_key_id", None) is not None:  # sealed with a retired key
                _retired[backend] = IntegrityError(
                    f"the store's handle key, which names the handles of detected secrets, cannot be "
                    f"read: {exc}. With that key back in the ring, a store-wide rotate_keys (CLI "
                    "rotate-keys without --thread) re-seals it under the active key"
                )
            _fallback(exc)
            found = None
        except Exception as exc:  # a store that cannot keep it must not fail the step
            _fallback(exc)
            found = None
        _cache[backend] = found
        return found


def retired_key_error(backend: Backend, name: str) -> IntegrityError | None:
    """Why detected secret ``name`` (``<kind>-<tag>``) may not resolve: the store's handle key
    is sealed with an encryption key id that is not in the ring (else None). Raised where the
    handle would be a ``SecretResolutionError``, which would hide the cause; loading and
    naming new handles go on (a logged per-process key), as for any unreadable handle key."""
    kind, _, tag = name.rpartition("-")
    return _retired.get(backend) if kind and len(tag) == 16 and ":" not in name else None


def _fallback(exc: Exception) -> None:
    """Log why the store's handle key is not used (the caller uses a per-process key)."""
    _log.warning(
        "persistkit: could not read or create the store's handle key (%s: %s); handles of "
        "detected secrets in this process use a per-process key and will differ in other "
        "processes. Configure a vault (pk.secrets.configure(vault=...)) to fix the key.",
        type(exc).__name__,
        exc,
    )
