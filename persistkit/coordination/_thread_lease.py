"""``pk.ThreadLease``: a thread's lease held around work that is not a ``pk.resume`` block.

An adapter that runs a framework's own loop (LangGraph's ``durable_invoke``) takes
the same lease ``pk.resume`` takes, with the same busy policy and heartbeat; store
writes made inside :meth:`ThreadLease.fenced` carry its fencing token; and when the
adapter finds the thread's newest turn unfinished (its own bookkeeping says so),
:meth:`ThreadLease.wait_for` gives the lease up reserved for that turn (under
``busy="queue"`` keeping this turn's place at the front) and takes it again once
the turn was continued, as ``pk.resume`` does (``_turns``). :meth:`ThreadLease.take_slot`
takes a concurrency slot (``pk.resume(concurrency=)``'s) once the turn knows it runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError, ThreadBusyError
from .._io import Plan, call, run_async, run_sync
from . import _concurrency as C
from ._drive import AsyncHeartbeat, Heartbeat
from ._fence import fenced
from ._hooks import Holding, hold_async, hold_sync, let_go_async, let_go_sync
from ._lease import (
    DEFAULT_BUSY,
    DEFAULT_BUSY_TIMEOUT,
    DEFAULT_TTL,
    Lease,
    acquire,
    check_options,
    check_unfinished,
    step_aside,
    unfinished_error,
)

if TYPE_CHECKING:
    from ..engine._store import Store

__all__ = ["ThreadLease"]


class ThreadLease:
    """The lease of ``(thread_id, namespace)`` for one turn ``run_id`` (None: a turn that
    continues whatever the thread left unfinished). ``busy``, ``lease_ttl`` and
    ``busy_timeout`` are ``pk.resume``'s; ``busy_timeout`` counts the whole wait, including
    :meth:`wait_for` and :meth:`take_slot` (``concurrency``, ``pk.resume``'s too). ``unfinished_timeout`` too: past it, a wait for another turn's unfinished
    run raises ``ThreadBusyError`` with ``retry_after`` (a job queue's worker goes back to the
    pool, where that run's redelivery needs one). A store without lease primitives holds nothing under the default
    policy (``held`` stays False); asking for a policy there is a ``ConfigurationError``.

    One object is one holding: :meth:`acquire` while it holds (or until :meth:`release`)
    is a ``ConfigurationError`` (it would wait for itself); :meth:`fenced` and
    :meth:`wait_for` before :meth:`acquire` are ``ConfigurationError`` too (a write
    would go out unfenced). :meth:`release` is idempotent: with nothing held (never
    acquired, or released already) it does nothing, so it fits a ``finally``."""

    #: ``busy``'s default: ``"queue"``, asked of a store only if it has lease primitives.
    DEFAULT_BUSY = DEFAULT_BUSY
    #: ``pk.resume``'s defaults, for entry points that take its options (the adapters' turns).
    DEFAULT_TTL = DEFAULT_TTL
    DEFAULT_BUSY_TIMEOUT = DEFAULT_BUSY_TIMEOUT
    #: Checks ``busy``, ``lease_ttl``, ``busy_timeout`` (``ConfigurationError``), as the constructor does.
    check_options = staticmethod(check_options)

    def __init__(
        self, store: Store, thread_id: str, namespace: str = "", *, run_id: str | None = None,
        busy: str | None = DEFAULT_BUSY, lease_ttl: float = DEFAULT_TTL, busy_timeout: float | None = DEFAULT_BUSY_TIMEOUT,
        unfinished_timeout: float | None = None, concurrency: Any = None,
    ) -> None:
        check_options(busy, lease_ttl, busy_timeout)
        check_unfinished(busy, unfinished_timeout)
        #: ``pk.resume(concurrency=)``'s limit, checked; :meth:`take_slot` takes its slot
        self.concurrency = C.check_concurrency(concurrency, busy)
        if not isinstance(thread_id, str) or not thread_id:
            raise ConfigurationError(f"ThreadLease: thread_id must be a non-empty str, got {thread_id!r}")
        if not isinstance(namespace, str):
            raise ConfigurationError(f"ThreadLease: namespace must be a str ('' for none), got {namespace!r}")
        self.store, self.thread_id, self.namespace, self.run_id = store, thread_id, namespace, run_id
        self.busy, self.ttl, self.timeout = busy, float(lease_ttl), busy_timeout
        self.unfinished = unfinished_timeout
        self._explicit = busy is not DEFAULT_BUSY
        self._holding: Holding | None = None
        self._slot: C.Held | None = None
        self._acquired = False  # between acquire() and release(), even on a store without leases
        self._since = time.monotonic()

    @property
    def held(self) -> bool:
        return self._holding is not None

    def _args(
        self,
    ) -> tuple[Store, str, str, str | None, bool, float, float | None, None, str | None, None, float | None]:
        return (self.store, self.thread_id, self.namespace, self.busy, self._explicit, self.ttl, self.timeout,
                None, self.run_id, None, self.unfinished)

    def _not_twice(self) -> None:
        if self._acquired:
            raise ConfigurationError(
                f"this ThreadLease of thread {self.thread_id!r} is acquired already: acquiring it again "
                "would wait for itself. Call release() first, or make another pk.ThreadLease"
            )

    def _needs(self, what: str) -> None:
        if not self._acquired:
            raise ConfigurationError(
                f"ThreadLease.{what} of thread {self.thread_id!r} before acquire() (or after release()): "
                "call acquire() (aacquire()) first"
            )

    def acquire(self) -> None:
        self._not_twice()
        self._holding = hold_sync(*self._args())
        self._acquired = True

    async def aacquire(self) -> None:
        self._not_twice()
        self._holding = await hold_async(*self._args())
        self._acquired = True

    def release(self) -> None:
        """Give the slot (:meth:`take_slot`) and the lease up; nothing to do when nothing is
        held (idempotent)."""
        slot, self._slot = self._slot, None
        try:
            C.let_go_sync(self.store, slot)
        finally:
            holding, self._holding, self._acquired = self._holding, None, False
            let_go_sync(self.store, holding)

    async def arelease(self) -> None:
        slot, self._slot = self._slot, None
        try:
            await C.let_go_async(self.store, slot)
        finally:
            holding, self._holding, self._acquired = self._holding, None, False
            await let_go_async(self.store, holding)

    def _spec(self) -> C.Concurrency | None:
        self._needs("take_slot()")
        return None if self._slot is not None else self.concurrency

    def _deadline(self) -> float | None:
        return None if self.timeout is None else self._since + self.timeout

    def take_slot(self) -> None:
        """Take a slot of the lease's ``concurrency`` (``(name, key, limit)`` or
        ``pk.Concurrency``, as ``pk.resume(concurrency=)``) for this holding, under its ``busy``
        policy and ``busy_timeout`` (``ConcurrencyLimitError``); :meth:`release` (and
        :meth:`wait_for`) give it up. Call it once the turn knows it runs (a turn that only
        replays, or waits for another, holds none). Without ``concurrency``, or with a slot held
        already, it does nothing; nothing is taken under an enclosing ``pk.resume`` block of the
        thread (that block's turn holds the slot, if any)."""
        spec = self._spec()
        if spec is not None:
            self._slot = C.take_sync(
                self.store, spec, self._holding, str(self.busy), self.ttl, self._deadline(), self.timeout
            )

    async def atake_slot(self) -> None:
        spec = self._spec()
        if spec is not None:
            self._slot = await C.take_async(
                self.store, spec, self._holding, str(self.busy), self.ttl, self._deadline(), self.timeout
            )

    @contextmanager
    def fenced(self) -> Iterator[None]:
        """Store writes to this thread/namespace in this context carry the lease's token
        (none on a store without leases, where :meth:`acquire` held nothing)."""
        self._needs("fenced()")
        if self._holding is None:
            yield
        else:
            with fenced(self._holding.lease):
                yield

    def _aside(self, unfinished: str, why: str) -> Holding:
        self._needs(f"wait_for({unfinished!r})")
        holding, self._holding = self._holding, None
        if holding is None or holding.beat is None:  # no lease, or an enclosing block's
            if holding is not None:
                self._holding = holding
            raise unfinished_error(self.thread_id, unfinished, f"{why}: this turn holds no lease of its own, so it cannot wait")
        return holding

    def wait_for(self, unfinished: str, why: str = "") -> None:
        """Give the lease up reserved for the unfinished run ``unfinished`` and hold it again
        once that run was continued (or abandoned); ``ThreadBusyError`` (``unfinished_run``)
        at once under ``busy="reject"``, or when ``busy_timeout`` ran out."""
        holding = self._aside(unfinished, why)
        assert holding.beat is not None
        slot, self._slot = self._slot, None
        C.let_go_sync(self.store, slot)
        holding.beat.stop()
        lease = holding.lease
        self._acquired = False  # until it holds again
        run_sync(self.store.backend, step_aside(lease, unfinished, str(self.busy)))
        try:
            if self.busy == "reject":
                raise unfinished_error(self.thread_id, unfinished, f"{why} (busy='reject')")
            new = run_sync(self.store.backend, self._again(lease))
        except ThreadBusyError as exc:
            raise self._named(exc, unfinished, self.store.run_sync(self._known(unfinished))) from None
        self._holding, self._acquired = Holding(new, Heartbeat(self.store.backend, new)), True

    async def await_for(self, unfinished: str, why: str = "") -> None:
        holding = self._aside(unfinished, why)
        assert holding.beat is not None
        slot, self._slot = self._slot, None
        await C.let_go_async(self.store, slot)
        await holding.beat.stop()
        lease = holding.lease
        self._acquired = False
        await run_async(self.store.backend, step_aside(lease, unfinished, str(self.busy)))
        try:
            if self.busy == "reject":
                raise unfinished_error(self.thread_id, unfinished, f"{why} (busy='reject')")
            new = await run_async(self.store.backend, self._again(lease))
        except ThreadBusyError as exc:
            raise self._named(exc, unfinished, await self.store.run_async(self._known(unfinished))) from None
        self._holding, self._acquired = Holding(new, AsyncHeartbeat(self.store.backend, new)), True

    def _known(self, run_id: str) -> Plan[bool]:
        """Whether the store holds a record of ``run_id`` on this thread (one indexed read)."""
        page = yield call("list", self.thread_id, self.namespace, run_id=run_id, limit=1)
        return bool(page)

    def _named(self, exc: ThreadBusyError, unfinished: str, known: bool) -> ThreadBusyError:
        """``exc``, or, for a run the store has no record of, an error that says so (the caller
        named it; an adapter keeping its own bookkeeping may know runs the store does not)."""
        if known or exc.unfinished_run != unfinished:
            return exc
        where = f" in namespace {self.namespace!r}" if self.namespace else ""
        return ThreadBusyError(
            f"thread {self.thread_id!r}: this turn waited for run {unfinished!r}, which its caller named "
            f"as the thread's unfinished turn (ThreadLease.wait_for), but the store has no record of a run "
            f"{unfinished!r} on this thread{where}: it is unknown here, and unless the caller's own records "
            "know it, nothing will ever continue it. Check the run id given to wait_for; the thread's next "
            "turn re-checks and goes on by itself",
            thread_id=self.thread_id, waiting=exc.waiting, unfinished_run=unfinished,
        )

    def _again(self, lease: Lease) -> Plan[Lease]:
        assert self.busy is not None
        me = (lease.owner, lease.probe)  # the same waiter: step_aside kept its place in the queue
        return acquire(
            self.thread_id, self.namespace, self.busy, self.ttl, self.timeout, self.run_id, me=me, since=self._since,
            unfinished=self.unfinished, looked=True,
        )
