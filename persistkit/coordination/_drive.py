"""The blocking and the awaiting loop for lease plans, and the heartbeats that renew a lease.

A plan yields ``Call`` (one backend request, with the transient retries of
``_io``) or ``Sleep``. The heartbeat renews a held lease every third of its TTL
on a timer thread (sync blocks) or an asyncio task (async blocks), never on
the step path: a step with a lease held costs nothing beyond its fenced write.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from typing import Any, TypeVar

from .._errors import LeaseLostError, PersistkitError
from .._io import call_async, call_sync
from ..backends import Backend
from ._lease import Lease, Plan, Sleep, renew

__all__ = ["AsyncHeartbeat", "Heartbeat", "drive_async", "drive_sync"]

log = logging.getLogger("persistkit.coordination")
T = TypeVar("T")


def drive_sync(backend: Backend, plan: Plan[T]) -> T:
    try:
        req = next(plan)
        while True:
            if isinstance(req, Sleep):
                time.sleep(req.seconds)
                req = plan.send(None)
                continue
            try:
                result = call_sync(backend, req)
            except BaseException as exc:
                req = plan.throw(exc)
            else:
                req = plan.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def drive_async(backend: Backend, plan: Plan[T]) -> T:
    try:
        req = next(plan)
        while True:
            if isinstance(req, Sleep):
                await asyncio.sleep(req.seconds)
                req = plan.send(None)
                continue
            try:
                result = await call_async(backend, req)
            except BaseException as exc:
                req = plan.throw(exc)
            else:
                req = plan.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _beat_failed(lease: Lease, exc: BaseException) -> bool:
    """Record what a failed renewal means; True when the heartbeat should stop."""
    if isinstance(exc, LeaseLostError):
        lease.lost = exc
        return True
    # The store is unreachable: try again next beat. If the lease expires meanwhile and
    # another run takes over, the fenced write refuses this run's next commit.
    log.warning("persistkit: could not renew the lease of thread %r: %s", lease.thread_id, exc)
    return False


class Heartbeat:
    """Renews ``lease`` every ``ttl / 3`` on a daemon thread until ``stop()`` (or the lease is gone)."""

    def __init__(self, backend: Backend, lease: Lease) -> None:
        self._backend = backend
        self._lease = weakref.ref(lease)  # an abandoned block's lease is not kept alive forever
        self._stopped = threading.Event()
        self._interval = lease.ttl / 3
        self._thread = threading.Thread(target=self._run, name=f"persistkit-lease-{lease.token}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            lease = self._lease()
            if lease is None or lease.lost is not None:
                return
            try:
                drive_sync(self._backend, renew(lease))
            except PersistkitError as exc:
                if _beat_failed(lease, exc):
                    return
            del lease

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


class AsyncHeartbeat:
    """The heartbeat of an ``async with`` block: a task on the block's event loop."""

    def __init__(self, backend: Backend, lease: Lease) -> None:
        self._task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(
            _abeat(backend, weakref.ref(lease), lease.ttl / 3), name=f"persistkit-lease-{lease.token}"
        )

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.wait([self._task])  # unlike awaiting it, never swallows our own cancellation


async def _abeat(backend: Backend, ref: weakref.ref[Lease], interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        lease = ref()
        if lease is None or lease.lost is not None:
            return
        try:
            await drive_async(backend, renew(lease))
        except PersistkitError as exc:
            if _beat_failed(lease, exc):
                return
        del lease
