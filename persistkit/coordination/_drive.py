"""The heartbeats that renew a lease. Lease plans are driven by ``_io``'s loops
(``run_sync``/``run_async``: a ``Call`` with its transient retries, or a
``Sleep``). The heartbeat renews a held lease every third of its TTL on a timer
thread (sync blocks) or an asyncio task (async blocks), never on the step path:
a step with a lease held costs nothing beyond its fenced write.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
import weakref
from typing import Any, TypeVar

from .._errors import LeaseLostError
from .._io import run_async, run_sync
from ..backends import Backend
from ._lease import DEFAULT_TTL, Lease

__all__ = ["AsyncHeartbeat", "Heartbeat"]

log = logging.getLogger("persistkit.coordination")
T = TypeVar("T")


def _beat_failed(lease: Lease, exc: BaseException) -> bool:
    """Record what a failed renewal means; True when the heartbeat should stop."""
    if isinstance(exc, LeaseLostError):
        lease.lost = exc
        return True
    # The store is unreachable: try again next beat. If the lease expires meanwhile and
    # another run takes over, the fenced write refuses this run's next commit.
    log.warning("persistkit: could not renew the lease of thread %r: %s", lease.thread_id, exc)
    return False


class _Beater:
    """One daemon thread per process renewing every lease held by a sync block, each when due.

    Starting and joining a thread per block cost ~1 ms, more than a short run's
    steps; this thread starts once (again after a fork) and sleeps until the next
    renewal is due. With nothing to renew it still wakes every ``DEFAULT_TTL / 3``:
    a block with the default TTL (or a longer one) then never has to wake it, since
    its renewal falls after the thread's next wake-up anyway. Sleeping longer made
    the first block after an idle spell wake it (a GIL hand-over, and the thread,
    late, often found that short block gone and slept long again: so did the next).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[int, tuple[float, Backend, weakref.ref[Lease]]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._wake_at = 0.0  # when the thread wakes up next: only an earlier renewal wakes it

    def add(self, backend: Backend, lease: Lease) -> int:
        with self._cond:
            key = next(self._ids)
            at = time.monotonic() + lease.ttl / 3
            self._due[key] = (at, backend, weakref.ref(lease))
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="persistkit-leases", daemon=True)
                self._thread.start()
            elif at < self._wake_at:
                self._cond.notify()  # (waking it costs a GIL hand-over: only when it must)
            return key

    def remove(self, key: int) -> None:
        with self._cond:
            self._due.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [(k, b, r) for k, (at, b, r) in self._due.items() if at <= now]
                if not due:
                    self._wake_at = min((at for at, _, _ in self._due.values()), default=now + DEFAULT_TTL / 3)
                    self._cond.wait(self._wake_at - now)
                    continue
            for key, backend, ref in due:
                lease = ref()
                stop = lease is None or lease.lost is not None
                if lease is not None and not stop:
                    try:
                        run_sync(backend, lease.renewal())
                    except Exception as exc:  # never let one store's failure end every lease's heartbeat
                        stop = _beat_failed(lease, exc)
                with self._cond:
                    if key in self._due:
                        if stop:
                            del self._due[key]
                        elif lease is not None:
                            self._due[key] = (time.monotonic() + lease.ttl / 3, backend, ref)
                del lease


_BEATER = _Beater()


class Heartbeat:
    """Renews ``lease`` every ``ttl / 3`` (on the process's lease thread) until ``stop()``.

    Holds the lease weakly: an abandoned block's lease is not renewed forever.
    """

    def __init__(self, backend: Backend, lease: Lease) -> None:
        self._key = _BEATER.add(backend, lease)

    def stop(self) -> None:
        _BEATER.remove(self._key)


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
            await run_async(backend, lease.renewal())
        except Exception as exc:
            if _beat_failed(lease, exc):
                return
        del lease
