"""Committing: the checkpoint a step or a run's end writes, and what happens when it lands.

A checkpoint goes straight to the backend (no plan generator in between: the per-step
path is the one whose microseconds matter). What to write and what to remember is
decided once (``_step_body``/``_end_body``, ``_prepare``, ``_landed``); the sync and
async twins differ only in how they call the backend. A commit refused by the head's
compare-and-swap becomes a ``ConflictError`` whose advice is safe to follow (``_conflict``).
"""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING, Any

from .._errors import (
    ConflictError,
    LeaseLostError,
    NonDeterminismError,
    PersistkitError,
    RetryableError,
    SerializationError,
    ValueTooLargeError,
)
from .._io import Plan, call
from ..backends import CheckpointRow, Head
from ..codec._pipeline import _dump, content_hash
from ..codec._sizes import large_value
from ..coordination._fenced import write_fenced_swap_async, write_fenced_swap_sync
from ..coordination._lease import freeing
from ..ops._telemetry import conflicted
from ..state._channels import Diff
from ..state._dedupe import result
from ..state._records import Record
from ._cursor import COMPLETED, FAILED, RUNNING, SUSPENDED, ReplayCursor

if TYPE_CHECKING:
    import asyncio



#: Results whose serialized form is larger than this are stored as a blob, not in the record.
RESULT_INLINE_LIMIT = 64 * 1024


class Commits(ReplayCursor):
    """Writing a run's checkpoints (part of :class:`Run`)."""

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
        retry = (
            f"pk.resume({self.thread_id!r}, run_id={self.run_id!r}, retry_failed=True) replays the "
            "committed steps before it and runs this one again (its side effects happen a second time). "
            "Do not use a new run_id for this: a new run runs the steps before it again"
        )
        ran = f"step {name!r} at position {position} of thread {self.thread_id!r} (run {self.run_id}) ran, "
        if isinstance(exc, ValueTooLargeError):
            return ValueTooLargeError(
                f"{ran}but {exc} The step is recorded as failed with this error, so resuming this run "
                f"replays the error and does not run the step again. To re-run only this step: {retry}",
                size=exc.size, limit=exc.limit,
            )
        return SerializationError(
            f"{ran}but what it left cannot be stored: {exc}. The step is recorded as failed with this error, "
            "so resuming this run replays the error and does not run the step (and its side effects) "
            "again. Fix the value (JSON-like data, pydantic models, dataclasses, namedtuples and enums "
            f"can be stored), then re-run only this step: {retry}"
        )

    def precheck(self, position: str, name: str) -> None:
        """Before a live step's body runs: fail if the state as it is now cannot be stored
        (only what changed since the last checkpoint is checked)."""
        try:
            self._tracker.precheck(self.spec.channels(self.state))
        except SerializationError as exc:
            where = f"step {name!r} at position {position} of thread {self.thread_id!r} was not run: "
            if isinstance(exc, ValueTooLargeError):
                raise ValueTooLargeError(f"{where}{exc}", size=exc.size, limit=exc.limit) from exc
            raise SerializationError(
                f"{where}run.state cannot be stored ({exc}). Keep functions, locks, clients and other live "
                "objects out of run.state; store the data they stand for"
            ) from exc

    def end_sync(self, error: BaseException | None) -> None:
        """Commit the run's end: completed, or failed with ``error``."""
        with self._lock:
            if self._lost is not None and _caused_by(error, self._lost):
                self.status = FAILED  # the block ends on its own conflict: that error said it all
                return
            body = self._end_body(error)
            if not self._repeats_failure(body):
                self._write_sync(body, {}, None, None)
            self.status = body["rs"]

    async def end_async(self, error: BaseException | None) -> None:
        async with self.async_lock():
            if self._lost is not None and _caused_by(error, self._lost):
                self.status = FAILED
                return
            body = self._end_body(error)
            if not self._repeats_failure(body):
                await self._write_async(body, {}, None, None)
            self.status = body["rs"]

    def _write_sync(
        self, body: dict[str, Any], extra: dict[str, bytes], args: bytes | None, error: BaseException | None
    ) -> None:
        streams = self._streams
        if streams is not None:  # the run emitted (persistkit/streams): its events land first
            streams.before(self, body)
        row, blobs, diff = self._prepare(body, extra, args)
        lease, version, obs = self.lease, self._head.version if self._head else 0, self.observer
        began = perf_counter() if obs is not None else 0.0  # telemetry (ops/_telemetry): write latency
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
            if self.refused is not None and (stop := self.store.run_sync(self.refused(self, exc))) is not None:
                raise stop from None  # store.cancel ended this lease-less run meanwhile (coordination/_cancel)
            lost = self.store.run_sync(self._conflict(body, diff, exc))
            if lost is None:
                return  # an end record that changes nothing: skipped (see _conflict)
            self._lost = lost
            conflicted(self, body, lost)  # logged, and reported if observed (ops/_telemetry)
            raise lost from exc
        self._landed(row, body, diff, head, error)
        if streams is not None:
            streams.landed(self, body)
        if obs is not None:
            obs.wrote(row.payload, blobs, body, perf_counter() - began)

    async def _write_async(
        self, body: dict[str, Any], extra: dict[str, bytes], args: bytes | None, error: BaseException | None
    ) -> None:
        streams = self._streams
        if streams is not None:  # the run emitted (persistkit/streams): its events land first
            await streams.abefore(self, body)
        row, blobs, diff = self._prepare(body, extra, args)
        lease, version, obs = self.lease, self._head.version if self._head else 0, self.observer
        began = perf_counter() if obs is not None else 0.0  # telemetry (ops/_telemetry): write latency
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
            if self.refused is not None and (stop := await self.store.run_async(self.refused(self, exc))) is not None:
                raise stop from None
            lost = await self.store.run_async(self._conflict(body, diff, exc))
            if lost is None:
                return
            self._lost = lost
            conflicted(self, body, lost)  # logged, and reported if observed (ops/_telemetry)
            raise lost from exc
        self._landed(row, body, diff, head, error)
        if streams is not None:
            await streams.alanded(self, body)
        if obs is not None:
            obs.wrote(row.payload, blobs, body, perf_counter() - began)

    def _step_body(
        self, position: str, name: str, digest: bytes | str | None, result: Any, error: BaseException | None
    ) -> tuple[dict[str, Any], dict[str, bytes]]:
        body: dict[str, Any] = {"k": "step", "p": position, "n": name, "rs": RUNNING}
        extra: dict[str, bytes] = {}
        self._result_raw = self._result_tree = None
        if digest and type(digest) is str:
            body["a"] = digest
        if self._marks:  # recorded by a layer for this step (e.g. its compensation)
            marks = self._marks.pop(position, None)
            if marks and error is None:
                body.update(marks)
        if error is not None:
            body["s"] = "failed"
            body["e"] = self.codec.serializer.encode_exception(error)
            if self.leaves_unfinished(error):  # no end record will list it: see _cursor._ended_attempt
                body["ru"] = 1
            return body, extra
        body["s"] = "completed"
        if result is None:
            body["r"] = None
            return body, extra
        tree = self.codec.encode(result, f"result of step {name!r}")  # a SerializationError: see step_sync
        # Sized unredacted: an inline result is redacted once, with the whole row.
        raw = _dump(tree)
        if len(raw) > self.codec.value_alarm:  # a warning, or max_value_bytes= (codec/_sizes.py)
            large_value(self.codec, len(raw), f"the result of step {name!r} at position {position} of "
                        f"thread {self.thread_id!r}", f"step {name}")
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

    def _repeats_failure(self, body: dict[str, Any]) -> bool:
        """A retry of a failed run (its failed end record was the head as it opened) that
        committed nothing and fails the same way: the head already says so, write nothing."""
        end = self._failed_end
        return (
            end is not None
            and body["rs"] == FAILED
            and self._head is not None
            and self._head.checkpoint_id == end.id
            and _dump(body.get("e")) == _dump(end.body.get("e"))
            and list(body.get("x") or ()) == list(end.body.get("x") or ())
        )

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
        if self._attach:  # rides on whatever this run writes next (see Run._attach)
            body.update(self._attach)
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
        if self._attach:
            for key in self._attach.keys() & body.keys():
                if self._attach[key] is body[key]:
                    del self._attach[key]
        self._loader.landed(row.checkpoint_id, body, diff)  # what later replays in this run may read
        if body["k"] != "step":
            self._result = None
            return
        self._result = result(row.checkpoint_id, self._result_tree, self._result_raw)
        # the body is all a replay reads: the row is kept without its payload
        bare = CheckpointRow(row.thread_id, row.namespace, row.checkpoint_id, row.parent_id, row.run_id, b"")
        rec = Record(bare, body, live=True)
        if error is not None:
            self._failures[id(error)] = (error, row.checkpoint_id)
        pos = body["p"]
        self._remember(pos, rec, live=True)
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

    def lease_lost(self, exc: BaseException | None) -> bool:
        """Whether this run lost its lease (it must write nothing more, not even its end)."""
        return isinstance(exc, LeaseLostError) or (self.lease is not None and self.lease.lost is not None)

    def leaves_unfinished(self, exc: BaseException | None) -> bool:
        """Whether the block, ended now by ``exc`` (None: cleanly), writes no end record and
        leaves the run unfinished: an interrupt, or a ``pk.RetryableError`` (a busy or lost
        lease, a store briefly unavailable: retrying the same run_id continues it); a run
        that could not load a recorded state (a failed migration) must not move the head,
        nor one that this code cannot replay (``NonDeterminismError``: the run stays as it
        was, a suspended one keeps its question, for the code that can finish it); a
        suspended run ends without one (``pk.suspend``, even if its ``pk.Suspended`` was
        caught); a run whose lease was lost must write nothing more."""
        return (
            self.status == SUSPENDED
            or self.load_error is not None
            or isinstance(exc, NonDeterminismError | RetryableError)
            or (exc is not None and not isinstance(exc, Exception))
            or self.lease_lost(exc)
        )

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
