"""The storage model of state channels: what a checkpoint writes, and how it is read back.

Each checkpoint holds one *ref* per channel:

``{"i": tree}``
    a small value (≤ ``INLINE_LIMIT`` bytes serialized) inline in the record.
``{"b": "v:<hash>"}``
    a value stored once as a blob keyed by its content hash: an unchanged
    channel references the same blob again and writes nothing.
``{"l": tip, "n": length, "g": generation}``
    a list stored as a chain of *segments*: each segment blob holds the items
    appended since the previous checkpoint and the key of the segment before
    it. Appending 1 KB to a 5 MB list writes a ~1 KB segment. A list changed
    any other way starts a new chain (a new generation) with one segment.

Segment keys are ``s:<channel>:<generation>:<start>:<hash>`` so that all
segments of one chain come back in one ``scan_blobs`` range read; the chain
is then walked from its tip through the ``p`` (previous) links, which also
makes it correct if several chains share a range.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import quote

from ._codec import Codec, content_hash
from ._errors import IntegrityError, SerializationError
from ._io import Plan, call
from ._state import TrackedList

__all__ = ["INLINE_LIMIT", "Loader", "Tracker"]

#: Values whose serialized form is at most this many bytes live inside the record.
INLINE_LIMIT = 96


@lru_cache(maxsize=1024)
def _qname(name: str) -> str:
    return quote(name, safe="") or "%00"


def seg_range(name: str, gen: int) -> tuple[str, str]:
    base = f"s:{_qname(name)}:{gen:06d}"
    return base + ":", base + ";"  # ';' sorts right after ':'


def _seg_key(name: str, gen: int, start: int, digest: str) -> str:
    return f"s:{_qname(name)}:{gen:06d}:{start:010d}:{digest}"


@dataclass(slots=True)
class _ValuePrev:
    ref: dict[str, Any]
    digest: str


@dataclass(slots=True)
class _ListPrev:
    ref: dict[str, Any]
    n: int
    tip: str | None
    gen: int
    last_tree: Any  # encoded tree of the newest committed item (None: empty list)
    obj: list[Any] | None = None  # identity mode: the live TrackedList committed last
    items: list[Any] | None = None  # compare mode: the committed items (shallow)


_Prev = _ValuePrev | _ListPrev


@dataclass(slots=True)
class Diff:
    """Refs and new blobs for one checkpoint, and what the tracker learns if it commits."""

    refs: dict[str, dict[str, Any]]
    blobs: dict[str, bytes]
    prev: dict[str, _Prev]
    was_dirty: list[TrackedList]


class Tracker:
    """Remembers what the thread head holds per channel and diffs the live state against it."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.prev: dict[str, _Prev] = {}
        self.known: set[str] = set()

    def reset(self, refs: dict[str, dict[str, Any]], loader: Loader) -> None:
        """Start from a stored checkpoint's refs (the thread head)."""
        self.prev = {}
        for name, ref in refs.items():
            if "l" in ref:
                items = loader.list_items(name, ref)
                self.prev[name] = _ListPrev(
                    ref, ref["n"], ref["l"], ref["g"], loader.last_tree(name, ref), items=items
                )
            else:
                self.prev[name] = _ValuePrev(ref, _ref_digest(self.codec, ref))
                if "b" in ref:
                    self.known.add(ref["b"])

    def detach(self, name: str) -> None:
        """The live list of ``name`` is about to be rewritten in place (replay): stop trusting identity."""
        p = self.prev.get(name)
        if isinstance(p, _ListPrev) and p.obj is not None:
            p.items, p.obj = list(p.obj[: p.n]), None

    def diff(self, channels: dict[str, Any]) -> Diff:
        d = Diff({}, {}, {}, [])
        for name, value in channels.items():
            if isinstance(value, list):
                self._diff_list(name, value, d)
            else:
                self._diff_value(name, value, d)
        return d

    def committed(self, d: Diff) -> None:
        self.prev = d.prev
        self.known.update(k for k in d.blobs if k.startswith("v:"))

    def failed(self, d: Diff) -> None:
        """The write of ``d`` did not happen: lists it cleaned are dirty again."""
        for lst in d.was_dirty:
            lst._pk_dirty = True

    # -- per channel ---------------------------------------------------------------

    def _diff_value(self, name: str, value: Any, d: Diff) -> None:
        tree = self.codec.encode(value, f"state.{name}")
        text = self.codec.dump_tree(tree)
        digest = content_hash(text)
        p = self.prev.get(name)
        if isinstance(p, _ValuePrev) and p.digest == digest:
            d.refs[name], d.prev[name] = p.ref, p
            return
        if len(text) <= INLINE_LIMIT:
            ref: dict[str, Any] = {"i": tree}
        else:
            key = "v:" + digest
            ref = {"b": key}
            if key not in self.known:
                d.blobs[key] = self.codec.seal(text)
        d.refs[name], d.prev[name] = ref, _ValuePrev(ref, digest)

    def _diff_list(self, name: str, value: list[Any], d: Diff) -> None:
        p = self.prev.get(name)
        tracked = value if isinstance(value, TrackedList) else None
        if tracked is not None and tracked._pk_dirty:
            d.was_dirty.append(tracked)
        extends = False
        if isinstance(p, _ListPrev) and len(value) >= p.n:
            if p.obj is not None:
                extends = p.obj is value and tracked is not None and not tracked._pk_dirty
            elif p.items is not None:
                extends = (value == p.items) if len(value) == p.n else (value[: p.n] == p.items)
            if extends and p.n:
                # The newest committed item is the one most often edited in place.
                extends = self.codec.encode(value[p.n - 1], f"state.{name}[{p.n - 1}]") == p.last_tree
        if tracked is not None:
            tracked._pk_dirty = False
        if extends:
            assert isinstance(p, _ListPrev)
            if len(value) == p.n:
                d.refs[name] = p.ref
                d.prev[name] = _ListPrev(p.ref, p.n, p.tip, p.gen, p.last_tree, *_mode(value))
                return
            self._write_segment(name, value, p.n, p.tip, p.gen, d)
        else:
            gen = p.gen + 1 if isinstance(p, _ListPrev) else 1
            if not value:
                ref = {"l": None, "n": 0, "g": gen}
                d.refs[name] = ref
                d.prev[name] = _ListPrev(ref, 0, None, gen, None, *_mode(value))
                return
            self._write_segment(name, value, 0, None, gen, d)

    def _write_segment(
        self, name: str, value: list[Any], start: int, prev_tip: str | None, gen: int, d: Diff
    ) -> None:
        trees = [
            self.codec.encode(item, f"state.{name}[{start + i}]")
            for i, item in enumerate(value[start:])
        ]
        text = self.codec.dump_tree({"p": prev_tip, "s": start, "i": trees})
        key = _seg_key(name, gen, start, content_hash(text))
        d.blobs[key] = self.codec.seal(text)
        ref = {"l": key, "n": len(value), "g": gen}
        d.refs[name] = ref
        d.prev[name] = _ListPrev(ref, len(value), key, gen, trees[-1], *_mode(value))


def _mode(value: list[Any]) -> tuple[list[Any] | None, list[Any] | None]:
    """(obj, items) for a committed list: identity for tracked lists, a shallow copy otherwise."""
    if isinstance(value, TrackedList):
        return value, None
    return None, list(value)


def _ref_digest(codec: Codec, ref: dict[str, Any]) -> str:
    if "b" in ref:
        return str(ref["b"])[2:]
    return content_hash(codec.dump_tree(ref["i"]))


class Loader:
    """Fetches and decodes channel values for one thread, caching what it has read."""

    def __init__(self, codec: Codec, thread_id: str) -> None:
        self.codec = codec
        self.thread_id = thread_id
        self.blobs: dict[str, bytes] = {}
        self.scanned: set[tuple[str, int]] = set()
        self.segments: dict[str, tuple[str | None, int, list[Any]]] = {}
        # (name, gen) -> (items of the longest chain seen, {segment key: end index})
        self.chains: dict[tuple[str, int], tuple[list[Any], dict[str, int]]] = {}

    def fetch(self, refs: Iterable[dict[str, dict[str, Any]]]) -> Plan[None]:
        """Read every blob and segment chain the given checkpoint refs need (batched)."""
        want: set[str] = set()
        ranges: set[tuple[str, int]] = set()
        tips: list[tuple[str, str]] = []
        for channel_refs in refs:
            for name, ref in channel_refs.items():
                if "b" in ref and ref["b"] not in self.blobs:
                    want.add(ref["b"])
                elif "l" in ref and ref["l"] is not None:
                    tips.append((name, ref["l"]))
                    if (name, ref["g"]) not in self.scanned:
                        ranges.add((name, ref["g"]))
        if want:
            got = yield call("get_blobs", self.thread_id, sorted(want))
            missing = want - set(got)
            if missing:
                raise IntegrityError(
                    f"thread {self.thread_id!r}: {len(missing)} stored value(s) referenced by a "
                    f"checkpoint are missing (e.g. {min(missing)}); the store lost data or was edited"
                )
            self.blobs.update(got)
        for name, gen in sorted(ranges):
            start, stop = seg_range(name, gen)
            got = yield call("scan_blobs", self.thread_id, start, stop)
            self.blobs.update(got)
            self.scanned.add((name, gen))
        for name, tip in tips:
            if tip not in self.blobs:
                raise IntegrityError(
                    f"thread {self.thread_id!r}: list channel {name!r} is missing its segment {tip}; "
                    "the store lost data or was edited"
                )

    def value(self, name: str, ref: dict[str, Any]) -> Any:
        """A freshly decoded value for a channel ref (the caller may mutate it)."""
        path = f"state.{name}"
        if "i" in ref:
            return self.codec.decode(ref["i"], path)
        if "b" in ref:
            return self.codec.decode(self.codec.unpack_tree(self.blobs[ref["b"]], path), path)
        return TrackedList(self.list_items(name, ref))

    def list_items(self, name: str, ref: dict[str, Any]) -> list[Any]:
        """The items of a list ref. Item objects are shared with the cache: treat as read-only."""
        tip, n, gen = ref["l"], ref["n"], ref["g"]
        if tip is None:
            return []
        chain = self.chains.get((name, gen))
        if chain is not None and chain[1].get(tip) == n:
            return chain[0][:n]
        keys = list(self._walk(name, tip, n))
        items: list[Any] = []
        ends: dict[str, int] = {}
        for key in keys:
            items.extend(self.segments[key][2])
            ends[key] = len(items)
        if chain is None or len(items) >= len(chain[0]):
            self.chains[(name, gen)] = (items, ends)
        return items[:n]

    def last_tree(self, name: str, ref: dict[str, Any]) -> Any:
        """The stored tree of the newest item of a list ref (None for an empty list)."""
        tip = ref["l"]
        if tip is None:
            return None
        self._segment(name, tip)
        text = self.codec.open(self.blobs[tip], f"state.{name}")
        trees = self.codec.load_tree(text, f"state.{name}")["i"]
        return trees[-1] if trees else None

    def _segment(self, name: str, key: str) -> tuple[str | None, int, list[Any]]:
        seg = self.segments.get(key)
        if seg is not None:
            return seg
        path = f"state.{name}"
        blob = self.blobs.get(key)
        if blob is None:
            raise IntegrityError(
                f"thread {self.thread_id!r}: list channel {name!r} is missing segment {key}; "
                "the store lost data or was edited"
            )
        tree = self.codec.unpack_tree(blob, path)
        try:
            prev, start, trees = tree["p"], tree["s"], tree["i"]
            if not (isinstance(start, int) and isinstance(trees, list) and (prev is None or isinstance(prev, str))):
                raise TypeError("bad segment fields")
        except (KeyError, TypeError) as exc:
            raise SerializationError(f"segment {key} is malformed", path=path) from exc
        items = [self.codec.decode(t, f"{path}[{start + i}]") for i, t in enumerate(trees)]
        seg = (prev, start, items)
        self.segments[key] = seg
        return seg

    def _walk(self, name: str, tip: str, n: int) -> Iterator[str]:
        """Segment keys of the chain ending at ``tip``, oldest first, checked for gaps."""
        keys: list[str] = []
        key: str | None = tip
        end = n
        while key is not None:
            prev, start, items = self._segment(name, key)
            if start + len(items) != end or start < 0 or len(keys) > n + 1:
                raise IntegrityError(
                    f"thread {self.thread_id!r}: list channel {name!r} has a broken segment chain "
                    f"at {key} (covers {start}..{start + len(items)}, expected to end at {end})"
                )
            keys.append(key)
            end = start
            key = prev
        if end != 0:
            raise IntegrityError(
                f"thread {self.thread_id!r}: list channel {name!r} segment chain does not start at 0"
            )
        return reversed(keys)
