"""pk.suspend / pk.sleep / store.answer / pending / due: details beyond the shipped suite
(persistkit/testing/suspend_suite.py, run on every store by tests/test_suspend_conformance.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pickle
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pydantic
import pytest
from pydantic import BaseModel

import persistkit as pk
from persistkit._cli import main as cli
from persistkit.engine import _suspend as engine_suspend


class Refund(BaseModel):
    amount: int
    reason: str


@dataclasses.dataclass
class Choice:
    option: str
    score: float


BODIES: list[str] = []


@pk.checkpointed
def note(name: str) -> str:
    BODIES.append(name)
    return name


def tid() -> str:
    return f"s-{uuid.uuid4().hex}"


def test_model_and_dataclass_answers(store: pk.Store) -> None:
    t = tid()
    got: list[Any] = []

    def agent() -> pk.Run:
        with pk.resume(t, store=store) as run:
            got.append(pk.suspend("how much?", answer_type=Refund))
            got.append(pk.suspend("which?", answer_type=Choice))
        return run

    agent()
    with pytest.raises(pk.AnswerError, match="does not fit its type Refund") as bad:
        store.answer(t, {"amount": "lots"})
    assert bad.value.thread_id == t and bad.value.question == "0"
    again = pickle.loads(pickle.dumps(bad.value))
    assert (type(again), str(again), again.question) == (pk.AnswerError, str(bad.value), "0")
    store.answer(t, {"amount": 30, "reason": "late"})
    assert agent().status == "suspended"
    with pytest.raises(pk.AnswerError, match="Choice"):
        store.answer(t, {"option": "a"})  # score missing
    with pytest.raises(pk.AnswerError, match="is not the question's answer type"):
        store.answer(t, {"option": "a", "score": 1}, answer_type=Refund)
    store.answer(t, Choice("b", 2))
    assert agent().status == "completed"
    assert got[-2:] == [Refund(amount=30, reason="late"), Choice("b", 2)]


def test_an_answer_type_this_process_cannot_resolve(local_store: pk.Store) -> None:
    t = tid()
    with pk.resume(t, store=local_store):
        pk.suspend("?", answer_type=Refund)
    cp = local_store.history(t)[0]
    # forge what another process sees: a class neither registered nor in an allowed module
    from persistkit.codec import _registry

    saved = dict(_registry._REGISTRY)
    name = _registry.class_name(Refund)
    del _registry._REGISTRY[name]
    mods = set(_registry._MODULES)
    _registry._MODULES.discard(__name__)
    try:
        with pytest.raises(pk.ConfigurationError, match=r"cannot resolve.*answer_type=Refund.*pk.register"):
            local_store.answer(t, {"amount": 1, "reason": "x"})
        assert local_store.history(t)[0].checkpoint_id == cp.checkpoint_id  # nothing stored
        local_store.answer(t, {"amount": 1, "reason": "x"}, answer_type=Refund)
    finally:
        _registry._REGISTRY.update(saved)
        _registry._MODULES.update(mods)


def test_bad_arguments(local_store: pk.Store) -> None:
    with pk.resume(tid(), store=local_store):
        with pytest.raises(pk.ConfigurationError, match="naive"):
            pk.suspend("?", deadline=datetime(2030, 1, 1), default=1)
        with pytest.raises(pk.ConfigurationError, match="answer_type"):
            pk.suspend("?", answer_type=set)
        with pytest.raises(pk.ConfigurationError, match="non-empty list"):
            pk.suspend_all([])
        with pytest.raises(pk.ConfigurationError, match="finite duration"):
            pk.sleep(-1)
        with pytest.raises(pk.ConfigurationError, match="seconds"):
            pk.sleep("1")  # type: ignore[arg-type]
        with pytest.raises(pk.ConfigurationError, match="suspend_above"):
            pk.sleep(1, suspend_above=-1)
    with pytest.raises(pk.ConfigurationError, match="question must be"):
        local_store.answer("t", 1, question=3)  # type: ignore[arg-type]
    with pytest.raises(pk.ConfigurationError, match="naive"):
        local_store.due(datetime(2030, 1, 1))
    for fn in (pk.suspend_all, pk.asuspend, pk.asuspend_all, pk.asleep):
        with pytest.raises(pk.ConfigurationError, match="inside a run"):
            coro = fn([1]) if fn in (pk.suspend_all, pk.asuspend_all) else fn(1)  # type: ignore[operator]
            if asyncio.iscoroutine(coro):
                asyncio.run(coro)


def test_a_completed_run_with_a_suspend_replays_and_writes_nothing(store: pk.Store) -> None:
    t = tid()

    def agent() -> tuple[pk.Run, Any]:
        out: list[Any] = []
        with pk.resume(t, store=store, run_id="R") as run:
            out.append(pk.suspend("?"))
        return run, out

    agent()
    store.answer(t, {"ok": True})
    run, out = agent()
    assert run.status == "completed" and out == [{"ok": True}]
    n = len(store.history(t))
    run, out = agent()  # a redelivery: replays, writes nothing
    assert out == [{"ok": True}] and len(store.history(t)) == n


def test_short_sleep_crash_resumes_only_the_remainder(local_store: pk.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wake time is recorded before the sleep: a crash mid-sleep sleeps only the rest."""
    clock = {"offset": 0.0}
    slept: list[float] = []

    class Crash(BaseException):
        pass

    class FakeTime:
        @staticmethod
        def time() -> float:
            return time.time() + clock["offset"]

        @staticmethod
        def sleep(secs: float) -> None:
            slept.append(secs)
            raise Crash  # the process dies in the middle of the sleep

    monkeypatch.setattr(engine_suspend, "time", FakeTime)
    t = tid()

    def agent() -> pk.Run:
        with pk.resume(t, store=local_store) as run:
            note(f"{t}:a")
            pk.sleep(30)  # under suspend_above: sleeps in the process
            note(f"{t}:b")
        return run

    with pytest.raises(Crash):
        agent()
    assert slept == [30.0]
    clock["offset"] = 20.0  # 20 s later the run is resumed
    with pytest.raises(Crash):
        agent()
    assert 9.0 < slept[-1] <= 10.0  # only the rest
    clock["offset"] = 31.0
    assert agent().status == "completed"  # past the wake time: no sleep at all
    assert len(slept) == 2
    assert [b for b in BODIES if b.startswith(t)] == [f"{t}:a", f"{t}:b"]


def test_a_long_timer_resumed_early_sleeps_the_rest_here(local_store: pk.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = {"offset": 0.0}
    slept: list[float] = []

    class FakeTime:
        @staticmethod
        def time() -> float:
            return time.time() + clock["offset"]

        @staticmethod
        def sleep(secs: float) -> None:
            slept.append(secs)

    monkeypatch.setattr(engine_suspend, "time", FakeTime)
    t = tid()

    def agent() -> pk.Run:
        with pk.resume(t, store=local_store) as run:
            pk.sleep(timedelta(hours=1))
        return run

    assert agent().status == "suspended" and slept == []
    clock["offset"] = 3600 - 10  # 10 s before the wake time: under suspend_above, sleeps the rest
    assert agent().status == "completed"
    assert len(slept) == 1 and 9 < slept[0] <= 10


def test_a_resume_with_the_run_id_continues_and_a_taskgroup_suspend_is_suppressed(store: pk.Store) -> None:
    t = tid()

    async def agent() -> pk.Run:
        async with pk.resume(t, store=store, run_id="R1") as run, asyncio.TaskGroup() as tg:
            tg.create_task(pk.asuspend("from a task"))
        return run

    run = asyncio.run(agent())
    assert run.status == "suspended" and run.run_id == "R1"
    store.answer(t, 1)
    assert asyncio.run(agent()).status == "completed"


def test_steps_and_history_show_the_suspension(local_store: pk.Store) -> None:
    t = tid()
    with pk.resume(t, store=local_store) as run:
        note("x")
        pk.suspend("?")
    assert [(s.name, s.status) for s in run.steps] == [("note", "completed"), ("pk.suspend", "suspended")]
    [cp] = local_store.history(t, limit=1)
    assert (cp.kind, cp.step, cp.status, cp.run_status) == ("step", "pk.suspend", "suspended", "suspended")


def test_cli_verbs(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    store = pk.connect(url)
    with pk.resume("cli-a", store=store):
        pk.suspend({"refund": 5}, answer_type=int)
    with pk.resume("cli-b", store=store):
        pk.sleep(3600)
    store.close()
    assert cli(["pending", "--url", url, "--json"]) == 0
    [q] = json.loads(capsys.readouterr().out)
    assert (q["thread"], q["payload"], q["answer_type"]) == ("cli-a", {"refund": 5}, "builtins:int")
    assert cli(["due", "--url", url, "--now", "2100-01-01T00:00:00+00:00", "--json"]) == 0
    assert [d["thread"] for d in json.loads(capsys.readouterr().out)] == ["cli-b"]
    assert cli(["due", "--url", url]) == 0
    assert "cli-b" not in capsys.readouterr().out
    assert cli(["answer", "cli-a", "not json", "--url", url]) == 1
    assert "not JSON" in capsys.readouterr().err
    assert cli(["answer", "cli-b", "1", "--url", url]) == 1
    assert "timer" in capsys.readouterr().err
    assert cli(["answer", "cli-a", "5", "--url", url]) == 0
    assert "resume run" in capsys.readouterr().out
    assert cli(["pending", "--url", url]) == 0
    assert "cli-a" not in capsys.readouterr().out
    assert cli(["answer", "nope", "5", "--url", url]) == 3


def test_async_due_and_pending(store: pk.Store) -> None:
    t = tid()

    async def main() -> None:
        async with pk.resume(t, store=store):
            await pk.asuspend("?", deadline=timedelta(minutes=5), default="no")
        [q] = await store.apending(prefix=t)
        assert q.has_default and q.deadline is not None
        assert await store.adue(prefix=t) == []
        [d] = await store.adue(datetime.now(UTC) + timedelta(minutes=6), prefix=t)
        assert d.run_id == q.run_id and d.due_at == q.deadline

    asyncio.run(main())


@pk.checkpointed
async def slow_note(name: str) -> str:
    for _ in range(20):
        await asyncio.sleep(0)
    BODIES.append(name)
    return name


def test_a_step_committed_after_a_concurrent_suspend_leaves_the_run_suspended(local_store: pk.Store) -> None:
    """A step of another task commits after the suspend record: the block's exit writes the
    suspension again, so the head still says suspended (pending, answer and due read it)."""
    t = tid()

    async def agent() -> tuple[pk.Run, list[Any]]:
        async with pk.resume(t, store=local_store) as run:
            got = await asyncio.gather(pk.asuspend("q"), slow_note(f"{t}:b"), return_exceptions=True)
            for g in got:
                if isinstance(g, BaseException):
                    raise g
        return run, got

    run, _ = asyncio.run(agent())
    assert run.status == "suspended"
    steps = [(c.step, c.status) for c in local_store.history(t)][::-1]
    assert steps == [("pk.suspend", "suspended"), ("slow_note", "completed"), ("pk.suspend", "suspended")]
    [q] = local_store.pending(prefix=t)
    local_store.answer(t, "yes", question=q.question_id)
    run, got = asyncio.run(agent())
    assert run.status == "completed" and got == ["yes", f"{t}:b"]
    assert [b for b in BODIES if b.startswith(t)] == [f"{t}:b"]


def test_two_tasks_that_suspend_ask_one_after_the_other(local_store: pk.Store) -> None:
    t = tid()
    got: list[Any] = []

    async def ask(what: str) -> None:
        got.append(await pk.asuspend(what))

    async def agent() -> pk.Run:
        async with pk.resume(t, store=local_store) as run, asyncio.TaskGroup() as tg:
            tg.create_task(ask("first"))
            tg.create_task(ask("second"))
        return run

    run = asyncio.run(agent())
    assert [q.payload for q in run.suspended] == ["first"]  # the second task asks next time
    local_store.answer(t, 1)
    run = asyncio.run(agent())
    assert [q.payload for q in run.suspended] == ["second"]
    local_store.answer(t, 2)
    assert asyncio.run(agent()).status == "completed"
    assert got[-2:] == [1, 2]


def test_on_an_encrypted_integrity_sealed_store(store_url: str) -> None:
    """The answer record is sealed and chained like any record (it is written through the
    wrappers), and verify finds the thread sound."""
    keys = {"encryption": pk.generate_key(), "integrity": pk.generate_key()}
    one, two = pk.connect(store_url, **keys), pk.connect(store_url, **keys)
    t = tid()
    try:
        got: list[Any] = []

        def agent() -> pk.Run:
            with pk.resume(t, store=one) as run:
                note(f"{t}:x")
                got.append(pk.suspend({"secret-free": 1}, answer_type=Refund))
            return run

        assert agent().status == "suspended"
        assert [q.payload for q in two.pending(prefix=t)] == [{"secret-free": 1}]
        two.answer(t, {"amount": 3, "reason": "ok"})
        assert agent().status == "completed" and got == [Refund(amount=3, reason="ok")]
        report = two.verify(t)
        assert report.ok, report
    finally:
        one.close()
        two.close()


def test_a_suspended_run_can_be_abandoned(local_store: pk.Store) -> None:
    t = tid()
    with pk.resume(t, store=local_store, run_id="A") as run:
        pk.suspend("never answered")
    assert run.status == "suspended"
    local_store.abandon(t, "A")
    assert local_store.pending(prefix=t) == []
    with pytest.raises(pk.AnswerError, match="not suspended"):
        local_store.answer(t, 1)
    with pk.resume(t, store=local_store, run_id="B", busy="reject") as later:
        note(f"{t}:B")
    assert later.status == "completed"
    with pytest.raises(pk.RunAbandonedError), pk.resume(t, store=local_store, run_id="A"):
        pass


def test_an_answered_run_nobody_resumed_is_due(local_store: pk.Store) -> None:
    """The process that answered died before it resumed the run: ``due()`` lists the run (the
    Slack example's finding), and once it is resumed, no more."""
    t = f"answered-{uuid.uuid4().hex[:8]}"
    with pk.resume(t, store=local_store) as run:
        pk.suspend({"refund": 80}, answer_type=bool)
    assert local_store.due() == [] or all(d.thread_id != t for d in local_store.due())
    local_store.answer(t, True)
    assert all(d.thread_id != t for d in local_store.due())  # a timer scheduler does not get it
    due = [d for d in local_store.due(answered=True) if d.thread_id == t]
    assert [(d.run_id, d.questions) for d in due] == [(run.run_id, ())]
    with pk.resume(t, store=local_store, run_id=run.run_id) as again:
        assert pk.suspend({"refund": 80}, answer_type=bool) is True
    assert again.status == "completed" and all(d.thread_id != t for d in local_store.due(answered=True))


def test_a_caught_suspension_runs_no_step_after_it(local_store: pk.Store) -> None:
    """An agent that catches pk.Suspended (against the advice) cannot run a step past the
    question: the step raises the suspension again, the head stays the suspend record and the
    question stays answerable (found from outside)."""
    t, ran = f"caught-{uuid.uuid4().hex[:8]}", []

    @pk.checkpointed(name="charge")
    def charge(n: int) -> int:
        ran.append(n)
        return n

    def block() -> pk.Run:
        with pk.resume(t, store=local_store) as run:
            charge(1)
            try:  # noqa: SIM105 -- what an agent that catches it writes
                pk.suspend({"charge": 2})
            except pk.Suspended:
                pass
            charge(2)
        return run

    assert block().status == "suspended" and ran == [1]
    assert [q.thread_id for q in local_store.pending() if q.thread_id == t] == [t]
    local_store.answer(t, True)
    assert block().status == "completed" and ran == [1, 2]


def test_code_that_cannot_replay_a_suspended_run_leaves_it_suspended(local_store: pk.Store) -> None:
    """A deploy that changed the step order: its resume raises NonDeterminismError and writes
    nothing, so the question stays open and the thread's other turns still wait for the run."""
    t = f"nde-{uuid.uuid4().hex[:8]}"

    @pk.checkpointed(name="old")
    def old() -> int:
        return 1

    @pk.checkpointed(name="new")
    def new() -> int:
        return 2

    with pk.resume(t, store=local_store, run_id="r1"):
        old()
        pk.suspend({"q": 1})
    with pytest.raises(pk.NonDeterminismError), pk.resume(t, store=local_store):
        new()
    assert [q.run_id for q in local_store.pending() if q.thread_id == t] == ["r1"]
    with pytest.raises(pk.ThreadBusyError) as busy, pk.resume(t, store=local_store, run_id="r2", busy="reject"):
        pass
    assert busy.value.unfinished_run == "r1"
    local_store.answer(t, True)
    with pk.resume(t, store=local_store, run_id="r1") as run:  # the old code finishes it
        old()
        assert pk.suspend({"q": 1}) is True
    assert run.status == "completed"


def test_a_default_is_checked_against_the_answer_type_and_returned_as_it(local_store: pk.Store) -> None:
    """A deadline's default is an answer too: refused when it does not fit ``answer_type``
    (nothing stored), and returned as that type after the deadline, as an answer would be."""
    t = f"default-{uuid.uuid4().hex[:8]}"
    with pytest.raises(pk.ConfigurationError, match="does not fit answer_type"), pk.resume(t, store=local_store):
        pk.suspend({"q": 1}, answer_type=bool, deadline=timedelta(seconds=-1), default="maybe")
    assert local_store.history(t) == [] or all(c.step != "pk.suspend" for c in local_store.history(t))
    with pk.resume(t, store=local_store, run_id="r1"):
        pk.suspend({"q": 1}, answer_type=Refund, deadline=timedelta(milliseconds=1),
                   default={"amount": 5, "reason": "timeout"})
    time.sleep(0.01)
    with pk.resume(t, store=local_store, run_id="r1"):
        got = pk.suspend({"q": 1}, answer_type=Refund, deadline=timedelta(milliseconds=1),
                         default={"amount": 5, "reason": "timeout"})
    assert isinstance(got, Refund) and got.amount == 5


def test_update_state_refuses_a_waiting_run(local_store: pk.Store) -> None:
    """An edit on top of a suspended run, or of an answer nobody resumed, would strand it (its
    question or answer lost, its steps run again by a new run): refused, nothing written."""
    t = f"edit-{uuid.uuid4().hex[:8]}"
    with pk.resume(t, store=local_store, run_id="r1"):
        note(f"{t}:asking")
        pk.suspend({"refund": 50})
    before = local_store.history(t)
    with pytest.raises(pk.ConfigurationError, match="is suspended"):
        local_store.update_state(t, {"note": "customer called"})
    local_store.answer(t, True)
    with pytest.raises(pk.ConfigurationError, match="was answered"):
        local_store.update_state(t, {"note": "customer called"})
    assert len(local_store.history(t)) == len(before) + 1  # the answer only
    with pk.resume(t, store=local_store, run_id="r1") as run:
        note(f"{t}:asking")
        assert pk.suspend({"refund": 50}) is True
    assert run.status == "completed" and BODIES.count(f"{t}:asking") == 1
    local_store.update_state(t, {"note": "after the run"})  # a finished run: edits as before


class Pick(BaseModel):
    """An answer checked against its question: one of the options the payload offers."""

    option: str

    @pydantic.model_validator(mode="after")
    def _offered(self, info: pydantic.ValidationInfo) -> Pick:
        context = info.context or {}
        if "payload" in context and self.option not in context["payload"]["options"]:
            if self.option == "raise":  # an AnswerError of the validator's own reaches the caller
                raise pk.AnswerError(
                    "my own words", thread_id=context["thread_id"], question=context["question"]
                )
            raise ValueError(f"{self.option!r} is not one of {context['payload']['options']}")
        return self


def test_an_answer_types_validators_see_the_question(store: pk.Store) -> None:
    t = tid()
    got: list[Any] = []

    def agent() -> pk.Run:
        with pk.resume(t, store=store) as run:
            got.append(pk.suspend({"options": ["a", "b"]}, answer_type=Pick))
        return run

    agent()
    with pytest.raises(pk.AnswerError, match=r"'c' is not one of \['a', 'b'\]") as bad:
        store.answer(t, {"option": "c"})
    assert type(bad.value) is pk.AnswerError and bad.value.question == "0"
    with pytest.raises(pk.AnswerError) as own:
        store.answer(t, {"option": "raise"})
    assert str(own.value) == "my own words" and own.value.thread_id == t
    assert [q.question_id for q in store.pending(prefix=t)] == ["0"]  # nothing stored, still open
    store.answer(t, {"option": "b"})
    assert agent().status == "completed" and got == [Pick(option="b")]  # revived without a context
