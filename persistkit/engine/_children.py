"""``pk.start`` / ``pk.astart``, ``pk.ChildHandle``, ``pk.gather`` / ``pk.agather`` and
``pk.run_child`` / ``pk.arun_child``: child runs. This module finds the run and the position in
the engine's frame and opens the child's ``pk.resume``; what is recorded, the links, the
outcome and the stop that reaches every child are ``coordination/_children.py`` and
``coordination/_child_stop.py`` (docs/messages.md, "Child runs").

Where a child runs is the ``executor=`` of ``pk.start``: ``"thread"`` (default: a thread of
this process, started after the parent recorded the start), ``"inline"`` (run to its end
inside ``pk.start``, before the parent goes on), or a callable that gets the child's spec (a
dict of plain data) and hands it to whatever runs turns (a queue worker calls
``pk.run_child(spec, store=...)``; examples/celery_children.py).
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AsyncExitStack, ExitStack
from typing import Any

from .._errors import (
    ConfigurationError,
    NonDeterminismError,
    PersistkitError,
    RunCancelledError,
    ThreadBusyError,
)
from ..backends._capabilities import require
from ..codec._functions import NotFound, find, registered_name
from ..codec._names import refusal
from ..coordination import _children as C
from ..coordination import _suspend as S
from ..coordination._cancel import _ask, halt
from ..coordination._child_stop import IN_CHILD, started
from ..state._records import Record
from . import _args
from ._api import _CURRENT, checkpointed, resume
from ._replay_check import CHECKING
from ._run import Run
from ._store import Store, check_namespace, check_thread_id, default_store
from ._suspend import _frame, _look

__all__ = ["ChildHandle", "agather", "arun_child", "astart", "gather", "run_child", "start"]

log = logging.getLogger("persistkit.children")

_EXECUTORS = ("thread", "inline")


# -- the child's side -------------------------------------------------------------------------


def _resolve(name: str, store: Store) -> Callable[..., Any]:
    try:
        return find(name, tuple(store.codec.serializer.allow_modules))
    except NotFound as missing:
        module = name.partition(":")[0]
        fix = (
            f"put @pk.register on it in {module}"
            if missing.kind == "unregistered"
            else f"import {module} (it registers the agent with @pk.register) before running the child"
        )
        raise ConfigurationError(
            f"pk.run_child: {refusal(name, 'a child run agent', fix)}"
        ) from None


@checkpointed(name=C.CHILD, check_args=False)
def _child_step(agent: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    store = _CURRENT.get().run.store  # type: ignore[union-attr]  # a step runs in a run
    return _resolve(agent, store)(*args, **kwargs)


@checkpointed(name=C.CHILD, check_args=False)
async def _achild_step(agent: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    store = _CURRENT.get().run.store  # type: ignore[union-attr]
    return await _resolve(agent, store)(*args, **kwargs)


def _spec(spec: object) -> C.Child:
    if not isinstance(spec, dict):
        raise ConfigurationError(
            f"pk.run_child() takes the spec pk.start gave the executor (a dict), got {spec!r:.80}"
        )
    try:
        p = spec["parent"]
        child = C.Child(
            check_thread_id(spec["thread_id"]),
            check_thread_id(spec["run_id"], "run_id"),
            check_namespace(spec["namespace"]),
            str(spec["agent"]),
            check_thread_id(p["thread_id"]),
            str(p["run_id"]),
            check_namespace(p["namespace"]),
            str(p["position"]),
            C.check_policy(spec["on_parent_close"], "pk.run_child"),
            tuple((check_namespace(a[0]), check_thread_id(a[1])) for a in spec.get("ancestors") or ()),
            _ttl(spec.get("lease_ttl"), "pk.run_child(): the spec's lease_ttl"),
        )
        spec["args"], spec["kwargs"]  # present: a spec pk.start made
        return child
    except (KeyError, TypeError, IndexError) as exc:
        raise ConfigurationError(
            f"pk.run_child(): the spec is not one pk.start made ({exc!r})"
        ) from None


def _ttl(value: object, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise ConfigurationError(f"{what} must be seconds > 0 (or None for the default), got {value!r}")
    return float(value)


class _ChildBlocked(ThreadBusyError):
    """A child run could not open its thread: another run holds it (past ``busy_timeout``) or
    the thread's newest run is another, unfinished one that nobody continues. Nothing of the
    child ran; ``executor="inline"`` raises it from ``pk.start`` (a ``pk.ThreadBusyError``)."""


def _opening(child: C.Child, store: Store) -> resume:
    options: dict[str, Any] = {} if child.lease_ttl is None else {"lease_ttl": child.lease_ttl}
    # unfinished_timeout=0: a child never waits for another run's redelivery (it may never come,
    # and an inline child would hold its parent there): it raises at once, naming that run
    return resume(
        child.thread_id, run_id=child.run_id, namespace=child.namespace, store=store,
        metadata={C.MARK: child.parent_run_id}, unfinished_timeout=0, **options,
    )


def _blocked(child: C.Child, exc: ThreadBusyError) -> _ChildBlocked:
    return _ChildBlocked(
        f"child run {child.run_id} (pk.start at position {child.position} of run {child.parent_run_id} of "
        f"thread {child.parent_thread_id!r}) could not open its thread, and ran nothing: {exc}. Or start "
        "the child on a thread of its own (leave thread_id out)",
        thread_id=exc.thread_id, holder=exc.holder, expires_at=exc.expires_at, waiting=exc.waiting,
        unfinished_run=exc.unfinished_run, retry_after=exc.retry_after,
    )


def _check_link(store: Store, child: C.Child, spec: dict[str, Any], link: dict[str, Any] | None) -> None:
    """Before the child's run opens: a spec that is not the child its parent started (another
    agent, other arguments than its link keeps) is refused, and nothing of the child is touched."""
    if link is None:
        return  # its parent's thread was deleted: nothing to compare with
    theirs = (str(link.get("a")), link.get("g"))
    mine = (child.agent, [spec["args"], spec["kwargs"]])
    codec = store.codec
    if theirs[0] != mine[0] or (
        theirs[1] is not None
        and codec.dump_tree(theirs[1], stable=True) != codec.dump_tree(mine[1], stable=True)
    ):
        what = "agent" if theirs[0] != mine[0] else "arguments"
        raise NonDeterminismError(
            f"pk.run_child(): the spec does not match the child its parent started: child run "
            f"{child.run_id} of thread {child.thread_id!r} was started by pk.start at position "
            f"{child.position} of run {child.parent_run_id} as {theirs[0]} with its own arguments, "
            f"and this spec has another {what}. Run the spec pk.start gave the executor "
            "(store.children(parent_thread)[i].spec() rebuilds it)",
            position="0",
            step=C.CHILD,
        )


def run_child(spec: dict[str, Any], *, store: Store | None = None) -> Any:
    """Run (or continue, or replay) the child run ``spec`` names, to its end: what an executor
    calls in whatever process runs turns. The agent is found by its registered name
    (``@pk.register``); a child whose stop was asked runs nothing (``pk.RunCancelledError``).
    Returns the agent's result (raises its error). Safe to call twice: the child's run id is
    fixed, so a second call continues or replays the same run, never a second one."""
    child = _spec(spec)
    store = store or default_store()
    if inspect.iscoroutinefunction(_resolve(child.agent, store)):
        import asyncio  # here: importing persistkit loads no event loop machinery

        return asyncio.run(arun_child(spec, store=store))
    args, kwargs = C.decode_args(store.codec, spec)
    _check_link(store, child, spec, store.run_sync(C.read_link_plan(store.codec, child)))
    token = IN_CHILD.set((child.namespace, child.thread_id, child.run_id, child.ancestors))
    try:
        with ExitStack() as stack:
            try:
                run = stack.enter_context(_opening(child, store))
            except ThreadBusyError as exc:
                raise _blocked(child, exc) from None
            # holding its lease: a stop asked before it took it
            if not run.replay_only and store.run_sync(C.cancel_asked_plan(store.codec, child)):
                _ask(run, "cancel")  # its first step raises pk.RunCancelledError; it ends ``cancelled``
            return _child_step(child.agent, args, kwargs)
    finally:
        IN_CHILD.reset(token)


async def arun_child(spec: dict[str, Any], *, store: Store | None = None) -> Any:
    """The async twin of :func:`run_child` (a sync agent runs in the event loop's thread)."""
    child = _spec(spec)
    store = store or default_store()
    args, kwargs = C.decode_args(store.codec, spec)
    _check_link(store, child, spec, await store.run_async(C.read_link_plan(store.codec, child)))
    token = IN_CHILD.set((child.namespace, child.thread_id, child.run_id, child.ancestors))
    try:
        async with AsyncExitStack() as stack:
            try:
                run = await stack.enter_async_context(_opening(child, store))
            except ThreadBusyError as exc:
                raise _blocked(child, exc) from None
            if not run.replay_only and await store.run_async(C.cancel_asked_plan(store.codec, child)):
                _ask(run, "cancel")
            if inspect.iscoroutinefunction(_resolve(child.agent, store)):
                return await _achild_step(child.agent, args, kwargs)
            return _child_step(child.agent, args, kwargs)
    finally:
        IN_CHILD.reset(token)


# -- the parent's side ------------------------------------------------------------------------


def _in_thread(spec: dict[str, Any], store: Store, inline: bool = False) -> None:
    try:
        run_child(spec, store=store)
    except RunCancelledError:
        pass  # cancelled: its end record says so, the parent's handle reads it
    except _ChildBlocked:
        if inline:
            raise  # it never ran, and never would: the parent is told, not left waiting
        log.warning("persistkit: %s", sys.exc_info()[1])
    except PersistkitError as exc:  # it could not run (its agent cannot be found, the store failed)
        log.warning(
            "persistkit: child run %s of thread %r did not run to its end: %s",
            spec.get("run_id"),
            spec.get("thread_id"),
            exc,
        )
    except (
        Exception
    ):  # the agent's failure is recorded in its thread: the parent's handle raises it
        log.debug(
            "child run %s of thread %r failed",
            spec.get("run_id"),
            spec.get("thread_id"),
            exc_info=True,
        )


def _inline(spec: dict[str, Any], store: Store) -> None:
    contextvars.Context().run(_in_thread, spec, store, True)


def _executor(executor: object, store: Store, what: str) -> Callable[[dict[str, Any]], Any]:
    if executor is None or executor == "thread":

        def in_thread(spec: dict[str, Any]) -> None:
            t = threading.Thread(
                target=contextvars.Context().run,
                args=(_in_thread, spec, store),
                name=f"persistkit-child-{spec['run_id']}",
            )
            t.start()

        return in_thread
    if executor == "inline":
        return lambda spec: _inline(spec, store)
    if callable(executor) and not isinstance(executor, str):
        return executor
    raise ConfigurationError(
        f"{what}(executor=) must be 'thread' (default: a thread of this process), 'inline' (run the child "
        "to its end before the parent goes on) or a callable that gets the child's spec and hands it to a "
        f"worker (which calls pk.run_child(spec, store=...)), got {executor!r}"
    )


def _agent_name(agent: object, what: str) -> str:
    if not callable(agent):
        raise ConfigurationError(
            f"{what}() takes the child's agent function first, got {agent!r:.80}"
        )
    return registered_name(
        agent,
        f"{what}({getattr(agent, '__qualname__', agent)!r})",
        "a resumed parent, or a worker that runs the child,",
    )


def _same_start(
    run: Run, rec: Record, child: C.Child, agent: str, call: tuple[Any, ...], what: str
) -> None:
    """Refuse a replayed start whose call is not the recorded one (another agent, thread,
    namespace or arguments): the handle would be another child's. No I/O: the record holds the
    agent and the thread (its tree) and the arguments' digest (``a``, as a step's; a record
    written before it had none: the arguments are not compared there)."""
    position = str(rec.body.get("p"))
    thread_id, namespace, args, kwargs = call
    why = None
    if child.agent != agent:
        why = f"starts {agent} there"
    elif thread_id is not None and thread_id != child.thread_id:
        why = f"starts {agent} there on thread {thread_id!r}"
    elif namespace is not None and namespace != child.namespace:
        why = f"starts {agent} there in namespace {namespace!r}"
    else:
        recorded = rec.body.get("a")
        if recorded and not run.migrated and not _args.matches(run.codec, recorded, args, kwargs):
            why = f"starts {agent} there with other arguments"
    if why is None:
        return
    raise NonDeterminismError(
        f"thread {run.thread_id!r} run {run.run_id}: {what} at position {position} recorded the start of "
        f"{child.agent} (child run {child.run_id} on thread {child.thread_id!r}), but the code now {why}: "
        "the handle would be another child's. The children are started in another order or with other "
        "arguments than when the run started. " + run.remedies(),
        position=position,
        step=C.START,
    )


def _child(
    run: Run,
    position: str,
    rec: Record | None,
    agent: str,
    call: tuple[Any, ...],
    policy: str,
    what: str,
    lease_ttl: float | None,
) -> C.Child:
    thread_id, namespace = call[0], call[1]
    if rec is not None:  # the recorded child: a resumed parent gets the same handle
        child = C.Child.of(
            run.replay(rec), f"the {C.START} record at {position} of thread {run.thread_id!r}"
        )
        _same_start(run, rec, child, agent, call, what)
        return child
    ns = run.namespace if namespace is None else check_namespace(namespace)
    rid = C.child_run_id(run.run_id, position, run.thread_id, run.namespace)
    tid = f"{run.thread_id}~{rid}" if thread_id is None else check_thread_id(thread_id)
    if tid == run.thread_id and ns == run.namespace:
        raise ConfigurationError(
            f"{what}(thread_id={tid!r}): a child run needs a thread of its own, not its parent's (run "
            f"{run.run_id}): name another thread, or leave thread_id out (default: '<parent thread>~<child run id>')"
        )
    check_thread_id(tid)
    mine = IN_CHILD.get()  # this run is itself a child: the threads above it
    above = mine[3] if mine is not None and mine[:3] == (run.namespace, run.thread_id, run.run_id) else ()
    ancestors = (*above, (run.namespace, run.thread_id))
    if (ns, tid) in ancestors:
        raise ConfigurationError(
            f"{what}(thread_id={tid!r}): that thread runs an ancestor of this child (a run above it in the "
            f"tree that waits for it): the child would wait for its lease forever and write onto it. Name "
            f"another thread, or leave thread_id out (default: '<parent thread>~<child run id>')"
        )
    return C.Child(
        tid, rid, ns, agent, run.thread_id, run.run_id, run.namespace, position, policy, ancestors, lease_ttl
    )


def _begin(
    what: str, agent: object, on_parent_close: object, executor: object
) -> tuple[str, str, Run, str, Record | None]:
    name = _agent_name(agent, what)
    policy = C.check_policy(on_parent_close, what)
    if isinstance(executor, str) and executor not in _EXECUTORS:
        _executor(executor, None, what)  # type: ignore[arg-type]  # raises
    run, position = _frame(what)
    return name, policy, run, position, _look(run, position, C.START)


def start(
    agent: Callable[..., Any],
    /,
    *args: Any,
    thread_id: str | None = None,
    namespace: str | None = None,
    on_parent_close: str = "cancel",
    executor: str | Callable[[dict[str, Any]], Any] | None = None,
    lease_ttl: float | None = None,
    **kwargs: Any,
) -> ChildHandle:
    """Start ``agent(*args, **kwargs)`` as a child run on thread ``thread_id`` (default: one of its
    own, ``<parent thread>~<child run id>``) and return its handle; inside a run only.

    Recorded as a step: a resumed parent gets the same handle here and never starts a second
    child (the child's run id is fixed by the parent's run and position; a child whose process
    died with the parent's is handed to ``executor`` again and continues where it stopped).
    ``agent`` must be registered (``@pk.register``): a resumed parent or a worker finds it by
    that name. ``executor``: ``"thread"`` (default), ``"inline"``, or a callable that gets the
    child's spec and hands it to a worker calling ``pk.run_child(spec, store=...)``.
    ``on_parent_close``: ``"cancel"`` (default: the child is cancelled when the parent run ends,
    is cancelled or rolled back) or ``"abandon"`` (it finishes on its own).
    The arguments are encoded with the store's codec (the spec is plain JSON data; one it cannot
    encode raises ``pk.SerializationError`` here). ``lease_ttl``: the child's lease TTL (a stop
    reaches a child in another process within ``lease_ttl / 3`` s; default 30).
    In async code use ``await pk.astart(...)``."""
    name, policy, run, position, rec = _begin("pk.start", agent, on_parent_close, executor)
    ttl = _ttl(lease_ttl, "pk.start(lease_ttl=)")
    child = _child(run, position, rec, name, (thread_id, namespace, args, kwargs), policy, "pk.start", ttl)
    encoded = C.encode_args(run.codec, args, kwargs, "pk.start")
    checking = (
        CHECKING.get() is not None
    )  # store.check_replay: no link, no launch, no other store touched
    launch = rec is None and not checking
    if rec is None:
        if not checking:
            require(run.store.backend, "kv", "pk.start()")
            run.store.run_sync(C.link_plan(run.codec, child, encoded, thread_id is not None, "pk.start"))
        digest = run.arguments(args, kwargs)  # compared when a resumed parent passes here
        run.step_sync(position, C.START, digest, result=child.tree())  # the check: its frontier
    elif not run.replay_only and not checking:
        launch = run.store.run_sync(C.needs_launch(run.codec, child))
    started(run, child)
    if launch:
        _executor(executor, run.store, "pk.start")(child.spec(encoded))
    return ChildHandle(child, run.store)


async def astart(
    agent: Callable[..., Any],
    /,
    *args: Any,
    thread_id: str | None = None,
    namespace: str | None = None,
    on_parent_close: str = "cancel",
    executor: str | Callable[[dict[str, Any]], Any] | None = None,
    lease_ttl: float | None = None,
    **kwargs: Any,
) -> ChildHandle:
    """The async twin of :func:`start` (``"inline"`` awaits the child; the default runs it in a thread)."""
    name, policy, run, position, rec = _begin("pk.astart", agent, on_parent_close, executor)
    ttl = _ttl(lease_ttl, "pk.astart(lease_ttl=)")
    child = _child(run, position, rec, name, (thread_id, namespace, args, kwargs), policy, "pk.astart", ttl)
    encoded = C.encode_args(run.codec, args, kwargs, "pk.astart")
    checking = (
        CHECKING.get() is not None
    )  # store.check_replay: no link, no launch, no other store touched
    launch = rec is None and not checking
    if rec is None:
        if not checking:
            require(run.store.backend, "kv", "pk.astart()")
            await run.store.run_async(C.link_plan(run.codec, child, encoded, thread_id is not None, "pk.astart"))
        digest = run.arguments(args, kwargs)
        await run.step_async(
            position, C.START, digest, result=child.tree()
        )  # the check: its frontier
    elif not run.replay_only and not checking:
        launch = await run.store.run_async(C.needs_launch(run.codec, child))
    started(run, child)
    if launch:
        spec = child.spec(encoded)
        if executor == "inline":
            import asyncio

            try:
                await contextvars.Context().run(
                    asyncio.ensure_future, arun_child(spec, store=run.store)
                )
            except RunCancelledError:
                pass
            except _ChildBlocked:
                raise  # it never ran, and never would: the parent is told, not left waiting
            except Exception:  # recorded in the child's thread; the handle raises it
                log.debug("child run %s failed", child.run_id, exc_info=True)
        else:
            _executor(executor, run.store, "pk.astart")(spec)
    return ChildHandle(child, run.store)


class ChildHandle:
    """A child run started by ``pk.start``: ``thread_id``, ``run_id``; ``result()`` waits for its
    end (recorded in the parent), ``status()`` looks now (not recorded)."""

    __slots__ = ("child", "store")

    def __init__(self, child: C.Child, store: Store) -> None:
        self.child = child
        self.store = store

    @property
    def thread_id(self) -> str:
        return self.child.thread_id

    @property
    def run_id(self) -> str:
        return self.child.run_id

    def __repr__(self) -> str:
        return f"ChildHandle(thread_id={self.thread_id!r}, run_id={self.run_id!r}, agent={self.child.agent!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChildHandle) and other.child == self.child

    def __hash__(self) -> int:
        return hash(self.child)

    def status(self) -> str:
        """The child's status now: ``pending``, ``running``, ``suspended`` or its end status."""
        status: str = self.store.run_sync(C.status_plan(self.store.codec, self.child))
        return status

    def result(
        self, timeout: float | None = None, *, suspend_above: float = C.DEFAULT_CHILD_SUSPEND_ABOVE
    ) -> Any:
        """The child's result (or its error, raised; ``pk.RunCancelledError`` for a child that was
        cancelled), once it ended. In the run that started it, recorded as a step: a resumed parent
        gets the same outcome here. It waits in this process up to ``suspend_above`` seconds
        (default 60); longer, the parent suspends (``pk.Suspended``: ``store.due()`` lists it once
        the child ended). ``timeout`` (seconds; None: as long as it takes): past it, ``TimeoutError``
        (recorded too). Outside any run it only waits and reads. In async code: ``await h.aresult()``."""
        wait, above = _options(timeout, suspend_above, "handle.result")
        frame = _CURRENT.get()
        if frame is None:
            return _unrecorded(
                self,
                wait,
                self.store.run_sync(C.wait_plan(self.store.codec, self.child, _until(wait))),
            )
        run, position = _frame("handle.result")
        self._mine(run, "handle.result")
        rec = _look(run, position, C.RESULT)
        replay, value, deadline, until = _decide(run, rec, wait, above)
        if replay:
            return value
        got = run.store.run_sync(_watch(run, self.child, until))
        halt_if_stopped(run)
        if got is None and not _past(deadline):
            if rec is not None:
                raise S.waiting_on(run, rec)
            raise S.waiting_on(
                run, S.write_sync(run, _suspend_body(position, self.child, deadline))
            )
        error = got.error if got is not None else _timeout(self.child, wait)
        run.step_sync(position, C.RESULT, None, result=None if error else got.value, error=error)
        if error is not None:
            raise error
        return got.value

    async def aresult(
        self, timeout: float | None = None, *, suspend_above: float = C.DEFAULT_CHILD_SUSPEND_ABOVE
    ) -> Any:
        """The async twin of :meth:`result`."""
        wait, above = _options(timeout, suspend_above, "handle.aresult")
        frame = _CURRENT.get()
        if frame is None:
            found = await self.store.run_async(
                C.wait_plan(self.store.codec, self.child, _until(wait))
            )
            return _unrecorded(self, wait, found)
        run, position = _frame("handle.aresult")
        self._mine(run, "handle.aresult")
        rec = _look(run, position, C.RESULT)
        replay, value, deadline, until = _decide(run, rec, wait, above)
        if replay:
            return value
        got = await run.store.run_async(_watch(run, self.child, until))
        halt_if_stopped(run)
        if got is None and not _past(deadline):
            if rec is not None:
                raise S.waiting_on(run, rec)
            raise S.waiting_on(
                run, await S.write_async(run, _suspend_body(position, self.child, deadline))
            )
        error = got.error if got is not None else _timeout(self.child, wait)
        await run.step_async(
            position, C.RESULT, None, result=None if error else got.value, error=error
        )
        if error is not None:
            raise error
        return got.value

    def _mine(self, run: Run, what: str) -> None:
        c = self.child
        if (run.thread_id, run.namespace, run.run_id) != (
            c.parent_thread_id,
            c.parent_namespace,
            c.parent_run_id,
        ):
            raise ConfigurationError(
                f"{what}(): this handle is of child run {c.run_id}, started by run {c.parent_run_id} of thread "
                f"{c.parent_thread_id!r}, but it is called in run {run.run_id} of thread {run.thread_id!r}. Only "
                "the run that started a child records its outcome; elsewhere, read it outside any run "
                "(handle.result() with no run open) or start the child in this run"
            )


def gather(*handles: ChildHandle, timeout: float | None = None) -> list[Any]:
    """Every handle's result, in order (each recorded as ``handle.result`` records it); the first
    child that failed raises its error."""
    _check_handles(handles, "pk.gather")
    return [h.result(timeout) for h in handles]


async def agather(*handles: ChildHandle, timeout: float | None = None) -> list[Any]:
    """The async twin of :func:`gather`."""
    _check_handles(handles, "pk.agather")
    return [await h.aresult(timeout) for h in handles]


def _check_handles(handles: tuple[Any, ...], what: str) -> None:
    for h in handles:
        if not isinstance(h, ChildHandle):
            raise ConfigurationError(f"{what}() takes the handles pk.start returned, got {h!r:.80}")


# -- waiting (no I/O) ---------------------------------------------------------------------------


def _options(timeout: object, above: object, what: str) -> tuple[float | None, float]:
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 <= timeout < float("inf")
    ):
        raise ConfigurationError(
            f"{what}(timeout=) must be seconds >= 0, or None to wait as long as it takes; got {timeout!r}"
        )
    if isinstance(above, bool) or not isinstance(above, int | float) or not above >= 0:
        raise ConfigurationError(
            f"{what}(suspend_above=) must be a number of seconds >= 0, got {above!r}"
        )
    return (None if timeout is None else float(timeout)), float(above)


def _until(wait: float | None) -> float:
    return time.time() + (wait if wait is not None else 365 * 86400.0)


def _unrecorded(handle: ChildHandle, wait: float | None, got: Any) -> Any:
    if got is None:
        raise _timeout(handle.child, wait)
    if got.error is not None:
        raise got.error
    return got.value


def _timeout(child: C.Child, wait: float | None) -> TimeoutError:
    return TimeoutError(
        f"child run {child.run_id} of thread {child.thread_id!r} did not end within {wait} s"
    )


def _decide(
    run: Run, rec: Record | None, wait: float | None, above: float
) -> tuple[bool, Any, float | None, float]:
    """(True, the recorded outcome) to replay; else (False, None, the deadline or None, wait here until)."""
    if rec is not None and rec.body.get("s") != S.SUSPENDED:
        return True, run.replay(rec), None, 0.0
    now = time.time()
    if rec is None:
        deadline = None if wait is None else now + wait
    else:
        run.replay(rec)  # the state as it was when the parent suspended here
        if run.replay_only or CHECKING.get() is not None:  # the replay check waits for nothing
            raise S.waiting_on(run, rec)
        d = S.items(rec)[0].get("d")
        deadline = None if d is None else float(d)
    if CHECKING.get() is not None:
        above = 0.0  # the replay check looks once: its frontier is the write that comes next
    until = now + above if deadline is None else min(deadline, now + above)
    return False, None, deadline, until


def _watch(run: Run, child: C.Child, until: float) -> Any:
    """:func:`C.wait_plan`, cut short when a stop is asked of the parent (its status changes)."""
    delay = 0.002
    while True:
        got = yield from C.outcome_plan(run.codec, child)
        if got is not None or time.time() >= until or run.status != "running":
            return got
        from .._io import Sleep

        yield Sleep(min(delay, max(until - time.time(), 0.0)))
        delay = min(delay * 1.5, 0.05)


def halt_if_stopped(run: Run) -> None:
    if run.status != "running":
        halt(run)


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.time() >= deadline


def _suspend_body(position: str, child: C.Child, deadline: float | None) -> dict[str, Any]:
    q: dict[str, Any] = {"i": position, "ch": child.tree()}
    if deadline is not None:
        q["d"] = deadline
    return S.suspend_body(position, C.RESULT, q)
