"""The writing side of the storage model (``_channels``): what a checkpoint writes per channel.

:class:`Tracker` remembers what the thread head holds per channel and diffs the live
state against it at each checkpoint: unchanged values are referenced again, lists
write only their appended items as a segment (inline in the row, or as a blob: a long
first segment, or a span gathering the small segments before it), and everything else
is written once, content-addressed. The reading side is ``_channels.Loader``.
"""

from __future__ import annotations

import time
from typing import Any

from .._errors import SerializationError
from .._ids import next_checkpoint_id
from ..backends import CheckpointRow
from ..backends._protocol import new_row
from ..codec._pipeline import Codec, _dump, _orjson, content_hash
from ..codec._sizes import large_value
from ..secrets._registry import _generation
from ._channels import (
    _NO_OBJ,
    INLINE_LIMIT,
    INLINE_SEGMENT_ITEMS,
    Diff,
    Loader,
    _Inline,
    _ListPrev,
    _Prev,
    _seg_key,
    _ValuePrev,
)
from ._dedupe import Result, refer
from ._spec import TrackedList

__all__ = ["Tracker"]

#: A span gathers the inline segments written since a chain's newest blob segment into one
#: blob once there are more than this many (spans, in the module docstring)...
SPAN_SEGMENTS = 256
#: ... holding at most this many bytes (serialized): larger segments are not gathered.
SPAN_BYTES = 8 << 20

#: Values that cannot change in place: one that is the very object committed last is
#: unchanged, so neither the pre-step check nor the commit serializes it again.
_IMMUTABLE = frozenset({str, int, float, bool, type(None), bytes})


# A cheap "was the newest item edited in place?" for plain-JSON items: datetimes,
# dataclasses, subclasses and the like raise, and take the typed comparison.
_RAW_OPTS = (
    _orjson.OPT_PASSTHROUGH_DATETIME
    | _orjson.OPT_PASSTHROUGH_DATACLASS
    | _orjson.OPT_PASSTHROUGH_SUBCLASS
    if _orjson is not None
    else 0
)


def _raw(item: Any) -> bytes | None:
    if _orjson is None:
        return None
    try:
        return _orjson.dumps(item, option=_RAW_OPTS)
    except (TypeError, _orjson.JSONEncodeError):
        return None


def _plain(value: Any) -> bool:
    """Whether orjson writes ``value``: a cheap "this is data" (the commit still encodes it
    and may refuse what orjson takes, e.g. an unsupported tzinfo). Subclasses of str,
    int, dict and list are left to the typed encoding, which refuses some of them."""
    if _orjson is None:
        return False
    try:
        _orjson.dumps(value, option=_orjson.OPT_PASSTHROUGH_SUBCLASS)
    except (TypeError, _orjson.JSONEncodeError):
        return False
    return True


class Tracker:
    """Remembers what the thread head holds per channel and diffs the live state against it."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.prev: dict[str, _Prev] = {}
        self.known: set[str] = set()

    def reset(
        self, refs: dict[str, dict[str, Any]], loader: Loader, new_lists: bool = False
    ) -> None:
        """Start from a stored checkpoint's refs (the thread head); with ``new_lists``
        (the head has another schema version) the next checkpoint starts every list anew."""
        self.prev = {}
        for name, ref in refs.items():
            if "l" in ref and new_lists:
                self.prev[name] = _ListPrev(
                    ref, ref["n"], ref["l"], ref["g"], None
                )  # neither obj nor items
            elif "l" in ref:
                items = loader.list_items(name, ref)
                # The newest item as this process encodes it (what a commit compares it with),
                # not the stored tree: a secret in it is a handle there, and the live value
                # would never match, rewriting the whole list at each run's first commit.
                last = (
                    self.codec.encode(items[-1], f"state.{name}[{len(items) - 1}]")
                    if items
                    else None
                )
                recent = loader.recent(name, ref["l"], SPAN_SEGMENTS)
                self.prev[name] = _ListPrev(
                    ref, ref["n"], ref["l"], ref["g"], last, items=items, recent=recent
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

    def diff(self, channels: dict[str, Any], checkpoint_id: str, lenient: bool = False) -> Diff:
        """Refs, blobs and inline segments for the checkpoint ``checkpoint_id`` about to be written.

        ``lenient`` (a failure's checkpoint, which must be recorded): a channel that
        cannot be serialized keeps the ref of its last stored value."""
        d = Diff({}, {}, {}, {}, [], {})
        for name, value in channels.items():
            try:
                if isinstance(value, list):
                    self._diff_list(name, value, d, checkpoint_id)
                else:
                    self._diff_value(name, value, d)
            except SerializationError:
                if not lenient:
                    raise
                p = self.prev.get(name)
                if p is not None:
                    d.refs[name], d.prev[name] = p.ref, p
                if isinstance(value, TrackedList):
                    value._pk_dirty = True  # still not stored: the next checkpoint tries again
        return d

    def precheck(self, channels: dict[str, Any]) -> None:
        """Raise the ``SerializationError`` the next checkpoint would, for what changed since
        the last one as far as it is cheap to tell (new list items; other values through
        orjson, then the typed encoding only where orjson refuses): run before a step's body."""
        for name, value in channels.items():
            p = self.prev.get(name)
            if isinstance(value, list):
                start = p.n if isinstance(p, _ListPrev) and len(value) >= p.n else 0
                if isinstance(value, TrackedList) and value._pk_dirty:
                    start = 0
                if start < len(value) and not _plain(value[start:]):
                    for i in range(start, len(value)):
                        self.codec.serializer.encode(value[i], path=f"state.{name}[{i}]")
            elif not (isinstance(p, _ValuePrev) and p.holds(value)) and not _plain(value):
                self.codec.encode(value, f"state.{name}")

    def checkpoint(
        self,
        channels: dict[str, Any],
        body: dict[str, Any],
        where: tuple[str, str, str | None, str | None],
        schema: Any,
        args: bytes | None = None,
        result: Result | None = None,
        lenient: bool = False,
    ) -> tuple[CheckpointRow, Diff]:
        """The row committing ``body`` (completed in place: segments, schema stamp,
        time, channel refs, and the digest of ``args``, a step's arguments as JSON
        bytes, if given) with these channel values, and their diff. Appended items
        that are copies of ``result``, the parent's result, are stored as
        references to it (``_dedupe``).

        ``where`` is (thread_id, namespace, parent checkpoint id, run id); the new
        id sorts after the parent's. The one place a checkpoint row is built: steps
        and run ends (``Run``), forks and state edits (``Store``).
        """
        thread_id, namespace, parent, run_id = where
        cid = next_checkpoint_id(parent)
        diff = self.diff(channels, cid, lenient)
        if diff.segments:
            if result is not None and result.checkpoint_id == parent:
                refer(diff.segments, result)
            body["sg"] = diff.segments
        body["sc"] = schema
        body["t"] = time.time()
        body["ch"] = diff.refs
        codec = self.codec
        payload = codec.pack_tree(body) if args is None else codec.pack_step(body, args)
        return new_row(thread_id, namespace, cid, parent, run_id, payload), diff

    def committed(self, d: Diff) -> None:
        self.prev = d.prev
        if d.blobs:
            self.known.update(k for k in d.blobs if k.startswith("v:"))

    def failed(self, d: Diff) -> None:
        """The write of ``d`` did not happen: lists it cleaned are dirty again."""
        for lst in d.was_dirty:
            lst._pk_dirty = True

    # -- per channel ---------------------------------------------------------------

    def _diff_value(self, name: str, value: Any, d: Diff) -> None:
        p = self.prev.get(name)
        if isinstance(p, _ValuePrev) and p.holds(value):  # the immutable value committed last
            d.refs[name], d.prev[name] = p.ref, p
            return
        tree = self.codec.encode(value, f"state.{name}")
        data = _dump(tree)
        obj = value if type(value) in _IMMUTABLE else _NO_OBJ
        if isinstance(p, _ValuePrev) and p.data == data and p.gen == _generation[0]:
            # The JSON committed last, under the same secrets: its stored form is the one the
            # head holds, so it is not redacted, sized, hashed nor written again.
            d.refs[name] = p.ref
            d.prev[name] = p if p.obj is obj else _ValuePrev(p.ref, p.digest, obj, p.gen, data)
            return
        text = self.codec.dump_tree(tree, data=data)
        if len(text) > self.codec.value_alarm:  # a warning, or max_value_bytes= (codec/_sizes.py)
            large_value(self.codec, len(text), f"run.state.{name}", f"state.{name}")
        digest = content_hash(text)
        if isinstance(p, _ValuePrev) and p.digest == digest:
            d.refs[name], d.prev[name] = p.ref, _ValuePrev(p.ref, digest, obj, _generation[0], data)
            return
        if len(text) <= INLINE_LIMIT:
            ref: dict[str, Any] = {"i": tree}
        else:
            key = "v:" + digest
            ref = {"b": key}
            if key not in self.known:
                d.blobs[key] = self.codec.seal(text)
        d.refs[name], d.prev[name] = ref, _ValuePrev(ref, digest, obj, _generation[0], data)

    def _diff_list(self, name: str, value: list[Any], d: Diff, cid: str) -> None:
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
                last = value[p.n - 1]
                raw = _raw(last) if p.last_raw is not None else None
                if raw is None or raw != p.last_raw:
                    extends = self.codec.encode(last, f"state.{name}[{p.n - 1}]") == p.last_tree
        if tracked is not None:
            tracked._pk_dirty = False
        if extends:
            assert isinstance(p, _ListPrev)
            if len(value) == p.n:
                d.refs[name] = p.ref
                d.prev[name] = _ListPrev(
                    p.ref, p.n, p.tip, p.gen, p.last_tree, *_mode(value), p.last_raw, p.recent
                )
                return
            self._write_segment(name, value, p.n, p, p.gen, d, cid)
        else:
            gen = p.gen + 1 if isinstance(p, _ListPrev) else 1
            if not value:
                ref = {"l": None, "n": 0, "g": gen}
                d.refs[name] = ref
                d.prev[name] = _ListPrev(ref, 0, None, gen, None, *_mode(value))
                return
            self._write_segment(name, value, 0, None, gen, d, cid)

    def _write_segment(
        self,
        name: str,
        value: list[Any],
        start: int,
        p: _ListPrev | None,
        gen: int,
        d: Diff,
        cid: str,
    ) -> None:
        """The segment of items ``start``... of list ``name``: inline in the row (continuing the
        chain of ``p`` when ``start`` > 0), or a blob: a new chain's long first segment, or a span."""
        encode = self.codec.serializer.encode
        new = value[start:]
        try:
            trees = list(map(encode, new))
        except SerializationError:  # again, item by item, for the error that names the item
            trees = [encode(item, path=f"state.{name}[{start + i}]") for i, item in enumerate(new)]
        d.appended[name] = new
        prev_tip = p.tip if p is not None and start > 0 else None
        d.links[name] = prev_tip
        last_raw = _raw(value[-1])
        # its size: the newest item's JSON is made anyway (a lone plain item's is the size)
        size = len(last_raw) if last_raw is not None and len(trees) == 1 else len(_dump(trees))
        if size > self.codec.value_alarm:
            large_value(self.codec, size, f"the items appended to run.state.{name}", f"state.{name}")
        gathered = _gather(p.recent if p is not None and start > 0 else (), cid, prev_tip, start, trees, size)
        if (start > 0 or len(trees) <= INLINE_SEGMENT_ITEMS) and len(gathered) <= SPAN_SEGMENTS:
            d.segments[name] = {"p": prev_tip, "s": start, "i": trees}
            key, recent = cid, gathered
        else:
            key, recent = self._span(name, gen, gathered, d), ()
        ref = {"l": key, "n": len(value), "g": gen}
        d.refs[name] = ref
        d.prev[name] = _ListPrev(ref, len(value), key, gen, trees[-1], *_mode(value), last_raw, recent)

    def _span(self, name: str, gen: int, gathered: tuple[_Inline, ...], d: Diff) -> str:
        """Write ``gathered`` (inline segments, the last one this checkpoint's) as one blob segment."""
        codec, first = self.codec, gathered[0]
        items: list[Any] = []  # in stored form: a segment read back is; one of ours is redacted
        for seg in gathered:
            items.extend(seg.trees if seg.stored else codec.redact_tree(seg.trees))
        text = _dump({"p": first.prev, "s": first.start, "i": items})
        key = _seg_key(name, gen, first.start, content_hash(text))
        d.blobs[key] = codec.seal(text)
        d.spans[name] = (first.prev, first.start, items)
        return key


def _gather(
    recent: tuple[_Inline, ...], cid: str, prev: str | None, start: int, trees: list[Any], size: int
) -> tuple[_Inline, ...]:
    """The inline segments the next span would hold, the one about to be written (``cid``) last.
    Large segments are cheap to read one by one (a row's cost is small beside its bytes): once
    the segments gathered hold over ``SPAN_BYTES``, gathering starts again from this one. Each
    segment carries the bytes gathered up to it (``upto``), so a step does not add them up again."""
    upto = (recent[-1].upto if recent else 0) + size
    if upto > SPAN_BYTES:
        return (_Inline(cid, prev, start, trees, size, stored=False, upto=size),)
    return (*recent, _Inline(cid, prev, start, trees, size, stored=False, upto=upto))


def _mode(value: list[Any]) -> tuple[list[Any] | None, list[Any] | None]:
    """(obj, items) for a committed list: identity for tracked lists, a shallow copy otherwise."""
    if isinstance(value, TrackedList):
        return value, None
    return None, list(value)


def _ref_digest(codec: Codec, ref: dict[str, Any]) -> str:
    if "b" in ref:
        return str(ref["b"])[2:]
    return content_hash(codec.dump_tree(ref["i"]))


