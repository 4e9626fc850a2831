"""Conformance checks for sagas on a store (``pk.compensate``, ``run.abort``, the rollback).

Mix :class:`SagaConformance` into a test class that provides a ``persistkit_url`` fixture
(a fresh store per test; ``backend_options`` optionally, as for the lease suite)::

    from persistkit.testing.saga_suite import SagaConformance

    class TestMyStoreSagas(SagaConformance):
        @pytest.fixture
        def persistkit_url(self) -> str:
            return "mystore://..."

What it checks, sync and async: a run that fails for good runs the compensations of its
completed steps in reverse order, each once and each a recorded step, before its end record
(``compensated``); its redelivery runs nothing; a rollback interrupted by a crash is finished
by the next resume (never the block, no compensation twice); a compensation that fails is
retried, and one that fails for good is reported by one ``CompensationError`` and retried by
a later resume; a run with nothing to undo ends as before; other turns wait for a run that
is rolling back. Each check uses fresh ``pk.connect`` instances of the store ("processes").
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from .._errors import CompensationError, RunAbortedError, RunCompensatedError, ThreadBusyError
from .._retry import Retry
from ..codec._versions import register
from ..engine._api import checkpointed, current_run, current_step, resume
from ..engine._saga import compensate
from ..engine._store import Store
from ._stores import TwoStores

__all__ = ["SagaConformance"]

#: What ran, in order: forward step bodies ("book:x") and compensations ("undo:x").
LOG: list[str] = []
#: Compensations told to fail: name -> how many more calls raise (-1: always).
FAILING: dict[str, int] = {}
#: Compensations that "crash the process" (raise a BaseException) on their next call.
CRASHING: set[str] = set()


class _Crash(BaseException):
    """Stands for a process that dies: nothing is recorded for what was in flight."""


class Declined(Exception):
    """The forward failure the runs below end with."""


#: The policy of the compensations below: two attempts, no waits (the checks never wait on time).
_QUICK = Retry(attempts=2, wait_initial=0.0, wait_max=0.0, wait_jitter=0.0)


@register
def undo(name: str) -> str:
    """A compensation: logs itself; fails or "crashes" when told to."""
    if name in CRASHING:
        CRASHING.discard(name)
        raise _Crash(name)
    left = FAILING.get(name, 0)
    if left:
        FAILING[name] = left - 1
        raise ConnectionError(f"cannot undo {name} now")
    step = current_step()
    assert step is not None and step.position.startswith("c/"), "a compensation runs as a step in its own scope"
    LOG.append(f"undo:{name}")
    return name


@register
async def aundo(name: str) -> str:
    await asyncio.sleep(0)
    return undo(name)


def undo_result(result: dict[str, Any]) -> None:
    LOG.append(f"undo:{result['booked']}")


@checkpointed
def book(name: str) -> str:
    LOG.append(f"book:{name}")
    compensate(undo, name, retry=_QUICK)
    return name


@checkpointed
async def abook(name: str) -> str:
    LOG.append(f"book:{name}")
    compensate(aundo, name, retry=Retry(attempts=3, wait_initial=0.0, wait_max=0.0, wait_jitter=0.0))
    return name


@checkpointed(compensate=undo_result)
def reserve(name: str) -> dict[str, Any]:
    LOG.append(f"book:{name}")
    return {"booked": name}


@checkpointed
def fail(why: str) -> None:
    LOG.append(f"fail:{why}")
    raise Declined(why)


@checkpointed
def plain(name: str) -> str:
    LOG.append(f"book:{name}")
    return name


def _saga(store: Store, thread: str, run_id: str, names: list[str], **kw: Any) -> None:
    with resume(thread, store=store, run_id=run_id, **kw):
        for n in names:
            book(n)
        fail("card declined")


class SagaConformance(TwoStores):
    """Mix into a test class that provides ``persistkit_url``."""

    @pytest.fixture
    def saga_stores(self, stores: tuple[Store, Store]) -> tuple[Store, Store]:
        """The two stores, with this module's records of what ran cleared."""
        LOG.clear()
        FAILING.clear()
        CRASHING.clear()
        return stores

    @staticmethod
    def saga_thread() -> str:
        return f"saga-{uuid.uuid4().hex[:10]}"

    # -- the rollback --------------------------------------------------------------------

    def test_saga_rollback_runs_in_reverse_each_once_then_compensated(self, saga_stores: tuple[Store, Store]) -> None:
        one, two = saga_stores
        t, r = self.saga_thread(), uuid.uuid4().hex
        with pytest.raises(Declined) as caught:
            _saga(one, t, r, ["flight", "hotel", "car"])
        assert LOG == ["book:flight", "book:hotel", "book:car", "fail:card declined",
                       "undo:car", "undo:hotel", "undo:flight"]
        assert any("rolled back" in n for n in getattr(caught.value, "__notes__", []))
        hist = one.history(t)
        assert (hist[0].kind, hist[0].run_status) == ("end", "compensated")
        comps = [c for c in reversed(hist) if c.position and c.position.startswith("c")]
        assert [(c.position, c.status, c.run_status) for c in comps] == [
            ("c", "completed", "compensating"), ("c/0", "completed", "compensating"),
            ("c/1", "completed", "compensating"), ("c/2", "completed", "compensating"),
        ]
        # a redelivery runs nothing, in another process too; a turn without run_id starts anew
        LOG.clear()
        with pytest.raises(RunCompensatedError) as again:
            _saga(two, t, r, ["flight", "hotel", "car"])
        assert again.value.run_id == r and "Declined" in again.value.failure
        assert LOG == []
        with resume(t, store=two) as fresh:
            plain("next")
        assert fresh.run_id != r and fresh.status == "completed" and LOG == ["book:next"]
        # ... even while another turn holds the thread: it is known finished, nothing waits
        if two.backend.supports_leases:  # a store without lease primitives has no turns to hold
            with resume(t, store=one, run_id=uuid.uuid4().hex), pytest.raises(RunCompensatedError):
                _saga(two, t, r, ["flight"], busy="reject")

    def test_saga_async_rollback(self, saga_stores: tuple[Store, Store]) -> None:
        one, _ = saga_stores
        t = self.saga_thread()

        async def main() -> Any:
            async with resume(t, store=one) as run:
                await abook("a")
                await abook("b")
                raise Declined("later")
            return run  # pragma: no cover

        FAILING["b"] = 2  # fails twice, then succeeds within its retry=Retry(attempts=3)
        with pytest.raises(Declined):
            asyncio.run(main())
        assert LOG == ["book:a", "book:b", "undo:b", "undo:a"]
        assert one.history(t)[0].run_status == "compensated"

    def test_saga_decorator_undo_gets_the_result_and_abort_fails_for_good(self, saga_stores: tuple[Store, Store]) -> None:
        one, _ = saga_stores
        t = self.saga_thread()
        with pytest.raises(RunAbortedError) as caught, resume(t, store=one) as run:
            reserve("room")
            book("taxi")
            run.abort("customer cancelled")
        assert caught.value.reason == "customer cancelled"
        assert LOG == ["book:room", "book:taxi", "undo:taxi", "undo:room"]
        assert run.status == "compensated"

    def test_saga_nothing_to_undo_ends_as_before(self, saga_stores: tuple[Store, Store]) -> None:
        one, _ = saga_stores
        t, r = self.saga_thread(), uuid.uuid4().hex
        with pytest.raises(Declined), resume(t, store=one, run_id=r) as run:
            plain("x")
            fail("no")
        assert run.status == "failed" and one.history(t)[0].run_status == "failed"
        assert [c.position for c in one.history(t) if c.position] == ["1", "0"]
        LOG.clear()
        # a failed run's redelivery continues it, as always
        with pytest.raises(Declined), resume(t, store=one, run_id=r):
            plain("x")
            fail("no")
        assert LOG == ["fail:no"]

    def test_saga_a_failed_step_leaves_no_undo(self, saga_stores: tuple[Store, Store]) -> None:
        one, _ = saga_stores
        t = self.saga_thread()

        with pytest.raises(Declined), resume(t, store=one):
            book("kept")
            _registers_then_fails()
        assert LOG == ["book:kept", "book:dropped", "undo:kept"]

    # -- crashes and failures during the rollback -----------------------------------------

    def test_saga_crash_mid_rollback_is_finished_by_the_next_resume(self, saga_stores: tuple[Store, Store]) -> None:
        one, two = saga_stores
        t, r = self.saga_thread(), uuid.uuid4().hex
        CRASHING.add("b")  # the process dies while undoing b: c is undone, a and b are not
        with pytest.raises(_Crash):
            _saga(one, t, r, ["a", "b", "c"])
        assert LOG[-1] == "undo:c"
        assert one.history(t)[0].run_status == "compensating"
        LOG.clear()
        # without run_id, the thread's unfinished run continues: the rollback finishes, the block does not run
        with pytest.raises(RunCompensatedError), resume(t, store=two):
            raise AssertionError("the forward path of a rolled-back run ran again")
        assert LOG == ["undo:b", "undo:a"]
        assert two.history(t)[0].run_status == "compensated"

    def test_saga_a_compensation_that_fails_for_good(self, saga_stores: tuple[Store, Store]) -> None:
        one, two = saga_stores
        t, r = self.saga_thread(), uuid.uuid4().hex
        FAILING["b"] = -1
        with pytest.raises(CompensationError) as caught:
            _saga(one, t, r, ["a", "b", "c"], busy="reject" if one.backend.supports_leases else None)
        err = caught.value
        assert isinstance(err.__cause__, Declined) and "card declined" in err.failure
        assert [u.split(" ")[0] for u in err.undone] == [f"{undo.__module__}:undo"] * 2
        assert len(err.not_undone) == 1 and "'book' at 1" in err.not_undone[0][0]
        assert "ConnectionError" in err.not_undone[0][1]
        assert LOG[-2:] == ["undo:c", "undo:a"]
        assert one.history(t)[0].run_status == "compensating"
        # the thread's other turns wait for it, as for a crashed run (turns need leases)
        if two.backend.supports_leases:
            with pytest.raises(ThreadBusyError) as busy, resume(t, store=two, run_id=uuid.uuid4().hex, busy="reject"):
                plain("other turn")
            assert busy.value.unfinished_run == r
        # once the cause is fixed, a resume retries only what is not undone
        FAILING.clear()
        LOG.clear()
        with pytest.raises(RunCompensatedError):
            _saga(two, t, r, ["a", "b", "c"])
        assert LOG == ["undo:b"]
        assert two.history(t)[0].run_status == "compensated"

    def test_saga_a_rolling_back_run_can_be_abandoned(self, saga_stores: tuple[Store, Store]) -> None:
        one, two = saga_stores
        t, r = self.saga_thread(), uuid.uuid4().hex
        FAILING["a"] = -1
        with pytest.raises(CompensationError):
            _saga(one, t, r, ["a"])
        two.abandon(t, r)
        LOG.clear()
        with resume(t, store=two) as nxt:
            plain("after")
        assert nxt.run_id != r and LOG == ["book:after"]


@checkpointed
def _registers_then_fails() -> None:
    LOG.append("book:dropped")
    compensate(undo, "dropped")
    run = current_run()
    assert run is not None
    raise Declined("after registering")
