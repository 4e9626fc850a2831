"""Conformance checks for the ``kv`` capability of a store (what ``store.board()`` builds on).

Subclass :class:`KvConformance` with a ``persistkit_url`` fixture (and ``backend_options``
if needed), as for :class:`~persistkit.testing.backend_suite.BackendConformance`::

    class TestMyStoreKv(KvConformance):
        @pytest.fixture
        def persistkit_url(self) -> str:
            return "mystore://localhost/test"

It checks the contract of ``kv_get`` / ``kv_history`` / ``kv_list`` / ``kv_write`` /
``kv_drop`` (see :class:`persistkit.backends.Backend`): versions that never go back
(a delete is a tombstone), a batch that lands whole or not at all, one winner among
racing compare-and-swaps from two instances of the store, ``keep`` bounding the kept
versions, listing in code-point order with prefix, ``after`` and ``limit``, scopes that
never see each other, exact bytes, and the async twins. A store that declares no
``kv`` is skipped, and says so.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from .._errors import ConflictError
from ..backends import Backend, open_backend
from ..backends._capabilities import declared, detected, has
from ..backends._protocol import KvEntry, KvOp

__all__ = ["KvConformance"]


def _scope() -> str:
    return f"kv_{uuid.uuid4().hex[:20]}"


class KvStores:
    """The fixtures of the kv and watch suites: two instances of the store under test, and a
    fresh scope dropped afterwards. ``capability``: the one a store must have, or the
    suite skips (saying so)."""

    capability = "kv"
    without = "kv_* not implemented"

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        return {}

    @pytest.fixture
    def backend(self, persistkit_url: str, backend_options: dict[str, Any]) -> Iterator[Backend]:
        b = open_backend(persistkit_url, **backend_options)
        if not has(b, self.capability):
            b.close()
            pytest.skip(f"{type(b).__name__} has no {self.capability} capability ({self.without})")
        yield b
        b.close()

    @pytest.fixture
    def other(self, persistkit_url: str, backend_options: dict[str, Any]) -> Iterator[Backend]:
        b = open_backend(persistkit_url, **backend_options)
        yield b
        b.close()

    @pytest.fixture
    def scope(self, backend: Backend) -> Iterator[str]:
        s = _scope()
        yield s
        backend.kv_drop(s)


class KvConformance(KvStores):
    """Mix into a test class that provides ``persistkit_url``."""

    # -- declaration -------------------------------------------------------------

    def test_declared_kv_is_implemented(self, backend: Backend) -> None:
        if getattr(backend, "inner", None) is None:  # a store, not a wrapper over one
            assert "kv" in declared(backend), f"{type(backend).__name__} implements kv_* but does not declare 'kv'"
            assert "kv" in detected(backend)

    # -- single keys ---------------------------------------------------------------

    def test_create_read_update_delete(self, backend: Backend, other: Backend, scope: str) -> None:
        assert backend.kv_get(scope, "a") is None
        backend.kv_write(scope, [KvOp("a", 0, b"one")], keep=10)
        assert other.kv_get(scope, "a") == KvEntry("a", 1, b"one")
        other.kv_write(scope, [KvOp("a", 1, b"two")], keep=10)
        assert backend.kv_get(scope, "a") == KvEntry("a", 2, b"two")
        backend.kv_write(scope, [KvOp("a", 2, None)], keep=10)
        assert other.kv_get(scope, "a") == KvEntry("a", 3, None)  # a tombstone keeps the version
        assert backend.kv_list(scope) == []
        backend.kv_write(scope, [KvOp("a", 3, b"again")], keep=10)  # recreated: versions go on
        assert other.kv_get(scope, "a") == KvEntry("a", 4, b"again")

    def test_stale_or_missing_expected_version_is_a_conflict(self, backend: Backend, scope: str) -> None:
        backend.kv_write(scope, [KvOp("k", 0, b"v1")], keep=5)
        for wrong in (0, 2, 7):
            with pytest.raises(ConflictError) as info:
                backend.kv_write(scope, [KvOp("k", wrong, b"no")], keep=5)
            assert (info.value.key, info.value.expected, info.value.found) == ("k", wrong, 1)
        with pytest.raises(ConflictError) as info:
            backend.kv_write(scope, [KvOp("never", 3, b"no")], keep=5)
        assert (info.value.key, info.value.found) == ("never", 0)
        assert backend.kv_get(scope, "k") == KvEntry("k", 1, b"v1")
        assert backend.kv_get(scope, "never") is None

    def test_exact_bytes_and_large_values(self, backend: Backend, scope: str) -> None:
        every_byte = bytes(range(256)) * 3
        big = bytes(i % 251 for i in range(1_000_000))
        backend.kv_write(scope, [KvOp("bytes", 0, every_byte), KvOp("big", 0, big), KvOp("empty", 0, b"")], keep=2)
        assert backend.kv_get(scope, "bytes") == KvEntry("bytes", 1, every_byte)
        assert backend.kv_get(scope, "big") == KvEntry("big", 1, big)
        assert backend.kv_get(scope, "empty") == KvEntry("empty", 1, b"")  # empty bytes are a value, not a delete

    def test_unicode_keys(self, backend: Backend, scope: str) -> None:
        keys = ["users/42/profile", "é/ü", "雪/☃", "tab\tkey", "emoji/🦜", "a" * 1024, "x y/z?%&#"]
        backend.kv_write(scope, [KvOp(k, 0, k.encode()) for k in keys], keep=1)
        for k in keys:
            assert backend.kv_get(scope, k) == KvEntry(k, 1, k.encode())
        assert [e.key for e in backend.kv_list(scope)] == sorted(keys)

    # -- batches -------------------------------------------------------------------

    def test_batch_lands_whole_or_not_at_all(self, backend: Backend, other: Backend, scope: str) -> None:
        backend.kv_write(scope, [KvOp("a", 0, b"a1"), KvOp("b", 0, b"b1")], keep=5)
        with pytest.raises(ConflictError) as info:
            other.kv_write(scope, [KvOp("a", 1, b"a2"), KvOp("c", 0, b"c1"), KvOp("b", 5, b"b2")], keep=5)
        assert info.value.key == "b"
        assert backend.kv_get(scope, "a") == KvEntry("a", 1, b"a1")
        assert backend.kv_get(scope, "c") is None
        other.kv_write(scope, [KvOp("a", 1, b"a2"), KvOp("c", 0, b"c1"), KvOp("b", 1, None)], keep=5)
        assert [(e.key, e.version) for e in backend.kv_list(scope)] == [("a", 2), ("c", 1)]
        assert backend.kv_get(scope, "b") == KvEntry("b", 2, None)

    def test_racing_batches_one_winner(self, backend: Backend, other: Backend, scope: str) -> None:
        backend.kv_write(scope, [KvOp("x", 0, b"0"), KvOp("y", 0, b"0")], keep=3)
        barrier = threading.Barrier(2)
        outcomes: list[str] = []

        def race(b: Backend, tag: bytes) -> None:
            barrier.wait()
            try:
                b.kv_write(scope, [KvOp("x", 1, tag), KvOp("y", 1, tag)], keep=3)
                outcomes.append("won")
            except ConflictError:
                outcomes.append("lost")

        threads = [threading.Thread(target=race, args=(b, t)) for b, t in ((backend, b"A"), (other, b"B"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == ["lost", "won"]
        x, y = backend.kv_get(scope, "x"), backend.kv_get(scope, "y")
        assert x is not None and y is not None and x.version == y.version == 2 and x.value == y.value

    def test_compare_and_swap_counter_from_many_threads(self, backend: Backend, other: Backend, scope: str) -> None:
        backend.kv_write(scope, [KvOp("n", 0, b"0")], keep=2)

        def bump(b: Backend) -> int:
            conflicts = 0
            for _ in range(10):
                while True:
                    cur = b.kv_get(scope, "n")
                    assert cur is not None and cur.value is not None
                    try:
                        b.kv_write(scope, [KvOp("n", cur.version, str(int(cur.value) + 1).encode())], keep=2)
                        break
                    except ConflictError:
                        conflicts += 1
            return conflicts

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(bump, [backend, other] * 4))
        final = backend.kv_get(scope, "n")
        assert final is not None and final.value == b"80" and final.version == 81

    # -- kept versions ---------------------------------------------------------------

    def test_keep_bounds_history(self, backend: Backend, scope: str) -> None:
        for v in range(6):
            backend.kv_write(scope, [KvOp("h", v, b"v%d" % (v + 1))], keep=3)
        assert [(e.version, e.value) for e in backend.kv_history(scope, "h")] == [(6, b"v6"), (5, b"v5"), (4, b"v4")]
        assert backend.kv_get(scope, "h", version=5) == KvEntry("h", 5, b"v5")
        assert backend.kv_get(scope, "h", version=2) is None  # pushed out
        assert backend.kv_get(scope, "h", version=99) is None
        assert [e.version for e in backend.kv_history(scope, "h", before=6)] == [5, 4]
        assert [e.version for e in backend.kv_history(scope, "h", limit=1)] == [6]
        backend.kv_write(scope, [KvOp("h", 6, None)], keep=3)
        assert [(e.version, e.value) for e in backend.kv_history(scope, "h")] == [(7, None), (6, b"v6"), (5, b"v5")]
        backend.kv_write(scope, [KvOp("h", 7, b"v8")], keep=1)  # a smaller keep trims at once
        assert backend.kv_history(scope, "h") == [KvEntry("h", 8, b"v8")]
        assert backend.kv_history(scope, "missing") == []

    # -- listing ---------------------------------------------------------------------

    def test_list_prefix_after_limit_in_code_point_order(self, backend: Backend, scope: str) -> None:
        keys = [f"tasks/{i:03d}" for i in range(30)] + ["tasks", "tasks0", "task", "tasks/\uffff", "tasks/Z"]
        backend.kv_write(scope, [KvOp(k, 0, b"1") for k in keys], keep=1)
        backend.kv_write(scope, [KvOp(f"tasks/{i:03d}", 1, None) for i in range(0, 30, 3)], keep=1)
        live = sorted(k for k in keys if not (k.startswith("tasks/0") and int(k[6:]) % 3 == 0))
        assert [e.key for e in backend.kv_list(scope)] == live
        under = [k for k in live if k.startswith("tasks/")]
        assert [e.key for e in backend.kv_list(scope, prefix="tasks/")] == under
        page, after = [], None
        while True:
            got = backend.kv_list(scope, prefix="tasks/", after=after, limit=4)
            assert len(got) <= 4
            if not got:
                break
            page += [e.key for e in got]
            after = got[-1].key
        assert page == under  # tombstones are skipped, not counted against the limit
        assert [e.key for e in backend.kv_list(scope, prefix="tasks/", after="tasks/010", limit=2)] == ["tasks/011", "tasks/013"]
        assert backend.kv_list(scope, prefix="nothing/") == []
        assert all(e.value == b"1" and e.version == 1 for e in backend.kv_list(scope, prefix="tasks/"))

    def test_scopes_are_separate_and_drop(self, backend: Backend, other: Backend) -> None:
        a, b = _scope(), _scope()
        try:
            backend.kv_write(a, [KvOp("k", 0, b"in a")], keep=1)
            assert other.kv_get(b, "k") is None and other.kv_list(b) == []
            other.kv_write(b, [KvOp("k", 0, b"in b")], keep=1)
            assert backend.kv_drop(a) is True
            assert backend.kv_drop(a) is False
            assert other.kv_get(a, "k") is None and other.kv_list(a) == []
            assert backend.kv_get(b, "k") == KvEntry("k", 1, b"in b")
            backend.kv_write(a, [KvOp("k", 0, b"new")], keep=1)  # a dropped scope starts over
        finally:
            backend.kv_drop(a)
            backend.kv_drop(b)

    # -- async twins -------------------------------------------------------------------

    def test_async_twins(self, backend: Backend, scope: str) -> None:
        async def go() -> None:
            await backend.akv_write(scope, [KvOp("q", 0, b"1"), KvOp("r", 0, b"2")], keep=2)
            assert await backend.akv_get(scope, "q") == KvEntry("q", 1, b"1")
            with pytest.raises(ConflictError):
                await backend.akv_write(scope, [KvOp("q", 0, b"x")], keep=2)
            await backend.akv_write(scope, [KvOp("q", 1, b"3")], keep=2)
            assert [e.version for e in await backend.akv_history(scope, "q")] == [2, 1]
            assert [e.key for e in await backend.akv_list(scope, prefix="", limit=1)] == ["q"]

        asyncio.run(go())
        assert backend.kv_get(scope, "q") == KvEntry("q", 2, b"3")
