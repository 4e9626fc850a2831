"""The end-to-end contract of a store: steps, replay, runs, state, history, fork, conflicts.

Subclass :class:`StoreConformance` in your test suite and provide a
``persistkit_url`` fixture that returns the URL of a fresh, isolated store::

    from persistkit.testing import StoreConformance

    class TestMyStore(StoreConformance):
        @pytest.fixture
        def persistkit_url(self):
            return "mystore://localhost/test"

Every test uses its own unique thread ids and never assumes the store is empty.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

import pytest

import persistkit as pk

__all__ = ["StoreConformance"]


def _tid(label: str = "t") -> str:
    return f"pk-{label}-{uuid.uuid4().hex[:12]}"


class Chat(pk.State, name="persistkit.testing.Chat", version=1):
    messages: Annotated[list[dict[str, Any]], pk.append] = []
    tokens: Annotated[int, pk.add] = 0
    notes: Annotated[dict[str, str], pk.merge] = {}
    topic: str = ""


class _Crash(BaseException):
    """A process death in miniature: not an Exception, so the step in flight is not recorded."""


class Counter:
    """Side effects counted outside persistkit."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()

    def hit(self, key: str) -> int:
        with self.lock:
            self.calls[key] = self.calls.get(key, 0) + 1
            return self.calls[key]


class StoreConformance:
    """End-to-end store contract. Needs a ``persistkit_url`` fixture."""

    @pytest.fixture
    def store(self, persistkit_url: str) -> Iterator[pk.Store]:
        pk.set_testing(True)
        s = pk.connect(persistkit_url)
        yield s
        s.close()

    # -- steps and replay ------------------------------------------------------------------

    def test_finished_steps_replay_after_failure(self, store: pk.Store) -> None:
        seen = Counter()
        fail_at = {"n": 3}

        @pk.checkpointed
        def step(i: int) -> str:
            seen.hit(f"step{i}")
            if i == fail_at["n"]:
                raise TimeoutError("rate limited")
            return f"r{i}"

        tid = _tid()
        with pytest.raises(TimeoutError), pk.resume(tid, store=store) as run:
            for i in range(6):
                step(i)
        assert run.status == "failed"
        fail_at["n"] = -1
        with pk.resume(tid, store=store) as run:
            results = [step(i) for i in range(6)]
        assert results == [f"r{i}" for i in range(6)]
        assert run.status == "completed"
        assert [seen.calls[f"step{i}"] for i in range(6)] == [1, 1, 1, 2, 1, 1]
        assert [s.replayed for s in run.steps] == [True, True, True, False, False, False]

    def test_same_run_id_replays_a_completed_run(self, store: pk.Store) -> None:
        seen = Counter()

        @pk.checkpointed
        def charge(amount: int) -> dict[str, Any]:
            seen.hit("charge")
            return {"charged": amount, "key": pk.current_step().key}  # type: ignore[union-attr]

        tid = _tid()
        with pk.resume(tid, store=store, run_id="webhook-1") as run:
            first = charge(10)
        before = len(store.history(tid))
        with pk.resume(tid, store=store, run_id="webhook-1") as again:
            second = charge(10)
        assert first == second and seen.calls["charge"] == 1
        assert again.status == "completed" and again.run_id == run.run_id == "webhook-1"
        assert len(store.history(tid)) == before  # replaying wrote nothing

    def test_new_run_starts_from_latest_state(self, store: pk.Store) -> None:
        @pk.checkpointed
        def reply(text: str) -> str:
            return text.upper()

        tid = _tid()
        for word in ("hello", "again"):
            with pk.resume(tid, store=store, state=Chat) as run:
                run.state.messages.append({"role": "user", "content": word})
                run.state.messages.append({"role": "assistant", "content": reply(word)})
                run.update(tokens=5)
        state = store.get_state(tid, state=Chat)
        assert [m["content"] for m in state.messages] == ["hello", "HELLO", "again", "AGAIN"]
        assert state.tokens == 10
        runs = {cp.run_id for cp in store.history(tid)}
        assert len(runs) == 2

    def test_state_is_committed_with_each_step(self, store: pk.Store) -> None:
        @pk.checkpointed
        def work(i: int) -> int:
            run = pk.current_run()
            assert run is not None
            run.state.messages.append({"i": i})
            if i == 4:
                raise RuntimeError("crash")
            return i

        tid = _tid()
        with pytest.raises(RuntimeError), pk.resume(tid, store=store, state=Chat):
            for i in range(6):
                work(i)
        # the failed step's checkpoint holds the state at the moment it failed
        committed = [m["i"] for m in store.get_state(tid, state=Chat).messages]
        assert committed == [0, 1, 2, 3, 4]
        with pk.resume(tid, store=store, state=Chat) as run:
            assert run.state.messages == []  # the run replays from its starting state
            for i in range(4):
                work(i)
            assert [m["i"] for m in run.state.messages] == [0, 1, 2, 3]
            with pytest.raises(RuntimeError):
                work(4)  # the failure ended the last attempt: it runs again
        assert [m["i"] for m in store.get_state(tid, state=Chat).messages] == [0, 1, 2, 3, 4]

    def test_nested_steps(self, store: pk.Store) -> None:
        seen = Counter()
        boom = {"on": True}

        @pk.checkpointed
        def leaf(x: int) -> int:
            seen.hit(f"leaf{x}")
            if x == 2 and boom["on"]:
                raise ValueError("leaf 2")
            return x * 10

        @pk.checkpointed
        def parent(xs: list[int]) -> int:
            seen.hit("parent")
            return sum(leaf(x) for x in xs)

        @pk.checkpointed
        def done() -> str:
            seen.hit("done")
            return "ok"

        tid = _tid()
        with pytest.raises(ValueError), pk.resume(tid, store=store):
            parent([0, 1, 2, 3])
        boom["on"] = False
        with pk.resume(tid, store=store) as run:
            assert parent([0, 1, 2, 3]) == 60
            assert done() == "ok"
        assert seen.calls == {"parent": 2, "leaf0": 1, "leaf1": 1, "leaf2": 2, "leaf3": 1, "done": 1}
        positions = {(s.position, s.replayed) for s in run.steps}
        assert ("0/0", True) in positions and ("0/2", False) in positions and ("1", False) in positions
        # a completed parent replays whole: its children are not even looked at
        with pk.resume(tid, store=store, run_id=run.run_id) as again:
            assert parent([0, 1, 2, 3]) == 60
        assert [s.position for s in again.steps] == ["0"]

    def test_handled_error_is_replayed(self, store: pk.Store) -> None:
        seen = Counter()

        @pk.checkpointed
        def flaky() -> None:
            seen.hit("flaky")
            raise KeyError("missing")

        @pk.checkpointed
        def after() -> int:
            n = seen.hit("after")
            if n == 1:
                raise RuntimeError("die once")
            return n

        tid = _tid()
        for _ in range(2):
            try:
                with pk.resume(tid, store=store):
                    try:
                        flaky()
                    except KeyError as exc:
                        assert "missing" in str(exc)
                    after()
            except RuntimeError:
                pass
        assert seen.calls == {"flaky": 1, "after": 2}

    def test_nondeterminism_is_refused(self, store: pk.Store) -> None:
        @pk.checkpointed
        def a() -> int:
            return 1

        @pk.checkpointed
        def b() -> int:
            raise RuntimeError("stop")

        @pk.checkpointed
        def c() -> int:
            return 3

        tid = _tid()
        with pytest.raises(RuntimeError), pk.resume(tid, store=store):
            a()
            b()
        with pytest.raises(pk.NonDeterminismError) as info, pk.resume(tid, store=store):
            c()
        msg = str(info.value)
        assert ".a'" in msg and ".c'" in msg and "position 0" in msg and "run_id" in msg

    def test_changed_arguments_are_refused(self, store: pk.Store) -> None:
        @pk.checkpointed
        def ask(q: str) -> str:
            return q

        @pk.checkpointed
        def fail() -> None:
            raise RuntimeError("stop")

        tid = _tid()
        with pytest.raises(RuntimeError), pk.resume(tid, store=store):
            ask("first")
            fail()
        with pytest.raises(pk.NonDeterminismError, match="different arguments"), pk.resume(tid, store=store):
            ask("second")

    def test_retry_reruns_only_the_failed_child(self, store: pk.Store) -> None:
        seen = Counter()

        @pk.checkpointed
        def fetch(i: int) -> int:
            n = seen.hit(f"fetch{i}")
            if i == 2 and n < 3:
                raise TimeoutError("slow")
            return i

        @pk.checkpointed(retry=pk.Retry(attempts=5, on=TimeoutError))
        def gather() -> list[int]:
            seen.hit("gather")
            return [fetch(i) for i in range(4)]

        with pk.resume(_tid(), store=store):
            assert gather() == [0, 1, 2, 3]
        assert seen.calls == {"gather": 3, "fetch0": 1, "fetch1": 1, "fetch2": 3, "fetch3": 1}

    def test_retry_gives_up(self, store: pk.Store) -> None:
        seen = Counter()

        @pk.checkpointed(retry=pk.Retry(attempts=3, on=TimeoutError))
        def never() -> None:
            seen.hit("never")
            raise TimeoutError("down")

        @pk.checkpointed(retry=pk.Retry(attempts=3, on=TimeoutError))
        def wrong() -> None:
            seen.hit("wrong")
            raise ValueError("not retried")

        with pytest.raises(TimeoutError), pk.resume(_tid(), store=store):
            never()
        with pytest.raises(ValueError), pk.resume(_tid(), store=store):
            wrong()
        assert seen.calls == {"never": 3, "wrong": 1}

    def test_idempotency_key_is_stable(self, store: pk.Store) -> None:
        keys: list[str] = []

        @pk.checkpointed
        def pay() -> None:
            info = pk.current_step()
            assert info is not None
            keys.append(info.key)
            if len(keys) == 1:
                raise ConnectionError("lost")

        tid = _tid()
        for _ in range(2):
            try:
                with pk.resume(tid, store=store):
                    pay()
            except ConnectionError:
                pass
        assert len(keys) == 2 and keys[0] == keys[1]
        assert pk.current_step() is None

    def test_outside_a_block_steps_are_plain_calls(self, store: pk.Store) -> None:
        @pk.checkpointed
        def double(x: int) -> int:
            return 2 * x

        assert double(4) == 8
        tid = _tid()
        with pk.resume(tid, store=store):
            pass
        history_before = len(store.history(tid))
        assert double(5) == 10
        assert len(store.history(tid)) == history_before

    # -- concurrency -----------------------------------------------------------------------

    def test_two_writers_on_one_thread_conflict(self, store: pk.Store) -> None:
        @pk.checkpointed(name="step")
        def step(label: str) -> str:
            return label

        tid = _tid()
        with pk.resume(tid, store=store):
            step("seed")
        with pytest.raises(pk.ConflictError) as info, pk.resume(tid, store=store):
            with pk.resume(tid, store=store):
                step("inner")
            step("outer")
        err = info.value
        assert err.thread_id == tid and err.found == err.expected + 2  # inner: step + end
        labels = [cp.step for cp in store.history(tid) if cp.kind == "step"]
        assert labels.count("step") == 2  # seed + inner; outer was refused

    def test_many_threads_in_parallel(self, store: pk.Store) -> None:
        @pk.checkpointed
        def inc(i: int) -> int:
            return i + 1

        def agent(tid: str) -> list[int]:
            with pk.resume(tid, store=store):
                return [inc(i) for i in range(10)]

        tids = [_tid("par") for _ in range(8)]
        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(agent, tids))
        assert all(r == list(range(1, 11)) for r in results)
        assert all(len(store.history(t)) == 11 for t in tids)

    # -- async -------------------------------------------------------------------------------

    def test_async_steps(self, store: pk.Store) -> None:
        seen = Counter()

        @pk.checkpointed
        async def fetch(i: int) -> int:
            seen.hit(f"f{i}")
            await asyncio.sleep(0)
            if i == 3 and seen.calls[f"f{i}"] == 1:
                raise TimeoutError("once")
            return i * i

        async def main(tid: str) -> list[int]:
            async with pk.resume(tid, store=store, state=Chat) as run:
                run.state.topic = "async"
                out = list(await asyncio.gather(*(fetch(i) for i in range(5))))
                return out

        tid = _tid()
        with pytest.raises(TimeoutError):
            asyncio.run(main(tid))
        assert asyncio.run(main(tid)) == [0, 1, 4, 9, 16]
        assert seen.calls["f3"] == 2 and all(seen.calls[f"f{i}"] == 1 for i in (0, 1, 2, 4))
        assert asyncio.run(store.aget_state(tid, state=Chat)).topic == "async"
        assert len(asyncio.run(store.ahistory(tid))) == len(store.history(tid))

    # -- state, history, time travel ---------------------------------------------------------

    def test_history_pages_and_filters(self, store: pk.Store) -> None:
        @pk.checkpointed
        def s(i: int) -> int:
            return i

        tid = _tid()
        run_ids = []
        for r in range(3):
            with pk.resume(tid, store=store, metadata={"turn": r}) as run:
                for i in range(4):
                    s(i)
            run_ids.append(run.run_id)
        full = store.history(tid)
        assert len(full) == 15
        assert [c.checkpoint_id for c in full] == sorted((c.checkpoint_id for c in full), reverse=True)
        assert full[0].kind == "end" and full[0].run_status == "completed"
        paged: list[pk.Checkpoint] = []
        before = None
        while True:
            page = store.history(tid, limit=4, before=before)
            if not page:
                break
            paged.extend(page)
            before = page[-1].checkpoint_id
        assert [c.checkpoint_id for c in paged] == [c.checkpoint_id for c in full]
        assert {c.run_id for c in store.history(tid, run_id=run_ids[1])} == {run_ids[1]}
        assert len(store.history(tid, metadata={"turn": 2})) == 5
        assert len(store.history(tid, metadata={"turn": 2}, limit=2)) == 2
        for cp in full:
            assert cp.parent_id is None or cp.parent_id < cp.checkpoint_id
        assert store.history(_tid("none")) == []

    def test_state_at_any_checkpoint(self, store: pk.Store) -> None:
        @pk.checkpointed
        def say(i: int) -> None:
            run = pk.current_run()
            assert run is not None
            run.state.messages.append({"i": i})

        tid = _tid()
        with pk.resume(tid, store=store, state=Chat):
            for i in range(5):
                say(i)
        steps = [c for c in reversed(store.history(tid)) if c.kind == "step"]
        for n, cp in enumerate(steps):
            st = store.get_state(tid, cp.checkpoint_id, state=Chat)
            assert [m["i"] for m in st.messages] == list(range(n + 1))
        as_dict = store.get_state(tid, steps[1].checkpoint_id)
        assert [m["i"] for m in as_dict["messages"]] == [0, 1]

    def test_fork_with_update_and_lineage(self, store: pk.Store) -> None:
        @pk.checkpointed
        def say(text: str) -> None:
            run = pk.current_run()
            assert run is not None
            run.state.messages.append({"content": text})

        tid = _tid()
        with pk.resume(tid, store=store, state=Chat):
            say("a")
            say("b")
            say("c")
        at_b = [c for c in store.history(tid) if c.kind == "step"][1]
        fork = store.fork(tid, at_b.checkpoint_id, update={"messages": [{"content": "edited"}], "tokens": 7}, state=Chat)
        assert fork.forked_from == (tid, at_b.checkpoint_id) and fork.thread_id != tid
        forked = store.get_state(fork.thread_id, state=Chat)
        assert [m["content"] for m in forked.messages] == ["a", "b", "edited"]
        assert forked.tokens == 7
        with pk.resume(fork.thread_id, store=store, state=Chat):
            say("d")
        assert [m["content"] for m in store.get_state(fork.thread_id, state=Chat).messages] == ["a", "b", "edited", "d"]
        assert [m["content"] for m in store.get_state(tid, state=Chat).messages] == ["a", "b", "c"]
        named = _tid("named")
        assert store.fork(tid, new_thread_id=named).thread_id == named
        with pytest.raises(pk.ConfigurationError, match="already exists"):
            store.fork(tid, new_thread_id=named)

    def test_update_state_outside_a_run(self, store: pk.Store) -> None:
        tid = _tid()
        store.update_state(tid, {"messages": [{"role": "system"}], "notes": {"a": "1"}}, state=Chat)
        store.update_state(tid, {"messages": {"role": "user"}, "notes": {"b": "2"}, "tokens": 3}, state=Chat)
        st = store.get_state(tid, state=Chat)
        assert [m["role"] for m in st.messages] == ["system", "user"]
        assert st.notes == {"a": "1", "b": "2"} and st.tokens == 3
        with pytest.raises(pk.ConfigurationError, match="unknown field"):
            store.update_state(tid, {"nope": 1}, state=Chat)

    def test_schema_versions_migrate_on_load(self, store: pk.Store) -> None:
        name = f"persistkit.testing.Doc-{uuid.uuid4().hex[:6]}"

        class DocV1(pk.State, name=name, version=1):
            title: str = ""

        class DocV2(pk.State, name=name, version=2):
            title: str = ""
            words: int = 0

        @pk.migration(DocV2, from_version=1)
        def add_words(data: dict[str, Any]) -> dict[str, Any]:
            return {**data, "words": len(data["title"].split())}

        class DocV3(pk.State, name=name, version=3):
            title: str = ""

        tid = _tid()
        with pk.resume(tid, store=store, state=DocV1) as run:
            run.state.title = "durable agents rock"
        with pk.resume(tid, store=store, state=DocV2) as run:
            assert run.state.words == 3
        assert store.history(tid)[0].schema == (name, 2)
        with pytest.raises(pk.SchemaVersionError, match="newer"):
            store.get_state(tid, state=DocV1)
        with pytest.raises(pk.SchemaVersionError, match="from version 2"):
            store.get_state(tid, state=DocV3)

    # -- threads, deletion, bad input ----------------------------------------------------

    def test_threads_and_delete(self, store: pk.Store) -> None:
        prefix = f"pk-list-{uuid.uuid4().hex[:8]}-"
        tids = [prefix + s for s in ("a", "b", "ü", "日本", "🙂 x/y")]
        for tid in tids:
            with pk.resume(tid, store=store) as run:
                run.state["who"] = tid
        assert store.threads(prefix=prefix) == sorted(tids)
        assert store.threads(prefix=prefix, limit=2) == sorted(tids)[:2]
        assert store.threads(prefix=prefix, after=sorted(tids)[1]) == sorted(tids)[2:]
        for tid in tids:
            assert store.get_state(tid) == {"who": tid}
        assert store.delete_thread(tids[0]) is True
        assert store.delete_thread(tids[0]) is False
        assert store.history(tids[0]) == []
        with pytest.raises(pk.NotFoundError):
            store.get_state(tids[0])
        assert store.threads(prefix=prefix) == sorted(tids[1:])

    def test_bad_input_is_a_clear_error(self, store: pk.Store) -> None:
        for bad in ("", "   ", "x" * 513, "a\x00b", None, 42):
            with pytest.raises(pk.ConfigurationError):
                pk.resume(bad, store=store)  # type: ignore[arg-type]
        tid = _tid()
        with pk.resume(tid, store=store):
            pass
        for cid in ("nope", "0" * 24):
            with pytest.raises(pk.NotFoundError):
                store.get_state(tid, cid)
        with pytest.raises(pk.NotFoundError):
            store.fork(_tid("absent"))
        with pytest.raises(pk.ConfigurationError):
            store.history(tid, limit=0)

    def test_unstorable_result_is_recorded_and_not_run_again(self, store: pk.Store) -> None:
        class Opaque:
            pass

        seen = Counter()

        @pk.checkpointed
        def bad() -> Any:
            seen.hit("bad")
            return Opaque()

        tid = _tid()
        for _ in range(2):  # the step ran: its side effect must not happen again
            with pytest.raises(pk.SerializationError, match="bad"), pk.resume(tid, store=store):
                bad()
            assert seen.calls == {"bad": 1}
            assert store.history(tid)[0].run_status == "failed"  # recorded, not left running

    def test_unstorable_state_is_found_before_the_step_runs(self, store: pk.Store) -> None:
        seen = Counter()

        @pk.checkpointed
        def send() -> None:
            seen.hit("send")

        tid = _tid()
        with pytest.raises(pk.SerializationError, match="was not run"), pk.resume(tid, store=store) as run:
            run.state["client"] = threading.Lock()
            send()
        assert seen.calls == {} and store.history(tid)[0].run_status == "failed"

    # -- schema changes across a crash -------------------------------------------------

    def test_crashed_run_resumed_by_code_with_a_migration(self, store: pk.Store) -> None:
        name = f"persistkit.testing.Turns-{uuid.uuid4().hex[:6]}"

        class V1(pk.State, name=name, version=1):
            turns: int = 0
            log: Annotated[list[str], pk.append] = []

        class V2(pk.State, name=name, version=2):
            turn_count: int = 0
            origin: str = ""
            log: Annotated[list[dict[str, str]], pk.append] = []

        @pk.migration(V2, from_version=1)
        def upgrade(data: dict[str, Any]) -> dict[str, Any]:  # rename, add, change a type
            data["turn_count"] = data.pop("turns")
            data["origin"] = "version 1"
            data["log"] = [{"text": t} for t in data["log"]]
            return data

        def agent(tid: str, cls: type[pk.State], crash_at: int, seen: Counter) -> None:
            @pk.checkpointed(name="turn")
            def turn(i: int) -> int:
                seen.hit(f"turn{i}")
                if i == crash_at:
                    raise _Crash
                st: Any = pk.current_run().state  # type: ignore[union-attr]
                if cls is V1:
                    st.turns += 1
                    st.log.append(f"t{i}")
                else:
                    st.turn_count += 1
                    st.log.append({"text": f"t{i}"})
                return i

            with pk.resume(tid, store=store, state=cls):
                for i in range(4):
                    turn(i)

        for k in range(4):
            origin = "version 1" if k else ""  # a crash in step 0: version 1 stored nothing
            expected = {"turn_count": 4, "origin": origin, "log": [{"text": f"t{i}"} for i in range(4)]}
            tid, seen = _tid("mig"), Counter()
            with pytest.raises(_Crash):
                agent(tid, V1, k, seen)
            agent(tid, V2, -1, seen)
            assert seen.calls == {f"turn{i}": 2 if i == k else 1 for i in range(4)}, k
            assert store.get_state(tid, state=V2).model_dump() == expected, k
            history = store.history(tid)
            assert [cp.run_status for cp in history][:1] == ["completed"], k
            for cp in history:  # checkpoints of both versions load
                assert store.get_state(tid, cp.checkpoint_id, state=V2).origin == origin

    def test_failed_migration_writes_nothing(self, store: pk.Store) -> None:
        name = f"persistkit.testing.Bad-{uuid.uuid4().hex[:6]}"

        class V1(pk.State, name=name, version=1):
            turns: int = 0

        class V2(pk.State, name=name, version=2):
            turn_count: int = 0

        @pk.migration(V2, from_version=1)
        def broken_upgrade(data: dict[str, Any]) -> dict[str, Any]:
            data["turn_count"] = data.pop("turnz")
            return data

        @pk.checkpointed(name="turn")
        def turn() -> None:
            pk.current_run().state.turns += 1  # type: ignore[union-attr]

        tid = _tid()
        with pytest.raises(_Crash), pk.resume(tid, store=store, state=V1):
            turn()
            raise _Crash
        head = store.history(tid)[0].checkpoint_id
        for _ in range(2):
            with pytest.raises(pk.SchemaVersionError, match=r"broken_upgrade.*from_version=1"), pk.resume(
                tid, store=store, state=V2
            ):
                turn()
            assert store.history(tid)[0].checkpoint_id == head
        assert store.get_state(tid) == {"turns": 1}

    def test_stored_field_the_class_lacks_is_an_error(self, store: pk.Store) -> None:
        name = f"persistkit.testing.Renamed-{uuid.uuid4().hex[:6]}"

        class Before(pk.State, name=name):
            messages: list[str] = []

        class After(pk.State, name=name):  # renamed without a version bump
            history: list[str] = []

        tid = _tid()
        with pk.resume(tid, store=store, state=Before) as run:
            run.state.messages.append("important")
        for load in (
            lambda: store.get_state(tid, state=After),
            lambda: store.fork(tid, state=After),
            lambda: pk.resume(tid, store=store, state=After).__enter__(),
        ):
            with pytest.raises(pk.SchemaVersionError, match=r"\['messages'\].*version=2.*@pk\.migration"):
                load()
        assert store.get_state(tid) == {"messages": ["important"]} and len(store.history(tid)) == 1

    def test_closed_store(self, persistkit_url: str) -> None:
        s = pk.connect(persistkit_url)
        s.close()
        s.close()
        with pytest.raises(pk.StoreClosedError):
            s.history(_tid())
        with pytest.raises(pk.StoreClosedError), pk.resume(_tid(), store=s):
            pass

    def test_large_values(self, store: pk.Store) -> None:
        big = "x" * (3 * 1024 * 1024)

        @pk.checkpointed
        def produce() -> str:
            return big

        tid = _tid()
        with pk.resume(tid, store=store) as run:
            run.state["doc"] = big + "!"
            assert produce() == big
        with pk.resume(tid, store=store, run_id=run.run_id):
            assert produce() == big
        assert store.get_state(tid)["doc"] == big + "!"
