"""PersistkitStore (LangGraph's BaseStore over a board): differential against LangGraph's own
InMemoryStore on random operation sequences, namespaces and TTL, a real graph, async twins.

Every test takes the ``store`` fixture (one per backend) and skips a store without the
``kv`` capability (every shipped store has it; docs/adapters-langgraph.md says so).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypedDict

import pytest
from conftest import uid

pytest.importorskip("langgraph.store.memory")

from langgraph.graph import END, START, StateGraph
from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore

import persistkit as pk
from persistkit_langgraph import PersistkitSaver, PersistkitStore
from persistkit_langgraph._store_rules import board_key, parse_key


@pytest.fixture
def kv_store(store: pk.Store) -> pk.Store:
    if not store.backend.supports_kv:
        pytest.skip(f"{store.url}: no kv capability on this store yet")
    return store


@pytest.fixture
def lg(kv_store: pk.Store) -> Iterator[PersistkitStore]:
    s = PersistkitStore(kv_store, board=uid("lg"))
    yield s
    s.board.clear()


class Reference(InMemoryStore):
    """LangGraph's InMemoryStore, except that a namespace exists while it holds an item:
    InMemoryStore keeps an emptied namespace (or one a ``get`` touched) in ``list_namespaces``,
    where PersistkitStore (like LangGraph's PostgresStore) lists only namespaces with items."""

    def _handle_list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        for ns in [ns for ns, items in self._data.items() if not items]:
            del self._data[ns]
        return super()._handle_list_namespaces(op)


# -- random operations --------------------------------------------------------------------------

LABELS = ["a", "b", "users", "42", "ü", "日本", "x/y", "50%", "a b", "-", "z"]
KEYS = ["k1", "k2", "profile", "ключ", "x/1", "%", "a b", "🙂"]
WORDS = ["red", "blue", "grün", "", "10", "x/y"]


def _label(rng: random.Random) -> str:
    return rng.choice(LABELS) if rng.random() < 0.3 else rng.choice(LABELS[:3])  # a few crowded namespaces


def _namespace(rng: random.Random, lo: int = 1) -> tuple[str, ...]:
    return tuple(_label(rng) for _ in range(rng.randint(lo, 3)))


def _value(rng: random.Random) -> dict[str, Any]:
    v: dict[str, Any] = {"r": rng.choice([rng.randint(-3, 3), round(rng.uniform(-3, 3), 2)])}  # always a number
    if rng.random() < 0.8:
        v["n"] = rng.choice([rng.randint(-3, 3), rng.uniform(-3, 3), rng.choice(WORDS)])
    if rng.random() < 0.7:
        v["s"] = rng.choice(WORDS)
    if rng.random() < 0.4:
        v["tags"] = [rng.choice(WORDS) for _ in range(rng.randint(0, 2))]
    if rng.random() < 0.4:
        v["nested"] = {"c": rng.choice(WORDS), "d": rng.randint(0, 2)}
    if rng.random() < 0.3:
        v["flag"] = rng.random() < 0.5
    if rng.random() < 0.2:
        v["a.b"] = rng.choice(WORDS)  # a dotted key is a plain top-level field
    return v


def _filter(rng: random.Random) -> dict[str, Any] | None:
    choices: list[Callable[[], dict[str, Any]]] = [
        lambda: {"s": rng.choice(WORDS)},
        lambda: {"r": {rng.choice(["$gt", "$gte", "$lt", "$lte"]): rng.randint(-2, 2)}},
        lambda: {"r": {rng.choice(["$gt", "$gte", "$lt", "$lte"]): rng.randint(-2, 2)}},
        lambda: {"n": {rng.choice(["$gt", "$lte"]): rng.randint(-2, 2)}},  # InMemoryStore may raise
        lambda: {"n": {"$ne": rng.randint(-1, 1)}},
        lambda: {"n": {"$eq": rng.randint(-1, 1)}, "s": rng.choice(WORDS)},
        lambda: {"nested": {"c": rng.choice(WORDS)}},
        lambda: {"tags": [rng.choice(WORDS)]},
        lambda: {"flag": rng.random() < 0.5},
        lambda: {rng.choice(["a.b", "nested.c"]): rng.choice(WORDS)},
        lambda: {"r": {"$gte": -1, "$lt": 2}, "s": {"$ne": "red"}},
    ]
    return None if rng.random() < 0.3 else rng.choice(choices)()


def _path(rng: random.Random) -> tuple[str, ...]:
    return tuple("*" if rng.random() < 0.3 else _label(rng) for _ in range(rng.randint(1, 2)))


def random_ops(seed: int, n: int) -> Iterator[list[Op]]:
    """``n`` steps, each a batch (mostly of one op): puts, deletes, gets, searches, listings."""
    rng = random.Random(seed)
    for _ in range(n):
        batch: list[Op] = []
        for _ in range(1 if rng.random() < 0.85 else rng.randint(2, 5)):
            r = rng.random()
            if r < 0.35:
                batch.append(PutOp(_namespace(rng), rng.choice(KEYS), _value(rng)))
            elif r < 0.45:
                batch.append(PutOp(_namespace(rng), rng.choice(KEYS), None))
            elif r < 0.6:
                batch.append(GetOp(_namespace(rng), rng.choice(KEYS)))
            elif r < 0.85:
                limit = rng.choice([1, 2, 3, 5, 10, 1000])
                batch.append(SearchOp(_namespace(rng, 0)[: rng.randint(0, 2)], _filter(rng), limit, rng.choice([0, 0, 1, 2, 5])))
            else:
                conditions = []
                if rng.random() < 0.5:
                    conditions.append(MatchCondition("prefix", _path(rng)))
                if rng.random() < 0.4:
                    conditions.append(MatchCondition("suffix", _path(rng)))
                depth = rng.choice([None, None, 1, 2, 3])
                batch.append(ListNamespacesOp(tuple(conditions), depth, rng.choice([1, 3, 100]), rng.choice([0, 0, 1, 4])))
        yield batch


def _triple(item: Any) -> tuple[tuple[str, ...], str, dict[str, Any]]:
    return (tuple(item.namespace), item.key, item.value)


class Differ:
    """Runs the same batches on the reference and on PersistkitStore and compares results."""

    def __init__(self, lg: PersistkitStore) -> None:
        self.ref = Reference()
        self.lg = lg
        self.compared = {"get": 0, "search": 0, "list": 0, "ref_raised": 0}

    def prepare(self, batch: list[Op]) -> tuple[list[Op], list[Op]]:
        """The reference's batch (searches widened to every match, to compare pages against
        the order PersistkitStore defines) and ours."""
        ref_ops: list[Op] = [op._replace(limit=10**6, offset=0) if isinstance(op, SearchOp) else op for op in batch]
        return ref_ops, batch

    def check(self, batch: list[Op], ref_ops: list[Op], ref: list[Result] | None, ours: list[Result]) -> None:
        assert len(ours) == len(batch)
        if ref is None:  # the reference raised (a range operator on a non-number): ours must not
            self.compared["ref_raised"] += 1
            return
        for op, r, o in zip(batch, ref, ours, strict=True):
            if isinstance(op, GetOp):
                assert (r is None) == (o is None), op
                if r is not None:
                    assert _triple(o) == _triple(r), op
                    assert o.created_at <= o.updated_at  # type: ignore[union-attr]
                self.compared["get"] += 1
            elif isinstance(op, SearchOp):
                # Every match, in PersistkitStore's order (board keys), then the page.
                expected = sorted((_triple(i) for i in r), key=lambda t: board_key(t[0], t[1]))  # type: ignore[union-attr]
                assert [_triple(i) for i in o] == expected[op.offset : op.offset + op.limit], op  # type: ignore[union-attr]
                assert all(i.score is None for i in o)  # type: ignore[union-attr]
                self.compared["search"] += 1
            elif isinstance(op, ListNamespacesOp):
                assert o == r, op
                self.compared["list"] += 1
            else:
                assert o is None and r is None

    def run_sync(self, seed: int, n: int) -> None:
        for batch in random_ops(seed, n):
            ref_ops, ours_ops = self.prepare(batch)
            ref = self._ref(ref_ops)
            self.check(batch, ref_ops, ref, self.lg.batch(ours_ops))
        self.final()

    async def run_async(self, seed: int, n: int) -> None:
        for batch in random_ops(seed, n):
            ref_ops, ours_ops = self.prepare(batch)
            ref = self._ref(ref_ops)
            self.check(batch, ref_ops, ref, await self.lg.abatch(ours_ops))
        self.final()

    def _ref(self, ops: list[Op]) -> list[Result] | None:
        try:
            return self.ref.batch(ops)
        except (TypeError, ValueError):  # InMemoryStore: float(None) in $gt and friends
            # Its searches run before its puts, so a raising batch wrote nothing: apply the
            # puts alone to stay in step with PersistkitStore, which did write them.
            self.ref.batch([op for op in ops if isinstance(op, PutOp)])
            return None

    def final(self) -> None:
        everything = sorted((_triple(i) for i in self.ref.search((), limit=10**6)), key=lambda t: board_key(t[0], t[1]))
        assert [_triple(i) for i in self.lg.search((), limit=10**6)] == everything
        assert self.lg.list_namespaces(limit=10**6) == self.ref.list_namespaces(limit=10**6)
        assert all(self.compared[k] > 20 for k in ("get", "search", "list")), self.compared
        assert self.compared["ref_raised"] < self.compared["search"] / 4, self.compared


def _on_moto(store: pk.Store) -> bool:
    """S3 and DynamoDB here are moto's server: one Python process answering every request over
    HTTP, 20-50x slower than the other stores for the same operations."""
    return store.url.startswith(("s3:", "dynamodb:"))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_differential_against_inmemorystore(lg: PersistkitStore, kv_store: pk.Store, seed: int) -> None:
    if seed != 1 and _on_moto(kv_store):  # 70-100 s a seed there (issue #35)
        pytest.skip("one random history on moto's S3 and DynamoDB (seed 1); three on the others")
    Differ(lg).run_sync(seed, 400)


@pytest.mark.parametrize("seed", [4])
def test_differential_async(lg: PersistkitStore, kv_store: pk.Store, seed: int) -> None:
    if _on_moto(kv_store):  # 83 s on S3 (issue #35)
        pytest.skip("S3's and DynamoDB's async is their sync methods in a worker thread (the sync history runs "
                    "here); the async path is checked on memory, SQLite, and PostgreSQL's and Redis's own async")
    asyncio.run(Differ(lg).run_async(seed, 300))


# -- namespaces, keys, timestamps -------------------------------------------------------------


def test_board_keys_cannot_collide_and_keep_prefixes() -> None:
    rng = random.Random(7)
    alphabet = ["a", "/", "%", "2F", "25", "\x00", "ü", " ", "-"]
    seen: dict[str, tuple[tuple[str, ...], str]] = {}
    for _ in range(3000):
        ns = tuple("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 3)))
        key = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 3)))
        bk = board_key(ns, key)
        assert parse_key(bk) == (ns, key)
        assert seen.setdefault(bk, (ns, key)) == (ns, key), bk
        for cut in range(len(ns) + 1):  # a search under any leading part of ns finds the item
            assert bk.startswith(board_key(ns[:cut], ""))


def test_put_keeps_created_at_and_values_go_through_the_board(lg: PersistkitStore) -> None:
    lg.put(("users", "42"), "profile", {"name": "Ann"})
    first = lg.get(("users", "42"), "profile")
    lg.put(("users", "42"), "profile", {"name": "Ann", "lang": "de"})
    second = lg.get(("users", "42"), "profile")
    assert first is not None and second is not None
    assert second.value == {"name": "Ann", "lang": "de"}
    assert second.created_at == first.created_at and second.updated_at >= first.updated_at
    assert second.created_at.tzinfo is not None
    # the board holds it at its path; a board user reads the envelope
    entry = lg.board.get("users/42/profile")
    assert entry is not None and entry.value["value"] == {"name": "Ann", "lang": "de"}
    lg.delete(("users", "42"), "profile")
    lg.put(("users", "42"), "profile", {"name": "Bo"})
    third = lg.get(("users", "42"), "profile")
    assert third is not None and third.created_at > first.created_at  # a new item after a delete


def test_namespace_rules_match_langgraph(lg: PersistkitStore) -> None:
    doc = {"foo": "bar"}
    for bad in [(), ("the", "thing.about"), ("some", "fun", ""), ("langgraph", "foo")]:
        with pytest.raises(InvalidNamespaceError):
            lg.put(bad, "foo", doc)
        with pytest.raises(InvalidNamespaceError):
            asyncio.run(lg.aput(bad, "foo", doc))
    with pytest.raises(InvalidNamespaceError):  # batch checks labels too (a dot would alias a path)
        lg.batch([PutOp(("a.b",), "k", doc)])
    with pytest.raises(InvalidNamespaceError):
        lg.batch([PutOp((), "k", doc)])
    # "langgraph" is refused only as the root label of the public put (as InMemoryStore does)
    lg.put(("foo", "langgraph", "foo"), "bar", doc)
    lg.batch([PutOp(("langgraph", "foo"), "bar", doc)])
    assert lg.get(("langgraph", "foo"), "bar").value == doc  # type: ignore[union-attr]
    assert lg.search(("foo", "langgraph"))[0].value == doc
    assert lg.get((), "bar") is None


def test_bad_inputs_raise_persistkit_errors(lg: PersistkitStore) -> None:
    with pytest.raises(pk.ConfigurationError, match="dict"):
        lg.batch([PutOp(("a",), "k", ["not", "a", "dict"])])  # type: ignore[arg-type]
    lg.put(("a",), "k", {"n": 1})
    with pytest.raises(pk.ConfigurationError, match="operator"):
        lg.search(("a",), filter={"n": {"$regex": "x"}})
    with pytest.raises(pk.ConfigurationError, match="limit"):
        lg.search(("a",), limit=-1)
    with pytest.raises(pk.ConfigurationError, match="unknown store operation"):
        lg.batch(["get"])  # type: ignore[list-item]
    with pytest.raises(pk.ConfigurationError, match="TTLConfig"):
        PersistkitStore(lg.store, ttl={"default_tll": 5})  # type: ignore[typeddict-unknown-key]
    with pytest.raises(pk.ConfigurationError, match="minutes"):
        lg.put(("a",), "k", {"n": 1}, ttl=-1)
    with pytest.raises(pk.ConfigurationError, match="no vector index"):
        PersistkitStore(lg.store, index={"dims": 3, "embed": lambda texts: [[0.0] * 3 for _ in texts]})
    with pytest.raises(pk.ConfigurationError, match=r"pk\.Store or a store URL"):
        PersistkitStore(42)  # type: ignore[arg-type]
    lg.board.put("no-namespace", {"x": 1})  # a key no namespace has: skipped
    assert [i.key for i in lg.search(())] == ["k"] and lg.list_namespaces() == [("a",)]
    lg.board.put("a/foreign", {"x": 1})  # a value PersistkitStore did not write: said so
    with pytest.raises(pk.SerializationError, match="no LangGraph store item"):
        lg.get(("a",), "foreign")


def test_batch_reads_see_the_state_before_its_writes(lg: PersistkitStore) -> None:
    lg.put(("a",), "k", {"v": 1})
    got = lg.batch([
        PutOp(("a",), "k", {"v": 2}), GetOp(("a",), "k"), PutOp(("a",), "k", {"v": 3}),
        SearchOp(("a",)), PutOp(("b",), "k", {"v": 1}), ListNamespacesOp(),
    ])
    assert got[1].value == {"v": 1}  # type: ignore[union-attr]
    assert [i.value for i in got[3]] == [{"v": 1}]  # type: ignore[union-attr]
    assert got[5] == [("a",)]
    assert lg.get(("a",), "k").value == {"v": 3}  # type: ignore[union-attr]  # the last put wins
    assert lg.board.get("a/k").version == 2  # type: ignore[union-attr]  # one write for the batch


def test_query_is_ignored_without_a_vector_index(lg: PersistkitStore) -> None:
    ref = InMemoryStore()
    for s in (lg, ref):
        s.put(("docs",), "d1", {"text": "python"})
        s.put(("docs",), "d2", {"text": "rust"})
    ours, theirs = lg.search(("docs",), query="python"), ref.search(("docs",), query="python")
    assert [_triple(i) for i in ours] == [_triple(i) for i in theirs]
    assert [i.score for i in ours] == [i.score for i in theirs] == [None, None]


def test_secrets_become_handles_in_the_stored_bytes(kv_store: pk.Store) -> None:
    lg = PersistkitStore(kv_store, board=uid("lg"))
    token = "sk-proj-" + "Zq8xT2mW9vK4pL7nR3sY6uB1"
    lg.put(("users", "1"), "creds", {"openai": token, "plain": "hello"})
    raw = kv_store.backend.kv_get(lg.board.name, "users/1/creds")
    assert raw is not None and raw.value is not None and token.encode() not in raw.value
    if not hasattr(kv_store.backend, "inner"):  # unwrapped: the bytes are readable JSON
        assert b'"plain":"hello"' in raw.value and b"$CRED{" in raw.value
    assert lg.get(("users", "1"), "creds").value == {"openai": token, "plain": "hello"}  # type: ignore[union-attr]
    lg.board.clear()


def test_concurrent_writers_keep_created_at_and_lose_nothing(lg: PersistkitStore, kv_store: pk.Store) -> None:
    lg.put(("shared",), "k", {"w": -1})
    first = lg.get(("shared",), "k")
    assert first is not None
    rounds = 6 if _on_moto(kv_store) else 15  # six racing writers either way; 145 s on moto's S3 at 15 (#35)

    def writer(w: int) -> None:
        for i in range(rounds):
            lg.batch([PutOp(("shared",), "k", {"w": w, "i": i}), PutOp(("own", str(w)), f"k{i}", {"i": i})])

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    last = lg.get(("shared",), "k")
    assert last is not None and last.created_at == first.created_at and last.value["i"] == rounds - 1
    assert len(lg.search(("own",), limit=1000)) == 6 * rounds
    assert lg.list_namespaces(prefix=("own",)) == [("own", str(w)) for w in range(6)]


# -- TTL ------------------------------------------------------------------------------------------


class Clock:
    """time.time moved forward by hand (expiry is judged by the reader's clock)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.offset = 0.0
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + self.offset)

    def advance(self, seconds: float) -> None:
        self.offset += seconds


def test_ttl_expires_refreshes_on_read_and_defaults(kv_store: pk.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    lg = PersistkitStore(kv_store, board=uid("lg"), ttl={"default_ttl": 2, "refresh_on_read": True})
    assert lg.supports_ttl
    lg.put(("m",), "short", {"v": 1}, ttl=1)  # one minute
    lg.put(("m",), "default", {"v": 2})  # the store's default_ttl: two minutes
    lg.put(("m",), "forever", {"v": 3}, ttl=None)
    clock.advance(45)
    assert lg.get(("m",), "short") is not None  # read at 45 s: expiry now 105 s
    clock.advance(45)  # 90 s
    assert lg.get(("m",), "short", refresh_ttl=False) is not None
    assert [i.key for i in lg.search(("m",), refresh_ttl=False)] == ["default", "forever", "short"]
    clock.advance(30)  # 120 s: short expired at 105 s, default at 120 s
    assert lg.get(("m",), "short") is None
    assert lg.get(("m",), "default") is None
    assert [i.key for i in lg.search(("m",))] == ["forever"]
    assert lg.list_namespaces() == [("m",)]
    lg.delete(("m",), "forever")
    assert lg.list_namespaces() == []
    # a put over an expired item starts a new item
    lg.put(("m",), "short", {"v": 4}, ttl=1)
    assert lg.get(("m",), "short").value == {"v": 4}  # type: ignore[union-attr]
    lg.board.clear()


def test_refresh_on_read_off_by_config(kv_store: pk.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    lg = PersistkitStore(kv_store, board=uid("lg"), ttl={"default_ttl": 1, "refresh_on_read": False})
    lg.put(("m",), "k", {"v": 1})
    clock.advance(50)
    assert lg.get(("m",), "k") is not None  # no refresh: still expires at 60 s
    assert lg.search(("m",))[0].key == "k"
    clock.advance(20)
    assert lg.get(("m",), "k") is None
    assert lg.get(("m",), "k", refresh_ttl=True) is None
    lg.board.clear()


def test_async_api(lg: PersistkitStore) -> None:
    async def main() -> None:
        await lg.aput(("u", "1"), "a", {"n": 1})
        await lg.aput(("u", "2"), "b", {"n": 5})
        assert (await lg.aget(("u", "1"), "a")).value == {"n": 1}  # type: ignore[union-attr]
        assert [i.key for i in await lg.asearch(("u",), filter={"n": {"$gt": 2}})] == ["b"]
        assert await lg.alist_namespaces(prefix=("u",)) == [("u", "1"), ("u", "2")]
        assert await lg.alist_namespaces(suffix=("2",), max_depth=1) == [("u",)]
        await lg.adelete(("u", "1"), "a")
        assert await lg.aget(("u", "1"), "a") is None
        results = await asyncio.gather(*(lg.aput(("c",), f"k{i}", {"i": i}) for i in range(8)))
        assert results == [None] * 8
        assert len(await lg.asearch(("c",), limit=100)) == 8

    asyncio.run(main())


def test_from_url_owns_its_store() -> None:
    with PersistkitStore(f"memory://{uid('lgurl')}") as lg:
        lg.put(("a",), "k", {"v": 1})
        assert lg.get(("a",), "k").value == {"v": 1}  # type: ignore[union-attr]
    with pytest.raises(pk.StoreClosedError):
        lg.get(("a",), "k")


# -- a graph with store=PersistkitStore --------------------------------------------------------


class State(TypedDict):
    user: str
    said: str
    seen: int


def _remember(state: State, *, store: BaseStore) -> dict[str, Any]:
    ns = ("users", state["user"], "memories")
    count = len(store.search(ns, limit=100))
    store.put(ns, f"m{count}", {"said": state["said"]})
    return {"seen": count + 1}


async def _aremember(state: State, *, store: BaseStore) -> dict[str, Any]:
    ns = ("users", state["user"], "memories")
    count = len(await store.asearch(ns, limit=100))
    await store.aput(ns, f"m{count}", {"said": state["said"]})
    return {"seen": count + 1}


def _graph(node: Any, lg: PersistkitStore) -> Any:
    builder = StateGraph(State)
    builder.add_node("remember", node)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", END)
    return builder.compile(checkpointer=PersistkitSaver(lg.store), store=lg)


def _thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": uid(name)}}


def test_graph_nodes_read_and_write_the_store(lg: PersistkitStore) -> None:
    graph = _graph(_remember, lg)
    # memories outlive threads: each turn here is a new thread
    assert graph.invoke({"user": "42", "said": "hi", "seen": 0}, _thread("t"))["seen"] == 1
    assert graph.invoke({"user": "42", "said": "bye", "seen": 0}, _thread("t"))["seen"] == 2
    assert graph.invoke({"user": "7", "said": "yo", "seen": 0}, _thread("t"))["seen"] == 1
    assert [i.value for i in lg.search(("users", "42"))] == [{"said": "hi"}, {"said": "bye"}]
    assert lg.list_namespaces(prefix=("users",), max_depth=2) == [("users", "42"), ("users", "7")]

    agraph = _graph(_aremember, lg)
    out = asyncio.run(agraph.ainvoke({"user": "42", "said": "again", "seen": 0}, _thread("t")))
    assert out["seen"] == 3
    assert lg.get(("users", "42", "memories"), "m2").value == {"said": "again"}  # type: ignore[union-attr]


def test_sweep_ttl_removes_expired_items_and_the_sweeper_stops(tmp_path: Any) -> None:
    from persistkit_langgraph import PersistkitStore

    lg = PersistkitStore(f"sqlite:///{tmp_path}/sweep.db", ttl={"refresh_on_read": False, "sweep_interval_minutes": 0.001})

    def stored() -> int:  # keys whose value is still in storage (expired ones included)
        return len(lg.store.backend.kv_list(lg.board.name))

    try:
        lg.put(("users", "1"), "a", {"v": 1}, ttl=0.001)  # 60 ms
        lg.put(("users", "1"), "b", {"v": 2})
        time.sleep(0.15)
        assert lg.get(("users", "1"), "a") is None and stored() == 2  # hidden, not yet removed
        assert lg.sweep_ttl() == 1 and stored() == 1
        assert lg.sweep_ttl() == 0
        lg.put(("users", "1"), "c", {"v": 3}, ttl=0.001)
        done = lg.start_ttl_sweeper()  # every 60 ms
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and stored() > 1:
            time.sleep(0.05)
        assert stored() == 1
        assert lg.stop_ttl_sweeper(timeout=10) and done.done()
        assert lg.get(("users", "1"), "b") is not None
    finally:
        lg.close()
