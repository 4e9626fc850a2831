"""Conformance checks for the ``prune`` capability of a store (what retention builds on).

Subclass :class:`PruneConformance` with a ``persistkit_url`` fixture (and
``backend_options`` if needed), as for the kv suite::

    class TestMyStorePrune(PruneConformance):
        @pytest.fixture
        def persistkit_url(self) -> str:
            return "mystore://localhost/test"

It checks the contract of ``prune_rows`` / ``delete_blobs`` / ``blob_sizes`` (see
``persistkit.backends._prune``): only the asked rows below the head go, the head's row
and anything newer never, other namespaces and threads are untouched, the chain goes
on being written after a prune, missing ids and keys are skipped, a lease record
survives, blob sizes are the stored sizes, and the async twins. A store that declares
no ``prune`` is skipped, and says so. What retention builds on top (``store.prune``:
policies, lists, integrity) is checked by ``RetentionConformance``.
"""

from __future__ import annotations

import asyncio
import uuid

from ..backends import Backend
from ..backends._capabilities import declared, detected
from ..backends._protocol import CheckpointRow
from .kv_suite import KvStores

__all__ = ["PruneConformance"]


def _thread() -> str:
    return f"prune-{uuid.uuid4().hex[:16]}"


def _cid(n: int) -> str:
    return f"{n:024x}"


def _chain(b: Backend, thread: str, n: int, namespace: str = "", start: int = 1) -> list[str]:
    """Write rows ``start..start+n-1`` of a chain; their ids, oldest first."""
    ids = []
    for i in range(start, start + n):
        parent = _cid(i - 1) if i > 1 else None
        b.write(CheckpointRow(thread, namespace, _cid(i), parent, "run", f"payload {i}".encode()), {}, i - 1)
        ids.append(_cid(i))
    return ids


def _ids(b: Backend, thread: str, namespace: str = "") -> list[str]:
    return sorted(r.checkpoint_id for r in b.list(thread, namespace))


class PruneConformance(KvStores):
    """Mix into a test class that provides ``persistkit_url``."""

    capability = "prune"
    without = "prune_rows / delete_blobs / blob_sizes not implemented"

    def test_declared_prune_is_implemented(self, backend: Backend) -> None:
        assert ("prune" in declared(backend)) == ("prune" in detected(backend)), (
            "declare 'prune' in capabilities exactly when prune_rows, delete_blobs and blob_sizes are overridden"
        )

    def test_prune_rows_deletes_only_the_asked_rows_below_the_head(self, backend: Backend) -> None:
        t = _thread()
        ids = _chain(backend, t, 6)
        try:
            # the head's row and a missing id are skipped; the others go, whatever their order
            assert backend.prune_rows(t, "", [ids[2], ids[0], ids[5], _cid(99), ids[1]]) == 3
            assert _ids(backend, t) == [ids[3], ids[4], ids[5]]
            head = backend.head(t, "")
            assert head is not None and (head.checkpoint_id, head.version) == (ids[5], 6)
            assert backend.get(t, "", ids[0]) is None
            got = backend.get(t, "", ids[3])
            assert got is not None and got.payload == b"payload 4"
            assert backend.prune_rows(t, "", [ids[0]]) == 0  # again: nothing left to delete
            assert backend.prune_rows(t, "", []) == 0
            # the chain goes on: the next write moves the head from version 6
            _chain(backend, t, 1, start=7)
            head = backend.head(t, "")
            assert head is not None and head.version == 7
            assert backend.list(t, "", run_id="run", limit=2)[0].checkpoint_id == _cid(7)
        finally:
            backend.delete_thread(t)

    def test_prune_rows_never_deletes_the_head_or_newer_rows(self, backend: Backend) -> None:
        t = _thread()
        ids = _chain(backend, t, 3)
        try:
            assert backend.prune_rows(t, "", ids) == 2  # the head (ids[2]) stays
            assert _ids(backend, t) == [ids[2]]
            assert backend.prune_rows(t, "", [ids[2]]) == 0
            assert backend.prune_rows(_thread(), "", [ids[0]]) == 0  # no such thread
        finally:
            backend.delete_thread(t)

    def test_other_namespaces_and_threads_are_untouched(self, backend: Backend) -> None:
        t, u = _thread(), _thread()
        ids = _chain(backend, t, 3)
        sub = _chain(backend, t, 3, namespace="sub")
        other = _chain(backend, u, 3)
        try:
            assert backend.prune_rows(t, "sub", sub[:2]) == 2
            assert _ids(backend, t) == ids
            assert _ids(backend, t, "sub") == sub[2:]
            assert _ids(backend, u) == other
        finally:
            backend.delete_thread(t)
            backend.delete_thread(u)

    def test_a_lease_record_survives(self, backend: Backend) -> None:
        if not backend.supports_leases:
            return
        t = _thread()
        ids = _chain(backend, t, 3)
        try:
            assert backend.lease_swap(t, "", 0, 1, b"lease")
            backend.prune_rows(t, "", ids)
            rec = backend.lease_get(t, "")
            assert rec is not None and rec.token == 1 and rec.data == b"lease"
        finally:
            backend.delete_thread(t)

    def test_blobs_deleted_and_sized(self, backend: Backend) -> None:
        t = _thread()
        _chain(backend, t, 1)
        try:
            backend.put_blobs(t, {"v:a": b"x" * 10, "v:b": b"y" * 2000, "s:c:000001:0000000000:d": b"z"})
            sizes = backend.blob_sizes(t)
            assert set(sizes) == {"v:a", "v:b", "s:c:000001:0000000000:d"}
            assert sizes["v:b"] >= 2000 and sizes["v:a"] >= 10  # stored sizes: a store may add framing
            assert backend.delete_blobs(t, ["v:a", "v:missing", "v:a"]) == 1
            assert backend.get_blobs(t, ["v:a", "v:b"]) == {"v:b": b"y" * 2000}
            assert set(backend.blob_sizes(t)) == {"v:b", "s:c:000001:0000000000:d"}
            assert backend.delete_blobs(t, []) == 0
            assert backend.blob_sizes(_thread()) == {}
        finally:
            backend.delete_thread(t)

    def test_async_twins(self, backend: Backend) -> None:
        t = _thread()
        ids = _chain(backend, t, 4)
        backend.put_blobs(t, {"v:a": b"1", "v:b": b"2"})

        async def main() -> None:
            assert await backend.aprune_rows(t, "", ids[:2]) == 2
            assert set(await backend.ablob_sizes(t)) == {"v:a", "v:b"}
            assert await backend.adelete_blobs(t, ["v:a"]) == 1

        try:
            asyncio.run(main())
            assert _ids(backend, t) == ids[2:]
            assert set(backend.blob_sizes(t)) == {"v:b"}
        finally:
            backend.delete_thread(t)

    def test_a_prune_between_writes_of_another_instance(self, backend: Backend, other: Backend) -> None:
        """A prune decided on an older head never deletes what another writer added since."""
        t = _thread()
        ids = _chain(backend, t, 3)
        try:
            newer = _chain(other, t, 2, start=4)
            assert backend.prune_rows(t, "", [*ids, *newer]) == 4  # everything below the new head
            assert _ids(other, t) == [newer[-1]]
            head = other.head(t, "")
            assert head is not None and head.version == 5
        finally:
            backend.delete_thread(t)
