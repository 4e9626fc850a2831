"""What the crash matrix sees of the agent it runs (``persistkit.testing.crash_matrix``).

:class:`Watch` is installed as ``engine._context.MATRIX`` while the agent runs: every
``pk.resume`` block hands it its run, and it becomes the run's observer (wrapping the
telemetry observer when there is one), so it sees every step call. For a step that runs
live it wraps the body: it counts the body's runs by step key (thread, namespace,
position, and the run: its ordinal among the runs of its thread, as the store has them), keeps its arguments' digest and its result, and passes the three crash points
of the step: ``before`` (the engine decided to run the body: nothing of the step is
written), ``inside`` (the body ran: its side effects happened, its result never reached
the engine) and ``after`` (the body returned and the engine is about to write its
checkpoint: the write never lands). A step called where no run is current (another
thread, code after the block) is counted by name: it is recorded nowhere. ``forced``
(step key -> its name and a result) makes a watched body return that result instead of
its own (the body still runs): the uncrashed run the matrix compares a resume with when
a step that is not deterministic returned something else after the crash.

:class:`RecordingStore` is the ``pk.Store`` the agent is given: it logs every checkpoint
write that lands, in order, so that "what a process dying at this point leaves in the
store" is a prefix of the log (:meth:`RecordingStore.materialize`), and it passes the
``after`` point just before the step's own write.
"""

from __future__ import annotations

import base64
import copy
import os
import pickle
import select
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

from ..backends import CheckpointRow, Head
from ..engine import _context
from ..engine._store import Store
from ._crash_effects import AFTER, IN_STEP, arg_prints, mutated
from ._crash_report import FAILED

__all__ = [
    "FAILED",
    "UNCARRIED",
    "Crash",
    "Point",
    "Raised",
    "RecordingStore",
    "Series",
    "Snapshot",
    "StepCall",
    "Watch",
    "kill_self",
    "wait_child",
]

# thread, namespace, position, run (its ordinal on the thread, "0" for the first)
Key = tuple[str, str, str, str]

#: A step checkpoint as the matrix compares it: its position, its name (+ FAILED), its run's ordinal.
Landed = tuple[str, str, str]

WHENS = ("before", "inside", "after")

#: The step whose checkpoint is the next write in this context (see ``Watch._wrote_next``).
_AFTER: ContextVar[tuple[Watch, int, Key, str] | None] = ContextVar(
    "persistkit_matrix_after", default=None
)


class Crash(BaseException):
    """A process death in miniature: not an ``Exception``, so the engine records nothing for
    the step, and the block writes no end record (a ``BaseException`` other than an
    ``Exception`` leaves the run unfinished, as a killed process does)."""


@dataclass(frozen=True, slots=True)
class Point:
    """One crash point: the ``index``-th step body of the run (call order), ``when``."""

    index: int
    when: str
    key: Key
    step: str
    cuts: Mapping[tuple[str, str], str] = field(
        default_factory=dict
    )  # per chain: the last checkpoint landed
    counts: Mapping[Key, int] = field(default_factory=dict)  # body runs so far
    plain: Mapping[str, int] = field(default_factory=dict)  # runs outside any run so far
    committed: frozenset[Key] = frozenset()
    # process mode: the steps that committed in the killed run: their arguments' digest and
    # result (UNCARRIED: pickle could not carry it)
    results: Mapping[Key, tuple[str, Any]] = field(default_factory=dict)

    def label(self) -> str:
        where = {"before": "before", "inside": "inside", "after": "after"}[self.when]
        return f"crash {where} step #{self.index} `{self.step}` (position {self.key[2]})"


@dataclass(slots=True)
class StepCall:
    """One live step body run, as the watch saw it."""

    key: Key
    step: str
    digest: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: Any = None
    returned: bool = False
    error: BaseException | None = None
    mutated: tuple[str, ...] = ()  # the arguments its body changed in place (the uncrashed run)


@dataclass(frozen=True, slots=True)
class Raised:
    """A forced outcome that is an error: the step raises it (the run it is forced from
    recorded that error, and a replay gives it back)."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class Series:
    """Forced outcomes of one step key called more than once (a ``retry=`` step's attempts),
    in call order; the last repeats."""

    items: tuple[Any, ...]


#: A step result the killed child could not pickle (process mode's event log).
UNCARRIED = object()

#: Result types kept as they are (no copy): nothing can change them after the body returned.
_ATOMS = frozenset({str, int, float, bool, bytes, type(None)})


def _kept(value: Any) -> Any:
    """``value`` as it was when the body returned, whatever the agent does to it later."""
    if type(value) in _ATOMS:
        return value
    try:
        return copy.deepcopy(value)
    except Exception:
        return value


class Watch:
    """The matrix's view of one agent call (see the module docstring).

    ``on_point(point)`` is called at every crash point; it may raise :class:`Crash`, kill
    the process, or record the point and return."""

    def __init__(
        self,
        on_point: Callable[[Point], None] | None = None,
        events_fd: int | None = None,
        forced: Mapping[Key, tuple[str, Any]] | None = None,
    ) -> None:
        self.on_point = on_point
        self.forced = forced  # step key -> (name, the result its body returns instead)
        self.events_fd = events_fd  # process mode: each body start is written here as it happens
        self.counts: Counter[Key] = Counter()
        self.plain_counts: Counter[str] = Counter()
        self.calls: list[StepCall] = []
        self.committed: set[Key] = set()
        self.runs: dict[tuple[str, str], Any] = {}  # (thread, namespace) -> the run's last Run
        self.end_states: dict[tuple[str, str], Any] = {}
        self.cuts: dict[tuple[str, str], str] = {}  # per chain: the last checkpoint that landed
        # per chain, in the order they landed: each checkpoint id and, for a step's, (position, name)
        self.log: dict[tuple[str, str], list[tuple[str, Landed | None]]] = {}
        self.index = 0
        # per chain: its run ids, oldest first
        self.run_order: dict[tuple[str, str], list[str]] = {}
        self.attempts: dict[Key, int] = {}  # per step key: the attempts its retry= allows
        self._wrapped: dict[int, tuple[Any, Any]] = {}  # id(step) -> (step, its wrapped copy)
        self._served: Counter[Key] = Counter()  # forced outcomes given, per key
        self.checks = False  # the uncrashed run: effects between steps, arguments changed in place
        self.effects: list[tuple[str, str]] = []  # (what, where) made outside any step

    def seed(self, store: Store, chains: Any) -> Watch:
        """Number the runs ``store`` already holds, as the run they came from did."""
        for thread, ns in chains:
            for cp in reversed(store.history(thread, namespace=ns)):
                self.ordinal(thread, ns, cp.run_id or "")
        return self

    def ordinal(self, thread: str, ns: str, run_id: str) -> str:
        order = self.run_order.setdefault((thread, ns), [])
        if run_id not in order:
            order.append(run_id)
        return str(order.index(run_id))

    # -- the engine's side ----------------------------------------------------------------

    def opened(self, run: Any, observer: Any) -> Any:
        self.runs[(run.thread_id, run.namespace)] = run
        self.ordinal(run.thread_id, run.namespace, run.run_id)
        return _Observer(self, observer, run)

    def plain(self, name: str) -> None:
        self.plain_counts[name] += 1
        self._event(f"plain\t{name}\n")

    def _event(self, line: str) -> None:
        if self.events_fd is not None:
            os.write(self.events_fd, line.encode())

    def point(self, index: int, when: str, key: Key, step: str) -> None:
        if self.on_point is None:
            return
        self.on_point(
            Point(
                index,
                when,
                key,
                step,
                dict(self.cuts),
                dict(self.counts),
                dict(self.plain_counts),
                frozenset(self.committed),
            )
        )

    def body(self, step: Any) -> Any:
        """The step object the engine runs, its body wrapped (the engine calls it only to run
        it live). One copy per step function and agent call: the wrapper finds the call it
        runs in the engine's frame."""
        found = self._wrapped.get(id(step))
        if found is not None and found[0] is step:
            return found[1]
        if not step.hints_done:
            step.register_hints()  # on the user's step, once: the copy must not repeat it
        fn, watch = step.fn, self

        def wrapped(*a: Any, **k: Any) -> Any:
            frame = _context.CURRENT.get()  # the step's own frame: its run, position and name
            run, name = frame.run, frame.name
            key = (run.thread_id, run.namespace, frame.path, watch.ordinal(run.thread_id, run.namespace, run.run_id))
            watch.attempts[key] = step.retry.attempts if step.retry is not None else 1
            index = watch.index
            watch.index += 1
            call = StepCall(key, name, run.digest(a, k), a, k)
            watch.calls.append(call)
            watch.point(index, "before", key, name)
            watch.counts[key] += 1
            watch._event(f"run\t{key[0]}\t{key[1]}\t{key[2]}\t{key[3]}\t{name}\n")
            prints = arg_prints(a, k) if watch.checks else None
            token = IN_STEP.set(True)
            try:
                result = fn(*a, **k)
            except Exception as exc:
                return watch._ended(call, index, fn, prints, None, exc)
            finally:
                IN_STEP.reset(token)
            if _awaitable(result):
                return _finish_async(watch, call, index, result, fn, prints)
            return watch._ended(call, index, fn, prints, result, None)

        copy = replace(step, fn=wrapped)
        self._wrapped[id(step)] = (step, copy)
        return copy

    def _ended(
        self,
        call: StepCall,
        index: int,
        fn: Any,
        prints: list[bytes | None] | None,
        result: Any,
        error: BaseException | None,
    ) -> Any:
        """The body of ``call`` returned ``result`` or raised ``error``: what the step gives
        the engine (a forced outcome replaces it)."""
        if prints is not None:
            call.mutated = tuple(mutated(fn, call.args, call.kwargs, prints))
        AFTER.set(f"after step `{call.step}` at position {call.key[2]}")
        forced = self._forced(call)
        if forced is not None:
            result, error = (None, forced.error) if isinstance(forced, Raised) else (_kept(forced), None)
        if error is not None:
            call.error = error
            self._wrote_next(index, call.key, call.step)  # its failure's checkpoint is the next write
            raise error
        return self._returned(call, index, result)

    def _forced(self, call: StepCall) -> Any:
        if self.forced is None:
            return None
        given = self.forced.get(call.key)
        if given is None or given[0] != call.step:
            return None
        value = given[1]
        if isinstance(value, Series):
            n = self._served[call.key]
            self._served[call.key] += 1
            value = value.items[min(n, len(value.items) - 1)]
        return value

    def _returned(self, call: StepCall, index: int, result: Any) -> Any:
        call.result, call.returned = _kept(result), True
        if self.events_fd is not None:  # process mode: what the killed run's step returned
            try:
                data = base64.b64encode(pickle.dumps(call.result)).decode()
            except Exception:
                data = "-"
            k = call.key
            self._event(f"result\t{k[0]}\t{k[1]}\t{k[2]}\t{k[3]}\t{call.digest}\t{data}\n")
        self.point(index, "inside", call.key, call.step)
        self._wrote_next(index, call.key, call.step)
        return result

    def before_write(self) -> None:
        after = _AFTER.get()
        if after is not None and after[0] is self:
            _AFTER.set(None)
            self.point(after[1], "after", after[2], after[3])

    def _wrote_next(self, index: int, key: Key, step: str) -> None:
        """The next checkpoint write in this context is step ``index``'s: its ``after`` point.
        Per context, not per watch: steps run side by side (``asyncio.gather``) each write
        their own checkpoint in their own task, after the others' bodies may have returned."""
        _AFTER.set((self, index, key, step))

    def landed(self, run: Any, body: Mapping[str, Any]) -> None:
        chain = (run.thread_id, run.namespace)
        step = None
        if body.get("k") == "step" and "dm" not in body and body.get("p") is not None:
            ordinal = self.ordinal(*chain, run.run_id)
            step = (str(body["p"]), str(body.get("n")) + (FAILED if body.get("s") == "failed" else ""), ordinal)
            self.committed.add((*chain, step[0], ordinal))
        if run.checkpoint_id is not None:
            self.cuts[chain] = run.checkpoint_id
            self.log.setdefault(chain, []).append((run.checkpoint_id, step))

    def steps(self, chain: tuple[str, str], cut: str | None = None) -> list[Landed]:
        """The step checkpoints of ``chain`` that landed (up to ``cut``, if given), in order."""
        out = []
        for cid, step in self.log.get(chain, ()):
            if step is not None:
                out.append(step)
            if cid == cut:
                break
        return out


def _awaitable(value: Any) -> bool:
    import inspect

    return inspect.isawaitable(value)


async def _finish_async(
    watch: Watch, call: StepCall, index: int, pending: Any, fn: Any, prints: list[bytes | None] | None
) -> Any:
    token = IN_STEP.set(True)
    try:
        result = await pending
    except Exception as exc:
        return watch._ended(call, index, fn, prints, None, exc)
    finally:
        IN_STEP.reset(token)
    return watch._ended(call, index, fn, prints, result, None)


class _Observer:
    """The run's observer while the matrix watches: steps through the watch, the rest to
    the telemetry observer when there is one."""

    __slots__ = ("inner", "run", "watch")

    def __init__(self, watch: Watch, inner: Any, run: Any) -> None:
        self.watch, self.inner, self.run = watch, inner, run

    def call_sync(
        self, call: Callable[..., Any], step: Any, frame: Any, args: Any, kwargs: Any
    ) -> Any:
        step = self.watch.body(step)
        if self.inner is not None:
            return self.inner.call_sync(call, step, frame, args, kwargs)
        return call(step, frame, args, kwargs)

    async def call_async(
        self, call: Callable[..., Any], step: Any, frame: Any, args: Any, kwargs: Any
    ) -> Any:
        step = self.watch.body(step)
        if self.inner is not None:
            return await self.inner.call_async(call, step, frame, args, kwargs)
        return await call(step, frame, args, kwargs)

    def replayed(self, position: str, name: str, failed: bool) -> None:
        if self.inner is not None:
            self.inner.replayed(position, name, failed)

    def wrote(
        self, payload: bytes, blobs: Mapping[str, bytes], body: Mapping[str, Any], seconds: float
    ) -> None:
        self.watch.landed(self.run, body)
        if self.inner is not None:
            self.inner.wrote(payload, blobs, body, seconds)

    def end(self, run: Any, exc: BaseException | None) -> None:
        self.watch.end_states[(run.thread_id, run.namespace)] = run.state
        if self.inner is not None:
            self.inner.end(run, exc)


class RecordingStore(Store):
    """A ``pk.Store`` that passes the ``after`` crash point just before a step's checkpoint
    write (see the module docstring)."""

    def __init__(self, base: Store) -> None:
        super().__init__(base.backend, codec=base.codec)
        self.watch: Watch | None = None

    def _before(self) -> None:
        if self.watch is not None:
            self.watch.before_write()

    def write_sync(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected: int) -> Head:
        self._before()
        return super().write_sync(row, blobs, expected)

    async def write_async(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected: int
    ) -> Head:
        self._before()
        return await super().write_async(row, blobs, expected)

    def write_fenced_sync(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected: int, lease: Any
    ) -> Head:
        self._before()
        return super().write_fenced_sync(row, blobs, expected, lease)

    async def write_fenced_async(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected: int, lease: Any
    ) -> Head:
        self._before()
        return await super().write_fenced_async(row, blobs, expected, lease)


class Snapshot:
    """The rows and values a finished agent call left in a store, to make the store a death
    at any earlier point left: each chain cut after the last checkpoint that had landed."""

    def __init__(self, store: Store, threads: set[tuple[str, str]]) -> None:
        self.rows: dict[tuple[str, str], dict[str, CheckpointRow]] = {}
        self.blobs: dict[str, dict[str, bytes]] = {}
        backend = store.backend
        for thread, ns in sorted(threads):
            self.rows[(thread, ns)] = {r.checkpoint_id: r for r in backend.list(thread, ns)}
            if thread not in self.blobs:
                self.blobs[thread] = backend.scan_blobs(thread, "", "\x7f")

    def chain(self, chain: tuple[str, str], cut: str) -> list[CheckpointRow]:
        """The rows from the thread's first checkpoint to ``cut``, by their parent links (two
        ids made in one clock tick need not sort in the order they were written)."""
        rows, out = self.rows.get(chain, {}), []
        at: str | None = cut
        while at is not None and at in rows:
            out.append(rows[at])
            at = rows[at].parent_id
        return out[::-1]

    def materialize(self, into: Store, cuts: Mapping[tuple[str, str], str]) -> None:
        """Write into the empty store ``into`` each chain up to its cut (no lease: a dead
        holder's lease is over)."""
        backend, given = into.backend, set()
        for chain, cut in cuts.items():
            version = 0
            for row in self.chain(chain, cut):
                blobs = self.blobs.get(chain[0], {}) if chain[0] not in given else {}
                given.add(chain[0])
                version = backend.write(row, blobs, version).version


def wait_child(pid: int, timeout: float) -> int | None:
    """Process mode: the wait status of child ``pid``, or None if it did not end within
    ``timeout`` seconds (it is killed then: a child stuck for good, e.g. waiting for a thread
    of the parent that ``os.fork`` did not copy, must not hang the matrix)."""
    deadline = time.monotonic() + timeout
    pidfd = (
        os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    )  # Linux: a wait with a timeout
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None
            if pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(0.01, left))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def kill_self(point: Point) -> None:
    """Process mode: die here, as a ``kill -9`` would kill the process."""
    os.kill(os.getpid(), signal.SIGKILL)
