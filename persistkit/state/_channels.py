"""The storage model of state channels: what a checkpoint writes (``_tracker.Tracker``
writes it), and how it is read back (:class:`Loader`).

Each checkpoint holds one *ref* per channel:

``{"i": tree}``
    a small value (≤ ``INLINE_LIMIT`` bytes serialized) inline in the record.
``{"b": "v:<hash>"}``
    a value stored once as a blob keyed by its content hash: an unchanged
    channel references the same blob again and writes nothing.
``{"l": tip, "n": length, "g": generation}``
    a list stored as a chain of *segments*: each segment holds the items
    appended since the previous checkpoint and a link ``p`` to the segment
    before it. Appending 1 KB to a 5 MB list writes a ~1 KB segment. A list
    changed any other way starts a new chain (a new generation).

Where a segment lives: the items appended by a step travel *inside that
step's checkpoint row* (payload key ``sg``), so a step is one row write — no
blob row, no extra index entry, no extra request. ``tip`` and ``p`` are then
checkpoint ids. The first segment of a long list (a new generation with
more than ``INLINE_SEGMENT_ITEMS`` items) is a content-addressed blob keyed
``s:<channel>:<generation>:<start>:<hash>``, so listing history never drags
a whole history along; the chain is walked from its tip through the ``p``
links, reading rows newest-first in pages and blobs in one range read.

An appended item that is a copy of the parent checkpoint's result (the step
returned it, the caller appended it) is stored as a reference to that result
(``_dedupe``): ``ri`` in the segment lists which items are references.

*Spans* keep a long chain cheap to read. A chain of thousands of row segments
would cost a decompression and a JSON parse per row on every load; so once the
inline segments written since the chain's newest blob segment number
``_tracker.SPAN_SEGMENTS``, the checkpoint that would write the next one writes a blob
segment instead (``s:`` key, like a first segment), holding those segments'
items and its own and linking to the segment before them. The rows keep their
own segments (each older checkpoint still loads through them); the chains of
later checkpoints reach back through a few large blobs and at most
``SPAN_SEGMENTS`` rows. Only small segments are gathered (a span holds at most
``SPAN_BYTES``): beside many bytes, a row's own cost is small. The price: the
items of a long list of small appends are stored twice (in their rows and in a
span) until retention prunes the rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import compress, repeat
from operator import contains
from typing import Any
from urllib.parse import quote

from .._errors import IntegrityError, PersistkitError, SchemaVersionError, SerializationError
from .._io import Plan, call
from ..backends import CheckpointRow
from ..codec._pipeline import Codec, _dump
from ..secrets._redact import escape_tree
from ..secrets._registry import _generation
from ._dedupe import resolve, result_blob, wanted
from ._records import Record
from ._segments import SegmentCache, Segments
from ._spec import TrackedList

__all__ = ["INLINE_LIMIT", "Diff", "Loader"]

#: Values whose serialized form is at most this many bytes live inside the record.
INLINE_LIMIT = 96
#: A new list chain with more items than this starts with a blob segment.
INLINE_SEGMENT_ITEMS = 64
#: Rows read per page when walking a segment chain back through a thread.
_ROW_PAGE = 512
#: What a kept segment costs beside its items' JSON (its tuple, list and keys), in bytes.
_SEGMENT_OVERHEAD = 256
#: The first page when the store has kept the thread's older segments (``_segments``): the
#: rows since the last turn are few; each further page of the same walk is twice as long.
_SHORT_PAGE = 32


def _is_blob_key(key: str) -> bool:
    return key.startswith("s:")


def _after(checkpoint_id: str) -> str:
    """The smallest id sorting after ``checkpoint_id`` (``list(before=...)`` is exclusive)."""
    return format(int(checkpoint_id, 16) + 1, f"0{len(checkpoint_id)}x")


@lru_cache(maxsize=1024)
def _qname(name: str) -> str:
    return quote(name, safe="") or "%00"


def seg_range(name: str, gen: int) -> tuple[str, str]:
    base = f"s:{_qname(name)}:{gen:06d}"
    return base + ":", base + ";"  # ';' sorts right after ':'


def _seg_key(name: str, gen: int, start: int, digest: str) -> str:
    return f"s:{_qname(name)}:{gen:06d}:{start:010d}:{digest}"


def root_key(name: str, checkpoint_id: str) -> str:
    """The blob that stands for the segment of list ``name`` in row ``checkpoint_id`` and
    every segment before it: written by retention (``ops/_retention``) before it deletes
    rows a kept list still links to, read only when that row (or a row whose result the
    segment refers to) is gone. Its tree is a segment that starts at 0 and links nowhere."""
    return f"l:{_qname(name)}:{checkpoint_id}"


#: A committed value not kept (its type is not immutable: see ``_tracker``).
_NO_OBJ = object()


@dataclass(slots=True)
class _ValuePrev:
    ref: dict[str, Any]
    digest: str
    obj: Any = _NO_OBJ  # the committed value, when its type is in _IMMUTABLE
    gen: int = -1  # the secret registry's generation it was redacted under
    data: bytes | None = None  # the JSON of its tree before redaction: the next commit's change mark

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is the immutable value committed last, stored as redaction
        would store it now: a secret registered since then must be redacted from it."""
        return self.obj is value and self.gen == _generation[0]


@dataclass(slots=True, frozen=True)
class _Inline:
    """An inline segment written since the chain's newest blob segment (what a span gathers)."""

    key: str  # its checkpoint id
    prev: str | None  # the segment before it
    start: int
    trees: list[Any]
    size: int  # its items' serialized bytes
    stored: bool  # trees in stored form (read back), not as this process encoded them
    upto: int  # the bytes of the inline segments gathered up to this one (see _tracker._gather)


@dataclass(slots=True)
class _ListPrev:
    ref: dict[str, Any]
    n: int
    tip: str | None
    gen: int
    last_tree: Any  # encoded tree of the newest committed item (None: empty list)
    obj: list[Any] | None = None  # identity mode: the live TrackedList committed last
    items: list[Any] | None = None  # compare mode: the committed items (shallow)
    last_raw: bytes | None = None  # orjson bytes of the newest item, when it is plain JSON
    recent: tuple[_Inline, ...] = ()  # inline segments since the chain's newest blob segment


_Prev = _ValuePrev | _ListPrev


@dataclass(slots=True)
class Diff:
    """Refs and new blobs for one checkpoint, and what the tracker learns if it commits."""

    refs: dict[str, dict[str, Any]]
    blobs: dict[str, bytes]
    segments: dict[str, dict[str, Any]]  # inline segments: go into the row's ``sg``
    prev: dict[str, _Prev]
    was_dirty: list[TrackedList]
    appended: dict[str, list[Any]]  # per list written: the item objects its new segment holds
    #: per list written: the tip it continues (None: a new chain), and, for a segment written
    #: as a blob, that segment (link, start, item trees in stored form)
    links: dict[str, str | None] = field(default_factory=dict)
    spans: dict[str, tuple[str | None, int, list[Any]]] = field(default_factory=dict)


def _handle_free(strings: list[str]) -> bool:
    """Whether no string holds a secret handle (``$CRED{``): looked for as "$" first, a memchr
    (most text has none), then as the whole marker in the strings that have one."""
    with_dollar = compress(strings, map(contains, strings, repeat("$")))
    return not any("$CRED{" in s for s in with_dollar)


class Loader:
    """Fetches and decodes channel values of one thread, caching what it has read.

    What it keeps is bounded by what a replay still needs, not by how long the thread
    is: a list is cached once per chain as its items and the end of each segment
    (``chains``); rows read while walking a chain leave their segments behind
    (``raw``), not their bodies; a run's own commits extend that cache with the items
    they committed (:meth:`landed`) instead of keeping each checkpoint's body.

    ``segments``: the store's :class:`~persistkit.state._segments.SegmentCache` (a run's
    loader): a chain's walk takes the segments earlier turns read from there, reads only
    what is newer, and leaves there what it read from the store.
    """

    def __init__(
        self, codec: Codec, thread_id: str, namespace: str = "", segments: SegmentCache | None = None
    ) -> None:
        self.codec = codec
        self.thread_id = thread_id
        self.namespace = namespace
        self._cache = segments
        self._kept: Segments | None = None  # the cache's segments of this thread, once looked up
        self._page = _ROW_PAGE
        self._read_rows: set[str] = set()  # checkpoint ids of rows read back from the store
        self._ours: set[str] = set()  # segment keys `landed` put in raw (live trees: never kept)
        self.blobs: dict[str, bytes] = {}
        #: checkpoint id -> decoded payload: records handed in (``add``), rows whose result a
        #: segment refers to or whose segment refers to one, and the run's newest commit.
        self.rows: dict[str, dict[str, Any]] = {}
        self.complete: set[tuple[str, str]] = (
            set()
        )  # (channel, segment) with its whole chain cached
        self.raw: dict[tuple[str, str], tuple[str | None, int, list[Any]]] = {}
        # (name, gen, plain) -> (items of a chain, {segment key: end index}); only ever extended
        self.chains: dict[tuple[str, int, bool], tuple[list[Any], dict[str, int]]] = {}
        self._need: set[str] = set()  # rows whose result a segment read so far refers to
        self._top: str | None = (
            None  # the run's newest commit (kept in rows: an outbox done mark copies it)
        )
        self._keep: set[str] = set()  # commits whose body a segment still needs (see landed)
        self._live: dict[str, dict[str, Any]] = {}  # bodies in rows this process committed (see _stored)

    def add(self, records: Iterable[Record | None]) -> None:
        """Records already read (they may hold inline segments)."""
        for rec in records:
            if rec is not None:
                self.rows[rec.id] = rec.body
                if not rec.live:
                    self._read_rows.add(rec.id)

    def _ingest(self, page: Iterable[CheckpointRow]) -> None:
        """Rows read while walking a chain, newest first: keep their segments, not their bodies.

        A segment whose items refer to a step's result (``_dedupe``: always its row's parent,
        the next row read) is resolved as soon as that row is read; one whose parent is not
        in the page (or whose result is a blob, or that is malformed) keeps its row's body
        for ``_raw``, as does a row whose result such a segment refers to."""
        waiting: dict[str, list[tuple[str, CheckpointRow, dict[str, Any]]]] = {}
        for row in page:
            cid = row.checkpoint_id
            if cid in self.rows:
                continue
            body = Record.decode(self.codec, row, walked=True).body
            self._read_rows.add(cid)
            for name, child, child_body in waiting.pop(cid, ()):
                if result_blob(body) is None and body.get("k") == "step" and "r" in body:
                    try:
                        seg = resolve(
                            child_body["sg"][name],
                            {cid: body},
                            self.thread_id,
                            name,
                            child.checkpoint_id,
                            self._result_tree,
                        )
                    except (
                        SerializationError,
                        IntegrityError,
                    ):  # reported if the chain is walked (_raw)
                        seg = None
                    tup = _segment(seg)
                    if tup is not None:
                        self.raw[(name, child.checkpoint_id)] = tup
                        continue
                self.rows[child.checkpoint_id] = child_body  # _raw resolves (or reports) it
                self._need.add(cid)
            keep = cid in self._need
            for name, seg in (body.get("sg") or {}).items():
                ri = type(seg) is dict and "ri" in seg
                tup = _segment(seg) if not ri else None
                refs = wanted(body, name, {}) if ri else []
                if tup is not None:
                    self.raw.setdefault((name, cid), tup)
                elif len(set(refs)) == 1 and refs[0] == row.parent_id and refs[0] not in self.rows:
                    waiting.setdefault(refs[0], []).append((name, row, body))
                else:  # malformed, or refers to a row already read: _raw reads it from the body
                    keep = True
                    self._need.update(refs)
            if keep:
                self.rows[cid] = body
        for parent, children in waiting.items():  # the parent is on the next page: read by id
            self._need.add(parent)
            for _, child, child_body in children:
                self.rows[child.checkpoint_id] = child_body

    def landed(self, checkpoint_id: str, body: dict[str, Any], diff: Diff) -> None:
        """The run committed ``body`` as ``checkpoint_id``: keep what a later replay in this
        run may need of it. Each list segment it wrote extends the cached chain it continues,
        with the item objects committed (items are immutable once committed; the newest one,
        which may still be edited in place, as a decoded copy of the tree stored). A segment
        that continues no cached chain (a replay restored an earlier state, then the run went
        another way) is kept as its items' trees, so that walking back to it still works."""
        for name, new in diff.appended.items():
            ref, seg, span = diff.refs[name], diff.segments.get(name), diff.spans.get(name)
            tip, n, gen = ref["l"], ref["n"], ref["g"]
            start = n - len(new)
            prev = diff.links[name]
            now = diff.prev[name]
            last = now.last_tree if isinstance(now, _ListPrev) else None
            chain = self.chains.get((name, gen, False))
            fresh = start == 0 and chain is None
            extends = (
                chain is not None
                and start == len(chain[0])
                and prev is not None
                and chain[1].get(prev) == start
            )
            items = self._committed(new, last) if fresh or extends else None
            if items is not None and chain is None:
                self.chains[(name, gen, False)] = (items, {tip: n})
            elif items is not None and chain is not None:
                chain[0].extend(items)
                chain[1][tip] = n
            elif span is not None:  # a blob segment (a long first one, or a span): by its key
                self.raw[(name, tip)] = span
                self._ours.add(tip)
            elif seg is not None and "ri" not in seg:
                self.raw[(name, checkpoint_id)] = (prev, start, self._stored(seg["i"]))
                self._ours.add(checkpoint_id)
            else:  # its items refer to the parent's result: keep both bodies (_raw resolves them)
                self._keep.add(checkpoint_id)
                if prev is not None:
                    self._keep.update(wanted(body, name, {}))
        if self._top is not None and self._top not in self._keep:
            self.rows.pop(self._top, None)
            self._live.pop(self._top, None)
        self.rows[checkpoint_id] = self._live[checkpoint_id] = body
        self._top = checkpoint_id

    def _stored(self, trees: Any) -> Any:
        """Trees of live values (as this process encoded them, not as stored) with their text
        escaped as stored (``escape_tree``), for the decoders of stored trees: in a live tree
        a ``$CRED{`` someone typed is not escaped, and would read back as a handle."""
        return escape_tree(trees) if self.codec.redactor.enabled else list(trees)

    def committed_here(self, checkpoint_id: str) -> bool:
        """Whether ``rows`` holds ``checkpoint_id``'s body as this process committed it (live
        values, see :meth:`landed`) rather than as read back from the store (stored form)."""
        return checkpoint_id == self._top

    def _committed(self, new: list[Any], last_tree: Any) -> list[Any] | None:
        """The items a commit appended, the newest as a copy of its stored tree; None if that
        tree does not decode here (the segment is then kept as trees, see :meth:`landed`)."""
        try:
            return [*new[:-1], self.codec.decode(last_tree, live=True)] if new else []
        except PersistkitError:  # the commit landed: never fail it here
            return None

    def fetch(self, refs: Iterable[dict[str, dict[str, Any]]]) -> Plan[None]:
        """Read every blob, row and segment chain the given checkpoint refs need (batched)."""
        want: set[str] = set()
        lists: list[tuple[str, dict[str, Any]]] = []
        for channel_refs in refs:
            for name, ref in channel_refs.items():
                if "b" in ref and ref["b"] not in self.blobs:
                    want.add(ref["b"])
                elif "l" in ref and ref["l"] is not None:
                    lists.append((name, ref))
        if want:
            got = yield call("get_blobs", self.thread_id, sorted(want))
            missing = want - set(got)
            if missing:
                raise IntegrityError(
                    f"thread {self.thread_id!r}: {len(missing)} stored value(s) referenced by a "
                    f"checkpoint are missing (e.g. {min(missing)}); the store lost data or was edited"
                )
            self.blobs.update(got)
        for name, ref in lists:
            yield from self._fetch_chain(name, ref["l"], ref["g"])

    def _fetch_chain(self, name: str, key: str | None, gen: int) -> Plan[None]:
        used = yield from self._walk_chain(name, key, self._kept_segments())
        if used:  # a kept segment links to rows pruned since it was kept: walk the store itself
            assert self._cache is not None
            self._cache.forget(self.thread_id)
            for k in used:
                self.raw.pop((name, k), None)
            self._kept, self._page = {}, _ROW_PAGE
            yield from self._walk_chain(name, key, None)

    def _walk_chain(self, name: str, key: str | None, kept: Segments | None) -> Plan[list[str]]:
        """Walk the chain from ``key`` back, reading what is neither here nor ``kept``; the
        keys taken from ``kept`` if the walk then met a segment that is gone (pruned since
        they were kept: the caller walks again without them), else []."""
        walked: dict[str, None] = {}  # ordered, and a loop is found in O(1)
        used: list[str] = []
        blobs_read: set[str] = set()
        while key is not None and (name, key) not in self.complete:
            if (name, key) not in self.raw and kept is not None and (name, key) in kept:
                self.raw[(name, key)] = kept[(name, key)]  # read by an earlier turn
                used.append(key)
            if _is_blob_key(key):  # one read per blob: a long chain's spans are read one at a time
                if (name, key) not in self.raw and key not in self.blobs:
                    self.blobs.update((yield call("get_blobs", self.thread_id, [key])))
                if key in self.blobs:
                    blobs_read.add(key)
                    self._raw(name, key)
                    del self.blobs[key]  # parsed into raw: not kept twice
            elif (name, key) not in self.raw and key not in self.rows:
                try:
                    before = _after(key)
                except ValueError as exc:
                    raise IntegrityError(
                        f"thread {self.thread_id!r}: list channel {name!r} links to {key!r}, "
                        "which is not a checkpoint id; the store was edited"
                    ) from exc
                page = yield call(
                    "list", self.thread_id, self.namespace, before=before, limit=self._page
                )
                self._page = min(self._page * 2, _ROW_PAGE)
                self._ingest(page)
                if (name, key) not in self.raw and key not in self.rows:  # pruned: rooted again
                    yield from self._rooted(name, key)
            if not _is_blob_key(key) and (name, key) not in self.raw:
                # items stored as the result of another row: read from that row on (a page: the
                # rows after it are the chain's next segments, most referring to their parents)
                for ref in wanted(self.rows.get(key), name, self.rows):
                    try:
                        before = _after(ref)
                    except ValueError:
                        continue  # not a checkpoint id: _raw reports the segment as malformed
                    self._need.add(ref)
                    page = yield call(
                        "list", self.thread_id, self.namespace, before=before, limit=self._page
                    )
                    self._page = min(self._page * 2, _ROW_PAGE)
                    self._ingest(page)
                for ref in wanted(
                    self.rows.get(key), name, {}
                ):  # and a result over the inline limit: its blob
                    big = result_blob(self.rows.get(ref))
                    if big is not None and big not in self.blobs:
                        self.blobs.update((yield call("get_blobs", self.thread_id, [big])))
                if wanted(self.rows.get(key), name, self.rows):  # a row it refers to was pruned
                    yield from self._rooted(name, key)
            if key in walked:
                raise IntegrityError(
                    f"thread {self.thread_id!r}: list channel {name!r} has a segment chain that "
                    f"loops back to {key}; the store was edited"
                )
            if used and (name, key) not in self.raw and key not in (self.blobs if _is_blob_key(key) else self.rows):
                return used
            walked[key] = None
            key = self._raw(name, key)[0]
        self.complete.update((name, k) for k in walked)
        if self._cache is not None and not self._cache.oversized(self.namespace, self.thread_id):
            self._leave(name, walked, kept, blobs_read)
        return []

    def _kept_segments(self) -> Segments | None:
        """The segments the store kept of this thread (looked up once per loader); with some,
        the walk's first page of rows is short (those since the last turn)."""
        if self._cache is not None and self._kept is None:
            self._kept = self._cache.segments(self.namespace, self.thread_id) or {}
            if self._kept:
                self._page = _SHORT_PAGE
        return self._kept

    def _leave(self, name: str, walked: Iterable[str], kept: Segments | None, blobs_read: set[str]) -> None:
        """Leave in the store's cache the segments of a walked chain that were read back from
        the store here (a row's or a blob's), none of this run's own."""
        assert self._cache is not None
        found: dict[tuple[str, str], tuple[tuple[Any, int, list[Any]], int]] = {}
        total = 0
        for key in walked:
            seg = self.raw.get((name, key))
            if seg is None or key in self._ours or (kept is not None and (name, key) in kept):
                continue
            if key in blobs_read if _is_blob_key(key) else key in self._read_rows:
                size = len(_dump(seg[2])) + _SEGMENT_OVERHEAD  # of the order of what it holds in memory
                total += size
                if total > self._cache.limit:  # the cache would not keep it: stop measuring
                    self._cache.too_big(self.namespace, self.thread_id)
                    return
                found[(name, key)] = (seg, size)
        self._cache.add(self.namespace, self.thread_id, found)

    def recent(self, name: str, tip: str | None, limit: int) -> tuple[_Inline, ...]:
        """The inline segments of the chain ending at ``tip`` after its newest blob segment
        (at most ``limit``), oldest first, as read (after :meth:`fetch`): what the next
        span gathers."""
        found: list[tuple[str, str | None, int, list[Any]]] = []
        key = tip
        while key is not None and not _is_blob_key(key) and len(found) < limit:
            seg = self.raw.get((name, key))
            if seg is None:  # not read here: the next span starts after it
                break
            prev, start, trees = seg
            found.append((key, prev, start, trees))
            key = prev
        out, upto = [], 0
        for key, prev, start, trees in reversed(found):
            size = len(_dump(trees))
            upto += size
            out.append(_Inline(key, prev, start, trees, size, stored=True, upto=upto))
        return tuple(out)

    def segment_keys(self, name: str, ref: dict[str, Any]) -> list[str]:
        """The segment keys of a list ref's chain, oldest first (fetched first with :meth:`fetch`)."""
        return [] if ref["l"] is None else self._walk(name, ref["l"], ref["n"], {})[0]

    def segment_trees(self, name: str, key: str) -> list[Any]:
        """The item trees of one segment, references to other rows' results resolved."""
        return self._raw(name, key)[2]

    def _rooted(self, name: str, key: str) -> Plan[None]:
        """Stand the list's rooted copy (``root_key``), if retention wrote one, for the
        segment ``key`` and all before it; without one, reading the segment reports it missing."""
        rk = root_key(name, key)
        if rk not in self.blobs:
            self.blobs.update((yield call("get_blobs", self.thread_id, [rk])))
        if rk in self.blobs:
            tree = self.codec.unpack_tree(self.blobs[rk], f"state.{name}")
            if (
                type(tree) is not dict
                or tree.get("p") is not None
                or tree.get("s") != 0
                or type(tree.get("i")) is not list
            ):
                raise SerializationError(f"the rooted list {rk} is malformed", path=f"state.{name}")
            self.raw[(name, key)] = (None, 0, tree["i"])

    def value(self, name: str, ref: dict[str, Any], plain: bool = False, live: bool = False) -> Any:
        """A freshly decoded value for a channel ref (the caller may mutate it).

        ``plain``: models and dataclasses as dicts, for a state migration. ``live``: the ref
        is of a record this process committed (``Record.live``): an inline value is a live tree."""
        path = f"state.{name}"
        try:
            if "i" in ref:
                return self.codec.decode(ref["i"], path, plain=plain, live=live)
            if "b" in ref:
                return self.codec.decode(
                    self.codec.unpack_tree(self.blobs[ref["b"]], path), path, plain=plain
                )
        except SchemaVersionError as exc:
            raise SchemaVersionError(f"thread {self.thread_id!r}: {exc}") from exc.__cause__
        return TrackedList(self.list_items(name, ref, plain))

    def list_items(self, name: str, ref: dict[str, Any], plain: bool = False) -> list[Any]:
        """The items of a list ref. Item objects are shared with the cache: treat as read-only.

        Built in one pass: the chain is walked back from the tip only to the newest segment
        the cached chain already holds, and its items are decoded straight into one list."""
        tip, n, gen = ref["l"], ref["n"], ref["g"]
        if tip is None:
            return []
        chain = self.chains.get((name, gen, plain))
        if chain is not None and chain[1].get(tip) == n:
            return chain[0][:n]
        keys, base, segs = self._walk(name, tip, n, chain[1] if chain is not None else {})
        extends = chain is not None and base == len(chain[0])
        if extends:
            assert chain is not None
            items, ends = chain  # extended in place: every slice handed out is a copy
        else:
            items = chain[0][:base] if chain is not None and base else []
            ends = (
                {k: e for k, e in chain[1].items() if e <= base}
                if chain is not None and base
                else {}
            )
        trees: list[Any] = []  # every new segment's item trees, decoded in one pass below
        for key, seg in zip(keys, segs, strict=True):
            trees.extend(seg)
            ends[key] = base + len(trees)
        items.extend(self._decode(name, trees, base, plain))
        if chain is None:  # another branch of a cached chain (a replay went another way) is not
            self.chains[(name, gen, plain)] = (items, ends)
        return items[:n]

    def _raw(self, name: str, key: str) -> tuple[str | None, int, list[Any]]:
        """The (previous link, start, item trees) of a segment, from a blob or a row."""
        seg = self.raw.get((name, key))
        if seg is not None:
            return seg
        path = f"state.{name}"
        if _is_blob_key(key):
            blob = self.blobs.get(key)
            tree = None if blob is None else self.codec.unpack_tree(blob, path)
        else:
            body = self.rows.get(key)
            tree = None if body is None else (body.get("sg") or {}).get(name)
            rows: dict[str, Any] = self.rows
            if type(tree) is dict and self._live:  # trees a commit of this process holds: as stored
                if body is self._live.get(key) and type(tree.get("i")) is list:
                    tree = {**tree, "i": self._stored(tree["i"])}
                if "ri" in tree:
                    rows = {c: self._live_row(c) for c in wanted(body, name, {}) if c in self.rows}
            if type(tree) is dict and "ri" in tree:
                tree = resolve(tree, rows, self.thread_id, name, key, self._result_tree)
        if tree is None:
            raise IntegrityError(
                f"thread {self.thread_id!r}: list channel {name!r} is missing its segment {key}; "
                "the store lost data or was edited"
            )
        try:
            prev, start, trees = tree["p"], tree["s"], tree["i"]
            if not (
                isinstance(start, int)
                and isinstance(trees, list)
                and (prev is None or isinstance(prev, str))
            ):
                raise TypeError("bad segment fields")
        except (KeyError, TypeError) as exc:
            raise SerializationError(f"segment {key} is malformed", path=path) from exc
        seg = (prev, start, trees)
        self.raw[(name, key)] = seg
        return seg

    def _live_row(self, cid: str) -> dict[str, Any]:
        """The body of ``cid`` in ``rows``, its result's text escaped as stored if this process committed it."""
        body = self.rows[cid]
        return {**body, "r": self._stored(body["r"])} if body is self._live.get(cid) and "r" in body else body

    def _result_tree(self, key: str) -> Any:
        """The tree of a step's result stored as the blob ``key`` (a list item may refer to it)."""
        blob = self.blobs.get(key)
        if blob is None:
            raise IntegrityError(
                f"thread {self.thread_id!r}: a list item is stored as a step's result, whose stored "
                f"value {key} is missing; the store lost data or was edited"
            )
        return self.codec.unpack_tree(blob, f"result {key}")

    def _decode(self, name: str, trees: list[Any], start: int, plain: bool) -> list[Any]:
        """The items of ``trees``, list items ``start``... of channel ``name``."""
        if not plain and set(map(type, trees)) <= {str} and _handle_free(trees):
            return trees  # a string without a handle decodes to itself (the common message list)
        decode = self.codec.decode
        try:  # the items as one list
            items: list[Any] = decode(trees, plain=plain)
            return items
        except (
            SerializationError,
            SchemaVersionError,
        ):  # item by item, for the error that names the item
            try:
                return [
                    decode(t, f"state.{name}[{start + i}]", plain=plain)
                    for i, t in enumerate(trees)
                ]
            except SchemaVersionError as exc:
                raise SchemaVersionError(f"thread {self.thread_id!r}: {exc}") from exc.__cause__

    def _walk(
        self, name: str, tip: str, n: int, cached: dict[str, int]
    ) -> tuple[list[str], int, list[list[Any]]]:
        """Segment keys of the chain ending at ``tip``, oldest first, checked for gaps, back to
        the newest one ``cached`` (segment key -> end) holds; where that one ends (0: none);
        and each segment's item trees."""
        keys: list[str] = []
        segs: list[list[Any]] = []
        key: str | None = tip
        end = n
        while key is not None:
            if cached.get(key) == end:
                break
            prev, start, items = self._raw(name, key)
            if start + len(items) != end or start < 0 or len(keys) > n + 1:
                raise IntegrityError(
                    f"thread {self.thread_id!r}: list channel {name!r} has a broken segment chain "
                    f"at {key} (covers {start}..{start + len(items)}, expected to end at {end})"
                )
            keys.append(key)
            segs.append(items)
            end = start
            key = prev
        if key is None and end != 0:
            raise IntegrityError(
                f"thread {self.thread_id!r}: list channel {name!r} segment chain does not start at 0"
            )
        keys.reverse()
        segs.reverse()
        return keys, end if key is not None else 0, segs


def _segment(seg: Any) -> tuple[str | None, int, list[Any]] | None:
    """(previous link, start, item trees) of a stored segment, or None when it is malformed."""
    if type(seg) is not dict:
        return None
    prev, start, trees = seg.get("p"), seg.get("s"), seg.get("i")
    if not (
        isinstance(start, int)
        and isinstance(trees, list)
        and (prev is None or isinstance(prev, str))
    ):
        return None
    if "p" not in seg:
        return None
    return prev, start, trees
