"""Sagas: the undo of each completed step, and the rollback of a run that failed for good.

A step registers its undo with ``pk.compensate(fn, *args, **kwargs)`` (or the step is
decorated ``@pk.checkpointed(compensate=undo)``: ``undo(result)`` is called with the
step's recorded result). The registration is recorded with that step's own checkpoint
(``run._marks``, record key ``cp``), so it exists exactly when the step completed. A
function is stored as ``module:qualname`` and resolved, in whatever process runs the
rollback, only to a function registered for it (``@pk.register`` on the function, or
``@checkpointed(compensate=fn)``; ``codec._functions``): a stored record never names
arbitrary code, nor any other function of a trusted module. Arguments are encoded like
any value (secrets become handles, the row is compressed, encrypted and authenticated
with the rest of the record).

When a run fails for good (an ``Exception`` escaping its block that is not a
``pk.RetryableError``, or ``run.abort()``), the rollback (``_rollback``, the two driving
loops) runs before the end record, under the block's lease:

1. the *rollback mark*: a step record at position ``c`` (name ``pk.rollback``, run status
   ``compensating``) holding the plan (``cb``: ``[position, index]`` of each compensation,
   the newest completed step first, a step's own compensations last registered first) and
   the failure (``ce``). From here on, a resume of the run finishes the rollback and never
   runs the block;
2. compensation ``i`` of the plan runs as a step at position ``c/i`` (a scope no forward
   step can take), under its retry policy; its record (status ``compensating``) says it
   is done. A completed one never runs again, one that failed runs again next time;
3. all done: the end record, run status ``compensated``. Some failed for good:
   ``pk.CompensationError`` (no end record: the run stays ``compensating``, the thread's
   other turns wait for it as for a crashed run, and a resume of it retries what is left).

This module holds the decisions (no I/O): names, registration, the plan, the errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._errors import (
    CompensationError,
    ConfigurationError,
    NonDeterminismError,
    PersistkitError,
    RunAbortedError,
    RunCompensatedError,
    SchemaVersionError,
    SerializationError,
)
from .._retry import Retry
from ..codec._functions import NotFound, find, register_function, registered_name, stored_name
from ..codec._names import exception_class, refusal
from ..state._records import Record

#: The run being rolled back (``engine._run.Run``, not named here: the engine's replay
#: cursor imports this module, so it may not import the engine back, not even for types).
Run = Any

__all__ = [
    "COMPENSATED",
    "COMPENSATING",
    "ROLLBACK",
    "Rollback",
    "abort",
    "compensated_error",
    "register",
    "undo_name",
]

#: The position of the rollback mark; compensation ``i`` runs at ``c/i``. Forward steps
#: are numbered (``0``, ``2/1``): no forward position starts with ``c``.
ROLLBACK = "c"
ROLLBACK_NAME = "pk.rollback"
#: Run statuses: rolling back (unfinished), and the end status of a rolled-back run.
COMPENSATING, COMPENSATED = "compensating", "compensated"

#: A compensation's retry policy unless it names one: undoing is worth more patience than a
#: forward step (the run cannot end well without it). ``pk.Retry(attempts=1)``: no retries.
DEFAULT_RETRY = Retry(attempts=5, timeout=300.0, wait_initial=0.5, wait_max=30.0, wait_jitter=1.0)



# -- functions by name ---------------------------------------------------------------------


def function_name(fn: Any, what: str) -> str:
    """``module:qualname`` of a module-level function (or a class's static method),
    refused with a clear error for a lambda, a closure, a bound method or a callable
    object: a later process must find the very same function by that name."""
    return stored_name(fn, what, "the process that runs the rollback after a crash")


def resolve(codec: Any, name: str, what: str) -> Callable[..., Any]:
    """The compensation stored as ``name``: a function registered in this process
    (``@pk.register``, ``@checkpointed(compensate=...)``), after importing its module if
    that module is allowlisted; nothing else (``codec._functions``)."""
    try:
        return find(name, tuple(getattr(codec.serializer, "allow_modules", ())))
    except NotFound as missing:
        module = name.partition(":")[0]
        if missing.kind == "no import":
            raise ConfigurationError(f"{what}: cannot import module {module!r} {missing.detail}") from missing
        if missing.kind == "gone":
            raise ConfigurationError(
                f"{what}: {name} is not a function of this code (renamed or removed since the run "
                "registered it?). Restore it under that name, then resume the run again"
            ) from None
        fix = (
            f"put @pk.register on it in {module} (a compensation is called only when registered)"
            if missing.kind == "unregistered"
            else f"import the module that registers it (@pk.register) in the process that resumes "
            f"the run, or open the store with pk.connect(..., allow_modules=[{module!r}])"
        )
        raise ConfigurationError(f"{what}: {refusal(name, 'a compensation function', fix)}") from None


def undo_name(fn: Any, step: str) -> str:
    """``@checkpointed(compensate=fn)``: the stored name of ``fn``, registered at decoration
    (a declaration in code, as the step itself is)."""
    return register_function(fn, f"@checkpointed(compensate=...) of step {step!r}")


# -- retry policies as data ----------------------------------------------------------------


def _retry_spec(retry: Retry, what: str) -> dict[str, Any]:
    on = retry.on
    types = (on,) if isinstance(on, type) else on
    if not isinstance(types, tuple):
        raise ConfigurationError(
            f"{what}: retry=pk.Retry(on=<callable>) cannot be stored with the run (a resumed rollback "
            "runs in another process); give on= exception classes instead"
        )
    names = []
    for t in types:
        if t.__module__ != "builtins" and "<locals>" in t.__qualname__:
            raise ConfigurationError(f"{what}: retry on {t!r}: a class defined inside a function cannot be stored")
        names.append(f"{t.__module__}:{t.__qualname__}")
    return {
        "n": retry.attempts, "t": retry.timeout, "wi": retry.wait_initial, "wm": retry.wait_max,
        "wj": retry.wait_jitter, "on": names,
    }


def retry_policy(codec: Any, spec: Any, what: str) -> Retry:
    """The compensation's policy from its stored form (``DEFAULT_RETRY`` when none)."""
    if spec is None:
        return DEFAULT_RETRY
    if type(spec) is not dict or type(spec.get("on")) is not list:
        raise ConfigurationError(f"{what}: its stored retry policy is malformed: {spec!r:.200}")
    types = []
    for name in spec["on"]:
        cls = exception_class(str(name), tuple(getattr(codec.serializer, "allow_modules", ())))
        if cls is None:
            raise ConfigurationError(f"{what} (retry on=): " + refusal(
                str(name), "an exception class", "register it with pk.register(...) where it is defined"
            ))
        types.append(cls)
    return Retry(
        attempts=spec["n"], timeout=spec["t"], on=tuple(types),
        wait_initial=spec["wi"], wait_max=spec["wm"], wait_jitter=spec["wj"],
    )


# -- registering ---------------------------------------------------------------------------


def register(
    run: Run, position: str, attempt: int, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
    retry: Retry | None,
) -> None:
    """Record ``fn(*args, **kwargs)`` as an undo of the step at ``position`` (kept with the
    step's checkpoint if it completes; an earlier attempt's registrations are dropped)."""
    what = f"pk.compensate() in step at position {position} of thread {run.thread_id!r}"
    if position == ROLLBACK or position.startswith(ROLLBACK + "/"):
        raise ConfigurationError(f"{what}: a compensation cannot register compensations of its own")
    name = registered_name(fn, what, "the process that runs the rollback after a crash")
    if retry is not None and not isinstance(retry, Retry):
        raise ConfigurationError(f"{what}: retry= expects pk.Retry(...), got {retry!r}")
    entry: dict[str, Any] = {"f": name, "at": attempt}
    try:
        if args:
            entry["a"] = run.codec.encode(list(args), f"arguments of compensation {name}")
        if kwargs:
            entry["kw"] = run.codec.encode(kwargs, f"keyword arguments of compensation {name}")
    except SerializationError as exc:
        raise SerializationError(f"{what}: the arguments of {name} cannot be stored with the step: {exc}") from exc
    if retry is not None:
        entry["rt"] = _retry_spec(retry, what)
    marks = run._marks.setdefault(position, {})
    entries = marks.setdefault("cp", [])
    entries[:] = [e for e in entries if e.get("at") == attempt or "rr" in e]  # a retried attempt starts clean
    entries.append(entry)


def register_result_undo(run: Run, position: str, name: str) -> None:
    """``@checkpointed(compensate=undo)``: after the step returned, ``undo(result)``."""
    run._marks.setdefault(position, {}).setdefault("cp", []).append({"f": name, "rr": 1})


def abort(run: Run, reason: str | None) -> RunAbortedError:
    if reason is not None and not isinstance(reason, str):
        raise ConfigurationError(f"run.abort(reason=...) takes a str or None, got {type(reason).__name__}")
    if run.status != "running" or run.replay_only:
        raise ConfigurationError(
            f"thread {run.thread_id!r}: run {run.run_id} cannot be aborted: it is {run.status}"
            + (" (replayed read-only)" if run.replay_only else "")
            + ", so nothing of it would roll back. Call run.abort() inside its pk.resume block, while it runs"
        )
    why = f": {reason}" if reason else ""
    return RunAbortedError(
        f"thread {run.thread_id!r}: run {run.run_id} was aborted{why}. It fails for good: the "
        "compensations of its completed steps run (pk.compensate), then its end is recorded",
        thread_id=run.thread_id, run_id=run.run_id, reason=reason,
    )


# -- the rollback -------------------------------------------------------------------------


def _is_rollback(position: str) -> bool:
    return position == ROLLBACK or position.startswith(ROLLBACK + "/")


def fails_for_good(run: Run, exc: BaseException) -> bool:
    """Whether ``exc`` escaping the block starts a rollback. Not: an error saying this code or
    this data does not fit the run (``NonDeterminismError``, ``SchemaVersionError``: a deploy
    or a migration to fix, then redeliver; the run ends ``failed`` as without sagas), nor a
    run whose commits another writer refused (it cannot write any more)."""
    return (
        isinstance(exc, Exception)
        and not isinstance(exc, (NonDeterminismError, SchemaVersionError))
        and run._lost is None
    )


def plan(run: Run) -> list[list[Any]]:
    """``[position, index]`` of every compensation of the run's completed steps, in the
    order they undo: the step completed last first, its compensations last registered first."""
    steps = [
        r for p, r in run._index.items()
        if r.body.get("cp") and r.body.get("s") == "completed" and not _is_rollback(p)
    ]
    steps.sort(key=lambda r: r.id, reverse=True)
    return [[r.body["p"], i] for r in steps for i in reversed(range(len(r.body["cp"])))]


class Item:
    """One compensation of the plan: where it runs, what it undoes."""

    __slots__ = ("entry", "index", "name", "position", "source")

    def __init__(self, index: int, source: Record, entry: dict[str, Any]) -> None:
        self.index = index
        self.position = f"{ROLLBACK}/{index}"
        self.source = source
        self.entry = entry
        self.name = f"pk.compensate({entry['f']})"

    def describe(self) -> str:
        return f"{self.entry['f']} (undoes step {self.source.body.get('n')!r} at {self.source.body.get('p')})"


def plan_items(index: dict[str, Record], steps: list[list[Any]], thread_id: str, run_id: str) -> list[Item]:
    """The compensations a rollback plan (``cb``: ``[position, index in its cp]`` pairs) names,
    found in ``index`` (a run's records by position, later ones winning, as the cursor keeps
    them); a ``ConfigurationError`` when the run did not record one (damaged records)."""
    items = []
    for i, (pos, k) in enumerate(steps):
        source = index.get(pos)
        cp = source.body.get("cp") if source is not None else None
        if source is None or type(cp) is not list or not 0 <= k < len(cp) or type(cp[k]) is not dict:
            raise ConfigurationError(
                f"thread {thread_id!r} run {run_id}: the rollback plan names compensation {k} of "
                f"the step at {pos}, which the run did not record; the run's records are damaged"
            )
        items.append(Item(i, source, cp[k]))
    return items


def remaining(index: dict[str, Record], thread_id: str, run_id: str) -> list[Item] | None:
    """The compensations a run's recorded rollback has still to run (not recorded completed),
    or None when the run recorded no rollback mark (what the replay check asks)."""
    mark = index.get(ROLLBACK)
    if mark is None:
        return None
    items = plan_items(index, list(mark.body.get("cb") or []), thread_id, run_id)
    return [it for it in items if (rec := index.get(it.position)) is None or rec.body.get("s") != "completed"]


class Rollback:
    """The rollback of one run: its plan, what is done, and what to tell the user (no I/O)."""

    def __init__(self, run: Run, steps: list[list[Any]], failure: BaseException, failure_tree: Any) -> None:
        self.run = run
        self.steps = steps
        self.failure = failure
        self.failure_tree = failure_tree
        self.items = plan_items(run._index, steps, run.thread_id, run.run_id)
        self.undone_before: list[str] = []
        self.undone: list[str] = []
        self.failed: list[tuple[str, str]] = []

    @classmethod
    def start(cls, run: Run, exc: BaseException) -> Rollback | None:
        """The rollback ``exc`` escaping the block starts, or None (nothing to undo: the run
        ends as without sagas)."""
        if not fails_for_good(run, exc):
            return None
        steps = plan(run)
        if not steps:
            return None
        return cls(run, steps, exc, run.codec.serializer.encode_exception(exc))

    @classmethod
    def resumed(cls, run: Run) -> Rollback:
        """The rollback of a run whose rollback mark is recorded (a crash interrupted it)."""
        mark = run._index[ROLLBACK]
        at = f"thread {run.thread_id!r} run {run.run_id}: the failure that started its rollback"
        tree = mark.body.get("ce")
        failure = run.codec.decode_exception(tree, at, live=mark.live) if tree is not None else RuntimeError("unknown")
        return cls(run, list(mark.body.get("cb") or []), failure, tree)

    def mark_body(self) -> dict[str, Any]:
        """What the rollback mark records besides a step's usual keys."""
        return {"cb": self.steps, "ce": self.failure_tree}

    def todo(self) -> list[Item]:
        """The compensations to run now: not recorded as done (a failed one runs again)."""
        out = []
        for item in self.items:
            rec = self.run._index.get(item.position)
            if rec is not None and rec.body.get("n") != item.name:
                raise NonDeterminismError(
                    f"thread {self.run.thread_id!r} run {self.run.run_id}: rollback position {item.position} "
                    f"recorded {rec.body.get('n')!r}, but the plan names {item.name!r}; the run's records are damaged"
                )
            if rec is not None and rec.body.get("s") == "completed":
                self.undone_before.append(item.describe())
            else:
                out.append(item)
        return out

    def call(self, item: Item) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Retry]:
        """The function, arguments and policy of ``item`` (a ``PersistkitError`` if it cannot
        be had: that compensation is not undone, and says why)."""
        from ..secrets._live import live

        codec, run = self.run.codec, self.run
        what = f"compensation {item.describe()} of thread {run.thread_id!r} run {run.run_id}"
        fn = resolve(codec, item.entry["f"], what)
        fresh = item.source.live  # the step's record as this process committed it
        args = list(codec.decode(item.entry["a"], what + ": arguments", live=fresh)) if "a" in item.entry else []
        kwargs = dict(codec.decode(item.entry["kw"], what + ": arguments", live=fresh)) if "kw" in item.entry else {}
        if item.entry.get("rr"):
            args.insert(0, self._result(item.source, what))
        policy = retry_policy(codec, item.entry.get("rt"), what)
        live_args, live_kwargs = live((tuple(args), kwargs), where=what, redactor=codec.redactor)
        return fn, tuple(live_args), dict(live_kwargs), policy

    def _result(self, rec: Record, what: str) -> Any:
        codec, body = self.run.codec, rec.body
        at = what + ": the step's recorded result"
        if "rb" in body:
            return codec.decode(codec.unpack_tree(self.run._loader.blobs[body["rb"]], at), at)
        return codec.decode(body.get("r"), at, live=rec.live)

    def done(self, item: Item) -> None:
        self.undone.append(item.describe())

    def not_done(self, item: Item, exc: BaseException) -> None:
        self.failed.append((item.describe(), f"{type(exc).__name__}: {exc}"))

    def _failure_text(self) -> str:
        return f"{type(self.failure).__name__}: {self.failure}"

    def note(self) -> str:
        """Added to the failure the block raises once every compensation ran."""
        return (
            f"persistkit: run {self.run.run_id} failed for good and was rolled back (status "
            f"{COMPENSATED}); undone: " + "; ".join(self.undone_before + self.undone)
        )

    def error(self) -> CompensationError | None:
        """One error listing what was undone and what was not, or None when all is undone."""
        if not self.failed:
            return None
        run = self.run
        t, r = run.thread_id, run.run_id
        undone = self.undone_before + self.undone
        return CompensationError(
            f"thread {t!r}: run {r} failed for good ({self._failure_text()}) and its rollback could not "
            f"undo everything. Undone: {'; '.join(undone) or 'nothing'}. Not undone: "
            + "; ".join(f"{what}: {why}" for what, why in self.failed)
            + f". The run stays unfinished ({COMPENSATING}): fix the cause, then pk.resume({t!r}, "
            f"run_id={r!r}) runs only what is not undone yet, again (the block does not run); or give "
            f"the run up with store.abandon({t!r}, {r!r})",
            thread_id=t, run_id=r, undone=undone, not_undone=self.failed, failure=self._failure_text(),
        )

    def finished(self) -> RunCompensatedError:
        """What the resume that finished an interrupted rollback raises (the block does not run)."""
        t, r = self.run.thread_id, self.run.run_id
        return RunCompensatedError(
            f"thread {t!r}: run {r} failed for good ({self._failure_text()}) and its rollback was "
            f"interrupted; this resume finished it ({len(self.undone)} compensation(s) ran now, "
            f"{len(self.undone_before)} before) instead of running the block. The run does not run "
            "again: drop the message (ack it); to do its work anyway, run it as a new turn with a new run_id",
            thread_id=t, run_id=r, failure=self._failure_text(),
        )


def compensated_error(codec: Any, thread_id: str, run_id: str, end: Record) -> RunCompensatedError:
    """A redelivery of a rolled-back run (its end record's status is ``compensated``)."""
    text = "unknown"
    e = end.body.get("e")
    if isinstance(e, dict):
        try:
            exc = codec.decode_exception(e, f"thread {thread_id!r} run {run_id}: its recorded failure")
            text = f"{type(exc).__name__}: {exc}"
        except PersistkitError as why:
            text = f"(its recorded failure cannot be read: {why})"
    return RunCompensatedError(
        f"thread {thread_id!r}: run {run_id} failed for good ({text}) and was rolled back (its "
        "compensations ran): it does not run again, and retrying will not change that. Drop this "
        "message (ack it); to do its work anyway, run it as a new turn with a new run_id",
        thread_id=thread_id, run_id=run_id, failure=text,
    )
