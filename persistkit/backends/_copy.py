"""A thread as a unit of transfer: its blobs and its rows, read from one store, written to another.

What ``store.copy_from`` (``wrappers/_verify.copy_into``) and the command line's
``export`` / ``import`` (``_cli/_transfer``) share. A thread is every blob of it (one
range scan: blob keys are printable ASCII) and, per namespace, every row oldest
first. Writing puts the blobs first, then each namespace's rows with the head's
compare-and-swap from version 0, so the target's wrappers see an ordinary history
being written: encryption seals each record with the target's keys, integrity
chains it anew (each row's ``seq`` is the version its write creates), offload
moves large ones. Ids, parents, run ids and payloads are kept. Lease records
are not part of a thread's data (their tokens belong to the store they were
issued by) and are never copied.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from ._protocol import Backend, CheckpointRow

__all__ = ["BLOB_RANGE", "PAGE", "ThreadCopy", "all_threads", "read_thread", "write_thread"]

PAGE = 500
#: Blob keys are printable ASCII; this range covers every one of them.
BLOB_RANGE = (" ", "\x7f")


@dataclass(slots=True)
class ThreadCopy:
    """One thread's data: ``blobs`` by key, ``rows`` per namespace, oldest first."""

    thread_id: str
    blobs: dict[str, bytes] = field(default_factory=dict)
    rows: dict[str, list[CheckpointRow]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(len(r) for r in self.rows.values())


def all_threads(backend: Backend) -> Iterator[str]:
    """Every thread id of ``backend``, ascending, read in pages."""
    after: str | None = None
    while True:
        page = backend.threads(after=after, limit=PAGE)
        yield from page
        if len(page) < PAGE:
            return
        after = page[-1]


def read_thread(backend: Backend, thread_id: str) -> ThreadCopy:
    """Every blob and row of ``thread_id`` as ``backend`` returns them (through its wrappers:
    decrypted, tags checked, offloaded records fetched)."""
    copy = ThreadCopy(thread_id, dict(backend.scan_blobs(thread_id, *BLOB_RANGE)))
    for ns in backend.namespaces(thread_id):
        rows: list[CheckpointRow] = []
        before: str | None = None
        while True:  # newest first in pages: a long thread is not one query
            page = backend.list(thread_id, ns, before=before, limit=PAGE)
            rows += page
            if len(page) < PAGE:
                break
            before = page[-1].checkpoint_id
        rows.reverse()
        copy.rows[ns] = rows
    return copy


def write_thread(backend: Backend, copy: ThreadCopy) -> int:
    """Write ``copy`` into ``backend``, blobs first, each namespace's rows oldest first from
    head version 0 (``ConflictError`` when the thread already has a head there). Returns
    the number of rows written. Not atomic across rows: the caller deletes the thread on
    failure when it must be all or nothing."""
    if copy.blobs:
        backend.put_blobs(copy.thread_id, copy.blobs)
    written = 0
    for rows in copy.rows.values():
        for version, row in enumerate(rows):
            backend.write(row, {}, version)
            written += 1
    return written
