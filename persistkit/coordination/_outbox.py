"""The after-commit outbox: effects a step registers, run once its checkpoint is durable.

``run.after_commit(fn, *args, **kwargs)`` inside a step (``engine/_outbox.py``) stores the
effect in that step's own record (key ``ac``: a list of ``{"f": "module:qualname", "a":
arguments tree, "rt": retry}``), so it is pending in the same atomic write as the step and
dropped with a step that fails. Once the checkpoint landed the effect runs in the same
process; its id (``<checkpoint id>.<index>``) is then recorded done (key ``ad``) with the
run's next checkpoint, whatever it is (a step, the end, a suspend). An effect whose id no
later row carries is pending: the next resume of its run runs it before the block goes on
(from the run's own rows, read as it opens: no extra read), and ``store.drain_outbox()``
(``_outbox_store``) finds it from any process.

This module holds what both share and does no I/O of its own beyond calling the effects:
naming and resolving effect functions (a stored record never names arbitrary code), the
pending set of a list of records, the idempotency key, and calling an effect under its
retry policy with ``pk.current_effect()`` set.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

from .._errors import ConfigurationError, EffectError
from .._ids import next_checkpoint_id
from .._retry import Retry
from ..backends._protocol import CheckpointRow, new_row
from ..codec._functions import NotFound, find, registered_name
from ..codec._names import refusal
from ..codec._pipeline import Codec
from ..state._records import Record

__all__ = [
    "DEFAULT_RETRY",
    "EffectInfo",
    "Pending",
    "call_async",
    "call_sync",
    "current_effect",
    "done_mark",
    "effect_id",
    "effect_key",
    "effect_name",
    "pending_in",
    "resolve",
    "retry_of",
    "retry_spec",
]

#: The retry policy of an effect registered without ``retry=``: 3 attempts within 60 s.
DEFAULT_RETRY = Retry(attempts=3, timeout=60.0)

@dataclass(frozen=True, slots=True)
class EffectInfo:
    """The after-commit effect being run (``pk.current_effect()``).

    ``key`` is the effect's idempotency key: derived from the thread, the run, the
    position of the step that registered it and its index among that step's effects, so
    it is the same in every process that runs it (after a crash, a resume, a drain).
    Pass it to the receiving API (Stripe's ``Idempotency-Key``, a message id) and a run
    of the effect twice is seen once.
    """

    thread_id: str
    run_id: str
    position: str
    index: int
    function: str
    attempt: int
    key: str


_EFFECT: ContextVar[EffectInfo | None] = ContextVar("persistkit_effect", default=None)


def current_effect() -> EffectInfo | None:
    """The after-commit effect being run (with its idempotency ``key``), or None."""
    return _EFFECT.get()


def effect_key(thread_id: str, run_id: str, position: str, index: int, namespace: str = "") -> str:
    """The idempotency key of effect ``index`` of the step at ``position`` of ``run_id``
    (a namespace other than the default one is part of it: two tenants never share a key)."""
    ns = f"\x00{namespace}" if namespace else ""
    raw = f"{thread_id}\x00{run_id}\x00{position}\x00{index}{ns}".encode()
    return "pk-effect-" + hashlib.blake2b(raw, digest_size=16).hexdigest()


def effect_id(checkpoint_id: str, index: int) -> str:
    """What the ``ad`` list of a later row carries once the effect ran."""
    return f"{checkpoint_id}.{index}"


# -- naming and resolving effect functions ---------------------------------------------------


def effect_name(fn: Any) -> str:
    """``module:qualname`` of ``fn``, which must be registered (``@pk.register``) so that the
    process that runs it after a crash (the next resume, a drain) may call it; a
    ``ConfigurationError`` otherwise, or for a lambda, a closure or a bound method."""
    if not callable(fn):
        raise ConfigurationError(f"after_commit() takes a function, got {fn!r}")
    what = f"after_commit({getattr(fn, '__qualname__', fn)!r})"
    return registered_name(fn, what, "the next resume or store.drain_outbox(), after a crash,")


def resolve(name: str, codec: Codec, where: str) -> Callable[..., Any]:
    """The function a stored effect names: registered in this process (``@pk.register``),
    after importing its module if the module is allowlisted (``connect(allow_modules=...)``,
    the modules of ``@checkpointed`` functions and ``State`` classes). Nothing else: a
    stored record never makes us call or import anything more (``codec._functions``)."""
    try:
        return find(name, tuple(codec.serializer.allow_modules))
    except NotFound as missing:
        module = name.partition(":")[0]
        if missing.kind == "no import":
            raise EffectError(f"{where}: cannot import the effect function {name} {missing.detail}; "
                              "it stays pending", function=name) from missing
        if missing.kind == "gone":
            raise EffectError(f"{where}: {name} is no function in this code (renamed or removed?); it "
                              "stays pending: restore it, or keep a function of that name", function=name) from None
        fix = (
            f"put @pk.register on it in {module} (effect functions are called only when registered)"
            if missing.kind == "unregistered"
            else f"import the module that registers it (@pk.register) before draining (CLI: "
            f"persistkit drain-outbox --import {module}; or pk.connect(url, allow_modules=[{module!r}]))"
        )
        raise EffectError(
            f"{where}: {refusal(name, 'an after-commit effect function', fix)}; the effect stays pending",
            function=name,
        ) from None


# -- retry policies as stored ---------------------------------------------------------------


def retry_spec(retry: Retry) -> list[Any]:
    """The stored form of a policy (its ``on=`` is not stored: another process retries any Exception)."""
    return [retry.attempts, retry.timeout, retry.wait_initial, retry.wait_max, retry.wait_jitter]


def retry_of(spec: Any) -> Retry:
    if type(spec) is not list or len(spec) != 5:
        return DEFAULT_RETRY
    try:
        return Retry(attempts=spec[0], timeout=spec[1], wait_initial=spec[2], wait_max=spec[3], wait_jitter=spec[4])
    except ConfigurationError:
        return DEFAULT_RETRY


# -- pending effects in a list of records ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pending:
    """A committed effect whose done mark is in no later row."""

    rec: Record
    index: int
    entry: dict[str, Any]

    @property
    def id(self) -> str:
        return effect_id(self.rec.id, self.index)

    @property
    def position(self) -> str:
        return str(self.rec.body.get("p"))

    def info(self, attempt: int = 1) -> EffectInfo:
        t, r = self.rec.row.thread_id, self.rec.row.run_id or ""
        return EffectInfo(t, r, self.position, self.index, str(self.entry.get("f")), attempt,
                          effect_key(t, r, self.position, self.index, self.rec.row.namespace))

    def where(self) -> str:
        r = self.rec.row
        return (f"thread {r.thread_id!r} run {r.run_id}: effect {self.index} ({self.entry.get('f')}) of "
                f"step {self.rec.body.get('n')!r} at {self.position} (checkpoint {r.checkpoint_id})")


def pending_in(records: Iterable[Record]) -> list[Pending]:
    """The effects registered in ``records`` (oldest first) that none of them marks done."""
    done: set[str] = set()
    registered: list[Record] = []
    for rec in records:
        body = rec.body
        if "ad" in body:
            done.update(body["ad"])
        if "ac" in body:
            registered.append(rec)
    return [
        Pending(rec, i, entry)
        for rec in registered
        for i, entry in enumerate(rec.body["ac"])
        if effect_id(rec.id, i) not in done
    ]


def done_mark(
    codec: Codec, thread_id: str, namespace: str, run_id: str | None, head_id: str, head_body: dict[str, Any],
    done: list[str], *, stored: bool = False,
) -> tuple[CheckpointRow, dict[str, Any]]:
    """The row (and its body) that records ``done`` (the ids of effects that ran): a copy of
    the thread's head record (``head_id``, ``head_body``) — the same kind, run, status, state refs and result, so
    every reader treats it as the head it copies (a crashed run continues, a suspended one
    waits, a finished one stays finished) — without the effects the head registered (they
    are its own), its resume mark (``rz``: the run resumed once) or its list segments (the
    copied refs name the rows that hold them). Written right after a run's effects ran (``engine/_outbox``), or by a drain. ``stored``: ``head_body``
    was read back from the store (its secrets are handles already: packed as it is, see
    ``Codec.pack_stored``), not the body this process committed (live values)."""
    body = {k: v for k, v in head_body.items() if k not in ("ac", "ad", "sg", "rz")}  # rz: the head's own
    body["ad"] = done
    body["dm"] = 1  # a done mark: replay keeps the record it copies (it has the args digest)
    body["t"] = time.time()
    payload = codec.pack_stored(body) if stored else codec.pack_tree(body)
    row = new_row(thread_id, namespace, next_checkpoint_id(head_id), head_id, run_id, payload)
    return row, body


# -- calling an effect ---------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _takes_key(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "idempotency_key" in params


def _arguments(fn: Callable[..., Any], info: EffectInfo, kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        takes = _takes_key(fn)
    except TypeError:  # an unhashable callable
        takes = False
    return {**kwargs, "idempotency_key": info.key} if takes else kwargs


def _failed(info: EffectInfo, exc: BaseException, retry: Retry) -> EffectError:
    return EffectError(
        f"thread {info.thread_id!r} run {info.run_id}: the after-commit effect {info.function} "
        f"(effect {info.index} of the step at {info.position}, idempotency key {info.key}) failed "
        f"after {info.attempt} attempt(s): {type(exc).__name__}: {exc}. Its step is committed and the "
        "effect stays pending, never dropped: the next resume of this run, or store.drain_outbox(), "
        "runs it again with the same key. Fix the cause, or give it more attempts with "
        f"after_commit(..., retry=pk.Retry(attempts=...)) (this one allows up to {retry.attempts}; "
        "it stops sooner past its timeout, or on an exception its on= does not list)",
        thread_id=info.thread_id, run_id=info.run_id, position=info.position, index=info.index,
        function=info.function, key=info.key,
    )


def call_sync(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], info: EffectInfo, retry: Retry) -> None:
    """Call the effect under ``retry``; raise ``EffectError`` once it failed for good.

    An ``async def`` effect is run to completion with ``asyncio.run`` when no event loop
    runs in this thread; inside a running loop it cannot be awaited from here (a sync step
    of an async run): a ``ConfigurationError``, and the effect stays pending."""
    import tenacity

    attempt = 0
    try:
        for att in tenacity.Retrying(**retry.tenacity_kwargs()):
            with att:
                attempt += 1
                now = replace(info, attempt=attempt)
                token = _EFFECT.set(now)
                try:
                    out = fn(*args, **_arguments(fn, now, kwargs))
                    if inspect.isawaitable(out):
                        _await_here(out, now)
                finally:
                    _EFFECT.reset(token)
    except _NotAwaitable:
        raise
    except Exception as exc:
        raise _failed(replace(info, attempt=attempt), exc, retry) from exc


async def call_async(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], info: EffectInfo, retry: Retry
) -> None:
    """``call_sync`` for an async run: an ``async def`` effect is awaited, a plain one called."""
    import tenacity

    attempt = 0
    try:
        async for att in tenacity.AsyncRetrying(**retry.tenacity_kwargs()):
            with att:
                attempt += 1
                now = replace(info, attempt=attempt)
                token = _EFFECT.set(now)
                try:
                    out = fn(*args, **_arguments(fn, now, kwargs))
                    if inspect.isawaitable(out):
                        await out
                finally:
                    _EFFECT.reset(token)
    except _NotAwaitable:
        raise
    except Exception as exc:
        raise _failed(replace(info, attempt=attempt), exc, retry) from exc


class _NotAwaitable(ConfigurationError):
    """An async effect reached where it cannot be awaited (raised as it is, not as EffectError)."""


def _await_here(out: Any, info: EffectInfo) -> None:
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(_wait(out))
        return
    if inspect.iscoroutine(out):
        out.close()
    raise _NotAwaitable(
        f"thread {info.thread_id!r} run {info.run_id}: the effect {info.function} is async, but it was "
        "reached from a sync step inside a running event loop, where it cannot be awaited. Register "
        "it from an async step (async def), or make the effect a plain function. It stays pending: "
        "the next resume of the run under `async with pk.resume(...)`, or store.adrain_outbox(), runs it"
    )


async def _wait(out: Any) -> None:
    await out
