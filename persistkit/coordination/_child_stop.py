"""A stop that reaches every child run: ``store.cancel`` of a parent, and a parent run's end.

``store.cancel(thread, run_id)`` is :func:`cancel_tree_sync`: the run is cancelled as before
(``_cancel``), then each unfinished child it started with ``on_parent_close="cancel"`` is
stopped (:func:`_stop_sync`), and that child's own children in turn, found through the links
under each parent's thread (``_children``): any process can do it, the parent's need not run.

Stopping one child: its link is marked (``x``: a child whose run has not taken its lease yet
sees it when ``pk.run_child`` opens it, and runs nothing), then ``store.cancel`` of its run: a
live one is asked to stop at its next step boundary (in its lease record: a worker process
that dies during the cancel leaves the request there, and the child's redelivery runs nothing),
a suspended or orphaned one is ended ``cancelled`` now.

A parent run's final end (the block wrote its end record: completed, cancelled, interrupted,
rolled back, or failed by ``run.abort()``; not a suspension, not a crash, not an ordinary failure
that its retry continues) stops its unfinished ``cancel`` children the same
way (:func:`close_sync`, the one hook ``pk.resume``'s exit calls): only a run that started a
child in this block is looked at, so a run that starts none pays a dict lookup at its end.
"""

from __future__ import annotations

import logging
import weakref
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError, NotFoundError, PersistkitError, ThreadBusyError
from . import _children as C
from ._cancel import cancel_async, cancel_sync
from ._suspend import SUSPENDED

if TYPE_CHECKING:
    from ..engine._run import Run

__all__ = [
    "IN_CHILD",
    "cancel_tree_async",
    "cancel_tree_sync",
    "close_async",
    "close_sync",
    "foreign_child",
    "started",
]

log = logging.getLogger("persistkit.coordination")

#: The children each open run of this process started (or replayed a start of) in its block.
_OPEN: weakref.WeakKeyDictionary[Run, list[C.Child]] = weakref.WeakKeyDictionary()
#: Run statuses after which a parent keeps its children (it goes on later, or the process died).
_KEEPS = ("running", SUSPENDED, "cancelling", "compensating")


#: The child run ``pk.run_child`` is running in this context: (namespace, thread, run id, its
#: ancestors' ``(namespace, thread)``, root first). ``pk.resume`` of a child run elsewhere is refused.
IN_CHILD: ContextVar[tuple[str, str, str, tuple[tuple[str, str], ...]] | None] = ContextVar(
    "persistkit_in_child", default=None
)


def foreign_child(run: Run) -> ConfigurationError | None:
    """The refusal of a ``pk.resume`` that would continue a child run outside ``pk.run_child``:
    the block would run the caller's code at the root, in place of the child's agent (which runs
    under ``pk.child`` at position 0), and corrupt the child. None for any other run."""
    index = run._index
    if not index or ":" not in run.run_id:
        return None
    mine = IN_CHILD.get()
    if mine is not None and mine[:3] == (run.namespace, run.thread_id, run.run_id):
        return None
    if not any(C.marked(rec) for rec in index.values()):
        return None
    parent_run, _, position = run.run_id.rpartition(":")
    position = position.partition("@")[0]  # <parent run>:<position>@<digest of the parent thread>
    tail = "~" + run.run_id
    parent = f" of thread {run.thread_id[: -len(tail)]!r}" if run.thread_id.endswith(tail) else ""
    return ConfigurationError(
        f"thread {run.thread_id!r}: run {run.run_id} is a child run (pk.start at position {position} of "
        f"run {parent_run}{parent}); pk.resume cannot continue it: the block would run your code in place "
        "of the child's agent. Resume its parent instead (its pk.start hands the child over again once "
        "the child's wait ended: store.due() lists the parent), or continue it with "
        "pk.run_child(info.spec(), store=store), info being its entry in store.children(parent_thread)"
    )


def started(run: Run, child: C.Child) -> None:
    """``pk.start`` (live or replayed) in ``run``'s block: remember the child for the run's end."""
    mine = _OPEN.setdefault(run, [])
    if child not in mine:
        mine.append(child)


def _ignored(exc: PersistkitError) -> bool:
    """A child that cannot be cancelled now because there is nothing left to stop: it finished
    meanwhile (ConfigurationError), committed nothing yet (NotFoundError: its link's mark stops
    it when it opens), or a run of it took the lease as we looked (asked through the mark)."""
    return isinstance(exc, ConfigurationError | NotFoundError | ThreadBusyError)


def _stop_sync(store: Any, child: C.Child) -> None:
    store.run_sync(C.mark_cancelled_plan(store.codec, child))
    try:
        cancel_tree_sync(store, child.thread_id, child.run_id, child.namespace)
    except PersistkitError as exc:
        if not _ignored(exc):
            raise


async def _stop_async(store: Any, child: C.Child) -> None:
    await store.run_async(C.mark_cancelled_plan(store.codec, child))
    try:
        await cancel_tree_async(store, child.thread_id, child.run_id, child.namespace)
    except PersistkitError as exc:
        if not _ignored(exc):
            raise


def _children_of(store: Any, thread_id: str, run_id: str | None, namespace: str) -> Any:
    return C.children_plan(store.codec, thread_id, namespace, run_id)


def cancel_tree_sync(store: Any, thread_id: str, run_id: str | None, namespace: str) -> str:
    """``store.cancel``: the run, then every unfinished ``cancel`` child of it, recursively."""
    try:
        outcome = cancel_sync(store, thread_id, run_id, namespace)
    except NotFoundError:
        outcome = None  # nothing to cancel on the thread itself; its children may still run
    kids = (
        C.to_stop(store.run_sync(_children_of(store, thread_id, run_id, namespace)))
        if _kv(store)
        else []
    )
    for child in kids:
        _stop_sync(store, child)
    if outcome is None:
        if kids:
            return "requested"
        cancel_sync(
            store, thread_id, run_id, namespace
        )  # raises the NotFoundError again, as before
    return outcome or "requested"


async def cancel_tree_async(store: Any, thread_id: str, run_id: str | None, namespace: str) -> str:
    try:
        outcome = await cancel_async(store, thread_id, run_id, namespace)
    except NotFoundError:
        outcome = None
    kids = (
        C.to_stop(await store.run_async(_children_of(store, thread_id, run_id, namespace)))
        if _kv(store)
        else []
    )
    for child in kids:
        await _stop_async(store, child)
    if outcome is None:
        if kids:
            return "requested"
        await cancel_async(store, thread_id, run_id, namespace)
    return outcome or "requested"


def _kv(store: Any) -> bool:
    from ..backends._capabilities import has

    return has(store.backend, "kv")


def final(run: Run, exc: BaseException | None) -> bool:
    """Whether ``run``'s end is final, so its ``cancel`` children are stopped: completed,
    compensated (rolled back), cancelled, interrupted, or failed by ``run.abort()``. A run that
    failed with an ordinary error is not: its retry continues it (same run id) and its
    ``pk.start`` replays the same handles, so its children go on and the retry gets their
    results (docs/messages.md, "Child runs": a failed parent keeps its children)."""
    if run.status != "failed":
        return True
    from .._errors import RunAbortedError

    return isinstance(exc, RunAbortedError)


def _closing(run: Run, exc: BaseException | None) -> list[C.Child] | None:
    kids = _OPEN.pop(run, None)
    if not kids or run.status in _KEEPS or run.replay_only or not final(run, exc):
        return None
    return [k for k in kids if k.on_parent_close == "cancel"]


def close_sync(run: Run, exc: BaseException | None = None) -> None:
    """``pk.resume``'s exit: the run ended; stop its unfinished ``cancel`` children. A failure
    to stop one is logged, never raised over the block's own outcome (the child ends by itself,
    or ``store.cancel`` of it stops it)."""
    kids = _closing(run, exc) if run in _OPEN else None
    for child in kids or ():
        try:
            if run.store.run_sync(C.status_plan(run.codec, child)) not in C.FINAL:
                _stop_sync(run.store, child)
        except PersistkitError as exc:
            log.warning(
                "persistkit: could not cancel child run %s of thread %r: %s",
                child.run_id,
                child.thread_id,
                exc,
            )


async def close_async(run: Run, exc: BaseException | None = None) -> None:
    kids = _closing(run, exc) if run in _OPEN else None
    for child in kids or ():
        try:
            if await run.store.run_async(C.status_plan(run.codec, child)) not in C.FINAL:
                await _stop_async(run.store, child)
        except PersistkitError as exc:
            log.warning(
                "persistkit: could not cancel child run %s of thread %r: %s",
                child.run_id,
                child.thread_id,
                exc,
            )
