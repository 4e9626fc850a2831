"""``store.drain_outbox()`` / ``adrain_outbox()``: run committed effects no process ran.

A sweeper (cron, a loop, ``persistkit drain-outbox``) calls it. For each thread (``prefix``,
or one ``thread_id``) and namespace it reads the thread's rows (newest first, pages of
500) and finds the effects registered by committed steps (``ac``) that no later row marks
done (``ad``). A thread with none is left alone, without touching its lease. Otherwise it
takes the thread's lease the way ``store.abandon`` does (ahead of the queue, within
``_PATIENCE`` = 2 seconds; a live holder, a run or another drain: the thread is skipped and
reported, naming which), reads the
thread again under it, runs the pending effects oldest first (each under its retry policy,
with its idempotency key; the first that fails for good stops the thread's drain and is
reported, it and those after it stay pending), and records the ones that ran in one
write: a copy of the head record carrying their ids (``_outbox.done_mark``), fenced by
the lease, so every reader sees the head it was (a crashed run still continues, a
suspended one still waits).

Cost: every row of every thread looked at is read and decoded once per drain (O(rows)):
pass ``prefix=`` or ``thread_id=`` to bound it. Uses only the store protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError, PersistkitError, ThreadBusyError
from .._io import Plan, call, run_async, run_sync
from ..state._records import Record, read_rows, targets
from . import _outbox as ob
from ._fence import write_under
from ._lease import DEFAULT_TTL, Lease, acquire, give_back, holder_words, new_owner

if TYPE_CHECKING:
    from ..backends._protocol import Backend, Head
    from ..codec._pipeline import Codec

__all__ = ["OutboxEffect", "OutboxReport", "OutboxStore"]

#: Seconds a drain waits for a held lease (a waiting turn looks at the thread for a moment
#: every second) before it skips the thread: a run that holds it longer is live, and runs
#: its pending effects itself when it resumes.
_PATIENCE = 2.0


@dataclass(frozen=True, slots=True)
class OutboxEffect:
    """One effect a drain found pending: where it was registered, and what became of it."""

    thread_id: str
    namespace: str
    run_id: str | None
    checkpoint_id: str
    position: str
    index: int
    function: str
    key: str
    #: None: it ran and is recorded done (or, with ``dry_run``, it is pending). Else why it did not.
    error: str | None = None


@dataclass(frozen=True, slots=True)
class OutboxReport:
    """What ``store.drain_outbox()`` did. ``ok`` is False when an effect failed for good."""

    threads: int
    done: tuple[OutboxEffect, ...] = ()
    failed: tuple[OutboxEffect, ...] = ()
    pending: tuple[OutboxEffect, ...] = ()  # dry_run: what would run
    skipped: tuple[tuple[str, str, str], ...] = ()  # (thread, namespace, why): a live holder

    @property
    def ok(self) -> bool:
        return not self.failed


def _effect(p: ob.Pending, error: str | None = None) -> OutboxEffect:
    row = p.rec.row
    return OutboxEffect(row.thread_id, row.namespace, row.run_id, row.checkpoint_id, p.position, p.index,
                        str(p.entry.get("f")), p.info().key, error)


def _scan(codec: Codec, t: str, ns: str) -> Plan[tuple[list[ob.Pending], Record | None, Head | None]]:
    """The thread's pending effects, its head record and head (nothing: no head)."""
    found = yield call("head_row", t, ns)
    if found is None:
        return [], None, None
    recs = yield from read_rows(codec, t, ns)
    return ob.pending_in(recs), Record.decode(codec, found[1]), found[0]


def _mark(codec: Codec, top: Record, head: Head, done: list[str], lease: Lease | None) -> Plan[None]:
    r = top.row
    row, _ = ob.done_mark(codec, r.thread_id, r.namespace, r.run_id, top.id, top.body, done, stored=True)
    yield write_under(lease, row, head.version)


class _Drain:
    """One drain's bookkeeping."""

    def __init__(self) -> None:
        self.threads = 0
        self.done: list[OutboxEffect] = []
        self.failed: list[OutboxEffect] = []
        self.pending: list[OutboxEffect] = []
        self.skipped: list[tuple[str, str, str]] = []

    def report(self) -> OutboxReport:
        return OutboxReport(self.threads, tuple(self.done), tuple(self.failed), tuple(self.pending), tuple(self.skipped))

    def unmarked(self, ran: list[ob.Pending], exc: PersistkitError) -> None:
        why = (f"it ran, but its done mark could not be written ({type(exc).__name__}: {exc}); it runs "
               "again, with the same idempotency key, at the next resume or drain")
        self.failed.extend(_effect(p, why) for p in ran)


def _check(prefix: str, thread_id: str | None, namespace: str | None, dry_run: bool) -> None:
    if not isinstance(prefix, str):
        raise ConfigurationError(f"drain_outbox(prefix=...) must be a str, got {type(prefix).__name__}")
    if thread_id is not None and (not isinstance(thread_id, str) or not thread_id.strip()):
        raise ConfigurationError(f"drain_outbox(thread_id=...) must be a non-empty str, got {thread_id!r}")
    if thread_id is not None and prefix:
        raise ConfigurationError(
            f"drain_outbox(prefix={prefix!r}, thread_id={thread_id!r}): give one or the other (one "
            "thread, or the threads whose ids start with the prefix), not both"
        )
    if namespace is not None and not isinstance(namespace, str):
        raise ConfigurationError(f"drain_outbox(namespace=...) must be a str or None, got {namespace!r}")
    if not isinstance(dry_run, bool):
        raise ConfigurationError(f"drain_outbox(dry_run=...) must be True or False, got {dry_run!r}")


def _lease_plan(t: str, ns: str, top: Record) -> Plan[Lease]:
    # a drain's owner id says it is one (drain@…): another drain, a run or a prune that finds
    # the lease held names it as a drain, not as a live run
    return acquire(t, ns, "wait", DEFAULT_TTL, _PATIENCE, top.row.run_id, ahead=True, me=new_owner("drain"))


def _skipped(exc: ThreadBusyError) -> str:
    """Why a drain passed a thread by (after waiting ``_PATIENCE`` for its lease)."""
    if exc.holder is None and exc.unfinished_run:
        return f"its lease is kept for its unfinished run {exc.unfinished_run}, which runs the effects"
    then = "drain again once it is done" if (exc.holder or "").startswith("prune@") else "it runs the effects"
    return f"{holder_words(exc.holder)} holds its lease (waited {_PATIENCE:g} s): {then}"


def _call_of(codec: Codec, p: ob.Pending) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Any]:
    where = p.where()
    fn = ob.resolve(str(p.entry.get("f")), codec, where)
    value = codec.decode(p.entry.get("a"), f"{where}: arguments")
    return fn, tuple(value.get("a") or ()), dict(value.get("k") or {}), ob.retry_of(p.entry.get("rt"))


class OutboxStore:
    """``pk.Store``'s outbox methods (``Store`` inherits this mixin)."""

    backend: Backend
    codec: Codec

    if TYPE_CHECKING:  # Store's own

        def _check_open(self) -> None: ...
        def run_sync(self, plan: Plan[Any]) -> Any: ...
        async def run_async(self, plan: Plan[Any]) -> Any: ...

    def drain_outbox(
        self, *, prefix: str = "", thread_id: str | None = None, namespace: str | None = None, dry_run: bool = False
    ) -> OutboxReport:
        """Run the after-commit effects that committed but that no process ran (its process died
        between a checkpoint and its effects), and record them done (docs/long-runs.md).

        Looks at the threads starting with ``prefix`` (or the one ``thread_id``), in every
        namespace (or ``namespace``; a third-party store without the optional ``namespaces()``
        primitive lists only the default namespace: pass ``namespace=`` for the others). A thread whose
        lease is held (a live run, another drain) is waited for about 2 s, then skipped and reported
        in ``skipped``, naming the holder (that run or drain runs them). ``dry_run``: list the
        pending effects, run nothing. Reads every row of each thread it looks at."""
        from ._drive import Heartbeat  # imports asyncio: not on `import persistkit`

        _check(prefix, thread_id, namespace, dry_run)
        self._check_open()
        drain = _Drain()
        for t, ns in self.run_sync(targets(thread_id, prefix, namespace)):
            drain.threads += 1
            pending, top, _ = self.run_sync(_scan(self.codec, t, ns))
            if not pending or top is None:
                continue
            if dry_run:
                drain.pending.extend(_effect(p) for p in pending)
                continue
            lease = None
            if self.backend.supports_leases:
                try:
                    lease = run_sync(self.backend, _lease_plan(t, ns, top))
                except ThreadBusyError as exc:
                    drain.skipped.append((t, ns, _skipped(exc)))
                    continue
            beat = Heartbeat(self.backend, lease) if lease is not None else None
            try:
                self._drain_one_sync(drain, t, ns, lease)
            finally:
                if beat is not None:
                    beat.stop()
                if lease is not None and lease.lost is None:
                    run_sync(self.backend, give_back(lease, top))
        return drain.report()

    def _drain_one_sync(self, drain: _Drain, t: str, ns: str, lease: Lease | None) -> None:
        pending, top, head = self.run_sync(_scan(self.codec, t, ns))  # again, under the lease
        ran: list[ob.Pending] = []
        for p in pending:
            try:
                fn, args, kwargs, retry = _call_of(self.codec, p)
                ob.call_sync(fn, args, kwargs, p.info(), retry)
            except PersistkitError as exc:
                drain.failed.append(_effect(p, str(exc)))
                break
            ran.append(p)
        if not ran:
            return
        try:
            self.run_sync(_mark(self.codec, top, head, [p.id for p in ran], lease))
        except PersistkitError as exc:
            drain.unmarked(ran, exc)
            return
        drain.done.extend(_effect(p) for p in ran)

    async def adrain_outbox(
        self, *, prefix: str = "", thread_id: str | None = None, namespace: str | None = None, dry_run: bool = False
    ) -> OutboxReport:
        """``drain_outbox`` for async code: ``async def`` effects are awaited, plain ones called."""
        from ._drive import AsyncHeartbeat

        _check(prefix, thread_id, namespace, dry_run)
        self._check_open()
        drain = _Drain()
        for t, ns in await self.run_async(targets(thread_id, prefix, namespace)):
            drain.threads += 1
            pending, top, _ = await self.run_async(_scan(self.codec, t, ns))
            if not pending or top is None:
                continue
            if dry_run:
                drain.pending.extend(_effect(p) for p in pending)
                continue
            lease = None
            if self.backend.supports_leases:
                try:
                    lease = await run_async(self.backend, _lease_plan(t, ns, top))
                except ThreadBusyError as exc:
                    drain.skipped.append((t, ns, _skipped(exc)))
                    continue
            beat = AsyncHeartbeat(self.backend, lease) if lease is not None else None
            try:
                await self._drain_one_async(drain, t, ns, lease)
            finally:
                if beat is not None:
                    await beat.stop()
                if lease is not None and lease.lost is None:
                    await run_async(self.backend, give_back(lease, top))
        return drain.report()

    async def _drain_one_async(self, drain: _Drain, t: str, ns: str, lease: Lease | None) -> None:
        pending, top, head = await self.run_async(_scan(self.codec, t, ns))
        ran: list[ob.Pending] = []
        for p in pending:
            try:
                fn, args, kwargs, retry = _call_of(self.codec, p)
                await ob.call_async(fn, args, kwargs, p.info(), retry)
            except PersistkitError as exc:
                drain.failed.append(_effect(p, str(exc)))
                break
            ran.append(p)
        if not ran:
            return
        try:
            await self.run_async(_mark(self.codec, top, head, [p.id for p in ran], lease))
        except PersistkitError as exc:
            drain.unmarked(ran, exc)
            return
        drain.done.extend(_effect(p) for p in ran)
