"""What ``pk.resume`` calls: take the lease before the run opens, hold it (heartbeat)
while the block runs, give it up when the block exits. The run itself only passes
the lease's token to its writes (``Store.write_fenced_sync``/``write_fenced_async``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import PersistkitError
from .._io import Plan, run_async, run_sync
from ._drive import AsyncHeartbeat, Heartbeat
from ._lease import Lease, LeaseInfo, acquire, info, release

if TYPE_CHECKING:
    from ..backends._protocol import Backend
    from ..engine._run import Run


class Store(Protocol):
    """What these hooks use of a ``persistkit.Store`` (which imports this module, so
    the type is named by what it offers, not imported)."""

    backend: Backend
    _closed: bool

    def _check_open(self) -> None: ...

__all__ = ["Holding", "hold_async", "hold_sync", "leases_async", "leases_sync", "owns_lease"]

log = logging.getLogger("persistkit.coordination")


class Holding:
    """A block's lease and its heartbeat."""

    __slots__ = ("beat", "lease")

    def __init__(self, lease: Lease, beat: Any) -> None:
        self.lease = lease
        self.beat = beat


def _wanted(store: Store, busy: str | None, explicit: bool) -> bool:
    if busy is None:
        return False
    if not store.backend.supports_leases:
        if explicit:  # the backend's own method says what is missing
            store.backend.lease_get("", "")
        return False  # a third-party store without leases: run as before
    return True


def _enclosing(outer: Run | None, store: Store, thread_id: str, namespace: str) -> Holding | None:
    """A block nested in a block of the same thread shares its lease (re-entrant, like an
    RLock: waiting for itself would never end); the two runs then meet at the head's
    compare-and-swap as before leases (the second to commit gets ``ConflictError``)."""
    if outer is None or outer.lease is None or outer.store is not store:
        return None
    if outer.thread_id != thread_id or outer.namespace != namespace:
        return None
    return Holding(outer.lease, None)


def hold_sync(
    store: Store, thread_id: str, namespace: str, busy: str | None, explicit: bool, ttl: float,
    timeout: float | None, outer: Run | None, run_id: str | None = None,
    finished: Callable[[], Plan[bool]] | None = None, unfinished: float | None = None,
) -> Holding | None:
    if not _wanted(store, busy, explicit):
        return None
    assert busy is not None
    shared = _enclosing(outer, store, thread_id, namespace)
    if shared is not None:
        return shared
    store._check_open()
    lease = run_sync(store.backend, acquire(thread_id, namespace, busy, ttl, timeout, run_id, finished=finished, unfinished=unfinished))
    return Holding(lease, Heartbeat(store.backend, lease))


def owns_lease(holding: Holding | None) -> bool:
    """Whether the block took its lease itself (not an enclosing block's): its end record
    may then give the lease up with it (``Run.release_at_end``)."""
    return holding is not None and holding.beat is not None


def let_go_sync(store: Store, holding: Holding | None) -> None:
    if holding is None or holding.beat is None:  # no lease, or the enclosing block's
        return
    holding.beat.stop()
    if holding.lease.lost is None and not store._closed:
        try:
            run_sync(store.backend, release(holding.lease))
        except PersistkitError as exc:  # never hide the block's own outcome: the lease expires by itself
            _unreleased(holding.lease, exc)


async def hold_async(
    store: Store, thread_id: str, namespace: str, busy: str | None, explicit: bool, ttl: float,
    timeout: float | None, outer: Run | None, run_id: str | None = None,
    finished: Callable[[], Plan[bool]] | None = None, unfinished: float | None = None,
) -> Holding | None:
    if not _wanted(store, busy, explicit):
        return None
    assert busy is not None
    shared = _enclosing(outer, store, thread_id, namespace)
    if shared is not None:
        return shared
    store._check_open()
    lease = await run_async(
        store.backend, acquire(thread_id, namespace, busy, ttl, timeout, run_id, finished=finished, unfinished=unfinished)
    )
    return Holding(lease, AsyncHeartbeat(store.backend, lease))


async def let_go_async(store: Store, holding: Holding | None) -> None:
    if holding is None or holding.beat is None:
        return
    await holding.beat.stop()
    if holding.lease.lost is None and not store._closed:
        try:
            await run_async(store.backend, release(holding.lease))
        except PersistkitError as exc:
            _unreleased(holding.lease, exc)


def _unreleased(lease: Lease, exc: PersistkitError) -> None:
    log.warning(
        "persistkit: could not release the lease of thread %r (%s); it expires in %s s by itself",
        lease.thread_id, exc, lease.ttl,
    )


def leases_sync(store: Store, prefix: str) -> list[LeaseInfo]:
    return [info(t, ns, rec) for t, ns, rec in store.backend.lease_list(prefix=prefix)]


async def leases_async(store: Store, prefix: str) -> list[LeaseInfo]:
    return [info(t, ns, rec) for t, ns, rec in await store.backend.alease_list(prefix=prefix)]
