"""The replay check: would the code as it is now continue the runs that wait in a store?

Temporal's Replayer is the model. ``store.check_replay(entry)`` (``acheck_replay``; the
CLI's ``persistkit replay-check URL module:function``) finds every unfinished run with the
store protocol only — per thread, the run of its head record when that run is
``running`` (crashed or interrupted), ``failed`` (its retry continues it) or
``suspended`` — and calls ``entry(thread_id, run_id)`` for each: the user's function that
opens ``pk.resume(thread_id, run_id=run_id, ...)`` and runs the agent, the one the worker
calls. (An ``entry`` with a ``store`` parameter is given the store as ``store=``; an
``async def`` entry is awaited.)

While ``entry`` runs, :data:`CHECKING` is set, and every ``pk.resume`` in it:

* reads the checked store through :class:`_ReadOnly` (whatever ``store=`` it was given):
  any write — a checkpoint, a lease, a blob — raises :class:`Frontier` instead, so the
  check writes nothing, by construction;
* takes no lease and opens the run read-only (``replay_only``: no end record either);
* replays each recorded step (its result, or its recorded error) without running it;
  a step at a position the run never recorded is the run's live frontier: the check
  stops there with :class:`Frontier`, a ``BaseException`` (an ``except Exception`` in
  the agent does not swallow it), and no step body ever runs — except that of an
  unfinished step with recorded child steps, which a resume re-enters (its code runs
  between its children, as the block's own code does), so its children are checked too;
* ``pk.patched`` answers as in the real resume; each id answered False is listed (the
  run needs that patch's old path);
* when the (outermost) block ends cleanly or suspends, the entry ends there
  (:class:`Ended`): its code after the block — posting the reply, acking a message —
  never runs in a check. Its code before the block, and the block's code between
  steps, run as in every resume.

The outcome of each run is a :class:`RunReplay`: it *continues* (it reached its
frontier), *completes* or *waits* (its block ended: done, or suspended again), or it
*stops* — ``NonDeterminismError`` (another step or other arguments at a recorded
position, a deprecated patch an old run needs), ``SchemaVersionError`` (a recorded
state or result that no longer loads: its class changed shape, a migration is missing
or fails), any other error the code raises while replaying, or an ``entry`` that did
not resume the run it was given. :class:`ReplayReport` holds them; ``report.ok`` is
False when any run would stop (the CLI exits 1).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import ConfigurationError, NonDeterminismError, PersistkitError
from .._io import Plan, call
from ..backends import Backend, CheckpointRow
from ..state._records import Record, read_rows

if TYPE_CHECKING:
    from ..codec._pipeline import Codec
    from ._run import Run


class Store(Protocol):
    """What the check uses of a ``persistkit.Store`` (which mixes this module's class in,
    so the type is named by what it offers, not imported)."""

    backend: Backend
    codec: Codec

    def run_sync(self, plan: Plan[Any]) -> Any: ...

    async def run_async(self, plan: Plan[Any]) -> Any: ...

__all__ = ["CHECKING", "Ended", "Frontier", "ReplayCheckStore", "ReplayReport", "RunReplay"]

#: The running check, while ``store.check_replay`` calls an entry (read by ``pk.resume``).
CHECKING: ContextVar[_Check | None] = ContextVar("persistkit_replay_check", default=None)

#: The statuses of a head record whose run a resume continues.
UNFINISHED = ("running", "failed", "suspended")
#: A run rolling back (sagas): its block never runs again, but its compensations will.
ROLLING_BACK = "compensating"


class Frontier(BaseException):
    """The checked run reached a point where it would run a step or write: its live frontier."""

    def __init__(self, position: str | None, step: str | None, why: str, *, fails: bool = False) -> None:
        super().__init__(why)
        self.position, self.step, self.why, self.fails = position, step, why, fails


class Ended(BaseException):
    """The checked block ended (completed, or suspended again): the entry stops there, so
    its code after the block (posting the reply, acking a message) never runs in a check."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


@dataclass(frozen=True, slots=True)
class RunReplay:
    """What the replay check found for one waiting run.

    ``outcome``: ``continues`` (it replayed up to its live frontier: ``position`` and
    ``step`` say where it would go on), ``completes`` / ``waits`` (its block ended, done
    or suspended again), or ``stops`` (``error`` says why, at ``position`` / ``step`` when
    a step is known; None while the run opens; for an error the code itself raised,
    ``step`` is None and ``position`` is the last step replayed before it). ``old_patches``: the patch ids the run
    answered False — it needs their old code path, so keep those ``pk.patched`` guards.
    """

    thread_id: str
    namespace: str
    run_id: str
    status: str
    outcome: str
    position: str | None = None
    step: str | None = None
    error: str | None = None
    error_type: str | None = None
    old_patches: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.outcome != "stops"


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """The runs the replay check replayed (``store.check_replay``); ``ok`` when none would stop."""

    runs: tuple[RunReplay, ...] = ()

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.runs)

    @property
    def stopped(self) -> list[RunReplay]:
        """The runs that would stop under the code as it is now."""
        return [r for r in self.runs if not r.ok]

    def needing(self, patch_id: str) -> list[RunReplay]:
        """The runs that still need the old path of ``patch_id`` (keep its ``pk.patched``
        guard while any remains; ``pk.deprecate_patch`` once none does)."""
        return [r for r in self.runs if patch_id in r.old_patches]


class _ReadOnly(Backend):
    """A store seen by a replay check: reads pass through, a write of any kind is the
    checked run's frontier (it would write there). It holds no lease either."""

    def __init__(self, inner: Backend, codec: Codec) -> None:
        self.inner = inner
        self.codec = codec
        self.url = inner.url
        setattr(self, "native_async", inner.native_async)  # noqa: B010 (a ClassVar on Backend)
        setattr(self, "atomic_blobs", inner.atomic_blobs)  # noqa: B010

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Backend:
        raise ConfigurationError("a replay check's read-only view is made from an open store")

    @property
    def supports_leases(self) -> bool:
        return False

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise self._frontier(args)

    async def _arefuse(self, *args: Any, **kwargs: Any) -> Any:
        raise self._frontier(args)

    def _frontier(self, args: tuple[Any, ...]) -> Frontier:
        """Where the refused write would have landed: a step's row (its body is still the
        codec's, below no wrapper) names its position; anything else names none."""
        row = args[0] if args else None
        if isinstance(row, CheckpointRow):
            try:
                body = Record.decode(self.codec, row).body
            except PersistkitError:
                body = {}
            if body.get("k") == "step" and body.get("s") == "failed":
                return Frontier(body.get("p"), body.get("n"), "the step would fail here", fails=True)
            if body.get("k") == "step":
                return Frontier(body.get("p"), body.get("n"), "the step would complete here (its recorded children replayed)")
        return Frontier(None, None, "the run would write a checkpoint here")

    write = put_blobs = rewrite = delete_thread = lease_swap = write_fenced = write_fenced_swap = _refuse
    awrite = aput_blobs = arewrite = adelete_thread = alease_swap = awrite_fenced = awrite_fenced_swap = _arefuse

    def head(self, *a: Any, **k: Any) -> Any:
        return self.inner.head(*a, **k)

    def get(self, *a: Any, **k: Any) -> Any:
        return self.inner.get(*a, **k)

    def head_row(self, *a: Any, **k: Any) -> Any:
        return self.inner.head_row(*a, **k)

    def list(self, *a: Any, **k: Any) -> Any:
        return self.inner.list(*a, **k)

    def get_blobs(self, *a: Any, **k: Any) -> Any:
        return self.inner.get_blobs(*a, **k)

    def scan_blobs(self, *a: Any, **k: Any) -> Any:
        return self.inner.scan_blobs(*a, **k)

    def threads(self, *a: Any, **k: Any) -> Any:
        return self.inner.threads(*a, **k)

    def namespaces(self, *a: Any, **k: Any) -> Any:
        return self.inner.namespaces(*a, **k)

    def close(self) -> None:
        pass  # the checked store stays open: it is the caller's

    async def ahead(self, *a: Any, **k: Any) -> Any:
        return await self.inner.ahead(*a, **k)

    async def aget(self, *a: Any, **k: Any) -> Any:
        return await self.inner.aget(*a, **k)

    async def ahead_row(self, *a: Any, **k: Any) -> Any:
        return await self.inner.ahead_row(*a, **k)

    async def alist(self, *a: Any, **k: Any) -> Any:
        return await self.inner.alist(*a, **k)

    async def aget_blobs(self, *a: Any, **k: Any) -> Any:
        return await self.inner.aget_blobs(*a, **k)

    async def ascan_blobs(self, *a: Any, **k: Any) -> Any:
        return await self.inner.ascan_blobs(*a, **k)

    async def athreads(self, *a: Any, **k: Any) -> Any:
        return await self.inner.athreads(*a, **k)

    async def anamespaces(self, *a: Any, **k: Any) -> Any:
        return await self.inner.anamespaces(*a, **k)

    async def aclose(self) -> None:
        pass


def _read_only(store: Store) -> Store:
    """``store`` with its codec and options, over :class:`_ReadOnly` (no new codec is attached)."""
    view = object.__new__(type(store))
    view.__dict__.update(store.__dict__)
    view.backend = _ReadOnly(store.backend, store.codec)
    return view


@dataclass
class _Check:
    """One run's check: what ``pk.resume`` does in it, and what it found."""

    store: Any  # the checked pk.Store, over _ReadOnly: what every pk.resume in the check uses
    thread_id: str
    namespace: str
    run_id: str
    status: str
    runs: list[Run] = field(default_factory=list)
    at: tuple[str, str] | None = None  # the last step position looked up, and its name
    old: list[str] = field(default_factory=list)
    depth: int = 0  # checked blocks open (a block nested in the entry's ends only itself)

    # -- what pk.resume calls ----------------------------------------------------------

    def open_sync(self, run: Run, run_id: str | None) -> None:
        run.replay_only = True  # before open: nothing a layer does at open may write
        run.store.run_sync(run.open(run_id))
        self._opened(run)

    async def open_async(self, run: Run, run_id: str | None) -> None:
        run.replay_only = True
        await run.store.run_async(run.open(run_id))
        self._opened(run)

    def _opened(self, run: Run) -> None:
        from ._cursor import RUNNING

        run.status = RUNNING
        self.runs.append(run)
        self.depth += 1
        real = run.lookup

        def lookup(position: str, name: str) -> Record | None:
            self.at = (position, name)
            if position not in run._index:
                if position in run._max_child:  # an unfinished step: re-entered, its children replay
                    return None
                raise Frontier(position, name, "a step the run never recorded: the run would run it there")
            rec = real(position, name)
            if rec is None:
                raise Frontier(position, name, "its recorded failure ended an attempt: the run would run it again")
            return rec

        setattr(run, "lookup", lookup)  # noqa: B010 (this run only: no cost for any other)

    def exit(self, run: Run, exc: BaseException | None) -> None:
        """``pk.resume``'s exit in a check: a block that ends cleanly (or suspends) ends the
        entry with :class:`Ended`; an exception goes on (the block writes nothing)."""
        self.depth -= 1
        if self.depth == 0 and (exc is None or run.status == "suspended"):
            raise Ended(run.status) from None

    def old_patch(self, run: Run, patch_id: str) -> None:
        if patch_id not in self.old:
            self.old.append(patch_id)

    # -- the outcome -------------------------------------------------------------------

    def _mine(self) -> Run | None:
        for run in self.runs:
            if (run.thread_id, run.namespace, run.run_id) == (self.thread_id, self.namespace, self.run_id):
                return run
        return None

    def result(self, outcome: str, *, position: str | None = None, step: str | None = None,
               error: BaseException | str | None = None) -> RunReplay:
        if outcome != "stops" and self._mine() is None:
            opened = ", ".join(f"{r.thread_id!r} run {r.run_id}" for r in self.runs) or "no run"
            outcome, position, step = "stops", None, None
            error = ConfigurationError(
                f"the entry did not resume run {self.run_id} of thread {self.thread_id!r} (it opened "
                f"{opened}): it must open pk.resume(thread_id, run_id=run_id"
                + (f", namespace={self.namespace!r}" if self.namespace else "") + ") with the ids it is given"
            )
        return RunReplay(
            self.thread_id, self.namespace, self.run_id, self.status, outcome, position, step,
            None if error is None else str(error),
            None if error is None or isinstance(error, str) else type(error).__name__,
            tuple(self.old),
        )

    def frontier(self, signal: Frontier) -> RunReplay:
        position, step = signal.position, signal.step
        if signal.fails and isinstance(signal.__context__, Exception):
            return self.failed(signal.__context__)  # the write would record this failure: it stops
        return self.result("continues", position=position, step=step)

    def ended(self) -> RunReplay:
        run = self._mine()
        return self.result("waits" if run is not None and run.status == "suspended" else "completes")

    def failed(self, exc: Exception) -> RunReplay:
        if isinstance(exc, NonDeterminismError) and exc.position is not None:
            return self.result("stops", position=exc.position, step=exc.step, error=exc)
        at = self.at
        if at is None:  # before any step: as the run opened (a state that does not load, a failed migration)
            return self.result("stops", error=exc)
        if not isinstance(exc, PersistkitError):  # the code's own error, after the last step looked up
            return self.result("stops", position=at[0], error=exc)
        return self.result("stops", position=at[0], step=at[1], error=exc)


# -- finding the runs ---------------------------------------------------------------------


def _waiting(store: Store, threads: Iterable[str] | None, prefix: str, namespace: str) -> Plan[list[tuple[str, str, str]]]:
    """(thread, run, status) of each thread whose head record is an unfinished run's."""
    if threads is None:
        ids: list[str] = []
        after = None
        while True:
            page: list[str] = yield call("threads", prefix=prefix, after=after, limit=500)
            ids.extend(page)
            if len(page) < 500:
                break
            after = page[-1]
    else:
        ids = list(threads)
    out = []
    for t in ids:
        found = yield call("head_row", t, namespace)
        if not found:
            continue
        rec = Record.decode(store.codec, found[1])
        rs = rec.run_status
        if rec.kind in ("step", "end") and rs in (*UNFINISHED, ROLLING_BACK) and rec.row.run_id:
            out.append((t, rec.row.run_id, str(rs)))
    return out


def _stored_functions(store: Store, thread_id: str, namespace: str, run_id: str, status: str) -> Plan[RunReplay | None]:
    """The run's functions stored by name that a resume would call — its pending after-commit
    effects, and the compensations of a run rolling back — resolved in this code: a
    ``stops`` result naming the first that is gone (renamed, moved, not allowlisted); for a
    run rolling back (also one whose rollback waits on a question or a timer) ``continues``
    at ``c`` when all resolve (its block never runs again); else None: replay its block."""
    from ..coordination import _outbox as ob
    from ..coordination import _saga

    rows = yield from read_rows(store.codec, thread_id, namespace, run_id)
    wanted: list[tuple[str, str, str, str]] = []  # (kind, name, position, step)
    for p in ob.pending_in(rows):
        wanted.append(("after-commit effect", str(p.entry.get("f")), p.position, str(p.rec.body.get("n"))))
    index = {str(r.body["p"]): r for r in rows if r.kind == "step" and "dm" not in r.body}  # as the cursor keeps them
    try:
        todo = _saga.remaining(index, thread_id, run_id)
    except PersistkitError as exc:  # a plan naming what the run did not record: damaged records
        return RunReplay(thread_id, namespace, run_id, status, "stops", position="c", error=str(exc),
                         error_type=type(exc).__name__)
    rolling = status == ROLLING_BACK or todo is not None
    for item in todo or ():
        wanted.append(("compensation", str(item.entry.get("f")), item.position, str(item.source.body.get("n"))))
    for kind, name, position, step in wanted:
        where = f"thread {thread_id!r} run {run_id}: the {kind} {name} of step {step!r} at {position}"
        try:
            if kind == "compensation":
                _saga.resolve(store.codec, name, where)
            else:
                ob.resolve(name, store.codec, where)
        except PersistkitError as exc:
            return RunReplay(
                thread_id=thread_id, namespace=namespace, run_id=run_id, status=status, outcome="stops",
                position=position, step=step, error=str(exc), error_type=type(exc).__name__,
            )
    return RunReplay(thread_id, namespace, run_id, status, "continues", position="c") if rolling else None


def _entry_call(entry: Callable[..., Any], store: Store, thread_id: str, run_id: str) -> Any:
    try:
        params = inspect.signature(entry).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    return entry(thread_id, run_id, store=store) if "store" in params else entry(thread_id, run_id)


def _check_args(entry: object, threads: object, prefix: object, namespace: object) -> list[str] | None:
    if not callable(entry):
        raise ConfigurationError(
            f"check_replay(entry=...): entry must be the function that resumes one run, "
            f"entry(thread_id, run_id), got {entry!r}"
        )
    for what, value in (("prefix", prefix), ("namespace", namespace)):
        if not isinstance(value, str):
            raise ConfigurationError(f"check_replay({what}=...) must be a str, got {type(value).__name__}")
    if threads is None:
        return None
    if isinstance(threads, str) or not isinstance(threads, Iterable):
        raise ConfigurationError(f"check_replay(threads=...) must be a list of thread ids, got {threads!r}")
    ids = list(threads)
    for t in ids:
        if not isinstance(t, str) or not t:
            raise ConfigurationError(f"check_replay(threads=...): {t!r} is not a thread id (a non-empty str)")
    return ids


class ReplayCheckStore:
    """``Store.check_replay`` / ``acheck_replay`` (mixed into :class:`~persistkit.Store`)."""

    def check_replay(
        self, entry: Callable[..., Any], *, threads: Iterable[str] | None = None, prefix: str = "", namespace: str = ""
    ) -> ReplayReport:
        """Replay every unfinished or suspended run (of ``threads``, or of every thread whose
        id starts with ``prefix``) against the code as it is now, through ``entry(thread_id,
        run_id)``, without running a step body or writing anything; see :class:`ReplayReport`.
        An ``async def`` entry runs in ``asyncio.run`` (from async code use ``acheck_replay``)."""
        import asyncio

        store: Store = self  # type: ignore[assignment]
        ids = _check_args(entry, threads, prefix, namespace)
        if inspect.iscoroutinefunction(entry) and _loop_running():
            raise ConfigurationError(
                "check_replay() with an async entry was called from a running event loop: "
                "use `await store.acheck_replay(entry)`"
            )
        view = _read_only(store)
        found: list[tuple[str, str, str]] = store.run_sync(_waiting(store, ids, prefix, namespace))
        results = []
        for t, r, status in found:
            settled: RunReplay | None = store.run_sync(_stored_functions(store, t, namespace, r, status))
            if settled is not None:  # a function it will call is gone, or a rollback (its block never runs again)
                results.append(settled)
                continue
            check = _Check(view, t, namespace, r, status)
            token = CHECKING.set(check)
            try:
                out = _entry_call(entry, view, t, r)
                if inspect.isawaitable(out):
                    asyncio.run(_awaited(out))
                results.append(check.ended())
            except Frontier as signal:
                results.append(check.frontier(signal))
            except Ended:
                results.append(check.ended())
            except Exception as exc:
                results.append(check.failed(exc))
            finally:
                CHECKING.reset(token)
        return ReplayReport(tuple(results))

    async def acheck_replay(
        self, entry: Callable[..., Any], *, threads: Iterable[str] | None = None, prefix: str = "", namespace: str = ""
    ) -> ReplayReport:
        """:meth:`check_replay` from async code: an ``async def`` entry is awaited, a plain
        one runs in a worker thread (it blocks on the store)."""
        import asyncio

        store: Store = self  # type: ignore[assignment]
        ids = _check_args(entry, threads, prefix, namespace)
        view = _read_only(store)
        found: list[tuple[str, str, str]] = await store.run_async(_waiting(store, ids, prefix, namespace))
        results = []
        for t, r, status in found:
            settled: RunReplay | None = await store.run_async(_stored_functions(store, t, namespace, r, status))
            if settled is not None:
                results.append(settled)
                continue
            check = _Check(view, t, namespace, r, status)
            token = CHECKING.set(check)
            try:
                if inspect.iscoroutinefunction(entry):
                    await _entry_call(entry, view, t, r)
                else:  # to_thread copies this context: the check goes with it
                    out = await asyncio.to_thread(_entry_call, entry, view, t, r)
                    if inspect.isawaitable(out):
                        await out
                results.append(check.ended())
            except Frontier as signal:
                results.append(check.frontier(signal))
            except Ended:
                results.append(check.ended())
            except Exception as exc:
                results.append(check.failed(exc))
            finally:
                CHECKING.reset(token)
        return ReplayReport(tuple(results))


def _loop_running() -> bool:
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _awaited(out: Any) -> Any:
    return await out
