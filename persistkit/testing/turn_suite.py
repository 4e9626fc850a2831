"""Conformance checks for turn order on a store (part of :class:`~persistkit.testing.lease_suite.LeaseConformance`).

A crashed run keeps its place (docs/coordination.md): while a thread's newest run is
unfinished, a run of another turn does not start on top of it; it waits (``busy="queue"``
/ ``"wait"``) for the unfinished run's redelivery, which goes ahead of the queue, up to
``busy_timeout`` (then ``ThreadBusyError`` with ``unfinished_run``), or until
``store.abandon`` gives the run up. Each check uses two ``pk.connect`` instances of the
store (two "processes") and waits on conditions it can observe in the store, never on time.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from .._errors import (
    BackendUnavailableError,
    ConfigurationError,
    ConflictError,
    RunAbandonedError,
    ThreadBusyError,
)
from ..engine._api import checkpointed, current_run, resume
from ..engine._store import Store, connect
from ._stores import TwoStores

__all__ = ["TurnConformance"]


class _Crash(BaseException):
    """Stands for a process that dies mid-turn: the block writes no end record."""


_BODIES: list[str] = []  # every step body that ran, in order (a committed step must never run twice)


@checkpointed
def _item(name: str) -> str:
    """A step whose item commits with it (its state change is part of its checkpoint)."""
    _BODIES.append(name)
    run = current_run()
    if run is not None:
        run.state["items"] = [*run.state.get("items", []), name]
    return name


def _turn(store: Store, thread: str, run_id: str, n: int, *, crash_after: int | None = None, **kw: Any) -> None:
    """One turn: ``n`` steps, each appending its item to ``state["items"]`` (committed with it)."""
    with resume(thread, store=store, run_id=run_id, **kw):
        for k in range(n):
            _item(f"{run_id}.{k}")
            if crash_after is not None and k + 1 == crash_after:
                raise _Crash


def _until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60  # a bound for a broken build, not a timing assertion
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.005)


class TurnConformance(TwoStores):
    """Mix into a test class that provides ``persistkit_url`` (``LeaseConformance`` does)."""


    @staticmethod
    def crashed(store: Store, steps: int = 3, crash_after: int = 2) -> str:
        thread = f"turns-{uuid.uuid4().hex}"
        with pytest.raises(_Crash):
            _turn(store, thread, "A", steps, crash_after=crash_after)
        return thread

    def test_a_crashed_run_keeps_its_place(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        thread = self.crashed(one)
        with pytest.raises(ThreadBusyError) as busy:
            _turn(two, thread, "B", 1, busy="reject")
        assert busy.value.unfinished_run == "A" and busy.value.retryable
        with pytest.raises(ThreadBusyError) as late:
            _turn(two, thread, "B", 1, busy_timeout=0)
        assert late.value.unfinished_run == "A" and "store.abandon" in str(late.value)
        again = pickle.loads(pickle.dumps(late.value))  # a queue ships it to another process
        assert (again.unfinished_run, again.thread_id, str(again)) == ("A", thread, str(late.value))
        # B queues; C arrives after it; A's redelivery arrives last and goes first.
        done: list[str] = []

        def later(run_id: str) -> None:
            _turn(two, thread, run_id, 1, busy_timeout=60)
            done.append(run_id)

        b = threading.Thread(target=later, args=("B",))
        b.start()
        _until(lambda: [i.reserved_for for i in one.leases(prefix=thread)] == ["A"] and
               len(one.leases(prefix=thread)[0].waiting) == 1, "B waits in the queue for A")
        c = threading.Thread(target=later, args=("C",))
        c.start()
        _until(lambda: len(one.leases(prefix=thread)[0].waiting) == 2, "C queues behind B")
        before = list(_BODIES)
        _turn(one, thread, "A", 3)  # the redelivery continues A
        b.join(60)
        c.join(60)
        assert done == ["B", "C"]
        assert one.get_state(thread)["items"] == ["A.0", "A.1", "A.2", "B.0", "C.0"]
        ran = [x for x in _BODIES[len(before):] if x.startswith("A.")]
        assert ran == ["A.2"]  # A's committed steps replayed, not run again
        assert [c.run_status for c in one.history(thread) if c.kind == "end"] == ["completed"] * 3

    def test_a_finished_turn_replays_while_another_is_unfinished(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        thread = f"turns-{uuid.uuid4().hex}"
        _turn(one, thread, "A", 2)
        with pytest.raises(_Crash):
            _turn(one, thread, "B", 2, crash_after=1)
        before = len(_BODIES)
        _turn(two, thread, "A", 2, busy_timeout=0)  # finished: replays at once, waits for nothing
        assert len(_BODIES) == before
        _turn(two, thread, "B", 2, busy_timeout=0)  # the crashed one continues
        assert _BODIES[before:] == ["B.1"]
        assert one.get_state(thread)["items"] == ["A.0", "A.1", "B.0", "B.1"]

    @pytest.mark.parametrize("sealed", [False, True], ids=["plain", "encrypted+integrity"])
    def test_a_finished_turn_replays_at_once_behind_a_live_turn(
        self, persistkit_url: str, backend_options: dict[str, Any], sealed: bool
    ) -> None:
        from ..wrappers._keys import generate_key

        keys: dict[str, Any] = {"encryption": generate_key(), "integrity": generate_key()} if sealed else {}
        one = connect(persistkit_url, **backend_options, **keys)
        two = connect(persistkit_url, **backend_options, **keys)
        try:
            thread = f"turns-{uuid.uuid4().hex}"
            _turn(one, thread, "A", 2)
            with resume(thread, store=one, run_id="B"):  # a live turn holds the thread
                _item("B.0")
                rows = [c.checkpoint_id for c in two.history(thread)]
                before = len(_BODIES)
                for busy in ("reject", "wait", "queue"):  # a redelivery of A: replays, waits for nothing
                    with resume(thread, store=two, run_id="A", busy=busy, busy_timeout=0) as run:
                        assert [_item("A.0"), _item("A.1")] == ["A.0", "A.1"]
                        assert run.status == "completed"
                assert len(_BODIES) == before  # nothing ran
                assert [c.checkpoint_id for c in two.history(thread)] == rows  # nothing written
                assert two.leases(prefix=thread)[0].holder is not None  # B still holds it: A took nothing

            async def redeliver() -> None:
                with resume(thread, store=one, run_id="C"):
                    async with resume(thread, store=two, run_id="A", busy="reject") as arun:
                        assert arun.status == "completed"

            asyncio.run(redeliver())
        finally:
            one.close()
            two.close()

    def test_a_failed_run_retried_writes_nothing_more(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        thread = f"turns-{uuid.uuid4().hex}"

        class Boom(Exception):
            pass

        for store in (one, two, one):  # the failure itself, then two retries of the same message
            with pytest.raises(Boom), resume(thread, store=store, run_id="F"):
                _item("F.0")
                raise Boom("bug")
        assert [(c.kind, c.run_status) for c in one.history(thread)][:2] == [("end", "failed"), ("step", "running")]
        assert len(one.history(thread)) == 2  # one failed end record, not one per retry
        with pytest.raises(Boom, match="other"), resume(thread, store=two, run_id="F"):
            _item("F.0")
            raise Boom("other")  # a different failure is recorded
        assert len(one.history(thread)) == 3
        _turn(one, thread, "G", 1)
        with pytest.raises(ConflictError, match="run F failed") as moved, resume(thread, store=two, run_id="F"):
            _item("F.0")
            _item("F.1")
        assert "did not finish" not in str(moved.value)

    def test_a_resume_without_run_id_continues_the_unfinished_run(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        thread = self.crashed(one)
        with resume(thread, store=two, busy_timeout=0) as run:
            assert run.run_id == "A"

    def test_abandon_lets_the_waiting_turn_go_on(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        thread = self.crashed(one)
        done = threading.Event()

        def later() -> None:
            _turn(two, thread, "B", 1, busy_timeout=60)
            done.set()

        b = threading.Thread(target=later)
        b.start()
        _until(lambda: len(one.leases(prefix=thread)[0].waiting) == 1, "B waits for A")
        end = one.abandon(thread, "A")
        assert (end.kind, end.run_status, end.run_id) == ("end", "abandoned", "A")
        b.join(60)
        assert done.is_set()
        assert one.get_state(thread)["items"] == ["A.0", "A.1", "B.0"]  # A's committed steps stay
        assert one.abandon(thread, "A").checkpoint_id == end.checkpoint_id  # again: nothing to do
        with pytest.raises(RunAbandonedError) as gone:
            _turn(two, thread, "A", 3)
        assert not gone.value.retryable and gone.value.run_id == "A"
        assert pickle.loads(pickle.dumps(gone.value)).run_id == "A"
        with pytest.raises(ConfigurationError, match="finished"):
            one.abandon(thread, "B")
        with pytest.raises(LookupError):
            one.abandon(thread, "nope")

    def test_abandon_refuses_a_run_held_by_a_live_holder(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        thread = self.crashed(one)
        with resume(thread, store=one, run_id="A"), pytest.raises(ThreadBusyError, match="live run holds"):
            two.abandon(thread, "A")

    def test_a_retryable_error_leaves_the_run_unfinished(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        thread = f"turns-{uuid.uuid4().hex}"
        with pytest.raises(BackendUnavailableError), resume(thread, store=one, run_id="A"):
            _item("A.0")
            _item("A.1")
            raise BackendUnavailableError("the store went away for a moment")
        assert [c.kind for c in one.history(thread)] == ["step", "step"]  # no FAILED end
        with pytest.raises(ThreadBusyError):
            _turn(two, thread, "B", 1, busy="reject")
        before = len(_BODIES)
        _turn(two, thread, "A", 3)  # the queue's retry continues it
        assert _BODIES[before:] == ["A.2"]

    def test_async_twins(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        thread = self.crashed(one)

        async def main() -> None:
            with pytest.raises(ThreadBusyError) as busy:
                async with resume(thread, store=two, run_id="B", busy_timeout=0):
                    pass
            assert busy.value.unfinished_run == "A"
            entered = asyncio.Event()

            async def later() -> None:
                async with resume(thread, store=two, run_id="B", busy_timeout=60) as run:
                    entered.set()
                    run.state["items"] = [*run.state["items"], "B.0"]

            task = asyncio.ensure_future(later())
            while not (await one.aleases(prefix=thread))[0].waiting:
                await asyncio.sleep(0.005)
            assert not entered.is_set()
            await one.aabandon(thread, "A")
            await asyncio.wait_for(task, 60)

        asyncio.run(main())
        assert one.get_state(thread)["items"] == ["A.0", "A.1", "B.0"]
