"""Conformance checks for after-commit effects (``run.after_commit``, ``store.drain_outbox``).

An effect runs only once its step's checkpoint is durable, exactly once per committed
checkpoint across crashes: by the process that committed it, else by the next resume of
its run, else by ``store.drain_outbox()`` from another "process" (a second
``pk.connect`` of the store). A crash is a ``BaseException`` escaping the block (it writes
nothing more, as a killed process); the tests in ``tests/test_outbox_processes.py`` do it
with SIGKILL. A receiver that deduplicates by the idempotency key sees each effect once.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

from .._errors import ConfigurationError, EffectError, ThreadBusyError
from .._retry import Retry
from ..codec._versions import register
from ..coordination._outbox import current_effect
from ..engine._api import checkpointed, current_run, resume
from ..engine._outbox import after_commit
from ..engine._store import Store, connect
from ._stores import TwoStores

__all__ = ["OutboxConformance"]


class _Crash(BaseException):
    """Stands for a process that dies: the block writes no end record."""


#: What the effects of this module did: (thread, text, key) per call, in order.
CALLS: list[tuple[str, str, str]] = []
#: A receiver that deduplicates by idempotency key (as Stripe or Slack's client_msg_id do).
RECEIVED: dict[str, str] = {}
#: Threads whose next effect call raises _Crash before it does anything (a kill before it).
CRASH_BEFORE: set[str] = set()
#: Threads whose next effect call raises _Crash after it posted (a kill before its done mark).
CRASH_AFTER: set[str] = set()
#: Threads whose effect raises ValueError this many more times.
FAIL: dict[str, int] = {}
#: What each effect saw of the store when it ran: was its step's checkpoint there?
DURABLE: list[bool] = []
_LOCK = threading.Lock()


def _seen(thread: str) -> list[str]:
    return [text for t, text, _ in CALLS if t == thread]


@register
def post(thread: str, text: str, *, idempotency_key: str) -> None:
    """The effect: posts ``text``; the receiver keeps the first post of each key."""
    with _LOCK:
        if thread in CRASH_BEFORE:
            CRASH_BEFORE.discard(thread)
            raise _Crash
        if FAIL.get(thread):
            FAIL[thread] -= 1
            raise ValueError(f"the receiver of {thread} is down")
        info = current_effect()
        assert info is not None and info.key == idempotency_key
        CALLS.append((thread, text, idempotency_key))
        RECEIVED.setdefault(idempotency_key, text)
        if thread in CRASH_AFTER:
            CRASH_AFTER.discard(thread)
            raise _Crash


@register
async def apost(thread: str, text: str, *, idempotency_key: str) -> None:
    await asyncio.sleep(0)
    post(thread, text, idempotency_key=idempotency_key)


#: The URL of the store the durability probe reads (set by the fixture).
_PROBE: dict[str, Any] = {}


@register
def probe(thread: str, position: str) -> None:
    """An effect that reads the store through another connection: is its step committed?"""
    other: Store = _PROBE["store"]
    DURABLE.append(any(c.kind == "step" and c.position == position for c in other.history(thread)))


@checkpointed
def reply(thread: str, text: str) -> str:
    after_commit(post, thread, text)
    return text


@checkpointed
def reply_twice(thread: str, a: str, b: str) -> str:
    run = current_run()
    assert run is not None
    run.after_commit(post, thread, a)
    run.after_commit(post, thread, b)
    return a + b


@checkpointed
def reply_then_fail(thread: str, text: str) -> str:
    after_commit(post, thread, text)
    raise KeyError("the step failed after registering its effect")


@checkpointed
def probed(thread: str) -> None:
    after_commit(probe, thread, "0")


@checkpointed
def reply_retried(thread: str, text: str, attempts: int) -> str:
    after_commit(post, thread, text, retry=Retry(attempts=attempts, wait_initial=0, wait_max=0, wait_jitter=0))
    return text


@checkpointed
async def areply(thread: str, text: str) -> str:
    after_commit(apost, thread, text)
    return text


class OutboxConformance(TwoStores):
    """Mix into a test class that provides ``persistkit_url``."""


    @staticmethod
    def thread() -> str:
        return f"outbox-{uuid.uuid4().hex}"

    def test_an_effect_runs_once_after_its_checkpoint_is_durable(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()
        _PROBE["store"] = two
        before = len(DURABLE)
        with resume(t, store=one):
            probed(t)
            assert DURABLE[before:] == [True]  # ran right after the commit, before the block went on
            reply_twice(t, "a", "b")
            assert _seen(t) == ["a", "b"]
        assert _seen(t) == ["a", "b"]
        assert two.drain_outbox(thread_id=t).done == ()  # the end record carries the done marks
        with resume(t, store=one):
            reply(t, "c")
        assert _seen(t) == ["a", "b", "c"]

    def test_keys_are_stable_and_distinct(self, stores: tuple[Store, Store]) -> None:
        one, _ = stores
        t = self.thread()
        with resume(t, store=one, run_id="r1"):
            reply_twice(t, "a", "b")
        keys = [k for th, _, k in CALLS if th == t]
        assert len(set(keys)) == 2 and all(k.startswith("pk-effect-") for k in keys)
        with resume(t, store=one, run_id="r1"):  # a redelivery replays: no effect again
            reply_twice(t, "a", "b")
        assert _seen(t) == ["a", "b"]

    def test_a_failed_step_drops_its_effects(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()
        with pytest.raises(KeyError), resume(t, store=one):
            reply_then_fail(t, "never")
        assert _seen(t) == []
        assert two.drain_outbox(thread_id=t, dry_run=True).pending == ()

    def test_a_crash_between_commit_and_effect_is_settled_by_the_resume(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()
        CRASH_BEFORE.add(t)
        with pytest.raises(_Crash), resume(t, store=one, run_id="r1"):
            reply(t, "a")
        assert _seen(t) == []
        pending = two.drain_outbox(thread_id=t, dry_run=True).pending
        assert [(p.run_id, p.position, p.index, p.function.rpartition(":")[2]) for p in pending] == [("r1", "0", 0, "post")]
        with resume(t, store=two, run_id="r1") as run:
            assert _seen(t) == ["a"]  # before the block's code went on
            reply(t, "a")  # replays: its effect is not run again
            reply(t, "b")
        assert _seen(t) == ["a", "b"] and run.status == "completed"
        assert next(k for th, _, k in CALLS if th == t) == pending[0].key
        assert two.drain_outbox(thread_id=t, dry_run=True).pending == ()

    def test_a_crash_between_commit_and_effect_is_settled_by_a_drain(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()
        CRASH_BEFORE.add(t)
        with pytest.raises(_Crash), resume(t, store=one, run_id="r1"):
            reply(t, "a")
        report = two.drain_outbox(prefix=t)
        assert report.ok and [d.function.rpartition(":")[2] for d in report.done] == ["post"]
        assert _seen(t) == ["a"]
        if one.backend.supports_leases:  # given back reserved for the unfinished run: turns wait for it
            assert [(i.holder if i.held else None, i.reserved_for) for i in one.leases(prefix=t)] == [(None, "r1")]
        assert two.drain_outbox(prefix=t).done == ()
        with resume(t, store=one, run_id="r1") as run:  # the crashed run continues, nothing twice
            reply(t, "a")
            reply(t, "b")
        assert _seen(t) == ["a", "b"] and run.status == "completed"
        assert [c.run_status for c in one.history(t) if c.kind == "end"] == ["completed"]

    def test_a_crash_after_the_effect_runs_it_again_with_the_same_key(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()
        with pytest.raises(_Crash), resume(t, store=one, run_id="r1"):
            reply(t, "b")  # effect, done mark, and a crash after it: nothing is pending
            raise _Crash
        assert two.drain_outbox(thread_id=t).done == () and _seen(t) == ["b"]
        CRASH_AFTER.add(t)
        with pytest.raises(_Crash), resume(t, store=one, run_id="r1"):
            reply(t, "b")
            reply(t, "a")  # the effect posts, then the process dies before its done mark
        assert two.drain_outbox(thread_id=t).done != ()  # what can happen twice (docs/long-runs.md)
        keys = [k for th, text, k in CALLS if th == t and text == "a"]
        assert len(keys) == 2 and keys[0] == keys[1]
        assert [RECEIVED[k] for k in set(keys)] == ["a"]  # the deduplicating receiver saw it once

    def test_an_effect_that_fails_for_good_stays_pending(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()
        FAIL[t] = 2
        with pytest.raises(EffectError) as err, resume(t, store=one, run_id="r1"):
            reply_retried(t, "a", 2)
        assert err.value.key and err.value.position == "0" and "stays pending" in str(err.value)
        assert isinstance(err.value.__cause__, ValueError) and err.value.retryable
        # a RetryableError: no end record, the run stays unfinished (the thread's other turns wait)
        assert [c.kind for c in one.history(t)] == ["step"]
        if two.backend.supports_leases:
            with pytest.raises(ThreadBusyError) as busy, resume(t, store=two, run_id="r2", busy="reject"):
                pass
            assert busy.value.unfinished_run == "r1"
        FAIL[t] = 5
        report = two.drain_outbox(thread_id=t)
        assert not report.ok and report.failed[0].key == err.value.key and _seen(t) == []
        FAIL[t] = 1  # one more failure, then it works: its own policy (2 attempts) covers it
        with resume(t, store=one, run_id="r1") as run:  # the queue's retry continues it: its effect first
            assert _seen(t) == ["a"]
            reply_retried(t, "a", 2)
        assert run.status == "completed" and _seen(t) == ["a"]
        assert two.drain_outbox(thread_id=t, dry_run=True).pending == ()

    def test_a_drain_skips_a_thread_whose_lease_is_held(self, stores: tuple[Store, Store]) -> None:
        from ..coordination._thread_lease import ThreadLease

        one, two = stores
        if not one.backend.supports_leases:
            pytest.skip("the store has no leases")
        t = self.thread()
        CRASH_BEFORE.add(t)
        with pytest.raises(_Crash), resume(t, store=one, run_id="r1"):
            reply(t, "a")
        lease = ThreadLease(one, t, run_id="r1")
        lease.acquire()
        try:
            report = two.drain_outbox(thread_id=t)
        finally:
            lease.release()
        assert report.done == () and [s[0] for s in report.skipped] == [t] and _seen(t) == []
        assert two.drain_outbox(thread_id=t).done != () and _seen(t) == ["a"]

    def test_async_effects_are_awaited_and_settled(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()

        async def main() -> str:
            async with resume(t, store=one):
                await areply(t, "a")
                assert _seen(t) == ["a"]
            CRASH_BEFORE.add(t)
            with pytest.raises(_Crash):
                async with resume(t, store=one, run_id="r2"):
                    await areply(t, "b")
            async with resume(t, store=two, run_id="r2") as run:
                assert _seen(t) == ["a", "b"]
                await areply(t, "b")
                await areply(t, "c")
            return run.status

        assert asyncio.run(main()) == "completed" and _seen(t) == ["a", "b", "c"]

    def test_an_async_drain_awaits_async_effects(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()

        async def main() -> None:
            CRASH_BEFORE.add(t)
            with pytest.raises(_Crash):
                async with resume(t, store=one, run_id="r1"):
                    await areply(t, "a")
            report = await two.adrain_outbox(prefix=t)
            assert report.ok and len(report.done) == 1 and _seen(t) == ["a"]
            assert (await two.adrain_outbox(prefix=t)).done == ()

        asyncio.run(main())

    def test_a_sync_drain_runs_async_effects(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()

        async def crash() -> None:
            CRASH_BEFORE.add(t)
            with pytest.raises(_Crash):
                async with resume(t, store=one, run_id="r1"):
                    await areply(t, "a")

        asyncio.run(crash())
        assert len(two.drain_outbox(thread_id=t).done) == 1 and _seen(t) == ["a"]

    @pytest.mark.parametrize("sealed", [False, True], ids=["plain", "encrypted+integrity"])
    def test_a_drain_on_a_namespaced_thread_of_a_sealed_store(self, persistkit_url: str, sealed: bool) -> None:
        from ..wrappers._keys import generate_key

        keys: dict[str, Any] = {"encryption": generate_key(), "integrity": generate_key()} if sealed else {}
        one, two = connect(persistkit_url, **keys), connect(persistkit_url, **keys)
        try:
            t = self.thread()
            CRASH_BEFORE.add(t)
            with pytest.raises(_Crash), resume(t, store=one, run_id="r1", namespace="agent-2"):
                reply(t, "a")
            assert two.drain_outbox(thread_id=t, namespace="").done == ()  # another namespace: nothing
            # every namespace of the thread, where the store lists them (the optional namespaces())
            try:
                lists = bool(two.backend.namespaces(t))
            except ConfigurationError:
                lists = False
            report = two.drain_outbox(thread_id=t, namespace=None if lists else "agent-2")
            assert [(d.namespace, d.run_id) for d in report.done] == [("agent-2", "r1")] and _seen(t) == ["a"]
            with resume(t, store=one, run_id="r1", namespace="agent-2") as run:
                reply(t, "a")
                reply(t, "b")
            assert run.status == "completed" and _seen(t) == ["a", "b"]
            if sealed and lists:  # verify walks every namespace: it needs namespaces()
                assert two.verify(t).ok
        finally:
            one.close()
            two.close()

    def test_the_effects_of_a_run_the_thread_moved_past_are_drained(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()
        CRASH_BEFORE.add(t)
        with pytest.raises(_Crash), resume(t, store=one, run_id="A"):
            reply(t, "a")
        one.abandon(t, "A")  # its redelivery will never come: the next turn goes on
        with resume(t, store=one, run_id="B"):
            reply(t, "b")
        assert _seen(t) == ["b"]
        report = two.drain_outbox(thread_id=t)
        assert [d.run_id for d in report.done] == ["A"] and _seen(t) == ["b", "a"]
        with resume(t, store=one, run_id="B") as replayed:  # B's redelivery still replays
            reply(t, "b")
        with resume(t, store=one, run_id="C") as run:  # and a new turn starts on top
            reply(t, "c")
        assert replayed.status == run.status == "completed" and _seen(t) == ["b", "a", "c"]
        assert two.drain_outbox(thread_id=t, dry_run=True).pending == ()

    def test_a_resume_whose_pending_effect_fails_for_good_does_not_start(self, stores: tuple[Store, Store]) -> None:
        one, two = stores
        t = self.thread()
        CRASH_BEFORE.add(t)
        with pytest.raises(_Crash), resume(t, store=one, run_id="r1"):
            reply_retried(t, "a", 2)
        FAIL[t] = 2
        entered = False
        busy = "reject" if two.backend.supports_leases else None  # the lease is given up, where there is one
        with pytest.raises(EffectError) as err, resume(t, store=two, run_id="r1", busy=busy):
            entered = True
        assert not entered and "stays pending" in str(err.value) and _seen(t) == []
        with resume(t, store=two, run_id="r1", busy=busy) as run:
            assert _seen(t) == ["a"]
            reply_retried(t, "a", 2)
        assert run.status == "completed" and _seen(t) == ["a"]
