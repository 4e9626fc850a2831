"""``store.limits``: rate limits shared by every process on a store (docs/flow-control.md).

The limits live in one kv scope of the store (the protocol's ``kv`` capability: versioned
keys, compare-and-swap): ``d/<name>`` holds a limit's declaration, ``s/<name>/<key>`` one
bucket's GCRA state (``_gcra``). A draw reads its bucket, decides, and swaps the new state in
against the version it read; a conflict (another process drew meanwhile) reads again. Every
operation is one plan (``_io``'s ``Call``/``Sleep`` requests) driven by a blocking or an
awaiting loop, so there is one copy of the logic for sync and async callers.

The clock is this process's wall clock (``time.time``), as leases use: hosts sharing a store
keep their clocks close (NTP); docs/flow-control.md says what a skew does.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigurationError, ConflictError, LimitNotFoundError, RateLimitedError
from .._io import Call, Sleep, call
from ..backends._capabilities import require
from ..backends._protocol import KvOp
from . import _gcra as G

__all__ = ["DEFAULT_TIMEOUT", "SCOPE", "LimitDraw", "LimitInfo", "Limits", "limits_of"]

#: The kv scope of every limit of a store.
SCOPE = "__pk_limits"
#: Seconds a call waits for capacity unless its limit or the call says otherwise.
DEFAULT_TIMEOUT = 60.0
#: Seconds a process trusts a limit's declaration it read (a changed rate reaches others within it).
SPEC_TTL = 1.0
_Plan = Generator[Call | Sleep, Any, Any]


@dataclass(frozen=True, slots=True)
class LimitDraw:
    """What one draw did: the limit, the key, the tokens drawn and the seconds it waited."""

    limit: str
    key: str
    tokens: float
    waited: float


@dataclass(frozen=True, slots=True)
class LimitInfo:
    """A limit as declared, and (from ``list``/``get``) one bucket's use at the time of reading.

    ``available``: tokens a call could draw now; ``in_use``: tokens drawn in the last
    ``burst / rate`` window (from the bucket's schedule alone: 0 during a throttle, where
    ``available`` is 0 too and ``throttled_until`` says why); ``waiting``: calls that reserved a place and have not started
    yet (reservations ahead of now, in calls of ``tokens_per_call``); ``throttled_until``: a
    provider's reset time reported with ``pk.throttle`` (seconds since the epoch), or None."""

    name: str
    rate: str
    burst: float
    tokens_per_call: float
    timeout: float
    key: str = ""
    available: float = 0.0
    in_use: float = 0.0
    waiting: int = 0
    throttled_until: float | None = None


def _spec_key(name: str) -> str:
    return f"d/{name}"


def _state_key(name: str, key: str) -> str:
    return f"s/{name}/{key}"


class Limits:
    """The rate limits of one store: ``store.limits``. Declarations and buckets are shared by
    every process that opens the store; this object is this process's handle on them.

    ``clock``, ``sleep`` and ``asleep`` are what a draw reads the time with and waits with:
    a test replaces them (a fake clock that a fake sleep advances)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.clock: Callable[[], float] = time.time
        self.sleep: Callable[[float], None] = time.sleep
        self.asleep: Callable[[float], Awaitable[None]] = _asyncio_sleep
        self._specs: dict[str, tuple[G.LimitSpec, float]] = {}

    # -- declarations ----------------------------------------------------------------------

    def set(
        self,
        name: str,
        *,
        rate: str,
        burst: float | None = None,
        tokens_per_call: float = 1,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> LimitInfo:
        """Declare (or change) the limit ``name``: ``rate`` tokens per period ("500/min", "50/s",
        "10/5s"), ``burst`` tokens at once (default ``tokens_per_call``: calls evenly spaced),
        ``tokens_per_call`` drawn by a call that names no ``tokens``, ``timeout`` seconds a call
        waits for capacity before ``pk.RateLimitedError`` (0: never wait). Every process sees
        the change within a second; buckets keep their state."""
        spec = G.LimitSpec.build(name, rate, burst, tokens_per_call, timeout)
        self._run(self._set_plan(spec))
        return _info(spec)

    def _set_plan(self, spec: G.LimitSpec) -> _Plan:
        self._require()
        while True:
            entry = yield call("kv_get", SCOPE, _spec_key(spec.name))
            try:
                yield call(
                    "kv_write",
                    SCOPE,
                    [KvOp(_spec_key(spec.name), entry.version if entry else 0, spec.dump())],
                    keep=1,
                )
            except ConflictError:
                continue
            self._specs[spec.name] = (spec, time.monotonic())
            return None

    def get(self, name: str, *, key: object = None) -> LimitInfo | None:
        """The limit ``name`` and the use of its bucket ``key``; None if it was never set."""
        return self._run(self._get_plan(G.check_name(name), G.check_key(key)))  # type: ignore[no-any-return]

    def _get_plan(self, name: str, key: str) -> _Plan:
        self._require()
        spec = yield from self._read_spec(name)
        if spec is None:
            return None
        entry = yield call("kv_get", SCOPE, _state_key(name, key))
        return _info(spec, key, G.State.load(entry.value if entry else None), self.clock())

    def list(self) -> list[LimitInfo]:
        """Every declared limit with each of its buckets' use (one entry per key that was drawn
        from; a limit never drawn from appears once, with key "")."""
        return self._run(self._list_plan())  # type: ignore[no-any-return]

    def _list_plan(self) -> _Plan:
        self._require()
        found: list[LimitInfo] = []
        specs = yield call("kv_list", SCOPE, prefix="d/")
        now = self.clock()
        for e in specs:
            spec = G.LimitSpec.load(e.key[2:], bytes(e.value))
            states = yield call("kv_list", SCOPE, prefix=f"s/{spec.name}/")
            if not states:
                found.append(_info(spec, "", G.State(), now))
            for s in states:
                found.append(
                    _info(spec, s.key[len(spec.name) + 3 :], G.State.load(bytes(s.value)), now)
                )
        return found

    def delete(self, name: str) -> bool:
        """Remove the limit ``name`` and its buckets; whether it existed. Calls that draw from
        it afterwards raise ``pk.LimitNotFoundError`` (other processes within a second)."""
        return self._run(self._delete_plan(G.check_name(name)))  # type: ignore[no-any-return]

    def _delete_plan(self, name: str) -> _Plan:
        self._require()
        self._specs.pop(name, None)
        states = yield call("kv_list", SCOPE, prefix=f"s/{name}/")
        for s in states:
            try:
                yield call("kv_write", SCOPE, [KvOp(s.key, s.version, None)], keep=1)
            except ConflictError:  # drawn from meanwhile: the tombstone of the next pass takes it
                again = yield call("kv_get", SCOPE, s.key)
                if again is not None and again.value is not None:
                    yield call("kv_write", SCOPE, [KvOp(s.key, again.version, None)], keep=1)
        while True:
            entry = yield call("kv_get", SCOPE, _spec_key(name))
            if entry is None or entry.value is None:
                return bool(states)
            try:
                yield call("kv_write", SCOPE, [KvOp(_spec_key(name), entry.version, None)], keep=1)
            except ConflictError:
                continue
            return True

    # -- draws and throttles -----------------------------------------------------------------

    def acquire(
        self,
        name: str,
        *,
        key: object = None,
        tokens: float | None = None,
        timeout: float | None = None,
    ) -> LimitDraw:
        """LimitDraw ``tokens`` (default the limit's ``tokens_per_call``) from bucket ``key`` of limit
        ``name``, waiting for capacity up to ``timeout`` seconds (default the limit's), else
        ``pk.RateLimitedError`` with nothing drawn. ``pk.limited`` and ``limit=`` call this."""
        return self._run(self.draw_plan(name, key, tokens, timeout))  # type: ignore[no-any-return]

    async def aacquire(
        self,
        name: str,
        *,
        key: object = None,
        tokens: float | None = None,
        timeout: float | None = None,
    ) -> LimitDraw:
        """``acquire`` for async callers: the wait is an ``asyncio.sleep``."""
        return await self._arun(self.draw_plan(name, key, tokens, timeout))  # type: ignore[no-any-return]

    def draw_plan(
        self, name: str, key: object, tokens: float | None, timeout: float | None
    ) -> _Plan:
        from ..ops import _telemetry as telemetry

        name, key = G.check_name(name), G.check_key(key)
        if tokens is not None:
            G._positive("tokens", tokens)
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0
        ):
            raise ConfigurationError(f"timeout={timeout!r}: expected seconds >= 0 (0: never wait)")
        self._require()
        began = self.clock()
        spec = yield from self._read_spec(name)
        if spec is None:
            raise _unknown(name)
        cost = spec.tokens_per_call if tokens is None else float(tokens)
        deadline = began + (spec.timeout if timeout is None else float(timeout))
        skey = _state_key(name, key)
        while True:
            entry = yield call("kv_get", SCOPE, skey)
            state = G.State.found(entry.value if entry else None)
            now = self.clock()
            decision = G.decide(spec, state, now, cost, max(0.0, deadline - now))
            if decision.state is None:
                telemetry.limit_refused(name)
                raise RateLimitedError(
                    f"rate limit {name!r}{_of(key)} ({spec.rate}, burst {spec.burst:g}) has no capacity for "
                    f"{cost:g} token(s) within the timeout ({deadline - began:g} s): it would fit in "
                    f"{decision.wait:.3f} s. Retry after that, or raise the limit's timeout",
                    limit=name,
                    key=key,
                    retry_after=round(decision.wait, 3),
                )
            try:
                yield call(
                    "kv_write",
                    SCOPE,
                    [KvOp(skey, entry.version if entry else 0, decision.state.dump())],
                    keep=1,
                )
            except ConflictError:
                continue  # another process drew meanwhile: read its state and decide again
            if decision.wait <= 0:
                break
            yield Sleep(decision.wait)
            # A throttle (pk.throttle) or a delete while this call waited voids its reservation:
            # draw again, from the limit as declared now (none: LimitNotFoundError).
            after = yield call("kv_get", SCOPE, skey)
            if after is not None and after.value and G.State.load(after.value).epoch == decision.state.epoch:
                break
            self._specs.pop(name, None)
            spec = yield from self._read_spec(name)
            if spec is None:
                raise _unknown(name)
            cost = spec.tokens_per_call if tokens is None else float(tokens)
        waited = self.clock() - began
        telemetry.limit_waited(name, waited)
        return LimitDraw(name, key, cost, waited)

    def throttle(self, name: str, retry_after: float, *, key: object = None) -> None:
        """A call under limit ``name`` (bucket ``key``: None is the unkeyed bucket, not every key)
        got a 429 whose reset is ``retry_after`` seconds away: no draw of that bucket, in any
        process, starts before then, and calls already waiting for it draw again after it. An
        earlier, longer throttle stands."""
        self._run(self.throttle_plan(name, retry_after, key))

    async def athrottle(self, name: str, retry_after: float, *, key: object = None) -> None:
        """``throttle`` for async callers."""
        await self._arun(self.throttle_plan(name, retry_after, key))

    def throttle_plan(self, name: str, retry_after: float, key: object) -> _Plan:
        name, key = G.check_name(name), G.check_key(key)
        G._positive("retry_after", retry_after)
        self._require()
        spec = yield from self._read_spec(name)
        if spec is None:
            raise _unknown(name)
        skey = _state_key(name, key)
        while True:
            entry = yield call("kv_get", SCOPE, skey)
            new = G.throttled(
                G.State.found(entry.value if entry else None), self.clock(), float(retry_after)
            )
            if new is None:
                return None
            try:
                yield call(
                    "kv_write",
                    SCOPE,
                    [KvOp(skey, entry.version if entry else 0, new.dump())],
                    keep=1,
                )
            except ConflictError:
                continue
            return None

    # -- helpers -----------------------------------------------------------------------------

    def _read_spec(self, name: str) -> Generator[Call | Sleep, Any, G.LimitSpec | None]:
        cached = self._specs.get(name)
        if cached is not None and time.monotonic() - cached[1] < SPEC_TTL:
            return cached[0]
        entry = yield call("kv_get", SCOPE, _spec_key(name))
        if entry is None or entry.value is None:
            self._specs.pop(name, None)
            return None
        spec = G.LimitSpec.load(name, bytes(entry.value))
        self._specs[name] = (spec, time.monotonic())
        return spec

    def _require(self) -> None:
        require(
            self.store.backend,
            "kv",
            "rate limits (store.limits, @pk.checkpointed(limit=), pk.limited)",
        )

    def _run(self, plan: _Plan) -> Any:
        try:
            req = next(plan)
            while True:
                if isinstance(req, Sleep):
                    self.sleep(req.seconds)
                    req = plan.send(None)
                    continue
                try:
                    result = self.store.call_sync(req)
                except BaseException as exc:
                    req = plan.throw(exc)
                else:
                    req = plan.send(result)
        except StopIteration as stop:
            return stop.value

    async def _arun(self, plan: _Plan) -> Any:
        try:
            req = next(plan)
            while True:
                if isinstance(req, Sleep):
                    await self.asleep(req.seconds)
                    req = plan.send(None)
                    continue
                try:
                    result = await self.store.call_async(req)
                except BaseException as exc:
                    req = plan.throw(exc)
                else:
                    req = plan.send(result)
        except StopIteration as stop:
            return stop.value


def limits_of(store: Any) -> Limits:
    """The one ``Limits`` of ``store`` (made on first use)."""
    found: Limits | None = store.__dict__.get("_limits")
    if found is None:
        found = store.__dict__["_limits"] = Limits(store)
    return found


async def _asyncio_sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


def _info(
    spec: G.LimitSpec, key: str = "", state: G.State | None = None, now: float = 0.0
) -> LimitInfo:
    available, in_use, reserved = (
        G.usage(spec, state or G.State(), now) if state is not None else (spec.burst, 0.0, 0.0)
    )
    until = state.until if state is not None and state.until > now else None
    return LimitInfo(
        spec.name,
        spec.rate,
        spec.burst,
        spec.tokens_per_call,
        spec.timeout,
        key,
        available,
        in_use,
        int(-(-reserved // spec.tokens_per_call)),
        until,
    )


def _of(key: str) -> str:
    return f" (key {key!r})" if key else ""


def _unknown(name: str) -> LimitNotFoundError:
    return LimitNotFoundError(
        f"no rate limit named {name!r} on this store: declare it once with "
        f"store.limits.set({name!r}, rate='500/min') (or `persistkit limits --url URL` to list the limits there are)",
        limit=name,
    )
