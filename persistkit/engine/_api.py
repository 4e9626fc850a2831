"""The user's view: ``@checkpointed`` steps and ``with resume(thread_id):`` blocks.

The decorator picks a sync or an async driver once, at decoration time
(like stamina). Outside a ``resume`` block a step is a plain call costing one
context-variable lookup.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import threading
import time
import typing
from collections.abc import Awaitable, Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, overload

from .._errors import (
    ConfigurationError,
    LeaseLostError,
    PersistkitError,
    SchemaVersionError,
    SerializationError,
)
from .._retry import Retry
from ..codec import _serde
from ..coordination import (
    DEFAULT_BUSY,
    DEFAULT_BUSY_TIMEOUT,
    DEFAULT_TTL,
    check_options,
    check_unfinished,
)
from ..coordination._cancel import cancelled_under, halt
from ..coordination._child_stop import close_async as close_children_async
from ..coordination._child_stop import close_sync as close_children_sync
from ..coordination._child_stop import foreign_child
from ..coordination._saga import register_result_undo
from ..coordination._suspend import Suspended
from ..coordination._suspend import end_async as suspend_end_async
from ..coordination._suspend import end_sync as suspend_end_sync
from ..ops import _telemetry as telemetry
from ..secrets._registry import _loaded
from ..state._spec import StateSpec
from . import _context, _outbox
from ._context import CURRENT
from ._inputs import live_inputs
from ._replay_check import CHECKING
from ._run import Run, StepInfo
from ._store import Store, check_namespace, check_thread_id, default_store

__all__ = ["checkpointed", "current_run", "current_step", "resume"]

P = ParamSpec("P")
R = TypeVar("R")


class _Frame:
    """Where the code runs: the run, the call path, and the step (name and attempt) if in one."""

    __slots__ = ("attempt", "name", "path", "run", "seq")

    def __init__(self, run: Run, path: str, name: str | None = None, attempt: int = 0) -> None:
        self.run = run
        self.path = path
        self.name = name
        self.attempt = attempt
        self.seq: itertools.count[int] | None = None  # made by the first child: most steps have none

    def child(self) -> str:
        seq = self.seq
        if seq is None:
            with _SEQ_LOCK:  # two threads starting the first children of one step share one count
                seq = self.seq
                if seq is None:
                    seq = self.seq = itertools.count()
        n = next(seq)  # itertools.count is atomic under the GIL: safe across threads
        return f"{self.path}/{n}" if self.path else str(n)


_SEQ_LOCK = threading.Lock()


_CURRENT: ContextVar[_Frame | None] = CURRENT  # in _context: the layers' engine modules read it too


def current_step() -> StepInfo | None:
    """The step being executed (with its stable idempotency ``key``), or None outside a step."""
    frame = _CURRENT.get()
    if frame is None or frame.name is None:
        return None
    run = frame.run
    return StepInfo(run.thread_id, run.run_id, frame.path, frame.name, frame.attempt, run.namespace)


def current_run() -> Run | None:
    """The run of the innermost ``resume`` block, or None."""
    frame = _CURRENT.get()
    return frame.run if frame is not None else None


# -- resume ------------------------------------------------------------------------------


class resume:
    """Run a block as a durable run of ``thread_id``; ``with`` and ``async with`` both work.

    Finished steps of an unfinished run replay from the store; the first
    unrecorded step runs for real. ``run_id`` makes the block idempotent: the
    same ``run_id`` twice replays the recorded run instead of running it again.
    ``state`` is a ``pk.State`` subclass (or an instance: the initial state of a
    new thread), a dict, or None for dict state.

    One live run per thread (docs/coordination.md): the block takes the thread's
    lease first, renews it every ``lease_ttl / 3`` seconds and gives it up at exit;
    every checkpoint it writes carries the lease's fencing token. When another live
    run holds it, ``busy`` decides: ``"queue"`` (default) waits in arrival order,
    ``"wait"`` waits for it to be free, ``"reject"`` raises ``pk.ThreadBusyError``,
    ``"interrupt"`` asks that run to stop at its next step (it ends ``interrupted``, its
    finished steps kept) and runs next, ``"rollback"`` does the same and puts the state
    back where the stopped turn started (docs/messages.md);
    waiting gives up after ``busy_timeout`` seconds. ``busy=None`` takes no lease.
    A run whose holder died is continued once its lease expired (at once when the
    holder ran on this machine). A crashed run keeps its place: a block of another
    ``run_id`` that finds the thread's newest run unfinished waits for that run to be
    continued (its redelivery goes first) or ``store.abandon``-ed, within ``busy_timeout``;
    then ``ThreadBusyError`` names it (``unfinished_run``). ``unfinished_timeout`` (seconds;
    None: up to ``busy_timeout``) bounds that wait alone: past it the block gives its place
    back and raises ``ThreadBusyError`` with ``retry_after``, so that a job queue's worker
    slot is free for the unfinished run's redelivery (retry the turn after ``retry_after``
    seconds). A block that ends with a ``pk.RetryableError`` stays unfinished: retrying its
    ``run_id`` continues it.

    ``retry_failed=True`` re-runs a step that ran but whose result or state could
    not be stored (a recorded ``SerializationError``, which otherwise replays on
    every resume): after the code is fixed, the continued run replays its
    committed steps and runs only that step again. Its side effects happen a
    second time, so pass it once the cause is fixed, with the run's ``run_id``.

    :param thread_id: the thread (a conversation, a task) whose run this block is.
    :param store: where the run is kept; None: :func:`default_store` (``$PERSISTKIT_URL``,
        else SQLite under ``./.persistkit/``).
    :param state: a ``pk.State`` subclass, or an instance (the initial state of a new thread),
        or a dict, or None for dict state; ``run.state`` in the block.
    :param run_id: the run's identity (an event or message id): the same ``run_id`` again
        replays the recorded run, or continues it if it did not finish. None: a new run,
        unless the thread's newest run is unfinished (then that run continues).
    :param metadata: a dict stored with the run's records (``store.history(..., metadata=)``
        filters on it).
    :param namespace: a separate chain of checkpoints inside the thread ("" by default).
    :param busy: when another live run holds the thread's lease: ``"queue"`` (default) waits
        in arrival order, ``"wait"`` waits, ``"reject"`` raises ``pk.ThreadBusyError``,
        ``"interrupt"`` asks the running turn to stop at its next step boundary and runs next,
        ``"rollback"`` does the same and puts the state back where that turn started;
        None takes no lease.
    :param lease_ttl: seconds a lease outlives a holder that stopped renewing it (default 30).
    :param busy_timeout: seconds to wait for the lease (and for the thread's unfinished run)
        before ``pk.ThreadBusyError`` (default 300; None: no limit).
    :param unfinished_timeout: seconds to wait for another turn's unfinished run before giving
        the place back with ``ThreadBusyError.retry_after`` (None: up to ``busy_timeout``).
    :param retry_failed: run again a step recorded as failed to store its result or state.
    :param concurrency: ``(name, key, limit)`` (or ``pk.Concurrency``): at most ``limit`` turns of
        that key (a tenant) run at once across every process; the others wait for a slot in arrival
        order, or are refused, as ``busy`` says (``pk.ConcurrencyLimitError``; docs/flow-control.md).
    :param debounce: with ``busy="debounce"``: ``(window, max_wait)`` seconds. The turn's ``message``
        goes to the thread's inbox; turns arriving within ``window`` of each other become one turn,
        which runs with every message in ``run.messages``; the others raise ``pk.Debounced``.
    :param message: with ``busy="debounce"``: this turn's message (needs ``run_id``).
    """

    def __init__(
        self,
        thread_id: str,
        *,
        store: Store | None = None,
        state: Any = None,
        run_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        namespace: str = "",
        busy: str | None = DEFAULT_BUSY,
        lease_ttl: float = DEFAULT_TTL,
        busy_timeout: float | None = DEFAULT_BUSY_TIMEOUT,
        unfinished_timeout: float | None = None,
        retry_failed: bool = False,
        concurrency: Any = None,
        debounce: tuple[float, float] | None = None,
        message: Any = None,
    ) -> None:
        self.thread_id = check_thread_id(thread_id)
        if not isinstance(retry_failed, bool):
            raise ConfigurationError(f"retry_failed must be True or False, got {retry_failed!r}")
        self._gate: Any = None  # concurrency= and busy="debounce" (coordination/_gate)
        if concurrency is not None or busy == "debounce" or debounce is not None or message is not None:
            from ..coordination._gate import make_gate

            self._gate, busy = make_gate(busy, concurrency, debounce, message, run_id, lease_ttl, busy_timeout)  # type: ignore[assignment]
        check_options(busy, lease_ttl, busy_timeout)
        check_unfinished(busy, unfinished_timeout)
        self._unfinished = unfinished_timeout
        # the default asks a store without lease primitives (a third-party one) for none
        self._busy = (busy, busy is not DEFAULT_BUSY, float(lease_ttl), busy_timeout)
        if store is not None and not isinstance(store, Store):
            raise ConfigurationError(f"store must be a persistkit Store (pk.connect(...)), got {store!r}")
        if run_id is not None:
            check_thread_id(run_id, "run_id")
        if metadata is not None and not isinstance(metadata, dict):
            raise ConfigurationError(f"metadata must be a dict, got {type(metadata).__name__}")
        self.store = store
        self.spec = StateSpec(state)
        self.run_id = run_id
        self.metadata = metadata
        self.retry_failed = retry_failed
        self.namespace = check_namespace(namespace)
        self._run: Run | None = None
        self._token: Token[_Frame | None] | None = None
        self._holding: Any = None  # the lease and its heartbeat (persistkit.coordination)

    def _new_run(self) -> Run:
        if self._run is not None:
            raise ConfigurationError("a resume() object can be entered once; call pk.resume(...) again")
        self._run = Run(self.store or default_store(), self.thread_id, self.namespace, self.spec, self.metadata)
        self._run.retry_failed = self.retry_failed
        self._run.refused = cancelled_under  # a refused write: did store.cancel end this run meanwhile?
        return self._run

    def __enter__(self) -> Run:
        from ..coordination._turns import open_sync

        began = time.time()  # the run's span starts here: the wait for the lease is part of it
        check = CHECKING.get()
        if check is not None:  # store.check_replay: its read-only store, no lease (engine/_replay_check)
            self.store = check.store
        run = self._new_run()
        gate = self._gate
        if check is not None:
            check.open_sync(run, self.run_id)
        else:  # the lease, then the run (after the thread's unfinished run of another turn, if any)
            if gate is not None:  # busy="debounce": send the message, join a live burst (pk.Debounced)
                gate.before_sync(run, self.run_id)
            self._holding = open_sync(run, self.run_id, *self._busy, current_run(), self._unfinished)
            if run._index and (refused := foreign_child(run)) is not None:  # a child run, outside pk.run_child
                from ..coordination._hooks import let_go_sync

                if gate is not None:
                    gate.exit_sync(run.store)
                let_go_sync(run.store, self._holding)
                raise refused
            if run._index:  # a run whose rollback a crash interrupted: finish it and raise (sagas)
                from ..coordination._rollback import finish_sync

                finish_sync(run, self._holding, (_CURRENT, _Frame, _outbox.after_step_sync))
            if run._pending:  # effects committed but not done (the process died): first (engine/_outbox)
                from ..coordination._hooks import let_go_sync

                _outbox.settle_sync(run, self._holding, let_go_sync)
            if run._index and not run.replay_only:  # its earlier attempts may have emitted (persistkit/streams)
                from ..streams._writer import opened

                opened(run)
            if gate is not None:  # gather a debounced burst; take a concurrency slot
                gate.opened_sync(run, self._holding)
        frame = _Frame(run, "")
        if gate is not None:  # busy="debounce": the batch at the block's first position (run.messages)
            gate.entered_sync(run, self._holding, frame.child)
        # the recorded steps that replay (one recorded as failed runs again, or replays its error)
        replays = sum(1 for rec in run._index.values() if rec.body.get("s") != "failed")
        run.observer = telemetry.opened(run, began, replays)  # None unless telemetry is on
        if _context.MATRIX is not None:  # the crash matrix (persistkit.testing) watches the run
            run.observer = _context.MATRIX.opened(run, run.observer)
        self._token = _CURRENT.set(frame)
        return run

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool | None:
        from ..coordination._hooks import let_go_sync, owns_lease

        run = self._run
        assert run is not None and self._token is not None
        _CURRENT.reset(self._token)
        if (check := CHECKING.get()) is not None:
            check.exit(run, exc)  # a replay check: the entry ends with the block (engine/_replay_check)
        try:
            if exc is None and (lost := _lease_lost(run)) is not None:
                raise lost  # taken over: the end is not written, the caller must not ack (docs/coordination.md)
            if _writes_nothing(run, exc):
                return run.status == "suspended" and suspend_end_sync(run, exc)  # pk.Suspended: ends cleanly
            run.release_at_end = owns_lease(self._holding)
            if exc is not None:  # failed for good: its completed steps' compensations run first (sagas)
                from ..coordination._rollback import rollback_sync

                try:
                    undo_error = rollback_sync(run, exc, (_CURRENT, _Frame, _outbox.after_step_sync))
                except Suspended as asked:  # a compensation asked (pk.suspend): the rollback waits
                    return suspend_end_sync(run, asked)
                if undo_error is not None:
                    raise undo_error from exc
            try:
                run.end_sync(exc)
            except PersistkitError as end_exc:
                if exc is not None:
                    exc.add_note(f"persistkit: the run's failure could not be recorded: {end_exc}")
                    return None
                if not isinstance(end_exc, SerializationError):
                    raise
                failure = _unstorable_end(run, end_exc)
                run.end_sync(failure)  # a failure's checkpoint keeps what cannot be stored at its last stored value
                raise failure from end_exc
        finally:
            if self._gate is not None:
                self._gate.exit_sync(run.store)
            let_go_sync(run.store, self._holding)
            close_children_sync(run, exc)  # the run ended: its unfinished children are cancelled (coordination/_child_stop)
            if run.observer is not None:
                run.observer.end(run, exc)
        return None

    async def __aenter__(self) -> Run:
        from ..coordination._turns import open_async

        began = time.time()
        check = CHECKING.get()
        if check is not None:  # store.check_replay: its read-only store, no lease (engine/_replay_check)
            self.store = check.store
        run = self._new_run()
        gate = self._gate
        if check is not None:
            await check.open_async(run, self.run_id)
        else:
            if gate is not None:
                await gate.before_async(run, self.run_id)
            self._holding = await open_async(run, self.run_id, *self._busy, current_run(), self._unfinished)
            if run._index and (refused := foreign_child(run)) is not None:  # a child run, outside pk.run_child
                from ..coordination._hooks import let_go_async

                if gate is not None:
                    await gate.exit_async(run.store)
                await let_go_async(run.store, self._holding)
                raise refused
            if run._index:  # a run whose rollback a crash interrupted: finish it and raise (sagas)
                from ..coordination._rollback import finish_async

                await finish_async(run, self._holding, (_CURRENT, _Frame, _outbox.after_step_async))
            if run._pending:
                from ..coordination._hooks import let_go_async

                await _outbox.settle_async(run, self._holding, let_go_async)
            if run._index and not run.replay_only:  # its earlier attempts may have emitted (persistkit/streams)
                from ..streams._writer import opened

                opened(run)
            if gate is not None:
                await gate.opened_async(run, self._holding)
        frame = _Frame(run, "")
        if gate is not None:
            await gate.entered_async(run, self._holding, frame.child)
        # the recorded steps that replay (one recorded as failed runs again, or replays its error)
        replays = sum(1 for rec in run._index.values() if rec.body.get("s") != "failed")
        run.observer = telemetry.opened(run, began, replays)  # None unless telemetry is on
        if _context.MATRIX is not None:  # the crash matrix (persistkit.testing) watches the run
            run.observer = _context.MATRIX.opened(run, run.observer)
        self._token = _CURRENT.set(frame)
        return run

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool | None:
        from ..coordination._hooks import let_go_async, owns_lease

        run = self._run
        assert run is not None and self._token is not None
        _CURRENT.reset(self._token)
        if (check := CHECKING.get()) is not None:
            check.exit(run, exc)  # a replay check: the entry ends with the block (engine/_replay_check)
        try:
            if exc is None and (lost := _lease_lost(run)) is not None:
                raise lost
            if _writes_nothing(run, exc):
                return run.status == "suspended" and await suspend_end_async(run, exc)  # pk.Suspended: ends cleanly
            run.release_at_end = owns_lease(self._holding)
            if exc is not None:  # failed for good: its completed steps' compensations run first (sagas)
                from ..coordination._rollback import rollback_async

                try:
                    undo_error = await rollback_async(run, exc, (_CURRENT, _Frame, _outbox.after_step_async))
                except Suspended as asked:
                    return await suspend_end_async(run, asked)
                if undo_error is not None:
                    raise undo_error from exc
            try:
                await run.end_async(exc)
            except PersistkitError as end_exc:
                if exc is not None:
                    exc.add_note(f"persistkit: the run's failure could not be recorded: {end_exc}")
                    return None
                if not isinstance(end_exc, SerializationError):
                    raise
                failure = _unstorable_end(run, end_exc)
                await run.end_async(failure)  # a failure's checkpoint keeps what cannot be stored at its last stored value
                raise failure from end_exc
        finally:
            if self._gate is not None:
                await self._gate.exit_async(run.store)
            await let_go_async(run.store, self._holding)
            await close_children_async(run, exc)
            if run.observer is not None:
                run.observer.end(run, exc)
        return None


def _lease_lost(run: Run) -> LeaseLostError | None:
    """The takeover the lease's heartbeat found while the block ran (another holder has the
    lease: the run must write nothing more, not even its end). A block that ends cleanly then
    raises it: ending quietly would let the caller ack a turn whose run stays unfinished."""
    if run.replay_only or run.lease is None:
        return None
    return run.lease.lost


def _writes_nothing(run: Run, exc: BaseException | None) -> bool:
    """A replayed run writes nothing, nor one that ``exc`` leaves unfinished
    (``Run.leaves_unfinished``: an interrupt, a ``pk.RetryableError``, a
    ``NonDeterminismError``, a failed migration, a suspend, a lost lease)."""
    return run.replay_only or run.leaves_unfinished(exc)


def _unstorable_end(run: Run, exc: SerializationError) -> SerializationError:
    return SerializationError(
        f"thread {run.thread_id!r} run {run.run_id}: the state at the end of the run cannot be stored "
        f"({exc}); the run is recorded as failed, with each such field at its last stored value. "
        "Keep functions, locks, clients and other live objects out of run.state; after the fix, "
        f"pk.resume({run.thread_id!r}, run_id={run.run_id!r}) replays the run's steps without "
        "running them and records its end"
    )


# -- checkpointed --------------------------------------------------------------------------


@dataclass(slots=True)
class _Step:
    fn: Callable[..., Any]
    name: str
    retry: Retry | None
    check_args: bool
    takes_thread_id: bool
    takes_store: bool = False
    hints_done: bool = False
    undo: str | None = None  # compensate=: the stored name of undo(result) (sagas)

    def register_hints(self) -> None:
        """Trust the types named in the signature (a later process may revive them).
        Once per step function: the caller checks ``hints_done`` (on the per-call path)."""
        self.hints_done = True
        try:
            hints = typing.get_type_hints(self.fn, include_extras=True)
        except Exception:  # unresolvable forward references: nothing to register
            return
        for hint in hints.values():
            _serde.register_type_hints(hint)


@overload
def checkpointed(fn: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def checkpointed(
    *, name: str | None = None, retry: Retry | None = None, check_args: bool = True,
    compensate: Callable[..., Any] | None = None, limit: str | tuple[str, Any] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def checkpointed(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    retry: Retry | None = None,
    check_args: bool = True,
    compensate: Callable[..., Any] | None = None,
    limit: str | tuple[str, Any] | None = None,
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a function a durable step: inside a ``resume`` block each call is recorded, and a
    recorded call replays its result instead of running again.

    ``name`` (default: the function's qualified name) is what replay matches
    on; ``retry`` retries failed attempts, replaying finished child steps;
    ``check_args`` refuses to replay a step called with different arguments.
    ``compensate`` (a module-level function) undoes the step: if the run fails for good
    after the step completed, ``compensate(result)`` runs (see ``pk.compensate``).
    Outside a block, pass ``thread_id=...`` (and ``store=...``, default
    :func:`default_store`) to run the one call as a block.

    :param fn: the function, for ``@pk.checkpointed``; None for ``@pk.checkpointed(...)``
        with options. Sync and ``async def`` functions both work; a generator does not.
    :param name: what replay matches a recorded step on (default: the function's qualified
        name); give one to rename or move the function without breaking waiting runs.
    :param retry: a ``pk.Retry`` policy for failed attempts (finished child steps replay).
    :param check_args: refuse to replay a step called with other arguments than recorded
        (``pk.NonDeterminismError``); False for a step whose input may change (the turn's
        event, read again by a process that has only the thread).
    :param compensate: a module-level function that undoes the step: if the run fails for
        good after the step completed, ``compensate(result)`` runs (see ``pk.compensate``).
    :param limit: a shared rate limit (``store.limits``) each live call draws from before its
        body runs: a name, or ``(name, key)`` with key a str/int or a function of the step's
        arguments (a tenant id). A replayed step never draws (docs/flow-control.md).
    """
    if name is not None and (not isinstance(name, str) or not name):
        raise ConfigurationError(f"@checkpointed(name={name!r}): name must be a non-empty str")
    if retry is not None and not isinstance(retry, Retry):
        raise ConfigurationError(f"@checkpointed(retry={retry!r}): expected pk.Retry(...)")

    def decorate(f: Callable[P, R]) -> Callable[P, R]:
        if not callable(f):
            raise TypeError(f"@checkpointed decorates a function, got {f!r}")
        if inspect.isgeneratorfunction(f) or inspect.isasyncgenfunction(f):
            raise TypeError(
                f"@checkpointed cannot decorate the generator {f.__qualname__}: a generator's "
                "values are produced after the call returns. Return a list instead, or make "
                "each item a step"
            )
        try:
            params = inspect.signature(f).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        step_name: str = name or getattr(f, "__qualname__", None) or repr(f)
        body: Callable[..., Any] = f
        if limit is not None:  # the body draws before it runs: a replayed step never calls it
            from ._flow import limited_body

            body = limited_body(f, limit)
        step = _Step(body, step_name, retry, check_args, "thread_id" in params, "store" in params)
        if compensate is not None:
            from ..coordination._saga import undo_name

            step.undo = undo_name(compensate, step_name)
        _serde.register_module(getattr(f, "__module__", "") or "__main__")
        if inspect.iscoroutinefunction(f):
            return _async_wrapper(step)  # type: ignore[return-value]
        return _sync_wrapper(step)

    return decorate if fn is None else decorate(fn)


def _sync_wrapper(step: _Step) -> Callable[..., Any]:
    fn = step.fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        frame = _CURRENT.get()
        if frame is None:
            if "thread_id" in kwargs and not step.takes_thread_id:
                with resume(kwargs.pop("thread_id"), store=_one_call_store(step, kwargs)):
                    return wrapper(*args, **kwargs)
            if _context.MATRIX is not None:  # the crash matrix counts a step run where no run is
                _context.MATRIX.plain(step.name)
            return fn(*args, **kwargs)
        if frame.run.observer is not None:  # telemetry on (ops/_telemetry): the same call, in a span
            return frame.run.observer.call_sync(_call_sync, step, frame, args, kwargs)
        return _call_sync(step, frame, args, kwargs)

    return wrapper


def _async_wrapper(step: _Step) -> Callable[..., Awaitable[Any]]:
    fn = step.fn

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        frame = _CURRENT.get()
        if frame is None:
            if "thread_id" in kwargs and not step.takes_thread_id:
                async with resume(kwargs.pop("thread_id"), store=_one_call_store(step, kwargs)):
                    return await wrapper(*args, **kwargs)
            if _context.MATRIX is not None:
                _context.MATRIX.plain(step.name)
            return await fn(*args, **kwargs)
        if frame.run.observer is not None:  # telemetry on (ops/_telemetry): the same call, in a span
            return await frame.run.observer.call_async(_call_async, step, frame, args, kwargs)
        return await _call_async(step, frame, args, kwargs)

    return wrapper


def _one_call_store(step: _Step, kwargs: dict[str, Any]) -> Any:
    """The ``store=`` of a one-call block (``step(..., thread_id=t, store=s)``; None: the
    default store), unless the step takes a ``store`` argument itself."""
    return None if step.takes_store else kwargs.pop("store", None)


def _begin(
    step: _Step, frame: _Frame, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[str, Any, bytes | str | None]:
    """Position, the record to replay (or None) and the arguments' digest material
    (``Run.arguments``) of one step call to run."""
    if not step.hints_done:
        step.register_hints()
    run = frame.run
    if run.load_error is not None:
        raise SchemaVersionError(f"this run cannot go on: {run.load_error}")
    if run.status != "running":  # suspended (even if its pk.Suspended was caught), asked to stop, ...
        halt(run)  # raises before the step, or returns (coordination/_cancel)
    position = frame.child()
    # run.lookup() decides; a position the run has not recorded runs live without asking
    rec = run.lookup(position, step.name) if position in run._index or run.replay_only else None
    if rec is not None:
        if step.check_args:
            run.check_args(rec, position, step.name, args, kwargs)
        return position, rec, None
    run.precheck(position, step.name)
    return position, None, run.arguments(args, kwargs) if step.check_args else None


def _call_sync(step: _Step, frame: _Frame, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    run = frame.run
    position, rec, digest = _begin(step, frame, args, kwargs)
    if rec is not None:
        return run.replay(rec)
    if _loaded:  # a handle was read back unresolved: resolve what the body gets, or refuse
        args, kwargs = live_inputs(run, position, step.name, args, kwargs, digest)
    if step.retry is None:  # the common case, without the closure a retry loop needs
        token = _CURRENT.set(_Frame(run, position, step.name, 1))
        try:
            result = step.fn(*args, **kwargs)
        except BaseException as exc:
            _CURRENT.reset(token)
            run.mark_escaped(exc)
            if isinstance(exc, Exception):
                run.step_sync(position, step.name, digest, error=exc)
            raise
        _CURRENT.reset(token)
        if step.undo is not None:
            register_result_undo(run, position, step.undo)
        run.step_sync(position, step.name, digest, result=result)
        if run._effects:  # after-commit effects of this step: run now that it is durable
            _outbox.after_step_sync(run, position)
        return result
    attempt = 0

    def body() -> Any:
        nonlocal attempt
        attempt += 1
        token = _CURRENT.set(_Frame(run, position, step.name, attempt))
        try:
            return step.fn(*args, **kwargs)
        except BaseException as exc:
            run.mark_escaped(exc)
            run._marks.pop(position, None)  # what a failed attempt registered is not committed
            raise
        finally:
            _CURRENT.reset(token)

    import tenacity

    try:
        retried = functools.partial(telemetry.retrying, run, position, step.name)  # logs, and a span event
        for att in tenacity.Retrying(**step.retry.tenacity_kwargs(), before_sleep=retried):
            with att:
                result = body()
    except Exception as exc:
        run.step_sync(position, step.name, digest, error=exc)
        raise
    if step.undo is not None:
        register_result_undo(run, position, step.undo)
    run.step_sync(position, step.name, digest, result=result)
    if run._effects:
        _outbox.after_step_sync(run, position)
    return result


async def _call_async(step: _Step, frame: _Frame, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    run = frame.run
    position, rec, digest = _begin(step, frame, args, kwargs)
    if rec is not None:
        return run.replay(rec)
    if _loaded:  # a handle was read back unresolved: resolve what the body gets, or refuse
        args, kwargs = live_inputs(run, position, step.name, args, kwargs, digest)
    if step.retry is None:
        token = _CURRENT.set(_Frame(run, position, step.name, 1))
        try:
            result = await step.fn(*args, **kwargs)
        except BaseException as exc:
            _CURRENT.reset(token)
            run.mark_escaped(exc)
            if isinstance(exc, Exception):
                await run.step_async(position, step.name, digest, error=exc)
            raise
        _CURRENT.reset(token)
        if step.undo is not None:
            register_result_undo(run, position, step.undo)
        await run.step_async(position, step.name, digest, result=result)
        if run._effects:
            await _outbox.after_step_async(run, position)
        return result
    attempt = 0

    async def body() -> Any:
        nonlocal attempt
        attempt += 1
        token = _CURRENT.set(_Frame(run, position, step.name, attempt))
        try:
            return await step.fn(*args, **kwargs)
        except BaseException as exc:
            run.mark_escaped(exc)
            run._marks.pop(position, None)  # what a failed attempt registered is not committed
            raise
        finally:
            _CURRENT.reset(token)

    import tenacity

    try:
        retried = functools.partial(telemetry.retrying, run, position, step.name)
        async for att in tenacity.AsyncRetrying(**step.retry.tenacity_kwargs(), before_sleep=retried):
            with att:
                result = await body()
    except Exception as exc:
        await run.step_async(position, step.name, digest, error=exc)
        raise
    if step.undo is not None:
        register_result_undo(run, position, step.undo)
    await run.step_async(position, step.name, digest, result=result)
    if run._effects:
        await _outbox.after_step_async(run, position)
    return result
