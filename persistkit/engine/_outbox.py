"""``pk.after_commit`` / ``run.after_commit``: what the engine does for the outbox.

Registering (inside a step) puts the effect in the step's marks (``Run._marks``: written
with that step's checkpoint, dropped if it fails) and keeps the live function and
arguments on the run. Right after the step's checkpoint landed, :func:`after_step_sync`
(``_api._call_sync``'s one hook, behind ``if run._effects:``) runs them in order and
attaches their done ids to the run's next checkpoint (``Run._attach``). When a run opens
with effects its rows show committed but not done (the process died in between),
:func:`settle_sync` runs them from the store before the block goes on. The logic shared
with ``store.drain_outbox()`` is ``coordination/_outbox.py``.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError, ConflictError
from .._retry import Retry
from ..backends._protocol import CheckpointRow
from ..coordination import _outbox as ob
from ._context import CURRENT as _CURRENT

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

# A Run and the engine's frame are named Any here: this module sits below _run and _api
# (Run.after_commit delegates to it, _api's step drivers call its hooks).
Run = Any
_Frame = Any

__all__ = ["after_commit", "after_commit_of", "after_step_async", "after_step_sync", "settle_async", "settle_sync"]


class _Live:
    """The effects one step call (one attempt: ``frame``) registered, as they will be stored
    (``stored``, the very list its record carries) and as they run here (``calls``)."""

    __slots__ = ("calls", "frame", "stored")

    def __init__(self, frame: _Frame) -> None:
        self.frame = frame
        self.stored: list[dict[str, Any]] = []
        self.calls: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Retry]] = []


def after_commit(fn: Callable[..., Any], /, *args: Any, retry: Retry | None = None, **kwargs: Any) -> None:
    """Run ``fn(*args, **kwargs)`` once the checkpoint of the current step is durable, exactly
    once per committed checkpoint across crashes (docs/long-runs.md, "Effects after commit").

    Call it inside a ``@pk.checkpointed`` step. ``fn`` must be a module-level function
    registered with ``@pk.register`` (it is stored by ``module:qualname``, and a stored record
    may call only registered functions; ``async def`` in async runs) and the arguments
    storable values. ``fn`` receives its idempotency key as ``idempotency_key=`` if it declares that
    parameter (and ``pk.current_effect().key`` tells it). ``retry``: the policy of the effect
    (default: 3 attempts within 60 s); once it failed for good the step's call raises
    ``pk.EffectError`` and the effect stays pending.
    """
    frame = _CURRENT.get()
    if frame is None:
        raise ConfigurationError(
            f"pk.after_commit({getattr(fn, '__qualname__', fn)!r}) was called outside a pk.resume block: "
            "there is no checkpoint to wait for. Call it inside a @pk.checkpointed step of a run"
        )
    register(frame.run, frame, fn, args, kwargs, retry)


def after_commit_of(
    run: Run, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], retry: Retry | None
) -> None:
    """``run.after_commit(...)``: as :func:`after_commit`, checked to be inside a step of ``run``."""
    register(run, _CURRENT.get(), fn, args, kwargs, retry)


def register(
    run: Run, frame: _Frame | None, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
    retry: Retry | None,
) -> None:
    """Record ``fn(*args, **kwargs)`` with the checkpoint of the step ``frame`` runs."""
    name = ob.effect_name(fn)
    if frame is None or frame.run is not run or frame.name is None:
        where = "outside any step" if frame is None or frame.run is run else "in a step of another run"
        raise ConfigurationError(
            f"run.after_commit({name}) was called {where} of thread {run.thread_id!r}: an effect "
            "belongs to the checkpoint of the step that registers it. Call it inside a "
            "@pk.checkpointed step of this run (e.g. in the step that produced the reply)"
        )
    if retry is not None and not isinstance(retry, Retry):
        raise ConfigurationError(f"after_commit(..., retry={retry!r}): expected pk.Retry(...)")
    if "idempotency_key" in kwargs:
        raise ConfigurationError(
            f"after_commit({name}, idempotency_key=...): persistkit passes the effect's own stable key "
            "as idempotency_key= to a function that declares it; do not pass one"
        )
    if inspect.iscoroutinefunction(fn) and _sync_only(run):
        raise ConfigurationError(
            f"after_commit({name}): an async def effect needs an async run (async with pk.resume(...)); "
            "this run has no event loop to await it. Make the effect a plain function"
        )
    tree = run.codec.encode({"a": list(args), "k": dict(kwargs)}, f"arguments of effect {name}")
    entry: dict[str, Any] = {"f": name, "a": tree}
    if retry is not None:
        entry["rt"] = ob.retry_spec(retry)
    position = frame.path
    with run._lock:
        live = run._effects.get(position)
        if live is None or live.frame is not frame:  # a new call (or a new attempt) of the step
            live = run._effects[position] = _Live(frame)
            run._marks.setdefault(position, {})["ac"] = live.stored
        live.stored.append(entry)
        live.calls.append((fn, args, dict(kwargs), retry or ob.DEFAULT_RETRY))


def _sync_only(run: Run) -> bool:
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    return False


def _due(run: Run, position: str) -> _Live | None:
    """The effects of the step at ``position`` whose checkpoint just landed, or None (the step
    failed and its marks were dropped, or they belong to an earlier attempt)."""
    live: _Live | None = run._effects.pop(position, None)
    if live is None:
        return None
    rec = run._index.get(position)
    if rec is None or rec.body.get("ac") is not live.stored:
        return None
    return live


def _done(run: Run, ids: list[str]) -> None:
    """Rides on the run's next checkpoint. A new list each time: a commit in flight holds the
    old one and clears it only if it is still the same object once it landed."""
    run._attach["ad"] = [*run._attach.get("ad", ()), *ids]


def _marker(run: Run, ids: list[str]) -> tuple[CheckpointRow, dict[str, Any]] | None:
    """The done mark of ``ids`` as a row to write now: a copy of the run's head record (its own
    newest row) carrying them (``ob.done_mark``), or None when the head is not this run's row
    as it knows it (then the ids ride on the run's next checkpoint)."""
    head = run._head
    top = run._loader.rows.get(head.checkpoint_id) if head is not None and not run.replay_only else None
    if top is None or head is None:
        return None
    # The copy is made of the head as stored: a body this process committed holds live values
    # (its secrets not yet handles), one read back holds handles, which must not be redacted twice.
    if run._loader.committed_here(head.checkpoint_id):
        top = run.codec.redact_tree(top)
    return ob.done_mark(run.codec, run.thread_id, run.namespace, run.run_id, head.checkpoint_id, top, ids, stored=True)


def mark_done_sync(run: Run, ids: list[str]) -> None:
    """Record ``ids`` (effects that ran) as done at once, so that only a crash between an
    effect and this one write can run it again: a fenced copy of the head carrying them. If
    another writer moved the head, they ride on the run's next checkpoint instead."""
    with run._lock:
        made = _marker(run, ids)
        if made is None:
            _done(run, ids)
            return
        row, body = made
        version = run._head.version
        try:
            if run.lease is not None:
                head = run.store.write_fenced_sync(row, {}, version, run.lease)
            else:
                head = run.store.write_sync(row, {}, version)
        except ConflictError:
            _done(run, ids)
            return
        run._head = head
        run._loader.rows[row.checkpoint_id] = body


async def mark_done_async(run: Run, ids: list[str]) -> None:
    async with run.async_lock():
        made = _marker(run, ids)
        if made is None:
            _done(run, ids)
            return
        row, body = made
        version = run._head.version
        try:
            if run.lease is not None:
                head = await run.store.write_fenced_async(row, {}, version, run.lease)
            else:
                head = await run.store.write_async(row, {}, version)
        except ConflictError:
            _done(run, ids)
            return
        run._head = head
        run._loader.rows[row.checkpoint_id] = body


def after_step_sync(run: Run, position: str) -> None:
    """Run the effects of the step at ``position``, whose checkpoint just landed, then mark
    them done (:func:`mark_done_sync`; an effect that fails for good stays pending)."""
    live = _due(run, position)
    if live is None:
        return
    rec = run._index[position]
    ran: list[str] = []
    token = _CURRENT.set(None)  # an effect is no step: a @checkpointed call inside it is a plain call
    try:
        for i, (fn, args, kwargs, retry) in enumerate(live.calls):
            info = ob.EffectInfo(run.thread_id, run.run_id, position, i, live.stored[i]["f"], 1,
                                 ob.effect_key(run.thread_id, run.run_id, position, i, run.namespace))
            ob.call_sync(fn, args, kwargs, info, retry)
            ran.append(ob.effect_id(rec.id, i))
    finally:
        _CURRENT.reset(token)
        if ran:
            mark_done_sync(run, ran)


async def after_step_async(run: Run, position: str) -> None:
    live = _due(run, position)
    if live is None:
        return
    rec = run._index[position]
    ran: list[str] = []
    token = _CURRENT.set(None)
    try:
        for i, (fn, args, kwargs, retry) in enumerate(live.calls):
            info = ob.EffectInfo(run.thread_id, run.run_id, position, i, live.stored[i]["f"], 1,
                                 ob.effect_key(run.thread_id, run.run_id, position, i, run.namespace))
            await ob.call_async(fn, args, kwargs, info, retry)
            ran.append(ob.effect_id(rec.id, i))
    finally:
        _CURRENT.reset(token)
        if ran:
            await mark_done_async(run, ran)


def _stored(run: Run, p: ob.Pending) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Retry]:
    where = p.where()
    fn = ob.resolve(str(p.entry.get("f")), run.codec, where)
    value = run.codec.decode(p.entry.get("a"), f"{where}: arguments")
    args, kwargs = value.get("a") or [], value.get("k") or {}
    return fn, tuple(args), dict(kwargs), ob.retry_of(p.entry.get("rt"))


def settle_sync(run: Run, holding: Any, let_go: Callable[[Any, Any], None]) -> None:
    """Run the effects of this run that committed but were not marked done (the process died
    between a checkpoint and its effects), oldest first, before the block goes on. If one
    fails for good the block does not start: its lease is given up and ``EffectError``
    raised (the effect stays pending; the effects run before it are marked done first)."""
    pending, run._pending = run._pending, []
    ran: list[str] = []
    token = _CURRENT.set(None)
    try:
        try:
            for p in pending:
                fn, args, kwargs, retry = _stored(run, p)
                ob.call_sync(fn, args, kwargs, p.info(), retry)
                ran.append(p.id)
        finally:
            _CURRENT.reset(token)
            if ran:
                mark_done_sync(run, ran)
    except BaseException:
        let_go(run.store, holding)
        raise


async def settle_async(run: Run, holding: Any, let_go: Callable[[Any, Any], Awaitable[None]]) -> None:
    pending, run._pending = run._pending, []
    ran: list[str] = []
    token = _CURRENT.set(None)
    try:
        try:
            for p in pending:
                fn, args, kwargs, retry = _stored(run, p)
                await ob.call_async(fn, args, kwargs, p.info(), retry)
                ran.append(p.id)
        finally:
            _CURRENT.reset(token)
            if ran:
                await mark_done_async(run, ran)
    except BaseException:
        await let_go(run.store, holding)
        raise
