"""pk.ThreadLease: the lease pk.resume takes, held around work that is not a resume block."""

from __future__ import annotations

import asyncio

import pytest
from conftest import make_url, uid

import persistkit as pk


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> pk.Store:
    s = pk.connect(make_url(request.param, request, tmp_path_factory))
    request.addfinalizer(s.close)
    return s


def test_one_holder_at_a_time_and_writes_fenced(store: pk.Store) -> None:
    thread = uid("tl")
    first = pk.ThreadLease(store, thread, run_id="A", busy="reject")
    first.acquire()
    assert first.held
    with first.fenced():
        store.update_state(thread, {"n": 1})
    second = pk.ThreadLease(store, thread, run_id="B", busy="reject")
    with pytest.raises(pk.ThreadBusyError) as err:
        second.acquire()
    assert not second.held and err.value.unfinished_run is None
    assert store.leases(prefix=thread)[0].held
    first.release()
    assert not first.held
    second.acquire()
    second.release()


def test_wait_for_an_unfinished_run_reserves_the_lease_for_it(store: pk.Store) -> None:
    thread = uid("tl")
    turn = pk.ThreadLease(store, thread, run_id="B", busy="queue", busy_timeout=0.3)
    turn.acquire()
    with pytest.raises(pk.ThreadBusyError) as err:
        turn.wait_for("A")  # nobody continues A: the wait ends at busy_timeout
    assert err.value.unfinished_run == "A" and not turn.held
    assert store.leases(prefix=thread)[0].reserved_for == "A"
    other = pk.ThreadLease(store, thread, run_id="C", busy="reject")
    with pytest.raises(pk.ThreadBusyError, match="did not finish"):
        other.acquire()  # reserved for A: another turn does not take it
    redelivery = pk.ThreadLease(store, thread, run_id="A", busy="reject")
    redelivery.acquire()  # A's redelivery does
    redelivery.release()

    async def rejecting() -> None:
        lease = pk.ThreadLease(store, thread, run_id="D", busy="reject")
        await lease.aacquire()
        try:
            with pytest.raises(pk.ThreadBusyError) as err:
                await lease.await_for("A")
            assert err.value.unfinished_run == "A"
        finally:
            await lease.arelease()

    asyncio.run(rejecting())


def test_bad_options_are_configuration_errors(store: pk.Store) -> None:
    for kwargs in ({"busy": "later"}, {"lease_ttl": 0}, {"busy_timeout": -1}, {"busy_timeout": float("nan")}):
        with pytest.raises(pk.ConfigurationError):
            pk.ThreadLease(store, "t", **kwargs)


def test_misuse_is_a_clear_error_at_once(store: pk.Store) -> None:
    lease = pk.ThreadLease(store, "misuse", busy="queue", busy_timeout=60)
    lease.release()  # idempotent: nothing held, nothing to do
    with pytest.raises(pk.ConfigurationError, match="before acquire"), lease.fenced():
        pass
    with pytest.raises(pk.ConfigurationError, match="before acquire"):
        lease.wait_for("A")
    lease.acquire()
    try:
        with pytest.raises(pk.ConfigurationError, match="acquired already"):
            lease.acquire()  # at once, not after busy_timeout=60 waiting for itself
        assert lease.held
    finally:
        lease.release()
    lease.release()
    with pytest.raises(pk.ConfigurationError, match="after release"), lease.fenced():
        pass
    lease.acquire()  # acquire, release, acquire again: fine
    lease.release()
    for bad in ({"thread_id": ""}, {"thread_id": "t", "namespace": None}):
        with pytest.raises(pk.ConfigurationError):
            pk.ThreadLease(store, **bad)  # type: ignore[arg-type]


def test_waiting_for_a_run_the_store_does_not_know_says_so(store: pk.Store) -> None:
    lease = pk.ThreadLease(store, "unknown-run", run_id="B", busy="reject")
    lease.acquire()
    try:
        with pytest.raises(pk.ThreadBusyError, match="unknown here") as err:
            lease.wait_for("nope")
        assert err.value.unfinished_run == "nope" and "did not finish" not in str(err.value)
    finally:
        lease.release()

    async def main() -> None:
        again = pk.ThreadLease(store, "unknown-run-2", run_id="B", busy="queue", busy_timeout=0)
        await again.aacquire()
        try:
            with pytest.raises(pk.ThreadBusyError, match="unknown here"):
                await again.await_for("nope")
            with pytest.raises(pk.ConfigurationError, match="before acquire"), again.fenced():
                pass  # the failed wait holds nothing: no write may go out as if fenced
        finally:
            await again.arelease()

    asyncio.run(main())


def test_a_slot_taken_with_the_lease_is_given_up_with_it(store: pk.Store) -> None:
    """``ThreadLease(concurrency=)``: the limit is checked at once; ``take_slot()`` takes a slot
    of the key (a second holding under limit 1 and busy='reject' is refused with
    ConcurrencyLimitError), ``wait_for`` and ``release()`` give it up; before ``acquire()`` it
    is a ConfigurationError."""
    key = uid("tenant")
    limit = ("tenant", key, 1)
    for bad in (("tenant", key, 0), ("tenant", "", 1), "tenant"):
        with pytest.raises(pk.ConfigurationError, match="concurrency="):
            pk.ThreadLease(store, "t", concurrency=bad)
    with pytest.raises(pk.ConfigurationError, match="busy=None"):
        pk.ThreadLease(store, "t", busy=None, concurrency=limit)
    first = pk.ThreadLease(store, uid("slot-a"), busy="reject", concurrency=limit)
    with pytest.raises(pk.ConfigurationError, match="before acquire"):
        first.take_slot()
    first.acquire()
    try:
        first.take_slot()
        first.take_slot()  # held already: nothing more
        info = pk.Concurrency(*limit).info(store)
        assert info is not None and len(info.holders) == 1
        second = pk.ThreadLease(store, uid("slot-b"), busy="reject", concurrency=limit)
        second.acquire()
        try:
            with pytest.raises(pk.ConcurrencyLimitError) as refused:
                second.take_slot()
            assert refused.value.limit == "tenant" and refused.value.capacity == 1
        finally:
            second.release()
    finally:
        first.release()
    info = pk.Concurrency(*limit).info(store)
    assert info is not None and info.holders == ()

    async def in_async() -> None:
        lease = pk.ThreadLease(store, uid("slot-c"), busy="reject", concurrency=limit)
        await lease.aacquire()
        try:
            await lease.atake_slot()
            held = await pk.Concurrency(*limit).ainfo(store)
            assert held is not None and len(held.holders) == 1
        finally:
            await lease.arelease()

    asyncio.run(in_async())
    assert pk.Concurrency(*limit).info(store).holders == ()  # type: ignore[union-attr]
