"""``pk.resume(unfinished_timeout=)``: a turn that waits for another turn's unfinished run gives
its place (and, on a job queue, its worker slot) back instead of waiting up to ``busy_timeout``
(issue #34, 3b: after a crash, the later turns of a thread filled every pool process waiting for a
crashed run whose redelivery then had no process to run in).

The crashed run here is a block that ended with a ``pk.RetryableError`` after a committed step:
it stays unfinished, exactly as a block whose process died.
"""

from __future__ import annotations

import asyncio
import math
import pickle
import time

import pytest
from conftest import uid

import persistkit as pk
from persistkit.coordination import _lease


@pk.checkpointed(name="unfinished.step")
def step(i: int) -> int:
    return i


def _crash(store: pk.Store, thread: str, run_id: str) -> None:
    """Leave ``run_id`` unfinished on ``thread`` with one committed step."""
    with pytest.raises(pk.BackendUnavailableError), pk.resume(thread, store=store, run_id=run_id):
        step(0)
        raise pk.BackendUnavailableError("the store went away (simulated)")


def _lease_of(store: pk.Store, thread: str) -> pk.LeaseInfo:
    [found] = [lease for lease in store.leases(prefix=thread) if lease.thread_id == thread]
    return found


def test_a_turn_waiting_for_a_crashed_run_gives_its_place_back_then_runs_after_it(store: pk.Store) -> None:
    t = uid("yield")
    _crash(store, t, "turn-0")
    started = time.monotonic()
    with pytest.raises(pk.ThreadBusyError) as gave, pk.resume(
        t, store=store, run_id="turn-1", unfinished_timeout=0.2, busy_timeout=60
    ):
        step(1)
    assert time.monotonic() - started < 30  # not busy_timeout
    err = gave.value
    assert err.unfinished_run == "turn-0" and err.retryable and err.holder is None
    assert err.retry_after is not None and 1.0 <= err.retry_after <= 1.5
    assert "unfinished_timeout=0.2" in str(err) and "err.retry_after" in str(err)
    lease = _lease_of(store, t)
    assert lease.reserved_for == "turn-0" and lease.waiting == ()  # it left the queue: nobody waits in a slot
    # the crashed run's redelivery goes first, then the turn that gave way runs
    with pk.resume(t, store=store, run_id="turn-0") as run:
        assert step(0) == 0 and len(run.replayed) == 1
    with pk.resume(t, store=store, run_id="turn-1", unfinished_timeout=0.2):
        step(1)
    assert [c.run_id for c in store.history(t) if c.kind == "end"] == ["turn-1", "turn-0"]


def test_a_bound_longer_than_the_first_in_lines_rechecks_still_ends_its_wait(local_store: pk.Store) -> None:
    """The first in line looks at a reserved thread every second (_RECHECK); each look used to
    start its wait again, so a bound above a second never ran out (found in the Celery test)."""
    t = uid("recheck")
    _crash(local_store, t, "turn-0")
    bound = _lease._RECHECK * 1.5
    with pytest.raises(pk.ThreadBusyError) as gave, pk.resume(
        t, store=local_store, run_id="turn-1", unfinished_timeout=bound, busy_timeout=bound * 6
    ):
        pass
    assert gave.value.retry_after is not None, gave.value  # gave way, not busy_timeout


def test_without_it_a_turn_waits_for_the_crashed_run_up_to_busy_timeout(local_store: pk.Store) -> None:
    t = uid("wait")
    _crash(local_store, t, "turn-0")
    started = time.monotonic()
    with pytest.raises(pk.ThreadBusyError, match=r"busy_timeout=0\.5") as busy, pk.resume(
        t, store=local_store, run_id="turn-1", busy_timeout=0.5
    ):
        step(1)
    assert time.monotonic() - started >= 0.5
    assert busy.value.unfinished_run == "turn-0" and busy.value.retry_after is None


def test_every_waiting_turn_leaves_the_queue_and_none_waits_longer_than_its_bound(local_store: pk.Store) -> None:
    t = uid("many")
    _crash(local_store, t, "turn-0")

    async def turn(i: int) -> pk.ThreadBusyError:
        try:
            async with pk.resume(t, store=local_store, run_id=f"turn-{i}", unfinished_timeout=0.3, busy_timeout=60):
                raise AssertionError("a turn started on top of the crashed run")
        except pk.ThreadBusyError as exc:
            return exc

    async def main() -> list[pk.ThreadBusyError]:
        return await asyncio.gather(*(turn(i) for i in range(1, 5)))

    started = time.monotonic()
    errors = asyncio.run(main())
    assert time.monotonic() - started < 30
    assert {e.unfinished_run for e in errors} == {"turn-0"} and all(e.retry_after for e in errors)
    lease = _lease_of(local_store, t)
    assert lease.reserved_for == "turn-0" and lease.waiting == ()


def test_a_run_finished_some_other_way_frees_the_turns_that_give_way(local_store: pk.Store) -> None:
    """The reservation outlives a run finished by store.update_state: the first in line looks at
    the thread before it gives way, so turns never bounce off it for ever."""
    t = uid("look")
    _crash(local_store, t, "turn-0")
    with pytest.raises(pk.ThreadBusyError), pk.resume(t, store=local_store, run_id="turn-1", unfinished_timeout=0):
        pass
    local_store.update_state(t, {"note": "finished by hand"})
    assert _lease_of(local_store, t).reserved_for == "turn-0"
    with pk.resume(t, store=local_store, run_id="turn-1", unfinished_timeout=0) as run:
        step(1)
    assert run.run_id == "turn-1"
    assert _lease_of(local_store, t).reserved_for is None


def test_the_redelivery_itself_and_a_free_thread_are_not_affected(local_store: pk.Store) -> None:
    t = uid("own")
    with pk.resume(t, store=local_store, run_id="a", unfinished_timeout=0):  # nothing unfinished
        step(0)
    _crash(local_store, t, "b")
    with pytest.raises(pk.ThreadBusyError), pk.resume(t, store=local_store, run_id="c", unfinished_timeout=0):
        pass
    with pk.resume(t, store=local_store, run_id="b", unfinished_timeout=0) as run:  # its own reservation
        step(0)
    assert len(run.replayed) == 1


def test_busy_wait_gives_way_too(local_store: pk.Store) -> None:
    t = uid("waitpolicy")
    _crash(local_store, t, "turn-0")
    with pytest.raises(pk.ThreadBusyError) as gave, pk.resume(
        t, store=local_store, run_id="turn-1", busy="wait", unfinished_timeout=0.1, busy_timeout=60
    ):
        pass
    assert gave.value.unfinished_run == "turn-0" and gave.value.retry_after is not None


def test_the_async_block_gives_way_too(local_store: pk.Store) -> None:
    t = uid("async")
    _crash(local_store, t, "turn-0")

    async def main() -> None:
        async with pk.resume(t, store=local_store, run_id="turn-1", unfinished_timeout=0.1):
            pass

    with pytest.raises(pk.ThreadBusyError) as gave:
        asyncio.run(main())
    assert gave.value.unfinished_run == "turn-0" and gave.value.retry_after is not None


def test_retry_after_grows_with_how_long_the_thread_has_waited() -> None:
    st = _lease._State(reserved="r", since=["r", 1000.0])
    soon = _lease._gave_way("t", st, "me", 1.0, 1001.0).retry_after
    later = _lease._gave_way("t", st, "me", 1.0, 1000.0 + 200).retry_after
    much_later = _lease._gave_way("t", st, "me", 1.0, 1000.0 + 86400).retry_after
    assert soon is not None and later is not None and much_later is not None
    assert 1.0 <= soon <= 1.5 and 50.0 <= later <= 60.0 and much_later == 60.0
    other = _lease._State(reserved="r", since=["another run", 0.0])  # not this reservation's: unknown
    assert (_lease._gave_way("t", other, "me", 1.0, 1e9).retry_after or 0) <= 1.5


def test_retry_after_survives_pickling_and_other_errors_have_none() -> None:
    err = pk.ThreadBusyError("busy", thread_id="t", unfinished_run="r", retry_after=2.5)
    again = pickle.loads(pickle.dumps(err))
    assert again.retry_after == 2.5 and again.unfinished_run == "r"
    assert pk.BackendUnavailableError("down").retry_after is None
    assert pk.ThreadBusyError("busy").retry_after is None


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"unfinished_timeout": -1}, "give seconds >= 0"),
        ({"unfinished_timeout": math.nan}, "give seconds >= 0"),
        ({"unfinished_timeout": math.inf}, "or None to wait up to busy_timeout"),
        ({"unfinished_timeout": True}, "give seconds >= 0"),
        ({"unfinished_timeout": "1"}, "give seconds >= 0"),
        ({"unfinished_timeout": 1, "busy": None}, "busy=None takes no lease"),
        ({"unfinished_timeout": 1, "busy": "reject"}, "busy='reject' raises at once"),
    ],
)
def test_a_bad_unfinished_timeout_is_a_configuration_error(options: dict[str, object], says: str) -> None:
    with pytest.raises(pk.ConfigurationError, match=r"unfinished_timeout=") as bad:
        pk.resume("t", **options)  # type: ignore[arg-type]
    assert says in str(bad.value)


def test_a_thread_lease_gives_way_too(local_store: pk.Store) -> None:
    """pk.ThreadLease (an adapter's turn, e.g. LangGraph's durable_invoke) takes the same option."""
    t = uid("tlease")
    _crash(local_store, t, "turn-0")
    lease = pk.ThreadLease(local_store, t, run_id="turn-1", unfinished_timeout=0.2, busy_timeout=60)
    lease.acquire()
    started = time.monotonic()
    with pytest.raises(pk.ThreadBusyError) as gave:
        lease.wait_for("turn-0", "the adapter's records say turn-0 did not finish")
    assert time.monotonic() - started < 30
    assert gave.value.unfinished_run == "turn-0" and gave.value.retry_after is not None
    assert not lease.held and _lease_of(local_store, t).waiting == ()
    lease.release()  # nothing held: nothing to do
    with pytest.raises(pk.ConfigurationError, match="unfinished_timeout"):
        pk.ThreadLease(local_store, t, busy="reject", unfinished_timeout=1)
