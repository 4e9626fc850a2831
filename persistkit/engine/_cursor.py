"""The replay cursor: which run a block continues, and what each step call replays.

Opening a run (:meth:`ReplayCursor.open`) reads the head and the run's records and
restores the state it starts from. Each step call then asks :meth:`~ReplayCursor.lookup`
for the record at its position: a recorded, completed step replays its result
(:meth:`~ReplayCursor.replay`, which also restores the state committed with it); None
means the step runs for real. Recorded failures replay, or run again when they ended an
attempt (:meth:`~ReplayCursor._ended_attempt`, :meth:`~ReplayCursor.mark_escaped`). No writes here: committing is ``_commit``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .._errors import (
    ConflictError,
    NonDeterminismError,
    NotFoundError,
    PersistkitError,
    RunPrunedError,
    SecretResolutionError,
)
from .._ids import new_run_id
from .._io import Plan, call
from ..backends import CheckpointRow, Head
from ..codec._versions import migrations_ran
from ..coordination._lease import here, host_pid
from ..coordination._outbox import pending_in
from ..coordination._saga import COMPENSATED, COMPENSATING, compensated_error
from ..coordination._unfinished import ENDED, check_turn, ended_error
from ..state._records import Record, read_rows, run_pruned
from . import _args
from ._restore import StateRestore

if TYPE_CHECKING:

    pass


#: Run statuses.
RUNNING, COMPLETED, FAILED, SUSPENDED = "running", "completed", "failed", "suspended"


class ReplayCursor(StateRestore):
    """Matching step calls to a run's records, and replaying them (part of :class:`Run`)."""

    # -- opening -------------------------------------------------------------------------

    def open(self, run_id: str | None) -> Plan[None]:
        store, t, ns = self.store, self.thread_id, self.namespace
        found: tuple[Head, CheckpointRow] | None = yield call("head_row", t, ns)
        head, head_rec = (found[0], Record.decode(self.codec, found[1])) if found else (None, None)
        rows: list[Record] = []
        if run_id is not None:
            rows = yield from read_rows(self.codec, t, ns, run_id)
            if rows:
                if rows[-1].run_status in ENDED:  # abandoned, cancelled, interrupted: never runs again
                    raise ended_error(self.thread_id, run_id, rows[-1])
                if rows[-1].run_status == COMPENSATED:  # rolled back (sagas): it never runs again
                    raise compensated_error(self.codec, self.thread_id, run_id, rows[-1])
                if rows[-1].run_status == COMPLETED:
                    self.replay_only = True
                elif head_rec is None or head_rec.row.run_id != run_id:
                    # Another run built on this one's checkpoints (or its end record was
                    # skipped, see _conflict): replay what it recorded, run nothing.
                    self.replay_only = True
                    self._moved_on = (
                        rows[-1].id, head, head_rec.row.run_id if head_rec else None, rows[-1].run_status
                    )
                elif rows[-1].run_status == FAILED and head_rec is not None and head_rec.id == rows[-1].id:
                    self._failed_end = rows[-1]  # retried after a failure: see _commit.end_sync
            elif head_rec is not None:
                # Retention may have deleted every record of this run (a redelivery after a
                # prune): it leaves a tombstone, and the run must not run again.
                pruned = yield from run_pruned(self.codec, t, ns, run_id)
                if pruned is not None:
                    raise pruned_error(t, run_id, pruned)
                if self.keeps_turns:
                    check_turn(head_rec, run_id)  # another turn's run is unfinished: wait for it (coordination)
        elif (
            head_rec is not None
            and head_rec.kind in ("step", "end")
            and head_rec.run_status in (RUNNING, FAILED, SUSPENDED, COMPENSATING)
            and head_rec.row.run_id
        ):
            run_id = head_rec.row.run_id
            rows = yield from read_rows(self.codec, t, ns, run_id)
        self.run_id = run_id or new_run_id()
        self.status = COMPLETED if self.replay_only else RUNNING
        self._head = head

        base_id = rows[0].row.parent_id if rows else (head.checkpoint_id if head else None)
        if base_id is None:
            base_rec = None
        elif head_rec is not None and base_id == head_rec.id:
            base_rec = head_rec
        else:
            try:
                base_rec = yield from store.read_record(t, ns, base_id)
            except NotFoundError:
                if not rows:
                    raise
                raise pruned_error(t, self.run_id, rows[-1].run_status) from None
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
            if rec.kind == "step" and "dm" not in rec.body:  # "dm": an outbox done mark, a copy
                self._remember(rec.body["p"], rec)  # a str: Record.decode checked it
            elif rec.kind == "end":
                self._escaped.update(rec.body.get("x") or ())
            if "pt" in rec.body:  # patch ids the run reached live (engine/_patches)
                self._patches.update(dict.fromkeys(rec.body["pt"], True))
        if rows and not self.replay_only:  # after-commit effects a crash left undone (coordination/_outbox)
            self._pending = pending_in(rows)
            newest = rows[-1]
            if (
                head_rec is not None and head_rec.id == newest.id and newest.run_status in (RUNNING, COMPENSATING)
                and not _answered(rows)
            ):
                self._attach["rz"] = self._resume_mark(newest)

    def _resume_mark(self, newest: Record) -> dict[str, Any]:
        """The resume mark (``rz``, ``state/_records``) of a block that continues this unfinished
        run: it rides on the block's first record (no write of its own, nothing per step)."""
        replays = sum(1 for rec in self._index.values() if rec.body.get("s") != "failed")
        mark: dict[str, Any] = {"t": time.time(), "h": here(), "n": replays, "c": newest.id}
        took = self.lease.took_over if self.lease is not None else None
        if took is not None:  # its holder never gave the lease up: it died, or hung
            mark["w"] = host_pid(took[0])
            if took[1]:
                mark["g"] = 1
        return mark

    def ended(self, run_id: str) -> Plan[str | None]:
        """The status of ``run_id``'s end record on this thread (``completed``, ``failed``,
        ``abandoned``), or None while it has none. One indexed read of the run's newest row:
        ``pk.resume`` asks it, with a ``run_id``, before it waits for the thread's lease."""
        page = yield call("list", self.thread_id, self.namespace, run_id=run_id, limit=1)
        if not page:
            return None
        rec = Record.decode(self.codec, page[0])
        return rec.run_status if rec.kind == "end" else None

    def _remember(self, pos: str, rec: Record, live: bool = False) -> None:
        """``rec``, the step at ``pos``, replays in this run. ``live``: this block just
        committed it (see :meth:`_forget_settled`)."""
        self._index[pos] = rec
        parent, _, seq = pos.rpartition("/")
        if seq.isdigit() and seq.isascii() and int(seq) > self._max_child.get(parent, -1):
            self._max_child[parent] = int(seq)
        if live:
            self._forget_settled(pos, parent, rec)

    def _forget_settled(self, pos: str, parent: str, rec: Record) -> None:
        """Drop the records this block committed that no later call can look up, so that a
        long run keeps O(1) of them: a position is called again only when a step it is
        nested in runs again (a retried parent), so once the step at ``pos`` completed its
        descendants are settled (a call of ``pos`` replays ``pos`` itself), and top-level
        positions are never called twice in one block. Records other layers read later
        (compensations ``cp``, after-commit effects ``ac``, questions ``q``, rollback
        positions) and the newest one (a rollback restores its state) always stay."""
        if not parent:
            for done in self._settled.pop("", ()):
                self._drop_under(done, True)
        if rec.body.get("s") == "completed":
            self._drop_under(pos, False)
        body = rec.body
        if "cp" not in body and "ac" not in body and "q" not in body and pos.replace("/", "").isdigit():
            self._settled.setdefault(parent, []).append(pos)

    def _drop_under(self, pos: str, itself: bool) -> None:
        """Forget the settled records nested in ``pos`` (and ``pos``'s own, if ``itself``)."""
        stack = [pos] if itself else list(self._settled.pop(pos, ()))
        while stack:
            done = stack.pop()
            self._index.pop(done, None)
            stack.extend(self._settled.pop(done, ()))

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
                    "being replayed because its run_id was reused; " + self.remedies(),
                    position=position, step=name,
                )
            return None
        recorded = rec.body.get("n")
        if recorded != name:
            raise NonDeterminismError(
                f"thread {self.thread_id!r} run {self.run_id}: at step position {position} the run "
                f"recorded {recorded!r}, but the code now calls {name!r}. The code changed (or is not "
                "deterministic between steps) since the run started. " + self.remedies(),
                position=position, step=name,
            )
        if rec.body.get("s") == "failed" and self._ended_attempt(rec, position):
            if self._moved_on is not None:
                raise self._unfinished(position, name, "failed, and its failure ended the attempt")
            return None
        return rec

    def _ended_attempt(self, rec: Record, position: str) -> bool:
        """Whether the recorded failure ``rec`` ended an attempt, so that its step runs again
        (that is what a retry is for); otherwise its error replays, as the caller saw it.

        A failure ended an attempt when it escaped the block (the run's end record lists it
        in ``x``) or, in this block, a step it is nested in (a retried parent: see
        :meth:`mark_escaped`). A failure with neither, the newest record of its parent
        (a crash came before anything else was recorded), was handled as far as anything
        recorded says, and replays: if it had escaped, its replayed error escapes the same
        way, and a retried parent then runs it again (the block fails with it, and says so
        in its end record, when nothing retries it). Two kinds are recorded so that they
        run again while nothing was recorded after them: ``ru``, an error that leaves the
        run unfinished when it escapes (a ``pk.RetryableError``, a ``NonDeterminismError``:
        the block writes no end record to list it, and the retry of the same run_id
        must run it again), and ``u`` (it ran, but what it left could not be stored) once
        ``retry_failed=True`` asks to run it again; without that flag ``u`` always replays."""
        body = rec.body
        if body.get("u") and not self.retry_failed:
            return False  # its side effects happened: it replays its error
        if rec.id in self._escaped:
            return True
        if not (body.get("ru") or body.get("u")):
            return False
        parent, _, seq = position.rpartition("/")
        return self._max_child.get(parent, -1) <= int(seq)  # nothing recorded after it

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
                "may not apply. Make the code before it deterministic, or decorate the step with "
                "check_args=False if the arguments may differ. " + self.remedies(),
                position=position, step=name,
            )

    def remedies(self) -> str:
        """What to do about a run that old code recorded and the code now contradicts."""
        t = self.thread_id
        return (
            "Remedies: finish this run with the code that started it; guard the change with "
            "`if pk.patched(\"<change-id>\"):` (old runs keep the old path, new runs take the new "
            "one); run the replay check before deploying (`persistkit replay-check URL "
            "module:function`, or store.check_replay(entry)); start a new run (a new run_id); "
            f"or fork the thread from a checkpoint before the change: store.fork({t!r}, <checkpoint_id>)"
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
                recorded = self.codec.decode_exception(rec.body.get("e"), at, live=rec.live)
            elif "rb" in rec.body:  # a blob: stored form, even of a record this run committed
                value = self.codec.decode(self.codec.unpack_tree(self._loader.blobs[rec.body["rb"]], at), at)
            else:
                value = self.codec.decode(rec.body.get("r"), at, live=rec.live)
        except SecretResolutionError as exc:  # never hand a handle's text to the caller as the value
            self.load_error = SecretResolutionError(
                f"{at} is a secret stored as a handle, and it cannot be given back: {exc}", handle=exc.handle
            )
            raise self.load_error from exc
        except PersistkitError as error:
            # The recorded value cannot be read here (its class changed shape, the store was
            # opened without blobs= or a key, the record is damaged): not the run's failure,
            # so it writes nothing, as for a state that cannot be restored
            self.load_error = error
            raise
        if migrations_ran() != ran:
            self.migrated = True
        self._events.append((pos, name, True, "failed" if failed else "completed"))
        if self.observer is not None:  # telemetry (ops/_telemetry): the step's span says replayed
            self.observer.replayed(pos, name, failed)
        if failed:
            self._failures[id(recorded)] = (recorded, rec.id)
            raise recorded
        return value

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

    def _unfinished(self, position: str, name: str, why: str) -> ConflictError:
        """A step the run did not record, replaying a run whose thread moved on (see open)."""
        assert self._moved_on is not None
        last, head, by, status = self._moved_on
        t, r = self.thread_id, self.run_id
        what = (
            f"run {r} failed (its block raised; the failure is recorded) and the thread moved on"
            if status == FAILED else f"run {r} did not finish before the thread moved on"
        )
        return ConflictError(
            f"thread {t!r}: {what} (its head is checkpoint "
            f"{head.checkpoint_id if head else None}" + (f" of run {by}" if by else "") + "): its "
            f"recorded steps replayed without running, but step {name!r} at position {position} {why} "
            "and cannot run on this thread now. Do not run the block under a new run_id (the recorded "
            f"steps would run twice); to go on from the run's state, fork it: store.fork({t!r}, {last!r}).",
            thread_id=t, namespace=self.namespace, expected=0,
            found=head.version if head else 0, found_checkpoint=head.checkpoint_id if head else None,
        )


def _answered(rows: list[Record]) -> bool:
    """Whether the run's newest record is ``store.answer``'s (the step at a suspended position,
    completed): a run that goes on after its answer is no crashed one."""
    newest = rows[-1]
    pos = newest.body.get("p")
    return pos is not None and any(r.body.get("p") == pos and r.body.get("s") == SUSPENDED for r in rows[:-1])


def pruned_error(thread_id: str, run_id: str, status: str | None) -> RunPrunedError:
    """Resuming a run whose records before its oldest kept one were pruned: retention keeps
    every record of an unfinished run, so this one finished (or the thread moved past it)."""
    return RunPrunedError(
        f"run {run_id} of thread {thread_id!r} ({status or 'finished'}) cannot be replayed: retention "
        "(store.prune) deleted its checkpoints (some or all), so its recorded steps are not there; it "
        "will not run again. A redelivered message of it was handled already: drop it (not "
        "retryable). To replay redeliveries, keep checkpoints longer than your queue redelivers: "
        "pk.Retention(max_age=...)",
        thread_id=thread_id, run_id=run_id,
    )
