"""A run: the replay cursor, the state it restores, and the checkpoints it commits.

Replay contract (DESIGN.md): steps are matched by position (call path +
sequence number). A recorded, completed step returns its recorded result —
and the run's state is set to the state committed with it — without running.
The first unrecorded position runs for real. A recorded failure is re-raised
(the caller handled it, as far as the records say, even when the process died
right after it); a failure that ended an attempt (it escaped the block, or a
retried parent in this block) runs again: that is what a retry is for (see
``_cursor.ReplayCursor._ended_attempt``) — except a step that ran but whose
result or state could not be stored (flag ``u``): it replays its error, since
its side effects happened, unless the run was opened with ``retry_failed=True``
(the cause is fixed: it runs as any failure).

Code between steps runs again on every attempt, so it must be deterministic
(like workflow code in Temporal): everything that talks to the world or the
clock belongs in a step.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from .._errors import (
    ConflictError,
    PersistkitError,
)
from ..backends import Head
from ..coordination._suspend import Question
from ..state._channels import Loader
from ..state._dedupe import Result
from ..state._records import Record
from ..state._spec import StateSpec
from ..state._tracker import Tracker
from ._commit import Commits
from ._cursor import RUNNING

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from .._io import Plan
    from .._retry import Retry
    from ..coordination import Lease
    from ..ops._telemetry import Observer


__all__ = ["Run", "StepEvent", "StepInfo"]


@dataclass(frozen=True, slots=True)
class StepInfo:
    """The step being executed (``pk.current_step()``).

    ``key`` is stable across retries, crashes and resumes of the same run and
    position: pass it as the idempotency key of external calls. A namespace other than the
    default one is part of it, so the same thread and run id in two namespaces (two
    tenants, two agents) never share a key.
    """

    thread_id: str
    run_id: str
    position: str
    name: str
    attempt: int
    namespace: str = ""

    @property
    def key(self) -> str:
        ns = f"\x00{self.namespace}" if self.namespace else ""  # "": the key as it always was
        raw = f"{self.thread_id}\x00{self.run_id}\x00{self.position}{ns}".encode()
        return "pk-" + hashlib.blake2b(raw, digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class StepEvent:
    """One step call of this run: whether it was replayed from the store or ran."""

    position: str
    name: str
    replayed: bool
    status: str


class Run(Commits):
    """One invocation on a thread. ``run.state`` is the working state; it is committed
    with every step. ``run.status`` is running, completed, failed, suspended, compensating or compensated."""

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
        self._moved_on: tuple[str, Head | None, str | None, str | None] | None = None  # see open()
        #: The run's own failed end record, when it is the thread's head as the run opens: an
        #: attempt that commits nothing and fails the same way writes nothing (see _commit).
        self._failed_end: Record | None = None
        self._lost: ConflictError | None = None  # what a commit of this run raised on a moved head
        self._index: dict[str, Record] = {}
        #: Positions this block committed that may be forgotten, by the position they are nested
        #: in ("" for top level): see ``_cursor._forget_settled``.
        self._settled: dict[str, list[str]] = {}
        self._max_child: dict[str, int] = {}
        self._escaped: set[str] = set()
        self._failures: dict[int, tuple[BaseException, str]] = {}
        #: Set when a recorded state could not be loaded (migration, schema): the run writes nothing more.
        self.load_error: PersistkitError | None = None
        #: Set once this run replayed a value older code stored in another shape (a state or
        #: class migration ran): arguments built from it cannot match the recorded digests.
        self.migrated = False
        self._head: Head | None = None
        self._loader = Loader(self.codec, thread_id, namespace, getattr(store, "_segments", None))
        self._tracker = Tracker(self.codec)
        self._lock = threading.Lock()
        self._alocks: dict[int, asyncio.Lock] = {}
        self._schema = spec.schema  # stamped on every checkpoint (orjson writes a tuple as an array)
        self._result: Result | None = None  # the head's result, which a list item may refer to
        self._result_raw: bytes | None = None  # the JSON bytes of the result being committed
        self._result_tree: Any = None  # and its tree (the row holds it inline, or a blob its redacted bytes)
        #: What a layer records with one step's own checkpoint, by the step's position
        #: (compensations, after-commit effects): merged into that step's record if it
        #: completes, dropped if it fails (see ``_commit._step_body``).
        self._marks: dict[str, dict[str, Any]] = {}
        #: What a layer records with the run's next checkpoint, whatever it is (patch
        #: markers, effects done): merged into the next row, kept until one lands.
        self._attach: dict[str, Any] = {}
        #: Patch ids decided in this block (pk.patched): the ids the run recorded, True from
        #: the start; each other id as first decided, so one block never answers it two ways.
        self._patches: dict[str, bool] = {}
        self._effects: dict[str, Any] = {}  # after-commit effects registered by running steps (engine/_outbox)
        self._pending: list[Any] = []  # effects committed but not done when the run opened (Pending)
        #: The run's stream writers (persistkit/streams), once it emits or continues: the commit
        #: path calls them before and after each write; None (the usual case) costs one test.
        self._streams: Any = None
        self.lease: Lease | None = None  # set by resume(): every write carries its fencing token
        #: Set by resume() when the block owns its lease: the end record gives it up with it.
        self.release_at_end = False
        #: Set by resume() when this run holds its own lease: open() raises Unfinished (and
        #: resume waits) rather than start on top of another turn's unfinished run.
        self.keeps_turns = False
        self._questions: list[Question] = []  # set when the run suspends (pk.suspend, pk.sleep)
        #: Set by resume() once the run is open: what reports its spans, metrics and DEBUG
        #: lines (ops/_telemetry), or None (off: the step path tests only this).
        self.observer: Observer | None = None
        #: Set by resume(): asked when one of this run's writes is refused by the head's
        #: compare-and-swap, for the error to raise instead of ``ConflictError`` (a plan; None:
        #: none). It is ``coordination._cancel.cancelled_under`` (a lease-less run that
        #: ``store.cancel`` ended meanwhile), given here because coordination sits above the engine.
        self.refused: Callable[[Any, ConflictError], Plan[Any]] | None = None
        #: ``pk.resume(busy="debounce")``: the messages of the burst this turn runs, in the order
        #: they were sent (this turn's own among them); None for other turns.
        self.messages: list[Any] | None = None
        #: ``busy="debounce"``: asked (a plan) when the run finds the thread's newest run unfinished
        #: and another turn's: raises ``pk.Debounced`` if another turn took this turn's message
        #: meanwhile (it need not wait for that run then). None for other turns.
        self.turn_check: Callable[[], Any] | None = None

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

    @property
    def suspended(self) -> list[Question]:
        """The open questions (or timer) the run waits on once ``status == "suspended"``."""
        return list(self._questions)
    def abort(self, reason: str | None = None) -> NoReturn:
        """Fail this run for good: raises ``pk.RunAbortedError`` (let it escape the block). The
        compensations of the completed steps then run (``pk.compensate``) before the run's end."""
        from ..coordination._saga import abort

        raise abort(self, reason)

    def update(self, **changes: Any) -> None:
        """Apply ``changes`` to ``run.state`` through each field's reducer (committed with the next checkpoint)."""
        self.spec.update(self.state, changes)

    def after_commit(self, fn: Callable[..., Any], /, *args: Any, retry: Retry | None = None, **kwargs: Any) -> None:
        """Run ``fn(*args, **kwargs)`` once the current step's checkpoint is durable (``pk.after_commit``)."""
        from ._outbox import after_commit_of

        after_commit_of(self, fn, args, kwargs, retry)
