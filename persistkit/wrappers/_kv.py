"""The kv primitives of a wrapper that changes value bytes, and the integrity wrapper's kv tags.

:class:`ValueKv` is :class:`~persistkit.backends._protocol.ForwardKv` for a wrapper
that seals (encryption), tags (integrity) or moves (offload) kv values: reads and
writes go to the inner store, with each value turned into its stored form on the
way down (``_kv_seal``) and back on the way up (``_kv_open``). ``kv_drop`` and
``watch_open`` stay forwarded: a drop carries no value, a hint is never the data.

A wrapper may store a delete as a value (the integrity wrapper stores a tagged
marker, so that a delete written past it is caught); its ``_kv_open`` turns the
marker back into ``value=None``. ``kv_list`` therefore skips entries that open to
``None`` and reads on past them, so they are not counted against ``limit``, as the
protocol promises for tombstones.

Integrity kv tags
-----------------
Each value (a delete as well) is stored as::

    0xA1 | 0x01 | len(kid) | kid | kind (0 value, 1 delete) | tag 32 | value

``tag`` is keyed BLAKE2b-256 (personalised ``pk-int-kv-v1``) over a length-prefixed
encoding of key id, scope, key, version, kind and value. What this catches and what
it does not is written in ``wrappers/_integrity.py``'s module docs.
"""

from __future__ import annotations

import abc
import builtins
import hashlib
import hmac
import struct
from collections.abc import Sequence

from .._errors import IntegrityError
from ..backends._protocol import ForwardKv, KvEntry, KvOp
from ._keys import KeyRing
from ._options import MARKER, offloaded

__all__ = ["UNTAGGED", "ValueKv", "kv_where", "open_kv_tagged", "tag_kv_op"]


def kv_where(scope: str, key: str, version: int) -> str:
    """How an error names a board key: its scope, key and version."""
    return f"kv scope {scope!r} key {key!r} version {version}"


class ValueKv(ForwardKv):
    """kv primitives that turn each value into its stored form and back (see the module docs).

    Subclasses implement ``_kv_seal`` and ``_kv_open``; their async twins default to
    the sync ones (CPU-only work) and are overridden by a wrapper that does I/O there.
    """

    @abc.abstractmethod
    def _kv_seal(self, scope: str, ops: Sequence[KvOp]) -> builtins.list[KvOp]:
        """``ops`` with each value in its stored form (``op.expected + 1`` is its version)."""

    @abc.abstractmethod
    def _kv_open(self, scope: str, entries: Sequence[KvEntry]) -> builtins.list[KvEntry]:
        """Stored ``entries`` with their values back; ``IntegrityError`` naming one that fails."""

    async def _akv_seal(self, scope: str, ops: Sequence[KvOp]) -> builtins.list[KvOp]:
        return self._kv_seal(scope, ops)

    async def _akv_open(self, scope: str, entries: Sequence[KvEntry]) -> builtins.list[KvEntry]:
        return self._kv_open(scope, entries)

    # -- sync ------------------------------------------------------------------------

    def kv_get(self, scope: str, key: str, version: int | None = None) -> KvEntry | None:
        entry = self.kv_inner().kv_get(scope, key, version)
        return None if entry is None else self._kv_open(scope, [entry])[0]

    def kv_history(
        self, scope: str, key: str, *, before: int | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        return self._kv_open(scope, self.kv_inner().kv_history(scope, key, before=before, limit=limit))

    def kv_list(
        self, scope: str, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        out: builtins.list[KvEntry] = []
        while True:
            want = None if limit is None else limit - len(out)
            page = self.kv_inner().kv_list(scope, prefix=prefix, after=after, limit=want)
            out += [e for e in self._kv_open(scope, page) if e.value is not None]
            if _done(page, want, out, limit):
                return out
            after = page[-1].key

    def kv_write(self, scope: str, ops: Sequence[KvOp], *, keep: int) -> None:
        self.kv_inner().kv_write(scope, self._kv_seal(scope, ops), keep=keep)

    # -- async -----------------------------------------------------------------------

    async def akv_get(self, scope: str, key: str, version: int | None = None) -> KvEntry | None:
        entry = await self.kv_inner().akv_get(scope, key, version)
        return None if entry is None else (await self._akv_open(scope, [entry]))[0]

    async def akv_history(
        self, scope: str, key: str, *, before: int | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        found = await self.kv_inner().akv_history(scope, key, before=before, limit=limit)
        return await self._akv_open(scope, found)

    async def akv_list(
        self, scope: str, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        out: builtins.list[KvEntry] = []
        while True:
            want = None if limit is None else limit - len(out)
            page = await self.kv_inner().akv_list(scope, prefix=prefix, after=after, limit=want)
            out += [e for e in await self._akv_open(scope, page) if e.value is not None]
            if _done(page, want, out, limit):
                return out
            after = page[-1].key

    async def akv_write(self, scope: str, ops: Sequence[KvOp], *, keep: int) -> None:
        await self.kv_inner().akv_write(scope, await self._akv_seal(scope, ops), keep=keep)


def _done(page: Sequence[KvEntry], want: int | None, out: Sequence[KvEntry], limit: int | None) -> bool:
    """Whether a ``kv_list`` has its answer: no limit, the inner store ran out, or the page is full."""
    return want is None or limit is None or not page or len(page) < want or len(out) >= limit


# -- the integrity wrapper's kv tags ---------------------------------------------------

_MAGIC = 0xA1
_FORMAT = 1
_TAG = 32
_PERSON = b"pk-int-kv-v1"
_VALUE, _DELETE = 0, 1
_U32 = struct.Struct(">I")
#: Why a record carries no tag, the likely cause first (issue 34: it read as tampering).
UNTAGGED = (
    "Most likely it was written by a store opened without integrity (before integrity was "
    "turned on for this store, or by a process without $PERSISTKIT_INTEGRITY_KEYS), and this "
    "store was opened with integrity on: by integrity= or ?integrity=, or by "
    "$PERSISTKIT_INTEGRITY_KEYS being set, which pk.connect and the persistkit CLI both read. "
    "If so, open it without integrity (integrity=False, ?integrity=false, or unset the "
    "variable), or adopt it: copy its threads into a fresh store opened with integrity= "
    "(store.copy_from(old_url)), which seals them. If every record of this store was always "
    "sealed, this one was written around persistkit (forged, or restored from an unsealed "
    "copy): `persistkit verify --url URL` lists every such record."
)

_FIX = (
    "The store was edited outside persistkit, restored from an older copy, or written without "
    "the integrity key. Write the key again through the board (or drop the scope) once the "
    "cause is known."
)


def _s(text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    return _U32.pack(len(data)) + data


def _kv_mac(key: bytes, kid: str, scope: str, kv_key: str, version: int, kind: int, value: bytes) -> bytes:
    h = hashlib.blake2b(key=key, digest_size=_TAG, person=_PERSON)
    h.update(b"".join((_s(kid), _s(scope), _s(kv_key), version.to_bytes(8, "big"), bytes((kind,)))))
    h.update(len(value).to_bytes(8, "big"))
    h.update(value)
    return h.digest()


def tag_kv_op(scope: str, op: KvOp, ring: KeyRing) -> KvOp:
    """``op`` with its value tagged for version ``op.expected + 1``; a delete becomes a tagged marker."""
    kid, key = ring.active()
    value = b"" if op.value is None else bytes(op.value)
    kind = _DELETE if op.value is None else _VALUE
    kb = kid.encode("ascii")
    tag = _kv_mac(key, kid, scope, op.key, op.expected + 1, kind, value)
    return KvOp(op.key, op.expected, b"".join((bytes((_MAGIC, _FORMAT, len(kb))), kb, bytes((kind,)), tag, value)))


def open_kv_tagged(scope: str, entry: KvEntry, ring: KeyRing) -> KvEntry:
    """``entry`` with its tag checked and taken off (a delete marker opens to ``value=None``);
    ``IntegrityError`` naming the scope, key and version when anything is off."""
    at = kv_where(scope, entry.key, entry.version)
    data = entry.value
    if data is None:
        raise IntegrityError(
            f"{at}: the store holds a delete that carries no integrity tag (deletes through an "
            f"integrity store are tagged): it was written without the integrity key. {_FIX}"
        )
    if data[: len(MARKER)] == MARKER:  # offload sits below: the store was opened without blobs=
        raise offloaded(at, "integrity=")
    if not data or data[0] != _MAGIC:
        raise IntegrityError(f"{at}: the value carries no integrity tag. {UNTAGGED}")
    try:
        if data[1] != _FORMAT:
            raise ValueError("format")
        n = data[2]
        kid = data[3 : 3 + n].decode("ascii")
        kind = data[3 + n]
        tag = data[4 + n : 4 + n + _TAG]
        value = data[4 + n + _TAG :]
        if len(tag) != _TAG or kind not in (_VALUE, _DELETE) or (kind == _DELETE and value):
            raise ValueError("truncated")
    except (IndexError, ValueError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"{at}: the integrity header is malformed. {_FIX}") from exc
    try:
        key = ring.key(kid)
    except IntegrityError as exc:
        raise IntegrityError(f"{at}: {exc}") from None
    if not hmac.compare_digest(_kv_mac(key, kid, scope, entry.key, entry.version, kind, value), tag):
        raise IntegrityError(
            f"{at}: the integrity tag does not match (value edited, copied from another key, version or "
            f"scope, or the wrong key with id {kid!r}). {_FIX}"
        )
    return KvEntry(entry.key, entry.version, None if kind == _DELETE else value)
