"""``pk.ThreadLease``: a thread's lease held around work that is not a ``pk.resume`` block.

An adapter that runs a framework's own loop (LangGraph's ``durable_invoke``) takes
the same lease ``pk.resume`` takes, with the same busy policy and heartbeat; store
writes made inside :meth:`ThreadLease.fenced` carry its fencing token; and when the
adapter finds the thread's newest turn unfinished (its own bookkeeping says so),
:meth:`ThreadLease.wait_for` gives the lease up reserved for that turn (under
``busy="queue"`` keeping this turn's place at the front) and takes it again once
the turn was continued, as ``pk.resume`` does (``_turns``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .._io import Plan, run_async, run_sync
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
    :meth:`wait_for`. A store without lease primitives holds nothing under the default
    policy (``held`` stays False); asking for a policy there is a ``ConfigurationError``."""

    #: ``busy``'s default: ``"queue"``, asked of a store only if it has lease primitives.
    DEFAULT_BUSY = DEFAULT_BUSY
    #: Checks ``busy``, ``lease_ttl``, ``busy_timeout`` (``ConfigurationError``), as the constructor does.
    check_options = staticmethod(check_options)

    def __init__(
        self, store: Store, thread_id: str, namespace: str = "", *, run_id: str | None = None,
        busy: str | None = DEFAULT_BUSY, lease_ttl: float = DEFAULT_TTL, busy_timeout: float | None = DEFAULT_BUSY_TIMEOUT,
    ) -> None:
        check_options(busy, lease_ttl, busy_timeout)
        self.store, self.thread_id, self.namespace, self.run_id = store, thread_id, namespace, run_id
        self.busy, self.ttl, self.timeout = busy, float(lease_ttl), busy_timeout
        self._explicit = busy is not DEFAULT_BUSY
        self._holding: Holding | None = None
        self._since = time.monotonic()

    @property
    def held(self) -> bool:
        return self._holding is not None

    def _args(self) -> tuple[Store, str, str, str | None, bool, float, float | None, None, str | None]:
        return (self.store, self.thread_id, self.namespace, self.busy, self._explicit, self.ttl, self.timeout,
                None, self.run_id)

    def acquire(self) -> None:
        self._holding = hold_sync(*self._args())

    async def aacquire(self) -> None:
        self._holding = await hold_async(*self._args())

    def release(self) -> None:
        holding, self._holding = self._holding, None
        let_go_sync(self.store, holding)

    async def arelease(self) -> None:
        holding, self._holding = self._holding, None
        await let_go_async(self.store, holding)

    @contextmanager
    def fenced(self) -> Iterator[None]:
        """Store writes to this thread/namespace in this context carry the lease's token."""
        if self._holding is None:
            yield
        else:
            with fenced(self._holding.lease):
                yield

    def _aside(self, unfinished: str, why: str) -> Holding:
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
        holding.beat.stop()
        lease = holding.lease
        run_sync(self.store.backend, step_aside(lease, unfinished, str(self.busy)))
        if self.busy == "reject":
            raise unfinished_error(self.thread_id, unfinished, f"{why} (busy='reject')")
        new = run_sync(self.store.backend, self._again(lease))
        self._holding = Holding(new, Heartbeat(self.store.backend, new))

    async def await_for(self, unfinished: str, why: str = "") -> None:
        holding = self._aside(unfinished, why)
        assert holding.beat is not None
        await holding.beat.stop()
        lease = holding.lease
        await run_async(self.store.backend, step_aside(lease, unfinished, str(self.busy)))
        if self.busy == "reject":
            raise unfinished_error(self.thread_id, unfinished, f"{why} (busy='reject')")
        new = await run_async(self.store.backend, self._again(lease))
        self._holding = Holding(new, AsyncHeartbeat(self.store.backend, new))

    def _again(self, lease: Lease) -> Plan[Lease]:
        assert self.busy is not None
        me = (lease.owner, lease.probe)  # the same waiter: step_aside kept its place in the queue
        return acquire(self.thread_id, self.namespace, self.busy, self.ttl, self.timeout, self.run_id, me=me, since=self._since)
