"""A run: the replay cursor, the state it restores, and the checkpoints it commits.

Replay contract (DESIGN.md): steps are matched by position (call path +
sequence number). A recorded, completed step returns its recorded result —
and the run's state is set to the state committed with it — without running.
The first unrecorded position runs for real. A recorded failure is re-raised
when the run went on past it (the caller handled it); a failure that ended
an attempt (it escaped the block or a retried parent, or nothing was
recorded after it) runs again: that is what a retry is for — except a step
that ran but whose result or state could not be stored (flag ``u``): it
replays its error, since its side effects happened, unless the run was
opened with ``retry_failed=True`` (the cause is fixed: it runs as any failure).

Code between steps runs again on every attempt, so it must be deterministic
(like workflow code in Temporal): everything that talks to the world or the
clock belongs in a step.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _args
from ._channels import Diff, Loader, Tracker
from ._codec import _dump, content_hash
from ._dedupe import Result, result
from ._errors import (
    ConflictError,
    LeaseLostError,
    NonDeterminismError,
    PersistkitError,
    SchemaVersionError,
    SecretResolutionError,
    SerializationError,
)
from ._ids import new_run_id
from ._io import Plan, call
from ._records import Record
from ._state import StateSpec, TrackedList
from ._versions import migrations_ran
from .backends import CheckpointRow, Head
from .coordination._fenced import write_fenced_swap_async, write_fenced_swap_sync
from .coordination._lease import freeing
from .coordination._unfinished import ABANDONED, abandoned_error, check_turn

if TYPE_CHECKING:
    import asyncio

    from .coordination import Lease

__all__ = ["Run", "StepEvent", "StepInfo"]

#: Results whose serialized form is larger than this are stored as a blob, not in the record.
RESULT_INLINE_LIMIT = 64 * 1024
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
        self.retry_failed = False  # resume(retry_failed=True): an unstorable step (flag "u") runs again
        self._moved_on: tuple[str, Head | None, str | None] | None = None  # see open()
        self._lost: ConflictError | None = None  # what a commit of this run raised on a moved head
        self._index: dict[str, Record] = {}
        self._max_child: dict[str, int] = {}
        self._escaped: set[str] = set()
        self._failures: dict[int, tuple[BaseException, str]] = {}
        #: Set when a recorded state could not be loaded (migration, schema): the run writes nothing more.
        self.load_error: PersistkitError | None = None
        #: Set once this run replayed a value older code stored in another shape (a state or
        #: class migration ran): arguments built from it cannot match the recorded digests.
        self.migrated = False
        self._head: Head | None = None
        self._loader = Loader(self.codec, thread_id, namespace)
        self._tracker = Tracker(self.codec)
        self._lock = threading.Lock()
        self._alocks: dict[int, asyncio.Lock] = {}
        self._schema = spec.schema  # stamped on every checkpoint (orjson writes a tuple as an array)
        self._result: Result | None = None  # the head's result, which a list item may refer to
        self._result_raw: bytes | None = None  # the JSON bytes of the result being committed
        self._result_tree: Any = None  # and its tree (the row holds it inline, or a blob its redacted bytes)
        self.lease: Lease | None = None  # set by resume(): every write carries its fencing token
        #: Set by resume() when the block owns its lease: the end record gives it up with it.
        self.release_at_end = False
        #: Set by resume() when this run holds its own lease: open() raises Unfinished (and
        #: resume waits) rather than start on top of another turn's unfinished run.
        self.keeps_turns = False

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
        found: tuple[Head, CheckpointRow] | None = yield call("head_row", t, ns)
        head, head_rec = (found[0], Record.decode(self.codec, found[1])) if found else (None, None)
        rows: list[Record] = []
        if run_id is not None:
            rows = yield from self._rows_of(run_id)
            if rows:
                if rows[-1].run_status == ABANDONED:
                    raise abandoned_error(self.thread_id, run_id, rows[-1])
                if rows[-1].run_status == COMPLETED:
                    self.replay_only = True
                elif head_rec is None or head_rec.row.run_id != run_id:
                    # Another run built on this one's checkpoints (or its end record was
                    # skipped, see _conflict): replay what it recorded, run nothing.
                    self.replay_only = True
                    self._moved_on = (rows[-1].id, head, head_rec.row.run_id if head_rec else None)
            elif self.keeps_turns and head_rec is not None:
                check_turn(head_rec, run_id)  # another turn's run is unfinished: wait for it (coordination)
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
        self._check_rows(base_rec, rows)
        if head_rec is not None:
            # Lists of a head written under another schema version are written anew by the
            # first checkpoint of this code: a chain never mixes items of two versions.
            migrated = self.spec.cls is not None and head_rec.schema != self.spec.schema
            self.migrated = self.migrated or migrated
            self._tracker.reset(head_rec.refs, self._loader, new_lists=migrated)
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
            if self._moved_on is not None:
                raise self._unfinished(position, name, "was never recorded")
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
        # "u": it ran but could not be stored; replay it unless the user asked to retry it
        if rec.body.get("s") == "failed" and (self.retry_failed or not rec.body.get("u")):
            parent, _, seq = position.rpartition("/")
            went_on = self._max_child.get(parent, -1) > int(seq)
            if rec.id in self._escaped or not went_on:
                if self._moved_on is not None:
                    raise self._unfinished(position, name, "failed, and its failure ended the attempt")
                return None
        return rec

    def check_args(
        self, rec: Record, position: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Refuse to replay ``rec`` for a call with other arguments than it recorded."""
        recorded = rec.body.get("a")
        # After a migration in this run, older code recorded the digest of arguments made from
        # values in their old shape (a step's result handed to the next step, a state field)
        # and this code hands them migrated: nothing to compare them with, replay as recorded.
        if recorded and not self.migrated and not _args.matches(self.codec, recorded, args, kwargs):
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
        """What a step call's digest is made from (``_args``: O(1) in big containers, and
        never a hash of a secret)."""
        return _args.arguments(self.codec, args, kwargs)

    def _typed_digest(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return _args.typed_digest(self.codec, args, kwargs)

    def replay(self, rec: Record) -> Any:
        """Return (or raise) what ``rec`` recorded, with the state set to its checkpoint."""
        ran = migrations_ran()
        try:
            self._restore(rec)
        except PersistkitError as error:  # e.g. a failed migration: this run must write nothing
            self.load_error = error
            raise
        name, pos = str(rec.body.get("n")), str(rec.body.get("p"))
        failed = rec.body.get("s") == "failed"
        at = f"thread {self.thread_id!r} run {self.run_id}, step {name!r} at {pos}: recorded {'error' if failed else 'result'}"
        try:
            if failed:
                recorded = self.codec.decode_exception(rec.body.get("e"), at)
            elif "rb" in rec.body:
                value = self.codec.decode(self.codec.unpack_tree(self._loader.blobs[rec.body["rb"]], at), at)
            else:
                value = self.codec.decode(rec.body.get("r"), at)
        except SchemaVersionError as error:  # a recorded value's class changed shape: write nothing
            self.load_error = error
            raise
        except SecretResolutionError as exc:  # never hand a handle's text to the caller as the value
            raise SecretResolutionError(
                f"{at} is a secret stored as a handle, and it cannot be given back: {exc}", handle=exc.handle
            ) from exc
        if migrations_ran() != ran:
            self.migrated = True
        self._events.append((pos, name, True, "failed" if failed else "completed"))
        if failed:
            self._failures[id(recorded)] = (recorded, rec.id)
            raise recorded
        return value

    def _restore(self, rec: Record) -> None:
        """Set ``run.state`` (in place) to the state committed with ``rec``, migrated to the
        code's schema version and checked like every load (field names and list items of
        the run's records were checked when it opened: :meth:`_check_rows`)."""
        spec, state, loader = self.spec, self.state, self._loader
        schema = rec.schema
        current = spec.channels(state)
        if spec.cls is not None and schema != spec.schema:
            fresh = spec.build({n: loader.value(n, r, True) for n, r in rec.refs.items()}, schema, self._where(rec))
            for name, migrated in spec.channels(fresh).items():  # every field: a migration may add some
                self._set(current, name, migrated)
            return
        typed = spec.cls is not None
        for name, ref in rec.refs.items():
            live = current.get(name)
            if "l" in ref:
                if isinstance(live, TrackedList):
                    self._tracker.detach(name)
                    live._pk_reset(loader.list_items(name, ref))
                    continue
                value: Any = TrackedList(loader.list_items(name, ref))
            else:
                value = loader.value(name, ref)
                if typed:
                    value = spec.check_value(name, value, schema, lambda: self._where(rec))
            self._set(current, name, value)
        if spec.cls is None:
            for name in [n for n in current if n not in rec.refs]:
                spec.del_channel(state, name)

    def _where(self, rec: Record) -> str:
        return f"thread {self.thread_id!r} checkpoint {rec.id} (step {rec.body.get('n')!r} at {rec.body.get('p')})"

    def _set(self, current: dict[str, Any], name: str, value: Any) -> None:
        """Set one channel of the live state, keeping the identity of its list or dict."""
        live = current.get(name)
        if isinstance(live, TrackedList) and isinstance(value, list):
            self._tracker.detach(name)
            live._pk_reset(value)
        elif isinstance(live, dict) and isinstance(value, dict) and type(live) is type(value):
            live.clear()
            live.update(value)
        else:
            self.spec.set_channel(self.state, name, value)

    def _check_rows(self, base: Record | None, rows: list[Record]) -> None:
        """Refuse, before anything runs, records of this run at the code's schema version
        that hold a field the class does not declare or list items that do not validate.

        Each list chain (channel, generation) only grows by appending, so its items are
        validated once, in one call, from where the base state (validated whole) ends."""
        spec = self.spec
        if spec.cls is None:
            return
        done: dict[tuple[str, int], int] = {}
        if base is not None and base.schema == spec.schema:
            done = {(n, r["g"]): r["n"] for n, r in base.refs.items() if "l" in r}
        longest: dict[tuple[str, int], tuple[Record, dict[str, Any]]] = {}
        fields, code_schema = spec.field_set, spec.schema
        for rec in rows:
            refs = rec.refs
            if rec.schema != code_schema:
                continue  # migrated and validated whole when replayed
            if not fields.issuperset(refs):
                spec.check_names(refs, code_schema, self._where(rec))
            for name, ref in refs.items():
                if "l" in ref:
                    best = longest.get((name, ref["g"]))
                    if best is None or ref["n"] > best[1]["n"]:
                        longest[(name, ref["g"])] = (rec, ref)
        for (name, gen), (rec, ref) in longest.items():
            if ref["n"] > done.get((name, gen), 0):
                items = self._loader.list_items(name, ref)
                spec.check_items(name, items, done.get((name, gen), 0), rec.schema, self._where(rec))

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
        A result or state that cannot be stored is recorded as an unstorable failure
        (see :meth:`_unstorable`), which is then raised.
        """
        with self._lock:
            args = digest if type(digest) is bytes else None
            try:
                body, extra = self._step_body(position, name, digest, result, error)
                self._write_sync(body, extra, args, error)
                return
            except SerializationError as exc:
                if error is not None:
                    raise
                cause, failure = exc, self._unstorable(position, name, exc)
            body, extra = self._step_body(position, name, digest, None, failure)
            body["u"] = 1
            self._write_sync(body, extra, args, failure)
        raise failure from cause

    async def step_async(
        self, position: str, name: str, digest: bytes | str | None, *, result: Any = None, error: BaseException | None = None
    ) -> None:
        async with self.async_lock():
            args = digest if type(digest) is bytes else None
            try:
                body, extra = self._step_body(position, name, digest, result, error)
                await self._write_async(body, extra, args, error)
                return
            except SerializationError as exc:
                if error is not None:
                    raise
                cause, failure = exc, self._unstorable(position, name, exc)
            body, extra = self._step_body(position, name, digest, None, failure)
            body["u"] = 1
            await self._write_async(body, extra, args, failure)
        raise failure from cause

    def _unstorable(self, position: str, name: str, exc: SerializationError) -> SerializationError:
        """The failure recorded for a step that ran but whose result or state cannot be stored.

        Its side effects happened, so it must not run again: the record (flag ``u``)
        replays as this error on every resume of the run, and its checkpoint keeps
        the last stored value of each channel that cannot be stored."""
        return SerializationError(
            f"step {name!r} at position {position} of thread {self.thread_id!r} (run {self.run_id}) ran, "
            f"but what it left cannot be stored: {exc}. The step is recorded as failed with this error, "
            "so resuming this run replays the error and does not run the step (and its side effects) "
            "again. Fix the value (JSON-like data, pydantic models, dataclasses, namedtuples and enums "
            "can be stored), then re-run only this step: "
            f"pk.resume({self.thread_id!r}, run_id={self.run_id!r}, retry_failed=True) replays the "
            "committed steps before it and runs this one again (its side effects happen a second time). "
            "Do not use a new run_id for this: a new run runs the steps before it again"
        )

    def precheck(self, position: str, name: str) -> None:
        """Before a live step's body runs: fail if the state as it is now cannot be stored
        (only what changed since the last checkpoint is checked)."""
        try:
            self._tracker.precheck(self.spec.channels(self.state))
        except SerializationError as exc:
            raise SerializationError(
                f"step {name!r} at position {position} of thread {self.thread_id!r} was not run: "
                f"run.state cannot be stored ({exc}). Keep functions, locks, clients and other live "
                "objects out of run.state; store the data they stand for"
            ) from exc

    def end_sync(self, error: BaseException | None) -> None:
        """Commit the run's end: completed, or failed with ``error``."""
        with self._lock:
            if self._lost is not None and _caused_by(error, self._lost):
                self.status = FAILED  # the block ends on its own conflict: that error said it all
                return
            body = self._end_body(error)
            self._write_sync(body, {}, None, None)
            self.status = body["rs"]

    async def end_async(self, error: BaseException | None) -> None:
        async with self.async_lock():
            if self._lost is not None and _caused_by(error, self._lost):
                self.status = FAILED
                return
            body = self._end_body(error)
            await self._write_async(body, {}, None, None)
            self.status = body["rs"]

    def _write_sync(
        self, body: dict[str, Any], extra: dict[str, bytes], args: bytes | None, error: BaseException | None
    ) -> None:
        row, blobs, diff = self._prepare(body, extra, args)
        lease, version = self.lease, self._head.version if self._head else 0
        try:
            swap = freeing(lease) if lease is not None and self.release_at_end and body["k"] == "end" else None
            if lease is None:
                head = self.store.write_sync(row, blobs, version)
            elif swap is not None:  # the end record gives the lease up with it: one round trip
                head, lease.released = write_fenced_swap_sync(self.store, row, blobs, version, lease, swap)
            else:
                head = self.store.write_fenced_sync(row, blobs, version, lease)
        except BaseException as exc:
            self._tracker.failed(diff)
            if not isinstance(exc, ConflictError):
                raise
            lost = self.store.run_sync(self._conflict(body, diff, exc))
            if lost is None:
                return  # an end record that changes nothing: skipped (see _conflict)
            self._lost = lost
            raise lost from exc
        self._landed(row, body, diff, head, error)

    async def _write_async(
        self, body: dict[str, Any], extra: dict[str, bytes], args: bytes | None, error: BaseException | None
    ) -> None:
        row, blobs, diff = self._prepare(body, extra, args)
        lease, version = self.lease, self._head.version if self._head else 0
        try:
            swap = freeing(lease) if lease is not None and self.release_at_end and body["k"] == "end" else None
            if lease is None:
                head = await self.store.write_async(row, blobs, version)
            elif swap is not None:  # the end record gives the lease up with it: one round trip
                head, lease.released = await write_fenced_swap_async(self.store, row, blobs, version, lease, swap)
            else:
                head = await self.store.write_fenced_async(row, blobs, version, lease)
        except BaseException as exc:
            self._tracker.failed(diff)
            if not isinstance(exc, ConflictError):
                raise
            lost = await self.store.run_async(self._conflict(body, diff, exc))
            if lost is None:
                return
            self._lost = lost
            raise lost from exc
        self._landed(row, body, diff, head, error)

    def _step_body(
        self, position: str, name: str, digest: bytes | str | None, result: Any, error: BaseException | None
    ) -> tuple[dict[str, Any], dict[str, bytes]]:
        body: dict[str, Any] = {"k": "step", "p": position, "n": name, "rs": RUNNING}
        extra: dict[str, bytes] = {}
        self._result_raw = self._result_tree = None
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
        tree = self.codec.encode(result, f"result of step {name!r}")  # a SerializationError: see step_sync
        # Sized unredacted: an inline result is redacted once, with the whole row.
        raw = _dump(tree)
        self._result_raw, self._result_tree = raw, tree  # a list item may refer to it, inline or blob
        if len(raw) > RESULT_INLINE_LIMIT:
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
        lenient = body.get("s") == "failed" or body["rs"] == FAILED  # a failure is always recorded
        row, diff = self._tracker.checkpoint(
            self.spec.channels(self.state), body, where, self._schema, args, self._result, lenient
        )
        return row, ({**diff.blobs, **extra} if extra else diff.blobs), diff

    def _landed(
        self, row: CheckpointRow, body: dict[str, Any], diff: Diff, head: Head, error: BaseException | None
    ) -> None:
        """``row`` is the thread's head now; a step's row is remembered for replay in this run."""
        self._head = head
        self._tracker.committed(diff)
        self._loader.rows[row.checkpoint_id] = body  # later replays in this run may read its segments
        if body["k"] != "step":
            self._result = None
            return
        self._result = result(row.checkpoint_id, self._result_tree, self._result_raw)
        rec = Record(row, body)
        if error is not None:
            self._failures[id(error)] = (error, row.checkpoint_id)
        pos = body["p"]
        self._remember(pos, rec)
        self._events.append((pos, body["n"], False, body["s"]))

    # -- another writer moved the head ------------------------------------------------------
    # Without leases (a later layer) two runs may write one thread; the head CAS
    # refuses the second writer's commit. What the error says must be true and
    # its advice safe to follow: the same run_id never runs a committed step again.

    def _conflict(self, body: dict[str, Any], diff: Diff, exc: ConflictError) -> Plan[ConflictError | None]:
        """The error for a commit of ``body`` refused by the head CAS, or None when
        it is the end record of a run whose committed steps already hold its
        outcome: the run completes without it (resuming its run_id replays it)."""
        t, ns, r = self.thread_id, self.namespace, self.run_id
        try:
            mine = yield call("list", t, ns, run_id=r, limit=1)
            last: str | None = mine[0].checkpoint_id if mine else None
            top = (yield call("get", t, ns, exc.found_checkpoint)) if exc.found_checkpoint else None
            by = f", written by run {top.run_id}" if top is not None and top.run_id else ""
            known = True
        except PersistkitError:  # cannot tell what committed: say so, and give the advice that always holds
            last, by, known = None, "", False
        prev = self._tracker.prev  # the channels as this run last committed (or opened) them
        changed = sorted(
            {n for n, ref in diff.refs.items() if n not in prev or prev[n].ref != ref}
            | (prev.keys() - diff.refs.keys())
        )
        failed = body["k"] == "end" and body["rs"] == FAILED
        if body["k"] == "end" and last is not None and not changed and not failed:
            return None
        moved = (
            f"the thread's head moved from version {exc.expected} to {exc.found}"
            + (f" (checkpoint {exc.found_checkpoint}{by})" if exc.found_checkpoint else "")
            + " before it was written"
        )
        if body["k"] == "step":
            what = f"step {body['n']!r} at position {body['p']} of run {r} ran, but its checkpoint was not written"
        elif failed:
            what = f"run {r} failed, and its failure record was not written"
        else:
            what = f"run {r} ended, but its end record was not written"
        if changed and body["k"] == "end":
            what += f" (nor the changes to state.{', state.'.join(changed)} made after its last step)"
        again = f"pk.resume({t!r}, run_id={r!r})"
        if not known:
            tail = (
                f"It could not be read back what of run {r} is committed. {again} replays whatever "
                "it committed without running it again; do not run the block under a new run_id."
            )
        elif last is None:
            tail = (
                f"Nothing of run {r} is stored. Run the block again with {again}: it starts the run "
                "from the new head"
                + (" and runs this step again (its side effects happened once already: pass "
                   "pk.current_step().key to external calls, the key stays the same)." if body["k"] == "step" else ".")
            )
        else:
            tail = (
                f"Run {r}'s checkpoints up to {last} are committed and stay. {again} replays them without "
                "running them again (and writes nothing); do not run the block under a new run_id, "
                "or its committed steps run twice."
            )
            if body["k"] == "step" or failed:
                tail += (
                    " The run cannot go on on this thread: the replay raises ConflictError at the first "
                    f"step it did not record. To go on from its state, fork it: store.fork({t!r}, {last!r})."
                )
            else:
                tail += (
                    " To keep those changes, make them inside a step (they commit with it), or apply them "
                    f"to the new head: store.update_state({t!r}, {{...}})."
                )
        return ConflictError(
            f"thread {t!r}: {what}: {moved}. {tail}",
            thread_id=t, namespace=ns, expected=exc.expected, found=exc.found, found_checkpoint=exc.found_checkpoint,
        )

    def _unfinished(self, position: str, name: str, why: str) -> ConflictError:
        """A step the run did not record, replaying a run whose thread moved on (see open)."""
        assert self._moved_on is not None
        last, head, by = self._moved_on
        t, r = self.thread_id, self.run_id
        return ConflictError(
            f"thread {t!r}: run {r} did not finish before the thread moved on (its head is checkpoint "
            f"{head.checkpoint_id if head else None}" + (f" of run {by}" if by else "") + "): its "
            f"recorded steps replayed without running, but step {name!r} at position {position} {why} "
            "and cannot run on this thread now. Do not run the block under a new run_id (the recorded "
            f"steps would run twice); to go on from the run's state, fork it: store.fork({t!r}, {last!r}).",
            thread_id=t, namespace=self.namespace, expected=0,
            found=head.version if head else 0, found_checkpoint=head.checkpoint_id if head else None,
        )

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


def _caused_by(error: BaseException | None, lost: ConflictError) -> bool:
    """Whether ``error`` is ``lost`` or was raised while handling it."""
    seen = 0
    while error is not None and seen < 100:
        if error is lost:
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False
