"""Tamper evidence on the read path: a keyed hash chain per thread, checked on every read.

``pk.connect(url, integrity=True, witness="file:...")`` wraps the store in
:class:`IntegrityBackend` (the OUTERMOST wrapper: an encryption wrapper sits
inside it, so the tags cover plaintext and re-encryption never re-chains).

Record format
-------------
Every checkpoint row payload gets a header in front of the codec's bytes::

    0xA1 | 0x01 | len(kid) | kid | seq u64 | flags | [prev_tag 32] | [u16 len | prev_cid] | tag 32 | payload

``seq`` is the head version this write created (``expected_version + 1``),
so the head row always has ``seq == head.version``. ``prev_tag`` is the tag
of the row at ``seq - 1`` (absent, flag bit 0 clear, exactly when
``seq == 1``); ``prev_cid`` is that row's checkpoint id, stored only when it
differs from ``parent_id`` (flag bit 1). ``tag`` is keyed BLAKE2b-256
(personalised ``pk-int-row-v1``) over a length-prefixed encoding of key id,
thread id, namespace, checkpoint id, parent id, run id, previous checkpoint
id, seq, previous tag and payload. A row's every column and its place in
the chain are therefore authenticated.

Blobs get ``0xA1 | 0x01 | len(kid) | kid | tag 32 | bytes`` with the tag
(personalised ``pk-int-blob-v1``) over key id, thread id, blob key and
bytes. Blobs are immutable and content-addressed: they have no versions.

What each read checks (and costs)
---------------------------------
``get``        the row's tag (one MAC over the payload; no extra I/O).
``list``       every row's tag and the links between consecutive rows (seq
               steps by one, ``prev_cid``/``prev_tag`` match). One extra row
               is read past ``limit`` so the link across a page boundary is
               checked; a list that reaches the oldest row checks it is #1.
               A gap that retention made is accepted when the prune's sealed
               anchor says so (``_integrity_prune.py``; read only at a gap).
               The first page (no ``before``, no ``run_id``) also reads the
               head: newest row == head row, seq == version, witness.
               ``run_id`` lists check gaps between rows of the run with one
               unfiltered list of the rows in between, and the oldest row's
               predecessor with one ``get``.
``head``       the head plus the newest row (``list(limit=1)``, one extra
               round trip): the head row exists, carries seq == version, no
               row is newer than the head, and the witness has nothing newer.
blob reads     each blob's tag.
``write``      one MAC; the previous head row's tag comes from a per-thread
               cache filled by the last write or head read (else one ``head``
               and one ``get``); then one witness record.

kv values (the shared space)
----------------------------
Each kv value is tagged over (scope, key, version, value), a delete too: it is
stored as a tagged marker, not a bare tombstone (format in ``wrappers/_kv.py``).
A read (``kv_get``, ``kv_history``, ``kv_list``) refuses, with an
``IntegrityError`` naming scope, key and version, a value that was edited, a
value copied to another key, version or scope, and a delete written without the
key (a bare tombstone; ``kv_list`` cannot see one, as the store skips
tombstones, so a listing leaves that key out). The hash chain does not apply to kv: no tag links one
version to the next, so NOT caught are a store that serves an older kept
version as the latest (its newer versions removed), a key or a whole scope
removed, and, after ``kv_drop``, a value of the dropped scope put back at the
same key and version. No witness records kv versions, and ``store.verify()``
walks threads only: the store protocol has no listing of kv scopes.
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import logging
import struct
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any, ClassVar, TypeVar

from .._errors import (
    ConfigurationError,
    ConflictError,
    IntegrityError,
    LeaseLostError,
    StoreOptionsError,
    damaged_record_advice,
)
from ..backends._protocol import Backend, CheckpointRow, ForwardLeases, Head, KvEntry, KvOp
from ..backends._prune import ForwardPrune
from ._integrity_prune import ANCHOR, check_gap, prune_op
from ._keys import KeyRing
from ._kv import UNTAGGED, ValueKv, open_kv_tagged, tag_kv_op
from ._options import ENCRYPTED, MARKER, command_url, offloaded
from ._witness import Witness, WitnessEntry, coerce_witness

__all__ = ["IntegrityBackend", "Sealed", "open_row", "seal_row", "wrap_integrity"]

log = logging.getLogger("persistkit")
T = TypeVar("T")

MAGIC = 0xA1
FORMAT = 1
TAG_SIZE = 32
_ROW_PERSON = b"pk-int-row-v1"
_BLOB_PERSON = b"pk-int-blob-v1"
#: Threads whose newest tag is cached for the next write (a miss costs one head + one get).
_LINK_CACHE = 10_000
_CAUSE = (
    "The store was edited outside persistkit, restored from an older copy, or written without "
    "the integrity key."
)
_FIX = (
    f"{_CAUSE} Restore it from a trusted backup, or fork the thread from a checkpoint "
    "that verifies; `python -m persistkit verify URL` lists every broken record."
)


_U32 = struct.Struct(">I")


def where(thread_id: str, namespace: str, checkpoint_id: str | None = None) -> str:
    text = f"thread {thread_id!r}"
    if namespace:
        text += f" namespace {namespace!r}"
    if checkpoint_id is not None:
        text += f" checkpoint {checkpoint_id}"
    return text


def _s(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    data = value.encode("utf-8", "surrogatepass")  # ids may hold lone surrogates
    return b"\x01" + _U32.pack(len(data)) + data


@dataclass(frozen=True, slots=True)
class Sealed:
    """A row's parsed integrity header (``body`` is the inner payload)."""

    row: CheckpointRow
    kid: str
    seq: int
    prev_cid: str | None
    prev_tag: bytes | None
    tag: bytes
    body: bytes

    def plain(self) -> CheckpointRow:
        r = self.row  # the constructor, not dataclasses.replace: this runs once per row read
        return CheckpointRow(r.thread_id, r.namespace, r.checkpoint_id, r.parent_id, r.run_id, self.body)


def _row_mac(
    key: bytes, kid: str, row: CheckpointRow, seq: int, prev_cid: str | None, prev_tag: bytes | None, body: bytes
) -> bytes:
    h = hashlib.blake2b(key=key, digest_size=TAG_SIZE, person=_ROW_PERSON)
    h.update(
        b"".join(
            (
                _s(kid), _s(row.thread_id), _s(row.namespace), _s(row.checkpoint_id),
                _s(row.parent_id), _s(row.run_id), _s(prev_cid), seq.to_bytes(8, "big"),
                len(prev_tag or b"").to_bytes(1, "big"), prev_tag or b"", len(body).to_bytes(8, "big"),
            )
        )
    )
    h.update(body)
    return h.digest()


def seal_row(
    row: CheckpointRow, kid: str, key: bytes, seq: int, prev_cid: str | None, prev_tag: bytes | None
) -> tuple[bytes, bytes]:
    """(sealed payload, tag) for ``row`` at chain position ``seq``."""
    tag = _row_mac(key, kid, row, seq, prev_cid, prev_tag, row.payload)
    kb = kid.encode("ascii")
    flags = 0
    parts = [bytes((MAGIC, FORMAT, len(kb))), kb, seq.to_bytes(8, "big")]
    extra = b""
    if prev_tag is not None:
        flags |= 1
        extra += prev_tag
    if prev_cid != row.parent_id:
        flags |= 2
        cb = (prev_cid or "").encode("utf-8")
        extra += len(cb).to_bytes(2, "big") + cb
    parts += [bytes((flags,)), extra, tag, row.payload]
    return b"".join(parts), tag


_ENCRYPTED = bytes([ENCRYPTED])


def _encrypted(at: str) -> StoreOptionsError:
    """An encrypted value met where a sealed one belongs: encryption wraps integrity, so
    this store was sealed *and* encrypted, and was opened without its encryption keys."""
    return StoreOptionsError(
        f"{at}: the record is encrypted (envelope 0xe1) and this store was opened with "
        "integrity= only: open it with pk.connect(url, encryption=..., integrity=...), as it was written",
        option="encryption",
    )


def open_row(row: CheckpointRow, ring: KeyRing) -> Sealed:
    """Parse and authenticate a sealed row; ``IntegrityError`` naming it if anything is off."""
    at = where(row.thread_id, row.namespace, row.checkpoint_id)
    p = row.payload
    if p[:1] == _ENCRYPTED:
        raise _encrypted(at)
    if p[: len(MARKER)] == MARKER:
        raise offloaded(at, "integrity=")
    if not p or p[0] != MAGIC:
        raise IntegrityError(f"{at}: the record carries no integrity tag. {UNTAGGED}")
    try:
        if p[1] != FORMAT:
            raise IntegrityError(f"{at}: integrity header format {p[1]} is unknown (newer persistkit?)")
        klen = p[2]
        kid = p[3 : 3 + klen].decode("ascii")
        i = 3 + klen
        seq = int.from_bytes(p[i : i + 8], "big")
        flags = p[i + 8]
        i += 9
        prev_tag: bytes | None = None
        prev_cid: str | None = None
        if flags & 1:
            prev_tag = p[i : i + TAG_SIZE]
            prev_cid = row.parent_id
            i += TAG_SIZE
        if flags & 2:
            n = int.from_bytes(p[i : i + 2], "big")
            prev_cid = p[i + 2 : i + 2 + n].decode("utf-8") if flags & 1 else None
            i += 2 + n
        tag = p[i : i + TAG_SIZE]
        body = p[i + TAG_SIZE :]
        if len(tag) != TAG_SIZE or (prev_tag is not None and len(prev_tag) != TAG_SIZE) or flags > 3:
            raise ValueError("truncated")
    except (IndexError, ValueError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"{at}: the integrity header is malformed. {_FIX}") from exc
    try:
        key = ring.key(kid)
    except IntegrityError as exc:
        raise IntegrityError(f"{at}: {exc}") from None
    expected = _row_mac(key, kid, row, seq, prev_cid, prev_tag, body)
    if not hmac.compare_digest(expected, tag):
        raise IntegrityError(
            f"{at}: the integrity tag does not match (content, step metadata, parent link, run id or "
            f"position edited, record copied from elsewhere, or the wrong key with id {kid!r}). {_FIX}"
        )
    if (seq == 1) != (prev_tag is None) or seq < 1:
        raise IntegrityError(f"{at}: the chain header is inconsistent (seq {seq}). {_FIX}")
    return Sealed(row, kid, seq, prev_cid, prev_tag, tag, body)


def _blob_mac(key: bytes, kid: str, thread_id: str, blob_key: str, data: bytes) -> bytes:
    h = hashlib.blake2b(key=key, digest_size=TAG_SIZE, person=_BLOB_PERSON)
    h.update(_s(kid) + _s(thread_id) + _s(blob_key) + len(data).to_bytes(8, "big"))
    h.update(data)
    return h.digest()


def seal_blob(thread_id: str, blob_key: str, data: bytes, kid: str, key: bytes) -> bytes:
    kb = kid.encode("ascii")
    return b"".join((bytes((MAGIC, FORMAT, len(kb))), kb, _blob_mac(key, kid, thread_id, blob_key, data), data))


def open_blob(thread_id: str, blob_key: str, value: bytes, ring: KeyRing) -> bytes:
    at = f"thread {thread_id!r} blob {blob_key!r}"
    if value[:1] == _ENCRYPTED:
        raise _encrypted(at)
    if value[: len(MARKER)] == MARKER:
        raise offloaded(at, "integrity=")
    if not value or value[0] != MAGIC:
        raise IntegrityError(f"{at}: the stored value carries no integrity tag. {UNTAGGED}")
    try:
        if value[1] != FORMAT:
            raise ValueError("format")
        klen = value[2]
        kid = value[3 : 3 + klen].decode("ascii")
        i = 3 + klen
        tag, data = value[i : i + TAG_SIZE], value[i + TAG_SIZE :]
        if len(tag) != TAG_SIZE:
            raise ValueError("truncated")
    except (IndexError, ValueError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"{at}: the integrity header is malformed. {_FIX}") from exc
    try:
        key = ring.key(kid)
    except IntegrityError as exc:
        raise IntegrityError(f"{at}: {exc}") from None
    if not hmac.compare_digest(_blob_mac(key, kid, thread_id, blob_key, data), tag):
        raise IntegrityError(f"{at}: the integrity tag does not match (value edited or copied). {_FIX}")
    return data


def check_links(thread_id: str, namespace: str, newer: Sealed, older: Sealed) -> None:
    """``older`` must be the chain predecessor of ``newer``."""
    if newer.seq == older.seq + 1 and newer.prev_cid == older.row.checkpoint_id and newer.prev_tag is not None \
            and hmac.compare_digest(newer.prev_tag, older.tag):
        return
    raise IntegrityError(
        f"{where(thread_id, namespace, newer.row.checkpoint_id)}: the chain is broken after it: its "
        f"predecessor is record #{newer.seq - 1} (checkpoint {newer.prev_cid}), but the store returned "
        f"checkpoint {older.row.checkpoint_id} (record #{older.seq}) next; a record was deleted, "
        f"reordered or inserted. {_FIX}"
    )


def check_witness(thread_id: str, namespace: str, head: Sealed | None, seen: WitnessEntry | None) -> None:
    """The head must not be older than (or diverge from) what the witness recorded."""
    if seen is None:
        return
    if head is None:
        raise IntegrityError(
            f"{where(thread_id, namespace)}: the store has no checkpoints for it, but the witness recorded "
            f"record #{seen.seq} (checkpoint {seen.checkpoint_id}); the thread was removed behind "
            f"persistkit's back or the store was rolled back. {_FIX}"
        )
    if seen.seq > head.seq:
        raise IntegrityError(
            f"{where(thread_id, namespace, head.row.checkpoint_id)}: the head is record #{head.seq}, but the "
            f"witness recorded record #{seen.seq} (checkpoint {seen.checkpoint_id}); the store (or this "
            f"thread) was rolled back to an older copy. {_FIX}"
        )
    if seen.seq == head.seq and (
        seen.checkpoint_id != head.row.checkpoint_id or not hmac.compare_digest(seen.tag, head.tag)
    ):
        raise IntegrityError(
            f"{where(thread_id, namespace, head.row.checkpoint_id)}: the head differs from the witness's "
            f"record #{seen.seq} (checkpoint {seen.checkpoint_id}); the history was replaced. {_FIX}"
        )


@dataclass(frozen=True, slots=True)
class _Link:
    seq: int
    checkpoint_id: str
    tag: bytes


# A request to the inner backend ("head", ...) or to the witness ("w:latest", ...).
_Req = tuple[str, tuple[Any, ...], dict[str, Any]]
_Op = Generator[_Req, Any, T]


def _req(method: str, *args: Any, **kwargs: Any) -> _Req:
    return (method, args, kwargs)


class IntegrityBackend(ForwardLeases, ForwardPrune, ValueKv, Backend):
    """Seals every row and blob written through it and refuses any read that fails its checks.

    ``keyring`` is a ``KeyRing(purpose="integrity")``: the active key seals,
    every key in the ring verifies (MAC keys rotate like encryption keys).
    ``witness`` (optional) keeps the latest head tag outside the store.
    """

    # Read from the class (not the instance) by callers: promise only what every inner store can.
    atomic_blobs: ClassVar[bool] = False
    # Rewriting a sealed row in place would break the chain after it: rotation of
    # encryption keys runs below this wrapper instead, on the encrypted store.
    supports_rewrite: ClassVar[bool] = False

    def __init__(self, inner: Backend, keyring: KeyRing, witness: Witness | None = None) -> None:
        if keyring.purpose != "integrity":
            raise ConfigurationError(f"IntegrityBackend needs an integrity key ring, got one for {keyring.purpose}")
        self._inner = inner
        self.keyring = keyring
        self.witness = witness
        self._links: dict[tuple[str, str], _Link] = {}
        setattr(self, "native_async", inner.native_async)  # noqa: B010 - as native as its inner store
        self.url = inner.url

    @property
    def inner(self) -> Backend:
        return self._inner

    @classmethod
    def from_url(cls, url: str, **options: Any) -> IntegrityBackend:
        """Not opened from a URL: use ``pk.connect(url, integrity=..., witness=...)``."""
        raise ConfigurationError("IntegrityBackend wraps a store; open it with pk.connect(url, integrity=True)")

    def __repr__(self) -> str:
        return f"IntegrityBackend({self._inner!r}, {self.keyring!r}, witness={self.witness!r})"

    # -- drivers: every operation is written once, as a generator of requests ------

    def _drive(self, op: _Op[T]) -> T:
        try:
            method, args, kwargs = next(op)
            while True:
                target: Any = self.witness if method.startswith("w:") else self._inner
                try:
                    result = getattr(target, method.removeprefix("w:"))(*args, **kwargs)
                except BaseException as exc:
                    method, args, kwargs = op.throw(exc)
                else:
                    method, args, kwargs = op.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def _adrive(self, op: _Op[T]) -> T:
        try:
            method, args, kwargs = next(op)
            while True:
                target: Any = self.witness if method.startswith("w:") else self._inner
                try:
                    result = await getattr(target, "a" + method.removeprefix("w:"))(*args, **kwargs)
                except BaseException as exc:
                    method, args, kwargs = op.throw(exc)
                else:
                    method, args, kwargs = op.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    # -- operations ---------------------------------------------------------------------

    def _open(self, row: CheckpointRow) -> Sealed:
        try:
            return open_row(row, self.keyring)
        except IntegrityError as exc:
            # the generic remedy becomes the ways forward for this record, with the calls to make
            advice = damaged_record_advice(row.thread_id, row.namespace, row.parent_id, command_url(self), integrity=True)
            text = str(exc)
            raise IntegrityError(text.replace(_FIX, f"{_CAUSE} {advice}") if _FIX in text else f"{text}. {advice}") from None

    def _remember(self, s: Sealed) -> None:
        self._link(s.row.thread_id, s.row.namespace, _Link(s.seq, s.row.checkpoint_id, s.tag))

    def _link(self, thread_id: str, namespace: str, link: _Link) -> None:
        links = self._links
        links.pop((thread_id, namespace), None)
        links[(thread_id, namespace)] = link
        if len(links) > _LINK_CACHE:  # bounded: a long-lived server touches unboundedly many threads
            links.pop(next(iter(links)), None)

    def _witness_latest(self, thread_id: str, namespace: str) -> _Op[WitnessEntry | None]:
        # Read BEFORE the head: a writer records in the witness after its commit, so a head
        # read later is at least as new as anything the witness held at this moment.
        if self.witness is None:
            return None
        seen: WitnessEntry | None = yield _req("w:latest", thread_id, namespace)
        return seen

    def _overtaken(self, thread_id: str, namespace: str, newest: Sealed, head: Head | None) -> _Op[None]:
        """``newest`` (listed after ``head`` was read) is newer than ``head``: a live writer, or a
        head set back. Rows and head move together, so the head read again must have caught up
        with ``newest``; a head that stays behind was replaced by an older version of itself."""
        again: Head | None = yield _req("head", thread_id, namespace)
        if again is not None and (
            again.version > newest.seq
            or (again.version == newest.seq and again.checkpoint_id == newest.row.checkpoint_id)
        ):
            return
        shown = f"{again.checkpoint_id} version {again.version}" if again else "none"
        raise IntegrityError(
            f"{where(thread_id, namespace, newest.row.checkpoint_id)}: this record (#{newest.seq}) is newer "
            f"than the thread head ({shown}): the head was replaced by an older version of itself, "
            f"or the records were inserted. {_FIX}"
        )

    def _head_op(self, thread_id: str, namespace: str) -> _Op[Head | None]:
        seen = yield from self._witness_latest(thread_id, namespace)
        head: Head | None = yield _req("head", thread_id, namespace)
        rows: list[CheckpointRow] = yield _req("list", thread_id, namespace, limit=1)
        newest = self._open(rows[0]) if rows else None
        if newest is not None and (head is None or newest.seq > head.version):
            yield from self._overtaken(thread_id, namespace, newest, head)
            check_witness(thread_id, namespace, newest, seen)
            return Head(newest.row.checkpoint_id, newest.seq)  # the head as of the listing
        if head is not None and (
            newest is None or newest.row.checkpoint_id != head.checkpoint_id or newest.seq != head.version
        ):
            raise IntegrityError(
                f"{where(thread_id, namespace, head.checkpoint_id)}: the thread head (version "
                f"{head.version}) points at this checkpoint, but the newest stored record is "
                + (f"checkpoint {newest.row.checkpoint_id} (record #{newest.seq})" if newest else "missing")
                + f"; the newest records were removed or the head was edited. {_FIX}"
            )
        check_witness(thread_id, namespace, newest, seen)
        if newest is not None:
            self._remember(newest)
        return head

    def _get_op(self, thread_id: str, namespace: str, checkpoint_id: str) -> _Op[CheckpointRow | None]:
        row: CheckpointRow | None = yield _req("get", thread_id, namespace, checkpoint_id)
        if row is None:
            return None
        return self._open(row).plain()

    def _list_op(
        self, thread_id: str, namespace: str, run_id: str | None, before: str | None, limit: int | None
    ) -> _Op[list[CheckpointRow]]:
        if run_id is not None:
            result = yield from self._run_list_op(thread_id, namespace, run_id, before, limit)
            return result
        seen = (yield from self._witness_latest(thread_id, namespace)) if before is None else None
        head: Head | None = (yield _req("head", thread_id, namespace)) if before is None else None
        want = None if limit is None else limit + 1
        rows: list[CheckpointRow] = yield _req("list", thread_id, namespace, before=before, limit=want)
        sealed = [self._open(r) for r in rows]
        for a, b in pairwise(sealed):
            yield from self._linked(thread_id, namespace, a, b)
        bottom = sealed and (want is None or len(sealed) < want) and sealed[-1].seq != 1
        if bottom and not (yield from check_gap(self, thread_id, namespace, sealed[-1], None)):
            oldest = sealed[-1]
            raise IntegrityError(
                f"{where(thread_id, namespace, oldest.row.checkpoint_id)}: this is the oldest stored record, but "
                f"it is record #{oldest.seq}; the records before it (from checkpoint {oldest.prev_cid}) "
                f"were deleted. {_FIX}"
            )
        if before is None:
            if sealed and (head is None or sealed[0].seq > head.version):
                yield from self._overtaken(thread_id, namespace, sealed[0], head)
            elif head is not None and (
                not sealed or sealed[0].row.checkpoint_id != head.checkpoint_id or sealed[0].seq != head.version
            ):
                raise IntegrityError(
                    f"{where(thread_id, namespace, head.checkpoint_id)}: the thread head (version {head.version}) "
                    "points at this checkpoint, but the newest stored record is "
                    + (f"checkpoint {sealed[0].row.checkpoint_id} (record #{sealed[0].seq})" if sealed else "missing")
                    + f"; records were removed or the head was edited. {_FIX}"
                )
            check_witness(thread_id, namespace, sealed[0] if sealed else None, seen)
            if sealed:
                self._remember(sealed[0])
        keep = sealed if limit is None else sealed[:limit]
        return [s.plain() for s in keep]

    def _run_list_op(
        self, thread_id: str, namespace: str, run_id: str, before: str | None, limit: int | None
    ) -> _Op[list[CheckpointRow]]:
        # One row past the page, so the link across the page boundary is checked too.
        want = None if limit is None else limit + 1
        rows: list[CheckpointRow] = yield _req(
            "list", thread_id, namespace, run_id=run_id, before=before, limit=want
        )
        sealed = [self._open(r) for r in rows]
        for a, b in pairwise(sealed):
            if a.seq == b.seq + 1:
                check_links(thread_id, namespace, a, b)
                continue
            if a.seq <= b.seq:
                check_links(thread_id, namespace, a, b)  # raises: out of order
            # rows of other runs (or updates) in between: walk exactly those
            gap: list[CheckpointRow] = yield _req(
                "list", thread_id, namespace, before=a.row.checkpoint_id, limit=a.seq - b.seq
            )
            chain = [a, *(self._open(r) for r in gap)]
            for x, y in pairwise(chain):
                yield from self._linked(thread_id, namespace, x, y)
                if y.row.run_id == run_id and y.row.checkpoint_id != b.row.checkpoint_id:
                    raise IntegrityError(
                        f"{where(thread_id, namespace, y.row.checkpoint_id)}: this record of run {run_id} was "
                        f"left out of the run's listing; the store's index was edited. {_FIX}"
                    )
            if chain[-1].row.checkpoint_id != b.row.checkpoint_id:
                yield from self._linked(thread_id, namespace, chain[-1], b)
        if sealed and (want is None or len(sealed) < want) and sealed[-1].seq > 1:
            oldest = sealed[-1]
            assert oldest.prev_cid is not None
            prev: CheckpointRow | None = yield _req("get", thread_id, namespace, oldest.prev_cid)
            if prev is None and (yield from self._pruned_below(thread_id, namespace, oldest)):
                pass
            elif prev is None:
                raise IntegrityError(
                    f"{where(thread_id, namespace, oldest.row.checkpoint_id)}: its predecessor, checkpoint "
                    f"{oldest.prev_cid} (record #{oldest.seq - 1}), is missing; a record was deleted. {_FIX}"
                )
            else:
                check_links(thread_id, namespace, oldest, self._open(prev))
        return [s.plain() for s in (sealed if limit is None else sealed[:limit])]

    def seal_blob(self, thread_id: str, key: str, data: bytes) -> bytes:
        kid, mac_key = self.keyring.active()
        return seal_blob(thread_id, key, data, kid, mac_key)

    def open_blob(self, thread_id: str, key: str, value: bytes) -> bytes:
        return open_blob(thread_id, key, value, self.keyring)

    def _linked(self, thread_id: str, namespace: str, newer: Sealed, older: Sealed) -> _Op[None]:
        """``older`` is ``newer``'s chain predecessor, or the gap between them was pruned
        (an anchor says so; read only when there is a gap: see ``_integrity_prune``)."""
        if newer.seq > older.seq + 1 and (yield from check_gap(self, thread_id, namespace, newer, older)):
            return
        check_links(thread_id, namespace, newer, older)

    def _pruned_below(self, thread_id: str, namespace: str, oldest: Sealed) -> _Op[bool]:
        """The predecessor of a run's oldest record is missing: was it pruned? The next older
        stored record (if any) must be one the record's anchor allows."""
        below: list[CheckpointRow] = yield _req("list", thread_id, namespace, before=oldest.row.checkpoint_id, limit=1)
        older = self._open(below[0]) if below else None
        allowed: bool = yield from check_gap(self, thread_id, namespace, oldest, older)
        return allowed

    # -- prune (retention): anchors first, then the deletion (``_integrity_prune``) ---------

    def prune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        return self._drive(prune_op(self, thread_id, namespace, checkpoint_ids))

    async def aprune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        return await self._adrive(prune_op(self, thread_id, namespace, checkpoint_ids))

    def _write_op(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected: int, fence: int | None = None) -> _Op[Head]:
        t, ns = row.thread_id, row.namespace
        kid, key = self.keyring.active()
        prev: _Link | None = None
        if expected > 0:
            prev = self._links.get((t, ns))
            if prev is None or prev.seq != expected or prev.checkpoint_id != row.parent_id:
                head: Head | None = yield _req("head", t, ns)
                if head is None or head.version != expected:
                    raise ConflictError(
                        thread_id=t, namespace=ns, expected=expected,
                        found=head.version if head else 0, found_checkpoint=head.checkpoint_id if head else None,
                    )
                got: CheckpointRow | None = yield _req("get", t, ns, head.checkpoint_id)
                if got is None:
                    raise IntegrityError(
                        f"{where(t, ns, head.checkpoint_id)}: the thread head points at this checkpoint, which "
                        f"is missing; nothing was written. {_FIX}"
                    )
                s = self._open(got)
                if s.seq != expected:
                    raise IntegrityError(
                        f"{where(t, ns, head.checkpoint_id)}: the head row is record #{s.seq} but the head is "
                        f"at version {expected}; nothing was written. {_FIX}"
                    )
                prev = _Link(s.seq, s.row.checkpoint_id, s.tag)
        seq = expected + 1
        payload, tag = seal_row(row, kid, key, seq, prev.checkpoint_id if prev else None, prev.tag if prev else None)
        sealed_blobs = {k: seal_blob(t, k, v, kid, key) for k, v in blobs.items()}
        try:
            sealed_row = replace(row, payload=payload)
            new: Head = yield (
                _req("write", sealed_row, sealed_blobs, expected)
                if fence is None
                else _req("write_fenced", sealed_row, sealed_blobs, expected, fence)
            )
        except (ConflictError, LeaseLostError):
            self._links.pop((t, ns), None)
            raise
        self._link(t, ns, _Link(seq, row.checkpoint_id, tag))
        if self.witness is not None:
            try:
                yield _req("w:record", t, ns, seq, row.checkpoint_id, tag)
            except Exception as exc:  # the checkpoint is durable; a lagging witness is safe
                log.warning("persistkit: %s: the witness could not record record #%d: %s", where(t, ns), seq, exc)
        return new

    def _put_blobs_op(self, thread_id: str, blobs: Mapping[str, bytes]) -> _Op[None]:
        kid, key = self.keyring.active()
        yield _req("put_blobs", thread_id, {k: seal_blob(thread_id, k, v, kid, key) for k, v in blobs.items()})

    def _blobs_op(self, thread_id: str, method: str, *args: Any) -> _Op[dict[str, bytes]]:
        found: dict[str, bytes] = yield _req(method, thread_id, *args)
        # prune anchors are this wrapper's own (``_integrity_prune``): not the layers' above
        return {k: open_blob(thread_id, k, v, self.keyring) for k, v in found.items() if not k.startswith(ANCHOR)}

    def _delete_op(self, thread_id: str) -> _Op[bool]:
        existed: bool = yield _req("delete_thread", thread_id)
        for k in [k for k in self._links if k[0] == thread_id]:
            del self._links[k]
        if self.witness is not None:
            yield _req("w:forget", thread_id)
        return existed

    # -- the protocol, sync ---------------------------------------------------------------

    def write(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int) -> Head:
        return self._drive(self._write_op(row, blobs, expected_version))

    def write_fenced(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int) -> Head:
        return self._drive(self._write_op(row, blobs, expected_version, fence))

    async def awrite_fenced(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int) -> Head:
        return await self._adrive(self._write_op(row, blobs, expected_version, fence))

    def put_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        self._drive(self._put_blobs_op(thread_id, blobs))

    def head(self, thread_id: str, namespace: str) -> Head | None:
        return self._drive(self._head_op(thread_id, namespace))

    def get(self, thread_id: str, namespace: str, checkpoint_id: str) -> CheckpointRow | None:
        return self._drive(self._get_op(thread_id, namespace, checkpoint_id))

    def list(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[CheckpointRow]:
        return self._drive(self._list_op(thread_id, namespace, run_id, before, limit))

    def get_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        return self._drive(self._blobs_op(thread_id, "get_blobs", keys))

    def scan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        return self._drive(self._blobs_op(thread_id, "scan_blobs", start, stop))

    def threads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        return self._inner.threads(prefix=prefix, after=after, limit=limit)

    def namespaces(self, thread_id: str) -> builtins.list[str]:
        return self._inner.namespaces(thread_id)

    def rewrite(self, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]) -> None:
        raise ConfigurationError(
            "records under integrity= are sealed into a chain and cannot be rewritten in place: "
            "store.rotate_keys() re-encrypts below the integrity layer, and store.copy_from() "
            "moves threads to a store with new integrity keys"
        )

    def delete_thread(self, thread_id: str) -> bool:
        return self._drive(self._delete_op(thread_id))

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            if self.witness is not None:
                self.witness.close()

    # -- kv values: tagged on the way down, checked on the way up (ValueKv drives) -----------

    def _kv_seal(self, scope: str, ops: Sequence[KvOp]) -> builtins.list[KvOp]:
        return [tag_kv_op(scope, op, self.keyring) for op in ops]

    def _kv_open(self, scope: str, entries: Sequence[KvEntry]) -> builtins.list[KvEntry]:
        return [open_kv_tagged(scope, e, self.keyring) for e in entries]

    # -- the protocol, async ----------------------------------------------------------------

    async def awrite(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int) -> Head:
        return await self._adrive(self._write_op(row, blobs, expected_version))

    async def aput_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        await self._adrive(self._put_blobs_op(thread_id, blobs))

    async def ahead(self, thread_id: str, namespace: str) -> Head | None:
        return await self._adrive(self._head_op(thread_id, namespace))

    async def aget(self, thread_id: str, namespace: str, checkpoint_id: str) -> CheckpointRow | None:
        return await self._adrive(self._get_op(thread_id, namespace, checkpoint_id))

    async def alist(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[CheckpointRow]:
        return await self._adrive(self._list_op(thread_id, namespace, run_id, before, limit))

    async def aget_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        return await self._adrive(self._blobs_op(thread_id, "get_blobs", keys))

    async def ascan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        return await self._adrive(self._blobs_op(thread_id, "scan_blobs", start, stop))

    async def athreads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        return await self._inner.athreads(prefix=prefix, after=after, limit=limit)

    async def anamespaces(self, thread_id: str) -> builtins.list[str]:
        return await self._inner.anamespaces(thread_id)

    async def adelete_thread(self, thread_id: str) -> bool:
        return await self._adrive(self._delete_op(thread_id))

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if self.witness is not None:
                await self.witness.aclose()


def wrap_integrity(backend: Backend, integrity: Any, witness: Any = None) -> IntegrityBackend:
    """What ``connect(integrity=..., witness=...)`` does: the outermost wrapper."""
    ring = KeyRing.coerce(integrity, purpose="integrity")
    return IntegrityBackend(backend, ring, coerce_witness(witness))
