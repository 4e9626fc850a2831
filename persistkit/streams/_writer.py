"""A run's stream writers: ``pk.emit`` buffers, a background thread writes batches, and the
run's commit path waits for them (docs/streams.md).

One :class:`RunStreams` per run (``Run._streams``), made by the run's first emit, or as a
continued run opens. The engine calls it twice per commit (``before``: write what is
buffered, decide what an ended attempt left; ``landed``: events become final, the run's end
is recorded). Everything that touches ``run`` happens on the run's own thread (emits and
commits); the background thread only writes the records it is handed.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .._errors import ConflictError, PersistkitError
from .._io import call
from ..backends._capabilities import require
from ..backends._protocol import KvOp
from ..state._records import Record
from . import _format as F
from ._points import Cover, ancestors, is_final, replays_in, started

__all__ = ["RunStreams", "emit_in", "opened"]

log = logging.getLogger("persistkit.streams")

#: how long the background writer waits to group emits into one batch (seconds)
LINGER = 0.002
#: a writer thread with nothing to do for this long exits (the next emit starts another)
IDLE = 2.0
#: batches between two rewrites of the stream's tail hint
HINT_EVERY = 16


class Rec:
    """One record on its way to the store; events stay in ``pending`` until final."""

    __slots__ = ("at", "attempt", "chain", "copy", "data", "dead", "kind", "offset", "started", "step")

    def __init__(self, kind: str, data: Any, step: str = "", start: int = 0, chain: tuple[Any, ...] = (), attempt: int = 1) -> None:
        self.kind = kind
        self.data = data
        self.step = step
        self.started = start
        self.chain = chain
        self.at = time.time()
        self.offset: int | None = None
        self.copy: int | None = None
        self.dead = False
        self.attempt = attempt

    def stored(self) -> list[Any]:
        rec = [self.kind, self.at, self.step, self.started, self.data]
        if self.copy is not None:
            rec.append(self.copy)
        return rec


class _Stream:
    """What a run knows of one stream."""

    def __init__(self, name: str, scope: str) -> None:
        self.name = name
        self.scope = scope
        self.ready = False  # the tail was found and what earlier attempts left was decided
        self.next = 1  # the next offset
        self.meta_version = 0
        self.since_hint = 0
        self.buffer: list[Rec] = []  # not yet written, in order
        self.pending: list[Rec] = []  # events not final yet (written or buffered), in order
        self.attempt = 1
        self.settled = 0  # every record at or before it is final or superseded
        self.last_final = 0  # the offset of the last final event
        self.marked = 0  # the last "final" record's `to`
        self.chains: dict[int, tuple[Any, ...]] = {}  # the distinct attempt chains of ``pending``
        self.lost: str | None = None  # a newer holder of the thread writes here: this run stops
        self.writing: list[Rec] = []  # the records being written now
        self.touched = False  # this run wrote here (or left events here): its end is recorded here
        self.writer: Any = None  # the frame that emitted here last
        self.left: dict[int, Any] = {}  # frames another branch's emit left behind (see RunStreams._switch)
        self.warned = False


class RunStreams:
    """The streams one run writes."""

    def __init__(self, run: Any, resumed: tuple[Cover, frozenset[str]] | None) -> None:
        self.run = run
        self.store = run.store
        self.codec = run.codec
        self.streams: dict[str, _Stream] = {}
        self.tags: dict[str, list[str]] = {}
        self.cover = resumed[0] if resumed else Cover.of(run._index, run._max_child)
        self.resumed = resumed  # the records a continued run found: what its earlier attempts left
        self.lock = threading.Lock()  # buffers and pending lists (the run's thread and the writer)
        self.io = threading.Lock()  # one writer at a time
        self.cond = threading.Condition()
        self.work = False
        self.thread: threading.Thread | None = None
        self.failure: BaseException | None = None
        self.indexed: set[str] | None = None  # the thread's stream names, once read
        self._index_version = 0
        self._frame: tuple[Any, tuple[Any, ...]] | None = None
        self._seen: tuple[Any, int] | None = None  # the frame and commit count of the last decided emit
        self.epoch = 0  # commits seen (each may end an attempt or settle one)
        self.closed = False
        self.noted = False  # "st" attached to the run's next record

    # -- the run's thread ------------------------------------------------------------------

    def stream(self, name: str) -> _Stream:
        s = self.streams.get(name)
        if s is None:
            s = self.streams[name] = _Stream(name, F.scope_of(self.run.thread_id, self.run.namespace, name))
        return s

    def chain(self, frame: Any) -> tuple[Any, ...]:
        """The attempt tokens of the steps enclosing ``frame``: each lives in that step's marks
        (``Run._marks``), which the engine drops when the attempt fails."""
        last = self._frame
        if last is not None and last[0] is frame:
            return last[1]
        marks = self.run._marks
        chain = []
        for pos in ancestors(frame.path):
            tag = self.tags.get(pos)
            held = marks.get(pos)
            if tag is None or held is None or held.get("se") is not tag:
                tag = self.tags[pos] = [pos]
                marks.setdefault(pos, {})["se"] = tag
            chain.append(tag)
        out = tuple(chain)
        self._frame = (frame, out)
        return out

    def add(self, frame: Any, name: str, tree: Any) -> None:
        if self._seen != (frame, self.epoch):  # an attempt can end only between frames or at a commit
            self.decide(None, None)
            self._seen = (frame, self.epoch)
        with self.lock:
            chain = self.chain(frame)
            s = self.stream(name)
            if s.lost is not None:
                return
            if s.writer is not frame:
                self._switch(s, frame)
            rec = Rec("e", tree, frame.path, started(frame), chain, s.attempt)
            if not s.touched and not self.noted:  # the run's next record says it emitted (see opened)
                self.run._attach["st"] = 1
                self.noted = True
            s.touched = True
            s.buffer.append(rec)
            s.pending.append(rec)
            if chain:
                s.chains[id(chain)] = chain
        self.kick()

    def _switch(self, s: _Stream, frame: Any) -> None:
        """Another frame emits into ``s``: the previous one is left behind unless one encloses
        the other. A frame left behind that emits again runs concurrently with another branch
        of the run: said once (docs/streams.md, Limits: one emitting branch per stream)."""
        prev = s.writer
        s.writer = frame
        if prev is None:
            return
        if id(frame) in s.left and s.left[id(frame)] is frame and not s.warned:
            s.warned = True
            log.warning(
                "persistkit: steps at %s and %s of run %s emit into stream %r concurrently: the rewind rule "
                "is exact for one emitting branch per stream; give each branch its own stream "
                "(stream=f'...-{i}'), docs/streams.md", prev.path or "(block)", frame.path or "(block)",
                self.run.run_id, s.name,
            )
        a, b = prev.path, frame.path
        if a and b and a != b and not a.startswith(b + "/") and not b.startswith(a + "/"):
            if len(s.left) > 64:
                s.left.clear()
            s.left[id(prev)] = prev

    def _valid(self, tag: list[str], committing: Any) -> bool:
        if tag is committing:
            return True
        held = self.run._marks.get(tag[0])
        return held is not None and held.get("se") is tag

    def _ended(self, failing: str | None, committing: Any) -> bool:
        return any(
            not self._valid(t, committing) and t[0] != failing
            for s in self.streams.values() for c in s.chains.values() for t in c
        )

    def decide(self, failing: str | None, committing: Any) -> None:
        """:meth:`check`, once no write is in flight (a record being written has no offset yet)."""
        with self.lock:
            if not self._ended(failing, committing):
                return  # every attempt that wrote a pending event still runs (the usual case)
        with self.io, self.lock:
            self.check(failing, committing)

    def check(self, failing: str | None, committing: Any) -> None:
        """Decide the events of attempts that ended (their marks were dropped): final or
        superseded (``_points``). ``failing``: the position whose failure is being recorded
        now (undecided until it is handled or escapes)."""
        replays = None
        for s in self.streams.values():
            if not any(not self._valid(t, committing) and t[0] != failing for c in s.chains.values() for t in c):
                continue  # every attempt that wrote a pending event still runs (the usual case)
            ended = [
                r for r in s.pending
                if r.chain and any(not self._valid(t, committing) and t[0] != failing for t in r.chain)
            ]
            if not ended:
                continue
            replays = replays or replays_in(self.run)
            dead = []
            for r in ended:
                if is_final(r.step, r.started, self.cover, replays):
                    s.pending.remove(r)
                    if r.offset is not None:
                        s.last_final = max(s.last_final, r.offset)
                else:
                    dead.append(r)
            if dead:
                self._supersede(s, dead)
            s.chains = {id(r.chain): r.chain for r in s.pending if r.chain}

    def _supersede(self, s: _Stream, dead: list[Rec]) -> None:
        """Take ``dead`` back: unwritten ones are dropped; written ones are named by one
        rewind, and events written after the first of them that stand are sent again."""
        for r in dead:
            r.dead = True
        written = [r.offset for r in dead if r.offset is not None]
        s.attempt += 1
        if not written:
            s.buffer = [r for r in s.buffer if not r.dead]
            s.pending = [r for r in s.pending if not r.dead]
            return
        first = min(written)
        standing = [r.offset for r in s.pending if not r.dead and r.offset is not None and r.offset < first]
        to = max([s.last_final, *standing]) if standing else s.last_final
        again = []
        for r in s.pending:
            if not r.dead and r.offset is not None and r.offset > first:
                c = Rec("e", r.data, r.step, r.started, r.chain, s.attempt)
                c.copy, c.at = r.offset, r.at
                again.append((r, c))
        copies = {id(r): c for r, c in again}
        s.pending = [copies.get(id(r), r) for r in s.pending if not r.dead]
        rewind = Rec("w", to, attempt=s.attempt)
        for r in s.buffer:
            r.attempt = s.attempt
        s.buffer = [rewind, *(c for _, c in again), *(r for r in s.buffer if not r.dead)]

    # -- the engine's hooks ------------------------------------------------------------------

    def before(self, run: Any, body: dict[str, Any]) -> None:
        """Before a checkpoint is written: what an ended attempt left is decided, and every
        event emitted so far is written (a committed step's events are never lost)."""
        self._decide(body)
        self.flush()

    async def abefore(self, run: Any, body: dict[str, Any]) -> None:
        self._decide(body)
        if self._dirty():
            import asyncio

            await asyncio.to_thread(self.flush)

    def _decide(self, body: dict[str, Any]) -> None:
        self.epoch += 1
        committing = body.pop("se", None)  # the attempt token: never stored
        failing = body.get("p") if body.get("s") == "failed" else None
        self.decide(failing, committing)

    def _dirty(self) -> bool:
        return self.indexed is None or any(s.buffer for s in self.streams.values())

    def landed(self, run: Any, body: dict[str, Any]) -> None:
        """After a checkpoint landed: a completed step makes every event before it final (one
        branch emitting at a time, docs/streams.md); a run's end is recorded in its streams."""
        if self._settle(body):
            self._end_flush()

    async def alanded(self, run: Any, body: dict[str, Any]) -> None:
        if self._settle(body):
            import asyncio

            await asyncio.to_thread(self._end_flush)

    def _settle(self, body: dict[str, Any]) -> bool:
        kind = body.get("k")
        self.epoch += 1
        if kind == "step":
            pos = str(body.get("p"))
            self.cover.add(pos)
            if body.get("s") == "completed":
                self.tags.pop(pos, None)  # its attempts are over
            if body.get("s") == "completed":
                with self.lock:
                    for s in self.streams.values():
                        self._finalize(s)
                self.kick()
            return False
        if kind != "end":
            return False
        status = str(body.get("rs"))
        with self.lock:
            for s in self.streams.values():
                if not s.touched:
                    continue  # another run's stream, looked at for what dead runs left
                if status == "completed":
                    self._finalize(s, marker=False)
                s.buffer.append(Rec("x", status, attempt=s.attempt))
        self.closed = True
        return True

    def _end_flush(self) -> None:
        try:
            self.flush(hint=True)
        except PersistkitError as exc:  # the run's end landed: never turn it into a failure
            log.warning("persistkit: the end of run %s could not be written to its streams (%s)", self.run.run_id, exc)

    def _finalize(self, s: _Stream, marker: bool = True) -> None:
        done = [r for r in s.pending if r.offset is not None]
        if not done:
            return
        s.pending = [r for r in s.pending if r.offset is None]
        s.chains = {id(r.chain): r.chain for r in s.pending if r.chain}
        s.last_final = max(s.last_final, *(r.offset for r in done if r.offset is not None))
        upto = (s.pending[0].offset or s.next) - 1 if s.pending else s.next - 1
        s.settled = max(s.settled, upto)
        if marker and upto > s.marked:
            s.marked = upto
            s.buffer.append(Rec("f", upto, attempt=s.attempt))

    # -- writing -------------------------------------------------------------------------------

    def kick(self) -> None:
        if self.work and self.thread is not None:
            return  # the writer is already asked to run (it clears `work` under the lock, then writes)
        with self.cond:
            self.work = True
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="persistkit-streams", daemon=True)
                self.thread.start()
            self.cond.notify()

    def _loop(self) -> None:
        while True:
            with self.cond:
                if not self.work:
                    self.cond.wait(IDLE)
                if not self.work:
                    self.thread = None
                    return
                self.work = False
            time.sleep(LINGER)  # group what the next milliseconds emit into the same batch
            try:
                self.flush()
            except Exception as exc:  # kept: the commit's own flush raises it
                self.failure = exc
                time.sleep(0.05)

    def stop(self, *, drop: bool) -> None:
        """Stop writing (a crash test: ``drop`` loses what is buffered, as a killed process would)."""
        with self.lock:
            for s in self.streams.values():
                if drop:
                    s.buffer = []
                s.lost = s.lost or "stopped"

    def flush(self, hint: bool = False) -> None:
        """Write everything buffered, in order, stream by stream."""
        with self.io:
            if self.indexed is None:
                self._known_streams()
            with self.lock:
                work = [(s, s.buffer) for s in self.streams.values() if s.buffer or (hint and s.ready)]
                for s, _ in work:
                    s.buffer = []
            for i, (s, recs) in enumerate(work):
                try:
                    self._write(s, recs, hint)
                except BaseException:
                    with self.lock:
                        for t, rest in work[i + 1 :]:
                            t.buffer[:0] = rest
                    raise

    def _known_streams(self) -> None:
        """The thread's streams, which this run's earlier attempts (a continued run) or runs that
        died may have left unsettled: each is decided at the run's first write (its rewind
        written then), not only when the run next emits into it."""
        for name in sorted(self._index()):
            with self.lock:
                s = self.stream(name)
            if not s.ready:
                self._write(s, [], False)

    def _index(self) -> set[str]:
        if self.indexed is None:
            entry = self.store.call_sync(call("kv_get", F.INDEX, F.index_key(self.run.thread_id, self.run.namespace)))
            names = self.codec.unpack_tree(bytes(entry.value), "stream index") if entry is not None and entry.value else {}
            self.indexed = set(names.get("s") or ()) if isinstance(names, dict) else set()
            self._index_version = entry.version if entry is not None else 0
        return self.indexed

    def _register(self, name: str) -> None:
        """Add ``name`` to the thread's index of streams (once per thread and stream)."""
        for _ in range(20):
            names = self._index()
            if name in names:
                return
            tree = {"t": self.run.thread_id, "n": self.run.namespace, "s": sorted(names | {name})}
            op = KvOp(F.index_key(self.run.thread_id, self.run.namespace), self._index_version, self.codec.pack_tree(tree))
            try:
                self.store.call_sync(call("kv_write", F.INDEX, [op], keep=1))
                self.indexed = set(tree["s"])
                self._index_version += 1
                return
            except ConflictError:
                self.indexed = None
        raise ConflictError(f"the stream index of thread {self.run.thread_id!r} kept changing under this writer")

    def _write(self, s: _Stream, recs: list[Rec], hint: bool) -> None:
        if s.lost is not None:
            return
        try:
            self._write_all(s, recs, hint)
        except BaseException:
            with self.lock:  # what did not land is written by the next flush, in order
                s.buffer[:0] = [r for r in s.writing if r.offset is None]
            raise

    def _write_all(self, s: _Stream, recs: list[Rec], hint: bool) -> None:
        s.writing = recs
        if not s.ready:
            first = self._prepare(s)
            with self.lock:
                recs = s.writing = first + recs  # what deciding earlier attempts wrote goes first
                for r in [*recs, *s.buffer]:  # emitted before the stream's earlier attempts were counted
                    r.attempt = max(r.attempt, s.attempt)
        fence = self.run.lease.token if self.run.lease is not None else 0
        i = 0
        while i < len(recs):
            attempt = recs[i].attempt
            j = i
            while j < len(recs) and j - i < F.MAX_BATCH and recs[j].attempt == attempt:
                j += 1
            part = recs[i:j]
            data = F.pack_batch(self.codec, self.run.run_id, attempt, fence, [r.stored() for r in part])
            try:
                self.store.call_sync(call("kv_write", s.scope, [KvOp(F.batch_key(s.next), 0, data)], keep=1))
            except ConflictError:
                if self._overtaken(s, fence):
                    return
                continue  # the tail moved: write the same records after it
            with self.lock:
                for n, r in enumerate(part):
                    r.offset = s.next + n
                s.next += len(part)
            s.since_hint += 1
            i = j
        if hint or s.since_hint >= HINT_EVERY:
            self._hint(s)

    def _overtaken(self, s: _Stream, fence: int) -> bool:
        """Another writer took the offset: a newer holder of the thread's lease (this run is a
        zombie: it stops writing), or an older writer still finishing: move past it."""
        entry = self.store.call_sync(call("kv_get", s.scope, F.batch_key(s.next)))
        if entry is None:  # a tombstone: a prune trimmed that batch since this writer saw the tail
            if not self._tail(s):
                s.lost = "a prune trimmed the stream under this writer"
                log.warning("persistkit: stream %r of thread %r: %s; this run's events are dropped", s.name, self.run.thread_id, s.lost)
                return True
            return False
        batch = F.load_batch(self.codec, entry.key, entry.value, f"stream {s.name!r}")
        if fence and batch.fence > fence:
            s.lost = f"run {batch.run_id} holds the thread now (lease token {batch.fence})"
            log.warning("persistkit: stream %r of thread %r: %s; this run's events are dropped", s.name, self.run.thread_id, s.lost)
            return True
        s.next = batch.end
        self._tail(s)
        return False

    def _hint(self, s: _Stream) -> None:
        tree = {"t": max(1, s.next - 1), "s": s.settled, "id": [self.run.thread_id, self.run.namespace, s.name]}
        try:
            self.store.call_sync(call("kv_write", s.scope, [KvOp(F.META, s.meta_version, self.codec.pack_tree(tree))], keep=1))
            s.meta_version += 1
        except ConflictError:
            entry = self.store.call_sync(call("kv_get", s.scope, F.META))
            s.meta_version = entry.version if entry is not None else 0
        s.since_hint = 0

    def _tail(self, s: _Stream) -> list[F.Batch]:
        """The batches from ``s.next`` on (normally none): ``s.next`` becomes the tail."""
        entries = self.store.call_sync(call("kv_list", s.scope, prefix="b", after=F.batch_key(s.next - 1)))
        batches = [F.load_batch(self.codec, e.key, e.value, f"stream {s.name!r}") for e in entries]
        if batches:
            s.next = max(s.next, batches[-1].end)
        return batches

    def _prepare(self, s: _Stream) -> list[Rec]:
        """Find the stream's tail, and decide what was left unsettled there: by this run's
        earlier attempts (from its records) or by runs that ended or died (from their status)."""
        self._register(s.name)
        meta = self.store.call_sync(call("kv_get", s.scope, F.META))
        start, settled = 1, 0
        if meta is not None and meta.value is not None:
            s.meta_version = meta.version
            hint = self.codec.unpack_tree(bytes(meta.value), f"stream {s.name!r} hint")
            settled = int(hint.get("s") or 0)
            start = max(1, min(int(hint.get("t") or 1), settled + 1) - F.MAX_BATCH + 1)
        s.next = start
        batches = self._tail(s)
        unsettled: list[tuple[int, str, list[Any]]] = []
        mine = 0
        for b in batches:
            if b.run_id == self.run.run_id:
                mine = max(mine, b.attempt)
            for n, rec in enumerate(b.records):
                off = b.start + n
                kind = rec[0]
                if kind == "f":
                    settled = max(settled, int(rec[4]))
                elif kind == "w" or (kind == "x" and rec[4] == "completed"):
                    settled = off
                elif kind == "e":
                    unsettled.append((off, b.run_id, rec))
        unsettled = [u for u in unsettled if u[0] > settled]
        s.touched = s.touched or mine > 0
        s.settled = settled
        s.attempt = mine + 1 if mine else 1
        s.ready = True
        if not unsettled:
            s.last_final = settled
            return []
        final, dead = self._decide_left(unsettled)
        standing = [o for o in final if not dead or o < min(dead)]
        to = max([settled, *standing])
        recs: list[Rec] = []
        if dead:
            s.touched = True
            recs.append(Rec("w", to, attempt=s.attempt))
            for off, _run, rec in unsettled:
                if off > min(dead) and off in final:  # final, but after one taken back: sent again
                    c = Rec("e", rec[4], rec[2], rec[3], (), s.attempt)
                    c.copy, c.at = off, rec[1]
                    recs.append(c)
        elif final:
            recs.append(Rec("f", s.next - 1, attempt=s.attempt))
        s.last_final = s.marked = to
        return recs

    def _decide_left(self, unsettled: list[tuple[int, str, list[Any]]]) -> tuple[set[int], list[int]]:
        """The offsets of events left unsettled that are final, and those that are superseded."""
        final: set[int] = set()
        dead: list[int] = []
        status: dict[str, str | None] = {}
        for off, run_id, rec in unsettled:
            if run_id == self.run.run_id:
                cover, replays = self.resumed if self.resumed is not None else (Cover(), frozenset())
                ok = is_final(str(rec[2]), int(rec[3]), cover, replays.__contains__)
            else:
                if run_id not in status:
                    status[run_id] = self._status(run_id)
                ok = status[run_id] == "completed"
            if ok:
                final.add(off)
            else:
                dead.append(off)
        return final, dead

    def _status(self, run_id: str) -> str | None:
        rows = self.store.call_sync(call("list", self.run.thread_id, self.run.namespace, run_id=run_id, limit=1))
        return Record.decode(self.codec, rows[0]).run_status if rows else None


def opened(run: Any) -> None:
    """A continued run opened: if its records say it emitted (``st``, attached to the record
    after its first emit), it decides what its earlier attempts left at its first write. A run
    that emitted but committed nothing since needs no records to decide: every event it left is
    superseded, which its next emit (or the next run's) finds. Nothing happens on a store without
    ``kv``, nor for a run that never emitted (no read, nothing per step)."""
    end = run._failed_end
    if run.replay_only or not (
        any("st" in rec.body for rec in run._index.values()) or (end is not None and "st" in end.body)
    ):
        return
    if not run.store.backend.supports_kv:
        return
    replays = replays_in(run)
    keep = frozenset(pos for pos in run._index if replays(pos))
    run._streams = RunStreams(run, (Cover.of(run._index, run._max_child), keep))


#: stream names checked once (the per-emit path)
_NAMES: dict[str, str] = {"default": "default"}


def emit_in(frame: Any, event: Any, stream: str) -> None:
    """``pk.emit`` inside a run: ``frame`` is the engine's frame where it is called."""
    name = stream
    if name not in _NAMES:
        F.check_stream(name)
        if len(_NAMES) < 1024:
            _NAMES[name] = name
    run = frame.run
    if run.replay_only:
        return  # a completed run replayed by its run_id writes nothing
    st: RunStreams | None = run._streams
    if st is None:
        require(run.store.backend, "kv", "pk.emit (durable streams)")
        st = run._streams = RunStreams(run, None)
    if st.cover.covers(frame.path, started(frame)):
        return  # replayed code: the earlier attempt's event stands (docs/streams.md)
    if st.failure is not None:
        failure, st.failure = st.failure, None
        raise failure
    tree = run.codec.encode(event, f"event of stream {name!r}")
    st.add(frame, name, tree)
