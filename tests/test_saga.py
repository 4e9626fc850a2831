"""Sagas: pk.compensate, @checkpointed(compensate=), run.abort() and the rollback, on every
store, sync and async (the shipped checks are persistkit.testing.saga_suite)."""

from __future__ import annotations

import asyncio
import functools
import os
import pickle
import shutil
import threading
import uuid
from typing import Annotated, Any

import pytest

import persistkit as pk
from persistkit.state._records import _check_body

CALLS: list[Any] = []
SECRET = "sk-live-" + "9f8e7d6c5b4a39281706f5e4d3c2b1a0"


@pk.register
def undo(*args: Any, **kwargs: Any) -> None:
    step = pk.current_step()
    assert step is not None
    CALLS.append(("undo", args, kwargs, step.position))


@pk.register
async def aundo(*args: Any, **kwargs: Any) -> None:
    await asyncio.sleep(0)
    undo(*args, **kwargs)


def undo_booking(result: dict[str, Any]) -> None:
    CALLS.append(("undo_booking", result["id"]))


@pk.register
def undo_with_a_nested_step(name: str) -> None:
    nested(name)


@pk.checkpointed
def nested(name: str) -> str:
    CALLS.append(("nested", name, pk.current_step().position))  # type: ignore[union-attr]
    return name


@pk.register
def undo_checking_the_lease(thread: str) -> None:
    run = pk.current_run()
    assert run is not None
    CALLS.append(("lease", [(i.thread_id, i.holder is not None) for i in run.store.leases(prefix=thread)]))


@pk.checkpointed
def step(name: str, fn: Any = undo, **kw: Any) -> str:
    CALLS.append(("step", name))
    pk.compensate(fn, name, **kw)
    return name


@pk.checkpointed
async def astep(name: str) -> str:
    CALLS.append(("step", name))
    pk.compensate(aundo, name)
    return name


@pk.checkpointed(compensate=undo_booking)
def booking(n: int) -> dict[str, Any]:
    return {"id": n}


_TRIES: dict[str, int] = {}


@pk.checkpointed(retry=pk.Retry(attempts=2, wait_initial=0.0, wait_max=0.0, wait_jitter=0.0))
def flaky(name: str) -> str:
    _TRIES[name] = _TRIES.get(name, 0) + 1
    pk.compensate(undo, f"{name}#{_TRIES[name]}")
    if _TRIES[name] == 1:
        raise ConnectionError("first attempt fails after registering")
    return name


class Boom(Exception):
    pass


@pytest.fixture(autouse=True)
def _clean() -> None:
    CALLS.clear()
    _TRIES.clear()


def _thread() -> str:
    return f"saga-{uuid.uuid4().hex[:10]}"


# -- the rollback, on every store ------------------------------------------------------------


def test_arguments_keyword_arguments_and_the_decorator_result(store: pk.Store) -> None:
    t = _thread()
    with pytest.raises(Boom), pk.resume(t, store=store) as run:
        step("a", extra={"n": 1})
        booking(42)
        raise Boom("after the steps")
    assert CALLS == [("step", "a"), ("undo_booking", 42), ("undo", ("a",), {"extra": {"n": 1}}, "c/1")]
    assert run.status == "compensated"
    assert [e.position for e in run.steps] == ["0", "1", "c", "c/0", "c/1"]


def test_async_block_with_sync_and_async_compensations(store: pk.Store) -> None:
    t = _thread()

    async def main() -> pk.Run:
        async with pk.resume(t, store=store) as run:
            step("sync")
            await astep("async")
            raise Boom("x")
        return run  # pragma: no cover

    with pytest.raises(Boom):
        asyncio.run(main())
    assert [c[1] for c in CALLS if c[0] == "undo"] == [("async",), ("sync",)]
    assert store.history(t)[0].run_status == "compensated"


def test_an_async_compensation_in_a_sync_block(store: pk.Store) -> None:
    t = _thread()
    with pytest.raises(Boom), pk.resume(t, store=store):
        step("a", fn=aundo)
        raise Boom("x")
    assert [c[1] for c in CALLS if c[0] == "undo"] == [("a",)]


def test_a_retried_attempt_drops_the_registrations_of_the_failed_one(store: pk.Store) -> None:
    t = _thread()
    with pytest.raises(Boom), pk.resume(t, store=store):
        flaky("f")
        raise Boom("x")
    assert [c[1] for c in CALLS if c[0] == "undo"] == [("f#2",)]


def test_nested_steps_of_a_compensation_record_in_its_scope(store: pk.Store) -> None:
    t = _thread()
    with pytest.raises(Boom), pk.resume(t, store=store):
        step("a", fn=undo_with_a_nested_step)
        raise Boom("x")
    assert CALLS[-1] == ("nested", "a", "c/0/0")
    assert [c.position for c in store.history(t) if c.position][:2] == ["c/0", "c/0/0"]


class _Crash(BaseException):
    """Stands for a process that dies."""


CRASH: set[str] = set()


@pk.register
async def acrash_once(name: str) -> None:
    if name in CRASH:
        CRASH.discard(name)
        raise _Crash(name)
    CALLS.append(("undo", name))


@pk.checkpointed
async def abook(name: str) -> str:
    CALLS.append(("step", name))
    run = pk.current_run()
    assert run is not None
    run.state.setdefault("booked", []).append(name)
    pk.compensate(acrash_once, name)
    return name


def test_async_crash_mid_rollback_finished_by_an_async_resume(store_url: str) -> None:
    t, r = _thread(), uuid.uuid4().hex

    async def first() -> None:
        with pk.connect(store_url) as store:
            async with pk.resume(t, store=store, run_id=r):
                for n in "abc":
                    await abook(n)
                raise Boom("x")

    async def second() -> None:
        with pk.connect(store_url) as store:
            async with pk.resume(t, store=store, run_id=r):
                raise AssertionError("the block of a run that is rolling back ran")

    CRASH.add("b")
    with pytest.raises(_Crash):
        asyncio.run(first())
    assert CALLS[-1] == ("undo", "c")
    CALLS.clear()
    with pytest.raises(pk.RunCompensatedError) as caught:
        asyncio.run(second())
    assert isinstance(caught.value.__cause__, Boom)
    assert CALLS == [("undo", "b"), ("undo", "a")]
    with pk.connect(store_url) as store:
        assert store.history(t)[0].run_status == "compensated"
        assert store.get_state(t) == {"booked": ["a", "b", "c"]}  # the state the run left, not its start
        with pytest.raises(pk.RunCompensatedError):
            asyncio.run(second())


@pk.register
def undo_while_another_holder_takes_over(thread: str) -> None:
    """Another run takes the thread's lease over (as after an expiry) while this undo runs."""
    run = pk.current_run()
    assert run is not None
    backend = run.store.backend
    while True:  # the heartbeat may move the record between the read and the swap: read again
        rec = backend.lease_get(thread, "")
        if backend.lease_swap(thread, "", rec.version, rec.token + 1, rec.data):
            break
    CALLS.append(("undo", thread))


def test_a_lease_lost_during_the_rollback_stops_it_and_writes_nothing_more(store: pk.Store) -> None:
    t = _thread()
    with pytest.raises(pk.LeaseLostError) as lost, pk.resume(t, store=store, lease_ttl=5):
        step("first")
        step(t, fn=undo_while_another_holder_takes_over)
        raise Boom("x")
    assert lost.value.token == 1
    assert [("step", "first"), ("step", t), ("undo", t)] == CALLS  # the rollback stopped there
    hist = store.history(t)
    assert [(c.position, c.run_status) for c in hist] == [("c", "compensating"), ("1", "running"), ("0", "running")]


def test_the_rollback_holds_the_blocks_lease(store: pk.Store) -> None:
    t = _thread()
    with pytest.raises(Boom), pk.resume(t, store=store):
        step(t, fn=undo_checking_the_lease)
        raise Boom("x")
    assert CALLS[-1] == ("lease", [(t, True)])
    assert [i.holder for i in store.leases(prefix=t)] == [None]  # given up with the end record


def test_secret_arguments_are_stored_as_handles(store: pk.Store) -> None:
    t = _thread()
    pk.secrets.register("saga_key", SECRET)
    try:
        with pytest.raises(Boom), pk.resume(t, store=store):
            step("a", key=SECRET)
            raise Boom("x")
    finally:
        pk.secrets.unregister("saga_key")
    assert CALLS[-1] == ("undo", ("a",), {"key": SECRET}, "c/0")
    rows = store.backend.list(t, "", limit=100)
    assert rows and all(SECRET.encode() not in r.payload for r in rows)


def test_state_the_block_left_unstorable_does_not_stop_the_rollback(store: pk.Store) -> None:
    t = _thread()
    with pytest.raises(Boom), pk.resume(t, store=store) as run:
        run.state["kept"] = 1
        step("a")
        run.state["lock"] = threading.Lock()
        raise Boom("x")
    assert run.status == "compensated" and [c[1] for c in CALLS if c[0] == "undo"] == [("a",)]
    assert store.get_state(t) == {"kept": 1}


@pytest.mark.parametrize(
    "error",
    [pk.NonDeterminismError("code changed"), pk.ThreadBusyError("busy"), KeyboardInterrupt()],
    ids=["non-determinism", "retryable", "interrupt"],
)
def test_what_does_not_roll_back(local_store: pk.Store, error: BaseException) -> None:
    t = _thread()
    with pytest.raises(type(error)), pk.resume(t, store=local_store):
        step("a")
        raise error
    assert not [c for c in CALLS if c[0] == "undo"]
    assert local_store.history(t)[0].run_status in ("failed", "running")


def test_abort_outside_a_step_and_its_reason(local_store: pk.Store) -> None:
    t = _thread()
    with pytest.raises(pk.RunAbortedError) as caught, pk.resume(t, store=local_store) as run:
        step("a")
        run.abort()
    assert caught.value.reason is None and run.status == "compensated"
    with pytest.raises(pk.ConfigurationError):
        run.abort(5)  # type: ignore[arg-type]


class Trip(pk.State, name="tests.test_saga.Trip"):
    legs: Annotated[list[str], pk.append] = []
    total: int = 0


@pk.register
def crash_on_b(name: str) -> None:
    if name in CRASH:
        CRASH.discard(name)
        raise _Crash(name)
    run = pk.current_run()
    assert run is not None
    run.state.total -= 1  # a compensation may change the state: it commits with its record
    CALLS.append(("undo", name))


@pk.checkpointed
def leg(name: str) -> str:
    run = pk.current_run()
    assert run is not None
    run.state.legs.append(name)
    run.state.total += 1
    pk.compensate(crash_on_b, name)
    return name


def test_typed_state_encrypted_and_sealed_store_crash_mid_rollback(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/sealed.db"
    keys = {"encryption": pk.generate_key(), "integrity": pk.generate_key()}
    t, r = _thread(), uuid.uuid4().hex
    CRASH.add("b")
    with pk.connect(url, **keys) as store, pytest.raises(_Crash), pk.resume(t, store=store, state=Trip, run_id=r):
        for n in "abc":
            leg(n)
        raise Boom("x")
    CALLS.clear()
    with pk.connect(url, **keys) as store:
        with pytest.raises(pk.RunCompensatedError), pk.resume(t, store=store, state=Trip, run_id=r):
            raise AssertionError("the block ran")
        assert CALLS == [("undo", "b"), ("undo", "a")]
        state = store.get_state(t, state=Trip)
        assert list(state.legs) == ["a", "b", "c"] and state.total == 0
        assert store.verify(t).ok
        assert store.history(t)[0].run_status == "compensated"


# -- what is refused ---------------------------------------------------------------------------


def _closure() -> Any:
    def inner() -> None: ...

    return inner


class _Holder:
    def method(self) -> None: ...


def _unregistered(name: str) -> None: ...


@pytest.mark.parametrize(
    "fn, says",
    [
        (lambda: None, "lambda"),
        (_closure(), "inside another function"),
        (_Holder().method, "bound method"),
        (functools.partial(undo, 1), "functools.partial"),
        (os.getcwd, "not a Python function of your code"),
        (shutil.rmtree, "standard library"),
        (_unregistered, "not registered"),
        ("undo", "expected a function"),
    ],
    ids=["lambda", "closure", "bound-method", "partial", "builtin", "stdlib", "unregistered", "not-callable"],
)
def test_functions_that_cannot_be_stored_are_refused(local_store: pk.Store, fn: Any, says: str) -> None:
    with pytest.raises(pk.ConfigurationError, match=says), pk.resume(_thread(), store=local_store):
        step("a", fn=fn)
    assert not [c for c in CALLS if c[0] == "undo"]


def test_other_refusals(local_store: pk.Store) -> None:
    with pytest.raises(pk.ConfigurationError, match=r"outside a @pk\.checkpointed step"), pk.resume(_thread(), store=local_store):
        pk.compensate(undo)
    with pytest.raises(pk.ConfigurationError, match="on= exception classes"), pk.resume(_thread(), store=local_store):
        step("a", retry=pk.Retry(on=lambda e: True))
    with pytest.raises(pk.ConfigurationError, match="retry= expects"), pk.resume(_thread(), store=local_store):
        step("a", retry=3)
    with pytest.raises(pk.SerializationError, match="cannot be stored with the step"), pk.resume(_thread(), store=local_store):
        step("a", lock=threading.Lock())
    with pytest.raises(pk.ConfigurationError, match="lambda"):
        pk.checkpointed(compensate=lambda r: None)(lambda: None)
    with pytest.raises(pk.ConfigurationError, match="lambda"):
        pk.compensate(lambda: None)  # refused outside a block too
    pk.compensate(undo, 1)  # outside a block: nothing to undo, nothing happens
    CALLS.clear()
    assert step("plain") == "plain" and CALLS == [("step", "plain")]


def test_errors_pickle_and_say_what_to_do() -> None:
    errors = [
        pk.CompensationError("m", thread_id="t", run_id="r", undone=["a"], not_undone=[("b", "E: x")], failure="F"),
        pk.RunCompensatedError("m", thread_id="t", run_id="r", failure="F"),
        pk.RunAbortedError("m", thread_id="t", run_id="r", reason="why"),
    ]
    for err in errors:
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and vars(back) == vars(err) and str(back) == "m"
        assert not err.retryable


def test_records_with_malformed_saga_keys_are_refused() -> None:
    base = {"k": "step", "p": "0", "n": "x", "s": "completed"}
    assert _check_body({**base, "cp": [{"f": "m:f"}], "cb": [["0", 0]], "ce": {}}) is None
    for bad in ({"cp": "x"}, {"cp": [{"a": 1}]}, {"cb": [["0", "0"]]}, {"cb": [[0, 0]]}, {"ce": []}):
        assert _check_body({**base, **bad}) is not None


# -- found from outside: a compensation that asks, a compensation with an effect ------------

_ASKED: list[str] = []


@pk.register
def _undo_ask(x: str) -> None:
    _ASKED.append(f"ask {x}")
    if pk.suspend({"refund?": x}, answer_type=bool):
        _ASKED.append(f"refunded {x}")


@pk.register
def _undo_notify(x: str) -> None:
    pk.after_commit(_notify, f"undone {x}")


@pk.register
def _notify(text: str) -> None:
    _ASKED.append(text)


@pk.checkpointed(name="saga.book_for")
def _book_for(x: str, undo: str) -> str:
    pk.compensate(_undo_ask if undo == "ask" else _undo_notify, x)
    return x


@pk.checkpointed(name="saga.declined")
def _declined() -> None:
    raise ValueError("declined")


def test_a_compensation_that_asks_suspends_the_rollback_cleanly(local_store: pk.Store) -> None:
    _ASKED.clear()
    t = f"ask-{uuid.uuid4().hex[:8]}"

    def block() -> pk.Run:
        with pk.resume(t, store=local_store, run_id="r1") as run:
            _book_for("B1", "ask")
            _declined()
        return run

    assert block().status == "suspended" and _ASKED == ["ask B1"]  # pk.Suspended did not escape
    local_store.answer(t, True)
    with pytest.raises(pk.RunCompensatedError):  # the resume finishes the rollback
        block()
    assert _ASKED == ["ask B1", "ask B1", "refunded B1"]
    assert local_store.history(t)[0].run_status == "compensated"


def test_an_effect_registered_by_a_compensation_runs_after_its_commit(local_store: pk.Store) -> None:
    _ASKED.clear()
    t = f"notify-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ValueError), pk.resume(t, store=local_store):
        _book_for("B2", "notify")
        _declined()
    assert _ASKED == ["undone B2"]
    assert local_store.drain_outbox(thread_id=t, dry_run=True).pending == ()
