"""Conformance checks for durable streams (``pk.emit``, ``store.read_stream``; docs/streams.md).

Subclass :class:`StreamConformance` with a ``persistkit_url`` fixture (any store with the
``kv`` capability; ``watch`` is used when there). An agent emits at the block level, in
three steps and in a nested one; it is crashed at each of its step positions (a
``BaseException`` escaping the block, as a killed process writes nothing more), with what it
buffered either written or lost, and continued from a second ``pk.connect`` of the store.
Then: the stream's offsets are dense; applying its rewinds gives exactly what an uncrashed run
emits, in order, and so does a ``final_only`` reader; a reader that reconnects after every
offset gets exactly the records after it. Also: live readers see an event before its step
commits, a retried step's attempt is rewound, async emits and readers, bad names refused.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

from .._errors import ConfigurationError
from .._retry import Retry
from ..engine._api import checkpointed, current_run, resume
from ..engine._emit import emit
from ..engine._store import Store
from ..streams._format import StreamEvent
from ._stores import TwoStores

__all__ = ["StreamConformance", "view"]


class _Crash(BaseException):
    """Stands for a process that dies: the block writes nothing more."""


#: thread -> (crash point, "written" | "lost"): the next time the agent reaches the point it dies
PLAN: dict[str, tuple[str, str]] = {}
#: what an uncrashed run of the agent emits, in order
EXPECTED = [
    "start", "s0.0", "s0.1", "s0.2", "after0", "s1.0", "s1.1", "s1.2", "after1",
    "p.before", "child", "p.after", "done",
]
#: crash points: inside each step after it emitted, between two steps, inside a parent after its child committed
POINTS = ["in0", "in1", "between", "parent"]


def _crash_here(point: str) -> None:
    run = current_run()
    assert run is not None
    plan = PLAN.get(run.thread_id)
    if plan is None or plan[0] != point:
        return
    del PLAN[run.thread_id]
    if plan[1] == "written":
        run._streams.flush()  # the background writer got there before the kill
    else:
        run._streams.stop(drop=True)  # it did not: what was buffered is lost with the process
    raise _Crash


@checkpointed(name="stream_suite.tokens")
def _tokens(i: int) -> int:
    for t in range(3):
        emit(f"s{i}.{t}")
    _crash_here(f"in{i}")
    return i


@checkpointed(name="stream_suite.child")
def _child() -> int:
    emit("child")
    return 1


@checkpointed(name="stream_suite.parent")
def _parent() -> int:
    emit("p.before")
    _child()
    emit("p.after")
    _crash_here("parent")
    return 2


def _agent(store: Store, thread: str) -> None:
    with resume(thread, store=store):
        emit("start")
        _tokens(0)
        emit("after0")
        _tokens(1)
        emit("after1")
        _crash_here("between")
        _parent()
        emit("done")


@checkpointed(name="stream_suite.tool")
def _tool(thread: str) -> int:
    if PLAN.get(thread, ("",))[0] == "tool":
        emit("calling refund_tool", stream="status")
        _crash_here("tool")
    return 1


@checkpointed(name="stream_suite.answer")
def _answer() -> str:
    emit("answer")
    return "answer"


def _tool_turn(store: Store, thread: str) -> None:
    with resume(thread, store=store):
        _tool(thread)
        _answer()


#: threads whose flaky step fails (once)
FAIL: set[str] = set()


@checkpointed(name="stream_suite.flaky_once")
def _flaky_once(thread: str) -> str:
    if thread in FAIL:
        emit("attempt failing")
        FAIL.discard(thread)
        raise ValueError("flaky")
    emit("attempt ok")
    return "ok"


def _failing_turn(store: Store, thread: str) -> None:
    with resume(thread, store=store):
        emit("before")
        _flaky_once(thread)


def view(records: list[StreamEvent]) -> list[Any]:
    """What a UI shows: every event, minus those a rewind took back (docs/streams.md)."""
    shown: list[StreamEvent] = []
    for r in records:
        if r.kind == "rewind":
            assert r.to is not None
            shown = [s for s in shown if s.offset <= r.to]
        elif r.kind == "event":
            shown.append(r)
    return [s.data for s in shown]


def _thread() -> str:
    return f"stream-{uuid.uuid4().hex[:12]}"


class StreamConformance(TwoStores):
    """Mix into a test class that provides ``persistkit_url``. A store without the ``kv``
    capability is skipped (streams need it; ``pk.emit`` says so there)."""

    @pytest.fixture(autouse=True)
    def _needs_kv(self, stores: tuple[Store, Store]) -> None:
        if not stores[0].backend.supports_kv:
            pytest.skip(f"{stores[0].url} has no kv capability: durable streams need it")

    def check_stream(
        self, store: Store, thread: str, expected: list[Any], rewinds: int | None = None, every: bool = True
    ) -> list[StreamEvent]:
        """The whole stream, checked: dense offsets, the view, final-only reading, and a reader
        reconnecting after every offset (``every``; else after the offsets around each rewind
        and at both ends: a listing per offset is the slow part on S3)."""
        full = list(store.read_stream(thread, follow=False))
        assert [r.offset for r in full] == list(range(1, len(full) + 1)), "offsets are not 1, 2, 3, ..."
        assert view(full) == expected, [(r.offset, r.kind, r.data, r.to) for r in full]
        assert full[-1].kind == "end" and full[-1].data == "completed"
        if rewinds is not None:
            assert sum(r.kind == "rewind" for r in full) <= rewinds
        finals = list(store.read_stream(thread, follow=False, final_only=True))
        assert [r.data for r in finals if r.kind == "event"] == expected
        assert all(r.kind in ("event", "end") for r in finals)
        offsets = range(len(full) + 1) if every else sorted(
            {0, len(full) - 1, len(full)} | {o for r in full if r.kind == "rewind" for o in (r.to or 0, r.offset - 1, r.offset)}
        )
        for o in offsets:
            again = list(store.read_stream(thread, after=o, follow=False))
            assert again == full[o:], f"a reader reconnecting after offset {o} got {[r.offset for r in again]}"
        return full

    @pytest.mark.parametrize("point", POINTS)
    def test_a_crash_at_every_step_position_is_rewound_exactly(self, stores: tuple[Store, Store], point: str) -> None:
        first, second = stores
        thread = _thread()
        PLAN[thread] = (point, "written" if POINTS.index(point) % 2 == 0 else "lost")
        with pytest.raises(_Crash):
            _agent(first, thread)
        _agent(second, thread)
        full = self.check_stream(second, thread, EXPECTED, rewinds=1, every=point in ("parent", "in1"))
        rewound = [r for r in full if r.kind == "rewind"]
        if rewound:  # the retry's events come from a later attempt (or run) than the ones it took back
            at, to = rewound[0].offset, rewound[0].to or 0
            dead = [r for r in full[: at - 1] if r.kind == "event" and r.offset > to]
            assert dead, "a rewind that takes nothing back"
            assert all(r.run_id != d.run_id or r.attempt > d.attempt for r in full[at:] if r.kind == "event" for d in dead)

    def test_an_uncrashed_run_and_replays_emit_once(self, stores: tuple[Store, Store]) -> None:
        first, second = stores
        thread = _thread()
        with resume(thread, store=first, run_id="r1"):
            emit("a")
            _tokens(0)
        with resume(thread, store=second, run_id="r1"):  # a redelivery replays: nothing written
            emit("a")
            _tokens(0)
        full = self.check_stream(second, thread, ["a", "s0.0", "s0.1", "s0.2"], rewinds=0)
        assert {r.run_id for r in full} == {"r1"} and full[0].step == "" and full[1].step == "0"

    def test_a_retried_step_rewinds_its_failed_attempt(self, stores: tuple[Store, Store]) -> None:
        store, _ = stores
        thread = _thread()
        tries = []

        @checkpointed(name="stream_suite.flaky", retry=Retry(attempts=2, wait_initial=0, wait_jitter=0))
        def flaky() -> str:
            tries.append(1)
            emit(f"try{len(tries)}")
            if len(tries) == 1:
                current_run()._streams.flush()  # type: ignore[union-attr]
                raise ValueError("transient")
            return "ok"

        with resume(thread, store=store):
            emit("start")
            flaky()
        full = self.check_stream(store, thread, ["start", "try2"], rewinds=1)
        rewind = next(r for r in full if r.kind == "rewind")
        assert rewind.to == 1

    def test_a_stream_the_retry_never_writes_again_is_rewound_and_ended(self, stores: tuple[Store, Store]) -> None:
        first, second = stores
        thread = _thread()
        PLAN[thread] = ("tool", "written")
        with pytest.raises(_Crash):
            _tool_turn(first, thread)
        _tool_turn(second, thread)  # the retry calls no tool: it writes nothing into "status"
        status = list(second.read_stream(thread, "status", follow=False))
        assert [r.kind for r in status] == ["event", "rewind", "end"] and status[1].to == 0
        assert [r.kind for r in second.read_stream(thread, "status", follow=False, final_only=True)] == ["end"]
        self.check_stream(second, thread, ["answer"], rewinds=0)

    def test_a_failed_run_run_again_rewinds_what_its_failed_step_emitted(self, stores: tuple[Store, Store]) -> None:
        first, second = stores
        thread = _thread()
        FAIL.add(thread)
        with pytest.raises(ValueError, match="flaky"):
            _failing_turn(first, thread)
        _failing_turn(second, thread)  # continues the failed run: the failed step runs again
        full = self.check_stream(second, thread, ["before", "attempt ok"], rewinds=1)
        assert [r.data for r in full if r.kind == "end"] == ["failed", "completed"]

    def test_a_live_reader_sees_an_event_before_its_step_commits(self, stores: tuple[Store, Store]) -> None:
        writer, reader = stores
        thread = _thread()
        got: list[StreamEvent] = []
        seen = threading.Event()

        def follow() -> None:
            for r in reader.read_stream(thread, timeout=20):
                got.append(r)
                if r.kind == "event" and r.data == "thinking":
                    seen.set()

        t = threading.Thread(target=follow, daemon=True)
        t.start()

        @checkpointed(name="stream_suite.slow")
        def slow() -> bool:
            emit("thinking")
            return seen.wait(20)  # the reader got it while this step has not committed

        with resume(thread, store=writer):
            assert slow()
        t.join(20)
        assert [r.kind for r in got] == ["event", "final", "end"]

    def test_async_emit_and_read(self, stores: tuple[Store, Store]) -> None:
        writer, reader = stores
        thread = _thread()

        @checkpointed(name="stream_suite.astep")
        async def astep(n: int) -> int:
            for i in range(n):
                emit({"i": i}, stream="tokens")
                await asyncio.sleep(0)
            return n

        async def main() -> list[StreamEvent]:
            async with resume(thread, store=writer):
                await astep(3)
            return [r async for r in reader.read_stream(thread, "tokens", timeout=10)]

        out = asyncio.run(main())
        assert [r.data for r in out if r.kind == "event"] == [{"i": 0}, {"i": 1}, {"i": 2}]
        assert out[-1].kind == "end"
        assert list(reader.read_stream(thread, follow=False)) == []  # another stream is empty

    def test_a_deleted_thread_takes_its_streams_with_it(self, stores: tuple[Store, Store]) -> None:
        store, other = stores
        thread = _thread()
        with resume(thread, store=store):
            emit("a")
            emit("b", stream="status")
        assert len(list(other.read_stream(thread, "status", follow=False))) == 2
        assert other.delete_thread(thread)
        assert list(store.read_stream(thread, follow=False)) == []
        assert list(store.read_stream(thread, "status", follow=False)) == []
        with resume(thread, store=store):  # the thread starts again from offset 1
            emit("again")
        assert [(r.offset, r.data) for r in store.read_stream(thread, follow=False)][:1] == [(1, "again")]

    def test_concurrent_emitters_in_one_stream_are_warned_about(
        self, stores: tuple[Store, Store], caplog: pytest.LogCaptureFixture
    ) -> None:
        store, _ = stores
        thread = _thread()

        @checkpointed(name="stream_suite.branch")
        async def branch(name: str, stream: str) -> str:
            for i in range(3):
                emit(f"{name}{i}", stream=stream)
                await asyncio.sleep(0)
            return name

        async def main(shared: bool) -> None:
            async with resume(thread, store=store):
                await asyncio.gather(*(branch(n, "one" if shared else n) for n in ("a", "b")))

        with caplog.at_level("WARNING", logger="persistkit.streams"):
            asyncio.run(main(shared=False))  # a stream per branch: exact, nothing said
            assert not [r for r in caplog.records if "concurrently" in r.getMessage()]
            asyncio.run(main(shared=True))
        assert [r for r in caplog.records if "concurrently" in r.getMessage()]

    def test_a_reader_times_out_on_a_quiet_stream(self, stores: tuple[Store, Store]) -> None:
        store, _ = stores
        assert list(store.read_stream(_thread(), timeout=0.2)) == []

    def test_bad_names_and_places_are_refused(self, stores: tuple[Store, Store]) -> None:
        store, _ = stores
        with pytest.raises(ConfigurationError, match=r"outside a pk\.resume block"):
            emit("x")
        with pytest.raises(ConfigurationError, match="stream name"):
            store.read_stream("t", "no spaces")
        with pytest.raises(ConfigurationError, match="after must be an offset"):
            store.read_stream("t", after=-1)
        with resume(_thread(), store=store), pytest.raises(ConfigurationError, match="stream name"):
            emit("x", stream="")
