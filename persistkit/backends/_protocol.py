"""The store protocol: the few byte-level primitives every backend implements.

Backends store bytes. They never see Python values, state classes or the
codec: serialization, compression, redaction and encryption all happen above
them (see ``persistkit/codec/_pipeline.py``). A backend only has to get these right:

* ``write`` — one checkpoint row, the blobs it references, and the thread
  head's compare-and-swap, all in ONE atomic write. Either all of it is
  durable or none of it is.
* reads — the head, one row, a page of rows (newest first), blobs by key or
  by key range.
* threads — list (by prefix, paginated) and delete; the namespaces of a thread.
* maintenance — ``rewrite`` replaces the payload bytes of existing rows and
  blobs. It is used by key rotation only (never on the step path) and is the
  ONE exception to "rows are never overwritten": it changes how a record is
  sealed, never which record it is (ids, parent and run links stay).

Every method has an async twin named with an ``a`` prefix. A backend whose
driver has native async overrides them (and sets ``native_async = True``);
the others inherit :class:`ThreadedAsync`, which runs the sync method in a
worker thread.

The conformance suite in :mod:`persistkit.testing` checks all of this; a
third-party backend passes it before it is trusted with anyone's agent.

Concepts
--------
thread_id
    Non-empty ``str`` (any unicode except NUL, at most 512 characters; the
    layer above validates). Backends must not assume ASCII.
namespace
    ``str``, ``""`` by default. Heads and checkpoint rows are keyed by
    ``(thread_id, namespace)``; blobs and deletion are per thread.
checkpoint_id
    A ``str`` that sorts in time order within a thread (the layer above makes
    each new id sort after its parent's). ``list`` orders by it.
version
    The head's version: 0 means "no head yet"; every successful ``write``
    moves it from ``expected_version`` to ``expected_version + 1``.
blob key
    A ``str`` of printable ASCII (``[0-9A-Za-z:._~%-]``), unique within a
    thread. Blobs are content-addressed or otherwise immutable: writing a key
    that exists must keep the existing bytes and must not fail.

Optional capabilities
---------------------
A store declares what it has beyond the required methods in ``capabilities``
(names in ``persistkit.backends._capabilities``); the conformance suite checks the
declaration against the methods the store overrides and runs one suite per
capability. ``leases``/``fencing``: the lease record and the fenced head write.
``kv``: a versioned key-value space per scope (``kv_*``), what ``store.board()``
builds on. ``watch``: hints that keys of a scope changed (``watch_open``), pushed
where the store can; without it the board polls ``kv_list``. ``prune``: deleting
single rows and blobs for retention (``prune_rows``, ``delete_blobs``, ``blob_sizes``;
see ``_prune.py``).

kv scope
    A ``str`` of ``[A-Za-z0-9_.-]``, 1 to 64 characters (the layer above validates):
    one independent space of keys. Scopes never see each other's keys.
kv key
    A non-empty ``str`` of any unicode except NUL, at most 1024 characters; listed
    in code-point order (UTF-8 byte order is the same order).
kv version
    Every write of a key (a delete included) makes the next version: 1, 2, 3, ...
    Versions never go back, so a delete leaves a tombstone (``value is None``) that
    keeps the key's latest version. The newest ``keep`` versions of each key stay
    readable (``kv_get(version=)``, ``kv_history``); older ones are removed by the
    write that pushes them out.
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, ParamSpec, TypeVar

from .._errors import AccessDeniedError, ConfigurationError
from ._prune import PrunePrimitives

__all__ = [
    "RESERVED_THREAD",
    "Backend",
    "CheckpointRow",
    "ForwardLeases",
    "Head",
    "KvEntry",
    "KvHint",
    "KvOp",
    "KvWatch",
    "LeaseRecord",
    "ThreadedAsync",
]

#: Thread ids that start with this are the store's own, kept beside the users' threads
#: without a head (so ``threads()`` never lists them, and retention never prunes them): the
#: handle key of detected secrets (``secrets._handlekey``), offloaded kv values
#: (``wrappers._offload``).
RESERVED_THREAD = "__persistkit__"


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    """One stored checkpoint. ``payload`` is opaque bytes produced by the codec."""

    thread_id: str
    namespace: str
    checkpoint_id: str
    parent_id: str | None
    run_id: str | None
    payload: bytes


@dataclass(frozen=True, slots=True)
class Head:
    """The latest checkpoint of ``(thread_id, namespace)`` and the head's version."""

    checkpoint_id: str
    version: int


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The lease of ``(thread_id, namespace)`` as the store keeps it (see ``Backend.lease_swap``).

    ``token`` is the fencing token a fenced write is checked against; ``data``
    is opaque to the store (owner, expiry and waiters: ``persistkit.coordination``);
    ``version`` counts successful swaps (the compare-and-swap's version, 0 = none).
    """

    token: int
    data: bytes
    version: int


@dataclass(frozen=True, slots=True)
class KvEntry:
    """One version of a key of a kv scope. ``value is None``: the key was deleted at ``version``."""

    key: str
    version: int
    value: bytes | None


@dataclass(frozen=True, slots=True)
class KvOp:
    """One write of ``Backend.kv_write``: ``key`` goes from version ``expected`` to ``expected + 1``.

    ``expected`` is the key's latest version, a tombstone's included (0: the key was never
    written, or its scope was dropped). ``value is None`` deletes (writes a tombstone).
    """

    key: str
    expected: int
    value: bytes | None


@dataclass(frozen=True, slots=True)
class KvHint:
    """A hint from a watch: ``key`` of the watched scope reached ``version``.

    ``key is None``: anything may have changed (a poll saw the store move, or the watch
    reconnected and hints may have been lost): the reader lists the scope again. A hint
    is never the data; the reader reads the key.
    """

    key: str | None
    version: int = 0


class KvWatch(abc.ABC):
    """An open watch on one kv scope (``Backend.watch_open``); close it when done."""

    @abc.abstractmethod
    def hints(self, timeout: float) -> builtins.list[KvHint]:
        """Block up to ``timeout`` seconds for hints of writes committed after the watch
        opened; return them (possibly coalesced, in any order), or ``[]`` on timeout.
        After a dropped connection the next call reconnects and returns ``[KvHint(None)]``
        first. Raises ``StoreClosedError`` once closed."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop watching and release the connection. Idempotent."""

    async def ahints(self, timeout: float) -> builtins.list[KvHint]:
        """``hints`` for async callers; the default waits in a worker thread."""
        return await _in_thread(self.hints, timeout)

    async def aclose(self) -> None:
        await _in_thread(self.close)


# A frozen dataclass's __init__ sets each field through object.__setattr__, which
# costs ~1,500 instructions a field; one row and one head are made on every step.
# These drafts have the same slots and become the frozen class in place (a
# __class__ assignment CPython allows between types of identical layout): the
# same objects, at 40% of the cost.
class _RowDraft:
    __slots__ = ("checkpoint_id", "namespace", "parent_id", "payload", "run_id", "thread_id")


class _HeadDraft:
    __slots__ = ("checkpoint_id", "version")


_new = object.__new__


def new_row(
    thread_id: str, namespace: str, checkpoint_id: str, parent_id: str | None, run_id: str | None, payload: bytes
) -> CheckpointRow:
    """``CheckpointRow(...)`` for the per-step path."""
    row: Any = _new(_RowDraft)
    row.thread_id = thread_id
    row.namespace = namespace
    row.checkpoint_id = checkpoint_id
    row.parent_id = parent_id
    row.run_id = run_id
    row.payload = payload
    row.__class__ = CheckpointRow
    return row  # type: ignore[no-any-return]


def new_head(checkpoint_id: str, version: int) -> Head:
    """``Head(...)`` for the per-step path."""
    head: Any = _new(_HeadDraft)
    head.checkpoint_id = checkpoint_id
    head.version = version
    head.__class__ = Head
    return head  # type: ignore[no-any-return]


class Backend(PrunePrimitives, abc.ABC):
    """Byte-level storage for checkpoints, blobs and thread heads."""

    #: URL scheme(s) this backend is registered under, e.g. ``("sqlite",)``.
    schemes: ClassVar[tuple[str, ...]] = ()
    #: True when the ``a*`` methods use the driver's own async API.
    native_async: ClassVar[bool] = False
    #: True when a ``write`` that raises ``ConflictError`` leaves no new blob behind.
    #: Stores without multi-object transactions (S3) write blobs before the head
    #: and set this to False: the loser's new blobs stay, unreferenced (they are
    #: never deleted there, since a concurrent writer may already reference them).
    atomic_blobs: ClassVar[bool] = True
    #: True when ``rewrite`` replaces stored bytes (key rotation needs it). A
    #: wrapper whose records cannot change in place (the integrity chain) sets False.
    supports_rewrite: ClassVar[bool] = True

    #: The optional capabilities this store implements, by name ("fencing", "leases",
    #: "kv", "watch"; see ``persistkit.backends._capabilities``). The conformance suite
    #: fails a store whose declaration and overridden methods disagree.
    capabilities: ClassVar[frozenset[str]] = frozenset()

    #: The URL the backend was opened from, with any password masked.
    url: str = ""

    @classmethod
    @abc.abstractmethod
    def from_url(cls, url: str, **options: Any) -> Backend:
        """Open the backend named by ``url``. Unknown options raise ``ConfigurationError``."""

    # -- writes --------------------------------------------------------------

    @abc.abstractmethod
    def write(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int) -> Head:
        """Atomically store ``blobs`` and ``row`` and move the head of
        ``(row.thread_id, row.namespace)`` from ``expected_version`` to
        ``expected_version + 1``, pointing at ``row.checkpoint_id``.

        Blob keys that already exist for the thread keep their bytes.
        ``expected_version == 0`` means the head must not exist yet.
        If the head's current version is not ``expected_version``, raise
        ``ConflictError(thread_id=..., namespace=..., expected=...,
        found=<current version or 0>, found_checkpoint=<current head id>)``
        and write nothing visible (no row, no head change; no blob either
        unless ``atomic_blobs`` is False). A row whose ``checkpoint_id`` already exists
        for ``(thread_id, namespace)`` raises ``BackendError`` and writes
        nothing: ids are never reused, rows are never overwritten.
        Returns the new head.
        """

    @abc.abstractmethod
    def put_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        """Store blobs outside a checkpoint write (idempotent; existing keys are kept)."""

    # -- reads ---------------------------------------------------------------

    @abc.abstractmethod
    def head(self, thread_id: str, namespace: str) -> Head | None:
        """The head of ``(thread_id, namespace)``, or ``None`` if there is none."""

    @abc.abstractmethod
    def get(self, thread_id: str, namespace: str, checkpoint_id: str) -> CheckpointRow | None:
        """One checkpoint row, or ``None``."""

    def head_row(self, thread_id: str, namespace: str) -> tuple[Head, CheckpointRow] | None:
        """The head of ``(thread_id, namespace)`` and its row, or ``None`` if there is no head.

        What opening a run reads first. Not abstract: the default is ``head`` then ``get``
        (two round trips; the head's row never changes, so the pair is consistent unless
        the thread is deleted in between, and then this returns None). A store that can
        read both in one statement overrides it.
        """
        head = self.head(thread_id, namespace)
        row = self.get(thread_id, namespace, head.checkpoint_id) if head is not None else None
        return (head, row) if head is not None and row is not None else None

    @abc.abstractmethod
    def list(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[CheckpointRow]:
        """Rows of ``(thread_id, namespace)``, newest first (``checkpoint_id``
        descending), only those with ``checkpoint_id < before`` when given,
        only those of ``run_id`` when given, at most ``limit`` when given."""

    @abc.abstractmethod
    def get_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        """The blobs of ``thread_id`` with these keys; missing keys are absent."""

    @abc.abstractmethod
    def scan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        """All blobs of ``thread_id`` whose key ``k`` has ``start <= k < stop``
        (plain code-point order of ASCII keys)."""

    @abc.abstractmethod
    def threads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        """Thread ids that have at least one head, ascending, starting with
        ``prefix``, only those ``> after`` when given, at most ``limit``."""

    def namespaces(self, thread_id: str) -> builtins.list[str]:
        """The namespaces that have a head or rows for ``thread_id``, sorted (code-point order).

        Not abstract, so that third-party backends written before it keep
        working; the default raises ``ConfigurationError``.
        """
        raise _missing(self, "namespaces")

    # -- maintenance -----------------------------------------------------------

    def rewrite(
        self, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]
    ) -> None:
        """Replace the payload bytes of EXISTING rows and the bytes of EXISTING blobs.

        Rows are matched by ``(thread_id, namespace, checkpoint_id)``; only their
        ``payload`` changes (stored ``parent_id`` and ``run_id`` stay as they are).
        Blobs are matched by key within ``thread_id``. Rows and keys that do not
        exist are skipped, never created; the head does not move. Each call is
        atomic where the store has transactions.

        This is the one exception to "rows are never overwritten", and it exists
        for key rotation only: the caller guarantees the new bytes decode to the
        same value as the old ones. Never used on the step path. Not abstract;
        the default raises ``ConfigurationError``.
        """
        raise _missing(self, "rewrite")

    # -- deletion and lifecycle ----------------------------------------------

    @abc.abstractmethod
    def delete_thread(self, thread_id: str) -> bool:
        """Remove every row, blob and head of ``thread_id`` (all namespaces).
        Returns whether anything existed."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections. Idempotent. Later calls raise ``StoreClosedError``."""

    # -- leases (persistkit.coordination) ---------------------------------------
    # Not abstract, so third-party stores written before leases keep working
    # without them (resume() then runs without a lease unless busy= asks for one).

    @property
    def supports_leases(self) -> bool:
        """Whether this store implements the lease primitives below (wrappers ask their inner store)."""
        return type(self).lease_swap is not Backend.lease_swap

    def lease_get(self, thread_id: str, namespace: str) -> LeaseRecord | None:
        """The lease record of ``(thread_id, namespace)``, or None if it never had one."""
        raise _missing(self, "lease_get", _LEASES)

    def lease_swap(self, thread_id: str, namespace: str, expected: int, token: int, data: bytes) -> bool:
        """Compare-and-swap the lease record: if its version is ``expected`` (0: no record
        yet), store ``token`` and ``data`` with version ``expected + 1`` and return True;
        otherwise change nothing and return False. Atomic; records are never deleted
        (tokens must keep increasing across holders, even after ``delete_thread``)."""
        raise _missing(self, "lease_swap", _LEASES)

    def lease_list(self, *, prefix: str = "") -> builtins.list[tuple[str, str, LeaseRecord]]:
        """Every ``(thread_id, namespace, record)`` whose thread id starts with ``prefix``."""
        raise _missing(self, "lease_list", _LEASES)

    def write_fenced(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int
    ) -> Head:
        """``write``, refused unless the lease token of ``(row.thread_id, row.namespace)`` is
        ``fence``, checked in the SAME atomic operation that moves the head: a stale token
        raises ``LeaseLostError(thread_id=, namespace=, token=fence, found=<current token>)``
        and writes nothing (a wrong version is still a ``ConflictError``)."""
        raise _missing(self, "write_fenced", _LEASES)

    def write_fenced_swap(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int,
        lease_version: int, lease_data: bytes,
    ) -> tuple[Head, bool]:
        """``write_fenced``, then ``lease_swap(row.thread_id, row.namespace, lease_version, fence,
        lease_data)``: a run's end record that gives its lease up with it. Returns the new head
        and whether the swap happened.

        The write is exactly ``write_fenced`` (it raises as that does, and then swaps nothing).
        The swap is a compare-and-swap as ``lease_swap``: it may fail (the record changed since
        ``lease_version``) while the write stands; the caller then releases the usual way. Not
        abstract: the default makes the two calls (two round trips); a store that can do both
        in one atomic operation overrides it (PostgreSQL: one statement).
        """
        head = self.write_fenced(row, blobs, expected_version, fence)
        return head, self.lease_swap(row.thread_id, row.namespace, lease_version, fence, lease_data)

    # -- kv: a versioned key-value space per scope (store.board()) -----------------
    # Not abstract: a store without them still passes the required suites; the board
    # then refuses to open with a ConfigurationError naming the capability.

    @property
    def supports_kv(self) -> bool:
        """Whether this store implements the kv primitives (wrappers ask their inner store)."""
        return type(self).kv_write is not Backend.kv_write

    @property
    def supports_watch(self) -> bool:
        """Whether this store pushes (or cheaply polls) hints of kv writes (``watch_open``)."""
        return type(self).watch_open is not Backend.watch_open

    def kv_get(self, scope: str, key: str, version: int | None = None) -> KvEntry | None:
        """The latest version of ``key`` (a tombstone included), or ``version`` of it if that
        version is still kept; ``None`` when there is none."""
        raise _missing(self, "kv_get", _KV)

    def kv_history(
        self, scope: str, key: str, *, before: int | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        """The kept versions of ``key``, newest first (tombstones included), only those with
        ``version < before`` when given, at most ``limit`` when given."""
        raise _missing(self, "kv_history", _KV)

    def kv_list(
        self, scope: str, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        """The latest version of every key that is not deleted, whose key starts with
        ``prefix``, only keys ``> after`` when given, in code-point order of the keys, at
        most ``limit`` when given (tombstones are skipped, not counted)."""
        raise _missing(self, "kv_list", _KV)

    def kv_write(self, scope: str, ops: Sequence[KvOp], *, keep: int) -> None:
        """Apply ``ops`` (distinct keys) atomically: every key moves from ``op.expected`` to
        ``op.expected + 1`` (storing ``op.value``, or a tombstone for ``None``), or nothing
        changes. A key whose latest version is not ``op.expected`` raises
        ``ConflictError(key=, namespace=scope, expected=, found=<latest version or 0>)``
        for the first such op, and nothing is written. Versions of a written key older than
        its newest ``keep`` (``keep >= 1``) are removed in the same write. Keys of every
        watch open on the scope get a hint once the write is committed (``watch`` stores)."""
        raise _missing(self, "kv_write", _KV)

    def kv_drop(self, scope: str) -> bool:
        """Remove every key and version of ``scope``; whether anything existed."""
        raise _missing(self, "kv_drop", _KV)

    def watch_open(self, scope: str) -> KvWatch:
        """Start watching ``scope``: the watch's ``hints`` returns hints of kv writes
        committed after this call, in this process and in others (see ``KvWatch``)."""
        raise _missing(self, "watch_open", _KV)

    def kv_denied(self, scope: str, key: str, operation: str, *, prefix: bool = False) -> AccessDeniedError | None:
        """Asked after a delete found no ``key`` (or a claim no item under the prefix ``key``):
        the ``AccessDeniedError`` to raise when the store's own access rules hide it from this
        connection (PostgreSQL row-level security), None when it is simply not there (the default)."""
        return None

    async def akv_denied(self, scope: str, key: str, operation: str, *, prefix: bool = False) -> AccessDeniedError | None:
        return self.kv_denied(scope, key, operation, prefix=prefix)

    async def akv_get(self, scope: str, key: str, version: int | None = None) -> KvEntry | None:
        return await _in_thread(self.kv_get, scope, key, version)

    async def akv_history(
        self, scope: str, key: str, *, before: int | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        return await _in_thread(self.kv_history, scope, key, before=before, limit=limit)

    async def akv_list(
        self, scope: str, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        return await _in_thread(self.kv_list, scope, prefix=prefix, after=after, limit=limit)

    async def akv_write(self, scope: str, ops: Sequence[KvOp], *, keep: int) -> None:
        await _in_thread(self.kv_write, scope, ops, keep=keep)

    async def akv_drop(self, scope: str) -> bool:
        return await _in_thread(self.kv_drop, scope)

    async def awatch_open(self, scope: str) -> KvWatch:
        return await _in_thread(self.watch_open, scope)

    # -- async twins (overridden by native-async backends) -------------------

    async def awrite(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int
    ) -> Head:
        raise NotImplementedError

    async def aput_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        raise NotImplementedError

    async def ahead(self, thread_id: str, namespace: str) -> Head | None:
        raise NotImplementedError

    async def aget(
        self, thread_id: str, namespace: str, checkpoint_id: str
    ) -> CheckpointRow | None:
        raise NotImplementedError

    async def alist(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[CheckpointRow]:
        raise NotImplementedError

    async def aget_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        raise NotImplementedError

    async def ascan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        raise NotImplementedError

    async def athreads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        raise NotImplementedError

    async def adelete_thread(self, thread_id: str) -> bool:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def ahead_row(self, thread_id: str, namespace: str) -> tuple[Head, CheckpointRow] | None:
        head = await self.ahead(thread_id, namespace)
        row = await self.aget(thread_id, namespace, head.checkpoint_id) if head is not None else None
        return (head, row) if head is not None and row is not None else None

    # Not abstract: by default the sync method runs in a worker thread.
    async def anamespaces(self, thread_id: str) -> builtins.list[str]:
        return await _in_thread(self.namespaces, thread_id)

    async def arewrite(
        self, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]
    ) -> None:
        await _in_thread(self.rewrite, thread_id, rows, blobs)

    async def alease_get(self, thread_id: str, namespace: str) -> LeaseRecord | None:
        return await _in_thread(self.lease_get, thread_id, namespace)

    async def alease_swap(self, thread_id: str, namespace: str, expected: int, token: int, data: bytes) -> bool:
        return await _in_thread(self.lease_swap, thread_id, namespace, expected, token, data)

    async def alease_list(self, *, prefix: str = "") -> builtins.list[tuple[str, str, LeaseRecord]]:
        return await _in_thread(self.lease_list, prefix=prefix)

    async def awrite_fenced(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int
    ) -> Head:
        return await _in_thread(self.write_fenced, row, blobs, expected_version, fence)

    async def awrite_fenced_swap(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int,
        lease_version: int, lease_data: bytes,
    ) -> tuple[Head, bool]:
        head = await self.awrite_fenced(row, blobs, expected_version, fence)
        return head, await self.alease_swap(row.thread_id, row.namespace, lease_version, fence, lease_data)


_MAINTENANCE = "key rotation and store-wide maintenance need; implement it (see persistkit.backends.Backend) or rotate on a store that has it"
_LEASES = (
    "leases (pk.resume(..., busy=...)) need; implement the lease primitives (see "
    "persistkit.backends.Backend and persistkit.testing) or run without a lease: busy=None"
)

_KV = (
    "the shared space (store.board()) needs; implement the kv primitives (see "
    "persistkit.backends.Backend and persistkit.testing.kv_suite) or open the board on a store "
    "that has them: memory, sqlite, postgresql, redis, s3, dynamodb"
)


def _missing(backend: Backend, method: str, needed_by: str = _MAINTENANCE) -> ConfigurationError:
    return ConfigurationError(
        f"the store {type(backend).__name__} ({backend.url or 'no URL'}) does not implement "
        f"{method}(), which {needed_by}"
    )


P = ParamSpec("P")
T = TypeVar("T")


async def _in_thread(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    import asyncio  # here, so that sync-only programs never import asyncio

    return await asyncio.to_thread(fn, *args, **kwargs)


class ThreadedAsync(Backend):
    """Async twins that delegate to the sync methods in a worker thread.

    For backends whose driver has no async API (SQLite, boto3) or needs none
    (memory). The sync method is the single implementation.
    """

    native_async: ClassVar[bool] = False

    async def awrite(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int
    ) -> Head:
        return await _in_thread(self.write, row, blobs, expected_version)

    async def aput_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        await _in_thread(self.put_blobs, thread_id, blobs)

    async def ahead(self, thread_id: str, namespace: str) -> Head | None:
        return await _in_thread(self.head, thread_id, namespace)

    async def aget(
        self, thread_id: str, namespace: str, checkpoint_id: str
    ) -> CheckpointRow | None:
        return await _in_thread(self.get, thread_id, namespace, checkpoint_id)

    async def ahead_row(self, thread_id: str, namespace: str) -> tuple[Head, CheckpointRow] | None:
        return await _in_thread(self.head_row, thread_id, namespace)

    async def alist(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[CheckpointRow]:
        return await _in_thread(
            self.list, thread_id, namespace, run_id=run_id, before=before, limit=limit
        )

    async def aget_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        return await _in_thread(self.get_blobs, thread_id, keys)

    async def ascan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        return await _in_thread(self.scan_blobs, thread_id, start, stop)

    async def athreads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        return await _in_thread(self.threads, prefix=prefix, after=after, limit=limit)

    async def adelete_thread(self, thread_id: str) -> bool:
        return await _in_thread(self.delete_thread, thread_id)

    async def aclose(self) -> None:
        await _in_thread(self.close)

    async def aprune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        return await _in_thread(self.prune_rows, thread_id, namespace, checkpoint_ids)

    async def adelete_blobs(self, thread_id: str, keys: Sequence[str]) -> int:
        return await _in_thread(self.delete_blobs, thread_id, keys)

    async def ablob_sizes(self, thread_id: str) -> dict[str, int]:
        return await _in_thread(self.blob_sizes, thread_id)


class ForwardLeases(Backend):
    """Lease primitives of a wrapper (encryption, integrity, offload): its inner store's.

    Lease records hold no user data (holder, expiry, waiters), so they pass through
    unsealed; the wrapper's own ``write_fenced`` seals the row as its ``write`` does.
    """

    def lease_inner(self) -> Backend:
        inner: Backend = getattr(self, "inner")  # noqa: B009 - each wrapper names its inner store so
        return inner

    @property
    def supports_leases(self) -> bool:
        return self.lease_inner().supports_leases

    def lease_get(self, thread_id: str, namespace: str) -> LeaseRecord | None:
        return self.lease_inner().lease_get(thread_id, namespace)

    def lease_swap(self, thread_id: str, namespace: str, expected: int, token: int, data: bytes) -> bool:
        return self.lease_inner().lease_swap(thread_id, namespace, expected, token, data)

    def lease_list(self, *, prefix: str = "") -> builtins.list[tuple[str, str, LeaseRecord]]:
        return self.lease_inner().lease_list(prefix=prefix)

    async def alease_get(self, thread_id: str, namespace: str) -> LeaseRecord | None:
        return await self.lease_inner().alease_get(thread_id, namespace)

    async def alease_swap(self, thread_id: str, namespace: str, expected: int, token: int, data: bytes) -> bool:
        return await self.lease_inner().alease_swap(thread_id, namespace, expected, token, data)

    async def alease_list(self, *, prefix: str = "") -> builtins.list[tuple[str, str, LeaseRecord]]:
        return await self.lease_inner().alease_list(prefix=prefix)


class ForwardKv(Backend):
    """The kv and watch primitives of a wrapper that leaves values as they are: its inner store's.

    A wrapper that changes value bytes (encryption seals them, integrity tags them, offload
    moves big ones) overrides ``kv_get``, ``kv_history``, ``kv_list`` and ``kv_write``
    and keeps the rest.
    """

    def kv_inner(self) -> Backend:
        inner: Backend = getattr(self, "inner")  # noqa: B009 - each wrapper names its inner store so
        return inner

    @property
    def supports_kv(self) -> bool:
        return self.kv_inner().supports_kv

    @property
    def supports_watch(self) -> bool:
        return self.kv_inner().supports_watch

    def kv_get(self, scope: str, key: str, version: int | None = None) -> KvEntry | None:
        return self.kv_inner().kv_get(scope, key, version)

    def kv_history(
        self, scope: str, key: str, *, before: int | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        return self.kv_inner().kv_history(scope, key, before=before, limit=limit)

    def kv_list(
        self, scope: str, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        return self.kv_inner().kv_list(scope, prefix=prefix, after=after, limit=limit)

    def kv_write(self, scope: str, ops: Sequence[KvOp], *, keep: int) -> None:
        self.kv_inner().kv_write(scope, ops, keep=keep)

    def kv_drop(self, scope: str) -> bool:
        return self.kv_inner().kv_drop(scope)

    def watch_open(self, scope: str) -> KvWatch:
        return self.kv_inner().watch_open(scope)

    def kv_denied(self, scope: str, key: str, operation: str, *, prefix: bool = False) -> AccessDeniedError | None:
        return self.kv_inner().kv_denied(scope, key, operation, prefix=prefix)

    async def akv_denied(self, scope: str, key: str, operation: str, *, prefix: bool = False) -> AccessDeniedError | None:
        return await self.kv_inner().akv_denied(scope, key, operation, prefix=prefix)

    async def akv_get(self, scope: str, key: str, version: int | None = None) -> KvEntry | None:
        return await self.kv_inner().akv_get(scope, key, version)

    async def akv_history(
        self, scope: str, key: str, *, before: int | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        return await self.kv_inner().akv_history(scope, key, before=before, limit=limit)

    async def akv_list(
        self, scope: str, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        return await self.kv_inner().akv_list(scope, prefix=prefix, after=after, limit=limit)

    async def akv_write(self, scope: str, ops: Sequence[KvOp], *, keep: int) -> None:
        await self.kv_inner().akv_write(scope, ops, keep=keep)

    async def akv_drop(self, scope: str) -> bool:
        return await self.kv_inner().akv_drop(scope)

    async def awatch_open(self, scope: str) -> KvWatch:
        return await self.kv_inner().awatch_open(scope)
