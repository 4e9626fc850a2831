"""What one checkpoint row's payload holds, and the public view of it.

The payload is a JSON object (sealed by the codec), with short keys because
it is written on every step:

====  =====================================================================
``k``  kind: ``step`` (a step finished), ``end`` (a run ended), ``fork``
       (first checkpoint of a forked thread), ``update`` (state edited
       outside a run)
``p``  step position (call path, e.g. ``"2/0"``) — steps only
``n``  step name — steps only
``s``  step status: ``completed``, ``failed`` or ``suspended`` (a ``pk.suspend`` /
       ``pk.sleep`` record waiting for its answer or wake time) — steps only
``rs`` run status after this checkpoint: running / completed / failed / suspended /
       compensating (rolling back) / compensated (rolled back: the run's end)
``sc`` ``[schema name, version]`` of the state, or null for dict state
``t``  creation time (seconds since the epoch)
``m``  user metadata (encoded tree)
``ch`` channel refs (see ``_channels``)
``r``  recorded result (encoded tree), or ``rb``: blob key of a large one
``e``  recorded error (encoded exception tree)
``a``  digest of the step's arguments
``u``  1 on a failed step that ran but whose result or state could not be
       stored: it replays its error on every resume, never runs again
``ru`` 1 on a failed step whose error leaves the run unfinished when it escapes the
       block (``pk.RetryableError``, ``NonDeterminismError``...: no end record lists
       it): it runs again while nothing is recorded after it (``engine/_cursor``)
``x``  end records: checkpoint ids of failures that ended the attempt
``f``  fork records: ``[source thread, source checkpoint]``
``q``  ``pk.suspend`` / ``pk.sleep`` records: the question (an object; a list of them
       for ``pk.suspend_all``): ``i`` id, ``v`` payload, ``d`` deadline or wake time,
       ``df`` default answer, ``ty`` answer type, ``w`` 1 for a timer, ``a`` the answer
       given so far (``coordination/_suspend.py``)
``cp`` compensations a completed step registered (sagas, ``coordination/_saga``): a
       list of ``{"f": "module:qualname", "a": args tree, "kw": kwargs tree, "rt": retry
       policy, "at": attempt}``, or ``{"f": ..., "rr": 1}``: called with the step's result
``cb`` the rollback mark (step ``pk.rollback`` at position ``c``): the plan,
       ``[[position, index in its cp], ...]``; compensation ``i`` is the step at ``c/i``
``ce`` the rollback mark: the failure that started the rollback (encoded exception)
``pt`` patch ids this run reached live (``pk.patched``), attached to the run's
       next checkpoint of any kind (``engine/_patches``)
``ac`` step records: after-commit effects the step registered, in order, each
       ``{"f": "module:qualname", "a": arguments tree, "rt": retry}`` (``rt``
       optional); effect ``i``'s id is ``<checkpoint id>.<i>`` (coordination/_outbox)
``ad`` any record: ids of effects run since the run's previous checkpoint (done marks)
``dm`` 1 on a done mark: a copy of the run's newest record (no ``ac``/``sg``/``rz``) written to
       carry ``ad`` right after the effects ran, or by ``store.drain_outbox``; replay
       keeps the record it copies
``st`` 1 on the record after a run's first ``pk.emit`` in a block (``Run._attach``): the run
       wrote a durable stream, so a continued run reads its streams (``streams/_writer.opened``)
``rz`` the resume mark, on the first record a block writes after it continued an unfinished
       run (the run's newest record said ``running`` or ``compensating``: its process died,
       was interrupted, or its block ended with a ``pk.RetryableError``): ``t`` when the block
       opened, ``h`` ``"host:pid"`` of the process that resumed, ``n`` the recorded steps it
       replays, ``c`` the run's newest checkpoint as it found it, ``w`` the lease holder it took
       over (``"host:pid"``: a holder that never gave the lease up) and ``g`` 1 when that
       process was seen gone. It rides on a record the block writes anyway (``Run._attach``):
       no write of its own, not a step (replay never looks at it), an unknown key to an older
       reader; a block that writes nothing before it stops leaves none (``ops/_timeline``)
====  =====================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .._errors import (
    ConfigurationError,
    SerializationError,
    StoreOptionsError,
    damaged_record_advice,
)
from .._io import Plan, call
from ..backends import CheckpointRow
from ..codec._pipeline import Codec

__all__ = ["Checkpoint", "Record", "ResumeInfo", "fork_key", "fork_link_blob", "fork_links", "read_rows", "run_pruned", "targets", "tombstone_key"]

KINDS = frozenset({"step", "end", "fork", "update"})


@dataclass(slots=True)
class Record:
    """A decoded checkpoint row (internal)."""

    row: CheckpointRow
    body: dict[str, Any]
    #: The body as this process committed it (live values: secrets not yet handles, text
    #: that looks like a handle not escaped), not as read back: decode its trees with
    #: ``codec.decode(..., live=rec.live)``.
    live: bool = False

    @property
    def id(self) -> str:
        return self.row.checkpoint_id

    @property
    def kind(self) -> str:
        return str(self.body["k"])

    @property
    def refs(self) -> dict[str, dict[str, Any]]:
        refs: dict[str, dict[str, Any]] = self.body.get("ch") or {}
        return refs

    @property
    def schema(self) -> tuple[str, int] | None:
        sc = self.body.get("sc")
        return (str(sc[0]), int(sc[1])) if sc else None

    @property
    def run_status(self) -> str | None:
        rs = self.body.get("rs")
        return None if rs is None else str(rs)

    @classmethod
    def decode(cls, codec: Codec, row: CheckpointRow, *, walked: bool = False) -> Record:
        """``walked``: a row read only for its list segments and result (a chain walk reads
        thousands): only those fields are checked, the others are never read."""
        # A resume decodes every row of the run: the error's path is made only on error.
        try:
            body = codec.unpack_tree(row.payload, "")
        except StoreOptionsError as exc:  # the record is fine: the store needs its options, not a fork
            raise StoreOptionsError(str(exc), path=_where(row), option=exc.option) from exc
        except SerializationError as exc:
            raise SerializationError(f"{exc}. {_damaged(row)}", path=_where(row)) from exc
        problem = _check_walked(body) if walked else _check_body(body)
        if problem:
            raise SerializationError(
                f"not a valid persistkit checkpoint record ({problem}). {_damaged(row)}", path=_where(row)
            )
        return cls(row, body)

    def public(self, codec: Codec) -> Checkpoint:
        b = self.body
        err = b.get("e")
        error = None
        if isinstance(err, dict):
            # {"__pk__": "ex", "c": "module:Class", "v": {"str": message, ...}} (see _serde)
            cls, v = err.get("c"), err.get("v")
            name = cls.partition(":")[2] or cls if isinstance(cls, str) else "Exception"
            text = v.get("str") if isinstance(v, dict) else None
            error = f"{name}: {text if isinstance(text, str) else ''}".replace("$CRED{$}", "$CRED{")
        f = b.get("f")
        meta = b.get("m")
        return Checkpoint(
            thread_id=self.row.thread_id,
            namespace=self.row.namespace,
            checkpoint_id=self.row.checkpoint_id,
            parent_id=self.row.parent_id,
            run_id=self.row.run_id,
            kind="mark" if b.get("dm") else self.kind,  # an outbox done mark: a copy, not a step
            step=b.get("n"),
            position=b.get("p"),
            status=b.get("s"),
            run_status=self.run_status,
            schema=self.schema,
            created_at=_created(b.get("t", 0.0), self.row),
            metadata=codec.decode(meta, "metadata", reveal=False) if meta else {},
            error=error,
            forked_from=(str(f[0]), str(f[1])) if f else None,
            channels=tuple(sorted(self.refs)),
            resumed=ResumeInfo.of(b.get("rz"), self.row),
        )


def _damaged(row: CheckpointRow) -> str:
    # Under integrity= a damaged record fails its tag before it is decoded, so one that
    # reaches here undecodable was damaged where nothing checked it.
    return damaged_record_advice(row.thread_id, row.namespace, row.parent_id, None, integrity=False)


def _is_str(v: Any) -> bool:
    return type(v) is str


def _ref_ok(ref: Any) -> bool:
    """A channel ref: ``{"i": tree}``, ``{"b": key}`` or ``{"l": tip, "n": length, "g": generation}``."""
    if type(ref) is not dict:
        return False
    if "i" in ref:
        return len(ref) == 1
    if "b" in ref:
        return len(ref) == 1 and _is_str(ref["b"])
    return (
        len(ref) == 3
        and "l" in ref
        and (ref["l"] is None or _is_str(ref["l"]))
        and type(ref.get("n")) is int
        and ref["n"] >= 0
        and type(ref.get("g")) is int
    )


# Shape of each payload key (see the module docstring); stored bytes are
# untrusted, so every field is checked once here rather than at each use.
# The string fields, ``rs`` and ``t`` are tested inline in _check_body (a
# resume checks every row of the run); ``k`` and ``r`` take any value there.
_STRINGS = frozenset({"p", "n", "a", "rb"})
_FIELDS: dict[str, Any] = {
    "s": lambda v: v in ("completed", "failed", "suspended"),
    "sc": lambda v: v is None or (type(v) is list and len(v) == 2 and _is_str(v[0]) and type(v[1]) is int),
    "ch": lambda v: type(v) is dict and all(map(_ref_ok, v.values())),
    "e": lambda v: type(v) is dict,
    "x": lambda v: type(v) is list and all(_is_str(i) for i in v),
    "f": lambda v: type(v) is list and len(v) == 2 and all(_is_str(i) for i in v),
    "sg": lambda v: type(v) is dict and all(type(g) is dict for g in v.values()),
    "q": lambda v: _question_ok(v) or (type(v) is list and len(v) > 0 and all(map(_question_ok, v))),
    "cp": lambda v: type(v) is list and all(type(c) is dict and _is_str(c.get("f")) for c in v),
    "cb": lambda v: type(v) is list
    and all(type(i) is list and len(i) == 2 and _is_str(i[0]) and type(i[1]) is int for i in v),
    "ce": lambda v: type(v) is dict,
    "pt": lambda v: type(v) is list and all(_is_str(i) for i in v),
    "ac": lambda v: type(v) is list and all(type(e) is dict and _is_str(e.get("f")) and "a" in e for e in v),
    "ad": lambda v: type(v) is list and all(_is_str(i) for i in v),
    "dm": lambda v: v == 1,
    "ru": lambda v: v == 1,
    "rz": lambda v: type(v) is dict and _is_str(v.get("h")) and type(v.get("n")) is int
    and (type(v.get("t")) is float or type(v.get("t")) is int),
}


def _question_ok(q: Any) -> bool:
    """One question of a suspend record (``q``): an id, and a number for a deadline."""
    d = q.get("d") if type(q) is dict else None
    return type(q) is dict and _is_str(q.get("i")) and (d is None or type(d) is float or type(d) is int)


def _check_walked(body: Any) -> str | None:
    """What is wrong with the fields a chain walk reads of a payload (kind, segments, result)."""
    if type(body) is not dict:
        return "not an object"
    kind = body.get("k")
    if type(kind) is not str or kind not in KINDS:
        return "unknown kind"
    if "sg" in body and type(body["sg"]) is not dict:  # each segment: checked where it is read
        return "field 'sg' is malformed"
    if "rb" in body and type(body["rb"]) is not str:
        return "field 'rb' is malformed"
    return None


def _check_body(body: Any) -> str | None:
    """What is wrong with a decoded payload, or None if its shape is right."""
    if type(body) is not dict:
        return "not an object"
    kind = body.get("k")
    if type(kind) is not str or kind not in KINDS:  # an unhashable kind must not raise TypeError
        return "unknown kind"
    for key, value in body.items():  # the keys present (~8), not all 13 known ones
        if key in _STRINGS:
            ok = type(value) is str
        elif key == "rs":
            ok = value is None or type(value) is str
        elif key == "t":
            ok = type(value) is float or type(value) is int
        elif key == "r" or key == "k":
            continue
        else:
            check = _FIELDS.get(key)
            ok = check is None or check(value)
        if not ok:
            return f"field {key!r} is malformed"
    if kind == "step" and not ("p" in body and "n" in body and "s" in body):
        return "a step record without position, name or status"
    return None


def read_rows(codec: Codec, thread_id: str, namespace: str, run_id: str | None = None) -> Plan[list[Record]]:
    """Every record of ``(thread_id, namespace)`` — only ``run_id``'s when given — decoded,
    oldest first, read newest first in pages of 500 (the run a resume continues; what a
    drain or the replay check looks through)."""
    out: list[Record] = []
    before = None
    while True:
        page = yield call("list", thread_id, namespace, run_id=run_id, before=before, limit=500)
        out.extend(Record.decode(codec, row) for row in page)
        if len(page) < 500:
            break
        before = page[-1].checkpoint_id
    out.reverse()
    return out


#: Blob keys of pruned runs' tombstones (``tombstone_key``); ``~`` keys are persistkit's own.
TOMBSTONE = "~pr:"


def tombstone_key(namespace: str, run_id: str) -> str:
    """The blob retention writes when it deletes every record of run ``run_id`` (status
    only): a redelivery of that run finds it and runs nothing (``RunPrunedError``)."""
    return f"{TOMBSTONE}{namespace.encode().hex()}:{run_id}"


def run_pruned(codec: Codec, thread_id: str, namespace: str, run_id: str) -> Plan[str | None]:
    """The status a run had when retention deleted all its records, or None (never pruned)."""
    key = tombstone_key(namespace, run_id)
    got = yield call("get_blobs", thread_id, [key])
    if key not in got:
        return None
    tree = codec.unpack_tree(got[key], f"tombstone {key}")
    status = tree.get("rs") if type(tree) is dict else None
    return status if type(status) is str else "finished"


#: Blob keys of fork links (``fork_key``).
FORK_LINK = "~fk:"


def fork_key(namespace: str) -> str:
    """The blob of a forked thread that names its source (``{"f": [thread, checkpoint]}``),
    written with the fork record. The link is the thread's, not that record's: a prune of
    the fork may delete its first record, while its source must stay as long as the fork
    exists (a blob goes with its thread, and retention never sweeps ``~`` keys)."""
    return f"{FORK_LINK}{namespace.encode().hex()}"


def fork_link_blob(codec: Codec, source: tuple[str, str]) -> bytes:
    return codec.pack_stored({"f": [source[0], source[1]]})


def fork_links(codec: Codec, thread_id: str, namespaces: list[str]) -> Plan[dict[str, tuple[str, str]]]:
    """namespace -> (source thread, source checkpoint) of the chains of ``thread_id`` that
    were forked and carry the link on the thread (a fork written before links were kept
    so has it on its first record only, body ``f``)."""
    keys = {fork_key(ns): ns for ns in namespaces}
    got: dict[str, bytes] = (yield call("get_blobs", thread_id, list(keys))) if keys else {}
    out: dict[str, tuple[str, str]] = {}
    for key, blob in got.items():
        if key not in keys:
            continue
        tree = codec.unpack_tree(blob, f"fork link {key} of thread {thread_id!r}")
        f = tree.get("f") if type(tree) is dict else None
        if not (isinstance(f, list) and len(f) == 2 and all(type(x) is str for x in f)):
            raise SerializationError(
                f"holds {f!r}, not [source thread, source checkpoint]", path=f"fork link {key} of thread {thread_id!r}"
            )
        out[keys[key]] = (f[0], f[1])
    return out


def targets(thread_id: str | None, prefix: str, namespace: str | None) -> Plan[list[tuple[str, str]]]:
    """The ``(thread, namespace)`` chains a sweep over the store looks at: the one
    ``thread_id`` or every thread starting with ``prefix`` (in pages), each in ``namespace``
    or in every namespace it has (a third-party store without ``namespaces()``: the
    default one). What a drain and a prune walk."""
    if thread_id is not None:
        threads = [thread_id]
    else:
        threads, after = [], None
        while True:
            page = yield call("threads", prefix=prefix, after=after, limit=500)
            threads.extend(page)
            if len(page) < 500:
                break
            after = page[-1]
    out: list[tuple[str, str]] = []
    for t in threads:
        if namespace is not None:
            out.append((t, namespace))
            continue
        try:
            spaces: list[str] = yield call("namespaces", t)
        except ConfigurationError:  # a store without namespaces(): the default one
            spaces = [""]
        out.extend((t, ns) for ns in spaces)
    return out


def _where(row: CheckpointRow) -> str:
    return f"checkpoint {row.checkpoint_id} of thread {row.thread_id!r}"


def _created(t: Any, row: CheckpointRow) -> datetime:
    try:
        return datetime.fromtimestamp(float(t), UTC)
    except (ValueError, OverflowError, OSError) as exc:
        raise SerializationError(
            f"creation time {t!r} is out of range", path=f"checkpoint {row.checkpoint_id} of thread {row.thread_id!r}"
        ) from exc


@dataclass(frozen=True, slots=True)
class ResumeInfo:
    """A block that continued an unfinished run (``Checkpoint.resumed``): its process had
    died, been interrupted, or its block ended with a ``pk.RetryableError``.

    ``host`` is ``"host:pid"`` of the process that resumed, ``at`` when its block opened,
    ``replayed`` how many recorded steps it replays, ``after`` the run's newest checkpoint as
    it found it; ``took_over`` is ``"host:pid"`` of the lease holder it took the thread from
    (one that never gave its lease up: it died or hung), or None, and ``holder_gone`` says
    that process was seen gone (same machine) rather than its lease expired.
    """

    host: str
    at: datetime
    replayed: int
    after: str | None = None
    took_over: str | None = None
    holder_gone: bool = False

    @classmethod
    def of(cls, rz: Any, row: CheckpointRow) -> ResumeInfo | None:
        """The resume mark ``rz`` of a record (checked by ``Record.decode``), or None."""
        if not isinstance(rz, dict):
            return None
        after, took = rz.get("c"), rz.get("w")
        return cls(
            host=str(rz["h"]),
            at=_created(rz["t"], row),
            replayed=int(rz["n"]),
            after=after if isinstance(after, str) else None,
            took_over=took if isinstance(took, str) else None,
            holder_gone=rz.get("g") == 1,
        )


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One entry of a thread's history (``store.history(...)``).

    ``kind`` is ``step`` (a step finished: ``step``, ``position``, ``status``
    say which and how), ``end`` (a run ended with ``run_status``), ``fork``
    (the first checkpoint of a forked thread; ``forked_from`` names the source)
    or ``update`` (state edited with ``store.update_state``), or ``mark``: the done mark of
    after-commit effects (``pk.after_commit``), a copy of the run's record before it (same
    step, status and state) written as the effects ran. ``resumed`` is set on the first
    checkpoint a block wrote after it continued an unfinished run (a crash, an interrupt, a
    ``pk.RetryableError``): who resumed it, when, and how many steps it replayed.
    """

    thread_id: str
    namespace: str
    checkpoint_id: str
    parent_id: str | None
    run_id: str | None
    kind: str
    step: str | None
    position: str | None
    status: str | None
    run_status: str | None
    schema: tuple[str, int] | None
    created_at: datetime
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    forked_from: tuple[str, str] | None = None
    channels: tuple[str, ...] = ()
    resumed: ResumeInfo | None = None
