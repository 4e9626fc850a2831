"""``store.prune(policy)`` / ``aprune``: retention that never breaks a resume.

For each thread (``prefix``, or one ``thread_id``), under the thread's lease taken the
way ``store.abandon`` does (a thread whose lease a live run holds is skipped and
reported: its run may be writing), in this order, each step safe to interrupt:

1. **sizes**: the thread's blob keys and sizes (``blob_sizes``), before anything is read;
   only these can be swept, so a value a writer adds meanwhile is never touched.
2. **read and decide**: every record of every namespace; :func:`~._retention.doomed`
   picks what the policy lets go and nothing needs.
3. **root the lists**: a kept checkpoint's list channel links back, segment by segment,
   through older rows. Where its chain reaches a row that goes (or a row whose result a
   kept segment refers to), the items up to there are written as one blob
   (``state._channels.root_key``), which a reader uses when that row is gone. Written
   before anything is deleted.
   With them, a *tombstone* for each run every record of which goes
   (``state._records.tombstone_key``, its status only): a redelivery of that run finds
   it and runs nothing (``RunPrunedError``), as a redelivery of a run partly pruned does.
4. **delete**: ``prune_rows`` in batches, newest first, so an interrupted prune leaves
   only rows no kept list reaches any more (under ``integrity=`` the wrapper
   first writes the anchors that let its chain skip them: ``wrappers/_integrity_prune``).
5. **sweep**: blobs from step 1 whose keys are values, list segments or rooted lists
   (``v:``, ``s:``, ``l:``) that no kept checkpoint refers to are deleted (any other key is
   never touched).
6. **streams**: each stream of the thread loses the records of runs no record of which is
   left (``streams._trim``), oldest first, up to the first record of a kept run.

``thread_ttl`` deletes a whole expired thread instead (``delete_thread``). Forks: the
checkpoint a thread was forked from is kept while that thread exists, which needs the
fork links of every thread, so a prune first reads them: a blob of the forked thread
(``state._records.fork_key``, written with its fork record, gone with the thread), or,
for a fork written before those, its oldest record (one pass over its rows). Step 3
writes that blob before a prune deletes such a fork record, so the link outlives it.
Interrupted anywhere, the store is consistent and the next prune finishes the work.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._errors import (
    ConfigurationError,
    IntegrityError,
    NotFoundError,
    PersistkitError,
    SerializationError,
    StoreOptionsError,
    ThreadBusyError,
)
from .._io import Call, Plan, call, run_sync
from ..backends import Backend
from ..backends._capabilities import require
from ..backends._protocol import RESERVED_THREAD
from ..codec._pipeline import Codec
from ..coordination._lease import DEFAULT_TTL, Lease, acquire, give_back, holder_words, new_owner
from ..secrets._redact import scrub
from ..state._channels import Loader, root_key, seg_range
from ..state._dedupe import result_blob, wanted
from ..state._records import (
    TOMBSTONE,
    Record,
    fork_key,
    fork_link_blob,
    fork_links,
    read_rows,
    targets,
    tombstone_key,
)
from ..streams._trim import trim_streams
from ._retention import PruneReport, Retention, doomed, thread_expired

__all__ = ["RetentionStore"]

_PAGE = 500
_BATCH = 2000  # rows per prune_rows call (a store reads the thread once per call), blobs per delete_blobs call
_SWEPT = ("v:", "s:", "l:")  # blob keys the sweep may delete; any other key stays


@dataclass
class _Thread:
    """One thread's work: its chains and what goes."""

    thread_id: str
    chains: dict[str, list[Record]] = field(default_factory=dict)
    gone: dict[str, set[str]] = field(default_factory=dict)
    roots: dict[str, bytes] = field(default_factory=dict)  # blobs to write first
    needed_roots: set[str] = field(default_factory=set)


def _check_scope(prefix: Any, thread_id: Any, namespace: Any, dry_run: Any, progress: Any) -> None:
    """The arguments of ``store.prune`` besides the policy: a clear error for each bad one."""
    for name, value in (("prefix", prefix), ("thread_id", thread_id), ("namespace", namespace)):
        if name != "prefix" and value is None:
            continue
        if not isinstance(value, str) or "\x00" in value or (name == "thread_id" and not value):
            raise ConfigurationError(f"store.prune({name}={value!r}): give a str without NUL characters")
    if not isinstance(dry_run, bool):
        raise ConfigurationError(f"store.prune(dry_run={dry_run!r}): give True or False")
    if progress is not None and not isinstance(progress, bool) and not callable(progress):
        raise ConfigurationError(f"store.prune(progress={progress!r}): give True, False, None or a function of one line")


def _threads(thread_id: str | None, prefix: str) -> Plan[list[str]]:
    """The threads a prune looks at (never a reserved one: the store's own)."""
    pairs = yield from targets(thread_id, prefix, "")  # one namespace each: the threads alone
    return [t for t, _ in pairs if not t.startswith(RESERVED_THREAD)]


def _namespaces(thread_id: str) -> Plan[list[str]]:
    pairs = yield from targets(thread_id, "", None)
    return [ns for _, ns in pairs]


def _fork_sources(codec: Codec, unreadable: list[str]) -> Plan[dict[tuple[str, str], set[str]]]:
    """(source thread, namespace) -> checkpoint ids some thread of the store was forked from.
    A fork's link is a blob of its thread (``state._records.fork_key``); a fork written
    before that has it on its first record only, read when the blob is absent (step 3 of a
    prune that deletes that record writes the blob first). A thread these store options
    cannot read (another key, another codec) is noted in ``unreadable`` and passed over: a
    fork holds its own copy of the state, so what it would protect is its source's history,
    not its own."""
    out: dict[tuple[str, str], set[str]] = {}
    spaces: dict[str, list[str]] = {}
    for t, ns in (yield from targets(None, "", None)):
        spaces.setdefault(t, []).append(ns)
    for t, namespaces in spaces.items():
        if t in unreadable:
            continue
        try:
            links = yield from fork_links(codec, t, namespaces)
            for ns in namespaces:
                source = links.get(ns)
                if source is None:
                    source = yield from _first_record_link(codec, t, ns)
                if source is not None:
                    out.setdefault((source[0], ns), set()).add(source[1])
        except PersistkitError:
            unreadable.append(t)
    return out


def _first_record_link(codec: Codec, t: str, ns: str) -> Plan[tuple[str, str] | None]:
    """The source a chain's oldest record names when it is a fork record."""
    before = None
    while True:  # the fork record is a chain's oldest: page to the bottom
        page = yield call("list", t, ns, before=before, limit=_PAGE)
        if len(page) < _PAGE:
            break
        before = page[-1].checkpoint_id
    if not page:
        return None
    rec = Record.decode(codec, page[-1])
    f = rec.body.get("f") if rec.kind == "fork" else None
    return (str(f[0]), str(f[1])) if f else None


def _links(codec: Codec, work: _Thread, sizes: Mapping[str, int]) -> dict[str, bytes]:
    """The fork link of each chain that loses its fork record and has no link blob yet (a
    fork written before links were kept on the thread): written before anything is deleted."""
    out: dict[str, bytes] = {}
    for ns, records in work.chains.items():
        first = records[0] if records else None
        f = first.body.get("f") if first is not None and first.kind == "fork" else None
        if f and first is not None and first.id in work.gone[ns] and fork_key(ns) not in sizes:
            out[fork_key(ns)] = fork_link_blob(codec, (str(f[0]), str(f[1])))
    return out


def _read(codec: Codec, work: _Thread, namespaces: Sequence[str]) -> Plan[None]:
    for ns in namespaces:
        work.chains[ns] = (yield from read_rows(codec, work.thread_id, ns))


def _lists(codec: Codec, work: _Thread, ns: str, report: PruneReport) -> Plan[None]:
    """Step 3's plan for one chain: which rooted lists the kept checkpoints need, and the
    blobs of those not stored yet."""
    records, gone = work.chains[ns], work.gone[ns]
    stored = {r.id for r in records}
    kept = [r for r in records if r.id not in gone]
    loader = Loader(codec, work.thread_id, ns)
    loader.add(records)
    for rec in kept:
        yield from loader.fetch([rec.refs])
        for name, ref in rec.refs.items():
            if "l" not in ref or ref["l"] is None:
                continue
            keys = loader.segment_keys(name, ref)

            def lost(key: str, name: str = name) -> bool:
                if key.startswith("s:"):
                    return False
                if key in gone or key not in stored:
                    return True
                body = loader.rows.get(key)
                return any(c in gone or c not in stored for c in wanted(body, name, {}))

            cut = max((i for i, k in enumerate(keys) if lost(k)), default=-1)
            if cut < 0:
                continue
            rk = root_key(name, keys[cut])
            work.needed_roots.add(rk)
            if rk in work.roots or rk in loader.blobs:
                continue
            trees: list[Any] = []
            for key in keys[: cut + 1]:
                trees.extend(loader.segment_trees(name, key))
            work.roots[rk] = codec.pack_stored({"p": None, "s": 0, "i": trees})  # read back: stored form
            report.lists_rooted += 1


def _tombstones(codec: Codec, work: _Thread) -> dict[str, bytes]:
    """A tombstone (``state._records.tombstone_key``) for each run every record of which goes:
    a redelivery of it must not run it again. Written before anything is deleted."""
    out: dict[str, bytes] = {}
    for ns, records in work.chains.items():
        last: dict[str, Record] = {}
        kept: set[str] = set()
        for rec in records:
            run_id = rec.row.run_id
            if not run_id:
                continue
            last[run_id] = rec
            if rec.id not in work.gone[ns]:
                kept.add(run_id)
        for run_id, rec in last.items():
            if run_id not in kept:
                out[tombstone_key(ns, run_id)] = codec.pack_stored({"rs": rec.run_status or "finished"})
    return out


def _marked(work: _Thread) -> tuple[set[str], set[str]]:
    """(blob keys, list generation prefixes) the kept checkpoints of every chain refer to."""
    keys: set[str] = set(work.needed_roots)
    prefixes: set[str] = set()
    for ns, records in work.chains.items():
        gone = work.gone.get(ns, set())
        for rec in records:
            if rec.id in gone:
                continue
            big = result_blob(rec.body)
            if big is not None:
                keys.add(big)
            for name, ref in rec.refs.items():
                if "b" in ref:
                    keys.add(ref["b"])
                elif "l" in ref:
                    prefixes.add(seg_range(name, ref["g"])[0])
    return keys, prefixes


def _sweepable(sizes: Mapping[str, int], work: _Thread) -> list[str]:
    keys, prefixes = _marked(work)
    return sorted(
        k for k in sizes
        if k.startswith(_SWEPT) and k not in keys and not any(k.startswith(p) for p in prefixes)
    )


def _bytes(work: _Thread, sizes: Mapping[str, int], namespace: str | None = None) -> int:
    """The thread's bytes (or, with ``namespace``, that namespace's rows and the blobs)."""
    rows = sum(len(r.row.payload) for ns, recs in work.chains.items() if namespace in (None, ns) for r in recs)
    return rows + sum(sizes.values())


def _count(work: _Thread, namespace: str | None) -> int:
    return sum(len(recs) for ns, recs in work.chains.items() if namespace in (None, ns))


def _batches(items: Sequence[str]) -> Iterator[list[str]]:
    for i in range(0, len(items), _BATCH):
        yield list(items[i : i + _BATCH])


class _Progress:
    """A line on a terminal (stderr, rewritten in place) while a prune runs, or each line
    to the caller's function; nothing by default when stderr is not a terminal."""

    def __init__(self, show: bool | Callable[[str], None] | None) -> None:
        self._fn = show if callable(show) else None
        self._terminal = self._fn is None and (sys.stderr.isatty() if show is None else bool(show))
        self._shown = False

    def __call__(self, line: str) -> None:
        if self._fn is not None:
            self._fn(line)
        elif self._terminal:
            print(f"\r{line}\x1b[K", end="", file=sys.stderr, flush=True)
            self._shown = True

    def done(self) -> None:
        if self._shown:
            print(file=sys.stderr, flush=True)


class RetentionStore:
    """``pk.Store``'s retention methods (``Store`` inherits this mixin)."""

    backend: Backend
    codec: Codec

    if TYPE_CHECKING:  # Store's own

        def run_sync(self, plan: Plan[Any]) -> Any: ...

        def call_sync(self, req: Call) -> Any: ...

        def _check_open(self) -> None: ...

        def delete_thread(self, thread_id: str) -> bool: ...

    def prune(
        self,
        policy: Retention,
        *,
        prefix: str = "",
        thread_id: str | None = None,
        namespace: str | None = None,
        dry_run: bool = False,
        progress: bool | Callable[[str], None] | None = None,
    ) -> PruneReport:
        """Delete what ``policy`` lets go and nothing still needs (docs/operations.md).

        Threads starting with ``prefix`` (or the one ``thread_id``), every namespace (or
        ``namespace``). ``dry_run``: report what would go (counts, bytes), change nothing.
        ``progress``: a line on stderr (default: when stderr is a terminal), or a callable
        given each line. Safe to interrupt and to run again. Returns a :class:`PruneReport`.
        """
        if not isinstance(policy, Retention):
            raise ConfigurationError(f"store.prune(policy): give a pk.Retention(...), not {policy!r}")
        _check_scope(prefix, thread_id, namespace, dry_run, progress)
        self._check_open()
        require(self.backend, "prune", "store.prune()")
        if thread_id is not None and not self.run_sync(_namespaces(thread_id)):
            raise NotFoundError(f"store.prune(thread_id={thread_id!r}): the store has no such thread")
        report = PruneReport(dry_run=bool(dry_run))
        show = _Progress(progress)
        now = time.time()
        unreadable: list[str] = []
        forks = self.run_sync(_fork_sources(self.codec, unreadable))
        targets = self.run_sync(_threads(thread_id, prefix))
        for i, t in enumerate(targets, 1):
            show(f"persistkit prune: thread {i}/{len(targets)} {t!r}: {report.checkpoints} checkpoint(s) so far")
            report.threads += 1
            if t in unreadable:
                report.skipped.append((t, "", "cannot be read with this store's options (keys, codec)"))
                continue
            try:
                self._prune_thread(t, namespace, policy, forks, now, report)
            except (IntegrityError, SerializationError, StoreOptionsError) as exc:
                report.skipped.append((t, "", f"cannot be read: {type(exc).__name__}: {scrub(str(exc))[:300]}"))
        show.done()
        return report

    async def aprune(
        self,
        policy: Retention,
        *,
        prefix: str = "",
        thread_id: str | None = None,
        namespace: str | None = None,
        dry_run: bool = False,
        progress: bool | Callable[[str], None] | None = None,
    ) -> PruneReport:
        """:meth:`prune` from a coroutine (it runs in a worker thread: maintenance, not the step path)."""
        import asyncio

        return await asyncio.to_thread(
            self.prune, policy, prefix=prefix, thread_id=thread_id, namespace=namespace, dry_run=dry_run,
            progress=progress,
        )

    # -- one thread ---------------------------------------------------------------------

    def _prune_thread(
        self, t: str, namespace: str | None, policy: Retention, forks: Mapping[tuple[str, str], set[str]],
        now: float, report: PruneReport,
    ) -> None:
        sizes: dict[str, int] = self.call_sync(call("blob_sizes", t))
        # every namespace is read, even with ``namespace``: blobs are the thread's, shared by its
        # namespaces (content-addressed), so the sweep must see every kept reference
        spaces: list[str] = self.run_sync(_namespaces(t))
        if namespace is not None and namespace not in spaces:
            spaces.append(namespace)
        work = _Thread(t)
        self.run_sync(_read(self.codec, work, spaces))
        forked = any(forks.get((t, ns)) for ns in spaces)  # a live fork's source is never deleted
        if namespace is None and not forked and thread_expired(work.chains, policy, now):
            report.bytes_before += _bytes(work, sizes)
            report.threads_deleted.append(t)
            report.checkpoints += sum(len(r) for r in work.chains.values())
            report.blobs += len(sizes)
            if not report.dry_run:  # with its streams, messages and events, as store.delete_thread
                self.delete_thread(t)
            return
        self._decide(work, namespace, policy, forks, now)
        leases = self._take_leases(t, work, report) if any(work.gone.values()) and not report.dry_run else {}
        if leases is None or not any(work.gone.values()):  # skipped (a live run holds it), or nothing goes
            report.bytes_before += _bytes(work, sizes, namespace)
            report.bytes_after += _bytes(work, sizes, namespace)
            report.kept += _count(work, namespace)
            if leases is not None:  # runs an earlier prune deleted may still have stream records
                self._trim_streams(work, namespace, sizes, report)
            return
        from ..coordination._drive import Heartbeat  # imports asyncio: not on `import persistkit`

        beats = [Heartbeat(self.backend, lease) for lease, _ in leases.values()]
        try:
            if leases and self._moved(work):  # a run wrote since the read: decide again, under the leases
                self.run_sync(_read(self.codec, work, list(work.chains)))
                self._decide(work, namespace, policy, forks, now)
            rooted = any(k.startswith("l:") for k in sizes)  # an earlier prune's rooted lists
            for ns in work.chains:
                # a chain losing nothing now may still read a list rooted by an earlier prune:
                # its root is marked needed here, or the sweep would take it
                if work.gone[ns] or rooted:
                    self.run_sync(_lists(self.codec, work, ns, report))
            sweep = _sweepable(sizes, work)
            before = _bytes(work, sizes, namespace)
            gone_rows = sum(len(r.row.payload) for ns, recs in work.chains.items() for r in recs if r.id in work.gone[ns])
            report.bytes_before += before
            report.bytes_after += before - gone_rows - sum(sizes[k] for k in sweep) + sum(map(len, work.roots.values()))
            report.kept += _count(work, namespace) - sum(len(g) for g in work.gone.values())
            if report.dry_run:
                report.checkpoints += sum(len(g) for g in work.gone.values())
                report.blobs += len(sweep)
                self._trim_streams(work, namespace, sizes, report)
                return
            first = {**work.roots, **_tombstones(self.codec, work), **_links(self.codec, work, sizes)}
            if first:
                self.call_sync(call("put_blobs", t, first))
            for ns, gone in work.gone.items():
                for batch in _batches(sorted(gone, reverse=True)):  # newest first: see backends/_prune
                    report.checkpoints += self.call_sync(call("prune_rows", t, ns, batch))  # what went, not what was meant to
            for batch in _batches(sweep):
                report.blobs += self.call_sync(call("delete_blobs", t, batch))
            self._trim_streams(work, namespace, sizes, report)
        finally:
            for beat in beats:
                beat.stop()
            for lease, top in leases.values():
                if lease.lost is None:
                    run_sync(self.backend, give_back(lease, top))

    @staticmethod
    def _decide(
        work: _Thread, namespace: str | None, policy: Retention, forks: Mapping[tuple[str, str], set[str]], now: float
    ) -> None:
        """What goes from each chain (only from ``namespace``'s when one is given)."""
        t = work.thread_id
        for ns, records in work.chains.items():
            chosen = namespace is None or ns == namespace
            work.gone[ns] = doomed(records, policy, forked_from=dict.fromkeys(forks.get((t, ns), ())), now=now) if chosen else set()

    def _trim_streams(self, work: _Thread, namespace: str | None, sizes: Mapping[str, int], report: PruneReport) -> None:
        """Step 6: the thread's streams lose the records of runs no record of which is left
        (deleted now, or by an earlier prune: their tombstones), ``streams._trim``."""
        if not self.backend.supports_kv:
            return
        for ns, records in work.chains.items():
            if namespace is not None and ns != namespace:
                continue
            gone = work.gone.get(ns, set())
            kept = {r.row.run_id for r in records if r.row.run_id and r.id not in gone}
            tomb = f"{TOMBSTONE}{ns.encode().hex()}:"
            runs = {r.row.run_id for r in records if r.row.run_id} - kept
            runs |= {k[len(tomb):] for k in sizes if k.startswith(tomb)}
            if runs:
                report.stream_records += self.run_sync(
                    trim_streams(self.codec, work.thread_id, ns, kept, runs, report.dry_run)
                )

    def _moved(self, work: _Thread) -> bool:
        for ns, records in work.chains.items():
            head = self.call_sync(call("head", work.thread_id, ns))
            if head is None or not records or head.checkpoint_id != records[-1].id:
                return True
        return False

    def _take_leases(self, t: str, work: _Thread, report: PruneReport) -> dict[str, tuple[Lease, Record]] | None:
        """The lease of each namespace to be pruned (None: one is held by a live run, the
        thread is skipped and reported). A store without leases: none taken."""
        if not self.backend.supports_leases:
            return {}
        taken: dict[str, tuple[Lease, Record]] = {}
        for ns, gone in work.gone.items():
            if not gone:
                continue
            top = work.chains[ns][-1]
            try:
                lease = run_sync(self.backend, acquire(
                    t, ns, "reject", DEFAULT_TTL, None, top.row.run_id, ahead=True, me=new_owner("prune")
                ))
            except ThreadBusyError as exc:
                report.skipped.append((t, ns, f"{holder_words(exc.holder)} holds its lease"))
                for held, held_top in taken.values():
                    run_sync(self.backend, give_back(held, held_top))
                return None
            taken[ns] = (lease, top)
        return taken
