"""Conformance checks for suspended runs and durable timers on a store (docs/long-runs.md).

``pk.suspend`` records a question and ends the block; ``store.answer`` records the answer
at the same position under the thread's lease; the next resume replays up to it and goes
on, running no recorded step again. Each check uses two ``pk.connect`` instances of the
store (the asking process and the answering one) and waits only on conditions it can
observe in the store, never on time. Subclass :class:`SuspendConformance` with a
``persistkit_url`` fixture::

    class TestMyStoreSuspend(SuspendConformance):
        @pytest.fixture
        def persistkit_url(self) -> str:
            return "mystore://..."
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from .._errors import AnswerError, ConfigurationError, NotFoundError, ThreadBusyError
from ..coordination._suspend import Suspended
from ..engine._api import checkpointed, current_run, resume
from ..engine._store import Store
from ..engine._suspend import asleep, asuspend, asuspend_all, sleep, suspend, suspend_all
from ._stores import TwoStores

__all__ = ["SuspendConformance"]

_BODIES: list[str] = []  # every step body that ran (a committed step must never run twice)


@checkpointed
def _note(name: str) -> str:
    _BODIES.append(name)
    run = current_run()
    if run is not None:
        run.state["notes"] = [*run.state.get("notes", []), name]
    return name


@checkpointed
async def _anote(name: str) -> str:
    _BODIES.append(name)
    return name


@checkpointed
def _asks_inside(thread: str) -> Any:
    _BODIES.append(f"{thread}:inside")
    return suspend("inside?", answer_type=int)


def _agent(store: Store, thread: str, **kw: Any) -> tuple[Any, Any]:
    """before → suspend(answer_type=int) → after(answer)."""
    got: list[Any] = []
    with resume(thread, store=store, **kw) as run:
        _note(f"{thread}:before")
        answer = suspend({"refund": 30}, answer_type=int)
        got.append(answer)
        _note(f"{thread}:after:{answer}")
    return run, got[0] if got else None


def _ran(thread: str) -> list[str]:
    return [b.partition(":")[2] for b in _BODIES if b.startswith(thread + ":")]


class SuspendConformance(TwoStores):
    """Mix into a test class that provides ``persistkit_url``."""


    @staticmethod
    def thread() -> str:
        return f"suspend-{uuid.uuid4().hex}"

    def test_suspend_answer_resume(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()
        run, got = _agent(one, t)
        assert run.status == "suspended" and got is None
        [q] = run.suspended
        assert (q.thread_id, q.run_id, q.payload, q.kind, q.deadline) == (t, run.run_id, {"refund": 30}, "question", None)
        assert [(p.thread_id, p.question_id) for p in two.pending(prefix=t)] == [(t, q.question_id)]
        assert two.history(t)[0].run_status == "suspended"
        again, got = _agent(one, t)  # not answered yet: still suspended, nothing written
        assert again.status == "suspended" and again.run_id == run.run_id and len(two.history(t)) == 2
        cp = two.answer(t, 7)
        assert (cp.run_id, cp.run_status, cp.status) == (run.run_id, "running", "completed")
        assert two.pending(prefix=t) == []
        done, got = _agent(one, t)
        assert (done.status, done.run_id, got) == ("completed", run.run_id, 7)
        assert _ran(t) == ["before", "after:7"]  # the step before the suspend ran once
        assert one.get_state(t)["notes"] == [f"{t}:before", f"{t}:after:7"]

    def test_async_suspend_answer_resume(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()

        async def agent() -> tuple[Any, Any]:
            got: list[Any] = []
            async with resume(t, store=one) as run:
                await _anote(f"{t}:before")
                got.append(await asuspend("approve?", answer_type=bool))
                await _anote(f"{t}:after")
            return run, got

        async def main() -> None:
            run, got = await agent()
            assert run.status == "suspended" and got == []
            assert [q.payload for q in await two.apending(prefix=t)] == ["approve?"]
            with pytest.raises(AnswerError):
                await two.aanswer(t, "yes")  # not a bool
            await two.aanswer(t, True)
            run, got = await agent()
            assert run.status == "completed" and got == [True]

        asyncio.run(main())
        assert _ran(t) == ["before", "after"]

    def test_suspend_inside_a_step_reruns_only_that_step(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()

        def agent() -> Any:
            with resume(t, store=one) as run:
                _note(f"{t}:first")
                out = _asks_inside(t)
                _note(f"{t}:last:{out}")
            return run

        assert agent().status == "suspended"
        [q] = two.pending(prefix=t)
        assert q.question_id == "1/0"  # the step's first child position
        two.answer(t, 5, question="1/0")
        assert agent().status == "completed"
        assert _ran(t) == ["first", "inside", "inside", "last:5"]

    def test_questions_one_after_another(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()

        def agent() -> Any:
            with resume(t, store=one) as run:
                a = suspend("first?")
                _note(f"{t}:{a}")
                b = suspend("second?")
                _note(f"{t}:{b}")
            return run

        assert agent().status == "suspended"
        two.answer(t, "x")
        run = agent()
        assert run.status == "suspended" and [q.payload for q in run.suspended] == ["second?"]
        two.answer(t, "y")
        assert agent().status == "completed"
        assert _ran(t) == ["x", "y"]

    def test_several_questions_open_at_once(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()
        got: list[Any] = []

        def agent() -> Any:
            with resume(t, store=one) as run:
                got.append(suspend_all(["legal?", "finance?"], answer_type=bool))
            return run

        run = agent()
        assert [q.question_id for q in run.suspended] == ["0.0", "0.1"]
        with pytest.raises(AnswerError, match="2 open questions"):
            two.answer(t, True)
        cp = two.answer(t, False, question="0.1")
        assert cp.run_status == "suspended"
        assert [q.question_id for q in two.pending(prefix=t)] == ["0.0"]
        with pytest.raises(AnswerError, match="answered already"):
            two.answer(t, True, question="0.1")
        assert agent().status == "suspended" and got == []
        two.answer(t, True)  # the one still open
        assert agent().status == "completed" and got == [[True, False]]

    def test_answer_refusals_store_nothing(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()
        with pytest.raises(NotFoundError):
            two.answer(t, 1)
        _agent(one, t)
        n = len(one.history(t))
        with pytest.raises(AnswerError, match="does not fit"):
            two.answer(t, "seven")
        with pytest.raises(AnswerError, match="does not fit"):
            two.answer(t, True)  # a bool is no int
        with pytest.raises(AnswerError, match="no open question"):
            two.answer(t, 1, question="9")
        assert len(one.history(t)) == n
        two.answer(t, 1)
        with pytest.raises(AnswerError, match="answered already"):
            two.answer(t, 2)
        _agent(one, t)
        with pytest.raises(AnswerError, match=r"not suspended \(its newest checkpoint \w+ is the end of a run, run "
                           r"status completed\)"):
            two.answer(t, 3)
        assert len(one.history(t)) == n + 3  # the answer, the step after it, the run's end

    def test_two_processes_answer_at_once(self, stores: tuple[Store, Store], persistkit_url: str,
                                          backend_options: dict[str, Any]) -> None:
        one, two = stores
        t = self.thread()
        _agent(one, t)
        outcomes: list[Any] = []
        gate = threading.Barrier(2)

        def answer(store: Store, value: int) -> None:
            gate.wait()
            try:
                store.answer(t, value)
                outcomes.append(value)
            except (AnswerError, ThreadBusyError) as exc:
                outcomes.append(exc)

        workers = [threading.Thread(target=answer, args=(s, v)) for s, v in ((one, 1), (two, 2))]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        won = [o for o in outcomes if isinstance(o, int)]
        assert len(won) == 1 and len(outcomes) == 2, outcomes
        answers = [c for c in one.history(t) if c.step == "pk.suspend" and c.status == "completed"]
        assert len(answers) == 1
        _, got = _agent(one, t)
        assert got == won[0]

    def test_answer_refused_while_a_live_run_holds_the_lease(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        if not one.backend.supports_leases:
            pytest.skip(f"{one.url} has no lease primitives: no lease to hold, no turns to order")
        t = self.thread()
        _agent(one, t)
        with resume(t, store=one, busy="reject") as run:
            with pytest.raises(ThreadBusyError, match="live run holds"):
                two.answer(t, 1)
            _note(f"{t}:before")
            with pytest.raises(Suspended):
                suspend({"refund": 30}, answer_type=int)
        assert run.status == "suspended"
        two.answer(t, 4)
        assert _agent(one, t)[1] == 4

    def test_deadline_takes_the_default(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()
        got: list[Any] = []

        def agent(deadline: Any) -> Any:
            with resume(t, store=one) as run:
                got.append(suspend("ok?", deadline=deadline, default="timeout"))
            return run

        past = datetime.now(UTC) - timedelta(seconds=1)
        assert agent(past).status == "suspended"
        assert two.pending(prefix=t) == []  # past its deadline: no longer answerable
        with pytest.raises(AnswerError, match="expired"):
            two.answer(t, "late")
        [due] = two.due(prefix=t)
        assert due.questions[0].has_default
        assert agent(past).status == "completed" and got == ["timeout"]
        assert two.due(prefix=t) == []
        with pytest.raises(ConfigurationError, match="go together"), resume(self.thread(), store=one):
            suspend("x", deadline=timedelta(days=1))

    def test_a_future_deadline_waits(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()
        with resume(t, store=one) as run:
            suspend("ok?", deadline=timedelta(days=2), default=False)
        assert run.status == "suspended"
        [q] = two.pending(prefix=t)
        assert q.deadline is not None and q.deadline > datetime.now(UTC) + timedelta(days=1)
        assert [d.thread_id for d in two.due(prefix=t)] == []
        assert [d.thread_id for d in two.due(datetime.now(UTC) + timedelta(days=3), prefix=t)] == [t]

    def test_long_sleep_suspends_until_due(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()

        def agent() -> Any:
            with resume(t, store=one) as run:
                _note(f"{t}:before")
                sleep(0.5, suspend_above=0)
                _note(f"{t}:after")
            return run

        run = agent()
        assert run.status == "suspended" and run.suspended[0].kind == "timer"
        assert two.pending(prefix=t) == []
        with pytest.raises(AnswerError, match="timer"):
            two.answer(t, None)
        wake = run.suspended[0].deadline
        assert wake is not None
        early = agent()  # before its wake time: still suspended, nothing slept here
        if early.status != "completed":  # (a slow host may resume it after its wake time)
            assert early.status == "suspended"
            deadline = time.monotonic() + 60
            while not two.due(prefix=t):  # an observable condition, not a timing assertion
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert agent().status == "completed"
        assert two.due(prefix=t) == [] and _ran(t) == ["before", "after"]
        assert [c.status for c in two.history(t) if c.step == "pk.sleep"] == ["completed", "suspended"]

    def test_async_sleep_and_short_sleep(self, stores: tuple[Store, Store]) -> None:
        one, _ = stores
        t = self.thread()

        async def main() -> Any:
            async with resume(t, store=one) as run:
                await asleep(0.01)  # short: sleeps here, wake time recorded
                await _anote(f"{t}:x")
                await asleep(timedelta(hours=1))
            return run

        run = asyncio.run(main())
        assert run.status == "suspended"
        [d] = one.due(datetime.now(UTC) + timedelta(hours=2), prefix=t)
        assert d.questions[0].kind == "timer"
        assert [c.step for c in one.history(t)][::-1] == ["pk.sleep", "_anote", "pk.sleep"]

    def test_a_suspended_run_is_unfinished_for_other_turns(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        if not one.backend.supports_leases:
            pytest.skip(f"{one.url} has no lease primitives: no lease to hold, no turns to order")
        t = self.thread()
        _agent(one, t, run_id="A")
        with pytest.raises(ThreadBusyError) as busy, resume(t, store=two, run_id="B", busy="reject"):
            _note(f"{t}:B")
        assert busy.value.unfinished_run == "A"
        two.answer(t, 3)
        _agent(one, t, run_id="A")  # its redelivery continues it
        with resume(t, store=two, run_id="B", busy="reject"):
            _note(f"{t}:B")
        assert _ran(t) == ["before", "after:3", "B"]

    def test_suspend_escapes_except_exception_and_outside_a_run(self, stores: tuple[Store, Store]) -> None:
        one, _ = stores
        t = self.thread()
        with resume(t, store=one) as run:
            try:
                suspend("q")
            except Exception:  # an agent's broad handler must not swallow it
                pytest.fail("pk.Suspended was caught by except Exception")
        assert run.status == "suspended"
        with pytest.raises(ConfigurationError, match="inside a run"):
            suspend("q")
        with pytest.raises(ConfigurationError, match="inside a run"):
            sleep(1)

    def test_async_several_at_once(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()

        async def agent() -> tuple[Any, list[Any]]:
            got: list[Any] = []
            async with resume(t, store=one) as run:
                got.append(await asuspend_all([1, 2]))
            return run, got

        assert asyncio.run(agent())[0].status == "suspended"
        two.answer(t, "a", question="0.0")
        two.answer(t, "b", question="0.1")
        run, got = asyncio.run(agent())
        assert run.status == "completed" and got == [["a", "b"]]
