"""The list segments a store has read, kept across turns (:class:`SegmentCache`).

A turn loads its thread's state: a list channel is a chain of segments (``_channels``)
walked back from the head's tip, and walking it reads the rows and blobs the segments
live in. A long-lived worker would read and decode the same segments again on every turn
of a thread (up to ``_tracker.SPAN_SEGMENTS`` rows since the chain's last span, in pages),
so a one-append turn's cost grew with the thread's turns (issue #37). The segments are
immutable once stored: a segment key is a checkpoint id (its row is never overwritten,
except by ``rewrite``, which keeps the value) or a content-addressed blob key. So a
store keeps the segments its runs read, per thread, and the next turn's walk reads only
the rows written since (a short page), then finds the rest here.

What is kept is what was read back from the store and checked there (integrity tags,
decryption, secrets as handles: the stored form): never a tree of live values this
process committed. Each entry is a ``(previous link, start, item trees)`` tuple that
nothing mutates (items are decoded from it afresh for each run). Bounded: at most
``limit`` bytes (a segment counted as its items' JSON plus its own overhead), the
threads read least recently dropped first; a thread whose segments alone are over the
limit is not kept (nor measured again: the cache remembers the last 1,024 such
threads). Only runs use it (``pk.resume``): ``get_state``, history, the timeline, prune
and the CLI read the store itself. A segment kept before a prune may link to rows the
prune deleted (retention roots the list at the oldest segment it keeps):
``Loader._fetch_chain`` then forgets the thread and walks the store again. A process
re-checks a segment only the first time it reads it: an edit of a row after that is
found by the next process that reads it, never used here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

__all__ = ["SEGMENT_CACHE_BYTES", "SegmentCache"]

#: The bytes of segments a store keeps across turns (per ``pk.connect``), counted as their
#: items' JSON plus a little per segment.
SEGMENT_CACHE_BYTES = 16 << 20

#: The threads found too big to keep that a cache remembers (so as not to measure them again).
_OVERSIZED = 1024

#: ``(channel, segment key)`` -> ``(previous link, start, item trees)``
Segments = dict[tuple[str, str], tuple[Any, int, list[Any]]]


class SegmentCache:
    """Segments read per ``(namespace, thread)``, least recently used threads dropped first."""

    def __init__(self, limit: int = SEGMENT_CACHE_BYTES) -> None:
        self.limit = limit
        self._threads: OrderedDict[tuple[str, str], tuple[Segments, list[int]]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        #: threads whose segments alone were over the limit, most recent last (not kept, not
        #: measured again: measuring is a JSON dump of what a walk read)
        self._oversized: OrderedDict[tuple[str, str], None] = OrderedDict()

    def oversized(self, namespace: str, thread_id: str) -> bool:
        """Whether the thread was found too big to keep (its walks leave nothing here)."""
        return (namespace, thread_id) in self._oversized

    def too_big(self, namespace: str, thread_id: str) -> None:
        """Remember that the thread's segments alone are over the limit (and drop them)."""
        key = (namespace, thread_id)
        with self._lock:
            if key in self._threads:
                self._drop(key)
            self._remember_oversized(key)

    def segments(self, namespace: str, thread_id: str) -> Segments | None:
        """The segments kept for a thread (read only: look up, never iterate; None: none)."""
        with self._lock:
            entry = self._threads.get((namespace, thread_id))
            if entry is None:
                return None
            self._threads.move_to_end((namespace, thread_id))
            return entry[0]

    def add(self, namespace: str, thread_id: str, found: dict[tuple[str, str], tuple[tuple[Any, int, list[Any]], int]]) -> None:
        """Keep ``found`` for a thread: segments read from the store, each with its size."""
        if not found:
            return
        key = (namespace, thread_id)
        with self._lock:
            entry = self._threads.get(key)
            if entry is None:
                entry = self._threads[key] = ({}, [0])
            segs, total = entry
            size = 0
            for k, (seg, n) in found.items():
                if k not in segs:
                    segs[k] = seg
                    size += n
            total[0] += size
            self._bytes += size
            self._threads.move_to_end(key)
            if total[0] > self.limit:  # this thread alone is too big to keep
                self._drop(key)
                self._remember_oversized(key)
            while self._bytes > self.limit and self._threads:
                self._drop(next(iter(self._threads)))

    def forget(self, thread_id: str) -> None:
        """Drop a thread's segments in every namespace (the thread was deleted)."""
        with self._lock:
            for key in [k for k in self._threads if k[1] == thread_id]:
                self._drop(key)
            for key in [k for k in self._oversized if k[1] == thread_id]:
                del self._oversized[key]

    def clear(self) -> None:
        with self._lock:
            self._threads.clear()
            self._oversized.clear()
            self._bytes = 0

    def _remember_oversized(self, key: tuple[str, str]) -> None:
        """Note ``key`` as too big to keep (the newest last; the oldest forgotten past the bound)."""
        self._oversized[key] = None
        self._oversized.move_to_end(key)
        while len(self._oversized) > _OVERSIZED:
            self._oversized.popitem(last=False)

    def _drop(self, key: tuple[str, str]) -> None:
        _, total = self._threads.pop(key)
        self._bytes -= total[0]
