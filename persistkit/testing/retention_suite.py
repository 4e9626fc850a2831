"""Conformance checks for retention (``store.prune``), end to end through ``pk.connect``.

What a prune keeps is checked by what a user does next: every checkpoint still in the
history loads the same state as before the prune, a crashed run resumes without running
a finished step again, a suspended run takes its answer, an after-commit effect that did
not run is still drained once, a fork's source checkpoint stays while the fork lives,
and ``store.verify()`` passes under ``integrity=``. A property test mixes random runs,
crashes, forks, suspensions and prunes. A crash is a ``BaseException`` escaping the block
(nothing more is written, as a killed process). A store without the ``prune``
capability is skipped, and says so.
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

import pytest

from .._errors import ConfigurationError
from ..codec._versions import register
from ..engine._api import checkpointed, current_run, resume
from ..engine._emit import emit
from ..engine._outbox import after_commit
from ..engine._store import Store
from ..engine._suspend import suspend
from ..ops._retention import Retention
from ._stores import TwoStores

__all__ = ["RetentionConformance"]


class _Crash(BaseException):
    """Stands for a process that dies mid-run."""


#: (thread, position) of every step body that ran, in order.
RAN: list[tuple[str, int]] = []
EFFECTS: list[str] = []
CRASH_AT: dict[str, int] = {}


#: Effects whose first call dies before doing anything (a kill between commit and effect).
CRASH_EFFECT: set[str] = set()


@register
def note(text: str) -> None:
    if text in CRASH_EFFECT:
        CRASH_EFFECT.discard(text)
        raise _Crash
    EFFECTS.append(text)


@checkpointed
def work(i: int) -> str:
    run = current_run()
    assert run is not None
    RAN.append((run.thread_id, i))
    if CRASH_AT.get(run.thread_id) == i:
        del CRASH_AT[run.thread_id]
        raise _Crash
    run.state["log"].append(f"entry {i} " + "x" * 120)
    run.state["last"] = {"i": i, "pad": "y" * 200}
    return f"result {i} " + "z" * 100


@checkpointed
def notify(text: str) -> str:
    """A step that registers an effect, run after its checkpoint commits."""
    after_commit(note, text)
    return text


def _turn(store: Store, thread: str, steps: range, *, append_result: bool = True) -> None:
    with resume(thread, store=store, state={"log": [], "last": {}}) as run:
        for i in steps:
            r = work(i)
            if append_result:
                run.state["log"].append(r)  # a copy of the result: stored as a reference to it


@checkpointed
def speak(i: int) -> int:
    """A step that streams three events."""
    for k in range(3):
        emit(f"r{i}.{k}")
    return i


def _speaking_turn(store: Store, thread: str, i: int) -> None:
    with resume(thread, store=store, state={"log": [], "last": {}}):
        speak(i)


def _records(store: Store, thread: str, **kwargs: Any) -> list[Any]:
    return list(store.read_stream(thread, follow=False, **kwargs))


def _states(store: Store, thread: str) -> dict[str, Any]:
    return {cp.checkpoint_id: store.get_state(thread, checkpoint_id=cp.checkpoint_id) for cp in store.history(thread)}


def _thread() -> str:
    return f"ret-{uuid.uuid4().hex[:12]}"


class RetentionConformance(TwoStores):
    """Mix into a test class that provides ``persistkit_url`` (and ``backend_options``)."""

    #: Examples of the property test (lower it for a slow store).
    retention_examples: ClassVar[int] = 25

    @pytest.fixture
    def store(self, stores: tuple[Store, Store]) -> Store:
        s = stores[0]
        if not s.backend.supports_prune:
            pytest.skip(f"{type(s.backend).__name__} has no prune capability")
        return s

    def _check(self, store: Store, thread: str, before: dict[str, Any]) -> None:
        """Every kept checkpoint loads what it loaded before; the store verifies."""
        after = _states(store, thread)
        assert after or not before, "the head is always kept"
        for cid, state in after.items():
            assert state == before[cid], f"checkpoint {cid} loads another state after the prune"
        ring: Any = getattr(store.backend, "keyring", None)
        if ring is not None and ring.purpose == "integrity":
            report = store.verify(thread)
            assert report.ok, str(report)

    # -- policies ------------------------------------------------------------------

    def test_keep_last_keeps_the_newest_and_every_kept_checkpoint_loads(self, store: Store) -> None:
        t = _thread()
        for k in range(4):
            _turn(store, t, range(k * 10, k * 10 + 4))
        before = _states(store, t)
        dry = store.prune(Retention(keep_last=3), thread_id=t, dry_run=True)
        assert len(store.history(t)) == len(before)  # a dry run changes nothing
        report = store.prune(Retention(keep_last=3), thread_id=t)
        assert (report.checkpoints, report.blobs) == (dry.checkpoints, dry.blobs) and report.checkpoints == len(before) - 3
        assert report.bytes_after < report.bytes_before
        assert [c.checkpoint_id for c in store.history(t)] == sorted(before, reverse=True)[:3]
        self._check(store, t, before)
        again = store.prune(Retention(keep_last=3), thread_id=t)
        assert again.checkpoints == 0 and again.blobs == 0  # nothing left to do
        _turn(store, t, range(90, 92))  # the thread goes on, its list continues
        assert store.get_state(t)["log"][: len(before[max(before)]["log"])] == before[max(before)]["log"]

    def test_final_only_keeps_the_last_checkpoint_of_each_finished_run(self, store: Store) -> None:
        t = _thread()
        for k in range(3):
            _turn(store, t, range(k * 10, k * 10 + 3))
        before = _states(store, t)
        store.prune(Retention(final_only=True), thread_id=t)
        kept = store.history(t)
        assert [(c.kind, c.run_status) for c in kept] == [("end", "completed")] * 3
        self._check(store, t, before)

    def test_max_age_and_keep_last_together(self, store: Store) -> None:
        t = _thread()
        _turn(store, t, range(5))
        before = _states(store, t)
        # everything is younger than a day: nothing is old enough to go
        assert store.prune(Retention(keep_last=1, max_age=86400), thread_id=t).checkpoints == 0
        assert store.prune(Retention(max_age=1e-9), thread_id=t).checkpoints == len(before) - 1
        self._check(store, t, before)

    def test_thread_ttl_deletes_whole_finished_threads_only(self, store: Store) -> None:
        done, live = _thread(), _thread()
        _turn(store, done, range(2))
        CRASH_AT[live] = 1
        with pytest.raises(_Crash):
            _turn(store, live, range(3))
        kv = store.backend.supports_kv
        if kv:  # a message nobody received and a stream: they go with the thread, as with store.delete_thread
            store.send(done, "left over", topic="t")
            _speaking_turn(store, done, 0)
        report = store.prune(Retention(thread_ttl=1e-9), prefix="ret-")
        assert done in report.threads_deleted and live not in report.threads_deleted
        assert store.history(done) == []
        if kv:  # a thread re-created under the id starts with an empty inbox and no stream
            assert store.messages(done, topic="t") == []
            assert _records(store, done) == []
        _turn(store, live, range(3))  # the crashed run resumes: step 0 is not run again
        assert [i for t, i in RAN if t == live] == [0, 1, 1, 2]

    def test_a_redelivered_pruned_run_never_runs_again(self, store: Store) -> None:
        from .._errors import RunPrunedError

        t = _thread()

        def turn(run_id: str, steps: range) -> None:
            with resume(t, store=store, state={"log": [], "last": {}}, run_id=run_id):
                for i in steps:
                    work(i)

        turn("msg-1", range(0, 5))
        turn("msg-2", range(10, 13))
        store.prune(Retention(keep_last=2), thread_id=t)
        RAN.clear()
        with pytest.raises(RunPrunedError, match="retention") as caught:  # partly pruned
            turn("msg-2", range(10, 13))
        assert caught.value.run_id == "msg-2" and not caught.value.retryable
        assert RAN == []  # nothing ran again
        # every checkpoint of msg-1 is gone: its tombstone tells it ran
        with pytest.raises(RunPrunedError, match="retention") as caught:
            turn("msg-1", range(0, 5))
        assert caught.value.run_id == "msg-1" and "completed" in str(caught.value)
        assert RAN == []
        assert [cp.run_id for cp in store.history(t)] == ["msg-2", "msg-2"]  # and nothing was written
        turn("msg-3", range(20, 22))  # a new message runs
        assert [i for th, i in RAN if th == t] == [20, 21]
        store.prune(Retention(keep_last=1), thread_id=t)  # a second prune keeps the tombstones
        RAN.clear()
        for old in ("msg-1", "msg-2"):
            with pytest.raises(RunPrunedError):
                turn(old, range(0, 5))
        assert RAN == []
        t = _thread()
        turn("a", range(3))
        turn("b", range(3))
        store.prune(Retention(final_only=True), thread_id=t)
        RAN.clear()
        with pytest.raises(RunPrunedError):
            turn("a", range(3))
        assert RAN == []

    def test_thread_ttl_keeps_a_thread_a_live_fork_came_from(self, store: Store) -> None:
        t = _thread()
        _turn(store, t, range(3))
        fork = store.fork(t, store.history(t)[-2].checkpoint_id, new_thread_id=_thread())
        report = store.prune(Retention(thread_ttl=1e-9), thread_id=t)
        assert report.threads_deleted == [] and store.history(t)
        store.delete_thread(fork.thread_id)
        assert store.prune(Retention(thread_ttl=1e-9), thread_id=t).threads_deleted == [t]

    def test_a_missing_thread_and_bad_arguments_are_refused(self, store: Store) -> None:
        from .._errors import NotFoundError

        with pytest.raises(NotFoundError, match="no such thread"):
            store.prune(Retention(keep_last=1), thread_id=_thread())
        for bad in ({"prefix": None}, {"thread_id": ""}, {"namespace": 5}, {"dry_run": "yes"}, {"progress": 5}):
            with pytest.raises(ConfigurationError):
                store.prune(Retention(keep_last=1), **bad)

    def test_policy_is_checked(self, store: Store) -> None:
        with pytest.raises(ConfigurationError, match="no rule"):
            Retention()
        with pytest.raises(ConfigurationError, match="keep_last"):
            Retention(keep_last=0)
        with pytest.raises(ConfigurationError, match="max_age"):
            Retention(max_age=-1)
        with pytest.raises(ConfigurationError, match="Retention"):
            store.prune("keep 3")  # type: ignore[arg-type]

    # -- streams (docs/streams.md, Retention) -------------------------------------------

    def test_prune_trims_the_streams_of_pruned_runs_and_an_old_offset_reads_a_pruned_record(self, store: Store) -> None:
        if not store.backend.supports_kv:
            pytest.skip(f"{type(store.backend).__name__} has no kv capability: no streams")
        t = _thread()
        _speaking_turn(store, t, 0)
        with pytest.raises(_Crash), resume(t, store=store) as run:  # dies before its first commit
            emit("dead")
            run._streams.flush()
            raise _Crash
        for i in (1, 2, 3):
            _speaking_turn(store, t, i)
        before = _records(store, t)
        last_run = before[-1].run_id
        kept = [r for r in before if r.run_id == last_run]
        trimmed = len(before) - len(kept)
        assert trimmed > 0 and [r.data for r in before if r.kind == "event"][:4] == ["r0.0", "r0.1", "r0.2", "dead"]
        dry = store.prune(Retention(keep_last=1), thread_id=t, dry_run=True)
        assert dry.stream_records == trimmed and _records(store, t) == before  # a dry run changes nothing
        report = store.prune(Retention(keep_last=1), thread_id=t)
        assert report.stream_records == trimmed
        # the kept run's records are intact, at their offsets; what went is one `pruned` record
        first = kept[0].offset
        for after in (0, 2, first - 2):
            got = _records(store, t, after=after)
            assert [(r.kind, r.offset, r.to) for r in got[:1]] == [("pruned", first - 1, first - 1)]
            assert got[1:] == kept
        assert _records(store, t, after=first - 1) == kept  # a reader past the gap (its marker's offset) sees none
        assert _records(store, t, after=first) == kept[1:]
        final = _records(store, t, final_only=True)
        assert final[0].kind == "pruned" and [r.data for r in final[1:]] == ["r3.0", "r3.1", "r3.2", "completed"]
        assert store.prune(Retention(keep_last=1), thread_id=t).stream_records == 0  # nothing left to trim
        _speaking_turn(store, t, 4)  # the stream goes on after its tail: dense, never reusing an offset
        after = _records(store, t, after=kept[-1].offset)
        assert [r.offset for r in after] == list(range(kept[-1].offset + 1, kept[-1].offset + 1 + len(after)))
        assert [r.data for r in after if r.kind == "event"] == ["r4.0", "r4.1", "r4.2"]

    def test_prune_keeps_the_stream_of_an_unfinished_run(self, store: Store) -> None:
        if not store.backend.supports_kv:
            pytest.skip(f"{type(store.backend).__name__} has no kv capability: no streams")
        t = _thread()
        for i in (0, 1):
            _speaking_turn(store, t, i)
        CRASH_AT[t] = 21
        with pytest.raises(_Crash), resume(t, store=store, state={"log": [], "last": {}}):
            speak(2)
            work(20)
            work(21)  # dies here: the run is unfinished, its stream stays whole
        before = _records(store, t)
        store.prune(Retention(keep_last=1), thread_id=t)
        runs = {c.run_id for c in store.history(t)}  # the unfinished run and the one it started from
        assert before[-1].run_id in runs and len(runs) == 2
        after = _records(store, t)
        assert after[0].kind == "pruned" and after[1:] == [r for r in before if r.run_id in runs]

    # -- what is never removed ---------------------------------------------------------

    def test_an_unfinished_run_resumes_after_a_prune(self, store: Store) -> None:
        t = _thread()
        _turn(store, t, range(0, 3))
        CRASH_AT[t] = 13
        with pytest.raises(_Crash):
            _turn(store, t, range(10, 16))
        before = _states(store, t)
        store.prune(Retention(keep_last=1), thread_id=t)
        self._check(store, t, before)
        RAN.clear()
        _turn(store, t, range(10, 16))
        assert [i for th, i in RAN if th == t] == [13, 14, 15]  # 10..12 replayed, not run

    def test_a_suspended_run_takes_its_answer_after_a_prune(self, store: Store) -> None:
        t = _thread()
        _turn(store, t, range(3))

        def agent() -> Any:
            with resume(t, store=store, state={"log": [], "last": {}}) as run:
                work(20)
                answer = suspend("approve?")
                run.state["log"].append(f"answer {answer}")
                return answer

        assert agent() is None  # suspended: the block ended cleanly
        before = _states(store, t)
        store.prune(Retention(keep_last=1, final_only=True), thread_id=t)
        self._check(store, t, before)
        store.answer(t, "yes")
        RAN.clear()
        assert agent() == "yes"
        assert [i for th, i in RAN if th == t] == []  # step 20 replayed

    def test_a_fork_source_stays_while_the_fork_lives(self, store: Store) -> None:
        t = _thread()
        for k in range(3):
            _turn(store, t, range(k * 10, k * 10 + 2))
        source = store.history(t)[-2]  # an old checkpoint
        fork = store.fork(t, source.checkpoint_id, new_thread_id=_thread())
        store.prune(Retention(keep_last=1), thread_id=t)
        assert source.checkpoint_id in [c.checkpoint_id for c in store.history(t)]
        assert fork.forked_from == (t, source.checkpoint_id)
        store.delete_thread(fork.thread_id)
        store.prune(Retention(keep_last=1), thread_id=t)
        assert len(store.history(t)) == 1

    @pytest.mark.parametrize("old_store", [False, True], ids=["link-on-thread", "link-on-first-record-only"])
    def test_a_fork_source_stays_after_the_forks_first_checkpoint_is_pruned(self, store: Store, old_store: bool) -> None:
        src = _thread()
        _turn(store, src, range(3))
        source = store.history(src)[-2]  # an old checkpoint
        fork = store.fork(src, source.checkpoint_id, new_thread_id=_thread()).thread_id
        if old_store:  # a fork written before the link was kept on the thread: its first record alone has it
            from ..state._records import fork_key

            assert store.backend.delete_blobs(fork, [fork_key("")]) == 1
        _turn(store, fork, range(10, 13))
        store.prune(Retention(keep_last=2), thread_id=fork)
        assert [c.kind for c in store.history(fork)] == ["end", "step"]  # its fork record went
        store.prune(Retention(keep_last=1), thread_id=src)
        assert source.checkpoint_id in [c.checkpoint_id for c in store.history(src)]
        assert store.get_state(src, checkpoint_id=source.checkpoint_id)["log"]
        store.prune(Retention(thread_ttl=1e-9), thread_id=src)  # nor is its thread deleted
        assert store.history(src)
        store.delete_thread(fork)
        store.prune(Retention(keep_last=1), thread_id=src)
        assert len(store.history(src)) == 1

    def test_an_effect_that_did_not_run_is_still_drained_once(self, store: Store) -> None:
        t = _thread()
        _turn(store, t, range(3))
        CRASH_EFFECT.add(f"{t}:effect")
        with pytest.raises(_Crash), resume(t, store=store, state={"log": [], "last": {}}):
            work(10)
            notify(f"{t}:effect")  # its commit is followed by the effect, which dies before it runs
            work(11)
        assert len(store.drain_outbox(thread_id=t, dry_run=True).pending) == 1
        before = _states(store, t)
        store.prune(Retention(keep_last=1, final_only=True), thread_id=t)
        self._check(store, t, before)
        assert len(store.drain_outbox(thread_id=t, dry_run=True).pending) == 1
        store.drain_outbox(thread_id=t)
        assert EFFECTS.count(f"{t}:effect") == 1

    def test_an_interrupted_prune_leaves_a_loadable_thread_and_finishes_next_time(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        t = _thread()
        for k in range(4):
            _turn(store, t, range(k * 10, k * 10 + 3))
        before = _states(store, t)
        import persistkit.ops._prune as prune_module

        monkeypatch.setattr(prune_module, "_BATCH", 2)
        real = store.call_sync
        calls = {"n": 0}

        def dying(req: Any) -> Any:
            if req.method == "prune_rows":
                calls["n"] += 1
                if calls["n"] == 3:
                    raise _Crash
            return real(req)

        monkeypatch.setattr(store, "call_sync", dying)
        with pytest.raises(_Crash):
            store.prune(Retention(keep_last=2), thread_id=t)
        monkeypatch.setattr(store, "call_sync", real)
        partly = _states(store, t)
        assert len(before) > len(partly) > 2
        for cid, state in partly.items():
            assert state == before[cid]
        store.prune(Retention(keep_last=2), thread_id=t)
        self._check(store, t, before)
        assert len(store.history(t)) == 2

    # -- random histories -------------------------------------------------------------

    def test_random_runs_forks_suspensions_and_prunes(self, store: Store) -> None:
        hypothesis = pytest.importorskip("hypothesis")
        st = hypothesis.strategies

        ops = st.lists(
            st.one_of(
                st.tuples(st.just("turn"), st.integers(1, 4), st.booleans()),
                st.tuples(st.just("crash"), st.integers(1, 4), st.booleans()),
                st.tuples(st.just("fork"), st.integers(0, 6), st.booleans()),
                st.tuples(st.just("prune"), st.integers(1, 4), st.booleans()),
                st.tuples(st.just("final"), st.integers(0, 0), st.booleans()),
            ),
            min_size=3,
            max_size=10,
        )

        @hypothesis.settings(max_examples=self.retention_examples, deadline=None, database=None)  # type: ignore[untyped-decorator]
        @hypothesis.given(ops)  # type: ignore[untyped-decorator]
        def run(plan: list[tuple[str, int, bool]]) -> None:
            t = _thread()
            forks: list[str] = []
            sources: dict[str, str] = {}  # fork -> the checkpoint of t it came from
            step = 0
            crashed: tuple[range, bool] | None = None  # a crashed run resumes with the same calls
            try:
                for op, n, flag in plan:
                    if op in ("turn", "crash"):
                        steps, results = crashed or (range(step, step + n), flag)
                        if op == "crash" and crashed is None:
                            CRASH_AT[t] = steps[-1]
                        try:
                            _turn(store, t, steps, append_result=results)
                            crashed = None
                        except _Crash:
                            crashed = (steps, results)
                        step = max(step, steps[-1] + 1)
                    elif op == "fork":
                        history = store.history(t)
                        if history:
                            src = history[min(n, len(history) - 1)]
                            forks.append(store.fork(t, src.checkpoint_id, new_thread_id=_thread()).thread_id)
                            sources[forks[-1]] = src.checkpoint_id
                            if flag and forks:
                                store.delete_thread(forks.pop(0))
                    elif store.history(t):  # pruning a thread that does not exist: NotFoundError
                        before = _states(store, t)
                        policy = Retention(final_only=True) if op == "final" else Retention(keep_last=n, final_only=flag)
                        store.prune(policy, thread_id=t)
                        self._check(store, t, before)
                        for f in forks:
                            assert store.get_state(f) is not None
                            # pruning the fork (its first record too) keeps its source alive
                            _turn(store, f, range(100, 101))
                            store.prune(Retention(keep_last=1), thread_id=f)
                        store.prune(policy, thread_id=t)
                        kept = {c.checkpoint_id for c in store.history(t)}
                        assert all(sources[f] in kept for f in forks), "a live fork's source checkpoint was pruned"
                CRASH_AT.pop(t, None)
                steps, results = crashed or (range(step, step + 1), True)
                _turn(store, t, steps, append_result=results)  # whatever happened, the thread goes on
            finally:
                CRASH_AT.pop(t, None)
                for f in forks:
                    store.delete_thread(f)
                store.delete_thread(t)

        run()
