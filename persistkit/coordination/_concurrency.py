"""Concurrency limits: at most N turns of one key (a tenant, a model) run at once, across processes.

``pk.resume(thread_id, concurrency=("tenant", tenant_id, 5))`` (or a :class:`Concurrency`)
takes one of the key's 5 *slots* after the thread's own lease and holds it until the block
ends. The slots are one lease record per key (``Backend.lease_get`` / ``lease_swap``, the
compare-and-swap every store with leases has), under the reserved thread id
``__pk_slot.<digest of name and key>``, namespace ``""``. Its data (JSON)::

    {"h": [[owner, expiry, probe, thread, namespace, token, since], ...],   # the holders (<= limit)
     "q": [[owner, expiry, probe], ...],                                     # the waiters, in arrival order
     "a": seconds a turn held a slot lately (an average: retry_after),
     "n": name, "k": key, "c": limit}                                        # for whoever reads it

* **Arrival order.** Under ``busy="queue"`` (and ``"interrupt"``/``"rollback"``, whose stop
  concerns the thread, not the slot) a turn that finds every slot taken appends itself to
  ``q`` and keeps its entry fresh; a free slot goes to the first live waiter. ``"wait"``
  takes a slot only when nobody queues; ``"reject"`` raises :class:`ConcurrencyLimitError`
  at once; ``busy_timeout`` bounds the whole wait (the thread's lease and the slot).
* **A holder that dies** stops renewing its entry (the heartbeat that renews its thread's
  lease renews it too, every ``lease_ttl / 3``): once its expiry passed, or at once when its
  process ran on this machine and is gone (``_lease._gone``), the next taker drops it.
* **Fencing.** Before dropping a holder that did not give its slot up, the taker *fences*
  it: if that holder still holds its thread's lease (the token it recorded in ``h``), the
  thread's lease record is swapped to the next token with nobody holding it. Every write of
  the dropped run carries the old token, so the store refuses it (``LeaseLostError``) in the
  same atomic operation that moves the head: a holder that was paused past its expiry
  (SIGSTOP, GC) and replaced commits nothing afterwards, and its turn stays unfinished for
  its redelivery, as after a crash. Its own heartbeat, finding its entry gone, marks the
  thread's lease lost too, so its next commit fails without a round trip. A holder that
  renews its entry after the taker decided to drop it (a renewal racing the takeover) may
  be fenced needlessly; it was past its expiry.
* The record is never deleted (lease records never are); a key nobody uses costs one row.
* Cost: taking a slot is a read and a swap of the record; giving it up one swap against the
  record as the holder last wrote it (a read first only if someone changed it since: a
  waiter queued, another holder came or went).

No I/O here but through plans (``_io``): the sync and async ``pk.resume`` drive the same ones.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._errors import ConcurrencyLimitError, ConfigurationError, LeaseLostError
from .._io import Plan, Sleep, call, run_async, run_sync
from ..backends import LeaseRecord
from ._lease import Lease, _gone, _State

__all__ = [
    "SCOPE",
    "Concurrency",
    "Slot",
    "SlotInfo",
    "check_concurrency",
    "slot_info",
    "slots",
    "take_async",
    "take_sync",
]

#: The thread-id prefix of the slot records (``store.leases(prefix=SCOPE)`` lists them).
SCOPE = "__pk_slot."
_MAX_NAME = 256
#: A waiter's entry lives this many TTLs unless refreshed (as a thread lease's waiter).
_WAITER_LIFE = 2.0
_QUEUES = ("queue", "interrupt", "rollback")
#: ``retry_after`` bounds (seconds) and the weight of the newest hold in the average.
_RETRY_MIN, _RETRY_MAX, _WEIGHT = 0.1, 60.0, 0.2


@dataclass(frozen=True, slots=True)
class Concurrency:
    """At most ``limit`` turns of ``key`` under the limit ``name`` run at once, across every
    process sharing the store: ``pk.resume(..., concurrency=pk.Concurrency("tenant", tenant_id, 5))``,
    or the tuple ``("tenant", tenant_id, 5)``."""

    name: str
    key: str
    limit: int

    @property
    def scope(self) -> str:
        """The slot record's thread id."""
        raw = f"{self.name}\x00{self.key}".encode("utf-8", "surrogatepass")
        return SCOPE + hashlib.blake2b(raw, digest_size=16).hexdigest()

    def words(self) -> str:
        return f"concurrency limit {self.name!r} key {self.key!r} ({self.limit} at once)"

    def info(self, store: Any) -> SlotInfo | None:
        """What ``store`` holds of this key now: its holders, its waiters (arrival order), the
        average hold; None if no turn of it ever took a slot. ``ainfo`` in async code."""
        info: SlotInfo | None = store.run_sync(_read(self))
        return info

    async def ainfo(self, store: Any) -> SlotInfo | None:
        info: SlotInfo | None = await store.run_async(_read(self))
        return info


def _read(spec: Concurrency) -> Plan[SlotInfo | None]:
    rec: LeaseRecord | None = yield call("lease_get", spec.scope, "")
    return slot_info(rec) if rec is not None else None


def check_concurrency(value: object, busy: object) -> Concurrency | None:
    """``pk.resume(concurrency=)``, checked: None, a :class:`Concurrency`, or ``(name, key, limit)``."""
    if value is None:
        return None
    how = (
        "pass concurrency=(name, key, limit), e.g. ('tenant', tenant_id, 5): at most `limit` turns of that "
        "key run at once across every process (or pk.Concurrency(name, key, limit))"
    )
    if isinstance(value, Concurrency):
        name, key, limit = value.name, value.key, value.limit
    elif isinstance(value, tuple) and len(value) == 3:
        name, key, limit = value
    else:
        raise ConfigurationError(f"concurrency={value!r:.120}: {how}")
    for what, text in (("name", name), ("key", key)):
        if not isinstance(text, str) or not text or "\x00" in text or len(text) > _MAX_NAME:
            raise ConfigurationError(
                f"concurrency={value!r:.120}: its {what} must be a non-empty str without NUL, at most {_MAX_NAME} "
                f"characters, got {text!r:.80}"
                + (" (str(tenant_id) for a number)" if what == "key" else "")
            )
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(
            f"concurrency={value!r:.120}: its limit must be an int >= 1 (how many turns of the key may run at "
            f"once), got {limit!r}"
        )
    if busy is None:
        raise ConfigurationError(
            f"concurrency={value!r:.120} with busy=None: a slot is fenced through the thread's lease, and "
            "busy=None takes none. Use busy='queue' (the default), 'wait' or 'reject'"
        )
    return value if isinstance(value, Concurrency) else Concurrency(name, key, limit)


# -- the record -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Slots:
    holders: list[list[Any]]
    queue: list[list[Any]]
    average: float

    @classmethod
    def load(cls, rec: LeaseRecord | None) -> _Slots:
        if rec is None:
            return cls([], [], 0.0)
        try:
            d = json.loads(rec.data)
            return cls(
                [list(h) for h in d.get("h") or () if len(h) == 7],
                [list(w) for w in d.get("q") or () if len(w) == 3],
                float(d.get("a") or 0.0),
            )
        except (ValueError, TypeError, AttributeError):
            return cls([], [], 0.0)

    def dump(self, spec: Concurrency) -> bytes:
        return json.dumps(
            {
                "h": self.holders,
                "q": self.queue,
                "a": round(self.average, 4),
                "n": spec.name,
                "k": spec.key,
                "c": spec.limit,
            }
        ).encode()

    def live(self, now: float) -> list[list[Any]]:
        return [h for h in self.holders if h[1] > now and not _gone(h[2])]

    def prune_queue(self, now: float) -> None:
        self.queue = [w for w in self.queue if w[1] > now and not _gone(w[2])]


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """One concurrency key as the store holds it: its limit, the holders' owner ids and the
    waiters' (arrival order), and how long a turn held a slot lately (seconds)."""

    name: str
    key: str
    limit: int
    holders: tuple[str, ...]
    waiting: tuple[str, ...]
    average_hold: float


def slot_info(rec: LeaseRecord) -> SlotInfo | None:
    """What a slot record says (None for a record that is not one)."""
    try:
        d = json.loads(rec.data)
        name, key, limit = str(d["n"]), str(d["k"]), int(d["c"])
    except (ValueError, TypeError, KeyError):
        return None
    st, now = _Slots.load(rec), time.time()
    st.prune_queue(now)
    return SlotInfo(
        name,
        key,
        limit,
        tuple(str(h[0]) for h in st.live(now)),
        tuple(str(w[0]) for w in st.queue),
        st.average,
    )


def slots(store: Any) -> list[SlotInfo]:
    """Every concurrency key ``store`` holds a slot record of (one turn of it took a slot), by
    name and key: ``persistkit limits`` shows them. None on a store without leases."""
    if not store.backend.supports_leases:
        return []
    found = (slot_info(rec) for _, _, rec in store.backend.lease_list(prefix=SCOPE))
    return sorted((i for i in found if i is not None), key=lambda i: (i.name, i.key))


# -- a held slot ------------------------------------------------------------------------------


class Slot(Lease):
    """A slot held by a turn: a :class:`Lease` of the key's record (so the process's heartbeat
    renews it), tied to the thread's lease it fences (``fences``)."""

    __slots__ = ("fences", "seen", "spec", "taken_at")

    def __init__(
        self, spec: Concurrency, owner: str, probe: list[Any] | None, ttl: float, fences: Lease
    ) -> None:
        super().__init__(spec.scope, "", owner, probe, fences.token, ttl)
        self.spec = spec
        self.fences = fences
        self.taken_at = time.monotonic()
        #: The record as this holder last swapped it in (version, token, what it says): giving
        #: the slot up swaps against it without reading first (a read if it changed since).
        self.seen: tuple[int, int, _Slots] | None = None

    def renewal(self) -> Plan[None]:
        return _renew(self)


def _lost(slot: Slot, found: int) -> LeaseLostError:
    lost = LeaseLostError(
        f"this turn of thread {slot.fences.thread_id!r} lost its slot of {slot.spec.words()}: its entry expired "
        "(the process stalled past lease_ttl: a pause, SIGSTOP, an overloaded host) and another turn took the "
        "slot. It writes nothing more; its run stays unfinished and its redelivery continues it",
        thread_id=slot.fences.thread_id,
        namespace=slot.fences.namespace,
        token=slot.fences.token,
        found=found,
    )
    if slot.fences.lost is None:
        slot.fences.lost = lost  # the turn's next commit raises it without a round trip
    return lost


def _renew(slot: Slot) -> Plan[None]:
    while True:
        rec: LeaseRecord | None = yield call("lease_get", slot.thread_id, "")
        st = _Slots.load(rec)
        mine = next((h for h in st.holders if h[0] == slot.owner), None)
        if slot.released:  # a renewal in flight while the block gave the slot up: not a loss
            return
        if rec is None or mine is None:
            raise _lost(slot, rec.token if rec else 0)
        mine[1] = time.time() + slot.ttl
        if (
            yield call("lease_swap", slot.thread_id, "", rec.version, rec.token, st.dump(slot.spec))
        ):
            slot.seen = (rec.version + 1, rec.token, st)
            return


def _fence(holder: list[Any]) -> Plan[None]:
    """Make sure the dropped ``holder`` commits nothing more: if it still holds its thread's
    lease (the token it took the slot with), move that lease to the next token, held by nobody."""
    owner, thread_id, namespace, token = holder[0], holder[3], holder[4], holder[5]
    while True:
        rec: LeaseRecord | None = yield call("lease_get", thread_id, namespace)
        if rec is None or rec.token != token:
            return  # another holder took the thread since: the dropped one is fenced already
        st = _State.load(rec)
        if st.owner != owner:
            return  # it gave the thread up (its block ended, or it stepped aside): nothing to fence
        st.owner, st.expires, st.probe = None, 0.0, None
        if (yield call("lease_swap", thread_id, namespace, rec.version, token + 1, st.dump())):
            return


def _retry_after(st: _Slots, spec: Concurrency, ahead: int) -> float:
    base = st.average or 1.0
    after = base * (1 + ahead // spec.limit) * (1 + random.random() / 2)
    return round(min(max(after, _RETRY_MIN), _RETRY_MAX), 2)


def _full(
    spec: Concurrency, thread_id: str, st: _Slots, owner: str, now: float, why: str
) -> ConcurrencyLimitError:
    ahead = next((i for i, w in enumerate(st.queue) if w[0] == owner), len(st.queue))
    held = len(st.live(now))
    after = _retry_after(st, spec, ahead)
    queue = f", {ahead} turn(s) queue before this one" if ahead else ""
    return ConcurrencyLimitError(
        f"thread {thread_id!r}: every slot of {spec.words()} is taken ({held} turns hold one{queue}). {why}. "
        f"Retry the turn in about {after} s (err.retry_after); it ran nothing",
        thread_id=thread_id,
        limit=spec.name,
        key=spec.key,
        capacity=spec.limit,
        holders=held,
        waiting=ahead,
        retry_after=after,
    )


def _poll(first: bool) -> float:
    return (0.005 if first else 0.05) * (0.5 + random.random())


def take(
    spec: Concurrency,
    lease: Lease,
    busy: str,
    ttl: float,
    deadline: float | None,
    timeout: float | None,
) -> Plan[Slot]:
    """Take a slot of ``spec`` for the turn holding ``lease`` (its thread's), under ``busy``;
    ``deadline`` (a ``time.monotonic()``) bounds the wait. The slot's entry records the thread
    lease's token, which a taker that drops this entry later fences (:func:`_fence`)."""
    owner, probe = lease.owner, lease.probe
    queued = False
    while True:
        rec: LeaseRecord | None = yield call("lease_get", spec.scope, "")
        st = _Slots.load(rec)
        now = time.time()
        st.prune_queue(now)
        live = st.live(now)
        mine = next((w for w in st.queue if w[0] == owner), None)
        first = not st.queue or st.queue[0][0] == owner
        allowed = first if busy in _QUEUES else not st.queue
        if len(live) < spec.limit and allowed:
            for gone in st.holders:
                if gone not in live:
                    yield from _fence(gone)
            st.holders = [
                *live,
                [owner, now + ttl, probe, lease.thread_id, lease.namespace, lease.token, now],
            ]
            st.queue = [w for w in st.queue if w[0] != owner]
            version, token = rec.version if rec else 0, (rec.token if rec else 0) + 1
            if (yield call("lease_swap", spec.scope, "", version, token, st.dump(spec))):
                slot = Slot(spec, owner, probe, ttl, lease)
                slot.seen = (version + 1, token, st)
                return slot
            continue
        if busy == "reject":
            raise _full(spec, lease.thread_id, st, owner, now, 'busy="reject" does not wait')
        if deadline is not None and time.monotonic() >= deadline:
            if queued:
                yield from _leave(spec, owner)
            raise _full(
                spec,
                lease.thread_id,
                st,
                owner,
                now,
                f"Waited busy_timeout={timeout} s; raise busy_timeout= in pk.resume(...) to wait longer",
            )
        if busy in _QUEUES and (mine is None or mine[1] - now < _WAITER_LIFE * ttl - ttl / 2):
            if mine is None:
                st.queue.append([owner, now + _WAITER_LIFE * ttl, probe])
            else:
                mine[1] = now + _WAITER_LIFE * ttl
            version = rec.version if rec else 0
            if (
                yield call(
                    "lease_swap", spec.scope, "", version, rec.token if rec else 0, st.dump(spec)
                )
            ):
                queued = True
            continue
        yield Sleep(_poll(first and mine is not None))


def _leave(spec: Concurrency, owner: str) -> Plan[None]:
    while True:
        rec: LeaseRecord | None = yield call("lease_get", spec.scope, "")
        st = _Slots.load(rec)
        if rec is None or not any(w[0] == owner for w in st.queue):
            return
        st.queue = [w for w in st.queue if w[0] != owner]
        if (yield call("lease_swap", spec.scope, "", rec.version, rec.token, st.dump(spec))):
            return


def give_up(slot: Slot) -> Plan[None]:
    """Give the slot up (the first waiter takes it); nothing if it was dropped already."""
    held = max(time.monotonic() - slot.taken_at, 0.0)
    slot.released = True  # (a renewal racing this one then stops quietly)

    def without(st: _Slots) -> _Slots:
        average = held if not st.average else (1 - _WEIGHT) * st.average + _WEIGHT * held
        return _Slots([h for h in st.holders if h[0] != slot.owner], list(st.queue), average)

    if slot.seen is not None:  # the record as this holder last wrote it: one swap, no read
        version, token, last = slot.seen
        if (
            yield call(
                "lease_swap", slot.thread_id, "", version, token, without(last).dump(slot.spec)
            )
        ):
            return
    while True:
        rec: LeaseRecord | None = yield call("lease_get", slot.thread_id, "")
        st = _Slots.load(rec)
        if rec is None or not any(h[0] == slot.owner for h in st.holders):
            return
        if (
            yield call(
                "lease_swap",
                slot.thread_id,
                "",
                rec.version,
                rec.token,
                without(st).dump(slot.spec),
            )
        ):
            return


# -- what pk.resume calls -----------------------------------------------------------------------


class Held:
    """A block's slot and its heartbeat."""

    __slots__ = ("beat", "slot")

    def __init__(self, slot: Slot, beat: Any) -> None:
        self.slot = slot
        self.beat = beat


def _needs(store: Any, spec: Concurrency, holding: Any) -> bool:
    if not store.backend.supports_leases:
        raise ConfigurationError(
            f"pk.resume(concurrency=...): {spec.words()} needs a store with leases (lease_get/lease_swap), and "
            f"{type(store.backend).__name__} has none. Use a built-in store (memory, SQLite, PostgreSQL, Redis, "
            "S3, DynamoDB), or drop concurrency="
        )
    # no lease of its own: a redelivered finished turn that replays (it runs nothing), or a
    # block nested in a block of the same thread (the enclosing block holds the slot, if any)
    return holding is not None and holding.beat is not None


def take_sync(
    store: Any,
    spec: Concurrency,
    holding: Any,
    busy: str,
    ttl: float,
    deadline: float | None,
    timeout: float | None,
) -> Held | None:
    if not _needs(store, spec, holding):
        return None
    assert holding is not None
    began = time.monotonic()
    try:
        slot = run_sync(store.backend, take(spec, holding.lease, busy, ttl, deadline, timeout))
    except ConcurrencyLimitError:
        _measured(spec, None)
        raise
    _measured(spec, time.monotonic() - began)
    # (imported here: `import persistkit` stays free of asyncio, and pk.Concurrency is this module)
    from ._drive import Heartbeat

    return Held(slot, Heartbeat(store.backend, slot))


async def take_async(
    store: Any,
    spec: Concurrency,
    holding: Any,
    busy: str,
    ttl: float,
    deadline: float | None,
    timeout: float | None,
) -> Held | None:
    if not _needs(store, spec, holding):
        return None
    assert holding is not None
    began = time.monotonic()
    try:
        slot = await run_async(store.backend, take(spec, holding.lease, busy, ttl, deadline, timeout))
    except ConcurrencyLimitError:
        _measured(spec, None)
        raise
    _measured(spec, time.monotonic() - began)
    from ._drive import AsyncHeartbeat

    return Held(slot, AsyncHeartbeat(store.backend, slot))


#: Told of each turn's wait for a slot (seconds) or refusal (None), by the limit's name:
#: ops/_telemetry installs its metrics here when it is imported (it sits above this floor).
on_wait: Callable[[str, float | None], None] | None = None


def _measured(spec: Concurrency, waited: float | None) -> None:
    if on_wait is not None:
        on_wait(spec.name, waited)


def let_go_sync(store: Any, held: Held | None) -> None:
    if held is None:
        return
    held.beat.stop()
    if held.slot.lost is None and not store._closed:
        try:
            run_sync(store.backend, give_up(held.slot))
        except Exception as exc:  # never hide the block's own outcome: the entry expires by itself
            _unreleased(held.slot, exc)


async def let_go_async(store: Any, held: Held | None) -> None:
    if held is None:
        return
    await held.beat.stop()
    if held.slot.lost is None and not store._closed:
        try:
            await run_async(store.backend, give_up(held.slot))
        except Exception as exc:
            _unreleased(held.slot, exc)


def _unreleased(slot: Slot, exc: Exception) -> None:
    import logging

    logging.getLogger("persistkit.coordination").warning(
        "persistkit: could not give up the slot of %s (%s); it expires in %s s by itself",
        slot.spec.words(),
        exc,
        slot.ttl,
    )
