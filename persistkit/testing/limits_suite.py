"""Conformance checks for shared rate limits (``store.limits``, ``limit=``, ``pk.limited``;
docs/flow-control.md).

Subclass :class:`LimitsConformance` with a ``persistkit_url`` fixture (any store with the
``kv`` capability). Time is a fake clock that the draws' sleeps advance, so every check is
exact and none reads the wall clock: the GCRA admits ``burst`` calls at once and then one per
interval; keys are independent buckets; a draw costs ``tokens``; threads on their own store
handles racing for one bucket never admit more than the burst (compare-and-swap); a throttle
written through another handle holds back draws, and voids the reservation of a call already
waiting; a replayed step never draws; bad input is refused with a clear error; async twins.
Limit names are unique per check: stores that share a schema between tests (PostgreSQL) keep
each check's limits apart.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from .._errors import ConfigurationError, LimitNotFoundError, RateLimitedError, RetryableError
from .._io import Sleep
from ..engine._api import checkpointed, resume
from ..engine._flow import limited, throttle
from ..engine._store import Store, connect

__all__ = ["FakeClock", "LimitsConformance"]


class FakeClock:
    """A clock that only sleeps move: ``now`` for ``Limits.clock``, ``sleep``/``asleep`` for its waits."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.t = start
        self.slept: list[float] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.slept.append(seconds)
            self.t += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)

    def install(self, store: Store) -> Store:
        lim = store.limits
        lim.clock, lim.sleep, lim.asleep = self.now, self.sleep, self.asleep
        return store


def _name(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}"


class LimitsConformance:
    """The shared rate limit checks; needs ``persistkit_url`` (a store with ``kv``)."""

    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest.fixture
    def store(self, persistkit_url: str, clock: FakeClock) -> Iterator[Store]:
        s = clock.install(connect(persistkit_url))
        yield s
        s.close()

    # -- the algorithm -----------------------------------------------------------------------

    def test_burst_then_one_per_interval(self, store: Store, clock: FakeClock) -> None:
        name = _name("gcra")
        store.limits.set(name, rate="10/s", burst=3)
        t0 = clock.t
        starts = []
        for _ in range(8):
            store.limits.acquire(name)
            starts.append(round(clock.t - t0, 6))
        assert starts == [0.0, 0.0, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
        info = store.limits.get(name)
        assert info is not None and info.available == 0 and info.in_use == 3
        clock.t += 10  # a quiet stretch refills the bucket to its burst, never above it
        info = store.limits.get(name)
        assert info is not None and info.available == 3 and info.waiting == 0

    def test_any_window_holds_at_most_burst_plus_rate(self, store: Store, clock: FakeClock) -> None:
        name = _name("window")
        store.limits.set(name, rate="50/min", burst=5)
        starts = []
        for i in range(60):
            store.limits.acquire(name)
            starts.append(clock.t)
            if i % 7 == 0:
                clock.t += 0.5  # irregular arrivals
        for i, a in enumerate(starts):
            for width in (1.0, 6.0, 30.0):
                inside = sum(1 for b in starts[i:] if b < a + width)
                assert inside <= 5 + width * 50 / 60 + 1e-9, (width, inside)

    def test_keys_are_separate_buckets(self, store: Store, clock: FakeClock) -> None:
        name = _name("keys")
        store.limits.set(name, rate="1/min", burst=1, timeout=0)
        store.limits.acquire(name, key="tenant-a")
        store.limits.acquire(name, key="tenant-b")
        store.limits.acquire(name, key=7)
        with pytest.raises(RateLimitedError) as err:
            store.limits.acquire(name, key="tenant-a")
        assert err.value.limit == name and err.value.key == "tenant-a"
        assert err.value.retry_after == pytest.approx(60.0, abs=1e-3)
        keys = sorted(i.key for i in store.limits.list() if i.name == name)
        assert keys == ["7", "tenant-a", "tenant-b"]

    def test_tokens_per_call_and_tokens(self, store: Store, clock: FakeClock) -> None:
        name = _name("tokens")
        store.limits.set(name, rate="100/s", burst=10, tokens_per_call=4, timeout=0)
        assert store.limits.acquire(name).tokens == 4
        assert store.limits.acquire(name, tokens=6).tokens == 6
        with pytest.raises(RateLimitedError):
            store.limits.acquire(name, tokens=1)
        clock.t += 0.04  # four tokens' worth of time
        store.limits.acquire(name)
        with pytest.raises(ConfigurationError, match="can never fit"):
            store.limits.acquire(name, tokens=11)

    def test_a_call_waits_then_fails_after_its_timeout(
        self, store: Store, clock: FakeClock
    ) -> None:
        name = _name("timeout")
        store.limits.set(name, rate="1/s", burst=1, timeout=2.5)
        store.limits.acquire(name)
        assert store.limits.acquire(name).waited == pytest.approx(1.0)
        assert store.limits.acquire(name).waited == pytest.approx(1.0)
        for _ in range(2):  # a wait within the timeout is waited out
            assert store.limits.acquire(name, timeout=2.5).waited <= 2.5
        before = store.limits.get(name)
        with pytest.raises(RateLimitedError) as err:
            store.limits.acquire(name, timeout=0.5)
        assert isinstance(err.value, RetryableError) and err.value.retry_after == pytest.approx(1.0)
        after = store.limits.get(name)
        assert before == after  # a refused call drew nothing
        revived = pickle.loads(pickle.dumps(err.value))
        assert (revived.limit, revived.retry_after) == (name, err.value.retry_after)

    # -- many writers ------------------------------------------------------------------------

    def test_threads_on_their_own_handles_never_admit_more_than_the_burst(
        self, persistkit_url: str, clock: FakeClock
    ) -> None:
        name = _name("race")
        handles = [clock.install(connect(persistkit_url)) for _ in range(6)]
        try:
            handles[0].limits.set(name, rate="1/hour", burst=7, timeout=0)
            admitted: list[int] = []
            refused: list[int] = []
            barrier = threading.Barrier(len(handles))

            def worker(i: int) -> None:
                barrier.wait()
                for _ in range(4):
                    try:
                        handles[i].limits.acquire(name)
                    except RateLimitedError:
                        refused.append(i)
                    else:
                        admitted.append(i)

            threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(handles))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(admitted) == 7 and len(refused) == 24 - 7
        finally:
            for h in handles:
                h.close()

    # -- throttles -----------------------------------------------------------------------------

    def test_a_throttle_holds_back_every_handle(
        self, persistkit_url: str, store: Store, clock: FakeClock
    ) -> None:
        name = _name("throttle")
        store.limits.set(name, rate="10/s", burst=2)
        other = clock.install(connect(persistkit_url))
        try:
            other.limits.throttle(name, 30)
            info = store.limits.get(name)
            assert (
                info is not None
                and info.throttled_until == pytest.approx(clock.t + 30)
                and info.available == 0
            )
            t0 = clock.t
            store.limits.acquire(name)
            store.limits.acquire(name)  # the bucket starts full at the reset: its burst
            assert clock.t - t0 == pytest.approx(30)
            store.limits.acquire(name)
            assert clock.t - t0 == pytest.approx(30.1)
            other.limits.throttle(name, 1)
            other.limits.throttle(name, 0.5)  # a shorter one does not cut the longer short
            assert store.limits.get(name).throttled_until == pytest.approx(clock.t + 1)  # type: ignore[union-attr]
            with pytest.raises(RateLimitedError) as err:
                store.limits.acquire(name, timeout=0.2)
            assert err.value.retry_after == pytest.approx(1.0)
        finally:
            other.close()

    def test_a_throttle_voids_the_reservation_of_a_waiting_call(
        self, persistkit_url: str, store: Store, clock: FakeClock
    ) -> None:
        name = _name("voids")
        store.limits.set(name, rate="1/s", burst=1)
        store.limits.acquire(name)
        plan = store.limits.draw_plan(
            name, None, None, None
        )  # driven by hand: stop it while it waits
        req = next(plan)
        while not isinstance(req, Sleep):
            req = plan.send(store.call_sync(req))
        assert req.seconds == pytest.approx(1.0)
        throttle(name, 20, store=clock.install(connect(persistkit_url)))
        clock.sleep(req.seconds)
        req = plan.send(None)
        while not isinstance(req, Sleep):  # it read the throttle, and draws again
            req = plan.send(store.call_sync(req))
        assert req.seconds == pytest.approx(19.0)
        clock.sleep(req.seconds)
        with pytest.raises(StopIteration):
            req = plan.send(None)
            while True:
                assert not isinstance(req, Sleep)
                req = plan.send(store.call_sync(req))

    def _waiting(self, store: Store, name: str) -> tuple[Any, float]:
        """A draw of ``name`` driven by hand up to its sleep: (the plan, the seconds it waits)."""
        plan = store.limits.draw_plan(name, None, None, None)
        req = next(plan)
        while not isinstance(req, Sleep):
            req = plan.send(store.call_sync(req))
        return plan, req.seconds

    def _wakes(self, store: Store, plan: Any) -> float | None:
        """The plan after its sleep: the seconds of its next sleep, None if it drew."""
        try:
            req = plan.send(None)
            while not isinstance(req, Sleep):
                req = plan.send(store.call_sync(req))
        except StopIteration:
            return None
        return float(req.seconds)

    def test_a_delete_voids_the_reservation_of_a_waiting_call(
        self, persistkit_url: str, store: Store, clock: FakeClock
    ) -> None:
        """A call waiting when its limit is deleted raises LimitNotFoundError when it wakes; one
        whose limit was deleted and declared again draws again from the new bucket instead of
        starting on its old reservation beside the new bucket's burst (found from outside)."""
        name = _name("deleted")
        store.limits.set(name, rate="1/s", burst=1)
        store.limits.acquire(name)
        plan, wait = self._waiting(store, name)
        assert wait == pytest.approx(1.0)
        other = clock.install(connect(persistkit_url))
        try:
            assert other.limits.delete(name)
            clock.sleep(wait)
            with pytest.raises(LimitNotFoundError):
                self._wakes(store, plan)
            store.limits.set(name, rate="1/s", burst=1)
            store.limits.acquire(name)
            plan, wait = self._waiting(store, name)  # reserved t0 + 1 in this bucket
            other.limits.delete(name)
            other.limits.set(name, rate="1/s", burst=1)
            other.limits.acquire(name)  # the new bucket's burst: starts at t0
            other.limits.acquire(name)  # then t0 + 1: the clock moves there
            # the waiter's t0 + 1 was the old bucket's: it draws again, after the new ones
            assert self._wakes(store, plan) == pytest.approx(1.0)
        finally:
            other.close()

    def test_a_throttled_bucket_shows_no_phantom_use(self, store: Store, clock: FakeClock) -> None:
        """``in_use`` is read from the bucket's schedule alone: a throttled bucket nobody drew
        from shows 0 in use and 0 available, ``throttled_until`` saying why (found from outside:
        it showed the whole burst in use); a drawn one shows its draws until the throttle."""
        name = _name("phantom")
        store.limits.set(name, rate="10/s", burst=5)
        store.limits.throttle(name, 30, key="globex")
        idle = store.limits.get(name, key="globex")
        assert idle is not None and (idle.available, idle.in_use, idle.waiting) == (0, 0, 0)
        assert idle.throttled_until == pytest.approx(clock.t + 30)
        store.limits.acquire(name, key="acme")
        store.limits.acquire(name, key="acme")
        drawn = store.limits.get(name, key="acme")
        assert drawn is not None and (drawn.available, drawn.in_use) == (3, 2)
        clock.t += 0.1  # one token's worth of time
        drawn = store.limits.get(name, key="acme")
        assert drawn is not None and (drawn.available, drawn.in_use) == (4, 1)
        store.limits.throttle(name, 5, key="acme")
        held = store.limits.get(name, key="acme")
        assert held is not None and (held.available, held.in_use, held.waiting) == (0, 0, 0)
        clock.t += 30  # both resets passed: full buckets, nothing in use
        for key in ("acme", "globex"):
            info = store.limits.get(name, key=key)
            assert info is not None and (info.available, info.in_use) == (5, 0)

    # -- steps ---------------------------------------------------------------------------------

    def test_a_replayed_step_never_draws(self, store: Store, clock: FakeClock) -> None:
        name = _name("replay")
        store.limits.set(name, rate="1/hour", burst=2, timeout=0)
        calls: list[str] = []

        @checkpointed(name="limited.ask", limit=name)
        def ask(q: str) -> str:
            calls.append(q)
            return q.upper()

        thread = _name("thread")
        with resume(thread, store=store) as run:
            assert ask("a") == "A" and ask("b") == "B"
            run_id = run.run_id
        with resume(thread, store=store, run_id=run_id):  # a redelivery replays: no draw, no error
            assert ask("a") == "A" and ask("b") == "B"
        assert calls == ["a", "b"]
        info = store.limits.get(name)
        assert info is not None and info.available == 0
        with (
            pytest.raises(RateLimitedError),
            resume(thread, store=store),
        ):  # a new turn draws: the bucket is empty
            ask("c")
        assert calls == ["a", "b"]

    def test_a_continued_run_draws_only_for_its_live_steps(
        self, store: Store, clock: FakeClock
    ) -> None:
        name = _name("continue")
        store.limits.set(name, rate="1/hour", burst=3, timeout=0)
        crash = [True]

        class Died(BaseException):
            pass

        @checkpointed(name="limited.step", limit=(name, lambda i, tenant: tenant))
        def step(i: int, tenant: str) -> int:
            return i

        thread = _name("thread")
        for _ in range(2):
            try:
                with resume(thread, store=store):
                    step(0, "t1")
                    if crash.pop() if crash else False:
                        raise Died
                    step(1, "t1")
            except Died:
                pass
        info = store.limits.get(name, key="t1")
        assert info is not None and info.in_use == 2  # step 0 drew once, step 1 once
        assert store.limits.get(name, key="other").in_use == 0  # type: ignore[union-attr]

    def test_pk_limited_and_the_default_of_a_run(self, store: Store, clock: FakeClock) -> None:
        name = _name("ctx")
        store.limits.set(name, rate="2/s", burst=1)
        with limited(name, store=store) as d:
            assert d.waited == 0
        with (
            resume(_name("thread"), store=store),
            limited(name) as d,
        ):  # inside a run: the run's store
            assert d.waited == pytest.approx(0.5)

    # -- async ---------------------------------------------------------------------------------

    def test_async_twins(self, store: Store, clock: FakeClock) -> None:
        name = _name("async")
        store.limits.set(name, rate="4/s", burst=2)

        @checkpointed(name="limited.async", limit=name)
        async def ask(q: str) -> str:
            return q

        async def main() -> list[float]:
            t0 = clock.t
            out = []
            async with limited(name, store=store):
                out.append(clock.t - t0)
            async with resume(_name("thread"), store=store):
                await ask("x")
                out.append(clock.t - t0)
                await ask("y")
                out.append(clock.t - t0)
            await store.limits.athrottle(name, 3)
            await store.limits.aacquire(name)
            out.append(clock.t - t0)
            return out

        assert [round(x, 6) for x in asyncio.run(main())] == [0.0, 0.0, 0.25, 3.25]

    # -- declarations and errors ----------------------------------------------------------------

    def test_set_get_list_delete(self, store: Store) -> None:
        name = _name("decl")
        assert store.limits.get(name) is None
        info = store.limits.set(name, rate="500/min", burst=20, tokens_per_call=2, timeout=5)
        assert (info.rate, info.burst, info.tokens_per_call, info.timeout) == ("500/min", 20, 2, 5)
        store.limits.set(name, rate="600/min")  # a change keeps the name, takes the new values
        got = store.limits.get(name)
        assert got is not None and (got.rate, got.burst) == ("600/min", 1)
        assert [i.name for i in store.limits.list() if i.name == name] == [name]
        store.limits.acquire(name, key="k")
        assert store.limits.delete(name) is True
        assert store.limits.get(name) is None and not [
            i for i in store.limits.list() if i.name == name
        ]
        assert store.limits.delete(name) is False
        with pytest.raises(LimitNotFoundError, match=r"store\.limits\.set"):
            store.limits.acquire(name)

    @pytest.mark.parametrize(
        ("options", "match"),
        [
            ({"rate": "fast"}, "COUNT/PERIOD"),
            ({"rate": "10/fortnight"}, "COUNT/PERIOD"),
            ({"rate": "0/s"}, "positive"),
            ({"rate": 10}, "COUNT/PERIOD"),
            ({"rate": "10/s", "burst": 0}, "burst"),
            ({"rate": "10/s", "burst": 0.5}, "burst"),
            ({"rate": "10/s", "burst": 2, "tokens_per_call": 3}, "no call would ever fit"),
            ({"rate": "10/s", "tokens_per_call": -1}, "tokens_per_call"),
            ({"rate": "10/s", "timeout": -1}, "timeout"),
        ],
    )
    def test_bad_declarations(self, store: Store, options: dict[str, Any], match: str) -> None:
        with pytest.raises(ConfigurationError, match=match):
            store.limits.set(_name("bad"), **options)

    def test_bad_names_keys_and_unknown_limits(self, store: Store) -> None:
        with pytest.raises(ConfigurationError, match="limit name"):
            store.limits.set("has space", rate="1/s")
        with pytest.raises(ConfigurationError, match="limit key"):
            store.limits.acquire("x", key=1.5)
        for timeout in (-1, float("nan"), "5"):  # NaN compares false with everything: refused too
            with pytest.raises(ConfigurationError, match="timeout="):
                store.limits.acquire("x", timeout=timeout)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="limit="):
            checkpointed(limit=("x", 1, 2))(lambda: None)  # type: ignore[arg-type]
        with pytest.raises(LimitNotFoundError):
            throttle(_name("missing"), 5, store=store)
        missing = _name("missing")

        @checkpointed(name="limited.missing", limit=missing)
        def step() -> None:
            return None

        with (
            pytest.raises(LimitNotFoundError, match=missing) as err,
            resume(_name("thread"), store=store),
        ):
            step()
        assert err.value.limit == missing
