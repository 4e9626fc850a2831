"""Conformance checks for the ``watch`` capability of a store (``store.board().watch``).

Subclass :class:`WatchConformance` with a ``persistkit_url`` fixture, as for
:class:`~persistkit.testing.kv_suite.KvConformance`. It checks the contract of
``watch_open`` and :class:`~persistkit.backends._protocol.KvWatch`: a write committed
after the watch opened is hinted (by key and version, or by a "list again" hint) whether
it was made by the same instance, another instance or another process; hints of other
scopes do not arrive; a quiet watch returns ``[]`` when its timeout passes; a closed
watch refuses; and the async twins. A store that declares no ``watch`` is skipped (the
board then polls ``kv_list``).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest

from .._errors import StoreClosedError
from ..backends import Backend
from ..backends._capabilities import declared
from ..backends._protocol import KvOp, KvWatch
from .kv_suite import KvStores

__all__ = ["WatchConformance"]


def _scope() -> str:
    return f"w_{uuid.uuid4().hex[:20]}"


def seen(watch: KvWatch, backend: Backend, scope: str, key: str, version: int, timeout: float = 10.0) -> bool:
    """Whether ``watch`` hints that ``key`` reached ``version`` (or hints "list again" and
    the key is there) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for hint in watch.hints(min(0.5, max(deadline - time.monotonic(), 0.0))):
            if hint.key == key and hint.version >= version:
                return True
            if hint.key is None:
                entry = backend.kv_get(scope, key)
                if entry is not None and entry.version >= version:
                    return True
    return False


class WatchConformance(KvStores):
    """Mix into a test class that provides ``persistkit_url``."""

    capability = "watch"
    without = "the board polls kv_list on it"

    def test_declared_watch_is_implemented(self, backend: Backend) -> None:
        if getattr(backend, "inner", None) is None:
            assert "watch" in declared(backend), f"{type(backend).__name__} implements watch_open but does not declare 'watch'"

    def test_own_and_other_instance_writes_are_hinted(self, backend: Backend, other: Backend, scope: str) -> None:
        watch = backend.watch_open(scope)
        try:
            backend.kv_write(scope, [KvOp("mine", 0, b"1")], keep=1)
            assert seen(watch, backend, scope, "mine", 1)
            other.kv_write(scope, [KvOp("theirs", 0, b"1")], keep=1)
            assert seen(watch, backend, scope, "theirs", 1)
            other.kv_write(scope, [KvOp("theirs", 1, None)], keep=1)  # a delete is a change too
            assert seen(watch, backend, scope, "theirs", 2)
        finally:
            watch.close()

    def test_many_writes_end_at_the_last_version(self, backend: Backend, other: Backend, scope: str) -> None:
        watch = backend.watch_open(scope)
        try:
            for v in range(50):
                other.kv_write(scope, [KvOp("busy", v, b"%d" % v)], keep=1)
            assert seen(watch, backend, scope, "busy", 50)  # hints may coalesce; the last one arrives
        finally:
            watch.close()

    def test_other_scopes_are_not_hinted_and_quiet_times_out(self, backend: Backend, other: Backend, scope: str) -> None:
        elsewhere = _scope()
        watch = backend.watch_open(scope)
        try:
            assert watch.hints(0.05) == [] or all(h.key is None for h in watch.hints(0.05))
            other.kv_write(elsewhere, [KvOp("k", 0, b"x")], keep=1)
            time.sleep(0.3)
            assert all(h.key is None for h in watch.hints(0.3))  # never a key of another scope
        finally:
            watch.close()
            backend.kv_drop(elsewhere)

    def test_another_process_writes_are_hinted(
        self, backend: Backend, scope: str, persistkit_url: str, backend_options: dict[str, Any]
    ) -> None:
        if persistkit_url.startswith("memory:"):
            pytest.skip("a memory:// store lives in one process")
        if backend_options:
            pytest.skip("the child process cannot be given backend_options")
        watch = backend.watch_open(scope)
        code = (
            "import sys; from persistkit.backends import open_backend; from persistkit.backends._protocol import KvOp\n"
            "b = open_backend(sys.argv[1]); b.kv_write(sys.argv[2], [KvOp('child', 0, b'hi')], keep=1); b.close()\n"
        )
        try:
            subprocess.run([sys.executable, "-c", code, persistkit_url, scope], check=True, timeout=60)
            assert seen(watch, backend, scope, "child", 1)
        finally:
            watch.close()

    def test_closed_watch_refuses(self, backend: Backend, scope: str) -> None:
        watch = backend.watch_open(scope)
        watch.close()
        watch.close()  # idempotent
        with pytest.raises(StoreClosedError):
            watch.hints(0.01)

    def test_async_twins(self, backend: Backend, other: Backend, scope: str) -> None:
        async def go() -> bool:
            watch = await backend.awatch_open(scope)
            try:
                await other.akv_write(scope, [KvOp("async", 0, b"1")], keep=1)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    for hint in await watch.ahints(0.5):
                        if hint.key == "async" or (hint.key is None and await backend.akv_get(scope, "async")):
                            return True
                return False
            finally:
                await watch.aclose()

        assert asyncio.run(go())
