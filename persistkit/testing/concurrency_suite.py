"""Conformance checks for concurrency limits and debounce (docs/flow-control.md).

``pk.resume(concurrency=(name, key, limit))``: never more than ``limit`` turns of the key at
once (threads with an overlap recorder, sync and async), waiters in arrival order,
``busy="reject"`` refused with ``pk.ConcurrencyLimitError``, and a holder whose slot expired
(its heartbeat stopped, as a SIGSTOPped process's) frees its slot and commits nothing after.
``busy="debounce"``: a burst becomes one turn that receives every message in order, the other
turns raise ``pk.Debounced``, a redelivery is merged once, and a leader that died between
claiming its batch and recording it loses nothing (its redelivery, or the next leader, runs the
batch once). Each check uses two ``pk.connect`` instances of the store. Subclass with a
``persistkit_url`` fixture::

    class TestMyStoreFlow(ConcurrencyConformance, DebounceConformance):
        @pytest.fixture
        def persistkit_url(self) -> str:
            return "mystore://..."
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from .._errors import ConcurrencyLimitError, ConfigurationError, LeaseLostError, ThreadBusyError
from ..coordination._concurrency import Concurrency
from ..coordination._debounce import TOPIC, Debounced
from ..engine._api import checkpointed, resume
from ..engine._store import Store
from ._stores import TwoStores

__all__ = ["ConcurrencyConformance", "DebounceConformance", "Overlap"]

_DEADLINE = 60.0  # seconds any one wait may take before the check fails (a hang, not a timing)


def _until(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + _DEADLINE
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)
    return found


class Overlap:
    """Records how many calls are inside at once (``peak``) and the order they entered."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.peak = 0
        self.entered: list[str] = []

    def enter(self, name: str) -> None:
        with self.lock:
            self.inside += 1
            self.peak = max(self.peak, self.inside)
            self.entered.append(name)

    def leave(self) -> None:
        with self.lock:
            self.inside -= 1


_OVERLAPS: dict[str, Overlap] = {}


@checkpointed
def _call_model(tag: str, name: str) -> str:
    """A fake provider call: inside the recorder for a moment (the overlap a limit must bound)."""
    o = _OVERLAPS[tag]
    o.enter(name)
    try:
        time.sleep(0.02)
    finally:
        o.leave()
    return f"answer {name}"


@checkpointed
async def _acall_model(tag: str, name: str) -> str:
    o = _OVERLAPS[tag]
    o.enter(name)
    try:
        await asyncio.sleep(0.02)
    finally:
        o.leave()
    return f"answer {name}"


@checkpointed
def _plain(name: str) -> str:
    return name


def _slot_waiters(store: Store, spec: Concurrency) -> int:
    info = spec.info(store)
    return len(info.waiting) if info is not None else 0


class ConcurrencyConformance(TwoStores):
    """Concurrency limits. Mix into a test class that provides ``persistkit_url``."""

    @staticmethod
    def tenant() -> str:
        return f"tenant-{uuid.uuid4().hex[:10]}"

    def test_never_more_than_the_limit_at_once(self, stores: tuple[Store, Store]) -> None:
        tag, tenant = uuid.uuid4().hex, self.tenant()
        _OVERLAPS[tag] = overlap = Overlap()
        errors: list[BaseException] = []

        def turn(i: int) -> None:
            try:
                with resume(
                    f"{tenant}-t{i}",
                    store=stores[i % 2],
                    run_id=f"turn-{i}",
                    concurrency=("tenant", tenant, 3),
                ):
                    _call_model(tag, f"t{i}")
                    _call_model(tag, f"t{i}-b")
            except BaseException as exc:  # the check reports it
                errors.append(exc)

        workers = [threading.Thread(target=turn, args=(i,)) for i in range(10)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert errors == []
        assert len(overlap.entered) == 20
        assert 1 <= overlap.peak <= 3, overlap.peak
        info = Concurrency("tenant", tenant, 3).info(stores[0])
        assert info is not None and info.holders == () and info.waiting == () and info.limit == 3
        assert info.average_hold > 0

    def test_waiters_take_their_slot_in_arrival_order(self, stores: tuple[Store, Store]) -> None:
        store, other = stores
        tenant = self.tenant()
        spec = Concurrency("tenant", tenant, 1)
        inside, release = threading.Event(), threading.Event()
        order: list[str] = []

        def holder() -> None:
            with resume(f"{tenant}-hold", store=store, concurrency=spec):
                inside.set()
                release.wait(_DEADLINE)

        def waiter(name: str, busy: str = "queue") -> None:
            with resume(f"{tenant}-{name}", store=other, busy=busy, concurrency=spec):
                order.append(_plain(name))

        first = threading.Thread(target=holder)
        first.start()
        assert inside.wait(_DEADLINE)
        # "wait" arrives first but takes no place in line: it goes only when nobody queues
        patient = threading.Thread(target=waiter, args=("w0", "wait"))
        patient.start()
        _until(
            lambda: any(i.holder for i in other.leases(prefix=f"{tenant}-w0")),
            "w0 waiting for a slot",
        )
        waiters = [patient]
        for i, name in enumerate(("w1", "w2", "w3")):
            t = threading.Thread(target=waiter, args=(name,))
            t.start()
            waiters.append(t)
            want = i + 1
            _until(lambda: _slot_waiters(store, spec) == want, f"{name} queued")  # noqa: B023
        release.set()
        for t in [first, *waiters]:
            t.join()
        assert order == ["w1", "w2", "w3", "w0"]

    def test_reject_refuses_at_once_and_writes_nothing(self, stores: tuple[Store, Store]) -> None:
        store, other = stores
        tenant = self.tenant()
        with (
            resume(f"{tenant}-a", store=store, concurrency=("tenant", tenant, 1)),
            pytest.raises(ConcurrencyLimitError) as caught,
            resume(f"{tenant}-b", store=other, busy="reject", concurrency=("tenant", tenant, 1)),
        ):
            _plain("never")
        err = caught.value
        assert err.retryable and isinstance(err, ThreadBusyError)
        assert (err.limit, err.key, err.capacity, err.holders) == ("tenant", tenant, 1, 1)
        assert err.retry_after is not None and err.retry_after > 0
        assert other.history(f"{tenant}-b") == []
        with resume(f"{tenant}-b", store=other, busy="reject", concurrency=("tenant", tenant, 1)):
            _plain("now")  # the slot is free again
        assert other.history(f"{tenant}-b")[0].run_status == "completed"

    def test_busy_timeout_bounds_the_wait_for_a_slot(self, stores: tuple[Store, Store]) -> None:
        store, other = stores
        tenant = self.tenant()
        spec = Concurrency("tenant", tenant, 1)
        with (
            resume(f"{tenant}-a", store=store, concurrency=spec),
            pytest.raises(ConcurrencyLimitError, match="busy_timeout"),
            resume(f"{tenant}-b", store=other, busy_timeout=0.2, concurrency=spec),
        ):
            _plain("never")
        assert _slot_waiters(store, spec) == 0  # it left the queue

    def test_a_stalled_holder_frees_its_slot_and_commits_nothing_after(
        self, stores: tuple[Store, Store]
    ) -> None:
        store, other = stores
        tenant = self.tenant()
        spec = Concurrency("tenant", tenant, 1)
        block = resume(
            f"{tenant}-stalled", store=store, run_id="r1", lease_ttl=0.3, concurrency=spec
        )
        block.__enter__()
        try:
            _plain("before")
            # what SIGSTOP does to a worker: its heartbeat stops renewing the thread lease and the slot
            block._holding.beat.stop()
            block._gate.held.beat.stop()
            done: list[str] = []

            def next_turn() -> None:
                with resume(
                    f"{tenant}-next", store=other, busy_timeout=_DEADLINE, concurrency=spec
                ):
                    done.append(_plain("next"))

            t = threading.Thread(target=next_turn)
            t.start()
            t.join()
            assert done == ["next"]  # the stalled holder's slot was taken once it expired
            with pytest.raises(LeaseLostError):
                _plain("after")  # the fenced-out holder writes nothing
        finally:
            block.__exit__(LeaseLostError, LeaseLostError("fenced"), None)
        steps = [c.step for c in other.history(f"{tenant}-stalled")]
        assert len(steps) == 1, steps  # only the step before the stall committed

    def test_async_never_more_than_the_limit(self, stores: tuple[Store, Store]) -> None:
        tag, tenant = uuid.uuid4().hex, self.tenant()
        _OVERLAPS[tag] = overlap = Overlap()

        async def turn(i: int) -> None:
            async with resume(
                f"{tenant}-a{i}", store=stores[i % 2], concurrency=("tenant", tenant, 2)
            ):
                await _acall_model(tag, f"a{i}")

        async def main() -> None:
            await asyncio.gather(*(turn(i) for i in range(8)))

        asyncio.run(main())
        assert len(overlap.entered) == 8 and 1 <= overlap.peak <= 2, overlap.peak

        async def rejected() -> None:
            async with resume(f"{tenant}-x", store=stores[0], concurrency=("tenant", tenant, 1)):
                with pytest.raises(ConcurrencyLimitError):
                    async with resume(
                        f"{tenant}-y",
                        store=stores[1],
                        busy="reject",
                        concurrency=("tenant", tenant, 1),
                    ):
                        pass

        asyncio.run(rejected())

        async def seen() -> None:
            info = await Concurrency("tenant", tenant, 2).ainfo(stores[1])
            assert info is not None and info.holders == () and info.waiting == ()
            assert await Concurrency("tenant", f"{tenant}-never", 2).ainfo(stores[1]) is None

        asyncio.run(seen())

    def test_bad_options_say_what_to_do(self, stores: tuple[Store, Store]) -> None:
        store, _ = stores
        for bad, words in [
            (("tenant", "acme", 0), "limit must be an int >= 1"),
            (("tenant", "acme", True), "limit must be an int >= 1"),
            (("tenant", 42, 5), "key must be a non-empty str"),
            (("", "acme", 5), "name must be a non-empty str"),
            (("tenant", 5), "concurrency=(name, key, limit)"),
            ("tenant", "concurrency=(name, key, limit)"),
        ]:
            with pytest.raises(
                ConfigurationError, match=words.replace("(", r"\(").replace(")", r"\)")
            ):
                resume("t", store=store, concurrency=bad)
        with pytest.raises(ConfigurationError, match="busy=None"):
            resume("t", store=store, busy=None, concurrency=("tenant", "acme", 2))


class DebounceConformance(TwoStores):
    """Debounce (``busy="debounce"``). Mix into a test class that provides ``persistkit_url``."""

    @staticmethod
    def thread() -> str:
        return f"chat-{uuid.uuid4().hex[:10]}"

    @staticmethod
    def _turn(
        store: Store,
        thread: str,
        event: str,
        text: str,
        ran: dict[str, list[Any]],
        window: tuple[float, float] = (0.05, 5.0),
    ) -> None:
        try:
            with resume(
                thread, store=store, run_id=event, busy="debounce", debounce=window, message=text
            ) as run:
                assert run.messages is not None
                ran[event] = list(run.messages)
                _plain(f"reply to {len(run.messages)}")
        except Debounced as d:
            ran[event] = [f"merged into {d.leader}"]

    def test_a_burst_queued_behind_a_turn_becomes_one_turn(
        self, stores: tuple[Store, Store]
    ) -> None:
        store, other = stores
        t = self.thread()
        inside, release = threading.Event(), threading.Event()

        def busy_turn() -> None:
            with resume(t, store=store, run_id="before"):
                inside.set()
                release.wait(_DEADLINE)

        blocker = threading.Thread(target=busy_turn)
        blocker.start()
        assert inside.wait(_DEADLINE)
        ran: dict[str, list[Any]] = {}
        workers = []
        for i in range(4):
            w = threading.Thread(target=self._turn, args=(stores[i % 2], t, f"ev{i}", f"m{i}", ran))
            w.start()
            workers.append(w)
            want = i + 1
            _until(lambda: len(other.leases(prefix=t)[0].waiting) == want, f"ev{i} queued")  # noqa: B023
        release.set()
        for w in [blocker, *workers]:
            w.join()
        assert ran["ev0"] == [
            "m0",
            "m1",
            "m2",
            "m3",
        ]  # the first in line leads: every message, in order
        assert ran["ev1"] == ran["ev2"] == ran["ev3"] == ["merged into ev0"]
        assert [(m.seq, m.value, m.received) for m in other.messages(t, topic=TOPIC)] == [
            (i + 1, f"m{i}", True) for i in range(4)
        ]
        # redeliveries: the leader replays its batch, a follower is merged again; nothing is stored twice
        again: dict[str, list[Any]] = {}
        self._turn(other, t, "ev0", "m0", again)
        self._turn(store, t, "ev2", "m2", again)
        assert again == {"ev0": ["m0", "m1", "m2", "m3"], "ev2": ["merged into ev0"]}
        # a turn continued without a message of its own (an answer, a retry) replays its batch
        with resume(t, store=other, run_id="ev0", busy="debounce", debounce=(0.05, 5.0)) as run:
            assert run.messages == ["m0", "m1", "m2", "m3"]
        assert len(other.messages(t, topic=TOPIC)) == 4

    def test_bursts_from_many_senders_lose_nothing_and_keep_order(
        self, stores: tuple[Store, Store]
    ) -> None:
        t = self.thread()
        ran: dict[str, list[Any]] = {}

        def sender(k: int) -> None:
            for i in range(6):
                self._turn(stores[k], t, f"s{k}-{i}", f"s{k}-{i}", ran, (0.03, 0.5))

        workers = [threading.Thread(target=sender, args=(k,)) for k in (0, 1)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        batches = [v for v in ran.values() if not str(v[0]).startswith("merged")]
        runs = [str(c.run_id) for c in reversed(stores[0].history(t)) if c.step == "pk.debounce"]
        by_run = {r: ran[r] for r in runs}
        flat = [m for r in runs for m in by_run[r]]
        sent = [m.value for m in stores[0].messages(t, topic=TOPIC)]
        assert sorted(flat) == sorted(sent) and len(flat) == 12 == len(
            set(flat)
        )  # each message in one turn
        assert flat == sent  # turns ran in the order of their messages, each in send order
        for k in (0, 1):
            mine = [m for m in flat if m.startswith(f"s{k}-")]
            assert mine == [f"s{k}-{i}" for i in range(6)]  # a sender's messages in its order
        assert len(batches) == len(runs)

    def test_a_leader_killed_between_claim_and_record_loses_nothing(
        self, stores: tuple[Store, Store]
    ) -> None:
        """The leader dies after its batch's claim and before the batch's record: its redelivery
        takes the same batch; and when another turn leads first, that turn adopts the batch."""
        from ..engine import _run

        store, other = stores
        for variant in ("redelivered", "adopted"):
            t = self.thread()
            real = _run.Run.step_sync

            def dies(
                self: Any, position: str, name: str, digest: Any, real: Any = real, **kw: Any
            ) -> None:
                if name == "pk.debounce":
                    raise KeyboardInterrupt  # as a SIGKILL: the claim is written, the record is not
                real(self, position, name, digest, **kw)

            other.send(
                t, "early", topic=TOPIC, key="ev-early"
            )  # a message sent before, no turn of its own
            _run.Run.step_sync = dies  # type: ignore[method-assign]
            try:
                with (
                    pytest.raises(KeyboardInterrupt),
                    resume(
                        t,
                        store=store,
                        run_id="ev1",
                        busy="debounce",
                        debounce=(0.01, 1.0),
                        message="m1",
                    ),
                ):
                    pass
            finally:
                _run.Run.step_sync = real  # type: ignore[method-assign]
            ran: dict[str, list[Any]] = {}
            if variant == "redelivered":
                self._turn(other, t, "ev1", "m1", ran)
                self._turn(store, t, "ev2", "m2", ran)
                assert ran == {"ev1": ["early", "m1"], "ev2": ["m2"]}
            else:
                self._turn(other, t, "ev2", "m2", ran)  # leads first: adopts ev1's batch
                self._turn(store, t, "ev1", "m1", ran)  # the redelivery finds it adopted
                assert ran == {"ev2": ["early", "m1", "m2"], "ev1": ["merged into ev2"]}
            assert [m.received for m in other.messages(t, topic=TOPIC)] == [True, True, True]

    def test_async_debounce(self, stores: tuple[Store, Store]) -> None:
        store, other = stores
        t = self.thread()

        async def turn(s: Store, event: str, text: str) -> Any:
            try:
                async with resume(
                    t, store=s, run_id=event, busy="debounce", debounce=(0.05, 2.0), message=text
                ) as run:
                    return run.messages
            except Debounced as d:
                return d.leader

        async def main() -> list[Any]:
            return list(
                await asyncio.gather(
                    turn(store, "a1", "x"), turn(other, "a2", "y"), turn(store, "a3", "z")
                )
            )

        got = asyncio.run(main())
        batches = [g for g in got if isinstance(g, list)]
        assert sorted(m for b in batches for m in b) == ["x", "y", "z"]
        assert all(isinstance(g, list) or g in ("a1", "a2", "a3") for g in got)

    def test_bad_options_say_what_to_do(self, stores: tuple[Store, Store]) -> None:
        store, _ = stores
        cases: list[tuple[dict[str, Any], str]] = [
            (
                {"busy": "debounce", "run_id": "e", "message": "m"},
                "needs debounce=\\(window, max_wait\\)",
            ),
            (
                {"busy": "debounce", "run_id": "e", "message": "m", "debounce": (0, 1)},
                "window must be seconds > 0",
            ),
            (
                {"busy": "debounce", "run_id": "e", "message": "m", "debounce": (2, 1)},
                "max_wait \\(1\\) must be >=",
            ),
            ({"busy": "debounce", "message": "m", "debounce": (1, 2)}, "needs run_id="),
            ({"debounce": (1, 2)}, "belong to busy='debounce'"),
            ({"busy": "queue", "message": "m"}, "belong to busy='debounce'"),
        ]
        for kwargs, words in cases:
            with pytest.raises(ConfigurationError, match=words):
                resume("t", store=store, **kwargs)
