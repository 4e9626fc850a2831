"""Conformance checks for messages into runs and events out of them (docs/messages.md).

``store.send`` appends to a thread's inbox; ``pk.receive`` in a run of the thread takes the
next message and records it at its step position; ``pk.set_event`` publishes a value that
``store.get_event`` reads. Each check uses two ``pk.connect`` instances of the store (the
run's process and the sender's), and one starts a real process that is killed between
claiming a message and recording it. Subclass :class:`MessagesConformance` with a
``persistkit_url`` fixture::

    class TestMyStoreMessages(MessagesConformance):
        @pytest.fixture
        def persistkit_url(self) -> str:
            return "mystore://..."
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest

from .._errors import ConfigurationError, RetryableError, RunCancelledError
from ..engine._api import checkpointed, current_run, resume
from ..engine._messages import areceive, aset_event, cancelled, receive, set_event
from ..engine._store import Store
from ._stores import TwoStores

__all__ = ["MessagesConformance"]

_BODIES: list[str] = []  # every step body that ran


@checkpointed
def _note(name: str) -> str:
    _BODIES.append(name)
    return name


@checkpointed
def _slow(name: str, gate: str = "") -> str:
    """A step that appends ``name`` to the state; the step named ``gate`` waits until the run
    was asked to stop (``pk.cancelled()``), as a long step that looks now and then."""
    _BODIES.append(name)
    run = current_run()
    assert run is not None
    run.state["done"] = [*run.state.get("done", []), name]
    if name == gate:
        for _ in range(2000):  # at most ~20 s: a test that cannot finish fails, it does not hang
            if cancelled():
                break
            time.sleep(0.01)
    return name


class _Again(RetryableError):
    """Ends a block without an end record: the run stays unfinished, as after a crash."""


#: The child of the crash check: receives message 1 (recorded), claims message 2 and dies
#: before recording it (SIGKILL: no end record, the lease never given up).
#: The child of the cross-process cancel check: a five-step turn whose third step waits for
#: the stop (seen at its lease's renewal, every lease_ttl / 3 s), then exits 3 on
#: pk.RunCancelledError.
_CANCEL_CHILD = """
import sys, time
import persistkit as pk
from persistkit.testing.messages_suite import _slow

url, thread = sys.argv[1:3]
store = pk.connect(url)
try:
    with pk.resume(thread, store=store, run_id="r1", lease_ttl=0.6):
        for i in range(5):
            _slow(f"{thread}:{i}", gate=f"{thread}:2")
except pk.RunCancelledError as exc:
    sys.exit(3 if exc.status == "cancelled" else 4)
"""

_CHILD = """
import os, signal, sys
import persistkit as pk
from persistkit.engine import _run

url, thread, run_id = sys.argv[1:4]
store = pk.connect(url)
real = _run.Run.step_sync

def dies(self, position, name, digest, **kw):
    if name == "pk.receive" and position == "1":
        os.kill(os.getpid(), signal.SIGKILL)  # the message is claimed, its record never written
    return real(self, position, name, digest, **kw)

_run.Run.step_sync = dies
with pk.resume(thread, store=store, run_id=run_id):
    pk.receive("chat", timeout=5)
    pk.receive("chat", timeout=5)
"""


def _die_in_process(store: Store, thread: str) -> None:
    """``_CHILD`` in this process: a KeyboardInterrupt where the child is killed (an interrupt
    leaves the run unfinished, as a kill does)."""
    from ..engine import _run

    real = _run.Run.step_sync

    def dies(self: Any, position: str, name: str, digest: Any, **kw: Any) -> None:
        if name == "pk.receive" and position == "1":
            raise KeyboardInterrupt
        real(self, position, name, digest, **kw)

    _run.Run.step_sync = dies  # type: ignore[method-assign]
    try:
        with resume(thread, store=store, run_id="r1"):
            receive("chat", timeout=5)
            receive("chat", timeout=5)
    except KeyboardInterrupt:
        pass
    finally:
        _run.Run.step_sync = real  # type: ignore[method-assign]


class MessagesConformance(TwoStores):
    """Mix into a test class that provides ``persistkit_url``."""

    @staticmethod
    def thread() -> str:
        return f"msg-{uuid.uuid4().hex[:12]}"

    def test_sent_before_the_run_received_in_order_once(self, stores: tuple[Store, Store]) -> None:
        store, sender = stores
        t = self.thread()
        assert sender.send(t, {"text": "first"}, topic="chat", key="evt-1") == 1
        assert sender.send(t, {"text": "second"}, topic="chat") == 2
        assert sender.send(t, {"text": "first"}, topic="chat", key="evt-1") == 1  # a redelivery: stored once
        assert sender.send(t, "elsewhere", topic="other") == 1  # topics are numbered apart
        with resume(t, store=store) as run:
            got = [receive("chat", timeout=0), receive("chat", timeout=0), receive("chat", timeout=0)]
        assert run.status == "completed"
        assert got == [{"text": "first"}, {"text": "second"}, None]  # None: the timeout, recorded
        inbox = sender.messages(t, topic="chat")
        assert [(m.seq, m.value, m.key, m.received) for m in inbox] == [
            (1, {"text": "first"}, "evt-1", True), (2, {"text": "second"}, None, True),
        ]
        assert [m.received for m in sender.messages(t, topic="other")] == [False]  # kept for a later receive

    def test_a_resumed_run_receives_the_same_message_at_the_same_place(self, stores: tuple[Store, Store]) -> None:
        store, sender = stores
        t = self.thread()
        for text in ("a", "b", "c"):
            sender.send(t, text)
        seen: list[Any] = []

        def agent(fail: bool) -> None:
            seen.append(receive(timeout=0))
            _note(f"{t}:{seen[-1]}")
            seen.append(receive(timeout=0))
            if fail:
                raise _Again("the queue retries this turn")

        with pytest.raises(_Again), resume(t, store=store, run_id="r1"):
            agent(True)
        with resume(t, store=store, run_id="r1"):
            agent(False)
        assert seen == ["a", "b", "a", "b"]  # replayed: no second message taken at those places
        assert _BODIES.count(f"{t}:a") == 1
        with resume(t, store=store):
            assert receive(timeout=0) == "c"  # the next turn takes the next message

    def test_a_timeout_is_recorded_and_a_later_message_waits(self, stores: tuple[Store, Store]) -> None:
        store, sender = stores
        t = self.thread()
        with pytest.raises(_Again), resume(t, store=store, run_id="r1"):
            assert receive("chat", timeout=0) is None
            sender.send(t, "late", topic="chat")
            raise _Again("retried")
        with resume(t, store=store, run_id="r1"):
            assert receive("chat", timeout=0) is None  # replayed as it was: the run is deterministic
            assert receive("chat", timeout=0) == "late"

    def test_a_long_wait_suspends_until_a_message_is_sent(self, stores: tuple[Store, Store]) -> None:
        store, sender = stores
        t = self.thread()

        def agent() -> Any:
            _note(f"{t}:before")
            got = receive("approval")  # no timeout: the run suspends
            _note(f"{t}:after:{got}")
            return got

        with resume(t, store=store) as run:
            agent()
        assert run.status == "suspended"
        waiting = [q for q in sender.pending(prefix=t) if q.thread_id == t]
        assert [(q.kind, q.topic, q.run_id) for q in waiting] == [("message", "approval", run.run_id)]
        assert [d for d in sender.due(prefix=t) if d.thread_id == t] == []  # nothing sent yet
        with pytest.raises(ConfigurationError):
            sender.send(t, "x", topic="approval", key="")  # an empty key is refused, nothing stored
        with resume(t, store=store) as again:
            agent()
        assert again.status == "suspended" and again.run_id == run.run_id  # still waiting, nothing written
        sender.send(t, {"ok": True}, topic="approval")
        assert [d.run_id for d in sender.due(prefix=t) if d.thread_id == t] == [run.run_id]
        with resume(t, store=store) as done:
            assert agent() == {"ok": True}
        assert done.status == "completed" and done.run_id == run.run_id
        assert _BODIES.count(f"{t}:before") == 1
        assert [q for q in sender.pending(prefix=t) if q.thread_id == t] == []

    def test_the_replay_check_sees_a_run_waiting_for_a_message(self, stores: tuple[Store, Store]) -> None:
        store, sender = stores
        t = self.thread()

        def entry(thread_id: str, run_id: str) -> None:
            with resume(thread_id, store=store, run_id=run_id):
                _note(f"{t}:a")
                receive("approval")
                _note(f"{t}:b")

        entry(t, "r1")
        sender.send(t, "yes", topic="approval")  # sent, not yet received: the check writes nothing
        report = store.check_replay(entry, threads=[t])
        assert [(r.run_id, r.outcome) for r in report.runs] == [("r1", "waits")]
        assert [m.received for m in sender.messages(t, topic="approval")] == [False]

    def test_async_receive_and_events(self, stores: tuple[Store, Store]) -> None:
        store, sender = stores
        t = self.thread()

        async def main() -> Any:
            await sender.asend(t, "hello")
            async with resume(t, store=store) as run:
                got = await areceive(timeout=1)
                await aset_event("progress", {"step": 1})
            assert run.status == "completed"
            assert await sender.aget_event(t, "progress") == {"step": 1}
            assert [m.received for m in await sender.amessages(t)] == [True]
            return got

        assert asyncio.run(main()) == "hello"

    def test_events_are_set_once_per_run(self, stores: tuple[Store, Store]) -> None:
        store, reader = stores
        t = self.thread()
        assert reader.get_event(t, "status", default="none yet") == "none yet"
        with resume(t, store=store, run_id="r1"):
            set_event("status", "refund approved")
        with resume(t, store=store, run_id="r2"):
            set_event("status", "refund sent")
        with resume(t, store=store, run_id="r1"):  # a redelivery of r1 replays: it sets nothing
            set_event("status", "refund approved")
        assert reader.get_event(t, "status", wait=1) == "refund sent"

    def test_delete_thread_takes_its_messages_and_events(self, stores: tuple[Store, Store]) -> None:
        """``store.delete_thread`` drops the thread's inbox (every namespace: one with messages
        and no checkpoint too) and its events: a thread re-created under the same id receives
        nothing the old one was sent, and reads no old event."""
        store, other = stores
        t = self.thread()
        other.send(t, "old-1", topic="chat", key="evt-1")
        other.send(t, "old-2", topic="chat")
        other.send(t, "old-side", topic="chat", namespace="side")  # a namespace without checkpoints
        with resume(t, store=store) as run:
            assert receive("chat", timeout=0) == "old-1"
            set_event("status", "old")
        assert run.status == "completed"
        assert other.delete_thread(t) is True
        assert other.messages(t, topic="chat") == other.messages(t, topic="chat", namespace="side") == []
        assert other.get_event(t, "status", default="none") == "none"
        assert other.send(t, "new", topic="chat", key="evt-1") == 1  # numbered afresh; the old key is gone
        with resume(t, store=store) as again:
            got = [receive("chat", timeout=0), receive("chat", timeout=0)]
        assert again.status == "completed" and got == ["new", None]
        assert other.get_event(t, "status", default="none") == "none"

        async def main() -> list[Any]:
            await other.asend(t, "stale", topic="chat", namespace="side")
            assert await other.adelete_thread(t) is True
            return [*await other.amessages(t, topic="chat"), *await other.amessages(t, topic="chat", namespace="side")]

        assert asyncio.run(main()) == []

    def test_a_process_killed_after_claiming_a_message(self, stores: tuple[Store, Store], persistkit_url: str) -> None:
        store, sender = stores
        t = self.thread()
        for text in ("one", "two", "three"):
            sender.send(t, text, topic="chat")
        if persistkit_url.startswith("memory:"):  # one process's store: the same death, in process
            _die_in_process(store, t)
        else:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            child = subprocess.run(
                [sys.executable, "-c", _CHILD, persistkit_url, t, "r1"], env=env, capture_output=True, timeout=120
            )
            assert child.returncode == -9, child.stderr.decode()[-2000:]
        with resume(t, store=store, run_id="r1") as run:
            got = [receive("chat", timeout=5), receive("chat", timeout=5), receive("chat", timeout=0)]
        assert run.status == "completed"
        # "one" replayed, "two" was claimed at position 1 by the killed process: taken again there
        assert got == ["one", "two", "three"]
        assert [m.received for m in sender.messages(t, topic="chat")] == [True, True, True]

    def test_cancel_stops_a_live_run_at_its_next_step(self, stores: tuple[Store, Store], persistkit_url: str) -> None:
        store, operator = stores
        t = self.thread()
        if persistkit_url.startswith("memory:"):  # one process's store: the run in a thread
            errors: list[BaseException] = []

            def turn() -> None:
                try:
                    with resume(t, store=store, run_id="r1"):
                        for i in range(5):
                            _slow(f"{t}:{i}", gate=f"{t}:2")
                except RunCancelledError as exc:
                    errors.append(exc)

            worker = threading.Thread(target=turn)
            worker.start()
            _until(lambda: f"{t}:2" in _BODIES)
            assert operator.cancel(t) == "requested"
            worker.join(30)
            assert [e.status for e in errors] == ["cancelled"]  # type: ignore[attr-defined]
        else:  # another process: the stop reaches it through its lease record
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            child = subprocess.Popen([sys.executable, "-c", _CANCEL_CHILD, persistkit_url, t], env=env,
                                     stderr=subprocess.PIPE)
            try:
                _until(lambda: len(operator.history(t)) >= 2)  # steps 0 and 1 committed: step 2 runs
                assert operator.cancel(t, "r1") == "requested"
                _, err = child.communicate(timeout=60)
            finally:
                child.kill()
            assert child.returncode == 3, err.decode()[-2000:]
        end = operator.history(t)[0]
        assert end.run_status == "cancelled"
        assert [c.step for c in operator.history(t)[1:]] == ["_slow"] * 3  # steps 0-2 stay; 3 and 4 never ran
        with pytest.raises(RunCancelledError, match="cancelled"), resume(t, store=store, run_id="r1"):
            _slow(f"{t}:never")  # a redelivery runs nothing
        with resume(t, store=store) as nxt:  # the next turn starts from what the cancelled one did
            assert nxt.state["done"][-1].endswith(":2")

    def test_async_cancel_through_the_lease_record(self, stores: tuple[Store, Store],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
        """An async block hears the stop at its heartbeat's renewal (as a run in another process
        does: this process's shortcut is switched off)."""
        from ..coordination import _cancel

        monkeypatch.setattr(_cancel, "ask_local", lambda *a, **k: False)
        store, operator = stores
        t = self.thread()

        @checkpointed(name="_alap")
        async def lap(i: int) -> int:
            _BODIES.append(f"{t}:{i}")
            await asyncio.sleep(0.02)
            return i

        async def turn() -> str:
            try:
                # 1.5 s: a 0.3 s lease lapsed under load (another process took the thread over)
                async with resume(t, store=store, lease_ttl=1.5):
                    for i in range(500):  # ~10 s at most: the stop comes within ~0.5 s of the request
                        await lap(i)
            except RunCancelledError as exc:
                return exc.status
            return "not stopped"

        async def main() -> str:
            task = asyncio.create_task(turn())
            while f"{t}:1" not in _BODIES:
                await asyncio.sleep(0.01)
            assert await operator.acancel(t) == "requested"
            return await task

        assert asyncio.run(main()) == "cancelled"
        assert operator.history(t)[0].run_status == "cancelled"

    def test_async_cancel_of_a_live_run_without_a_lease(self, stores: tuple[Store, Store],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
        """``busy=None`` holds no lease to hear a stop through: the cancel (from another process:
        this process's shortcut is switched off) ends the run in the store, and the run's next
        write, refused, raises ``pk.RunCancelledError`` there; nothing runs after it (#39, F12)."""
        from ..coordination import _cancel

        monkeypatch.setattr(_cancel, "ask_local", lambda *a, **k: False)
        store, operator = stores
        t = self.thread()
        ran: list[int] = []

        @checkpointed(name="_anolease")
        async def lap(i: int) -> int:
            ran.append(i)
            await asyncio.sleep(0.05)  # the cancel's read and write of the head fit between two commits
            return i

        async def turn() -> str:
            try:
                async with resume(t, store=store, busy=None, run_id="r1"):
                    for i in range(600):  # ~30 s at most: the stop comes at the next write
                        await lap(i)
            except RunCancelledError as exc:
                return exc.status
            return "not stopped"

        async def main() -> str:
            task = asyncio.create_task(turn())
            while len(ran) < 2:
                await asyncio.sleep(0.005)
            assert await operator.acancel(t, "r1") == "cancelled"  # nobody holds a lease: ended now
            stopped_at = len(ran)
            status = await task
            assert len(ran) <= stopped_at + 1  # at most the step in flight, never one after it
            return status

        assert asyncio.run(main()) == "cancelled"
        history = operator.history(t)
        assert history[0].run_status == "cancelled"
        assert sum(1 for c in history if c.kind == "step") == len(ran) - 1  # the refused step is not recorded
        with pytest.raises(RunCancelledError), resume(t, store=store, busy=None, run_id="r1"):
            pass  # its redelivery runs nothing

    def test_cancel_of_a_suspended_run_ends_it(self, stores: tuple[Store, Store]) -> None:
        store, operator = stores
        t = self.thread()
        with resume(t, store=store) as run:
            _slow(f"{t}:a")
            receive("reply")  # suspends: nobody runs it now
        assert run.status == "suspended"
        assert operator.cancel(t) == "cancelled"
        assert operator.cancel(t, run.run_id) == "cancelled"  # again: nothing more to do
        assert operator.history(t)[0].run_status == "cancelled"
        assert [q for q in operator.pending(prefix=t) if q.thread_id == t] == []
        with pytest.raises(RunCancelledError), resume(t, store=store, run_id=run.run_id):
            receive("reply")

    @pytest.mark.parametrize(("busy", "at"), [("interrupt", 2), ("rollback", 2), ("interrupt", 4)])
    def test_a_second_message_stops_the_running_turn(self, stores: tuple[Store, Store], busy: str, at: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
        """The second message comes while the first turn is in step ``at`` of 5: the turn stops
        before its next step; in its last step it has no next step, and completes. Under
        ``rollback`` the first turn hears it through its lease record (this process's shortcut
        switched off), as a turn in another process does."""
        if busy == "rollback":
            from ..coordination import _cancel

            monkeypatch.setattr(_cancel, "ask_local", lambda *a, **k: False)
        store, other = stores
        t = self.thread()
        with resume(t, store=store, run_id="zero"):
            _slow(f"{t}:before")
        errors: list[BaseException] = []

        def first() -> None:
            try:
                # a TTL short enough that the stop is heard within the test, long enough that a
                # loaded machine's late renewal does not let the lease lapse (the second turn
                # would then wait for this unfinished run's redelivery, which never comes here)
                with resume(t, store=store, run_id="first", lease_ttl=1.5):
                    for i in range(5):
                        _slow(f"{t}:first:{i}", gate=f"{t}:first:{at}")
            except RunCancelledError as exc:
                errors.append(exc)

        worker = threading.Thread(target=first)
        worker.start()
        _until(lambda: f"{t}:first:{at}" in _BODIES)
        with resume(t, store=other, run_id="second", busy=busy) as run:
            _slow(f"{t}:second")
        worker.join(30)
        if at == 4:  # asked in its last step: nothing left to stop, it completed
            assert errors == []
            assert run.state["done"] == [f"{t}:before", *(f"{t}:first:{i}" for i in range(5)), f"{t}:second"]
            return
        status = "interrupted" if busy == "interrupt" else "rolled_back"
        assert [e.status for e in errors] == [status]  # type: ignore[attr-defined]
        assert not any(b.startswith(f"{t}:first:3") for b in _BODIES)  # nothing of it ran after the stop
        kept = [f"{t}:first:0", f"{t}:first:1", f"{t}:first:2"] if busy == "interrupt" else []
        assert run.state["done"] == [f"{t}:before", *kept, f"{t}:second"]
        statuses = {c.run_id: c.run_status for c in other.history(t) if c.step is None}
        assert statuses == {"zero": "completed", "first": status, "second": "completed"}
        assert len(other.history(t, run_id="first")) == 4  # its three steps and its end: nothing deleted
        with pytest.raises(RunCancelledError, match=status), resume(t, store=store, run_id="first"):
            _slow(f"{t}:first:again")  # a redelivery of the stopped turn runs nothing


def _until(ok: Any, limit: float = 30.0) -> None:
    """Wait for a condition the store (or this process) shows; fail past ``limit`` s."""
    end = time.monotonic() + limit
    while not ok():
        assert time.monotonic() < end, "the condition never held"
        time.sleep(0.01)
