"""Encryption at rest: a Backend wrapper that seals every row payload and blob.

``pk.connect(url, encryption=...)`` wraps the store in :class:`EncryptedBackend`
(after the blob offload wrapper, so offloaded objects are sealed too). Each
record is sealed with AES-256-GCM under the key ring's active key::

    0xE1 | key id length (1 byte) | key id (ASCII) | nonce (12 random bytes) | ciphertext + 16-byte tag

The associated data binds a record to its place: a row to its thread,
namespace, checkpoint id, parent id and run id; a blob to its thread and key.
A valid ciphertext copied to another thread, namespace, checkpoint or blob key
therefore fails to authenticate. Any failure (altered bytes, a moved record, a
wrong key, a key id the ring does not have) is an ``IntegrityError`` naming the
thread and checkpoint or blob key; a wrong value is never returned.

What stays visible to whoever can read the store: thread ids, namespaces,
checkpoint ids (they carry the write time), parent and run ids, blob keys
(content hashes of already redacted values: equal values in one thread share a
key), the head versions, record sizes (plus 30 bytes or so each) and timing.

Records that do not start with ``0xE1`` are plaintext. They are refused
(downgrade protection: someone who can write the store must not be able to
swap a sealed record for a forged plaintext one) unless the store is being
migrated, with ``accept_plaintext=True``; ``store.rotate_keys(...,
encrypt_plaintext=True)`` seals them in place. The codec's own envelopes start
with ``0x01``/``0x02``, so a persistkit record is never mistaken for either.

kv values (the shared space) are sealed the same way, each value (never a
delete: a tombstone carries no bytes) with associated data binding its scope,
key and version (``op.expected + 1``): a value copied to another key, version or
scope fails to open (``IntegrityError`` naming scope, key and version). Scopes,
keys, versions, value sizes and deletes stay visible; a delete or a removed
version written past this wrapper is not detected (``integrity=`` tags deletes).
``accept_plaintext=True`` reads unsealed values as they are, as for records.
A store-wide key rotation re-seals the blobs of the store's reserved headless
threads too (:data:`STORE_THREADS`: the handle key of detected secrets), which
``threads()`` does not list. Key rotation does NOT re-seal kv values: the protocol has no in-place rewrite
for them (a ``kv_write`` would make a new version and race the board's writers).
A value is re-sealed under the active key when it is next written; keep a
retired key in the ring while kv values sealed with it are kept (``keep``
versions of each key), or write those keys again before retiring it.

Nonces are 96 random bits: stay well under 2**32 records per key, i.e. rotate
(new active key) at least every few hundred million checkpoints.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from .._errors import (
    BackendNotFoundError,
    ConfigurationError,
    IntegrityError,
    damaged_record_advice,
)
from ..backends._protocol import (
    RESERVED_THREAD,
    Backend,
    CheckpointRow,
    ForwardLeases,
    Head,
    KvEntry,
    KvOp,
)
from ..backends._prune import ForwardPrune
from ._keys import KeyRing
from ._kv import ValueKv, kv_where
from ._options import ENCRYPTED, MARKER, offloaded

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from .._io import Plan

__all__ = ["MAGIC", "STORE_THREADS", "EncryptedBackend", "RotationReport", "find_encrypted"]

MAGIC = ENCRYPTED
_MAGIC = bytes([MAGIC])
_NONCE = 12
_BLOB_STOP = "\x7f"  # above every printable-ASCII blob key

#: Headless threads (``threads()`` never lists them) whose blobs this wrapper seals: the
#: store's handle key (``secrets._handlekey.HANDLE_THREAD``). A store-wide rotation re-seals them.
STORE_THREADS = (RESERVED_THREAD,)

_MIGRATE_HINT = (
    "If this store is being migrated from plaintext, open it with "
    "pk.connect(url, encryption=..., accept_plaintext=True) and run "
    "store.rotate_keys(encrypt_plaintext=True) (CLI: python -m persistkit rotate-keys URL "
    "--encrypt-plaintext); otherwise treat the record as forged."
)


def _aesgcm() -> type[AESGCM]:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:
        raise BackendNotFoundError(
            "encryption at rest needs the 'cryptography' package, which is not installed: "
            "pip install 'persistkit[crypto]'"
        ) from exc
    return AESGCM


def _field(value: str | None) -> bytes:
    if value is None:
        return b"\xff\xff\xff\xff"
    raw = value.encode("utf-8", "surrogatepass")
    return len(raw).to_bytes(4, "big") + raw


def row_aad(
    thread_id: str, namespace: str, checkpoint_id: str, parent_id: str | None, run_id: str | None
) -> bytes:
    """Associated data of a row: its thread, namespace, id, parent and run."""
    return b"pk-row\x00" + b"".join(
        map(_field, (thread_id, namespace, checkpoint_id, parent_id, run_id))
    )


def blob_aad(thread_id: str, key: str) -> bytes:
    """Associated data of a blob: its thread and key."""
    return b"pk-blob\x00" + _field(thread_id) + _field(key)


def kv_aad(scope: str, key: str, version: int) -> bytes:
    """Associated data of a kv value: its scope, key and version."""
    return b"pk-kv\x00" + _field(scope) + _field(key) + version.to_bytes(8, "big")


def key_id_of(data: bytes) -> str | None:
    """The key id a record is sealed with, or None for a plaintext (or unreadable) record."""
    if len(data) < 2 or data[0] != MAGIC:
        return None
    n = data[1]
    try:
        return data[2 : 2 + n].decode("ascii")
    except UnicodeDecodeError:
        return None


@dataclass
class RotationReport:
    """What :meth:`persistkit.Store.rotate_keys` did. Continue an interrupted
    store-wide rotation with ``after=report.last_thread``."""

    active_key: str
    threads: int = 0
    rows_resealed: int = 0
    blobs_resealed: int = 0
    rows_skipped: int = 0
    blobs_skipped: int = 0
    plaintext_sealed: int = 0
    last_thread: str | None = None

    def __str__(self) -> str:
        return (
            f"active key {self.active_key}: {self.threads} thread(s), resealed "
            f"{self.rows_resealed} row(s) and {self.blobs_resealed} blob(s) "
            f"({self.plaintext_sealed} of them plaintext), {self.rows_skipped} row(s) and "
            f"{self.blobs_skipped} blob(s) already under the active key; last thread "
            f"{self.last_thread!r}"
        )


class EncryptedBackend(ForwardLeases, ForwardPrune, ValueKv, Backend):
    """``inner`` with every row payload and blob sealed by AES-256-GCM under ``keyring``.

    Heads, ids and blob keys pass through in plaintext (see the module docs).
    ``accept_plaintext=True`` reads unsealed records as they are (for a store
    being migrated); new records are always sealed.
    """

    #: Read by ``_handlekey``: blobs written through this wrapper are encrypted at rest.
    encrypts_at_rest = True

    def __init__(self, inner: Backend, keyring: KeyRing, *, accept_plaintext: bool = False) -> None:
        if not isinstance(inner, Backend):
            raise ConfigurationError(
                f"EncryptedBackend wraps a persistkit Backend, got {type(inner).__name__}"
            )
        if not isinstance(keyring, KeyRing) or keyring.purpose != "encryption":
            raise ConfigurationError(
                "EncryptedBackend needs a KeyRing made for purpose='encryption'"
            )
        self._aesgcm = _aesgcm()
        self.inner = inner
        self.keyring = keyring
        self.accept_plaintext = bool(accept_plaintext)
        self._ciphers: dict[str, AESGCM] = {}
        # The wrapper is as native (and as atomic) as what it wraps.
        setattr(self, "native_async", inner.native_async)  # noqa: B010
        setattr(self, "atomic_blobs", inner.atomic_blobs)  # noqa: B010
        self.url = f"{inner.url} (encrypted)"

    schemes: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> EncryptedBackend:
        """Not opened from a URL: use ``pk.connect(url, encryption=...)``."""
        raise ConfigurationError(
            "EncryptedBackend wraps a store; open it with pk.connect('<url>', encryption=True) "
            "or EncryptedBackend(backend, pk.KeyRing(...))"
        )

    def __repr__(self) -> str:  # the key ring's repr shows ids only
        return f"<EncryptedBackend {self.inner.url} keys={self.keyring!r}>"

    # -- sealing (no I/O) --------------------------------------------------------

    def _cipher(self, key_id: str) -> AESGCM:
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            cipher = self._ciphers[key_id] = self._aesgcm(self.keyring.key(key_id))
        return cipher

    def _seal(self, plaintext: bytes, aad: bytes) -> bytes:
        kid = self.keyring.active_id
        header = _MAGIC + bytes([len(kid)]) + kid.encode("ascii")
        nonce = os.urandom(_NONCE)
        return header + nonce + self._cipher(kid).encrypt(nonce, bytes(plaintext), header + aad)

    def _open(self, data: bytes, aad: bytes, where: str, *, plaintext_ok: bool, damaged: str = "") -> bytes:
        """``data`` decrypted; ``damaged``: the ways forward when it was altered."""
        if data[: len(MARKER)] == MARKER:  # offload sits below: the store was opened without blobs=
            raise offloaded(where, "encryption=")
        if not data or data[0] != MAGIC:
            if plaintext_ok:
                return bytes(data)
            raise IntegrityError(
                f"{where} is not encrypted, but this store is opened with encryption: "
                f"plaintext records are refused. {_MIGRATE_HINT}"
            )
        kid = key_id_of(data)
        end = 2 + (data[1] if len(data) > 1 else 0)
        if kid is None or len(data) < end + _NONCE + 16:
            raise IntegrityError(
                f"{where}: the encrypted record is malformed (truncated or altered){damaged}"
            )
        if not self.keyring.has(kid):
            missing = IntegrityError(
                f"{where} is sealed with encryption key id {kid!r}, which is not in the key ring "
                f"{list(self.keyring.ids)}: add that key (was it retired before rotate_keys finished?)"
            )
            missing.missing_key_id = kid  # type: ignore[attr-defined]  # read by secrets._handlekey
            raise missing
        from cryptography.exceptions import InvalidTag

        try:
            return self._cipher(kid).decrypt(
                data[end : end + _NONCE], data[end + _NONCE :], data[:end] + aad
            )
        except InvalidTag:
            raise IntegrityError(
                f"{where} failed authentication under encryption key {kid!r}: the record was "
                "altered, moved from another thread, namespace, checkpoint, key or version, or the key "
                f"with that id is not the one it was sealed with{damaged}"
            ) from None

    @staticmethod
    def _row_where(row: CheckpointRow) -> str:
        ns = f" (namespace {row.namespace!r})" if row.namespace else ""
        return f"thread {row.thread_id!r}{ns} checkpoint {row.checkpoint_id!r}"

    def seal_row(self, row: CheckpointRow) -> CheckpointRow:
        aad = row_aad(row.thread_id, row.namespace, row.checkpoint_id, row.parent_id, row.run_id)
        return replace(row, payload=self._seal(row.payload, aad))

    def open_row(self, row: CheckpointRow, *, plaintext_ok: bool | None = None) -> CheckpointRow:
        aad = row_aad(row.thread_id, row.namespace, row.checkpoint_id, row.parent_id, row.run_id)
        ok = self.accept_plaintext if plaintext_ok is None else plaintext_ok
        # integrity, when on, sits above this wrapper and checked the record first
        advice = damaged_record_advice(row.thread_id, row.namespace, row.parent_id, None, integrity=False)
        return replace(
            row, payload=self._open(row.payload, aad, self._row_where(row), plaintext_ok=ok, damaged=". " + advice)
        )

    def seal_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> dict[str, bytes]:
        return {k: self._seal(v, blob_aad(thread_id, k)) for k, v in blobs.items()}

    def open_blob(
        self, thread_id: str, key: str, data: bytes, *, plaintext_ok: bool | None = None
    ) -> bytes:
        ok = self.accept_plaintext if plaintext_ok is None else plaintext_ok
        return self._open(
            data, blob_aad(thread_id, key), f"thread {thread_id!r} blob {key!r}", plaintext_ok=ok
        )

    def _open_blobs(self, thread_id: str, found: Mapping[str, bytes]) -> dict[str, bytes]:
        return {k: self.open_blob(thread_id, k, v) for k, v in found.items()}

    def _open_row_or_none(self, row: CheckpointRow | None) -> CheckpointRow | None:
        return None if row is None else self.open_row(row)

    # -- kv values: sealed on the way down, opened on the way up (ValueKv drives) -----------

    def _kv_seal(self, scope: str, ops: Sequence[KvOp]) -> builtins.list[KvOp]:
        return [
            op if op.value is None else KvOp(op.key, op.expected, self._seal(op.value, kv_aad(scope, op.key, op.expected + 1)))
            for op in ops
        ]

    def _kv_open(self, scope: str, entries: Sequence[KvEntry]) -> builtins.list[KvEntry]:
        return [
            e if e.value is None else KvEntry(e.key, e.version, self._open(
                e.value, kv_aad(scope, e.key, e.version), kv_where(scope, e.key, e.version),
                plaintext_ok=self.accept_plaintext,
            ))
            for e in entries
        ]

    # -- the protocol, sync ------------------------------------------------------------

    def write(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int) -> Head:
        return self.inner.write(
            self.seal_row(row), self.seal_blobs(row.thread_id, blobs), expected_version
        )

    def put_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        self.inner.put_blobs(thread_id, self.seal_blobs(thread_id, blobs))

    def head(self, thread_id: str, namespace: str) -> Head | None:
        return self.inner.head(thread_id, namespace)

    def get(self, thread_id: str, namespace: str, checkpoint_id: str) -> CheckpointRow | None:
        return self._open_row_or_none(self.inner.get(thread_id, namespace, checkpoint_id))

    def list(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[CheckpointRow]:
        rows = self.inner.list(thread_id, namespace, run_id=run_id, before=before, limit=limit)
        return [self.open_row(r) for r in rows]

    def get_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        return self._open_blobs(thread_id, self.inner.get_blobs(thread_id, keys))

    def scan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        return self._open_blobs(thread_id, self.inner.scan_blobs(thread_id, start, stop))

    def threads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        return self.inner.threads(prefix=prefix, after=after, limit=limit)

    def namespaces(self, thread_id: str) -> builtins.list[str]:
        return self.inner.namespaces(thread_id)

    def rewrite(
        self, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]
    ) -> None:
        """Seal plaintext ``rows``/``blobs`` and rewrite them (rotation uses the inner store directly).

        A row is sealed for the parent and run id STORED with it (rewrite keeps
        those), so each row is read first; rows that do not exist are skipped."""
        stored = [self.inner.get(thread_id, r.namespace, r.checkpoint_id) for r in rows]
        sealed = self._seal_as_stored(rows, stored)
        self.inner.rewrite(thread_id, sealed, self.seal_blobs(thread_id, blobs))

    def _seal_as_stored(
        self, rows: Sequence[CheckpointRow], stored: Sequence[CheckpointRow | None]
    ) -> builtins.list[CheckpointRow]:
        return [
            self.seal_row(replace(old, payload=new.payload))
            for new, old in zip(rows, stored, strict=True)
            if old is not None
        ]

    def delete_thread(self, thread_id: str) -> bool:
        return self.inner.delete_thread(thread_id)

    def close(self) -> None:
        self.inner.close()

    # -- the protocol, async: the inner store's own twins; crypto is CPU-only and fast ------

    async def awrite(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int
    ) -> Head:
        sealed = self.seal_blobs(row.thread_id, blobs)
        return await self.inner.awrite(self.seal_row(row), sealed, expected_version)

    async def aput_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        await self.inner.aput_blobs(thread_id, self.seal_blobs(thread_id, blobs))

    def write_fenced(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int) -> Head:
        sealed = self.seal_blobs(row.thread_id, blobs)
        return self.inner.write_fenced(self.seal_row(row), sealed, expected_version, fence)

    async def awrite_fenced(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int) -> Head:
        sealed = self.seal_blobs(row.thread_id, blobs)
        return await self.inner.awrite_fenced(self.seal_row(row), sealed, expected_version, fence)

    async def ahead(self, thread_id: str, namespace: str) -> Head | None:
        return await self.inner.ahead(thread_id, namespace)

    async def aget(
        self, thread_id: str, namespace: str, checkpoint_id: str
    ) -> CheckpointRow | None:
        return self._open_row_or_none(await self.inner.aget(thread_id, namespace, checkpoint_id))

    async def alist(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[CheckpointRow]:
        rows = await self.inner.alist(
            thread_id, namespace, run_id=run_id, before=before, limit=limit
        )
        return [self.open_row(r) for r in rows]

    async def aget_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        return self._open_blobs(thread_id, await self.inner.aget_blobs(thread_id, keys))

    async def ascan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        return self._open_blobs(thread_id, await self.inner.ascan_blobs(thread_id, start, stop))

    async def athreads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        return await self.inner.athreads(prefix=prefix, after=after, limit=limit)

    async def anamespaces(self, thread_id: str) -> builtins.list[str]:
        return await self.inner.anamespaces(thread_id)

    async def arewrite(
        self, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]
    ) -> None:
        stored = [await self.inner.aget(thread_id, r.namespace, r.checkpoint_id) for r in rows]
        sealed = self._seal_as_stored(rows, stored)
        await self.inner.arewrite(thread_id, sealed, self.seal_blobs(thread_id, blobs))

    async def adelete_thread(self, thread_id: str) -> bool:
        return await self.inner.adelete_thread(thread_id)

    async def aclose(self) -> None:
        await self.inner.aclose()

    # -- rotation: one plan, run against the INNER store by run_sync / run_async ---------

    def _reseal(
        self, data: bytes, aad: bytes, where: str, encrypt_plaintext: bool
    ) -> tuple[bytes | None, bool]:
        """(new bytes or None when already under the active key, was it plaintext)."""
        kid = key_id_of(data)
        if kid == self.keyring.active_id:
            return None, False
        if data[: len(MARKER)] == MARKER:  # sealing offload's pointer would lose the record
            raise offloaded(where, "encryption=")
        if kid is None and data[:1] != _MAGIC:
            if not encrypt_plaintext:
                raise IntegrityError(
                    f"{where} is not encrypted; rotate_keys refuses to seal plaintext unless asked "
                    "to: pass encrypt_plaintext=True (CLI: --encrypt-plaintext) when migrating a "
                    "plaintext store, otherwise treat the record as forged"
                )
            return self._seal(data, aad), True
        return self._seal(self._open(data, aad, where, plaintext_ok=False), aad), False

    def rotation_plan(
        self,
        thread_id: str | None,
        *,
        batch_size: int = 100,
        after: str | None = None,
        encrypt_plaintext: bool = False,
    ) -> Plan[RotationReport]:
        """Re-seal, under the active key, every record of one thread (or of every thread
        after ``after``) that is sealed with another key; one ``rewrite`` per batch.
        A store-wide run (``thread_id`` None, whatever ``after``) first re-seals the blobs
        of the store's reserved threads (:data:`STORE_THREADS`: the handle key of detected
        secrets), counted in ``blobs_resealed``/``blobs_skipped`` but not in ``threads``.
        kv values are not re-sealed (module docs: keep their key in the ring)."""
        from .._io import call

        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ConfigurationError(f"batch_size must be a positive int, got {batch_size!r}")
        report = RotationReport(self.keyring.active_id)
        if thread_id is None:  # the store's own blobs: a headless thread threads() never lists
            for reserved in STORE_THREADS:
                yield from self._rotate_blobs(reserved, batch_size, encrypt_plaintext, report)
        cursor = after
        while True:
            if thread_id is not None:
                todo = [thread_id]
            else:
                todo = yield call("threads", after=cursor, limit=batch_size)
            for t in todo:
                yield from self._rotate_thread(t, batch_size, encrypt_plaintext, report)
                report.threads += 1
                report.last_thread = cursor = t
            if thread_id is not None or len(todo) < batch_size:
                return report

    def _rotate_thread(
        self, t: str, batch_size: int, encrypt_plaintext: bool, report: RotationReport
    ) -> Plan[None]:
        from .._io import call

        namespaces = yield call("namespaces", t)
        for ns in namespaces:
            before: str | None = None
            while True:
                page: builtins.list[CheckpointRow] = yield call(
                    "list", t, ns, before=before, limit=batch_size
                )
                batch: builtins.list[CheckpointRow] = []
                for row in page:
                    aad = row_aad(t, ns, row.checkpoint_id, row.parent_id, row.run_id)
                    new, was_plain = self._reseal(
                        row.payload, aad, self._row_where(row), encrypt_plaintext
                    )
                    if new is None:
                        report.rows_skipped += 1
                    else:
                        batch.append(replace(row, payload=new))
                        report.plaintext_sealed += was_plain
                if batch:
                    yield call("rewrite", t, batch, {})
                    report.rows_resealed += len(batch)
                if len(page) < batch_size:
                    break
                before = page[-1].checkpoint_id
        yield from self._rotate_blobs(t, batch_size, encrypt_plaintext, report)

    def _rotate_blobs(
        self, t: str, batch_size: int, encrypt_plaintext: bool, report: RotationReport
    ) -> Plan[None]:
        from .._io import call

        blobs: dict[str, bytes] = yield call("scan_blobs", t, "", _BLOB_STOP)
        pending: dict[str, bytes] = {}
        for key, data in blobs.items():
            new, was_plain = self._reseal(
                data, blob_aad(t, key), f"thread {t!r} blob {key!r}", encrypt_plaintext
            )
            if new is None:
                report.blobs_skipped += 1
                continue
            pending[key] = new
            report.plaintext_sealed += was_plain
            if len(pending) >= batch_size:
                yield call("rewrite", t, [], pending)
                report.blobs_resealed += len(pending)
                pending = {}
        if pending:
            yield call("rewrite", t, [], pending)
            report.blobs_resealed += len(pending)


def find_encrypted(backend: Backend) -> EncryptedBackend | None:
    """The EncryptedBackend in a stack of wrappers (each exposing ``.inner``), if any."""
    seen = 0
    current: Any = backend
    while current is not None and seen < 16:
        if isinstance(current, EncryptedBackend):
            return current
        current = getattr(current, "inner", None)
        seen += 1
    return None
