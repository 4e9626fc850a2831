"""Trimming a thread's streams to the runs retention keeps (``store.prune``; docs/streams.md,
Retention).

A stream's batches each belong to one run (``Batch.run_id``), and a thread's runs write in
turn (its lease), so a stream is the runs' records one run after another. A prune that
deleted every record of some runs (or did so earlier: their tombstones say so) deletes
the **prefix** of each stream of that namespace whose batches belong to those runs:

* it stops at the first batch of a run that keeps a record (or of a run it knows nothing
  about that no gone run follows: a run that has emitted but not committed yet), and
  never deletes the stream's last batch (the tail a writer continues from, so offsets are
  never reused);
* a batch of a run that left no record (it died before its first commit) goes when a gone
  run's batch follows it: it is older than that run;
* a deleted batch leaves a kv tombstone (``KvOp(value=None)``), so no writer can create
  its key again; readers list past it. A reader asking for offsets that were trimmed gets
  one ``pruned`` record first (``_reader.Follow``), never other events in their place.

Deleted oldest first, a few batches per write: an interrupted trim leaves a shorter prefix
gone, which the next prune finishes.
"""

from __future__ import annotations

from collections.abc import Set
from typing import Any

from .._io import Plan, call
from ..backends._protocol import KvOp
from . import _format as F

__all__ = ["trim_streams"]

_PAGE = 256
_DELETES = 25  # batches per kv_write


def _names(codec: Any, thread_id: str, namespace: str) -> Plan[list[str]]:
    entry = yield call("kv_get", F.INDEX, F.index_key(thread_id, namespace))
    if entry is None or entry.value is None:
        return []
    index = codec.unpack_tree(bytes(entry.value), f"thread {thread_id!r} stream index")
    return sorted(str(n) for n in (index.get("s") or ())) if isinstance(index, dict) else []


def _doomed(
    codec: Any, scope: str, where: str, kept: Set[str], gone: Set[str]
) -> Plan[tuple[list[KvOp], int]]:
    """The deletes of the stream's deletable prefix (oldest first) and its record count.
    Read page by page up to the first batch of a kept run: a stream trimmed before costs
    one short listing."""
    out: list[KvOp] = []
    records = 0
    unknown: list[tuple[str, int, int]] = []
    pending: tuple[str, int, int, str] | None = None  # the last batch read: it may be the tail
    after: str | None = None
    while True:
        page = yield call("kv_list", scope, prefix="b", after=after, limit=_PAGE)
        for entry in page:
            if pending is not None:
                key, version, n, run = pending
                if run in kept:
                    return out, records
                if run not in gone:
                    unknown.append((key, version, n))  # goes if a gone run follows it
                else:
                    for k, v, m in [*unknown, (key, version, n)]:
                        out.append(KvOp(k, v, None))
                        records += m
                    unknown = []
            batch = F.load_batch(codec, entry.key, entry.value, where)
            pending = (entry.key, entry.version, len(batch.records), batch.run_id)
        if len(page) < _PAGE:
            return out, records  # `pending`, the stream's last batch, stays
        after = page[-1].key


def trim_streams(
    codec: Any, thread_id: str, namespace: str, kept: Set[str], gone: Set[str], dry_run: bool
) -> Plan[int]:
    """Delete the prefix of each stream of ``(thread_id, namespace)`` that belongs to runs in
    ``gone`` (every record of them deleted) and not to ``kept`` (see the module docstring);
    how many records went (with ``dry_run``: would go)."""
    total = 0
    for name in (yield from _names(codec, thread_id, namespace)):
        scope = F.scope_of(thread_id, namespace, name)
        deletes, records = yield from _doomed(
            codec, scope, f"thread {thread_id!r} stream {name!r}", kept, gone
        )
        total += records
        if dry_run:
            continue
        for i in range(0, len(deletes), _DELETES):
            yield call("kv_write", scope, deletes[i : i + _DELETES], keep=1)
    return total
