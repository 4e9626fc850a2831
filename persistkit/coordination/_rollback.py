"""The two loops that run a rollback (``_saga`` decides what; these do it): at the end of a
block that failed for good (``rollback_sync``/``rollback_async``, before the end record),
and when a resume opens a run whose rollback a crash interrupted (``finish_sync``/
``finish_async``, instead of the block). Both run under the block's lease: every record
is a fenced write.

Each compensation runs as a step at its own position (``c/i``) in an engine frame, so
``pk.current_step()`` (its stable ``key``) and nested ``@checkpointed`` calls work inside
it. The engine hands its frame variable and frame class in (``frames``): this floor does
not import the engine.
"""

from __future__ import annotations

import asyncio
import inspect
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NoReturn

from .._errors import ConfigurationError, PersistkitError, RunCompensatedError, SerializationError
from ._cancel import ending, rewind_async, rewind_sync
from ._hooks import Holding, let_go_async, let_go_sync, owns_lease
from ._saga import COMPENSATED, COMPENSATING, ROLLBACK, ROLLBACK_NAME, Item, Rollback

if TYPE_CHECKING:
    from ..engine._run import Run

__all__ = ["finish_async", "finish_sync", "rollback_async", "rollback_sync"]

#: The engine's frame variable and frame class: ``(run, path, name, attempt) -> frame``.
#: The engine's frame variable, its frame class, and what runs a step's after-commit effects
#: once its checkpoint landed (``engine/_outbox.after_step_sync`` / ``after_step_async``).
Frames = tuple[ContextVar[Any], Any, Any]


def _storable(run: Run) -> None:
    """The rollback records carry the state as it is; state the block left unstorable is
    set back to the state of the run's latest step (a failure must still be undone)."""
    try:
        run.precheck(ROLLBACK, ROLLBACK_NAME)
    except SerializationError:
        if not run._index:
            raise
        run._restore(max(run._index.values(), key=lambda r: r.id))


def _stop(run: Run, exc: Exception) -> None:
    """Raise what stops the rollback itself (the run cannot write: its lease or its head was
    taken; the lease's error rather than what the compensation raised meanwhile), rather
    than count ``exc`` as a compensation that failed."""
    lost = run.lease.lost if run.lease is not None else None
    if lost is not None and exc is not lost:
        raise lost from exc
    if run.lease_lost(exc) or run._lost is not None:
        raise exc


def _awaited(result: Any, item: Item) -> Any:
    """An async compensation run by a sync block: on its own event loop."""
    if not inspect.isawaitable(result):
        return result
    try:
        asyncio.get_running_loop()
    except RuntimeError:

        async def wait() -> Any:
            return await result

        return asyncio.run(wait())
    if inspect.iscoroutine(result):
        result.close()
    raise ConfigurationError(
        f"compensation {item.describe()} is async, and this block is a sync `with pk.resume` inside a "
        "running event loop: use `async with pk.resume(...)` there"
    )


def _one_sync(run: Run, item: Item, rb: Rollback, frames: Frames) -> None:
    var, frame, after_step = frames
    try:
        fn, args, kwargs, policy = rb.call(item)
    except PersistkitError as exc:
        run._attach["rs"] = COMPENSATING
        run.step_sync(item.position, item.name, None, error=exc)
        rb.not_done(item, exc)
        return
    attempt = 0

    def body() -> Any:
        nonlocal attempt
        attempt += 1
        token = var.set(frame(run, item.position, item.name, attempt))
        try:
            return _awaited(fn(*args, **kwargs), item)
        except BaseException as exc:
            run.mark_escaped(exc)
            raise
        finally:
            var.reset(token)

    import tenacity

    try:
        for att in tenacity.Retrying(**policy.tenacity_kwargs()):
            with att:
                body()
    except Exception as exc:
        _stop(run, exc)
        run._attach["rs"] = COMPENSATING
        run.step_sync(item.position, item.name, None, error=exc)
        rb.not_done(item, exc)
        return
    run._attach["rs"] = COMPENSATING
    run.step_sync(item.position, item.name, None, result=None)  # its return value is not kept
    rb.done(item)
    if run._effects:  # pk.after_commit inside the compensation: as after any step's commit
        after_step(run, item.position)


async def _one_async(run: Run, item: Item, rb: Rollback, frames: Frames) -> None:
    var, frame, after_step = frames
    try:
        fn, args, kwargs, policy = rb.call(item)
    except PersistkitError as exc:
        run._attach["rs"] = COMPENSATING
        await run.step_async(item.position, item.name, None, error=exc)
        rb.not_done(item, exc)
        return
    attempt = 0

    async def body() -> Any:
        nonlocal attempt
        attempt += 1
        token = var.set(frame(run, item.position, item.name, attempt))
        try:
            result = fn(*args, **kwargs)
            return (await result) if inspect.isawaitable(result) else result
        except BaseException as exc:
            run.mark_escaped(exc)
            raise
        finally:
            var.reset(token)

    import tenacity

    try:
        async for att in tenacity.AsyncRetrying(**policy.tenacity_kwargs()):
            with att:
                await body()
    except Exception as exc:
        _stop(run, exc)
        run._attach["rs"] = COMPENSATING
        await run.step_async(item.position, item.name, None, error=exc)
        rb.not_done(item, exc)
        return
    run._attach["rs"] = COMPENSATING
    await run.step_async(item.position, item.name, None, result=None)
    rb.done(item)
    if run._effects:
        await after_step(run, item.position)


def _run_sync(run: Run, rb: Rollback, frames: Frames, mark: bool) -> None:
    try:
        if mark:  # from here on, a resume of the run finishes the rollback, never the block
            _storable(run)
            run._marks[ROLLBACK] = rb.mark_body()
            run._attach["rs"] = COMPENSATING
            run.step_sync(ROLLBACK, ROLLBACK_NAME, None, result=None)
        for item in rb.todo():
            _one_sync(run, item, rb, frames)
    finally:
        run._attach.pop("rs", None)
    run.status = COMPENSATING


async def _run_async(run: Run, rb: Rollback, frames: Frames, mark: bool) -> None:
    try:
        if mark:
            _storable(run)
            run._marks[ROLLBACK] = rb.mark_body()
            run._attach["rs"] = COMPENSATING
            await run.step_async(ROLLBACK, ROLLBACK_NAME, None, result=None)
        for item in rb.todo():
            await _one_async(run, item, rb, frames)
    finally:
        run._attach.pop("rs", None)
    run.status = COMPENSATING


def rollback_sync(run: Run, exc: BaseException, frames: Frames) -> PersistkitError | None:
    """At the end of a block that raised ``exc``: run the compensations of the run's completed
    steps, if it failed for good and has any. None: the block's end goes on (its end record is
    ``compensated`` if a rollback ran, the note on ``exc`` says what was undone); else the
    ``CompensationError`` to raise (no end record: the run stays ``compensating``)."""
    if ending(run, exc):  # stopped by a second message (busy="interrupt", "rollback"): no compensations
        rewind_sync(run)
        return None
    rb = Rollback.start(run, exc)
    if rb is None:
        return None
    _run_sync(run, rb, frames, mark=True)
    return _ended(run, rb, exc)


async def rollback_async(run: Run, exc: BaseException, frames: Frames) -> PersistkitError | None:
    if ending(run, exc):
        await rewind_async(run)
        return None
    rb = Rollback.start(run, exc)
    if rb is None:
        return None
    await _run_async(run, rb, frames, mark=True)
    return _ended(run, rb, exc)


def _ended(run: Run, rb: Rollback, exc: BaseException) -> PersistkitError | None:
    error = rb.error()
    if error is None:
        run._attach["rs"] = COMPENSATED  # the end record the block writes next says so
        exc.add_note(rb.note())
    return error


def _resumed(run: Run) -> Rollback:
    rb = Rollback.resumed(run)
    run._restore(max(run._index.values(), key=lambda r: r.id))  # the state the rollback left
    return rb


def _finished(run: Run, rb: Rollback) -> PersistkitError:
    error = rb.error()
    if error is not None:
        return error
    run._attach["rs"] = COMPENSATED
    if isinstance(rb.failure_tree, dict):
        run._attach["e"] = rb.failure_tree  # the end records the failure as it was stored
    return rb.finished()


def finish_sync(run: Run, holding: Holding | None, frames: Frames) -> None:
    """Right after the run opened: if its rollback was interrupted, finish it and raise
    (``RunCompensatedError`` once all is undone, else ``CompensationError``) instead of
    letting the block run; the lease is given up. Returns at once otherwise."""
    if ROLLBACK not in run._index or run.replay_only:
        return
    try:
        rb = _resumed(run)
        run.release_at_end = owns_lease(holding)
        _run_sync(run, rb, frames, mark=False)
        error = _finished(run, rb)
        if isinstance(error, RunCompensatedError):
            run.end_sync(rb.failure)
        _raise(error, rb)
    finally:
        run._attach.pop("rs", None)
        run._attach.pop("e", None)
        let_go_sync(run.store, holding)


async def finish_async(run: Run, holding: Holding | None, frames: Frames) -> None:
    if ROLLBACK not in run._index or run.replay_only:
        return
    try:
        rb = _resumed(run)
        run.release_at_end = owns_lease(holding)
        await _run_async(run, rb, frames, mark=False)
        error = _finished(run, rb)
        if isinstance(error, RunCompensatedError):
            await run.end_async(rb.failure)
        _raise(error, rb)
    finally:
        run._attach.pop("rs", None)
        run._attach.pop("e", None)
        await let_go_async(run.store, holding)


def _raise(error: PersistkitError, rb: Rollback) -> NoReturn:
    raise error from rb.failure
