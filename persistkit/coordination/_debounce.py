"""Debounce: the messages of one thread that arrive close together become one turn.

``pk.resume(thread_id, run_id=event_id, busy="debounce", debounce=(window, max_wait),
message=text)``. Every arriving turn first **sends** its message into the thread's inbox
(``_inbox.send_plan``, topic :data:`TOPIC`, idempotency key = its ``run_id``: a redelivered
event is stored once). Then, in the inbox scope, next to the topic's counter and cursor, one
key ``<h>/d`` says which turn is gathering the burst (sealed JSON)::

    {"r": leader run id, "o": its thread-lease owner, "k": its lease token,
     "s": opened at, "l": last arrival, "open": 1,            # gathering
     "v": [run, first seq, last seq, position] or absent}     # a batch claimed and maybe never recorded
    {"r": run id, "a": first seq, "b": last seq, "p": position, "open": 0}   # the batch it took

* **A follower** (:func:`join`): a turn that finds a live leader gathering (its lease token is
  the thread's current one, held) moves ``l`` to now (compare-and-swap on ``<h>/d``) and
  raises :class:`Debounced` at once: its message is the leader's. A turn whose message was
  taken already (the cursor is past it) raises :class:`Debounced` too.
* **The leader**: any other turn. It takes the thread's lease (in arrival order, as
  ``busy="queue"``), opens ``<h>/d`` (:func:`lead`) and waits until no message arrived for
  ``window`` seconds, or ``max_wait`` seconds after it opened. Then, at its block's first
  step position, it **takes the batch** (:func:`take_batch`): one atomic ``kv_write`` moves
  the cursor to the newest message, writes a claim naming the run and the position (the
  range of messages) and closes ``<h>/d`` (compare-and-swap: a follower that joined
  meanwhile makes it look again and take that message too; one that comes after finds it
  closed and leads the next turn). The run records the batch as the step ``pk.debounce`` at
  that position: ``run.messages``, in the order the sends committed.
* **A turn without a message** (``message=None``: an answer continuing a suspended turn, a
  retry) sends nothing and gathers nothing: a run that recorded its batch replays it; a new
  run takes whatever messages wait (possibly none).
* **Exactly once across a leader's death.** Killed while gathering: its lease expires (at
  once on this machine), nothing was taken; the next arrival, or its redelivery, leads and
  takes every message not taken yet (its followers' included). Killed after recording the
  batch: its run is unfinished, the thread's next turns wait for its redelivery, which
  replays the batch. Killed between the claim and the record: its redelivery finds its
  claim and takes the same batch; if another turn leads first, it *adopts* that batch (the
  claimed run has no record, and it cannot be live: the new leader holds the thread's
  lease), rewriting the claim to ``x:<its run id>`` in the same write that takes its own,
  so the batch runs once, before the newer messages, and the redelivery finds it adopted
  (:class:`Debounced`).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError, ConflictError, LeaseLostError
from .._io import Plan, Sleep, call
from ..backends import LeaseRecord
from ..backends._protocol import KvEntry, KvOp
from . import _inbox as I
from ._lease import Lease, _State

if TYPE_CHECKING:
    from ..codec._pipeline import Codec

__all__ = [
    "STEP",
    "TOPIC",
    "Debounced",
    "check_debounce",
    "join",
    "lead",
    "send",
    "take_batch",
    "taken",
]

#: The inbox topic of debounced messages (``store.messages(thread_id, topic=TOPIC)`` lists them).
TOPIC = "pk.debounce"
#: The step name of the batch a leader records.
STEP = "pk.debounce"
_POLL = 0.05


class Debounced(Exception):  # an outcome, not an error: the turn's message is in another turn
    """This turn's message was merged into another turn of the thread (``busy="debounce"``):
    nothing to run here; ack the event. Raised by ``pk.resume`` when the block is entered, so
    the block does not run. ``leader`` is the run id of the turn that takes (or took) the
    message, when known; ``seq`` the message's number in the thread's debounce inbox."""

    def __init__(
        self,
        message: str,
        *,
        thread_id: str = "",
        run_id: str = "",
        seq: int = 0,
        leader: str | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.seq = seq
        self.leader = leader
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (str(self), self.thread_id, self.run_id, self.seq, self.leader))


def _rebuild(message: str, thread_id: str, run_id: str, seq: int, leader: str | None) -> Debounced:
    return Debounced(message, thread_id=thread_id, run_id=run_id, seq=seq, leader=leader)


def check_debounce(
    busy: object, debounce: object, message: object, run_id: object
) -> tuple[float, float] | None:
    """``pk.resume``'s ``debounce=`` (with ``busy="debounce"``), checked: (window, max_wait)."""
    if busy != "debounce":
        if debounce is not None or message is not None:
            raise ConfigurationError(
                f"debounce= and message= belong to busy='debounce' (got busy={busy!r}): pass busy='debounce', "
                "debounce=(window, max_wait) and the turn's message=, or drop them"
            )
        return None
    how = (
        "pass debounce=(window, max_wait) in seconds, e.g. (2.0, 10.0): a turn waits until no message of the "
        "thread arrived for `window` seconds, at most `max_wait` seconds, then runs them all"
    )
    if not isinstance(debounce, tuple) or len(debounce) != 2:
        raise ConfigurationError(
            f"busy='debounce' needs debounce=(window, max_wait), got {debounce!r:.80}: {how}"
        )
    window, most = debounce
    for what, v in (("window", window), ("max_wait", most)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < float("inf"):
            raise ConfigurationError(
                f"debounce={debounce!r}: {what} must be seconds > 0, got {v!r}; {how}"
            )
    if most < window:
        raise ConfigurationError(
            f"debounce={debounce!r}: max_wait ({most}) must be >= window ({window}); {how}"
        )
    if run_id is None:
        raise ConfigurationError(
            "busy='debounce' needs run_id= (the event's id): it is the message's idempotency key, so a "
            "redelivered event is merged once, and it names the turn that runs the batch"
        )
    return float(window), float(most)


def _where(thread_id: str, namespace: str) -> str:
    ns = f" (namespace {namespace!r})" if namespace else ""
    return f"thread {thread_id!r}{ns}"


def _load(codec: Codec, entry: KvEntry | None, where: str) -> dict[str, Any] | None:
    if entry is None or entry.value is None:
        return None
    try:
        d = json.loads(codec.open(entry.value, f"debounce record of {where}"))
    except ValueError:
        return None
    return d if isinstance(d, dict) else None


def _seal(codec: Codec, d: dict[str, Any]) -> bytes:
    return codec.seal(json.dumps(d).encode())


def _cursor_seq(codec: Codec, entry: KvEntry | None, where: str) -> int:
    return I._cursor(codec, entry, where)[0]


def _claimed(entry: KvEntry | None) -> tuple[int, int] | str | None:
    """A batch claim: (first, last) seq, the run that adopted it (str), or None."""
    if entry is None or entry.value is None:
        return None
    raw = entry.value.decode()
    if raw.startswith("x:"):
        return raw[2:]
    first, _, last = raw.partition("-")
    return int(first), int(last)


def _merged(thread_id: str, run_id: str, seq: int, leader: str | None, how: str) -> Debounced:
    by = f"turn {leader!r}" if leader else "an earlier turn"
    return Debounced(
        f"thread {thread_id!r}: the message of turn {run_id!r} (#{seq}) {how} {by} (busy='debounce'): "
        "nothing runs here; ack the event",
        thread_id=thread_id,
        run_id=run_id,
        seq=seq,
        leader=leader,
    )


def send(codec: Codec, thread_id: str, namespace: str, run_id: str, message: Any) -> Plan[int]:
    """Append the turn's message (key: its run id, so a redelivery stores nothing); its number."""
    return I.send_plan(codec, thread_id, namespace, TOPIC, message, run_id)


def _leader_of(d: dict[str, Any] | None, seq: int) -> str | None:
    if (
        d is not None
        and not d.get("open")
        and isinstance(d.get("a"), int)
        and d["a"] <= seq <= d.get("b", -1)
    ):
        return str(d.get("r"))
    return None


def _alive(d: dict[str, Any], rec: LeaseRecord | None) -> bool:
    """Whether the leader that opened ``d`` still holds the thread's lease."""
    if rec is None or rec.token != d.get("k"):
        return False
    st = _State.load(rec)
    return st.owner == d.get("o") and st.held(time.time())


def taken(
    codec: Codec, thread_id: str, namespace: str, run_id: str, seq: int, position: str
) -> Plan[bool]:
    """Whether message ``seq`` was taken already; raises :class:`Debounced` when another turn
    took it (False: not taken; True: this run's own claim took it, its batch is to be replayed)."""
    h, box, where = (
        I.prefix(namespace, thread_id, TOPIC),
        I.inbox_scope(thread_id),
        _where(thread_id, namespace),
    )
    cur: KvEntry | None = yield call("kv_get", box, f"{h}/c")
    if seq > _cursor_seq(codec, cur, where):
        return False
    claim = _claimed((yield call("kv_get", box, I._claim_key(h, run_id, position))))
    if isinstance(claim, tuple):
        return True
    if isinstance(claim, str):
        raise _merged(thread_id, run_id, seq, claim, "is in the batch (adopted) of")
    d = _load(codec, (yield call("kv_get", box, f"{h}/d")), where)
    raise _merged(thread_id, run_id, seq, _leader_of(d, seq), "was taken by")


def join(
    codec: Codec, thread_id: str, namespace: str, run_id: str, seq: int, position: str
) -> Plan[None]:
    """Before the lease: join a live leader's burst (:class:`Debounced`) or return to lead."""
    h, box, where = (
        I.prefix(namespace, thread_id, TOPIC),
        I.inbox_scope(thread_id),
        _where(thread_id, namespace),
    )
    while True:
        if (yield from taken(codec, thread_id, namespace, run_id, seq, position)):
            return  # this run's own batch, claimed before a crash: lead (replay it)
        entry: KvEntry | None = yield call("kv_get", box, f"{h}/d")
        d = _load(codec, entry, where)
        if d is None or not d.get("open") or d.get("r") == run_id:
            return
        rec: LeaseRecord | None = yield call("lease_get", thread_id, namespace)
        if not _alive(d, rec):
            return  # its leader died gathering: lead (the batch takes its messages too)
        assert entry is not None
        d["l"] = max(time.time(), float(d.get("l") or 0.0))
        try:
            yield call("kv_write", box, [KvOp(f"{h}/d", entry.version, _seal(codec, d))], keep=1)
        except ConflictError:
            continue  # it closed (or another follower joined): look again
        raise _merged(thread_id, run_id, seq, str(d.get("r")), "joins the burst gathered by")


def lead(
    codec: Codec,
    thread_id: str,
    namespace: str,
    run_id: str,
    seq: int,
    position: str,
    lease: Lease,
    window: float,
    most: float,
) -> Plan[None]:
    """Under the thread's lease: open the burst and wait until it went quiet (``window``) or
    ``most`` seconds passed. :class:`Debounced` when a turn before took the message."""
    h, box, where = (
        I.prefix(namespace, thread_id, TOPIC),
        I.inbox_scope(thread_id),
        _where(thread_id, namespace),
    )
    if (yield from taken(codec, thread_id, namespace, run_id, seq, position)):
        return
    while True:
        entry: KvEntry | None = yield call("kv_get", box, f"{h}/d")
        old = _load(codec, entry, where) or {}
        now = time.time()
        d: dict[str, Any] = {
            "r": run_id,
            "o": lease.owner,
            "k": lease.token,
            "s": now,
            "l": now,
            "open": 1,
        }
        if old.get("open") and old.get("v"):
            d["v"] = old["v"]  # a claimed batch nobody recorded yet: still to adopt
        elif not old.get("open") and old.get("r") not in (None, run_id) and "a" in old:
            d["v"] = [old["r"], old["a"], old["b"], old["p"]]
        try:
            yield call(
                "kv_write",
                box,
                [KvOp(f"{h}/d", entry.version if entry else 0, _seal(codec, d))],
                keep=1,
            )
        except ConflictError:
            continue
        break
    while True:
        if lease.lost is not None:
            raise lease.lost
        mine = _load(codec, (yield call("kv_get", box, f"{h}/d")), where)
        if mine is None or mine.get("r") != run_id or mine.get("k") != lease.token:
            raise LeaseLostError(
                f"{where}: turn {run_id!r} gathered a burst under busy='debounce' and another turn took the "
                "thread over (its lease expired): it runs nothing; its redelivery goes on",
                thread_id=thread_id,
                namespace=namespace,
                token=lease.token,
            )
        now = time.time()
        left = min(window - (now - float(mine["l"])), most - (now - float(mine["s"])))
        if left <= 0:
            return
        yield Sleep(min(left, _POLL))


def _no_record(thread_id: str, namespace: str, run_id: str) -> Plan[bool]:
    page = yield call("list", thread_id, namespace, run_id=run_id, limit=1)
    return not page


def take_batch(
    codec: Codec, thread_id: str, namespace: str, run_id: str, position: str
) -> Plan[list[Any]]:
    """Claim every message not taken yet (and a batch to adopt, see the module's doc) for the
    run ``run_id`` at ``position``, closing the burst; their values in order. A claim this run
    and position made before (a crash before it was recorded) returns the same batch."""
    h, box, where = (
        I.prefix(namespace, thread_id, TOPIC),
        I.inbox_scope(thread_id),
        _where(thread_id, namespace),
    )
    mark = I._claim_key(h, run_id, position)
    while True:
        mine: KvEntry | None = yield call("kv_get", box, mark)
        claim = _claimed(mine)
        if isinstance(claim, str):
            raise _merged(thread_id, run_id, 0, claim, "is in the batch (adopted) of")
        if claim is not None:
            return (yield from _values(codec, box, h, claim[0], claim[1], where))
        cur: KvEntry | None = yield call("kv_get", box, f"{h}/c")
        count: KvEntry | None = yield call("kv_get", box, f"{h}/n")
        entry: KvEntry | None = yield call("kv_get", box, f"{h}/d")
        taken, last = _cursor_seq(codec, cur, where), count.version if count is not None else 0
        d = _load(codec, entry, where) or {}
        first, ops = taken + 1, []
        adopt = d.get("v") if d.get("r") == run_id else None
        if isinstance(adopt, list) and len(adopt) == 4:
            prev, a, _, p = adopt
            other: KvEntry | None = yield call("kv_get", box, I._claim_key(h, str(prev), str(p)))
            if isinstance(_claimed(other), tuple) and (
                yield from _no_record(thread_id, namespace, str(prev))
            ):
                assert other is not None
                first = int(a)
                ops.append(KvOp(other.key, other.version, f"x:{run_id}".encode()))
        cursor = codec.seal(
            json.dumps({"s": max(last, taken), "r": run_id, "p": position}).encode()
        )
        closed = {"r": run_id, "a": first, "b": last, "p": position, "open": 0}
        ops += [
            KvOp(f"{h}/c", cur.version if cur else 0, cursor),
            KvOp(mark, mine.version if mine else 0, b"%d-%d" % (first, last)),
            KvOp(f"{h}/d", entry.version if entry else 0, _seal(codec, closed)),
        ]
        try:
            yield call("kv_write", box, ops, keep=1)
        except ConflictError:
            continue  # a follower joined, or a send moved on: look again
        return (yield from _values(codec, box, h, first, last, where))


def _values(codec: Codec, box: str, h: str, first: int, last: int, where: str) -> Plan[list[Any]]:
    if last < first:
        return []
    page: list[KvEntry] = yield call(
        "kv_list", box, prefix=f"{h}/m/", after=I._seq_key(h, first - 1), limit=last - first + 1
    )
    return [I._value(codec, e, f"{where} topic {TOPIC!r}") for e in page if e.value is not None]
