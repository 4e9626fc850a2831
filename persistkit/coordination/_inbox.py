"""Messages into a run and events out of it, kept in the store's kv space (no I/O here: plans).

``store.send(thread, message, topic=, key=)`` appends a message to the thread's inbox of
``topic``; ``pk.receive(topic)`` inside a run of the thread takes the next one
(``_receive.py``). ``pk.set_event(key, value)`` inside a run publishes a value that
``store.get_event(thread, key)`` reads from anywhere. Both live in the store's kv space, in
two scopes per thread: :func:`inbox_scope` (``__pk_i.<d>``) and :func:`events_scope`
(``__pk_e.<d>``), ``d`` a digest of the thread id (a board of such a name would share
them: do not name a board so). Every namespace of the thread shares its two scopes, so
``store.delete_thread`` (every namespace) drops both whole (:func:`drop_plan`), whatever
namespaces were sent to, and a thread re-created under the same id starts with an empty
inbox and no events. In the inbox scope, one group of keys per ``(namespace, topic)``,
under ``h``, a digest of ``(namespace, thread, topic)`` (any text fits a key that way)::

    <h>/n              the counter: its version is the number of messages sent
    <h>/m/<seq:012d>   message ``seq`` (1, 2, ...): an envelope {"v": tree, "t": sent at, "k": key}
    <h>/k/<key>        an idempotency key: the seq its message got (sent twice, stored once)
    <h>/c              the receive cursor: {"s": seq taken last, "r": run id, "p": position}
    <h>/r/<d>          a claim: the seq that the receive of one run at one position took
                       (``d``: a digest of the run id and the position)

In the events scope, ``<e>/<key>`` per event, ``e`` a digest of ``(namespace, thread)``:
an envelope {"v": tree, "t": set at, "r": run id, "p": position}, the newest value wins.

A send writes the counter, the message and the idempotency key in ONE atomic ``kv_write``
(compare-and-swap on each: a concurrent send retries with the next number), so messages
are numbered in the order their sends committed and a key names exactly one message.

A receive *claims* the next message: one atomic ``kv_write`` moves the cursor
(compare-and-swap) to its number and writes a claim key for the run and the position that
took it; then the run records the message as the step result at that position. A crash
between the two leaves the claim: the resumed run, at the same position, finds it and takes
the same message again (:func:`take` looks at its claim first), never a second one there.
Two receivers of one thread and topic (two runs without a lease) never get the same
message: the cursor's compare-and-swap lets one of them move it. Messages are deleted only with the thread: the
inbox is the record of what was sent (``store.messages`` lists it); a message nobody
received stays for the thread's next ``pk.receive`` of its topic, in a later turn too.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError, ConflictError, SerializationError
from .._io import Plan, Sleep, call
from ..backends._protocol import KvEntry, KvOp

if TYPE_CHECKING:
    from ..codec._pipeline import Codec

__all__ = [
    "Message",
    "check_topic",
    "drop_plan",
    "event_plan",
    "events_scope",
    "get_event_plan",
    "inbox_scope",
    "messages_plan",
    "peek",
    "send_plan",
    "take",
    "wait_plan",
]

#: The prefixes of a thread's two kv scopes: 7 characters + a 32-digit digest, within the
#: kv layer's 64 of ``[A-Za-z0-9_.-]`` (backends/_protocol.py).
_INBOX = "__pk_i."
_EVENTS = "__pk_e."

#: The longest poll between two looks for a message (or an event) a waiter makes.
_POLL_MAX = 0.025
_POLL_MIN = 0.002

_MAX_NAME = 256


class _Missing:
    def __repr__(self) -> str:
        return "<no message>"


#: What :func:`take` returns while there is no message to take.
NOTHING: Any = _Missing()


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a thread's inbox (``store.messages()``): its number in its topic (1, 2,
    ...), when it was sent, its idempotency key, and whether a receive took it already."""

    thread_id: str
    namespace: str
    topic: str
    seq: int
    value: Any
    sent_at: datetime
    key: str | None
    received: bool


def check_topic(topic: object, what: str = "topic") -> str:
    if not isinstance(topic, str) or "\x00" in topic or len(topic) > _MAX_NAME:
        raise ConfigurationError(f"{what} must be a str without NUL, at most {_MAX_NAME} characters, got {topic!r:.80}")
    return topic


def check_key(key: object, what: str = "key") -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not key or "\x00" in key or len(key) > _MAX_NAME:
        raise ConfigurationError(
            f"{what} must be None or a non-empty str without NUL, at most {_MAX_NAME} characters "
            f"(an idempotency key: the Slack event id, the webhook's delivery id), got {key!r:.80}"
        )
    return key


def _digest(*parts: str) -> str:
    return hashlib.blake2b("\x00".join(parts).encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def inbox_scope(thread_id: str) -> str:
    """The kv scope of ``thread_id``'s messages, every namespace and topic of it."""
    return _INBOX + _digest(thread_id)


def events_scope(thread_id: str) -> str:
    """The kv scope of ``thread_id``'s events, every namespace of it."""
    return _EVENTS + _digest(thread_id)


def prefix(namespace: str, thread_id: str, topic: str) -> str:
    return _digest(namespace, thread_id, topic)


def _seq_key(h: str, seq: int) -> str:
    return f"{h}/m/{seq:012d}"


def _where(thread_id: str, namespace: str, topic: str) -> str:
    ns = f" (namespace {namespace!r})" if namespace else ""
    return f"thread {thread_id!r}{ns} topic {topic!r}"


# -- sending --------------------------------------------------------------------------------


def send_plan(codec: Codec, thread_id: str, namespace: str, topic: str, message: Any, key: str | None) -> Plan[int]:
    """Append ``message``; its number in the topic. With ``key``: a key sent before returns
    the number its message got and stores nothing (sent twice, received once)."""
    h = prefix(namespace, thread_id, topic)
    box = inbox_scope(thread_id)
    where = _where(thread_id, namespace, topic)
    tree = codec.encode(message, f"message to {where}")
    data = codec.pack_tree({"v": tree, "t": time.time(), "k": key})
    attempt = 0
    while True:
        if key is not None:
            seen: KvEntry | None = yield call("kv_get", box, f"{h}/k/{key}")
            if seen is not None and seen.value is not None:
                return int(seen.value)
        count: KvEntry | None = yield call("kv_get", box, f"{h}/n")
        n = count.version if count is not None else 0
        ops = [KvOp(f"{h}/n", n, b"%d" % (n + 1)), KvOp(_seq_key(h, n + 1), 0, data)]
        if key is not None:
            ops.append(KvOp(f"{h}/k/{key}", 0, b"%d" % (n + 1)))
        try:
            yield call("kv_write", box, ops, keep=1)
        except ConflictError:  # another send took the number (or the key) first: look again
            attempt += 1
            yield Sleep(min(_POLL_MIN * 2**attempt, _POLL_MAX))
            continue
        return n + 1


# -- receiving ------------------------------------------------------------------------------


def _cursor(codec: Codec, entry: KvEntry | None, where: str) -> tuple[int, str | None, str | None]:
    if entry is None or entry.value is None:
        return 0, None, None
    try:
        c = json.loads(codec.open(entry.value, f"receive cursor of {where}"))
        return int(c["s"]), c.get("r"), c.get("p")
    except (ValueError, TypeError, KeyError) as exc:
        raise SerializationError(f"the receive cursor of {where} is not one persistkit wrote: {exc}") from exc


def _value(codec: Codec, entry: KvEntry, where: str) -> Any:
    assert entry.value is not None
    env = codec.unpack_tree(entry.value, f"message {entry.key} of {where}")
    if type(env) is not dict or "v" not in env:
        raise SerializationError(f"message {entry.key} of {where} is not one store.send() wrote")
    return codec.decode(env["v"], f"message {entry.key} of {where}")


def _claim_key(h: str, run_id: str, position: str) -> str:
    return f"{h}/r/{_digest(run_id, position)}"


def take(
    codec: Codec, thread_id: str, namespace: str, topic: str, run_id: str, position: str
) -> Plan[Any]:
    """Claim the next message of the topic for the receive of ``run_id`` at ``position`` and
    return its value (:data:`NOTHING` when there is none yet). If that run and position
    claimed one already (then crashed before recording it), the same message again."""
    h = prefix(namespace, thread_id, topic)
    box = inbox_scope(thread_id)
    where = _where(thread_id, namespace, topic)
    mark = _claim_key(h, run_id, position)
    while True:
        claimed: KvEntry | None = yield call("kv_get", box, mark)
        if claimed is not None and claimed.value is not None:
            seq = int(claimed.value)
            mine: KvEntry | None = yield call("kv_get", box, _seq_key(h, seq))
            if mine is None or mine.value is None:
                raise SerializationError(f"message {seq} of {where}, claimed by run {run_id} at {position}, is gone")
            return _value(codec, mine, where)
        entry: KvEntry | None = yield call("kv_get", box, f"{h}/c")
        seq = _cursor(codec, entry, where)[0]
        nxt: KvEntry | None = yield call("kv_get", box, _seq_key(h, seq + 1))
        if nxt is None or nxt.value is None:
            return NOTHING
        cursor = codec.seal(json.dumps({"s": seq + 1, "r": run_id, "p": position}).encode())
        ops = [KvOp(f"{h}/c", entry.version if entry else 0, cursor), KvOp(mark, 0, b"%d" % (seq + 1))]
        try:
            yield call("kv_write", box, ops, keep=1)
        except ConflictError:
            continue  # another receiver moved the cursor first: look again
        return _value(codec, nxt, where)


def wait_plan(
    codec: Codec, thread_id: str, namespace: str, topic: str, run_id: str, position: str, until: float
) -> Plan[Any]:
    """:func:`take`, polled (a few ms at first, then up to ``_POLL_MAX`` s apart) until
    ``until`` (epoch s); :data:`NOTHING` if no message came by then."""
    h = prefix(namespace, thread_id, topic)
    box = inbox_scope(thread_id)
    delay = _POLL_MIN
    while True:
        got = yield from take(codec, thread_id, namespace, topic, run_id, position)
        if got is not NOTHING:
            return got
        entry: KvEntry | None = yield call("kv_get", box, f"{h}/c")
        seq = _cursor(codec, entry, _where(thread_id, namespace, topic))[0]
        while True:  # only the next message's key, until it is there
            left = until - time.time()
            if left <= 0:
                return NOTHING
            yield Sleep(min(delay, left))
            delay = min(delay * 1.5, _POLL_MAX)
            nxt: KvEntry | None = yield call("kv_get", box, _seq_key(h, seq + 1))
            if nxt is not None and nxt.value is not None:
                break


def peek(codec: Codec, thread_id: str, namespace: str, topic: str, run_id: str, position: str) -> Plan[bool]:
    """Whether the receive of ``run_id`` at ``position`` would get a message now (``store.due``)."""
    h = prefix(namespace, thread_id, topic)
    box = inbox_scope(thread_id)
    claimed: KvEntry | None = yield call("kv_get", box, _claim_key(h, run_id, position))
    if claimed is not None and claimed.value is not None:
        return True
    entry: KvEntry | None = yield call("kv_get", box, f"{h}/c")
    seq = _cursor(codec, entry, _where(thread_id, namespace, topic))[0]
    nxt: KvEntry | None = yield call("kv_get", box, _seq_key(h, seq + 1))
    return nxt is not None and nxt.value is not None


def messages_plan(codec: Codec, thread_id: str, namespace: str, topic: str, limit: int | None) -> Plan[list[Message]]:
    """The topic's messages in order, the received ones included (``store.messages``)."""
    h = prefix(namespace, thread_id, topic)
    box = inbox_scope(thread_id)
    where = _where(thread_id, namespace, topic)
    entry: KvEntry | None = yield call("kv_get", box, f"{h}/c")
    taken = _cursor(codec, entry, where)[0]
    page: list[KvEntry] = yield call("kv_list", box, prefix=f"{h}/m/", limit=limit)
    out = []
    for e in page:
        if e.value is None:
            continue
        env = codec.unpack_tree(e.value, f"message {e.key} of {where}")
        seq = int(e.key.rpartition("/")[2])
        out.append(Message(
            thread_id, namespace, topic, seq, codec.decode(env["v"], f"message {seq} of {where}"),
            datetime.fromtimestamp(float(env.get("t") or 0.0), UTC), env.get("k"), seq <= taken,
        ))
    return out


# -- events ---------------------------------------------------------------------------------


def _event_key(namespace: str, thread_id: str, key: str) -> str:
    return f"{_digest(namespace, thread_id)}/{key}"


def event_plan(codec: Codec, thread_id: str, namespace: str, key: str, value: Any, run_id: str, position: str) -> Plan[int]:
    """Publish ``value`` as event ``key`` of the thread (the newest value wins); its version."""
    k = _event_key(namespace, thread_id, key)
    box = events_scope(thread_id)
    tree = codec.encode(value, f"event {key!r} of thread {thread_id!r}")
    data = codec.pack_tree({"v": tree, "t": time.time(), "r": run_id, "p": position})
    while True:
        found: KvEntry | None = yield call("kv_get", box, k)
        version = found.version if found is not None else 0
        try:
            yield call("kv_write", box, [KvOp(k, version, data)], keep=1)
        except ConflictError:
            continue
        return version + 1


def get_event_plan(codec: Codec, thread_id: str, namespace: str, key: str, wait: float, default: Any) -> Plan[Any]:
    """Event ``key``'s newest value, waiting up to ``wait`` s for one to be set; ``default`` if none."""
    k = _event_key(namespace, thread_id, key)
    box = events_scope(thread_id)
    until = time.time() + wait
    delay = _POLL_MIN
    while True:
        found: KvEntry | None = yield call("kv_get", box, k)
        if found is not None and found.value is not None:
            where = f"event {key!r} of thread {thread_id!r}"
            env = codec.unpack_tree(found.value, where)
            return codec.decode(env["v"], where)
        left = until - time.time()
        if left <= 0:
            return default
        yield Sleep(min(delay, left))
        delay = min(delay * 1.5, _POLL_MAX)


# -- deleting -------------------------------------------------------------------------------


def drop_plan(thread_id: str) -> Plan[bool]:
    """Drop ``thread_id``'s inbox, events and child links, every namespace and topic (what
    ``store.delete_thread`` does to them); whether there was any. A send that commits
    after the drop starts a new inbox (message 1), as one to a new thread would."""
    inbox: bool = yield call("kv_drop", inbox_scope(thread_id))
    events: bool = yield call("kv_drop", events_scope(thread_id))
    children: bool = yield call("kv_drop", "__pk_c." + _digest(thread_id))  # its child links (_children)
    return inbox or events or children
