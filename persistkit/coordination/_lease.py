"""Leases with fencing tokens: one live run per ``(thread, namespace)``, across processes.

The store keeps one small record per ``(thread, namespace)`` (``Backend.lease_get`` /
``lease_swap``: a compare-and-swap on its version) and checks a write's fencing
token against it in the same atomic operation that moves the head
(``Backend.write_fenced``). Everything else lives here, written once, without I/O:
what the record says (holder, expiry, waiters), who may take it, who waits in
which order. Plans yield ``Call`` (a backend request) or ``Sleep`` and are driven
by a blocking and an awaiting loop (the tenacity pattern, as in ``_io``).

The record's ``data`` (JSON)::

    {"o": holder or null, "e": expiry (epoch s), "p": holder's process probe,
     "q": [[waiter, expiry, probe], ...],   # waiters in arrival order ("queue")
     "u": run id or null,                   # reserved for this unfinished run (_turns)
     "r": [run id, since (epoch s)],        # since when that run is waited for (kept by rechecks)
     "x": [kind, run id or null, token]}    # a stop asked of the holder (_cancel): "cancel", "interrupt"

* The fencing token grows by one with every new holder and is never reset:
  records are never deleted (not even by ``delete_thread``).
* A holder whose expiry passed may be replaced. Expiry is judged by each
  process's wall clock: hosts sharing a store must keep their clocks within a
  small fraction of the TTL (NTP). Safety never depends on clocks: a replaced
  holder's writes are refused by the token.
* A holder or waiter on THIS machine whose process is gone (same boot, same
  PID namespace, and its PID is missing, a zombie or a newer process) is
  replaced at once instead of after its TTL: a crashed worker's message is
  taken over by its neighbour without waiting.
* Waiters (``busy="queue"``) append themselves and keep their entry fresh;
  the lease goes to the first live waiter. A waiter that died drops out when
  its entry expires (or at once, as above).
* A lease *reserved* for an unfinished run (``"u"``: the thread's newest run did
  not finish and a run of another turn found it so, see ``_turns``) is free only
  for a resume that continues that run (its ``run_id``, or none) or abandons it:
  it takes the lease ahead of the queue. Everyone else waits in their place;
  the first in line looks again at the thread every ``_RECHECK`` s in case the
  run was finished or given up some other way.
* A turn that waits for another turn's unfinished run longer than its
  ``unfinished_timeout`` gives up its place and raises ``ThreadBusyError`` with
  ``retry_after``: on a job queue, its worker slot goes back to the pool, where
  the unfinished run's redelivery needs one (it would wait behind the waiting
  turns otherwise). The first in line looks at the thread once before it goes.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .._errors import ConfigurationError, LeaseLostError, ThreadBusyError
from .._io import Plan, Sleep, call
from ..backends import LeaseRecord
from ..state._records import Record

__all__ = [
    "BUSY_POLICIES",
    "DEFAULT_BUSY",
    "DEFAULT_BUSY_TIMEOUT",
    "DEFAULT_TTL",
    "Finished",
    "Lease",
    "LeaseInfo",
    "acquire",
    "check_options",
    "check_unfinished",
    "freeing",
    "give_back",
    "holder_words",
    "info",
    "release",
    "renew",
    "step_aside",
    "unfinished_error",
]

T = TypeVar("T")

BUSY_POLICIES = ("wait", "reject", "queue", "interrupt", "rollback")


class _Default(str):
    """The default policy: equal to ``"queue"``, but ``resume`` can tell it was not asked for."""


#: ``pk.resume``'s default: wait in arrival order (two messages of one conversation run in order).
DEFAULT_BUSY: str = _Default("queue")
#: Seconds a lease lasts unless renewed; the heartbeat renews it every third of that.
DEFAULT_TTL = 30.0
#: Seconds ``wait``/``queue`` wait for the thread before ``ThreadBusyError``.
DEFAULT_BUSY_TIMEOUT = 300.0
#: A process on this machine that is gone is replaced without waiting for its TTL. Set to
#: False where hosts share a boot id and PID namespace but not processes (never seen so far).
PROBE_LOCAL_PROCESSES = True
#: A waiter's entry lives this many TTLs unless refreshed (a dead remote waiter drops out then).
_WAITER_LIFE = 2.0
#: The policies that wait in arrival order (``"interrupt"`` and ``"rollback"`` queue once they
#: asked the holder to stop: ``_STOPS``).
_QUEUES = ("queue", "interrupt", "rollback")
_STOPS = ("interrupt", "rollback")
#: Seconds between two looks of the first in line at a thread reserved for an unfinished run.
_RECHECK = 1.0
#: ``retry_after`` of a turn that gave its slot back: a quarter of how long the thread has
#: waited for the unfinished run, within these bounds (seconds), plus up to half of it as jitter.
_RETRY_MIN, _RETRY_MAX = 1.0, 60.0


# -- who we are -----------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of ``pid``, or None if there is no such process."""
    raw = _read(f"/proc/{pid}/stat")
    if not raw:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()  # after "pid (comm) ": comm may hold spaces
    return fields[0], fields[19]


_SERIAL = itertools.count(1)  # owners of one process never collide, whatever the random part
_SELF: dict[int, tuple[str, str, str, list[Any] | None]] = {}  # pid -> (host, boot, pidns, probe)


def _self() -> tuple[str, str, str, list[Any] | None]:
    """This process's host, boot id, PID namespace and probe: read once per process."""
    pid = os.getpid()
    found = _SELF.get(pid)
    if found is None:
        boot = _read("/proc/sys/kernel/random/boot_id")
        try:
            pidns = os.readlink("/proc/self/ns/pid")
        except OSError:
            pidns = ""
        started = _start_time(pid)
        probe = [boot, pidns, pid, started[1]] if boot and pidns and started else None
        import socket  # here: `import persistkit` stays free of it

        found = _SELF[pid] = (socket.gethostname(), boot, pidns, probe)
    return found


def new_owner(role: str = "") -> tuple[str, list[Any] | None]:
    """A new holder's id (host, PID and a random tag: readable in ``store.leases()``) and
    its process probe ``[boot id, PID namespace, pid, start time]`` (None off Linux).
    ``role``: a holder that is no run (``"drain"``, ``"prune"``) says so, ``drain@host:…``,
    so that whoever finds the lease held names what holds it (:func:`holder_words`)."""
    host, _, _, probe = _self()
    tag = f"{role}@" if role else ""
    return f"{tag}{host}:{os.getpid()}:{random.getrandbits(32):08x}.{next(_SERIAL)}", probe


def here() -> str:
    """``"host:pid"`` of this process, as an owner id names it (``new_owner``)."""
    return f"{_self()[0]}:{os.getpid()}"


def host_pid(owner: str) -> str:
    """The ``"host:pid"`` an owner id names (``new_owner``: ``host:pid:tag.serial``)."""
    return owner.rpartition(":")[0] or owner


#: What holds a lease, by the role its owner id starts with (``new_owner(role)``).
_ROLES = {"drain": "a drain of the outbox (store.drain_outbox)", "prune": "a prune (store.prune)"}


def holder_words(holder: str | None) -> str:
    """Who holds a lease, for a message: "a live run of HOST:PID:TAG", or the maintenance
    task its owner id names ("a drain of the outbox (store.drain_outbox) in drain@HOST…")."""
    role = holder.partition("@")[0] if holder and "@" in holder else ""
    if role in _ROLES:
        return f"{_ROLES[role]} in {holder}"
    return f"a live run of {holder or 'nobody'}"


def _gone(probe: Any) -> bool:
    """Whether ``probe`` names a process of this machine that no longer runs."""
    if not PROBE_LOCAL_PROCESSES or not isinstance(probe, list) or len(probe) != 4:
        return False
    boot, pidns, pid, started = probe
    if not boot or (boot, pidns) != _self()[1:3] or not isinstance(pid, int):
        return False
    now = _start_time(pid)
    return now is None or now[0] in ("Z", "X") or now[1] != started


# -- the record ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _State:
    owner: str | None = None
    expires: float = 0.0
    probe: list[Any] | None = None
    queue: list[list[Any]] = field(default_factory=list)
    reserved: str | None = None
    since: list[Any] | None = None  # [run id, epoch s]: since when the thread waits for that run
    stop: list[Any] | None = None  # [kind, run id or None, token]: a stop asked of a run (_cancel)

    @classmethod
    def load(cls, rec: LeaseRecord | None) -> _State:
        if rec is None:
            return cls()
        try:
            d = json.loads(rec.data)
            u, r, x = d.get("u"), d.get("r"), d.get("x")
            return cls(
                d.get("o"), float(d.get("e") or 0.0), d.get("p"), [list(w) for w in d.get("q") or ()],
                u if isinstance(u, str) else None,
                r if isinstance(r, list) and len(r) == 2 and isinstance(r[1], int | float) else None,
                x if isinstance(x, list) and len(x) == 3 else None,
            )
        except (ValueError, TypeError, AttributeError):
            return cls()  # unreadable: treat as free (the token still grows from the record's)

    def dump(self) -> bytes:
        d = {"o": self.owner, "e": self.expires, "p": self.probe, "q": self.queue}
        if self.reserved is not None:
            d["u"] = self.reserved
        if self.since is not None:
            d["r"] = self.since
        if self.stop is not None:
            d["x"] = self.stop
        return json.dumps(d).encode()

    def waited(self, now: float) -> float:
        """Seconds the thread has waited for its reserved run (0.0 if unknown)."""
        if self.since is None or self.since[0] != self.reserved:
            return 0.0
        return max(now - float(self.since[1]), 0.0)

    def held(self, now: float) -> bool:
        return self.owner is not None and self.expires > now and not _gone(self.probe)

    def prune(self, now: float) -> None:
        self.queue = [w for w in self.queue if len(w) == 3 and w[1] > now and not _gone(w[2])]


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """One thread's lease as ``store.leases()`` shows it.

    ``holder`` is None when nobody holds it (released, or expired: ``expires_at``
    in the past); ``token`` is the fencing token of the latest holder;
    ``waiting`` the waiters in arrival order; ``reserved_for`` the unfinished run the
    thread waits for (only its redelivery may take the lease), or None.
    """

    thread_id: str
    namespace: str
    holder: str | None
    token: int
    expires_at: float
    waiting: tuple[str, ...]
    reserved_for: str | None = None

    @property
    def held(self) -> bool:
        return self.holder is not None and self.expires_at > time.time()


def info(thread_id: str, namespace: str, rec: LeaseRecord) -> LeaseInfo:
    st = _State.load(rec)
    now = time.time()
    held = st.held(now)
    st.prune(now)
    return LeaseInfo(
        thread_id, namespace, st.owner if held else None, rec.token, st.expires, tuple(str(w[0]) for w in st.queue),
        st.reserved,
    )


# -- a held lease -------------------------------------------------------------------------------


class Lease:
    """The lease a run holds: its fencing token, renewed by a heartbeat until released.

    ``lost`` is set when a renewal found another holder; the next commit then
    raises it without writing (the store would refuse the write anyway).
    """

    __slots__ = (
        "__weakref__", "known", "lost", "namespace", "on_stop", "owner", "probe", "released", "thread_id", "token",
        "took_over", "ttl",
    )

    def __init__(self, thread_id: str, namespace: str, owner: str, probe: list[Any] | None, token: int, ttl: float) -> None:
        self.thread_id = thread_id
        self.namespace = namespace
        self.owner = owner
        self.probe = probe
        self.token = token
        self.ttl = ttl
        self.lost: LeaseLostError | None = None
        #: The record as this holder last swapped it in (its version and what it says): releasing
        #: swaps against it without reading first; if anyone changed it since, the swap fails and
        #: the release reads the record as before.
        self.known: tuple[int, _State] | None = None
        #: Set when the run's end record gave the lease up with it (``freeing``): nothing to release.
        self.released = False
        #: The holder this lease was taken from without being given up (its owner id, and
        #: whether its process is known to be gone), or None: what a resume records (``rz``).
        self.took_over: tuple[str, bool] | None = None
        #: Told of a stop asked of this holder (``_cancel``: the record's ``"x"``) when a renewal
        #: reads it; None when nobody listens (a holder that is no run).
        self.on_stop: Callable[[list[Any]], None] | None = None

    def __repr__(self) -> str:
        return f"<Lease {self.thread_id!r} token={self.token} owner={self.owner}>"

    def renewal(self) -> Plan[None]:
        """What the heartbeat runs every ``ttl / 3`` (``_drive``): :func:`renew`. A lease of
        another kind of record (a concurrency slot, ``_concurrency``) renews its own way."""
        return renew(self)


def check_options(busy: object, lease_ttl: object, busy_timeout: object) -> None:
    if busy is not None and busy not in BUSY_POLICIES:
        raise ConfigurationError(
            f"busy={busy!r}: use 'queue' (wait in arrival order, the default), 'wait' (wait for the "
            "thread to be free), 'reject' (raise pk.ThreadBusyError at once), 'interrupt' (ask the live "
            "run to stop at its next step, then go next), 'rollback' (the same, and the stopped turn's "
            "state changes are undone) or None (no lease)"
        )
    if isinstance(lease_ttl, bool) or not isinstance(lease_ttl, int | float) or not 0.05 <= lease_ttl <= 86400:
        raise ConfigurationError(f"lease_ttl={lease_ttl!r}: give seconds between 0.05 and 86400")
    if busy_timeout is not None and (
        # ``not >= 0`` also refuses nan, which compares false with every deadline (it would wait forever)
        isinstance(busy_timeout, bool) or not isinstance(busy_timeout, int | float) or not busy_timeout >= 0
    ):
        raise ConfigurationError(
            f"busy_timeout={busy_timeout!r}: give seconds >= 0 (float('inf') or None to wait as long as it takes)"
        )


def check_unfinished(busy: object, unfinished_timeout: object) -> None:
    """``unfinished_timeout``: None, or seconds >= 0 under a policy that waits."""
    if unfinished_timeout is None:
        return
    if isinstance(unfinished_timeout, bool) or not isinstance(unfinished_timeout, int | float) or not (
        0 <= unfinished_timeout < float("inf")  # nan and inf too: None already means "no bound"
    ):
        raise ConfigurationError(
            f"unfinished_timeout={unfinished_timeout!r}: give seconds >= 0 (how long a turn waits for another "
            "turn's unfinished run before it gives its worker slot back), or None to wait up to busy_timeout"
        )
    if busy not in ("queue", "wait", "interrupt", "rollback"):
        raise ConfigurationError(
            f"unfinished_timeout={unfinished_timeout!r} with busy={busy!r}: it bounds a wait for another turn's "
            "unfinished run, and this policy never waits (busy='reject' raises at once, busy=None takes no "
            "lease). Use busy='queue' (the default) or 'wait', or drop unfinished_timeout"
        )


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) + f" (in {max(t - time.time(), 0.0):.1f} s)"


def _busy(thread_id: str, st: _State, owner: str, why: str, now: float) -> ThreadBusyError:
    holder = st.owner
    # A waiter that gives up is in the queue itself: only the entries before its own are ahead.
    ahead = next((i for i, w in enumerate(st.queue) if w[0] == owner), len(st.queue))
    queue = f"; {ahead} run(s) queue before this one" if ahead else ""
    if st.reserved is not None and not st.held(now):
        return unfinished_error(thread_id, st.reserved, f"{queue.lstrip('; ')}. {why}" if queue else why, ahead)
    return ThreadBusyError(
        f"thread {thread_id!r} is busy: {holder_words(holder)} holds its lease until {_when(st.expires)}"
        f"{queue}. {why}",
        thread_id=thread_id,
        holder=holder,
        expires_at=st.expires,
        waiting=ahead,
    )


def unfinished_error(
    thread_id: str, run_id: str, why: str, waiting: int = 0, retry_after: float | None = None,
) -> ThreadBusyError:
    """This turn waits for ``run_id``, the thread's newest run, which did not finish."""
    return ThreadBusyError(
        f"thread {thread_id!r}: its newest run {run_id} did not finish (its process died, was "
        "interrupted or lost its lease, its block ended with a retryable error, or it is suspended: "
        "pk.suspend waits for store.answer, pk.sleep for its wake time), and turns of "
        "a thread run in arrival order: this run starts once that run is continued by its "
        f"redelivery, pk.resume({thread_id!r}, run_id={run_id!r}) (or a resume without run_id). "
        f"{why}. If it will never be redelivered, give it up: store.abandon({thread_id!r}, "
        f"{run_id!r}) or `persistkit abandon {thread_id} {run_id}` (its committed steps stay)",
        thread_id=thread_id,
        waiting=waiting,
        unfinished_run=run_id,
        retry_after=retry_after,
    )


def _gave_way(thread_id: str, st: _State, owner: str, unfinished: float, now: float) -> ThreadBusyError:
    """``unfinished_timeout`` ran out: this turn gives its place (and its worker's slot) back."""
    assert st.reserved is not None
    waited = st.waited(now)
    base = min(max(waited / 4, _RETRY_MIN), _RETRY_MAX)
    after = round(min(base * (1 + random.random() / 2), _RETRY_MAX), 1)
    ahead = next((i for i, w in enumerate(st.queue) if w[0] == owner), len(st.queue))
    return unfinished_error(
        thread_id, st.reserved,
        f"This turn waited unfinished_timeout={unfinished} s for it (the thread has waited {waited:.0f} s) and "
        f"gives its place back, so that its worker's slot is free for that run's redelivery: retry this turn "
        f"in about {after} s (err.retry_after; the run's redelivery goes first). Celery: "
        "self.retry(exc=err, countdown=err.retry_after)",
        ahead, after,
    )


def _poll(ttl: float, first: bool) -> float:
    # The next in line looks often (a release is noticed within a few ms); the others
    # only need to notice they moved up and keep their entry fresh.
    base = min(0.005 if first else 0.05, ttl / 8)
    return base * (0.5 + random.random())


# -- plans ----------------------------------------------------------------------------------------


class Finished(Exception):
    """Raised by :func:`acquire` when its ``finished`` check said True: take no lease."""


def acquire(
    thread_id: str,
    namespace: str,
    busy: str,
    ttl: float,
    timeout: float | None,
    run_id: str | None = None,
    *,
    me: tuple[str, list[Any] | None] | None = None,
    since: float | None = None,
    ahead: bool = False,
    finished: Callable[[], Plan[bool]] | None = None,
    unfinished: float | None = None,
    looked: bool = False,
) -> Plan[Lease]:
    """Take the lease of ``(thread_id, namespace)`` under policy ``busy`` for a run that
    opens ``run_id`` (None: continues the thread's unfinished run, if any). ``me`` and
    ``since`` (a ``time.monotonic()``) carry a run's owner id and its wait's start over
    :func:`step_aside` (``busy_timeout`` counts the whole wait). ``ahead``: take a free lease
    before the queue (``store.abandon``, which is no turn). ``finished``: asked once, the first
    time the lease cannot be taken at once (before waiting, queueing or refusing); when it
    says True, :class:`Finished` is raised and nothing was written (``_turns``: a redelivered
    run that finished replays without the lease). ``unfinished``: seconds to wait for a lease
    reserved for another run (another turn's unfinished run) before raising ``ThreadBusyError``
    with ``retry_after`` (``pk.resume(unfinished_timeout=)``); the first in line takes the free
    lease once to look at the thread first, unless ``looked`` (it just did: ``_turns``)."""
    owner, probe = me or new_owner()
    start = time.monotonic() if since is None else since
    deadline = None if timeout is None else start + timeout
    recheck_at = time.monotonic() + min(_RECHECK, ttl)
    queued = me is not None and busy in _QUEUES  # step_aside put us back at the front
    asked = False  # busy="interrupt" / "rollback": the stop was asked of the holder (once)
    reserved_at: float | None = None  # when this call first found the lease reserved for another run
    while True:
        rec: LeaseRecord | None = yield call("lease_get", thread_id, namespace)
        st = _State.load(rec)
        now = time.time()
        st.prune(now)
        mine = next((w for w in st.queue if w[0] == owner), None)
        first = not st.queue or st.queue[0][0] == owner
        version = rec.version if rec else 0
        free = not st.held(now)
        gave_way = False
        if st.reserved is None:
            take = free and (first or ahead)
            reserved_at = None
        elif run_id is None or run_id == st.reserved:
            take = free  # the unfinished run's own redelivery goes ahead of the turns after it
        elif unfinished is None:  # the first in line looks again now and then (was it finished some other way?)
            take = free and first and time.monotonic() >= recheck_at
        else:  # bounded: past the bound the first in line looks once (unless it just did), then goes
            reserved_at = time.monotonic() if reserved_at is None else reserved_at
            if time.monotonic() - reserved_at >= unfinished:
                take = free and first and not looked
                gave_way = not take
            else:
                take = False
        if take:
            token = (rec.token if rec else 0) + 1
            if st.reserved is None or run_id is None or run_id == st.reserved:
                st.since = None  # the run waited for is continued (a recheck keeps when it began)
            # a holder that never gave the lease up (it died, or hung past its expiry)
            dropped = (str(st.owner), _gone(st.probe)) if st.owner is not None and st.owner != owner else None
            st.owner, st.expires, st.probe, st.reserved = owner, now + ttl, probe, None
            st.queue = [w for w in st.queue if w[0] != owner]
            if st.stop is not None and st.stop[1] is None:
                st.stop = None  # a stop asked of the holder before: not of this one
            if (yield call("lease_swap", thread_id, namespace, version, token, st.dump())):
                lease = Lease(thread_id, namespace, owner, probe, token, ttl)
                lease.known = (version + 1, st)
                lease.took_over = dropped
                return lease
            continue  # the record changed under us: look again
        if finished is not None:
            ask, finished = finished, None
            if (yield from ask()):
                raise Finished(thread_id)
        if gave_way:
            if queued:
                yield from _leave_queue(thread_id, namespace, owner)
            assert unfinished is not None
            raise _gave_way(thread_id, st, owner, unfinished, now)
        if busy == "reject":
            raise _busy(
                thread_id, st, owner, 'Retry later, or resume with busy="wait" or busy="queue" to wait for it', now
            )
        if deadline is not None and time.monotonic() >= deadline:
            if queued:
                yield from _leave_queue(thread_id, namespace, owner)
            raise _busy(
                thread_id, st, owner,
                f"Waited busy_timeout={timeout} s; raise busy_timeout= in pk.resume(...) to wait longer", now,
            )
        if busy in _STOPS and not asked and st.held(now) and st.reserved is None and rec is not None:
            # ask the live run to stop at its next step (coordination/_cancel), then queue for its lease
            st.stop = [busy, None, rec.token]
            asked = bool((yield call("lease_swap", thread_id, namespace, version, rec.token, st.dump())))
            continue
        if busy in _QUEUES and (mine is None or mine[1] - now < _WAITER_LIFE * ttl - ttl / 2):
            # refreshed every ttl/2, an entry lives 2 ttl: a slow store leaves 1.5 ttl of slack
            if mine is None:
                st.queue.append([owner, now + _WAITER_LIFE * ttl, probe])
            else:
                mine[1] = now + _WAITER_LIFE * ttl
            if (yield call("lease_swap", thread_id, namespace, version, rec.token if rec else 0, st.dump())):
                queued = True
            continue
        # waiting for an unfinished run's redelivery (which may take minutes): no fast polling
        yield Sleep(_poll(ttl, first and mine is not None and st.reserved is None))


def step_aside(lease: Lease, unfinished: str, busy: str) -> Plan[None]:
    """Give the lease up, reserved for the thread's unfinished run ``unfinished``; under
    ``busy="queue"`` the run keeps its place at the front of the queue (it arrived before
    every waiter). Nothing if another holder has the lease already."""
    while True:
        rec: LeaseRecord | None = yield call("lease_get", lease.thread_id, lease.namespace)
        st = _State.load(rec)
        if rec is None or rec.token != lease.token or st.owner != lease.owner:
            return
        now = time.time()
        st.prune(now)
        st.owner, st.expires, st.probe, st.reserved = None, 0.0, None, unfinished
        if st.since is None or st.since[0] != unfinished:
            st.since = [unfinished, now]
        st.queue = [w for w in st.queue if w[0] != lease.owner]
        if busy in _QUEUES:
            st.queue.insert(0, [lease.owner, now + _WAITER_LIFE * lease.ttl, lease.probe])
        if (yield call("lease_swap", lease.thread_id, lease.namespace, rec.version, rec.token, st.dump())):
            return


def _leave_queue(thread_id: str, namespace: str, owner: str) -> Plan[None]:
    while True:
        rec: LeaseRecord | None = yield call("lease_get", thread_id, namespace)
        st = _State.load(rec)
        if rec is None or not any(w[0] == owner for w in st.queue):
            return
        st.queue = [w for w in st.queue if w[0] != owner]
        if (yield call("lease_swap", thread_id, namespace, rec.version, rec.token, st.dump())):
            return


def renew(lease: Lease) -> Plan[None]:
    """Push the lease's expiry one TTL ahead; ``LeaseLostError`` if another holder has it."""
    while True:
        rec: LeaseRecord | None = yield call("lease_get", lease.thread_id, lease.namespace)
        st = _State.load(rec)
        if rec is None or rec.token != lease.token or st.owner != lease.owner:
            raise LeaseLostError(
                thread_id=lease.thread_id, namespace=lease.namespace, token=lease.token, found=rec.token if rec else 0
            )
        if st.stop is not None and lease.on_stop is not None:
            lease.on_stop(st.stop)
        st.expires = time.time() + lease.ttl
        if (yield call("lease_swap", lease.thread_id, lease.namespace, rec.version, rec.token, st.dump())):
            lease.known = (rec.version + 1, st)
            return


def give_back(lease: Lease, top: Record) -> Plan[None]:
    """Give up a lease taken ahead of the queue by a sweep (a drain, a prune) of a thread whose
    newest record is ``top``: reserved again for the thread's unfinished run (crashed or
    suspended), as taking it cleared that, so the thread's turns keep waiting for that run."""
    run_id = top.row.run_id
    if top.kind == "step" and top.run_status in ("running", "suspended") and run_id:
        return step_aside(lease, run_id, "wait")
    return release(lease)


def release(lease: Lease) -> Plan[None]:
    """Give the lease up (the next in line takes it); nothing if another holder has it already.

    First a swap against the record as this holder last wrote it (one round trip, no
    read): it fails if anyone changed the record since (a waiter queued, a renewal
    raced it, another holder took over), and then the release reads it and goes on."""
    if lease.released:
        return
    freed = freeing(lease)
    if freed is not None:
        version, data = freed
        if (yield call("lease_swap", lease.thread_id, lease.namespace, version, lease.token, data)):
            return
    while True:
        rec: LeaseRecord | None = yield call("lease_get", lease.thread_id, lease.namespace)
        st = _State.load(rec)
        if rec is None or rec.token != lease.token or st.owner != lease.owner:
            return
        if (yield call("lease_swap", lease.thread_id, lease.namespace, rec.version, rec.token, _freed(st).dump())):
            return


def freeing(lease: Lease) -> tuple[int, bytes] | None:
    """The swap that gives ``lease`` up, if the record is as its holder last wrote it: that
    version, and the record's data with nobody holding it. None if not known. A run's end
    record carries it (``Backend.write_fenced_swap``), or ``release`` swaps it alone."""
    if lease.known is None:
        return None
    version, last = lease.known
    return version, _freed(last).dump()


def _freed(st: _State) -> _State:
    """``st`` with nobody holding the lease (its waiters stay, in their order)."""
    return dataclasses.replace(st, owner=None, expires=0.0, probe=None)
