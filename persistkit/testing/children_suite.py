"""Conformance checks for child runs (``pk.start``, docs/messages.md "Child runs").

A parent run starts registered agents as child runs on their own threads; each check uses two
``pk.connect`` instances of the store (the parent's process and a worker's or an operator's).
The children run in this process (the ``"thread"`` and ``"inline"`` executors) or are handed to
a list standing for a queue (a callable executor) and run later with ``pk.run_child`` on the
other store object. Subclass :class:`ChildrenConformance` with a ``persistkit_url`` fixture::

    class TestMyStoreChildren(ChildrenConformance):
        @pytest.fixture
        def persistkit_url(self) -> str:
            return "mystore://..."
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from .._errors import (
    ConfigurationError,
    ConflictError,
    NonDeterminismError,
    RetryableError,
    RunAbortedError,
    RunCancelledError,
    SerializationError,
    ThreadBusyError,
)
from ..codec._versions import register
from ..coordination._children import child_run_id
from ..engine._api import checkpointed, resume
from ..engine._children import ChildHandle, agather, arun_child, astart, gather, run_child, start
from ..engine._messages import cancelled, receive
from ..engine._store import Store
from ..engine._suspend import sleep, suspend
from ._stores import TwoStores

__all__ = ["ChildrenConformance"]

#: Every step body that ran, by its label: a child that ran twice shows a count of 2.
RAN: Counter[str] = Counter()


@checkpointed
def _work(label: str) -> str:
    RAN[label] += 1
    return label.upper()


@register
def research(label: str) -> str:
    """A child agent: one step."""
    return _work(label) + "!"


@register
def broken(label: str) -> str:
    _work(label)
    raise ValueError(f"no source for {label}")


@checkpointed
def _long(label: str) -> str:
    RAN[label] += 1
    for _ in range(3000):  # at most ~30 s: a check that cannot finish fails, it does not hang
        if cancelled():
            break
        time.sleep(0.01)
    return label


@register
def lingers(label: str) -> str:
    """A child agent whose step runs until its run is asked to stop; then a step that never runs."""
    _long(label)
    return _work(label + "/after")


@checkpointed
def _asks_inside(label: str) -> Any:
    return suspend(f"approve {label}?")


@register
def asks(label: str) -> Any:
    """A child agent that suspends for a human's approval (``pk.suspend``), then one more step."""
    _work(label)
    answer = suspend(f"approve {label}?")
    return [answer, _work(label + "/after")]


@register
def naps(label: str) -> Any:
    """A child agent whose durable sleep suspends it (``pk.sleep`` beyond ``suspend_above``)."""
    _work(label)
    sleep(0.3, suspend_above=0)
    return _work(label + "/woke")


@register
def echoes(*args: Any, **kwargs: Any) -> Any:
    """A child agent that returns its arguments as it got them (types included)."""
    return [list(args), kwargs, [type(a).__name__ for a in args]]


def _lease_plan(thread_id: str, namespace: str) -> Any:
    from .._io import call

    rec = yield call("lease_get", thread_id, namespace)
    return rec


@register
def lease_left() -> float:
    """A child agent that returns the seconds its own lease has left (its ``lease_ttl`` at most)."""
    from ..coordination._lease import _State
    from ..engine._api import _CURRENT

    run = _CURRENT.get().run  # type: ignore[union-attr]  # a child agent runs in its run
    rec = run.store.run_sync(_lease_plan(run.thread_id, run.namespace))
    return _State.load(rec).expires - time.time()


@register
def names_root(root: str) -> Any:
    """A child agent that starts a grandchild on the thread of its own parent (an ancestor)."""
    return start(research, "loop", thread_id=root, executor="inline").result()


@register
def waits(label: str) -> Any:
    """A child agent that suspends until a message comes."""
    _work(label)
    return receive("go")


@register
async def aresearch(label: str) -> str:
    return _work(label) + "?"


def _unregistered(label: str) -> str:
    return label


class _Crash(RetryableError):
    """Ends a block without an end record: the run stays unfinished, as after a crash."""


def _until(cond: Callable[[], bool], what: str = "the condition") -> None:
    for _ in range(3000):
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class _ReplayCheck(TwoStores):
    """``store.check_replay`` over a supervisor: it starts no child and hands nothing to a queue."""

    def test_the_replay_check_starts_no_child(self, stores: tuple[Store, Store]) -> None:
        store, _ = stores
        t = f"chk-{uuid.uuid4().hex[:12]}"
        queue: list[dict[str, Any]] = []

        def entry(thread_id: str, run_id: str) -> None:
            with resume(thread_id, store=store, run_id=run_id):
                first = start(research, f"{t}/a", executor=queue.append)
                first.result(suspend_above=0)  # the child never ran: the parent waits here
                start(research, f"{t}/b", executor=queue.append).result(suspend_above=0)

        entry(t, "r1")
        assert len(queue) == 1
        report = store.check_replay(entry, threads=[t])
        assert [(r.run_id, r.outcome) for r in report.runs] == [("r1", "waits")]
        assert len(queue) == 1 and RAN[f"{t}/a"] == 0  # nothing handed over, nothing ran
        run_child(queue[0], store=store)
        entry(t, "r1")  # a ended: the parent goes on, starts b and waits for it
        assert len(queue) == 2
        report = store.check_replay(entry, threads=[t])
        assert [(r.run_id, r.outcome) for r in report.runs] == [("r1", "waits")]
        assert len(queue) == 2 and RAN[f"{t}/b"] == 0


class ChildrenConformance(_ReplayCheck):
    """Mix into a test class that provides ``persistkit_url``."""

    @staticmethod
    def thread() -> str:
        return f"sup-{uuid.uuid4().hex[:12]}"

    def test_children_run_once_and_a_resumed_parent_replays_their_handles(
        self, stores: tuple[Store, Store]
    ) -> None:
        store, other = stores
        t = self.thread()

        def supervisor() -> list[Any]:
            hs = [
                start(research, f"{t}/a"),
                start(research, f"{t}/b", executor="inline"),
                start(research, f"{t}/c", thread_id=f"{t}-named"),
            ]
            return gather(*hs)

        with resume(t, store=store) as run:
            first = supervisor()
        assert first == [f"{t}/{x}".upper() + "!" for x in "abc"]
        assert run.status == "completed"
        with resume(
            t, store=other, run_id=run.run_id
        ) as again:  # a redelivery: replays, starts nothing
            assert supervisor() == first
        assert again.status == "completed"
        assert [RAN[f"{t}/{x}"] for x in "abc"] == [1, 1, 1]
        kids = other.children(t)
        assert [(k.child.position, k.status) for k in kids] == [
            ("0", "completed"),
            ("1", "completed"),
            ("2", "completed"),
        ]
        assert kids[2].child.thread_id == f"{t}-named"
        assert kids[0].child.run_id == child_run_id(run.run_id, "0", t, run.namespace)
        assert kids[0].child.run_id.startswith(f"{run.run_id}:0@")
        assert other.history(kids[0].child.thread_id)[0].run_status == "completed"

    def test_a_thread_pool_runs_the_children(self, stores: tuple[Store, Store]) -> None:
        store, worker = stores
        t = self.thread()
        with ThreadPoolExecutor(max_workers=2) as pool:

            def submit(spec: dict[str, Any]) -> None:
                pool.submit(run_child, spec, store=worker)  # the pool's own store object

            with resume(t, store=store) as run:
                got = gather(*(start(research, f"{t}/{x}", executor=submit) for x in "abcd"))
        assert run.status == "completed" and got == [f"{t}/{x}".upper() + "!" for x in "abcd"]
        assert [RAN[f"{t}/{x}"] for x in "abcd"] == [1, 1, 1, 1]

    def test_a_child_failure_is_raised_and_recorded_in_the_parent(
        self, stores: tuple[Store, Store]
    ) -> None:
        store, other = stores
        t = self.thread()
        outcomes: list[str] = []
        for s in (store, other, other):  # live, then two replays
            with resume(t, store=s, run_id="r1"):
                h = start(broken, f"{t}/x")
                try:
                    h.result()
                except ValueError as exc:
                    outcomes.append(str(exc))
        assert outcomes == [f"no source for {t}/x"] * 3
        assert RAN[f"{t}/x"] == 1
        assert [k.status for k in other.children(t)] == ["failed"]

    def test_a_parent_that_died_before_handing_children_over_starts_them_on_resume(
        self, stores: tuple[Store, Store]
    ) -> None:
        store, other = stores
        t = self.thread()
        queue: list[dict[str, Any]] = []
        with pytest.raises(_Crash), resume(t, store=store, run_id="r1"):
            start(research, f"{t}/a", executor="inline")  # ran to its end
            start(
                research, f"{t}/b", executor=queue.append
            )  # recorded, handed to a queue that lost it
            raise _Crash("the parent's process dies here")
        assert len(queue) == 1
        assert [k.status for k in other.children(t)] == ["completed", "pending"]
        with resume(t, store=other, run_id="r1") as run:  # the resume relaunches b only
            got = gather(
                start(research, f"{t}/a"), start(research, f"{t}/b"), start(research, f"{t}/c")
            )
        assert run.status == "completed"
        assert got == [f"{t}/{x}".upper() + "!" for x in "abc"]
        assert [RAN[f"{t}/{x}"] for x in "abc"] == [1, 1, 1]
        assert (
            run_child(queue[0], store=store) == f"{t}/b".upper() + "!"
        )  # the lost task, delivered late: a replay
        assert RAN[f"{t}/b"] == 1

    def test_a_long_wait_suspends_the_parent_until_the_child_ends(
        self, stores: tuple[Store, Store]
    ) -> None:
        store, worker = stores
        t = self.thread()
        queue: list[dict[str, Any]] = []

        def supervisor() -> Any:
            return start(research, f"{t}/q", executor=queue.append).result(suspend_above=0)

        with resume(t, store=store, run_id="r1") as run:
            supervisor()
        assert run.status == "suspended"
        waiting = [q for q in worker.pending(prefix=t) if q.thread_id == t]  # prefix: never another test's threads
        assert [(q.kind, q.run_id) for q in waiting] == [("child", "r1")]
        assert [d for d in worker.due(prefix=t) if d.thread_id == t] == []
        assert run_child(queue[0], store=worker) == f"{t}/q".upper() + "!"  # the queue worker
        assert [d.run_id for d in worker.due(prefix=t) if d.thread_id == t] == ["r1"]
        with resume(t, store=store, run_id="r1") as run:
            assert supervisor() == f"{t}/q".upper() + "!"
        assert run.status == "completed" and len(queue) == 1 and RAN[f"{t}/q"] == 1

    def test_a_timeout_is_recorded(self, stores: tuple[Store, Store]) -> None:
        store, other = stores
        t = self.thread()
        queue: list[dict[str, Any]] = []
        for s in (store, other):
            with resume(t, store=s, run_id="r1"):
                h = start(research, f"{t}/slow", executor=queue.append)
                with pytest.raises(TimeoutError):
                    h.result(timeout=0)
        assert (
            len(queue) == 1 and RAN[f"{t}/slow"] == 0
        )  # the replay raised it again, looked at nothing

    def test_cancel_of_a_parent_reaches_every_child(self, stores: tuple[Store, Store]) -> None:
        store, operator = stores
        t = self.thread()
        queue: list[dict[str, Any]] = []
        block = resume(t, store=store, run_id="r1")
        with pytest.raises(RunCancelledError), block:
            live = start(lingers, f"{t}/live")  # a thread of this process, in its long step
            queued = start(research, f"{t}/queued", executor=queue.append)  # not started yet
            parked = start(waits, f"{t}/parked", executor="inline")  # suspended in pk.receive
            gone = start(lingers, f"{t}/gone", on_parent_close="abandon", executor=queue.append)
            _until(lambda: RAN[f"{t}/live"] == 1, "the live child's long step")
            assert operator.cancel(t, "r1") == "requested"
            live.result()  # the parent stops at its next step boundary (here: while it waits)
        assert operator.history(t)[0].run_status == "cancelled"
        _until(lambda: live.status() == "cancelled", "the live child to stop")
        assert parked.status() == "cancelled"
        with pytest.raises(RunCancelledError):
            run_child(queue[0], store=operator)  # delivered after the cancel: runs nothing
        assert queued.status() == "cancelled" and RAN[f"{t}/queued"] == 0
        assert RAN[f"{t}/live/after"] == 0
        assert gone.status() == "pending"  # on_parent_close="abandon": left alone
        by_status = {k.child.run_id: k.status for k in operator.children(t)}
        assert (
            by_status[gone.run_id] == "pending"
            and sorted(by_status.values()).count("cancelled") == 3
        )

    def test_a_parent_that_ends_cancels_its_unfinished_children(
        self, stores: tuple[Store, Store]
    ) -> None:
        store, other = stores
        t = self.thread()
        with resume(t, store=store) as run:
            stop = start(lingers, f"{t}/stop")
            keep = start(waits, f"{t}/keep", on_parent_close="abandon", executor="inline")
            _until(lambda: RAN[f"{t}/stop"] == 1, "the child's long step")
        assert run.status == "completed"
        _until(lambda: stop.status() == "cancelled", "the child to stop")
        assert keep.status() == "suspended"  # left waiting for its message
        other.send(keep.thread_id, "go-ahead", topic="go")
        info = next(k for k in other.children(t) if k.child == keep.child)
        assert run_child(info.spec(), store=other) == "go-ahead"

    def test_a_failed_parent_keeps_its_children_for_its_retry(
        self, stores: tuple[Store, Store]
    ) -> None:
        """An ordinary failure is not final (the retry continues the run): its children go on;
        ``run.abort()`` is final: they are cancelled."""
        store, worker = stores
        t = self.thread()
        queue: list[dict[str, Any]] = []

        def supervisor(fail: bool) -> Any:
            h = start(research, f"{t}/k", executor=queue.append)
            if fail:
                raise TimeoutError("the model timed out (transient)")
            return h.result()

        with pytest.raises(TimeoutError), resume(t, store=store) as run:
            supervisor(True)
        assert run.status == "failed"
        assert [(k.status, k.cancel_asked) for k in worker.children(t)] == [("pending", False)]
        assert run_child(queue[0], store=worker) == f"{t}/k".upper() + "!"
        with resume(t, store=store) as again:  # the retry: same run, same handle, its result
            assert supervisor(False) == f"{t}/k".upper() + "!"
        assert again.run_id == run.run_id and again.status == "completed"
        a = f"{t}-abort"
        with pytest.raises(RunAbortedError), resume(a, store=store) as run:
            start(research, f"{a}/k", executor=queue.append)
            run.abort("no budget left")
        assert [(k.status, k.cancel_asked) for k in worker.children(a)] == [("cancelled", True)]

    def test_cancel_of_a_failed_parent_ends_it_and_every_child(
        self, stores: tuple[Store, Store]
    ) -> None:
        """A failed parent is not over (its redelivery continues it, and its children go on):
        ``store.cancel`` ends it for good, its redelivery runs nothing, and every unfinished
        child is cancelled (#39)."""
        store, operator = stores
        t = self.thread()
        queue: list[dict[str, Any]] = []

        def supervisor() -> None:
            start(research, f"{t}/q", executor=queue.append)  # handed to a queue, not run yet
            start(waits, f"{t}/parked", executor="inline")  # suspended in pk.receive
            raise TimeoutError("the model timed out (transient)")

        with pytest.raises(TimeoutError), resume(t, store=store, run_id="r1") as run:
            supervisor()
        assert run.status == "failed"
        assert [k.status for k in operator.children(t)] == ["pending", "suspended"]
        assert operator.cancel(t) == "cancelled"  # no run id: the thread's failed run
        assert operator.history(t)[0].run_status == "cancelled"
        assert [(k.status, k.cancel_asked) for k in operator.children(t)] == [("cancelled", True)] * 2
        with pytest.raises(RunCancelledError) as stop, resume(t, store=store, run_id="r1"):
            supervisor()  # the queue redelivers the failed turn: it runs nothing
        assert stop.value.status == "cancelled" and stop.value.run_id == "r1"
        with pytest.raises(RunCancelledError):
            run_child(queue[0], store=operator)  # the queued child, delivered now: runs nothing
        assert RAN[f"{t}/q"] == 0 and RAN[f"{t}/parked"] == 1
        assert operator.cancel(t, "r1") == "cancelled"  # cancelled already: nothing more to do
        assert [h.run_status for h in operator.history(t)][:2] == ["cancelled", "failed"]

    def test_an_answered_child_goes_on_when_its_parent_resumes(
        self, stores: tuple[Store, Store]
    ) -> None:
        """A child that suspends for approval: due() lists the parent (not the child, which
        pk.resume refuses to open outside pk.run_child); the parent's resume hands it over again."""
        store, worker = stores
        t = self.thread()

        def supervisor() -> Any:
            return start(asks, f"{t}/q", executor="inline").result(suspend_above=0)

        with resume(t, store=store, run_id="r1") as run:
            supervisor()
        assert run.status == "suspended"
        kid = worker.children(t)[0].child
        asked = [q for q in worker.pending(prefix=kid.thread_id) if q.thread_id == kid.thread_id]
        assert [q.kind for q in asked] == ["question"]
        mine = (t, kid.thread_id)
        assert [d.thread_id for d in worker.due(answered=True, prefix=t) if d.thread_id in mine] == []
        worker.answer(kid.thread_id, "yes")
        assert [d.thread_id for d in worker.due(prefix=t) if d.thread_id in mine] == [t]
        assert [d.thread_id for d in worker.due(answered=True, prefix=t) if d.thread_id in mine] == [t]
        with pytest.raises(ConfigurationError, match="is a child run"), resume(
            kid.thread_id, store=worker
        ):
            pass  # the answerer's usual pk.resume(thread_id): refused, nothing written

        async def aopen() -> None:
            async with resume(kid.thread_id, store=worker):
                pass

        with pytest.raises(ConfigurationError, match="is a child run"):
            asyncio.run(aopen())
        with resume(t, store=store, run_id="r1") as run:
            assert supervisor() == ["yes", f"{t}/q/after".upper()]
        assert run.status == "completed"
        assert RAN[f"{t}/q"] == 1 and RAN[f"{t}/q/after"] == 1
        u = f"{t}-user"  # a run of the user's, named like a child's, asking inside its first step
        with resume(u, store=store, run_id="order:42") as run:
            _asks_inside(u)
        assert run.status == "suspended"
        worker.answer(u, "ok")
        assert [d.thread_id for d in worker.due(answered=True, prefix=u) if d.thread_id == u] == [u]
        with resume(u, store=worker) as run:  # not taken for a child run
            assert _asks_inside(u) == "ok"
        assert run.status == "completed"

    def test_a_child_whose_timer_is_due_goes_on_when_its_parent_resumes(
        self, stores: tuple[Store, Store]
    ) -> None:
        store, worker = stores
        t = self.thread()
        queue: list[dict[str, Any]] = []

        def supervisor() -> Any:
            return start(naps, f"{t}/n", executor=queue.append).result(suspend_above=0)

        with resume(t, store=store, run_id="r1") as run:
            supervisor()
        run_child(queue[0], store=worker)  # the worker: the child suspends in its pk.sleep
        kid = worker.children(t)[0]
        assert kid.status == "suspended" and run.status == "suspended"
        mine = (t, kid.child.thread_id)
        _until(lambda: [d.thread_id for d in worker.due(prefix=t) if d.thread_id in mine] == [t], "t due")
        with resume(t, store=store, run_id="r1") as run:  # hands the child to the queue again
            supervisor()
        assert run.status == "suspended" and len(queue) == 2 and queue[1] == queue[0]
        assert run_child(queue[1], store=worker) == f"{t}/n/woke".upper()
        with resume(t, store=store, run_id="r1") as run:
            assert supervisor() == f"{t}/n/woke".upper()
        assert run.status == "completed" and RAN[f"{t}/n"] == 1

    def test_the_spec_is_json_and_checked_against_the_link(
        self, stores: tuple[Store, Store]
    ) -> None:
        """The spec's arguments are encoded with the store's codec (types survive a JSON hop);
        an argument it cannot encode is refused at pk.start; a spec that is not the child the
        parent started is refused by pk.run_child; lease_ttl= travels in the spec."""
        import datetime
        import json
        import threading

        store, worker = stores
        t = self.thread()
        queue: list[dict[str, Any]] = []
        when = datetime.datetime(2026, 1, 2, 3, 4, 5)
        with resume(t, store=store, run_id="r1"):
            with pytest.raises(SerializationError):
                start(echoes, threading.Lock(), executor=queue.append)
            h = start(
                echoes, (1, 2), {3}, b"x", when=when, executor=queue.append, lease_ttl=6,
                on_parent_close="abandon",
            )
            with pytest.raises(ConfigurationError, match="lease_ttl"):
                start(echoes, executor=queue.append, lease_ttl=0)
        assert len(queue) == 1
        spec = json.loads(json.dumps(queue[0]))  # a queue's JSON hop
        assert spec["lease_ttl"] == 6 and worker.children(t)[0].spec() == spec
        forged = {**spec, "agent": f"{research.__module__}:research"}
        with pytest.raises(NonDeterminismError, match="does not match the child"):
            run_child(forged, store=worker)
        with pytest.raises(NonDeterminismError, match="does not match the child"):
            run_child({**spec, "args": [["other"]]}, store=worker)
        assert h.status() == "pending"  # nothing of the child was touched
        with resume(t + "-ttl", store=store):
            short = start(lease_left, executor="inline", lease_ttl=6).result()
            long = start(lease_left, executor="inline").result()
        assert 0 < short <= 6 < long  # run_child opened the child with the spec's lease_ttl
        assert run_child(spec, store=worker) == [
            [(1, 2), {3}, b"x"],
            {"when": when},
            ["tuple", "set", "bytes"],
        ]

    def test_a_child_thread_of_an_ancestor_is_refused(self, stores: tuple[Store, Store]) -> None:
        store, _ = stores
        t = self.thread()
        with resume(t, store=store, run_id="r1"):
            h = start(names_root, t, executor="inline")
            with pytest.raises(ConfigurationError, match="ancestor"):
                h.result()
        assert [h.child.thread_id] == [k.child.thread_id for k in store.children(t)]
        assert store.children(h.thread_id) == []  # the grandchild was never linked

    def test_misuse_is_refused_clearly(self, stores: tuple[Store, Store]) -> None:
        store, _ = stores
        t = self.thread()
        with pytest.raises(ConfigurationError, match="inside a run"):
            start(research, "x")
        with resume(t, store=store, run_id="r1"):
            with pytest.raises(ConfigurationError, match="not registered"):
                start(_unregistered, "x")
            with pytest.raises(ConfigurationError, match="thread of its own"):
                start(research, "x", thread_id=t)
            with pytest.raises(ConfigurationError, match="on_parent_close"):
                start(research, "x", on_parent_close="detach")
            with pytest.raises(ConfigurationError, match="executor"):
                start(research, "x", executor="celery")
            mine = start(research, f"{t}/m", executor="inline")
        with (
            resume(t + "-other", store=store),
            pytest.raises(ConfigurationError, match="Only the run that started"),
        ):
            mine.result()
        assert mine.result() == f"{t}/m".upper() + "!"  # outside any run: read, not recorded
        with pytest.raises(ConfigurationError, match="spec"):
            run_child({"agent": "x"}, store=store)

    def test_async_children(self, stores: tuple[Store, Store]) -> None:
        store, other = stores
        t = self.thread()

        async def supervisor(s: Store) -> list[Any]:
            async with resume(t, store=s, run_id="r1"):
                a = await astart(aresearch, f"{t}/a", executor="inline")
                b = await astart(research, f"{t}/b")
                return await agather(a, b)

        assert asyncio.run(supervisor(store)) == [f"{t}/a".upper() + "?", f"{t}/b".upper() + "!"]
        assert asyncio.run(supervisor(other)) == [f"{t}/a".upper() + "?", f"{t}/b".upper() + "!"]
        assert RAN[f"{t}/a"] == RAN[f"{t}/b"] == 1
        kid = other.children(t)[0].child
        assert (
            asyncio.run(arun_child(other.children(t)[0].spec(), store=other))
            == f"{t}/a".upper() + "?"
        )
        assert (
            isinstance(ChildHandle(kid, other), ChildHandle)
            and ChildHandle(kid, other).status() == "completed"
        )

    def test_two_parents_never_share_a_child(self, stores: tuple[Store, Store]) -> None:
        """Two supervisors on different threads with the same run id: their children are other
        runs (the run id is derived from the parent's thread too), and a thread named for a child
        belongs to the first parent thread that started one there: another one is refused
        (``pk.ConflictError``, nothing recorded) instead of adopting its child."""
        store, other = stores
        a, b, kid = self.thread(), self.thread(), self.thread() + "-kid"
        with resume(a, store=store, run_id="turn-1"):
            mine = start(research, f"{a}/x", thread_id=kid, executor="inline")
            assert mine.result() == f"{a}/x".upper() + "!"
            own_a = start(research, f"{a}/own", executor="inline")
        with resume(b, store=other, run_id="turn-1") as run:
            with pytest.raises(ConflictError, match=f"another parent: thread {a!r}") as refused:
                start(research, f"{b}/x", thread_id=kid, executor="inline")
            assert refused.value.thread_id == kid and "delete_thread" in str(refused.value)
            own_b = start(research, f"{b}/own", executor="inline")
            assert own_b.result() == f"{b}/own".upper() + "!"
        assert run.status == "completed" and own_b.run_id != own_a.run_id
        assert RAN[f"{b}/x"] == 0 and RAN[f"{a}/x"] == 1
        assert [k.child.position for k in other.children(b)] == ["1"]  # the refused start left nothing
        assert [(h.run_id, h.run_status) for h in other.history(kid) if h.kind == "end"] == [
            (mine.run_id, "completed")
        ]
        assert other.children(kid) == []  # its claim is no child link
        with resume(a, store=other, run_id="turn-2"):  # the same parent's next turn may reuse it
            again = start(research, f"{a}/y", thread_id=kid, executor="inline")
            assert again.result() == f"{a}/y".upper() + "!" and again.run_id != mine.run_id
        other.delete_thread(kid)  # the old child thread gone: another parent may take the name
        with resume(b, store=store, run_id="turn-2"):
            assert start(research, f"{b}/z", thread_id=kid, executor="inline").result() == (
                f"{b}/z".upper() + "!"
            )

    def test_a_resumed_parent_that_starts_other_children_is_refused(
        self, stores: tuple[Store, Store]
    ) -> None:
        """pk.start at a recorded position checks the recorded agent, thread and arguments (as a
        step checks its arguments): another order raises pk.NonDeterminismError, never a
        swapped handle."""
        store, other = stores
        t = self.thread()
        queue: list[dict[str, Any]] = []
        with pytest.raises(_Crash), resume(t, store=store, run_id="r1"):
            start(research, f"{t}/a", executor=queue.append)
            start(echoes, f"{t}/b", executor=queue.append)
            raise _Crash("the parent's process dies here")
        said = []
        swaps: list[tuple[Callable[..., Any], str, str | None]] = [
            (echoes, f"{t}/b", None),  # another agent
            (research, f"{t}/b", None),  # other arguments
            (research, f"{t}/a", f"{t}-x"),  # another thread
        ]
        for agent, label, thread_id in swaps:
            with pytest.raises(NonDeterminismError) as caught, resume(t, store=other, run_id="r1"):
                start(agent, label, thread_id=thread_id, executor=queue.append)
            assert caught.value.position == "0" and caught.value.step == "pk.start"
            assert f"recorded the start of {research.__module__}:research" in str(caught.value)
            said.append(str(caught.value))
        assert f"now starts {echoes.__module__}:echoes there:" in said[0]
        assert "with other arguments" in said[1] and f"on thread '{t}-x'" in said[2]
        with resume(t, store=other, run_id="r1") as run:  # the same order: the same handles
            h = [start(research, f"{t}/a", executor=queue.append), start(echoes, f"{t}/b", executor=queue.append)]
            assert [k.child for k in other.children(t)] == [x.child for x in h]
        assert run.status == "completed" and RAN[f"{t}/a"] == 0

    def test_a_child_thread_held_by_an_unfinished_run_fails_fast(
        self, stores: tuple[Store, Store]
    ) -> None:
        """A named child thread whose newest run is another, unfinished one nobody runs (it
        crashed, or it is suspended): pk.start raises pk.ThreadBusyError naming it, at once and
        before recording anything; a recorded child that meets one when it is handed over
        inline raises it from pk.start too. Once that run is given up, the child runs."""
        store, other = stores
        t, kid = self.thread(), self.thread() + "-kid"
        with pytest.raises(_Crash), resume(kid, store=store, run_id="old"):
            _work(f"{kid}/old")
            raise _Crash("its process died")
        executors: list[str | Callable[[dict[str, Any]], Any]] = ["inline", "thread", lambda spec: None]
        for i, executor in enumerate(executors):
            with resume(t, store=store, run_id=f"r{i}") as run:
                with pytest.raises(ThreadBusyError, match=r"store\.abandon") as busy:
                    start(research, f"{t}/a", thread_id=kid, executor=executor)
                assert busy.value.unfinished_run == "old" and busy.value.thread_id == kid
        assert run.status == "completed" and store.children(t) == [] and RAN[f"{t}/a"] == 0
        q = f"{kid}-asks"
        with resume(q, store=store, run_id="asking"):
            _asks_inside(q)  # suspended: waits for an answer
        with resume(t + "-q", store=store), pytest.raises(ThreadBusyError, match="suspended"):
            start(research, f"{t}/q", thread_id=q, executor="inline")
        queue: list[dict[str, Any]] = []
        late = f"{kid}-late"
        with pytest.raises(_Crash), resume(t + "-late", store=store, run_id="r1"):
            start(research, f"{t}/late", thread_id=late, executor=queue.append)  # recorded, lost
            raise _Crash("the parent dies before the child ran")
        with pytest.raises(_Crash), resume(late, store=store, run_id="intruder"):
            _work(f"{late}/intruder")  # another run crashed on the child's thread meanwhile
            raise _Crash("its process died")
        with pytest.raises(ThreadBusyError, match="intruder") as busy, resume(
            t + "-late", store=other, run_id="r1"
        ):
            start(research, f"{t}/late", thread_id=late, executor="inline")  # replayed, handed over
        assert busy.value.unfinished_run == "intruder" and RAN[f"{t}/late"] == 0
        other.abandon(late, "intruder")
        with resume(t + "-late", store=other, run_id="r1") as run:
            h = start(research, f"{t}/late", thread_id=late, executor="inline")
            assert h.result() == f"{t}/late".upper() + "!"
        assert run.status == "completed" and RAN[f"{t}/late"] == 1

    def test_async_starts_are_checked_too(self, stores: tuple[Store, Store]) -> None:
        """pk.astart: another parent's named thread, a swapped replay, a blocked thread."""
        store, other = stores
        a, b, kid = self.thread(), self.thread(), self.thread() + "-kid"
        with pytest.raises(_Crash), resume(kid + "-busy", store=store, run_id="old"):
            _work(f"{kid}/old")
            raise _Crash("its process died")

        async def parent(thread_id: str, s: Store, agent: Any, label: str, child: str) -> Any:
            async with resume(thread_id, store=s, run_id="r1"):
                h = await astart(agent, label, thread_id=child, executor="inline")
                return await h.aresult()

        assert asyncio.run(parent(a, store, aresearch, f"{a}/x", kid)) == f"{a}/x".upper() + "?"
        with pytest.raises(ConflictError, match="another parent"):
            asyncio.run(parent(b, other, aresearch, f"{b}/x", kid))
        with pytest.raises(NonDeterminismError, match="recorded the start of"):
            asyncio.run(parent(a, other, research, f"{a}/x", kid))
        with pytest.raises(ThreadBusyError, match="old"):
            asyncio.run(parent(b, other, aresearch, f"{b}/y", kid + "-busy"))
        assert RAN[f"{a}/x"] == 1 and RAN[f"{b}/x"] == RAN[f"{b}/y"] == 0

    def test_delete_thread_drops_its_child_links(self, stores: tuple[Store, Store]) -> None:
        store, other = stores
        t = self.thread()
        with resume(t, store=store):
            start(research, f"{t}/d", executor="inline").result()
        assert len(other.children(t)) == 1
        other.delete_thread(t)
        assert other.children(t) == []


@register
def delegates(label: str) -> str:
    """A child agent that starts a child of its own (a grandchild of the supervisor)."""
    return str(start(research, label + "/grand", executor="inline").result()) + "+"
