"""A run: the replay cursor, the state it restores, and the checkpoints it commits.

Replay contract (DESIGN.md): steps are matched by position (call path +
sequence number). A recorded, completed step returns its recorded result —
and the run's state is set to the state committed with it — without running.
The first unrecorded position runs for real. A recorded failure is re-raised
when the run went on past it (the caller handled it); a failure that ended
an attempt (it escaped the block or a retried parent, or nothing was
recorded after it) runs again: that is what a retry is for.

Code between steps runs again on every attempt, so it must be deterministic
(like workflow code in Temporal): everything that talks to the world or the
clock belongs in a step.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._channels import Diff, Loader, Tracker
from ._codec import (  # without orjson every digest takes the typed path
    _dump,
    _orjson,
    content_hash,
    raw_digest,
)
from ._errors import ConflictError, LeaseLostError, NonDeterminismError, SerializationError
from ._ids import new_run_id
from ._io import Plan, call
from ._records import Record
from ._state import StateSpec, TrackedList
from .backends import CheckpointRow, Head

if TYPE_CHECKING:
    import asyncio

    from .coordination import Lease

__all__ = ["Run", "StepEvent", "StepInfo"]

#: Results whose serialized form is larger than this are stored as a blob, not in the record.
RESULT_INLINE_LIMIT = 64 * 1024
#: Lists longer than this enter an args digest by length and first and last item.
_FINGERPRINT_ITEMS = 16
_SEQUENCES = (list, tuple)  # a tuple, not `list | tuple`: that builds a union object per call


def _fingerprints(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    values = [*args, *(kwargs[k] for k in sorted(kwargs))] if kwargs else [*args]
    for i, value in enumerate(values):
        if isinstance(value, _SEQUENCES) and len(value) > _FINGERPRINT_ITEMS:
            values[i] = (type(value).__name__, len(value), value[0], value[-1])
    return values


#: Run statuses.
RUNNING, COMPLETED, FAILED = "running", "completed", "failed"


@dataclass(frozen=True, slots=True)
class StepInfo:
    """The step being executed (``pk.current_step()``).

    ``key`` is stable across retries, crashes and resumes of the same run and
    position: pass it as the idempotency key of external calls.
    """

    thread_id: str
    run_id: str
    position: str
    name: str
    attempt: int

    @property
    def key(self) -> str:
        raw = f"{self.thread_id}\x00{self.run_id}\x00{self.position}".encode()
        return "pk-" + hashlib.blake2b(raw, digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class StepEvent:
    """One step call of this run: whether it was replayed from the store or ran."""

    position: str
    name: str
    replayed: bool
    status: str


class Run:
    """One invocation on a thread. ``run.state`` is the working state; it is committed
    with every step. ``run.status`` is running, completed or failed."""

    def __init__(
        self,
        store: Any,
        thread_id: str,
        namespace: str,
        spec: StateSpec,
        metadata: dict[str, Any] | None,
    ) -> None:
        self.store = store
        self.codec = store.codec
        self.thread_id = thread_id
        self.namespace = namespace
        self.spec = spec
        self.metadata = dict(metadata or {})
        self.run_id = ""
        self.status = RUNNING
        self.state: Any = None
        self._events: list[tuple[str, str, bool, str]] = []  # StepEvent fields: made on request
        self.replay_only = False
        self._index: dict[str, Record] = {}
        self._max_child: dict[str, int] = {}
        self._escaped: set[str] = set()
        self._failures: dict[int, tuple[BaseException, str]] = {}
        self._head: Head | None = None
        self._loader = Loader(self.codec, thread_id, namespace)
        self._tracker = Tracker(self.codec)
        self._lock = threading.Lock()
        self._alocks: dict[int, asyncio.Lock] = {}
        self._schema = spec.schema  # stamped on every checkpoint (orjson writes a tuple as an array)
        self.lease: Lease | None = None  # set by resume(): every write carries its fencing token

    def __repr__(self) -> str:
        return f"<persistkit.Run thread={self.thread_id!r} run={self.run_id} status={self.status}>"

    # -- what users read -------------------------------------------------------------

    @property
    def checkpoint_id(self) -> str | None:
        """The thread's latest checkpoint as this run knows it."""
        return self._head.checkpoint_id if self._head else None

    @property
    def steps(self) -> list[StepEvent]:
        """Every step call of this run so far, in call order: replayed or run."""
        return [StepEvent(*e) for e in self._events]

    @property
    def replayed(self) -> list[StepEvent]:
        return [s for s in self.steps if s.replayed]

    @property
    def executed(self) -> list[StepEvent]:
        return [s for s in self.steps if not s.replayed]

    def update(self, **changes: Any) -> None:
        """Apply ``changes`` to ``run.state`` through each field's reducer (committed with the next checkpoint)."""
        self.spec.update(self.state, changes)

    # -- opening -------------------------------------------------------------------------

    def open(self, run_id: str | None) -> Plan[None]:
        store, t, ns = self.store, self.thread_id, self.namespace
        head: Head | None = yield call("head", t, ns)
        head_rec = (yield from store.read_record(t, ns, head.checkpoint_id)) if head else None
        rows: list[Record] = []
        if run_id is not None:
            rows = yield from self._rows_of(run_id)
            if rows:
                if rows[-1].run_status == COMPLETED:
                    self.replay_only = True
                elif head_rec is None or head_rec.row.run_id != run_id:
                    raise ConflictError(
                        f"thread {t!r}: run {run_id} ended {rows[-1].run_status} and the thread has "
                        f"moved on since (its head is checkpoint {head.checkpoint_id if head else None}"
                        f" of run {head_rec.row.run_id if head_rec else None}). Start a new run, or "
                        f"continue it on a copy: store.fork({t!r}, {rows[-1].id!r})",
                        thread_id=t,
                        namespace=ns,
                        expected=0,
                        found=head.version if head else 0,
                        found_checkpoint=head.checkpoint_id if head else None,
                    )
        elif (
            head_rec is not None
            and head_rec.kind in ("step", "end")
            and head_rec.run_status in (RUNNING, FAILED)
            and head_rec.row.run_id
        ):
            run_id = head_rec.row.run_id
            rows = yield from self._rows_of(run_id)
        self.run_id = run_id or new_run_id()
        self.status = COMPLETED if self.replay_only else RUNNING
        self._head = head

        base_id = rows[0].row.parent_id if rows else (head.checkpoint_id if head else None)
        if base_id is None:
            base_rec = None
        elif head_rec is not None and base_id == head_rec.id:
            base_rec = head_rec
        else:
            base_rec = yield from store.read_record(t, ns, base_id)
        self._loader.add([base_rec, head_rec, *rows])
        wanted = [r.refs for r in (base_rec, head_rec, *rows) if r is not None]
        big = [r.body["rb"] for r in rows if "rb" in r.body]
        if big:
            wanted.append({f"result{i}": {"b": key} for i, key in enumerate(big)})
        yield from self._loader.fetch(wanted)
        if base_rec is None:
            self.state = self.spec.empty()
        else:
            self.state = yield from store.load_state(base_rec, self.spec, self._loader)
        if head_rec is not None:
            self._tracker.reset(head_rec.refs, self._loader)
        for rec in rows:
            if rec.kind == "step":
                self._remember(rec.body["p"], rec)  # a str: Record.decode checked it
            elif rec.kind == "end":
                self._escaped.update(rec.body.get("x") or ())

    def _rows_of(self, run_id: str) -> Plan[list[Record]]:
        out: list[Record] = []
        before = None
        while True:
            page = yield call("list", self.thread_id, self.namespace, run_id=run_id, before=before, limit=500)
            out.extend(Record.decode(self.codec, row) for row in page)
            if len(page) < 500:
                break
            before = page[-1].checkpoint_id
        out.reverse()
        return out

    def _remember(self, pos: str, rec: Record) -> None:
        """``rec``, the step at ``pos``, replays in this run."""
        self._index[pos] = rec
        parent, _, seq = pos.rpartition("/")
        if seq.isdigit() and seq.isascii() and int(seq) > self._max_child.get(parent, -1):
            self._max_child[parent] = int(seq)

    # -- replay decisions (no I/O) ------------------------------------------------------

    def lookup(self, position: str, name: str) -> Record | None:
        """The record to replay at ``position``, or None to run the step for real."""
        rec = self._index.get(position)
        if rec is None:
            if self.replay_only:
                raise NonDeterminismError(
                    f"thread {self.thread_id!r} run {self.run_id}: the run completed without a step "
                    f"at position {position}, but the code now calls {name!r} there. The run is "
                    "being replayed because its run_id was reused; use a new run_id to run new code."
                )
            return None
        recorded = rec.body.get("n")
        if recorded != name:
            raise NonDeterminismError(
                f"thread {self.thread_id!r} run {self.run_id}: at step position {position} the run "
                f"recorded {recorded!r}, but the code now calls {name!r}. The code changed (or is not "
                "deterministic between steps) since the run started. Finish this run with the old "
                "code, start a new run (a new run_id), or fork the thread from a checkpoint before "
                f"the change: store.fork({self.thread_id!r}, <checkpoint_id>)"
            )
        if rec.body.get("s") == "failed":
            parent, _, seq = position.rpartition("/")
            went_on = self._max_child.get(parent, -1) > int(seq)
            if rec.id in self._escaped or not went_on:
                return None
        return rec

    def check_args(
        self, rec: Record, position: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Refuse to replay ``rec`` for a call with other arguments than it recorded.

        The digest is computed the way the recorded one was: from the JSON bytes
        for an ``x:`` digest (with no secret scan: this one is compared, never
        stored), from their redacted form for an ``r:`` digest, else from the
        typed encoding (also what persistkit before the fast digest recorded).
        """
        recorded = rec.body.get("a")
        if not recorded:
            return
        scheme = recorded[:2]
        if scheme == "x:" or scheme == "r:":
            raw = self._json_args(args, kwargs)
            if raw is None:
                return  # the arguments no longer fit the fast digest (e.g. a model class now): no basis to compare
            digest = raw_digest(raw) if scheme == "x:" else self.codec.args_digest(raw)
        else:
            digest = self._typed_digest(args, kwargs)
        if recorded != digest:
            raise NonDeterminismError(
                f"thread {self.thread_id!r} run {self.run_id}: step {name!r} at position {position} "
                "is called with different arguments than the run recorded, so its recorded result "
                "may not apply. Make the code before it deterministic, start a new run (a new "
                "run_id), or decorate the step with check_args=False if the arguments may differ"
            )

    def digest(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The digest a step called with these arguments records (see :meth:`arguments`)."""
        snap = self.arguments(args, kwargs)
        return self.codec.args_digest(snap) if isinstance(snap, bytes) else snap

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes | str:
        """What a step call's digest is made from, taken when it is called (a step may
        change its arguments in place): their JSON bytes, hashed when the step commits
        (``Codec.pack_step``), or else the finished digest of their typed encoding.

        A digest is O(1) in the size of big containers: steps are often called
        with the whole history (``call_llm(messages)``), and hashing it on every
        step would make each step cost O(state). A list or tuple longer than
        ``_FINGERPRINT_ITEMS`` counts by its length and its first and last items,
        which is what differs when code goes astray.

        Plain JSON-like arguments (what most steps take) are hashed straight from
        orjson's bytes (``x:``), or from their redacted form if they may hold a
        secret (``r:``), so that no stored digest hashes one. Other arguments
        (models, sets, big ints) take the typed encoding, at three times the cost.
        """
        raw = self._json_args(args, kwargs)
        return raw if raw is not None else self._typed_digest(args, kwargs)

    @staticmethod
    def _json_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes | None:
        """orjson's bytes of the fingerprinted arguments, or None if they are not plain JSON."""
        if _orjson is None:
            return None
        try:
            if not kwargs and len(args) == 1 and not isinstance(args[0], _SEQUENCES):
                return _orjson.dumps([args[0], []])  # the commonest call
            return _orjson.dumps([*_fingerprints(args, kwargs), sorted(kwargs)])
        except TypeError:  # not plain JSON (orjson.JSONEncodeError is a TypeError)
            return None

    def _typed_digest(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        parts: list[Any] = []
        for i, value in enumerate(_fingerprints(args, kwargs)):
            try:
                parts.append(self.codec.encode(value, f"arg {i}"))
            except SerializationError:
                parts.append({"unencodable": type(value).__qualname__})
        parts.append(sorted(kwargs))
        # Over the redacted form with kind-only handles: the digest is the same in every
        # process (per-process handle tags would break replay) and never hashes a secret.
        return hashlib.blake2b(self.codec.dump_tree(parts, stable=True), digest_size=8).hexdigest()

    def replay(self, rec: Record) -> Any:
        """Return (or raise) what ``rec`` recorded, with the state set to its checkpoint."""
        self._restore(rec)
        name, pos = str(rec.body.get("n")), str(rec.body.get("p"))
        if rec.body.get("s") == "failed":
            self._events.append((pos, name, True, "failed"))
            exc = self.codec.decode_exception(rec.body.get("e"))
            self._failures[id(exc)] = (exc, rec.id)
            raise exc
        self._events.append((pos, name, True, "completed"))
        where = f"result of step {name!r} at {pos}"
        if "rb" in rec.body:
            return self.codec.decode(self.codec.unpack_tree(self._loader.blobs[rec.body["rb"]], where), where)
        return self.codec.decode(rec.body.get("r"), where)

    def _restore(self, rec: Record) -> None:
        spec, state, loader = self.spec, self.state, self._loader
        if spec.cls is not None and rec.schema != spec.schema:
            fresh = spec.build(
                {n: loader.value(n, r) for n, r in rec.refs.items()},
                rec.schema,
                f"thread {self.thread_id!r} checkpoint {rec.id}",
            )
            values = spec.channels(fresh)
        else:
            values = None
        current = spec.channels(state)
        for name, ref in rec.refs.items():
            live = current.get(name)
            if values is None and "l" in ref and isinstance(live, TrackedList):
                self._tracker.detach(name)
                live._pk_reset(loader.list_items(name, ref))
                continue
            value = values[name] if values is not None else loader.value(name, ref)
            if isinstance(live, TrackedList) and isinstance(value, list):
                self._tracker.detach(name)
                live._pk_reset(value)
            elif isinstance(live, dict) and isinstance(value, dict) and type(live) is type(value):
                live.clear()
                live.update(value)
            else:
                spec.set_channel(state, name, value)
        if spec.cls is None:
            for name in [n for n in current if n not in rec.refs]:
                spec.del_channel(state, name)

    def mark_escaped(self, exc: BaseException) -> None:
        """Failures recorded in this run that ``exc`` carries ended an attempt: run them again next time."""
        seen: set[int] = set()
        stack: list[BaseException | None] = [exc]
        while stack:
            e = stack.pop()
            if e is None or id(e) in seen or len(seen) > 1000:
                continue
            seen.add(id(e))
            hit = self._failures.get(id(e))
            if hit is not None and hit[0] is e:
                self._escaped.add(hit[1])
            stack.extend((e.__cause__, e.__context__))
            if isinstance(e, BaseExceptionGroup):
                stack.extend(e.exceptions)

    # -- commits ---------------------------------------------------------------------------
    # A checkpoint goes straight to the backend (no plan generator in between: the
    # per-step path is the one whose microseconds matter). What to write and what
    # to remember is decided once, in _step_body/_end_body, _prepare and _landed;
    # the sync and async twins only differ in how they call the backend.

    def step_sync(
        self, position: str, name: str, digest: bytes | str | None, *, result: Any = None, error: BaseException | None = None
    ) -> None:
        """Commit the checkpoint of a step that ran (its result, or the error it raised).

        ``digest``: what :meth:`arguments` returned when the step was called, or None.
        """
        with self._lock:
            body, extra = self._step_body(position, name, digest, result, error)
            self._write_sync(body, extra, digest if type(digest) is bytes else None, error)

    async def step_async(
        self, position: str, name: str, digest: bytes | str | None, *, result: Any = None, error: BaseException | None = None
    ) -> None:
        async with self.async_lock():
            body, extra = self._step_body(position, name, digest, result, error)
            await self._write_async(body, extra, digest if type(digest) is bytes else None, error)

    def end_sync(self, error: BaseException | None) -> None:
        """Commit the run's end: completed, or failed with ``error``."""
        with self._lock:
            body = self._end_body(error)
            self._write_sync(body, {}, None, None)
            self.status = body["rs"]

    async def end_async(self, error: BaseException | None) -> None:
        async with self.async_lock():
            body = self._end_body(error)
            await self._write_async(body, {}, None, None)
            self.status = body["rs"]

    def _write_sync(
        self, body: dict[str, Any], extra: dict[str, bytes], args: bytes | None, error: BaseException | None
    ) -> None:
        row, blobs, diff = self._prepare(body, extra, args)
        lease, version = self.lease, self._head.version if self._head else 0
        try:
            if lease is None:
                head = self.store.write_sync(row, blobs, version)
            else:
                head = self.store.write_fenced_sync(row, blobs, version, lease)
        except BaseException:
            self._tracker.failed(diff)
            raise
        self._landed(row, body, diff, head, error)

    async def _write_async(
        self, body: dict[str, Any], extra: dict[str, bytes], args: bytes | None, error: BaseException | None
    ) -> None:
        row, blobs, diff = self._prepare(body, extra, args)
        lease, version = self.lease, self._head.version if self._head else 0
        try:
            if lease is None:
                head = await self.store.write_async(row, blobs, version)
            else:
                head = await self.store.write_fenced_async(row, blobs, version, lease)
        except BaseException:
            self._tracker.failed(diff)
            raise
        self._landed(row, body, diff, head, error)

    def _step_body(
        self, position: str, name: str, digest: bytes | str | None, result: Any, error: BaseException | None
    ) -> tuple[dict[str, Any], dict[str, bytes]]:
        body: dict[str, Any] = {"k": "step", "p": position, "n": name, "rs": RUNNING}
        extra: dict[str, bytes] = {}
        if digest and type(digest) is str:
            body["a"] = digest
        if error is not None:
            body["s"] = "failed"
            body["e"] = self.codec.serializer.encode_exception(error)
            return body, extra
        body["s"] = "completed"
        if result is None:
            body["r"] = None
            return body, extra
        try:
            tree = self.codec.encode(result, f"result of step {name!r}")
        except SerializationError as exc:
            raise SerializationError(
                f"step {name!r} at position {position} of thread {self.thread_id!r} ran, but "
                f"its result cannot be stored: {exc}. Return JSON-like data, pydantic models or "
                "dataclasses, or register the type with pk.register()"
            ) from exc
        # Sized unredacted: an inline result is redacted once, with the whole row.
        if len(_dump(tree)) > RESULT_INLINE_LIMIT:
            text = self.codec.dump_tree(tree)
            key = "v:" + content_hash(text)
            extra[key] = self.codec.seal(text)
            body["rb"] = key
            self._loader.blobs[key] = extra[key]
        else:
            body["r"] = tree
        return body, extra

    def _end_body(self, error: BaseException | None) -> dict[str, Any]:
        if error is not None:
            self.mark_escaped(error)
        body: dict[str, Any] = {"k": "end", "rs": FAILED if error is not None else COMPLETED}
        if error is not None:
            body["e"] = self.codec.serializer.encode_exception(error)
            body["x"] = sorted(self._escaped)
        return body

    def _prepare(
        self, body: dict[str, Any], extra: dict[str, bytes], args: bytes | None
    ) -> tuple[CheckpointRow, dict[str, bytes], Diff]:
        """The row and blobs that commit ``body`` with the state as it is now."""
        head = self._head
        if self.metadata:
            body["m"] = self.codec.encode(self.metadata, "metadata")
        where = (self.thread_id, self.namespace, head.checkpoint_id if head else None, self.run_id)
        row, diff = self._tracker.checkpoint(self.spec.channels(self.state), body, where, self._schema, args)
        return row, ({**diff.blobs, **extra} if extra else diff.blobs), diff

    def _landed(
        self, row: CheckpointRow, body: dict[str, Any], diff: Diff, head: Head, error: BaseException | None
    ) -> None:
        """``row`` is the thread's head now; a step's row is remembered for replay in this run."""
        self._head = head
        self._tracker.committed(diff)
        self._loader.rows[row.checkpoint_id] = body  # later replays in this run may read its segments
        if body["k"] != "step":
            return
        rec = Record(row, body)
        if error is not None:
            self._failures[id(error)] = (error, row.checkpoint_id)
        pos = body["p"]
        self._remember(pos, rec)
        self._events.append((pos, body["n"], False, body["s"]))

    def lease_lost(self, exc: BaseException | None) -> bool:
        """Whether this run lost its lease (it must write nothing more, not even its end)."""
        return isinstance(exc, LeaseLostError) or (self.lease is not None and self.lease.lost is not None)

    # -- locks serializing commits of concurrent steps -------------------------------------

    def async_lock(self) -> asyncio.Lock:
        import asyncio

        loop = asyncio.get_running_loop()
        lock = self._alocks.get(id(loop))
        if lock is None:
            lock = self._alocks[id(loop)] = asyncio.Lock()
        return lock
