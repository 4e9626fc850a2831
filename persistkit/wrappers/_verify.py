"""Offline verification of an integrity store: every broken record, not only the first.

``store.verify()`` / ``python -m persistkit verify URL`` walk each thread (or
one) and each of its namespaces through the *inner* store, check every row's
tag, every chain link, the head and the witness, and every blob's tag, and
collect a :class:`IntegrityProblem` for each failure instead of stopping.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._errors import IntegrityError
from ..backends import Backend, CheckpointRow
from ..backends._copy import BLOB_RANGE, all_threads, read_thread, write_thread
from ._integrity import (
    _FIX,
    IntegrityBackend,
    Sealed,
    check_links,
    check_witness,
    open_blob,
    open_row,
)
from ._integrity_prune import anchor_range, anchors_in, gap_allowed

__all__ = ["IntegrityProblem", "IntegrityReport", "verify_backend"]

_PAGE = 500


@dataclass(frozen=True, slots=True)
class IntegrityProblem:
    """One broken record: where it is and what is wrong with it."""

    thread_id: str
    namespace: str
    checkpoint_id: str | None
    reason: str
    blob_key: str | None = None

    def __str__(self) -> str:
        at = f"thread {self.thread_id!r}"
        if self.namespace:
            at += f" namespace {self.namespace!r}"
        if self.checkpoint_id:
            at += f" checkpoint {self.checkpoint_id}"
        if self.blob_key:
            at += f" blob {self.blob_key!r}"
        return f"{at}: {self.reason}"


@dataclass(slots=True)
class IntegrityReport:
    """What ``store.verify()`` found. ``ok`` is True when nothing is broken."""

    threads: int = 0
    records: int = 0
    blobs: int = 0
    problems: list[IntegrityProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        head = (
            f"{self.threads} thread(s), {self.records} record(s), {self.blobs} blob(s) checked: "
            + ("all verified" if self.ok else f"{len(self.problems)} problem(s)")
        )
        return "\n".join([head, *(f"  {p}" for p in self.problems)])


def _reason(exc: IntegrityError) -> str:
    # The message starts with "thread '...' checkpoint ...: "; the problem carries that already.
    text = str(exc).replace(" " + _FIX, "")
    return text.split(": ", 1)[1] if ": " in text else text


class _Source:
    """Where verification reads rows and blobs: below an encryption layer when there is
    one, opening each record on its own, so that one record that fails to decrypt is
    reported (and its neighbours still checked) instead of failing a whole page."""

    def __init__(self, ib: IntegrityBackend) -> None:
        from ._encryption import EncryptedBackend

        inner = ib.inner
        self.enc = inner if isinstance(inner, EncryptedBackend) else None
        self.backend: Backend = self.enc.inner if self.enc is not None else inner

    def row(self, row: CheckpointRow) -> CheckpointRow:
        return row if self.enc is None else self.enc.open_row(row)

    def blob(self, thread_id: str, key: str, data: bytes) -> bytes:
        return data if self.enc is None else self.enc.open_blob(thread_id, key, data)


def _verify_namespace(ib: IntegrityBackend, thread_id: str, ns: str, report: IntegrityReport) -> None:
    source = _Source(ib)
    inner = source.backend

    def problem(cid: str | None, reason: str) -> None:
        report.problems.append(IntegrityProblem(thread_id, ns, cid, reason))

    # The witness first: a writer records after its commit, so what is read next is at least as new.
    seen = ib.witness.latest(thread_id, ns) if ib.witness is not None else None
    head = inner.head(thread_id, ns)
    good: list[Sealed] = []  # verified rows, newest first
    last_ok = True  # was the row just before (newer) verified? A broken row is reported once, not twice
    before: str | None = None
    newest_seen: str | None = None
    while True:
        page = inner.list(thread_id, ns, before=before, limit=_PAGE)
        for row in page:
            newest_seen = newest_seen or row.checkpoint_id
            report.records += 1
            try:
                s = open_row(source.row(row), ib.keyring)
            except IntegrityError as exc:
                problem(row.checkpoint_id, _reason(exc))
                last_ok = False
                continue
            if good and last_ok:
                try:
                    if not (good[-1].seq > s.seq + 1 and _anchored(ib, source, thread_id, ns, good[-1], s)):
                        check_links(thread_id, ns, good[-1], s)
                except IntegrityError as exc:
                    problem(good[-1].row.checkpoint_id, _reason(exc))
            good.append(s)
            last_ok = True
        if len(page) < _PAGE:
            break
        before = page[-1].checkpoint_id
    if good and good[-1].seq != 1 and not _anchored(ib, source, thread_id, ns, good[-1], None):
        problem(good[-1].row.checkpoint_id, f"the oldest verifiable record is #{good[-1].seq}; older records are missing")
    newest = good[0] if good else None
    if head is None:
        if newest_seen is not None:
            problem(newest_seen, "records exist but the thread has no head (head deleted, or records inserted)")
    else:
        if newest is None or newest.row.checkpoint_id != head.checkpoint_id or newest.seq != head.version:
            problem(
                head.checkpoint_id,
                f"the head (version {head.version}) does not match the newest verified record "
                + (f"(checkpoint {newest.row.checkpoint_id}, #{newest.seq})" if newest else "(none)")
                + ": newest records removed, or the head replaced by an older version",
            )
    if ib.witness is not None:
        try:
            check_witness(thread_id, ns, newest if head is not None else None, seen)
        except IntegrityError as exc:
            problem(head.checkpoint_id if head else None, _reason(exc))


def _anchored(ib: IntegrityBackend, source: _Source, thread_id: str, ns: str, newer: Sealed, older: Sealed | None) -> bool:
    """Whether a prune anchored the gap below ``newer`` (``_integrity_prune``)."""
    key = newer.row.checkpoint_id
    found = {
        k: open_blob(thread_id, k, source.blob(thread_id, k, v), ib.keyring)
        for k, v in source.backend.scan_blobs(thread_id, *anchor_range(ns, key)).items()
    }
    anchors = anchors_in(thread_id, ns, key, found)
    if older is None:
        return gap_allowed(anchors, None, None, None)
    return gap_allowed(anchors, older.seq, older.row.checkpoint_id, older.tag)


def _verify_thread(ib: IntegrityBackend, thread_id: str, report: IntegrityReport) -> None:
    report.threads += 1
    known = set(ib.inner.namespaces(thread_id))
    if ib.witness is not None:  # a thread removed from the store entirely is still walked
        listed = getattr(ib.witness, "namespaces", None)
        known.update(listed(thread_id) if callable(listed) else [""])
    for ns in sorted(known):
        _verify_namespace(ib, thread_id, ns, report)
    source = _Source(ib)
    for key, value in source.backend.scan_blobs(thread_id, *BLOB_RANGE).items():
        report.blobs += 1
        try:
            open_blob(thread_id, key, source.blob(thread_id, key, value), ib.keyring)
        except IntegrityError as exc:
            report.problems.append(IntegrityProblem(thread_id, "", None, _reason(exc), blob_key=key))


def verify_backend(ib: IntegrityBackend, thread_id: str | None = None) -> IntegrityReport:
    """Walk one thread, or every thread of the store, and report every broken record."""
    report = IntegrityReport()
    if thread_id is not None:
        _verify_thread(ib, thread_id, report)
        return report
    after: str | None = None
    while True:
        page = ib.inner.threads(after=after, limit=_PAGE)
        for tid in page:
            _verify_thread(ib, tid, report)
        if len(page) < _PAGE:
            return report
        after = page[-1]


def copy_into(source: Backend, target: IntegrityBackend, thread_id: str | None = None) -> int:
    """Copy threads (one, or all) of an unsealed store into an integrity store, sealing them.

    The migration path into integrity: rows are immutable, so an existing store is
    never sealed in place. Every row keeps its checkpoint id, parent, run id and
    payload; blobs are copied first (``backends/_copy``, shared with the command
    line's export and import). Returns the number of rows copied. The target
    threads must not exist yet (``ConflictError`` otherwise).
    """
    todo = [thread_id] if thread_id is not None else list(all_threads(source))
    return sum(write_thread(target, read_thread(source, tid)) for tid in todo)
