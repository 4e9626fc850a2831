"""Conformance checks for ``store.board()`` end to end on a store, through its wrappers.

Subclass :class:`BoardConformance` with a ``persistkit_url`` fixture, and a
``backend_options`` fixture for the ``pk.connect`` keywords the store is opened with (the
wrappers' among them: ``encryption=``, ``integrity=``, ``blobs=``)::

    class TestMyStoreBoard(BoardConformance):
        @pytest.fixture
        def persistkit_url(self) -> str:
            return "mystore://localhost/test"

    class TestMyStoreBoardSealed(BoardConformance):
        @pytest.fixture
        def persistkit_url(self) -> str:
            return "mystore://localhost/test"

        @pytest.fixture
        def backend_options(self) -> dict[str, Any]:
            return {"encryption": key, "integrity": other_key}

Every check runs twice, through the sync methods and through their ``a``-prefixed twins
(``persistkit.testing._board_api.Api``), with two ``pk.connect`` instances of the store
where another process's view matters. It checks the contract the board's modules
document (``persistkit.blackboard``): versions that only go up (a delete or an expiry does
not reset them), kept history, compare-and-swap with 0 for "must not exist", ``update``
under contention, atomic batches, listing in code-point order, values of every kind
through the codec (secrets as handles, sealed by encryption, refused when tampered under
integrity, moved by offload), TTL, and bad input refused with a ``PersistkitError``. The
claims, watches, scoped handles and validators are in ``_board_coordination``. A store
without the ``kv`` capability is skipped, and the skip says so; a check about a wrapper
is skipped on a store opened without it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pydantic
import pytest

from .._errors import ConfigurationError, ConflictError, IntegrityError, PersistkitError
from ..backends._protocol import KvOp
from ..blackboard._space import Board
from ..codec._serde import register
from ..secrets import register as register_secret
from ..secrets import unregister as unregister_secret
from ._board_api import Api, wait_past
from ._board_coordination import CoordinationChecks

__all__ = ["BoardConformance"]


class BoardNote(pydantic.BaseModel):
    """A pydantic value (module level, so that a new process can revive it)."""

    title: str
    tags: list[str]
    score: float = 0.0


@dataclasses.dataclass
class BoardPoint:
    """A dataclass value."""

    x: int
    label: str
    when: datetime | None = None


register(BoardNote)
register(BoardPoint)

# A made-up OpenAI-style key: the built-in detectors find it in any stored string.
API_KEY = "sk-proj-Bq72xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI8k"
REGISTERED = "board-suite-registered-value-7f3a9c"
MARKER = "plain-marker-board-0b7e41"


class BoardConformance(CoordinationChecks):
    """Mix into a test class that provides ``persistkit_url`` (see the module docstring)."""

    # -- versions ----------------------------------------------------------------------------

    def test_versions_only_go_up(self, api: Api, api2: Api) -> None:
        assert api.get("k") is None and api.value("k", "dflt") == "dflt"
        assert api.put("k", "one") == 1
        assert api2.put("k", "two") == 2
        got = api.get("k")
        assert (got.key, got.version, got.value, got.deleted) == ("k", 2, "two", False)
        assert isinstance(got.written_at, datetime) and got.expires_at is None
        assert api2.delete("k") is True
        assert api.get("k") is None and api.delete("k") is False  # gone: nothing to delete
        assert api.put("k", "three") == 4  # after the delete's version 3, never back to 1
        assert api2.value("k") == "three"

    def test_get_version_and_history_newest_first(self, api: Api) -> None:
        for v in ("a", "b"):
            api.put("h", v)
        api.delete("h")
        api.put("h", "d")
        hist = api.history("h")
        assert [(e.version, e.value, e.deleted) for e in hist] == [(4, "d", False), (3, None, True), (2, "b", False), (1, "a", False)]
        assert [e.version for e in api.history("h", limit=2)] == [4, 3]
        assert api.get("h", version=2).value == "b"
        tomb = api.get("h", version=3)
        assert tomb.deleted and tomb.value is None
        assert api.get("h", version=9) is None and api.history("never") == []

    def test_history_is_bounded_by_the_policy(self, api: Api) -> None:
        api.policy("short/", history=2)
        for i in range(5):
            api.put("short/k", i)
            api.put("long/k", i)
        assert [e.value for e in api.history("short/k")] == [4, 3]
        assert api.get("short/k", version=1) is None  # pushed out
        assert [e.version for e in api.history("long/k")] == [5, 4, 3, 2, 1]  # the default keeps 10

    def test_rollback_is_one_put(self, api: Api) -> None:
        for v in ({"plan": 1}, {"plan": 2}, {"plan": 3}):
            api.put("plan", v)
        assert api.put("plan", api.get("plan", version=1).value) == 4
        assert api.value("plan") == {"plan": 1} and len(api.history("plan")) == 4

    # -- compare-and-swap and update -----------------------------------------------------------

    def test_cas_zero_means_must_not_exist(self, api: Api, api2: Api) -> None:
        assert api.cas("c", "first", 0) == 1
        with pytest.raises(ConflictError) as info:
            api2.cas("c", "again", 0)
        assert (info.value.key, info.value.expected, info.value.found) == ("c", 0, 1)
        with pytest.raises(ConflictError) as info:
            api2.cas("c", "stale", 7)
        assert info.value.found == 1 and isinstance(info.value, PersistkitError)
        assert api2.cas("c", "second", 1) == 2
        with pytest.raises(ConflictError):
            api.delete("c", expected_version=1)
        assert api.delete("c", expected_version=2) is True
        with pytest.raises(ConflictError) as info:
            api.cas("c", "x", 2)  # deleted: it does not exist, its version is 0 for cas
        assert info.value.found == 0
        assert api.cas("c", "reborn", 0) == 4  # after the delete's version 3
        assert api.value("c") == "reborn"

    def test_cas_after_expiry(self, api: Api) -> None:
        v = api.put("e", "short-lived", ttl=0.2)
        wait_past(time.time() + 0.2)  # past its expiry, however long the put took (a slow store)
        assert api.get("e") is None and api.list("e") == []
        with pytest.raises(ConflictError) as info:
            api.cas("e", "x", v)  # expired: it does not exist
        assert info.value.found == 0
        assert api.delete("e") is False  # nor is there anything to delete
        assert api.cas("e", "back", 0) == v + 1  # the version goes on past the expired one
        assert api.delete("gone-and-never-was") is False

    def contention_updates(self, url: str) -> int:
        """How many updates each of the eight workers makes in the contention check (a hook:
        a store served by a slow emulator may lower it; eight racing writers are the point)."""
        return 25

    @pytest.mark.parametrize("history", [10, 1])
    def test_update_under_contention_counts_exactly(
        self, boards: tuple[Board, Board], mode: str, loop: asyncio.AbstractEventLoop | None, history: int,
        persistkit_url: str,
    ) -> None:
        one, two = boards
        one.policy("n/", history=history)
        two.policy("n/", history=history)
        workers, each = 8, self.contention_updates(persistkit_url)
        if loop is None:
            errors: list[BaseException] = []

            def work(board: Board) -> None:
                try:
                    for _ in range(each):
                        board.update("n/count", lambda n: n + 1, default=0)
                except BaseException as exc:  # reported below, with the thread's traceback
                    errors.append(exc)

            threads = [threading.Thread(target=work, args=(b,)) for b in [one, two] * (workers // 2)]
            interval = sys.getswitchinterval()
            sys.setswitchinterval(1e-5)  # interleave the threads finely, also on an in-process store
            try:
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            finally:
                sys.setswitchinterval(interval)
            assert not errors, errors
        else:
            async def work_async(board: Board) -> None:
                for _ in range(each):
                    await board.aupdate("n/count", lambda n: n + 1, default=0)

            async def all_workers() -> None:
                await asyncio.gather(*(work_async(b) for b in [one, two] * (workers // 2)))

            loop.run_until_complete(all_workers())
        got = one.get("n/count")
        assert got is not None and got.value == workers * each and got.version == workers * each

    def test_update_returns_the_entry_it_wrote(self, api: Api) -> None:
        e = api.update("u", lambda cur: [*cur, "x"], default=[])
        assert (e.key, e.version, e.value) == ("u", 1, ["x"])
        e = api.update("u", lambda cur: [*cur, "y"], ttl=60)
        assert (e.version, e.value) == (2, ["x", "y"]) and e.expires_at is not None

    # -- batches -------------------------------------------------------------------------------

    def test_batch_is_atomic(self, api: Api, api2: Api) -> None:
        api.put("b/a", 1)
        api.put("b/gone", 1)
        batch = api.batch().put("b/a", 2).put("b/new", 1).delete("b/gone").cas("b/c", 1, 5)
        with pytest.raises(ConflictError) as info:
            batch.commit()
        assert info.value.key == "b/c" and info.value.found == 0
        assert api2.value("b/a") == 1 and api2.get("b/new") is None and api2.value("b/gone") == 1
        versions = api2.batch().put("b/a", 2).put("b/new", 1).delete("b/gone").cas("b/c", 1, 0).commit()
        assert versions == {"b/a": 2, "b/new": 1, "b/gone": 2, "b/c": 1}
        assert [(e.key, e.value) for e in api.list("b/")] == [("b/a", 2), ("b/c", 1), ("b/new", 1)]
        with pytest.raises(ConfigurationError):
            api.batch().put("b/a", 3).delete("b/a").commit()  # a key twice: refused, nothing written
        assert api.get("b/a").version == 2
        committed = api.batch().put("b/x", 1)
        committed.commit()
        with pytest.raises(ConfigurationError):
            committed.commit()

    def test_batch_context_managers(self, boards: tuple[Board, Board], mode: str, loop: asyncio.AbstractEventLoop | None) -> None:
        board = boards[0]
        if loop is None:
            with board.batch() as b:
                b.put("cm/a", 1).put("cm/b", 2)
            with pytest.raises(RuntimeError), board.batch() as failed:
                failed.put("cm/c", 3)
                raise RuntimeError("the block failed: nothing of it is applied")
        else:
            async def run() -> Any:
                async with board.batch() as b:
                    b.put("cm/a", 1).put("cm/b", 2)
                with pytest.raises(RuntimeError):
                    async with board.batch() as b2:
                        b2.put("cm/c", 3)
                        raise RuntimeError("the block failed: nothing of it is applied")
                return b

            b = loop.run_until_complete(run())
        assert b.versions == {"cm/a": 1, "cm/b": 1}
        assert [e.key for e in board.list("cm/")] == ["cm/a", "cm/b"]

    # -- listing -------------------------------------------------------------------------------

    def test_list_in_code_point_order_with_pages(self, api: Api, api2: Api) -> None:
        keys = ["l/a", "l/B", "l/é", "l/z", "l/中", "l/😀", "l/\uff5e", "l/a/b", "l/a0", "l/ ", "l/\t", "la", "l"]
        batch = api.batch()
        for k in keys:
            batch.put(k, k)
        batch.commit()
        api.delete("l/z")
        want = sorted(k for k in keys if k != "l/z")  # code points (UTF-8 byte order), not UTF-16
        assert [e.key for e in api2.list("")] == want
        assert [e.value for e in api2.list("l/")] == [k for k in want if k.startswith("l/")]
        pages, after = [], None
        while page := api.list("l/", after=after, limit=3):
            assert len(page) <= 3
            pages.append([e.key for e in page])
            after = page[-1].key
        assert [k for page in pages for k in page] == [k for k in want if k.startswith("l/")] and len(pages) == 4
        assert [e.key for e in api.list("l/a", after="l/a")] == ["l/a/b", "l/a0"]
        assert api.list("nothing/") == []

    def test_list_skips_expired_keys(self, api: Api) -> None:
        for i in range(6):
            api.put(f"t/{i}", i, ttl=0.2 if i in (1, 2, 3) else None)
        wait_past(time.time() + 0.2)
        assert [e.key for e in api.list("t/", limit=2)] == ["t/0", "t/4"]  # expired ones not counted
        assert [e.key for e in api.list("t/")] == ["t/0", "t/4", "t/5"]
        assert [e.key for e in api.scan("t/")] == ["t/0", "t/4", "t/5"]

    def test_scan_reads_every_page(self, api: Api) -> None:
        batch = api.batch()
        keys = [f"s/{i:04d}" for i in range(205)]  # more than one page of the scan
        for k in keys:
            batch.put(k, 1)
        batch.commit()
        assert [e.key for e in api.scan("s/")] == keys
        assert [e.key for e in api.scan("s/01")] == [k for k in keys if k.startswith("s/01")]

    # -- values --------------------------------------------------------------------------------

    def test_models_and_dataclasses_round_trip(self, api: Api, api2: Api) -> None:
        when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
        value = {
            "note": BoardNote(title="t", tags=["a", "é"], score=1.5),
            "point": BoardPoint(3, "p", when),
            "many": [BoardPoint(1, "a"), BoardPoint(2, "b")],
            "bytes": b"\x00\xff", "when": when, "n": None, "f": 0.1, "big": 2**70,
        }
        api.put("v/mixed", value)
        got = api2.value("v/mixed")
        assert got == value and type(got["note"]) is BoardNote and type(got["point"]) is BoardPoint
        api.put("v/model", BoardNote(title="solo", tags=[]))
        assert api2.value("v/model") == BoardNote(title="solo", tags=[])
        assert api2.history("v/model")[0].value == BoardNote(title="solo", tags=[])

    def test_secrets_are_stored_as_handles(self, api: Api, boards: tuple[Board, Board]) -> None:
        register_secret("board-suite", REGISTERED)
        try:
            value = {"password": REGISTERED, "note": f"call with {API_KEY} please"}
            api.put("sec/k", value)
            data = self.raw(boards[0], "sec/k")
            assert data is not None
            assert REGISTERED.encode() not in data and API_KEY.encode() not in data
            assert api.value("sec/k") == value  # the handles resolve on read, in this process
            assert api.history("sec/k")[0].value == value
        finally:
            unregister_secret("board-suite")

    def test_encryption_seals_values(self, api: Api, boards: tuple[Board, Board]) -> None:
        if "encryption" not in self.wrappers(boards[0]):
            pytest.skip("the store was not opened with encryption=")
        api.put("enc/k", {"text": MARKER})
        api.put("enc/k", [MARKER, MARKER])
        for version in (1, 2):
            data = self.raw(boards[0], "enc/k", version)
            assert data is not None and MARKER.encode() not in data
        assert api.value("enc/k") == [MARKER, MARKER]
        assert api.get("enc/k", version=1).value == {"text": MARKER}

    def test_integrity_refuses_a_tampered_value(self, api: Api, boards: tuple[Board, Board]) -> None:
        board = boards[0]
        tagger = self.wrappers(board).get("integrity")
        if tagger is None:
            pytest.skip("the store was not opened with integrity=")
        under = tagger.inner  # type: ignore[attr-defined]  # what the integrity layer wraps
        api.put("int/a", {"pay": 10})
        api.put("int/b", {"pay": 99999})
        entry = under.kv_get(board.name, "int/a")
        assert entry is not None and entry.value
        flipped = entry.value[:-1] + bytes([entry.value[-1] ^ 1])
        under.kv_write(board.name, [KvOp("int/a", 1, flipped)], keep=10)
        with pytest.raises(IntegrityError):
            api.get("int/a")
        assert api.get("int/a", version=1).value == {"pay": 10}  # the untouched version still reads
        moved = under.kv_get(board.name, "int/b")
        assert moved is not None
        under.kv_write(board.name, [KvOp("int/a", 2, moved.value)], keep=10)  # another key's tagged value
        with pytest.raises(IntegrityError):
            api.get("int/a")
        with pytest.raises(IntegrityError):
            api.list("int/")

    def test_offload_moves_big_values(self, api: Api, api2: Api, boards: tuple[Board, Board]) -> None:
        offload = self.wrappers(boards[0]).get("offload")
        if offload is None:
            pytest.skip("the store was not opened with blobs=")
        threshold = offload.threshold  # type: ignore[attr-defined]
        big = os.urandom(max(threshold, 1024) * 4).hex()  # does not compress below the threshold
        assert api.put("off/big", {"blob": big}) == 1
        api.put("off/small", "tiny")
        data = self.raw(boards[0], "off/big")
        assert data is not None and len(data) < len(big) // 2  # the primary keeps a pointer
        assert api2.value("off/big") == {"blob": big}
        assert [e.key for e in api2.list("off/")] == ["off/big", "off/small"]
        api.put("off/big", {"blob": big[::-1]})
        assert [e.value["blob"] for e in api2.history("off/big")] == [big[::-1], big]
        assert api.delete("off/big") and api2.get("off/big") is None

    # -- TTL -----------------------------------------------------------------------------------

    def test_ttl_per_put_and_per_policy(self, api: Api) -> None:
        api.policy("tmp/", ttl=1.5)  # long enough to read it back on a slow store before it expires
        api.put("tmp/a", 1)
        api.put("tmp/b", 2, ttl=3600)  # a put's own ttl wins over the policy's
        api.put("keep", 3)
        short = api.get("tmp/a")
        assert short.expires_at is not None and api.get("keep").expires_at is None
        assert api.get("tmp/b").expires_at > short.expires_at
        wait_past(short.expires_at)
        assert api.get("tmp/a") is None and api.value("tmp/a", "gone") == "gone"
        assert api.value("tmp/b") == 2 and api.value("keep") == 3
        assert [e.key for e in api.list("")] == ["keep", "tmp/b"]
        assert api.put("tmp/a", 4) == 2  # a new write after the expiry: the version goes on

    def test_refresh_on_read_moves_the_expiry(self, api: Api) -> None:
        api.policy("sess/", ttl=4.0, refresh_on_read=True)
        api.put("sess/u1", {"turns": 1})
        first = api.get("sess/u1")
        assert api.get("sess/u1").version == first.version  # more than half the TTL left: no write
        wait_past(first.expires_at.timestamp() - 1.9)  # less than half left: the next read refreshes
        second = api.get("sess/u1")
        assert second.expires_at > first.expires_at and second.value == {"turns": 1}
        assert second.version == first.version + 1
        assert api.get("sess/u1").version == second.version  # a full TTL again: no write
        assert api.get("sess/u1", version=1).value == {"turns": 1}

    # -- bad input -------------------------------------------------------------------------------

    def test_bad_input_is_a_persistkit_error(self, api: Api, boards: tuple[Board, Board]) -> None:
        store: Any = boards[0].store
        for name in ("", "has space", "x" * 65, "a/b", 5):
            with pytest.raises(PersistkitError):
                store.board(name)
        by_key: list[Callable[[Any], Any]] = [
            lambda k: api.get(k), lambda k: api.put(k, 1), lambda k: api.cas(k, 1, 0),
            lambda k: api.delete(k), lambda k: api.history(k), lambda k: api.update(k, lambda v: v),
            lambda k: api.batch().put(k, 1), lambda k: api.list("", after=k),
        ]
        for key in ("", "a\x00b", "k" * 1025, 5, None):
            for attempt in by_key[:-1] if key is None else by_key:  # after=None: from the start
                with pytest.raises(PersistkitError):
                    attempt(key)
        for ttl in (0, -1, "5", True, float("nan"), float("inf")):
            with pytest.raises(PersistkitError):
                api.put("k", 1, ttl=ttl)
        for limit in (0, -1, "10", True, 10_001, 2.5):
            with pytest.raises(PersistkitError):
                api.list("", limit=limit)
        for limit in (0, -1, "2", True, 2.5):
            with pytest.raises(PersistkitError):
                api.history("k", limit=limit)
        for version in (0, -1, "1", True, 1.0):
            with pytest.raises(PersistkitError):
                api.get("k", version=version)
        for expected in (-1, "0", None, False, 1.0):
            with pytest.raises(PersistkitError):
                api.cas("k", 1, expected)
        calls: list[Callable[[], Any]] = [
            lambda: api.list("a\x00"), lambda: api.update("k", "not callable"),
            lambda: api.put("k", object()), lambda: api.policy("p/", history=0),
            lambda: api.policy("p/", ttl=-1), lambda: api.policy("p/", schema=object),
        ]
        for bad in calls:
            with pytest.raises(PersistkitError):
                bad()
        assert api.get("k") is None and api.list("") == []  # nothing was written by any of them

    def test_longest_keys(self, api: Api, api2: Api) -> None:
        keys = ["k" * 1024, "é" * 1024, "😀" * 1024]  # at most 1024 characters, up to 4096 bytes
        for k in keys:
            assert api.put(k, k[:3]) == 1
        assert [e.key for e in api2.list("")] == sorted(keys)
        assert api2.value(keys[2]) == keys[2][:3]
