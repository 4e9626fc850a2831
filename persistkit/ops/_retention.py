"""Retention policies, what a prune may take from one chain, and the report it gives.

``pk.Retention`` says what may go; :func:`doomed` applies it to the records of one
``(thread, namespace)`` chain (oldest first) and keeps, whatever the policy says:

* the chain's newest record (its head: every writer builds on it), except when
  ``thread_ttl`` deletes the whole thread (:func:`thread_expired`);
* every record of the run the head belongs to when that run is unfinished (running,
  failed, suspended, compensating: a resume replays all of them), and the record it
  started from (its ``parent_id``: the state it began with);
* a record another thread was forked from, while that thread exists (the caller finds
  them by the forks' links, ``state._records.fork_links``);
* a record that registered an after-commit effect no later record marks done (the
  drain still has to run it), and a record that marks done an effect of a record
  that stays (without the mark, the effect would run again).

The policy's own rules: ``keep_last`` (the newest N records of each chain),
``max_age`` (records younger than this) — a record goes when it is outside every rule
given — and ``final_only`` (finished runs keep only their last record, whatever their
age or place). ``thread_ttl`` deletes whole threads whose newest record in every
namespace is older than the TTL, and whose runs are all finished, no effect pending.
Ages are measured from ``now`` (the time the prune started), a dry run's too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .._errors import ConfigurationError
from ..coordination import _outbox as ob
from ..state._records import Record

__all__ = ["PruneReport", "Retention", "doomed", "unfinished_run"]

#: A run whose last record has one of these statuses may be resumed or continued.
UNFINISHED = frozenset({"running", "failed", "suspended", "compensating"})


def _seconds(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(
            f"Retention({name}={value!r}): give a positive number of seconds or a datetime.timedelta"
        )
    return float(value)


@dataclass(frozen=True)
class Retention:
    """What ``store.prune`` may delete (see docs/operations.md, Retention).

    ``keep_last``: keep the newest N checkpoints of each thread (and namespace).
    ``max_age``: keep checkpoints younger than this (seconds or ``timedelta``).
    With both, a checkpoint goes only when both would let it go.
    ``final_only``: of each finished run keep only its last checkpoint.
    ``thread_ttl``: delete a whole thread whose newest checkpoint is older than this
    and which has no unfinished run and no pending after-commit effect.
    What a resume, a pending question, an undrained effect or a live fork still needs
    is never deleted, whatever the policy says.
    """

    keep_last: int | None = None
    max_age: float | timedelta | None = None
    final_only: bool = False
    thread_ttl: float | timedelta | None = None

    def __post_init__(self) -> None:
        if self.keep_last is not None and (
            isinstance(self.keep_last, bool) or not isinstance(self.keep_last, int) or self.keep_last < 1
        ):
            raise ConfigurationError(
                f"Retention(keep_last={self.keep_last!r}): give a whole number >= 1 (the head is always kept)"
            )
        _seconds(self.max_age, "max_age")
        _seconds(self.thread_ttl, "thread_ttl")
        if not isinstance(self.final_only, bool):
            raise ConfigurationError(f"Retention(final_only={self.final_only!r}): give True or False")
        if self.keep_last is None and self.max_age is None and not self.final_only and self.thread_ttl is None:
            raise ConfigurationError(
                "Retention() with no rule would delete nothing: give keep_last=, max_age=, "
                "final_only=True and/or thread_ttl="
            )

    @property
    def age(self) -> float | None:
        return _seconds(self.max_age, "max_age")

    @property
    def ttl(self) -> float | None:
        return _seconds(self.thread_ttl, "thread_ttl")


@dataclass
class PruneReport:
    """What ``store.prune`` did (or, with ``dry_run``, would do)."""

    dry_run: bool
    threads: int = 0  #: threads looked at
    threads_deleted: list[str] = field(default_factory=list)  #: whole threads (thread_ttl)
    checkpoints: int = 0  #: checkpoints deleted
    kept: int = 0  #: checkpoints kept
    blobs: int = 0  #: stored values deleted (no kept checkpoint refers to them)
    lists_rooted: int = 0  #: lists copied into one value so kept checkpoints still load them
    stream_records: int = 0  #: stream records of pruned runs trimmed from kept threads' streams
    bytes_before: int = 0
    bytes_after: int = 0
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  #: (thread, namespace, why)

    @property
    def bytes_freed(self) -> int:
        return self.bytes_before - self.bytes_after

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run, "threads": self.threads, "threads_deleted": list(self.threads_deleted),
            "checkpoints": self.checkpoints, "kept": self.kept, "blobs": self.blobs,
            "lists_rooted": self.lists_rooted, "stream_records": self.stream_records, "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after, "bytes_freed": self.bytes_freed,
            "skipped": [{"thread": t, "namespace": ns, "why": why} for t, ns, why in self.skipped],
        }

    def __str__(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        text = (
            f"{self.threads} thread(s) looked at: {verb} {self.checkpoints} checkpoint(s) "
            f"({self.kept} kept), {len(self.threads_deleted)} whole thread(s), {self.blobs} stored value(s), "
            f"{self.lists_rooted} list(s) rooted, {self.stream_records} stream record(s); {_size(self.bytes_before)} before, {_size(self.bytes_after)} after"
        )
        lines = [text, *(f"  skipped thread {t!r}{f' namespace {ns!r}' if ns else ''}: {why}" for t, ns, why in self.skipped)]
        return "\n".join(lines)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


def unfinished_run(records: Sequence[Record]) -> str | None:
    """The run the chain's head belongs to, if that run may still be resumed."""
    if not records:
        return None
    head = records[-1]
    if head.kind in ("step", "end") and head.run_status in UNFINISHED and head.row.run_id:
        return head.row.run_id
    return None


def doomed(
    records: Sequence[Record], policy: Retention, *, forked_from: Mapping[str, Any] | None = None, now: float | None = None
) -> set[str]:
    """The checkpoint ids of one chain (``records``, oldest first) that ``policy`` lets go
    and nothing still needs (see the module docstring). ``forked_from``: the ids of this
    chain other threads were forked from."""
    if len(records) < 2:
        return set()
    now = time.time() if now is None else now
    ids = [r.id for r in records]
    candidates: set[str] = set()
    age = policy.age
    if policy.keep_last is not None or age is not None:
        outside_count = set(ids[: -policy.keep_last]) if policy.keep_last is not None else set(ids)
        outside_age = {r.id for r in records if _time(r) < now - age} if age is not None else set(ids)
        candidates |= outside_count & outside_age
    if policy.final_only:
        last_of: dict[str, str] = {}
        for r in records:
            if r.row.run_id:
                last_of[r.row.run_id] = r.id
        live = unfinished_run(records)
        candidates |= {r.id for r in records if r.row.run_id and r.row.run_id != live and last_of[r.row.run_id] != r.id}
    gone = candidates - _needed(records, forked_from or {})
    # a done mark stays while the record whose effect it marks stays (else that effect
    # would look pending again); a mark of a record already gone may go
    registered = {r.id for r in records if "ac" in r.body}
    for r in records:
        if r.id in gone and any(
            (ac := m.rsplit(".", 1)[0]) in registered and ac not in gone for m in r.body.get("ad") or ()
        ):
            gone.discard(r.id)
    return gone


def _time(r: Record) -> float:
    t = r.body.get("t", 0.0)
    return float(t) if isinstance(t, int | float) else 0.0


def _needed(records: Sequence[Record], forked_from: Mapping[str, Any]) -> set[str]:
    keep = {records[-1].id}
    keep.update(c for c in forked_from if c)
    live = unfinished_run(records)
    if live is not None:
        mine = [r for r in records if r.row.run_id == live]
        keep.update(r.id for r in mine)
        if mine and mine[0].row.parent_id:
            keep.add(mine[0].row.parent_id)
    keep.update(p.rec.id for p in ob.pending_in(records))  # an effect the drain still runs
    return keep


def thread_expired(chains: Mapping[str, Sequence[Record]], policy: Retention, now: float | None = None) -> bool:
    """Whether a whole thread (its chains by namespace) is past ``policy.thread_ttl``."""
    ttl = policy.ttl
    if ttl is None or not chains:
        return False
    now = time.time() if now is None else now
    for records in chains.values():
        if not records:
            continue
        if _time(records[-1]) >= now - ttl or unfinished_run(records) is not None or ob.pending_in(records):
            return False
    return True
