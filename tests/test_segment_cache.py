"""The list segments a store keeps across turns (``state/_segments.py``, issue #37).

A long-lived worker's turn on a thread whose state holds a list read the list's chain back
through the rows written since its last span (up to ``SPAN_SEGMENTS`` segments, in pages
of 512 rows) and decoded them all, on every turn: a one-append turn grew with the thread.
Now a store keeps the segments its runs read, and a turn reads only the rows written since
(one short page). These tests count rows read (never time) and check what must hold
whatever the cache holds:

* a turn on a thread of many turns reads one short page, where a store that kept nothing
  (a new process) reads the whole tail; both see the same list, item for item, on every
  store and with every feature that touches stored bytes (secrets, encryption + integrity,
  offload: dealt over the stores), with spans written often or not at all;
* two stores (two processes) taking turns on one thread each see the other's items;
* the cache holds stored trees only: a secret appended is a handle there, never the secret;
* it is bounded (threads least recently read go first; a thread alone over the limit is
  not kept) and ``delete_thread`` forgets the thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import make_url, uid
from test_spans import CONFIGS, SECRET, Log, item, open_store, reply, resolved

import persistkit as pk
from persistkit.state import _channels, _tracker
from persistkit.state._segments import SegmentCache

STORES = ["memory", "sqlite", "postgres", "redis", "s3", "dynamodb"]
#: Each store with one feature (taking turns), and SQLite with every one (pairwise, issue #35);
#: spans every 3 segments on half of them (the chain then runs through span blobs).
PAIRS = [(kind, CONFIGS[i % len(CONFIGS)], i % 2 == 0) for i, kind in enumerate(STORES)] + [
    ("sqlite", config, True) for config in CONFIGS if config != CONFIGS[1 % len(CONFIGS)]
]
TURNS = 40


class Rows:
    """Counts the rows ``list`` returns from a store's backend (the reads a chain walk makes)."""

    def __init__(self, store: pk.Store) -> None:
        self.read = 0
        backend = store.backend
        inner = backend.list

        def counted(*args: Any, **kwargs: Any) -> Any:
            rows = inner(*args, **kwargs)
            self.read += len(rows)
            return rows

        backend.list = counted  # type: ignore[method-assign]


def turn(store: pk.Store, tid: str, config: str, i: int) -> list[Any]:
    """One turn appending item ``i``; returns the list as the turn saw it after the append."""
    with pk.resume(tid, store=store, state=Log) as run:
        run.state.log.append(reply(i, config))
        return list(run.state.log)


@pytest.mark.parametrize(("kind", "config", "spans"), PAIRS)
def test_a_turn_reads_the_rows_since_the_last_turn_and_sees_the_same_list(
    kind: str, config: str, spans: bool, request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    if spans:
        monkeypatch.setattr(_tracker, "SPAN_SEGMENTS", 3)
    store = open_store(make_url(kind, request, tmp_path_factory), config, tmp_path)
    tid = uid("seg")
    try:
        for i in range(TURNS):
            assert resolved(turn(store, tid, config, i)) == [item(j, config) for j in range(i + 1)]
        rows = Rows(store)
        kept = resolved(turn(store, tid, config, TURNS))
        cached = rows.read
        store._segments.clear()  # as a new process: nothing kept
        rows.read = 0
        fresh = resolved(turn(store, tid, config, TURNS + 1))
        walked = rows.read
        assert kept == [item(j, config) for j in range(TURNS + 1)]
        assert fresh == [item(j, config) for j in range(TURNS + 2)]
        assert resolved(store.get_state(tid)["log"]) == fresh
        # the rows since the last turn (one short page; the run's own rows: one more list)
        assert cached <= 2 * _channels._SHORT_PAGE, cached
        if not spans:  # without a span the fresh walk reads the whole chain: two rows a turn
            assert walked >= 2 * TURNS > cached, (walked, cached)
        if config == "secrets":
            assert SECRET not in repr(store._segments._threads)
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_two_stores_taking_turns_on_one_thread_see_each_others_items(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    url = make_url(kind, request, tmp_path_factory)
    first, second = pk.connect(url), pk.connect(url)
    tid = uid("seg2")
    try:
        for i in range(24):
            store = (first, second)[(i // 3) % 2]  # three turns each, in turn
            assert turn(store, tid, "plain", i) == [item(j, "plain") for j in range(i + 1)]
    finally:
        first.close()
        second.close()


def test_a_thread_too_big_to_keep_is_read_as_before_and_not_measured_again(
    local_store: pk.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    local_store._segments.limit = 2_000  # a few items' JSON
    tid = uid("seg4")
    for i in range(30):
        assert turn(local_store, tid, "plain", i) == [item(j, "plain") for j in range(i + 1)]
    assert local_store._segments.segments("", tid) is None and local_store._segments.oversized("", tid)
    measured: list[int] = []
    real = _channels.Loader._leave
    monkeypatch.setattr(_channels.Loader, "_leave", lambda self, *a: measured.append(1) or real(self, *a))
    assert turn(local_store, tid, "plain", 30) == [item(j, "plain") for j in range(31)]
    assert measured == []


def test_delete_thread_forgets_its_segments(local_store: pk.Store) -> None:
    tid = uid("seg3")
    for i in range(3):
        turn(local_store, tid, "plain", i)
    assert local_store._segments.segments("", tid)
    local_store.delete_thread(tid)
    assert local_store._segments.segments("", tid) is None
    assert turn(local_store, tid, "plain", 0) == [item(0, "plain")]  # a new thread under the id


def test_the_cache_is_bounded() -> None:
    cache = SegmentCache(limit=1000)
    seg = (None, 0, ["x"])
    for t in range(5):
        cache.add("", f"t{t}", {("log", f"k{t}-{i}"): (seg, 100) for i in range(3)})
    assert cache._bytes <= 1000
    assert cache.segments("", "t0") is None and cache.segments("", "t1") is None  # least recent first
    assert cache.segments("", "t4") is not None
    cache.segments("", "t2")  # read: now the most recent
    cache.add("", "t5", {("log", "k5"): (seg, 300)})
    assert cache.segments("", "t2") is not None and cache.segments("", "t3") is None
    cache.add("", "big", {("log", "b"): (seg, 1001)})  # alone over the limit: not kept
    assert cache.segments("", "big") is None and cache._bytes <= 1000
    assert cache.oversized("", "big")  # nor measured again
    cache.forget("big")
    assert not cache.oversized("", "big")
    cache.add("ns", "t4", {("log", "n"): (seg, 10)})
    cache.forget("t4")
    assert cache.segments("", "t4") is None and cache.segments("ns", "t4") is None
    cache.add("", "t5", {("log", "k5"): (seg, 300)})  # already kept: counted once
    assert cache._bytes == sum(total[0] for _, total in cache._threads.values())


def test_a_segment_kept_before_a_prune_does_not_lead_the_walk_into_pruned_rows(local_store: pk.Store) -> None:
    """Retention roots a pruned list at the oldest segment it keeps (a blob of every item up to
    it); a segment kept here from before the prune still links to the rows that went. The walk
    that meets a row gone walks the store again (found by the retention suite's random
    histories: a turn after two prunes raised "missing its segment")."""
    from persistkit.testing.retention_suite import _turn

    tid = uid("seg5")
    step = 0
    plan = [("turn", 1, True), ("turn", 1, False), ("turn", 3, True), ("turn", 4, False), ("turn", 1, False),
            ("prune", 1, True), ("turn", 4, False), ("turn", 1, False), ("turn", 1, False), ("prune", 3, False)]
    for op, n, flag in plan:
        if op == "turn":
            _turn(local_store, tid, range(step, step + n), append_result=flag)
            step += n
        else:
            for _ in range(2):
                local_store.prune(pk.Retention(keep_last=n, final_only=flag), thread_id=tid)
    before = local_store.get_state(tid)["log"]
    _turn(local_store, tid, range(step, step + 1))
    assert local_store.get_state(tid)["log"][: len(before)] == before
