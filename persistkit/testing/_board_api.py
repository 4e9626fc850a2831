"""What the board conformance checks share (``persistkit.testing.board_suite``).

:class:`BoardFixtures`: two ``pk.Store`` objects on ``persistkit_url`` (as two processes
see one store), a fresh board on each with the same name, and the ``mode`` each check
runs in. :class:`Api` drives one object of the board API (a board, a scoped handle, a
claim, a watch, a batch) through its sync methods or, in ``async`` mode, through their
``a``-prefixed twins on one event loop, so that every check is written once and proves
both halves of the API. The helpers below read a store's raw kv bytes under its wrappers
(encryption, integrity, offload), as an attacker with the database would.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ..backends._capabilities import has
from ..backends._protocol import Backend
from ..blackboard._acl import ScopedBoard
from ..blackboard._board import Batch
from ..blackboard._claims import Claim
from ..blackboard._space import Board
from ..blackboard._watch import AsyncBoardWatch, BoardWatch
from ..engine._store import Store, connect
from ._stores import TwoStores

__all__ = ["Api", "BoardFixtures", "innermost", "layers", "wait_past"]

_WRAPPED = (Board, ScopedBoard, Claim, BoardWatch, AsyncBoardWatch, Batch)


class Api:
    """``target``'s methods, called sync (``loop`` None) or as their async twins on ``loop``.

    ``api.put(k, v)`` is ``board.put(k, v)``, or ``loop.run_until_complete(board.aput(k, v))``;
    a method without a twin is called as it is (and awaited if it returns an awaitable);
    what is returned is wrapped again when it is a board object, and an async iterator
    (``ascan``) is collected into a list. An async watch is entered (``async with``) as it
    is made, so that it is open from then on as a sync watch is.
    """

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop | None) -> None:
        self.target = target
        self.loop = loop

    def __repr__(self) -> str:
        return f"<Api {'async' if self.loop else 'sync'} {self.target!r}>"

    def run(self, awaitable: Any) -> Any:
        assert self.loop is not None
        return self.loop.run_until_complete(awaitable)

    def __getattr__(self, name: str) -> Any:
        twin = getattr(self.target, "a" + name, None) if self.loop is not None else None
        attr = getattr(self.target, name) if twin is None else twin
        if not callable(attr) or isinstance(attr, type):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            if self.loop is not None:
                if inspect.isawaitable(result):
                    result = self.run(result)
                elif hasattr(result, "__anext__"):
                    result = self.run(_collect(result))
            if isinstance(result, AsyncBoardWatch):
                self.run(result.__aenter__())
            return Api(result, self.loop) if isinstance(result, _WRAPPED) else result

        return call


async def _collect(it: Any) -> list[Any]:
    return [x async for x in it]


def wait_past(moment: Any) -> None:
    """Sleep until this host's clock is past ``moment`` (a datetime or unix seconds): how a
    TTL or a claim's deadline is judged (by the reader's clock). Not a synchronization
    between workers: the deadline is the store's own record."""
    t = moment.timestamp() if hasattr(moment, "timestamp") else float(moment)
    while time.time() <= t:
        time.sleep(min(0.05, max(0.001, t - time.time() + 0.001)))


def innermost(backend: Backend) -> Backend:
    """The store under every wrapper: the raw bytes as they sit in the database."""
    while True:
        inner = getattr(backend, "inner", None) or getattr(backend, "primary", None)
        if not isinstance(inner, Backend):
            return backend
        backend = inner


def layers(backend: Backend) -> dict[str, Backend]:
    """The wrappers of a store by what they do (``encryption``, ``integrity``, ``offload``)."""
    from ..wrappers._encryption import EncryptedBackend
    from ..wrappers._integrity import IntegrityBackend
    from ..wrappers._offload import OffloadBackend

    found: dict[str, Backend] = {}
    kinds = {EncryptedBackend: "encryption", IntegrityBackend: "integrity", OffloadBackend: "offload"}
    while True:
        for cls, kind in kinds.items():
            if isinstance(backend, cls):
                found[kind] = backend
        inner = getattr(backend, "inner", None) or getattr(backend, "primary", None)
        if not isinstance(inner, Backend):
            return found
        backend = inner


class BoardFixtures(TwoStores):
    """Fixtures of the board checks; mix into a test class that provides ``persistkit_url``
    (and ``backend_options``: ``pk.connect`` keywords, the wrappers' among them)."""

    @pytest.fixture(params=["sync", "async"])
    def mode(self, request: pytest.FixtureRequest) -> str:
        return str(request.param)

    @pytest.fixture
    def loop(self, mode: str) -> Iterator[asyncio.AbstractEventLoop | None]:
        if mode == "sync":
            yield None
            return
        loop = asyncio.new_event_loop()
        yield loop
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    @pytest.fixture
    def stores(
        self, persistkit_url: str, backend_options: dict[str, Any], loop: asyncio.AbstractEventLoop | None
    ) -> Iterator[tuple[Store, Store]]:
        """Two instances of the store, closed on the check's event loop while it still runs
        (a store's async connections belong to the loop that opened them)."""
        pair = connect(persistkit_url, **backend_options), connect(persistkit_url, **backend_options)
        yield pair
        for s in pair:
            if loop is not None:
                loop.run_until_complete(s.aclose())
            s.close()

    @pytest.fixture
    def boards(self, stores: tuple[Store, Store]) -> Iterator[tuple[Board, Board]]:
        """A board of a fresh name on each of the two stores (one space, two instances)."""
        one, two = stores
        if not has(one.backend, "kv"):
            under = innermost(one.backend)
            if under is not one.backend and has(under, "kv"):
                pytest.skip(
                    f"the wrappers over {type(under).__name__} ({type(one.backend).__name__} outermost) do not "
                    "pass its kv capability through (persistkit.backends._protocol.ForwardKv)"
                )
            pytest.skip(
                f"{type(one.backend).__name__} ({one.url}) has no kv capability, so no board: "
                "implement kv_get/kv_history/kv_list/kv_write/kv_drop (persistkit.backends.Backend)"
            )
        name = f"bs_{uuid.uuid4().hex[:16]}"
        a, b = one.board(name), two.board(name)
        yield a, b
        a.clear()

    @pytest.fixture
    def api(self, boards: tuple[Board, Board], loop: asyncio.AbstractEventLoop | None) -> Api:
        return Api(boards[0], loop)

    @pytest.fixture
    def api2(self, boards: tuple[Board, Board], loop: asyncio.AbstractEventLoop | None) -> Api:
        """The same board through the second store instance (another process, as it were)."""
        return Api(boards[1], loop)

    @staticmethod
    def raw(board: Board, key: str, version: int | None = None) -> bytes | None:
        """The bytes of ``key`` as the store under every wrapper holds them."""
        entry = innermost(board.store.backend).kv_get(board.name, key, version)
        return None if entry is None else entry.value

    @staticmethod
    def wrappers(board: Board) -> dict[str, Backend]:
        return layers(board.store.backend)
