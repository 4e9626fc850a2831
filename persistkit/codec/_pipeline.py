"""The codec pipeline between Python values and the bytes a backend stores.

value → serialize (type-tagged JSON, :mod:`persistkit.codec._serde`) → redact
secrets into handles (:mod:`persistkit.secrets._redact`, inside ``dump_tree``) →
compress above a size threshold → envelope. Reading runs it backwards and fails
closed: bytes that are not a known envelope raise ``SerializationError``.

Envelope: one version byte, then the body.

* ``0x01`` — body is the serialized JSON as is.
* ``0x02`` — body is the serialized JSON compressed with zlib (written when the
  ``zstandard`` package is missing, and by persistkit before 0.1).
* ``0x04`` — body is one zstd frame (level 1, content size in the header).

Content addresses (blob keys of unchanged values) hash the serialized bytes,
after redaction and before compression, so a value has one address however
it is stored, and a hash never covers a secret.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import zlib
from typing import Any

from .._errors import SerializationError, StoreOptionsError
from ..secrets._redact import PEOPLE_KEYS, Redactor, hold_text
from ._serde import Serializer
from ._sizes import LARGE_VALUE_BYTES

try:  # 5-20x faster than the json module on the per-step path; optional
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised where no wheel exists
    _orjson = None  # type: ignore[assignment]

__all__ = ["COMPRESS_THRESHOLD", "Codec", "_orjson", "content_hash", "raw_digest"]  # _orjson: the one optional import, shared

# One encoder for every write (json.dumps builds a new one per call). Trees come
# from the serializer, which rejects cycles, so the circular check is skipped.
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)
# Strings may hold lone surrogates, which UTF-8 cannot encode: escape those.
_JSON_ASCII = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), check_circular=False)

_PLAIN = b"\x01"
_ZLIB = b"\x02"
_ZSTD = b"\x04"

# zstd level 1 compresses a 1 KB record in ~14 µs inside the step loop, where
# zlib level 1 took ~30-40 µs for the same size of output (measured with
# bench/bench_sqlite.py's workload; microbenchmarks flatter zlib, whose state
# is cold between steps). A compressor per thread: they are not thread-safe.
_local = threading.local()
#: Records of at least this many bytes (serialized) are compressed, if that makes them smaller.
#: Measured (bench/bench_compression.py, docs/performance.md "Where compression pays"): zstd
#: level 1 costs a nearly fixed ~56-65k instructions a record from 300 bytes to 2 KB (~15% of
#: a step) and takes a 512-1,023-byte record (chat messages, tool results, JSON state) to
#: 0.53-0.62 of its size: SQLite's bytes for 600-byte messages fall from 1.96x to 1.26x the
#: content. Below 512 bytes it saves under ~170 bytes a row, less than a row's own overhead.
COMPRESS_THRESHOLD = 512
_zstd_mod: Any = None  # the zstandard module once imported; False if it is missing
#: A frame claiming more than this is refused before anything is allocated.
MAX_RECORD = 1 << 30


def _zstd() -> Any:
    global _zstd_mod
    if _zstd_mod is None:
        try:
            import zstandard  # ~7 ms: imported by the first record worth compressing
        except ImportError:  # pragma: no cover - a platform without a wheel: zlib instead
            _zstd_mod = False
        else:
            _zstd_mod = zstandard
    return _zstd_mod or None


def _zstd_compressor(z: Any, level: int) -> Any:
    """This thread's compressor for ``level``."""
    try:
        return _local.zc[level]
    except AttributeError:
        _local.zc = {}
    except KeyError:
        pass
    c = _local.zc[level] = z.ZstdCompressor(level=level)
    return c


def _zstd_decompress(body: bytes, path: str) -> bytes:
    z = _zstd()
    if z is None:
        raise SerializationError(
            "the record is zstd-compressed and the zstandard package is missing: "
            "pip install zstandard (a persistkit dependency)",
            path=path,
        )
    try:
        size = z.frame_content_size(body)
    except z.ZstdError as exc:
        raise SerializationError(f"compressed record is corrupt ({exc})", path=path) from exc
    if size < 0 or size > MAX_RECORD:
        raise SerializationError(f"compressed record claims an unusable size ({size})", path=path)
    d = getattr(_local, "zd", None)
    if d is None:
        d = _local.zd = z.ZstdDecompressor()
    try:
        out = bytes(d.decompress(body))
    except z.ZstdError as exc:
        raise SerializationError(f"compressed record is corrupt ({exc})", path=path) from exc
    if len(out) != size:
        raise SerializationError("compressed record is corrupt (size mismatch)", path=path)
    return out


def _reject_constant(name: str) -> Any:
    # persistkit never writes NaN/Infinity literals (the serializer tags them).
    raise ValueError(f"unexpected JSON constant {name}")


def _dump(tree: Any) -> bytes:
    """Compact JSON bytes of an encoded tree (no redaction)."""
    if _orjson is not None:
        try:
            return _orjson.dumps(tree)
        except (TypeError, _orjson.JSONEncodeError):
            pass  # ints beyond 64 bits, lone surrogates: the json module handles them
    text = _JSON.encode(tree)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _JSON_ASCII.encode(tree).encode("ascii")


def raw_digest(raw: bytes) -> str:
    """``x:`` and 16 hex digits of BLAKE2b over a step's arguments as JSON bytes
    (bytes that cannot hold a secret: see ``Codec.args_digest``)."""
    return "x:" + hashlib.blake2b(raw, digest_size=8).hexdigest()


def content_hash(data: bytes) -> str:
    """32 hex digits of BLAKE2b over ``data``: the content address of a serialized value."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class Codec:
    """Serializes values and seals them into envelopes (and back)."""

    #: ``pk.connect(max_value_bytes=)``: larger values are refused (``_sizes.py``); None: no limit
    max_value_bytes: int | None = None
    #: the serialized size above which a value gets a look (a warning, the limit): ``_sizes.alarm``
    value_alarm: int = LARGE_VALUE_BYTES

    def __init__(
        self,
        serializer: Serializer | None = None,
        *,
        compress_threshold: int = COMPRESS_THRESHOLD,
        compress_level: int = 1,
        redactor: Redactor | None = None,
    ) -> None:
        self.serializer = serializer or Serializer()
        self.compress_threshold = compress_threshold
        self.compress_level = compress_level
        self.redactor = redactor or Redactor()  # its own: a store attaches its handle key to it
        self.serializer.secrets = self.redactor
        self.serializer.reveal = self.redactor.reveal_text if self.redactor.enabled else None
        #: Whether decoded values get their handles resolved (the CLI turns it off).
        self.reveal = True
        self._plain_serializer: Serializer | None = None
        self._verbatim_serializer: Serializer | None = None

    # -- trees (JSON-able structures) -----------------------------------------

    def encode(self, value: Any, path: str = "value") -> Any:
        return self.serializer.encode(value, path=path)

    def decode(
        self, tree: Any, path: str = "value", *, reveal: bool | None = None, plain: bool = False, live: bool = False
    ) -> Any:
        """The value of a stored tree; its handles resolved unless ``reveal`` (default
        ``self.reveal``) is false (history listings, CLI output, replayed errors).
        ``plain``: models and dataclasses as dicts, for a migration (``Serializer.decode``).

        ``live``: ``tree`` is not a stored tree but one this process encoded (:meth:`encode`)
        and kept — a record it committed, a list item it appended. Its text is decoded as it
        is: only the stored form escapes a ``$CRED{`` someone typed (``$CRED{$}``), so in a
        live tree such text is text, never a handle to resolve or to remember as read back."""
        if live:
            return self._verbatim().decode(tree, path=path, plain=plain)
        if self.reveal if reveal is None else reveal:
            return self.serializer.decode(tree, path=path, plain=plain)
        return self._plain().decode(tree, path=path, plain=plain)

    def decode_exception(self, tree: Any, path: str = "exception", *, live: bool = False) -> BaseException:
        """A recorded exception, revived with handles left in place (never a secret in a message);
        ``live``: a tree this process encoded, its text as it is (see :meth:`decode`)."""
        return (self._verbatim() if live else self._plain()).decode_exception(tree, path=path)

    def _verbatim(self) -> Serializer:
        """The serializer of live trees: strings come back as they are (see :meth:`decode`)."""
        twin = self._verbatim_serializer
        if twin is None:
            twin = copy.copy(self.serializer)
            twin.reveal = None
            twin._plain_twin = None  # its own, that keeps text as it is too
            twin._solid = twin
            self._verbatim_serializer = twin
        return twin

    def _plain(self) -> Serializer:
        plain = self._plain_serializer
        if plain is None:
            plain = copy.copy(self.serializer)
            plain.reveal = hold_text if self.redactor.enabled else None
            plain._plain_twin = None  # its own, that does not reveal either
            plain._solid = plain
            self._plain_serializer = plain
        return plain

    def dump_tree(self, tree: Any, *, stable: bool = False, data: bytes | None = None) -> bytes:
        """Compact JSON bytes of an already-encoded tree, secrets replaced by handles.

        ``stable``: every secret becomes ``$CRED{}``, the same in every process
        whatever named it (for digests that are compared across processes).
        ``data``: the tree's JSON before redaction (``_dump(tree)``), when the caller has it.
        """
        if data is None:
            data = _dump(tree)
        return self.redactor.redact_json(data, tree, _dump, stable)

    @staticmethod
    def _people(tree: Any) -> tuple[str, ...]:
        """The keys of a record body whose text is for people (recorded errors, metadata)."""
        if type(tree) is dict and ("e" in tree or "m" in tree):
            return tuple(k for k in PEOPLE_KEYS if k in tree)
        return ()

    @staticmethod
    def load_tree(data: bytes, path: str = "value") -> Any:
        if _orjson is not None:
            try:
                return _orjson.loads(data)
            except _orjson.JSONDecodeError:
                pass  # ints beyond 64 bits, escaped lone surrogates: try the json module
        try:
            return json.loads(data, parse_constant=_reject_constant)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise SerializationError(f"stored bytes are not valid JSON ({exc})", path=path) from exc

    # -- envelopes ------------------------------------------------------------

    def seal(self, data: bytes) -> bytes:
        """Wrap serialized bytes in an envelope, compressing them when large."""
        if len(data) >= self.compress_threshold:
            z = _zstd_mod if _zstd_mod is not None else _zstd()
            if z:
                try:  # _zstd_compressor(), inlined for its common case
                    c = _local.zc[self.compress_level]
                except (AttributeError, KeyError):
                    c = _zstd_compressor(z, self.compress_level)
                packed: bytes = c.compress(data)
                kind = _ZSTD
            else:
                packed, kind = zlib.compress(data, self.compress_level), _ZLIB
            if len(packed) < len(data):
                return kind + packed
        return _PLAIN + data

    def open(self, blob: bytes, path: str = "value") -> bytes:
        """The serialized bytes inside an envelope."""
        if not blob:
            raise SerializationError("stored record is empty", path=path)
        kind = blob[:1]
        if kind == _PLAIN:
            return bytes(blob[1:])
        if kind == _ZSTD:
            return _zstd_decompress(bytes(blob[1:]), path)
        if kind == _ZLIB:
            try:
                return zlib.decompress(blob[1:])
            except zlib.error as exc:
                raise SerializationError(f"compressed record is corrupt ({exc})", path=path) from exc
        if blob[0] == 0xE1:  # persistkit.wrappers._encryption.MAGIC (not imported: no crypto here)
            raise StoreOptionsError(
                "the record is encrypted (envelope 0xe1) but the store was opened without its "
                "keys: open it with pk.connect(url, encryption=...)",
                path=path,
                option="encryption",
            )
        if blob[0] == 0xA1:  # persistkit.wrappers._integrity: a sealed (tagged) record
            raise StoreOptionsError(
                "the record is sealed with an integrity tag: open the store with "
                "pk.connect(url, integrity=...) and the integrity key",
                path=path,
                option="integrity",
            )
        if blob.startswith(b"\x00PKREF1:"):  # persistkit.wrappers._offload._MARKER
            raise StoreOptionsError(
                "the record was offloaded to a blob store (the store holds only a pointer to it): "
                "open the store with pk.connect(url, blobs=<the blob store's URL>), as it was written",
                path=path,
                option="blobs",
            )
        raise SerializationError(
            f"unknown record envelope 0x{blob[0]:02x}: written by a newer persistkit, "
            "or not written by persistkit",
            path=path,
        )

    # -- whole values -----------------------------------------------------------

    def pack_tree(self, tree: Any) -> bytes:
        """A record body sealed: redacted, with the high-entropy rule on its errors and metadata.

        For a body made in this process (live values). A body copied from stored records
        is in stored form already — its secrets are handles, its text that looks like a
        handle escaped — and redacting it again would escape its handles into plain text
        (the secret lost for good): use :meth:`pack_stored`."""
        return self.seal(self._redacted(tree))

    def redact_tree(self, tree: Any) -> Any:
        """``tree`` (live values) in stored form: what :meth:`pack_tree` would store of it."""
        return self.load_tree(self._redacted(tree))

    def _redacted(self, tree: Any) -> bytes:
        """The JSON bytes of ``tree`` redacted, with the high-entropy rule on its errors and metadata."""
        return self.redactor.redact_json(_dump(tree), tree, _dump, False, self._people(tree))

    def pack_stored(self, tree: Any) -> bytes:
        """A record body in stored form sealed as it is: parts copied from stored records
        (``unpack_tree``), and new parts put through :meth:`redact_tree` first."""
        return self.seal(_dump(tree))

    # -- step arguments -----------------------------------------------------------

    def args_digest(self, raw: bytes) -> str:
        """The stored digest of a step's arguments from their JSON bytes ``raw``.

        ``x:`` hashes the bytes themselves; arguments that may hold a secret
        hash their redacted form with kind-only handles instead (``r:``), the
        same in every process, so that no stored digest is a hash of a secret.
        Every secret hashes as ``$CRED{}`` there, registered or detected, live or
        a handle read back unresolved: the digest of a replayed value is the
        digest of the live value it stands for.
        """
        if not self.redactor.may_hold_secret(raw):
            return raw_digest(raw)
        redacted = self.redactor.redact_json(raw, self.load_tree(raw, "arguments"), _dump, True)
        return "r:" + hashlib.blake2b(redacted, digest_size=8).hexdigest()

    def pack_step(self, body: dict[str, Any], args: bytes) -> bytes:
        """``pack_tree(body)`` after setting ``body["a"]`` to ``args_digest(args)``.

        The per-step path: one secret scan over the arguments and the record
        together answers both "may the arguments hold a secret" and "may the
        record" when neither can (and, for a record with an error or metadata,
        the high-entropy rule over their text) (the test finds a superset of matches, and a
        match inside either part is a match in the two joined). The digest
        (``x:`` and hex digits) is then spliced into the record's JSON as its
        last key instead of serializing the record again.
        """
        data = _dump(body)
        red = self.redactor
        if red.enabled and (
            red._maybe(b"\n".join((args, data)))
            # a recorded error or metadata: text for people, where the entropy rule applies too
            or (("e" in body or "m" in body) and red._people_hit(body, self._people(body), _dump))
        ):
            body["a"] = self.args_digest(args)
            return self.pack_tree(body)
        digest = raw_digest(args)
        body["a"] = digest
        return self.seal(b"".join((memoryview(data)[:-1], b',"a":"', digest.encode(), b'"}')))

    def unpack_tree(self, blob: bytes, path: str = "value") -> Any:
        return self.load_tree(self.open(blob, path), path)
