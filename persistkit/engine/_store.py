"""The store: one durable backend plus the codec, with history and time travel on top.

Every operation is written once as a plan (see ``_io``) and exposed twice:
``store.history(...)`` blocks, ``await store.ahistory(...)`` does not.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._errors import (
    BackendUnavailableError,
    ConfigurationError,
    PersistkitError,
    StoreClosedError,
)
from .._io import Call, Plan, call, call_async, call_sync, checked, run_async, run_sync
from ..backends import Backend, CheckpointRow, Head, open_backend, split_connect_options
from ..codec._pipeline import COMPRESS_THRESHOLD, Codec
from ..codec._serde import Serializer
from ..codec._sizes import alarm
from ..coordination._inbox import drop_plan as drop_messages
from ..coordination._message_store import MessageStore
from ..coordination._outbox_store import OutboxStore
from ..coordination._suspend_store import SuspendStore
from ..ops._prune import RetentionStore
from ..secrets._redact import Redactor, Vault, scrub
from ..state._records import Checkpoint, Record
from ..state._segments import SegmentCache
from ..state._spec import StateSpec
from ..streams._store import StreamStore, drop_streams
from ..wrappers import stack
from ._heads import ANY_HEAD, AnyHead
from ._replay_check import ReplayCheckStore
from ._store_plans import StorePlans

if TYPE_CHECKING:
    from ..blackboard._space import Board
    from ..coordination import Lease, LeaseInfo
    from ..flow._limits import Limits
    from ..wrappers._encryption import RotationReport
    from ..wrappers._verify import IntegrityReport


__all__ = ["DEFAULT_URL", "Store", "connect", "default_store"]


#: Where ``pk.connect()`` keeps its data when neither a URL nor $PERSISTKIT_URL is given.
DEFAULT_URL = "sqlite:///.persistkit/persistkit.db"


MAX_ID_LENGTH = 512


def _plain_spec(state: Any, plain: bool) -> StateSpec:
    if plain and state is not None:
        raise ConfigurationError(
            "get_state(..., plain=True) reads the state as stored, without classes; it takes no "
            "state= (pass one or the other)"
        )
    return StateSpec(state)


def check_thread_id(thread_id: object, what: str = "thread_id") -> str:
    if not isinstance(thread_id, str):
        raise ConfigurationError(f"{what} must be a str, got {type(thread_id).__name__}")
    if not thread_id or not thread_id.strip():
        raise ConfigurationError(f"{what} must be a non-empty string, got {thread_id!r}")
    if "\x00" in thread_id:
        raise ConfigurationError(
            f"{what} must not contain a NUL character (\\x00), got {thread_id!r} "
            f"(NUL at position {thread_id.index(chr(0))}); PostgreSQL text and other stores' keys cannot hold it"
        )
    if len(thread_id) > MAX_ID_LENGTH:
        raise ConfigurationError(
            f"{what} must be at most {MAX_ID_LENGTH} characters, got {len(thread_id)} characters "
            f"(starting {thread_id[:40]!r})"
        )
    return thread_id


def check_namespace(namespace: object) -> str:
    if not isinstance(namespace, str):
        raise ConfigurationError(f"namespace must be a str, got {type(namespace).__name__}")
    if "\x00" in namespace:
        raise ConfigurationError(f"namespace must not contain a NUL character (\\x00), got {namespace!r}")
    if len(namespace) > MAX_ID_LENGTH:
        raise ConfigurationError(
            f"namespace must be at most {MAX_ID_LENGTH} characters, got {len(namespace)} characters"
        )
    return namespace


def _check_limit(limit: object) -> int | None:
    if limit is None:
        return None
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ConfigurationError(f"limit must be a positive int or None, got {limit!r}")
    return limit


class Store(SuspendStore, MessageStore, ReplayCheckStore, OutboxStore, RetentionStore, StreamStore, StorePlans):
    """A durable store. Open one with :func:`connect`; share it across threads and runs."""

    def __init__(self, backend: Backend, *, codec: Codec | None = None) -> None:
        if not isinstance(backend, Backend):
            raise ConfigurationError(f"Store needs a persistkit Backend, got {type(backend).__name__}")
        self.backend = backend
        self.codec = codec or Codec()
        self.codec.redactor.attach(backend)  # the store's handle key names detected secrets' handles
        self._closed = False
        self._boards: dict[str, Board] = {}
        self._lock = threading.Lock()
        #: The list segments runs read, kept across turns (state/_segments.py)
        self._segments = SegmentCache()

    @property
    def url(self) -> str:
        return self.backend.url

    def __repr__(self) -> str:
        return scrub(f"<persistkit.Store {self.url}>")

    # -- plumbing -----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.url} is closed; open a new one with pk.connect(...)")

    def run_sync(self, plan: Plan[Any]) -> Any:
        self._check_open()
        return run_sync(self.backend, plan)

    async def run_async(self, plan: Plan[Any]) -> Any:
        self._check_open()
        return await run_async(self.backend, plan)

    def call_sync(self, req: Call) -> Any:
        """One backend call, with the plans' error mapping and transient retries."""
        self._check_open()
        return call_sync(self.backend, req)

    async def call_async(self, req: Call) -> Any:
        self._check_open()
        return await call_async(self.backend, req)

    def write_sync(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected: int) -> Head:
        """``call_sync(Call("write", ...))`` for the per-step path: the first attempt
        calls the backend directly; a transient failure goes on in ``call_sync``,
        which resolves the ambiguous write before retrying it."""
        if self._closed:
            self._check_open()
        try:
            return self.backend.write(row, blobs, expected)
        except BackendUnavailableError as exc:
            return call_sync(self.backend, Call("write", (row, blobs, expected)), exc)  # type: ignore[no-any-return]
        except PersistkitError:
            raise
        except Exception as exc:  # a backend that let a driver error escape
            raise checked("write", exc) from exc

    async def write_async(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected: int) -> Head:
        if self._closed:
            self._check_open()
        try:
            return await self.backend.awrite(row, blobs, expected)
        except BackendUnavailableError as exc:
            return await call_async(self.backend, Call("write", (row, blobs, expected)), exc)  # type: ignore[no-any-return]
        except PersistkitError:
            raise
        except Exception as exc:
            raise checked("write", exc) from exc

    def write_fenced_sync(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected: int, lease: Lease) -> Head:
        """``write_sync`` carrying ``lease``'s fencing token (``Backend.write_fenced``); a lease
        the heartbeat found taken over raises its ``LeaseLostError`` without writing."""
        if lease.lost is not None:
            raise lease.lost
        if self._closed:
            self._check_open()
        try:
            return self.backend.write_fenced(row, blobs, expected, lease.token)
        except BackendUnavailableError as exc:
            req = Call("write_fenced", (row, blobs, expected, lease.token))
            return call_sync(self.backend, req, exc)  # type: ignore[no-any-return]
        except PersistkitError:
            raise
        except Exception as exc:
            raise checked("write_fenced", exc) from exc

    async def write_fenced_async(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected: int, lease: Lease
    ) -> Head:
        if lease.lost is not None:
            raise lease.lost
        if self._closed:
            self._check_open()
        try:
            return await self.backend.awrite_fenced(row, blobs, expected, lease.token)
        except BackendUnavailableError as exc:
            req = Call("write_fenced", (row, blobs, expected, lease.token))
            return await call_async(self.backend, req, exc)  # type: ignore[no-any-return]
        except PersistkitError:
            raise
        except Exception as exc:
            raise checked("write_fenced", exc) from exc

    def leases(self, *, prefix: str = "") -> list[LeaseInfo]:
        """Who holds which thread's lease: one ``pk.LeaseInfo`` per thread that ever had one."""
        from ..coordination._hooks import leases_sync

        self._check_open()
        return leases_sync(self, prefix)

    async def aleases(self, *, prefix: str = "") -> list[LeaseInfo]:
        from ..coordination._hooks import leases_async

        self._check_open()
        return await leases_async(self, prefix)

    def board(self, name: str = "default", *, history: int | None = None) -> Board:
        """The shared space ``name`` of this store (docs/shared-state.md): the same object
        for the same name, so policies set on it hold for every caller in this process.
        ``history``: versions kept per key (10 unless set; ``board.policy`` per prefix)."""
        from ..blackboard._entries import check_name
        from ..blackboard._space import Board

        self._check_open()
        with self._lock:
            found = self._boards.get(check_name(name))
            if found is None:
                found = self._boards[name] = Board(self, name)
        if history is not None:
            found.policy("", history=history)
        return found

    @property
    def limits(self) -> Limits:
        """The rate limits every process on this store shares (docs/flow-control.md):
        ``store.limits.set("openai", rate="500/min")``, then ``@pk.checkpointed(limit="openai")``."""
        from ..flow._limits import limits_of

        return limits_of(self)

    def close(self) -> None:
        """Close the backend. Idempotent."""
        if not self._closed:
            self._closed = True
            self.backend.close()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self.backend.aclose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- public API (sync) -----------------------------------------------------------

    def threads(self, *, prefix: str = "", after: str | None = None, limit: int | None = None) -> list[str]:
        """Thread ids in the store, ascending; filter by ``prefix``, page with ``after`` / ``limit``."""
        result: list[str] = self.run_sync(_threads_plan(prefix, after, limit))
        return result

    def history(
        self,
        thread_id: str,
        *,
        limit: int | None = None,
        before: str | None = None,
        run_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        namespace: str = "",
    ) -> list[Checkpoint]:
        """A thread's checkpoints, newest first. Page with ``before=<last checkpoint_id>``;
        filter by ``run_id`` and by ``metadata`` (every given key must be equal)."""
        check_thread_id(thread_id)
        result: list[Checkpoint] = self.run_sync(
            self._history(thread_id, check_namespace(namespace), _check_limit(limit), before, run_id, metadata)
        )
        return result

    def get_checkpoint(self, thread_id: str, checkpoint_id: str | None = None, *, namespace: str = "") -> Checkpoint:
        """One checkpoint (the head when ``checkpoint_id`` is None). ``NotFoundError`` if absent."""
        check_thread_id(thread_id)
        rec: Record = self.run_sync(self.read_record(thread_id, check_namespace(namespace), checkpoint_id))
        return rec.public(self.codec)

    def get_state(
        self,
        thread_id: str,
        checkpoint_id: str | None = None,
        *,
        state: Any = None,
        namespace: str = "",
        plain: bool = False,
    ) -> Any:
        """The state at a checkpoint (the head when ``checkpoint_id`` is None), as ``state``
        (a pk.State class, migrated) or as a dict. ``plain=True`` (dict state only): nested
        models and dataclasses as dicts of their stored fields, so reading needs none of
        their classes (tools, dashboards, a process that never ran the agent)."""
        check_thread_id(thread_id)
        spec = _plain_spec(state, plain)
        return self.run_sync(self._get_state(thread_id, checkpoint_id, spec, check_namespace(namespace), plain))

    def fork(
        self,
        thread_id: str,
        checkpoint_id: str | None = None,
        *,
        new_thread_id: str | None = None,
        update: Mapping[str, Any] | None = None,
        state: Any = None,
        metadata: Mapping[str, Any] | None = None,
        namespace: str = "",
    ) -> Checkpoint:
        """Start a new thread from a checkpoint (the head when None), with ``update`` applied
        through the state's reducers. The new thread records where it came from
        (``checkpoint.forked_from``). Returns its first checkpoint."""
        check_thread_id(thread_id)
        new_id = check_thread_id(new_thread_id, "new_thread_id") if new_thread_id is not None else _fresh_id(thread_id)
        result: Checkpoint = self.run_sync(
            self._fork(thread_id, checkpoint_id, new_id, update, StateSpec(state), check_namespace(namespace), metadata)
        )
        return result

    def update_state(
        self,
        thread_id: str,
        changes: Mapping[str, Any],
        *,
        state: Any = None,
        metadata: Mapping[str, Any] | None = None,
        namespace: str = "", expected_head: str | AnyHead | None = ANY_HEAD,
        run_id: str | None = None,
    ) -> Checkpoint:
        """Edit a thread's state outside a run: ``changes`` go through the reducers and are
        written as a new head checkpoint (compare-and-swap like any write); with ``expected_head``
        only if the head is still that checkpoint id (None: no head yet), else ``ConflictError``.
        ``run_id``: the run the checkpoint is recorded under (``history(run_id=)``), for a loop
        that is not a ``pk.resume`` block (LangGraph's turns); like a run id, never redacted."""
        check_thread_id(thread_id)
        if run_id is not None:
            check_thread_id(run_id, "run_id")
        result: Checkpoint = self.run_sync(
            self._update_state(thread_id, changes, StateSpec(state), check_namespace(namespace), metadata, expected_head, run_id)
        )
        return result

    def rotate_keys(
        self,
        thread_id: str | None = None,
        *,
        batch_size: int = 100,
        after: str | None = None,
        encrypt_plaintext: bool = False,
    ) -> RotationReport:
        """Re-seal under the active encryption key every row and blob of ``thread_id``
        (or of every thread after ``after``, ascending) that another key sealed.

        One ``rewrite`` per ``batch_size`` records; records already under the active
        key are skipped, so it is idempotent and may run while writers are active.
        After an interruption, run it again (or pass ``after=report.last_thread``).
        ``encrypt_plaintext=True`` also seals plaintext records (migrating a store
        to encryption). Needs a store opened with ``encryption=``.
        """
        inner, plan = self._rotation(thread_id, batch_size, after, encrypt_plaintext)
        result: RotationReport = run_sync(inner, plan)
        return result

    async def arotate_keys(
        self,
        thread_id: str | None = None,
        *,
        batch_size: int = 100,
        after: str | None = None,
        encrypt_plaintext: bool = False,
    ) -> RotationReport:
        inner, plan = self._rotation(thread_id, batch_size, after, encrypt_plaintext)
        result: RotationReport = await run_async(inner, plan)
        return result

    def _rotation(
        self, thread_id: str | None, batch_size: int, after: str | None, encrypt_plaintext: bool
    ) -> tuple[Backend, Plan[RotationReport]]:
        """The backend under the encryption layer and the plan that rotates (rotate_keys, arotate_keys)."""
        from ..wrappers._encryption import find_encrypted

        enc = find_encrypted(self.backend)
        if enc is None:
            raise ConfigurationError(
                f"store {self.url} is not encrypted: rotate_keys needs a store opened with "
                "pk.connect(url, encryption=...)"
            )
        if thread_id is not None:
            check_thread_id(thread_id)
        plan = enc.rotation_plan(thread_id, batch_size=batch_size, after=after, encrypt_plaintext=encrypt_plaintext)
        self._check_open()
        return enc.inner, plan

    def verify(self, thread_id: str | None = None) -> IntegrityReport:
        """Check every record of one thread (or of the whole store) offline and report
        every broken one. Needs a store opened with ``integrity=``."""
        from ..wrappers._integrity import IntegrityBackend
        from ..wrappers._verify import verify_backend

        self._check_open()
        if not isinstance(self.backend, IntegrityBackend):
            raise ConfigurationError(
                f"store {self.url} was opened without integrity=; open it with "
                "pk.connect(url, integrity=...) to verify it"
            )
        if thread_id is not None:
            check_thread_id(thread_id)
        return verify_backend(self.backend, thread_id)

    def copy_from(self, source: Store | str, thread_id: str | None = None) -> int:
        """Copy one thread (or every thread) of another store into this integrity store,
        sealing every record (history, ids and blobs kept). The way to move an existing
        store under ``integrity=``. Returns the number of checkpoints copied."""
        from ..wrappers._integrity import IntegrityBackend
        from ..wrappers._verify import copy_into

        self._check_open()
        if not isinstance(self.backend, IntegrityBackend):
            raise ConfigurationError("copy_from() seals records: open the target with pk.connect(url, integrity=...)")
        src = connect(source) if isinstance(source, str) else source
        try:
            return copy_into(src.backend, self.backend, None if thread_id is None else check_thread_id(thread_id))
        finally:
            if isinstance(source, str):
                src.close()

    def delete_thread(self, thread_id: str) -> bool:
        """Delete every checkpoint and value of a thread, in every namespace, with its streams,
        messages and events (a thread re-created under this id starts empty). Returns whether
        it existed."""
        check_thread_id(thread_id)
        if self.backend.supports_kv:  # its streams (persistkit/streams), messages and events go with it
            self.run_sync(drop_streams(self.codec, thread_id))
            self.run_sync(drop_messages(thread_id))
        result: bool = self.run_sync(_delete_plan(thread_id))
        self._segments.forget(thread_id)
        return result

    def abandon(self, thread_id: str, run_id: str, *, namespace: str = "") -> Checkpoint:
        """Give up an unfinished run that will never be redelivered (docs/coordination.md): its
        committed steps stay, the thread's waiting turns go on, a redelivery raises RunAbandonedError."""
        from ..coordination._abandon import abandon_sync

        return abandon_sync(self, check_thread_id(thread_id), check_thread_id(run_id, "run_id"), check_namespace(namespace))

    # -- public API (async twins) ------------------------------------------------------

    async def aabandon(self, thread_id: str, run_id: str, *, namespace: str = "") -> Checkpoint:
        from ..coordination._abandon import abandon_async

        return await abandon_async(self, check_thread_id(thread_id), check_thread_id(run_id, "run_id"), check_namespace(namespace))

    async def athreads(self, *, prefix: str = "", after: str | None = None, limit: int | None = None) -> list[str]:
        result: list[str] = await self.run_async(_threads_plan(prefix, after, limit))
        return result

    async def ahistory(
        self,
        thread_id: str,
        *,
        limit: int | None = None,
        before: str | None = None,
        run_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        namespace: str = "",
    ) -> list[Checkpoint]:
        check_thread_id(thread_id)
        result: list[Checkpoint] = await self.run_async(
            self._history(thread_id, check_namespace(namespace), _check_limit(limit), before, run_id, metadata)
        )
        return result

    async def aget_checkpoint(
        self, thread_id: str, checkpoint_id: str | None = None, *, namespace: str = ""
    ) -> Checkpoint:
        check_thread_id(thread_id)
        rec: Record = await self.run_async(
            self.read_record(thread_id, check_namespace(namespace), checkpoint_id)
        )
        return rec.public(self.codec)

    async def aget_state(
        self,
        thread_id: str,
        checkpoint_id: str | None = None,
        *,
        state: Any = None,
        namespace: str = "",
        plain: bool = False,
    ) -> Any:
        check_thread_id(thread_id)
        spec = _plain_spec(state, plain)
        return await self.run_async(
            self._get_state(thread_id, checkpoint_id, spec, check_namespace(namespace), plain)
        )

    async def afork(
        self,
        thread_id: str,
        checkpoint_id: str | None = None,
        *,
        new_thread_id: str | None = None,
        update: Mapping[str, Any] | None = None,
        state: Any = None,
        metadata: Mapping[str, Any] | None = None,
        namespace: str = "",
    ) -> Checkpoint:
        check_thread_id(thread_id)
        new_id = check_thread_id(new_thread_id, "new_thread_id") if new_thread_id is not None else _fresh_id(thread_id)
        result: Checkpoint = await self.run_async(
            self._fork(thread_id, checkpoint_id, new_id, update, StateSpec(state), check_namespace(namespace), metadata)
        )
        return result

    async def aupdate_state(
        self,
        thread_id: str,
        changes: Mapping[str, Any],
        *,
        state: Any = None,
        metadata: Mapping[str, Any] | None = None,
        namespace: str = "", expected_head: str | AnyHead | None = ANY_HEAD,
        run_id: str | None = None,
    ) -> Checkpoint:
        check_thread_id(thread_id)
        if run_id is not None:
            check_thread_id(run_id, "run_id")
        result: Checkpoint = await self.run_async(
            self._update_state(thread_id, changes, StateSpec(state), check_namespace(namespace), metadata, expected_head, run_id)
        )
        return result

    async def averify(self, thread_id: str | None = None) -> IntegrityReport:
        """``verify`` in a worker thread (an offline walk: it uses the store's blocking methods)."""
        import asyncio

        return await asyncio.to_thread(self.verify, thread_id)

    async def adelete_thread(self, thread_id: str) -> bool:
        check_thread_id(thread_id)
        if self.backend.supports_kv:
            await self.run_async(drop_streams(self.codec, thread_id))
            await self.run_async(drop_messages(thread_id))
        result: bool = await self.run_async(_delete_plan(thread_id))
        self._segments.forget(thread_id)
        return result


def _fresh_id(thread_id: str) -> str:
    return f"{thread_id[:400]}~{os.urandom(6).hex()}"


def _threads_plan(prefix: str, after: str | None, limit: int | None) -> Plan[list[str]]:
    if not isinstance(prefix, str):
        raise ConfigurationError(f"prefix must be a str, got {type(prefix).__name__}")
    result: list[str] = yield call("threads", prefix=prefix, after=after, limit=_check_limit(limit))
    return result


def _delete_plan(thread_id: str) -> Plan[bool]:
    result: bool = yield call("delete_thread", thread_id)
    return result


def connect(
    url: str | Backend | None = None,
    *,
    blobs: str | Backend | None = None,
    blob_threshold: int = 256 * 1024,
    allow_pickle: bool = False,
    allow_modules: tuple[str, ...] = (),
    compress_threshold: int = COMPRESS_THRESHOLD,
    redact: bool | None = None,
    vault: Vault | None = None,
    encryption: Any = None,
    accept_plaintext: bool = False,
    integrity: Any = None,
    witness: Any = None,
    max_value_bytes: int | None = None,
    **options: Any,
) -> Store:
    """Open a store from a URL (``sqlite:///agent.db``, ``memory://``, ``postgresql://...``,
    ``redis://...``, ``s3://bucket/prefix``) or a backend instance.

    With no URL: ``$PERSISTKIT_URL``, else a SQLite file under ``./.persistkit/``.
    ``blobs`` names a second store (typically S3) for anything stored larger than
    ``blob_threshold`` bytes: channel values, step results, and checkpoint rows
    (where items appended to a list travel); the first store keeps a pointer. ``allow_pickle`` lets values of unknown types be
    pickled (off: a clear ``SerializationError`` instead). ``allow_modules`` lists
    modules whose classes may be revived from storage. ``redact`` (default: on,
    following ``pk.secrets.configure``) replaces secrets in every stored string
    by handles; ``vault`` keeps detected secrets for this store (see
    ``pk.secrets``). ``encryption`` seals every record with AES-256-GCM: ``True``
    (keys from ``$PERSISTKIT_ENCRYPTION_KEYS``), ``"env:VAR"``, ``"file:PATH"``,
    key bytes, a ``{key_id: key}`` mapping, a callable or a :class:`pk.KeyRing`;
    ``accept_plaintext=True`` reads records written before encryption was on
    (while migrating). ``integrity`` (True,
    ``"env:VAR"``, ``"file:PATH"``, key bytes, ``{id: key}``, a callable or a
    ``KeyRing``) seals every record with a keyed hash chain and refuses tampered
    reads; ``witness`` (``"file:PATH"``, a store URL or Backend, or an object with
    ``record``/``latest``) also refuses a store rolled back to an older copy.
    Without ``encryption=`` / ``integrity=`` (keyword or URL), a store is sealed when
    ``$PERSISTKIT_ENCRYPTION_KEYS`` / ``$PERSISTKIT_INTEGRITY_KEYS`` is set (keys from it), as
    the ``persistkit`` CLI opens it: ``False`` (``?integrity=false``) turns that off.
    ``max_value_bytes`` refuses a step result or state value whose serialized form is
    larger (``pk.ValueTooLargeError``, before any of it is written); without it, a value
    above 1 MiB gets a ``pk.LargeValueWarning`` once per step (none with ``blobs=``).
    Other keyword options go to the backend. Every option but ``vault`` may also sit in the
    URL query, as text (``?redact=false&integrity=env:MY_KEYS``; docs/backends.md): a
    keyword left at its default does not override it.

    :param url: a store URL or a ``Backend``; None: ``$PERSISTKIT_URL``, else a SQLite file
        under ``./.persistkit/``.
    :param blobs: a second store (a URL or a ``Backend``, typically S3) for anything stored
        larger than ``blob_threshold``; the first store keeps a pointer.
    :param blob_threshold: bytes (after compression and encryption) above which a value goes
        to ``blobs`` (default 256 KiB).
    :param allow_pickle: pickle values of types the codec does not know (off: a clear
        ``SerializationError`` instead).
    :param allow_modules: modules whose classes may be revived from storage.
    :param compress_threshold: bytes from which a stored value is compressed with zstd
        (default 512: below it compression saves less than a row's overhead).
    :param redact: replace secrets in every stored string by handles; None follows
        ``pk.secrets.configure`` (on by default).
    :param vault: keeps the detected secrets of this store (see ``pk.secrets``).
    :param encryption: seal every record with AES-256-GCM: True (keys from
        ``$PERSISTKIT_ENCRYPTION_KEYS``), ``"env:VAR"``, ``"file:PATH"``, key bytes, a
        ``{key_id: key}`` mapping, a callable or a ``pk.KeyRing``; None: on when
        ``$PERSISTKIT_ENCRYPTION_KEYS`` is set; False: off.
    :param accept_plaintext: also read records written before encryption was on (while
        migrating: ``store.rotate_keys(encrypt_plaintext=True)``).
    :param integrity: seal every record with a keyed hash chain and refuse tampered reads; the
        same forms as ``encryption`` (keys from ``$PERSISTKIT_INTEGRITY_KEYS``).
    :param witness: also refuse a store rolled back to an older copy: ``"file:PATH"``, a store
        URL or ``Backend``, or an object with ``record``/``latest``.
    :param max_value_bytes: refuse a step result or state value whose serialized form is
        larger (``pk.ValueTooLargeError``, nothing written); None: a value above 1 MiB gets a
        ``pk.LargeValueWarning`` once per step (none with ``blobs=``).
    :param options: the store's own options, as keywords or in the URL query (reference:
        Stores and their URL options).
    """
    if url is None:
        url = os.environ.get("PERSISTKIT_URL") or DEFAULT_URL
    own: dict[str, Any] = {
        "blobs": blobs, "blob_threshold": blob_threshold, "allow_pickle": allow_pickle,
        "allow_modules": allow_modules, "compress_threshold": compress_threshold, "redact": redact,
        "vault": vault, "encryption": encryption, "accept_plaintext": accept_plaintext,
        "integrity": integrity, "witness": witness, "max_value_bytes": max_value_bytes,
    }
    if isinstance(url, str):
        # pk.connect()'s own options may sit in the URL's query; a keyword given (not left
        # at its default) wins, as it does for the store's options.
        url, in_url = split_connect_options(url)
        for name, value in in_url.items():
            if own[name] == _CONNECT_DEFAULTS[name]:
                own[name] = value
    for name, variable in _KEY_VARIABLES.items():
        # Not given: the environment says, as for the CLI (docs/security.md: one rule for both);
        # False (or ?integrity=false) is off whatever the environment holds.
        if own[name] is None and os.environ.get(variable):
            own[name] = True
        elif own[name] is False:
            own[name] = None
    backend = url if isinstance(url, Backend) else open_backend(url, **options)
    if isinstance(url, Backend) and options:
        raise ConfigurationError(f"backend options {sorted(options)} only apply when connecting by URL")
    backend = stack(
        backend,
        blobs=own["blobs"],
        blob_threshold=own["blob_threshold"],
        encryption=own["encryption"],
        accept_plaintext=own["accept_plaintext"],
        integrity=own["integrity"],
        witness=own["witness"],
    )
    compress_threshold = own["compress_threshold"]
    if not isinstance(compress_threshold, int) or compress_threshold < 1:
        raise ConfigurationError(f"compress_threshold must be a positive int, got {compress_threshold!r}")
    serializer = Serializer(allow_pickle=own["allow_pickle"], allow_modules=tuple(own["allow_modules"]))
    # -- secrets (redact=, vault=) ------------------------------------------------------------
    redact, vault = own["redact"], own["vault"]
    redactor: Redactor | None = None
    if redact is not None or vault is not None:
        if vault is not None and not all(hasattr(vault, a) for a in ("get", "put", "handle_key")):
            raise ConfigurationError("vault must be a pk.secrets.FileVault (or have get/put/handle_key)")
        redactor = Redactor(enabled=redact is not False, vault=vault)
    # ------------------------------------------------------------------------------------------
    limit = own["max_value_bytes"]
    if limit is not None and (type(limit) is not int or limit < 1):
        raise ConfigurationError(f"max_value_bytes must be a positive int (bytes) or None, got {limit!r}")
    codec = Codec(serializer, compress_threshold=compress_threshold, redactor=redactor)
    codec.max_value_bytes, codec.value_alarm = limit, alarm(limit, warn=own["blobs"] is None)
    return Store(backend, codec=codec)


#: The variables whose keys seal a store opened without encryption= / integrity= (CLI likewise).
_KEY_VARIABLES = {"encryption": "PERSISTKIT_ENCRYPTION_KEYS", "integrity": "PERSISTKIT_INTEGRITY_KEYS"}

#: connect()'s keyword defaults: an option in the URL applies where its keyword was left at these.
_CONNECT_DEFAULTS: dict[str, Any] = {
    name: p.default for name, p in inspect.signature(connect).parameters.items() if p.kind is p.KEYWORD_ONLY
}


_default: Store | None = None


_default_lock = threading.Lock()


def default_store() -> Store:
    """The store ``resume()`` uses when none is given: ``pk.connect()``, opened once per process."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = connect()
        return _default
