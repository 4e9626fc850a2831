"""Conformance checks for the lease primitives of a store (``persistkit.coordination``).

Subclass :class:`LeaseConformance` beside :class:`~persistkit.testing.backend_suite.BackendConformance`
with the same ``persistkit_url`` fixture (and ``backend_options`` if needed)::

    class TestMyStoreLeases(LeaseConformance):
        @pytest.fixture
        def persistkit_url(self) -> str:
            return "mystore://localhost/test"

It checks the contract of ``lease_get`` / ``lease_swap`` / ``lease_list`` /
``write_fenced`` / ``write_fenced_swap`` (see :class:`persistkit.backends.Backend`):
the swap is a compare-and-swap on the version (one winner among racers), records
survive ``delete_thread``, a fenced write with a stale token writes nothing — also
when it races the takeover, from another instance of the store —, a write that
swaps the lease too swaps it only when the write lands and the version matches;
and, through ``pk.resume``, that turns of one thread keep their order when one
crashed (:mod:`persistkit.testing.turn_suite`).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from .._errors import ConflictError, LeaseLostError
from ..backends import Backend, CheckpointRow, open_backend
from .turn_suite import TurnConformance

__all__ = ["LeaseConformance"]


def _row(thread_id: str, n: int, parent: int | None = None) -> CheckpointRow:
    return CheckpointRow(thread_id, "", f"{n:024x}", None if parent is None else f"{parent:024x}", "r", b"p%d" % n)


class LeaseConformance(TurnConformance):
    """Mix into a test class that provides ``persistkit_url``. Includes the turn-order
    checks of :class:`~persistkit.testing.turn_suite.TurnConformance` (a crashed run keeps
    its place, ``store.abandon``)."""

    @pytest.fixture
    def backend(self, persistkit_url: str, backend_options: dict[str, Any]) -> Iterator[Backend]:
        b = open_backend(persistkit_url, **backend_options)
        yield b
        b.close()

    @pytest.fixture
    def other(self, persistkit_url: str, backend_options: dict[str, Any]) -> Iterator[Backend]:
        b = open_backend(persistkit_url, **backend_options)
        yield b
        b.close()

    @staticmethod
    def tid(tag: str = "lease") -> str:
        return f"{tag}-{uuid.uuid4().hex}"

    def test_supports_leases(self, backend: Backend) -> None:
        assert backend.supports_leases

    def test_swap_is_a_compare_and_swap(self, backend: Backend, other: Backend) -> None:
        t = self.tid()
        assert backend.lease_get(t, "") is None
        assert backend.lease_swap(t, "", 0, 1, b"first")
        assert not other.lease_swap(t, "", 0, 1, b"again")  # exists already
        rec = other.lease_get(t, "")
        assert rec is not None and (rec.token, rec.data, rec.version) == (1, b"first", 1)
        assert not backend.lease_swap(t, "", 2, 5, b"wrong version")
        assert other.lease_swap(t, "", 1, 1, b"renewed")
        rec = backend.lease_get(t, "")
        assert rec is not None and (rec.token, rec.data, rec.version) == (1, b"renewed", 2)
        assert backend.lease_get(t, "other namespace") is None

    def test_one_winner_among_racing_swaps(self, backend: Backend, other: Backend) -> None:
        t = self.tid()
        assert backend.lease_swap(t, "", 0, 1, b"")
        barrier = threading.Barrier(8)

        def race(i: int) -> bool:
            b = backend if i % 2 else other
            barrier.wait(timeout=60)
            return b.lease_swap(t, "", 1, 2, b"%d" % i)

        with ThreadPoolExecutor(8) as pool:
            won = list(pool.map(race, range(8)))
        assert won.count(True) == 1
        rec = backend.lease_get(t, "")
        assert rec is not None and rec.version == 2 and rec.data == b"%d" % won.index(True)

    def test_records_survive_delete_thread_and_are_listed(self, backend: Backend) -> None:
        base = self.tid("list")
        for i, ns in enumerate(["", "ns"]):
            assert backend.lease_swap(f"{base}/a", ns, 0, 3 + i, b"x")
        assert backend.lease_swap(f"{base}/b", "", 0, 7, b"y")
        backend.write_fenced(_row(f"{base}/b", 1), {}, 0, 7)
        backend.delete_thread(f"{base}/b")
        rec = backend.lease_get(f"{base}/b", "")
        assert rec is not None and rec.token == 7  # tokens never restart
        listed = [(t, ns, r.token) for t, ns, r in backend.lease_list(prefix=base)]
        assert listed == [(f"{base}/a", "", 3), (f"{base}/a", "ns", 4), (f"{base}/b", "", 7)]
        everything = {(t, ns, r.token) for t, ns, r in backend.lease_list()}  # no prefix: the whole store
        assert set(listed) <= everything

    def test_a_stale_token_writes_nothing(self, backend: Backend, other: Backend) -> None:
        t = self.tid()
        assert backend.lease_swap(t, "", 0, 1, b"")
        backend.write_fenced(_row(t, 1), {"k1": b"v"}, 0, 1)
        assert other.lease_swap(t, "", 1, 2, b"")  # taken over, through another instance
        with pytest.raises(LeaseLostError) as caught:
            backend.write_fenced(_row(t, 2, 1), {"k2": b"v"}, 1, 1)
        assert (caught.value.token, caught.value.found) == (1, 2)
        head = other.head(t, "")
        assert head is not None and (head.checkpoint_id, head.version) == (f"{1:024x}", 1)
        assert other.get(t, "", f"{2:024x}") is None
        other.write_fenced(_row(t, 3, 1), {}, 1, 2)  # the new holder goes on
        with pytest.raises(ConflictError):  # a wrong version is still a conflict
            other.write_fenced(_row(t, 4, 3), {}, 1, 2)
        with pytest.raises(LeaseLostError):
            asyncio.run(backend.awrite_fenced(_row(t, 5, 3), {}, 2, 1))
        assert asyncio.run(other.awrite_fenced(_row(t, 6, 3), {}, 2, 2)).version == 3

    def test_write_fenced_swap(self, backend: Backend, other: Backend) -> None:
        """``write_fenced_swap``: the fenced write, and the lease's compare-and-swap with it
        (how a run's end record gives its lease up). The swap needs the write to land and
        the record's version to match; a stale token or a moved head writes and swaps nothing."""
        t = self.tid()
        assert backend.lease_swap(t, "", 0, 1, b"held")
        head, swapped = backend.write_fenced_swap(_row(t, 1), {"k1": b"v"}, 0, 1, 1, b"freed")
        assert head == other.head(t, "") and head.version == 1 and swapped
        rec = other.lease_get(t, "")
        assert rec is not None and (rec.token, rec.data, rec.version) == (1, b"freed", 2)
        assert other.get_blobs(t, ["k1"]) == {"k1": b"v"}
        # the record moved since (a waiter queued): the write lands, the swap does not
        assert other.lease_swap(t, "", 2, 1, b"a waiter queued")
        head, swapped = backend.write_fenced_swap(_row(t, 2, 1), {}, 1, 1, 2, b"freed again")
        assert head.version == 2 and not swapped
        rec = other.lease_get(t, "")
        assert rec is not None and (rec.data, rec.version) == (b"a waiter queued", 3)
        # a moved head: ConflictError, nothing swapped
        with pytest.raises(ConflictError):
            backend.write_fenced_swap(_row(t, 3, 1), {}, 1, 1, 3, b"never")
        rec = other.lease_get(t, "")
        assert rec is not None and (rec.data, rec.version) == (b"a waiter queued", 3)
        # taken over: LeaseLostError, nothing written, nothing swapped (sync and async)
        assert other.lease_swap(t, "", 3, 2, b"new holder")
        with pytest.raises(LeaseLostError):
            backend.write_fenced_swap(_row(t, 4, 2), {}, 2, 1, 4, b"never")
        with pytest.raises(LeaseLostError):
            asyncio.run(backend.awrite_fenced_swap(_row(t, 4, 2), {}, 2, 1, 4, b"never"))
        rec = other.lease_get(t, "")
        assert rec is not None and (rec.token, rec.data, rec.version) == (2, b"new holder", 4)
        assert other.get(t, "", f"{4:024x}") is None
        # the new holder's end record, async, gives it up
        head, swapped = asyncio.run(other.awrite_fenced_swap(_row(t, 5, 2), {}, 2, 2, 4, b"freed by 2"))
        assert head.version == 3 and swapped
        rec = backend.lease_get(t, "")
        assert rec is not None and (rec.token, rec.data, rec.version) == (2, b"freed by 2", 5)

    def test_first_write_of_a_thread_is_fenced(self, backend: Backend, other: Backend) -> None:
        t = self.tid()
        assert backend.lease_swap(t, "", 0, 1, b"")
        assert other.lease_swap(t, "", 1, 2, b"")
        with pytest.raises(LeaseLostError):
            backend.write_fenced(_row(t, 1), {}, 0, 1)
        assert other.head(t, "") is None

    def test_a_lease_without_a_write_is_no_thread(self, backend: Backend, other: Backend) -> None:
        """Taking a lease (or having it taken over) on a thread never written creates no
        thread: a store may mark the thread for fencing (S3's placeholder head), but no
        reader shows it, and ``delete_thread`` finds nothing to delete."""
        t = self.tid("bare")
        assert backend.lease_swap(t, "", 0, 1, b"")
        assert other.lease_swap(t, "", 1, 2, b"")  # a takeover seals whatever is there
        for b in (backend, other):
            assert b.head(t, "") is None
            assert b.list(t, "") == []
            assert b.get(t, "", f"{1:024x}") is None
            if type(b).namespaces is not Backend.namespaces:  # optional: only where implemented
                assert b.namespaces(t) == []
            assert b.threads(prefix=t) == []
        assert other.delete_thread(t) is False
        other.write_fenced(_row(t, 1), {}, 0, 2)  # the holder's first write is an ordinary one
        assert backend.threads(prefix=t) == [t]
        if type(backend).namespaces is not Backend.namespaces:
            assert backend.namespaces(t) == [""]
        assert backend.delete_thread(t) is True
        assert backend.threads(prefix=t) == []
        rec = backend.lease_get(t, "")
        assert rec is not None and rec.token == 2

    def test_no_stale_write_lands_after_the_takeover(self, backend: Backend, other: Backend) -> None:
        """A holder keeps writing while another instance takes the lease over: every write
        that starts after the takeover returned is refused, and the chain has no gap."""
        t = self.tid()
        assert backend.lease_swap(t, "", 0, 1, b"")
        taken, first = threading.Event(), threading.Event()
        started_after: list[int] = []
        landed: list[int] = []

        def holder() -> None:
            version, n = 0, 1
            while n < 400:
                after = taken.is_set()
                try:
                    backend.write_fenced(_row(t, n, n - 1 if n > 1 else None), {}, version, 1)
                except LeaseLostError:
                    return
                landed.append(n)
                first.set()
                if after:
                    started_after.append(n)
                version, n = version + 1, n + 1

        writer = threading.Thread(target=holder)
        writer.start()
        assert first.wait(timeout=60)
        assert other.lease_swap(t, "", 1, 2, b"")
        taken.set()
        writer.join(timeout=120)
        assert not writer.is_alive()
        assert started_after == []
        head = other.head(t, "")
        assert head is not None and head.version == len(landed)
