"""The watches of one board in a process share one feed of the store (blackboard/_hub.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from conftest import uid

import persistkit as pk
from persistkit.backends._protocol import KvWatch


class Counting:
    """Counts the store feeds opened and open."""

    def __init__(self, backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.opened = 0
        self.open = 0
        real = backend.watch_open

        def watch_open(scope: str) -> KvWatch:
            self.opened += 1
            self.open += 1
            feed = real(scope)
            close = feed.close

            def closing() -> None:
                if not getattr(feed, "_counted_closed", False):
                    feed._counted_closed = True  # type: ignore[attr-defined]
                    self.open -= 1
                close()

            feed.close = closing  # type: ignore[method-assign]
            return feed

        monkeypatch.setattr(backend, "watch_open", watch_open)


def _wait(cond: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_many_watches_of_one_board_share_one_feed(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = pk.connect(store_url)
    try:
        if not store.backend.supports_watch:
            pytest.skip("the store has no watch capability")
        count = Counting(store.backend, monkeypatch)
        board = store.board(uid("hub").replace("-", "_")[:60])
        watches = [board.watch("k/*") for _ in range(20)]
        assert count.opened == 1
        board.put("k/1", "x")
        for w in watches:
            change = w.next(timeout=30)
            assert change is not None and (change.key, change.version) == ("k/1", 1)

        async def more() -> None:
            aw = [await board.awatch("k/*") for _ in range(5)]
            await board.aput("k/2", "y")
            for w in aw:
                change = await w.next(timeout=30)
                assert change is not None and change.key == "k/2"
            for w in aw:
                await w.aclose()

        asyncio.run(more())
        assert count.opened == 1  # the async watches joined the same feed
        for w in watches:
            assert w.next(timeout=30) == pk.BoardChange("k/2", 1, "put")
            w.close()
        assert _wait(lambda: count.open == 0)  # the last watch closed: so did the feed
        with board.watch("k/*") as again:  # a new watch opens a new feed
            board.put("k/3", "z")
            assert again.next(timeout=30) == pk.BoardChange("k/3", 1, "put")
        assert count.opened == 2
        other = store.board(uid("hub2").replace("-", "_")[:60])
        with other.watch("*"):
            assert count.opened == 3  # another board: a feed of its own
        board.clear()
        other.clear()
    finally:
        store.close()


def test_postgres_watchers_share_one_listen_connection(postgres_url: str) -> None:
    import psycopg

    store = pk.connect(postgres_url)
    board = store.board(uid("pghub").replace("-", "_")[:60])

    def listeners() -> int:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%%'"
                " AND pid <> pg_backend_pid()"
            ).fetchone()
            return int(row[0]) if row else 0

    before = listeners()
    watches = [board.watch("*") for _ in range(50)]
    try:
        assert listeners() - before <= 1  # fifty watchers, one LISTEN connection (others may run theirs)
        board.put("a", 1)
        assert all(w.next(timeout=30) == pk.BoardChange("a", 1, "put") for w in watches)
    finally:
        for w in watches:
            w.close()
        board.clear()
        store.close()
