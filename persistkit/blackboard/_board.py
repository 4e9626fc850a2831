"""``store.board()``: a shared space of keys with versions, compare-and-swap and batches.

Every operation is written once, as a plan (``persistkit._io``) over the store's ``kv``
primitives, and driven by a blocking or an awaiting loop: ``get`` / ``aget`` and so on.
Every write is a compare-and-swap underneath (``kv_write`` with the version the board read),
so the wrappers can bind a value to its key and version; a ``put`` (last writer wins) reads
the key's version and retries when another writer got there first.

Versions as the board shows them: a key that does not exist (never written, deleted, or
expired) has version 0 for ``cas``; the version a write makes is always higher than any
the key had before (a delete or an expiry does not reset it).
"""

from __future__ import annotations

import builtins
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .._errors import AccessDeniedError, ConfigurationError, ConflictError
from .._io import Plan, Sleep, call
from ..backends._capabilities import require
from ..backends._protocol import KvEntry, KvOp
from . import _entries as E
from ._entries import BoardEntry, Policies, Policy, Stored, StoreLike
from ._validate import validate

__all__ = ["Batch", "BoardBatch", "BoardCore"]

#: attempts of a put, delete or update that keeps meeting other writers
ATTEMPTS = 100
_PAGE = 200
_ANY = -1  # an intent's expected version: whatever the key has now (put, delete)


@dataclass(frozen=True, slots=True)
class _Intent:
    """One write of a batch, as the caller asked for it (before reading versions)."""

    key: str
    value: Any  # None with delete=True
    expected: int  # the board version the caller expects, or _ANY
    delete: bool = False
    ttl: float | None = None
    claim: tuple[str, float] | None = None


class BoardCore:
    """The data operations of a board (``persistkit.blackboard._space.Board`` adds claims,
    watches and scoped handles). Get a board with ``store.board(name)``.

    Sync methods and their ``a``-prefixed async twins; safe to share across threads and
    tasks. See docs/shared-state.md.
    """

    def __init__(self, store: StoreLike, name: str = "default", *, history: int = E.DEFAULT_HISTORY) -> None:
        require(store.backend, "kv", "store.board()")
        self.store = store
        self.name = E.check_name(name)
        self._policies = Policies(Policy("", history=history).history)

    def __repr__(self) -> str:
        return f"<persistkit Board {self.name!r} on {self.store.url}>"

    # -- configuration -----------------------------------------------------------------

    def policy(
        self, prefix: str, *, history: int = E.DEFAULT_HISTORY, ttl: float | None = None,
        refresh_on_read: bool = False, schema: Any = None, checks: tuple[Any, ...] | list[Any] = (),
    ) -> Policy:
        """Set the rules of the keys under ``prefix`` (the longest matching prefix wins):
        ``history`` versions kept per key, a ``ttl`` in seconds (with ``refresh_on_read``),
        a pydantic ``schema`` and content ``checks`` run before a write is stored. The policy
        of a key's longest matching prefix applies whole: rules are not merged with a shorter
        prefix's (repeat the checks you want kept). Rules live in this process: set the same
        ones in every process that writes the board."""
        if isinstance(checks, (str, bytes)) or not isinstance(checks, (list, tuple)):
            raise ConfigurationError(f"checks must be a list of functions check(key, value) -> str | None, got {checks!r}")
        p = Policy(prefix, history=history, ttl=ttl, refresh_on_read=refresh_on_read, schema=schema, checks=tuple(checks))
        self._policies.set(p)
        return p

    def policy_of(self, key: str) -> Policy:
        return self._policies.of(key)

    # -- plans ---------------------------------------------------------------------------

    def _load(self, entry: KvEntry | None) -> Stored | None:
        if entry is None:
            return None
        return Stored.load(self.store.codec, entry.key, entry.version, entry.value, self.name)

    def _absent(self, key: str, operation: str, *, prefix: bool = False) -> Plan[bool]:
        """False for a key (or prefix) that is not there, but raise the store's AccessDeniedError
        when its access rules hide it from this connection (PostgreSQL row-level security)."""
        denied: AccessDeniedError | None = yield call("kv_denied", self.name, key, operation, prefix=prefix)
        if denied is not None:
            raise denied
        return False

    def _read(self, key: str, version: int | None = None) -> Plan[Stored | None]:
        entry: KvEntry | None = yield call("kv_get", self.name, key, version)
        return self._load(entry)

    def _get(self, key: str, version: int | None) -> Plan[BoardEntry | None]:
        E.check_key(key)
        if version is not None and (not isinstance(version, int) or isinstance(version, bool) or not 1 <= version < 2**62):
            raise ConfigurationError(f"version must be an int from 1 to 2**62 (a version the key had), or None, got {version!r}")
        s = yield from self._read(key, version)
        if s is None:
            return None
        if version is None:
            now = time.time()
            if not s.live(now):
                return None
            policy = self._policies.of(key)
            # A refresh is a write (a version, a watch event): made only once less than half
            # the TTL is left, so reads in a loop (or a watcher reading each change) do not write;
            # and never on a claimed item (the write would move the claim's fencing token).
            if (
                policy.refresh_on_read and policy.ttl is not None and s.expires_at is not None
                and s.expires_at - now < policy.ttl / 2 and not s.claimed(now)
            ):
                s = yield from self._refresh(s, policy.ttl, now)
        return s.entry(self.store.codec, self.name)

    def _refresh(self, s: Stored, ttl: float, now: float) -> Plan[Stored]:
        data = E.pack(self.store.codec, s.tree, expires_at=now + ttl, now=s.written_at)
        try:
            yield call("kv_write", self.name, [KvOp(s.key, s.version, data)], keep=self._policies.of(s.key).history)
        except ConflictError:
            return s  # another writer moved it: its write set its own expiry
        return Stored(s.key, s.version + 1, s.tree, s.written_at, now + ttl)

    def _list(self, prefix: str, after: str | None, limit: int) -> Plan[list[BoardEntry]]:
        E.check_prefix(prefix)
        if after is not None:
            E.check_key(after)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 10_000:
            raise ConfigurationError(f"limit must be an int from 1 to 10000, got {limit!r}")
        out: builtins.list[BoardEntry] = []
        now = time.time()
        while len(out) < limit:
            want = min(_PAGE, limit - len(out))
            page: builtins.list[KvEntry] = yield call("kv_list", self.name, prefix=prefix, after=after, limit=want)
            for entry in page:
                s = self._load(entry)
                if s is not None and s.live(now):  # an expired key is skipped: read again for more
                    out.append(s.entry(self.store.codec, self.name))
            if len(page) < want:
                break
            after = page[-1].key
        return out

    def _sweep(self, prefix: str) -> Plan[int]:
        """Delete the expired keys under ``prefix`` (a tombstone each, expected at the version
        found: a key written since is left alone); how many."""
        E.check_prefix(prefix)
        swept, after = 0, None
        while True:
            page: builtins.list[KvEntry] = yield call("kv_list", self.name, prefix=prefix, after=after, limit=_PAGE)
            now = time.time()
            for entry in page:
                s = self._load(entry)
                if s is None or not s.expired(now) or s.claimed(now):
                    continue
                try:
                    # keep=1: an expired value goes with its history (only the delete's version stays)
                    yield call("kv_write", self.name, [KvOp(s.key, s.version, None)], keep=1)
                except ConflictError:
                    continue  # written again since: not expired any more
                swept += 1
            if len(page) < _PAGE:
                return swept
            after = page[-1].key

    def _history(self, key: str, limit: int | None) -> Plan[list[BoardEntry]]:
        E.check_key(key)
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise ConfigurationError(f"limit must be an int >= 1 (versions, newest first) or None for all kept, got {limit!r}")
        found: builtins.list[KvEntry] = yield call("kv_history", self.name, key, limit=limit)
        return [s.entry(self.store.codec, self.name) for e in found if (s := self._load(e)) is not None]

    def _write(self, intents: builtins.list[_Intent]) -> Plan[dict[str, Stored]]:
        """Apply ``intents`` atomically; what each written key now holds (a delete of a key that
        does not exist writes nothing and is absent). A ``cas`` whose key is
        not at its expected version raises ``ConflictError``; puts and deletes read again and
        retry when another writer got there first. ``written``: filled with what was stored
        of each value (``update`` returns it: reading it back could find it pushed out of
        the kept history by a later writer)."""
        keys = [i.key for i in intents]
        if len(set(keys)) != len(keys):
            raise ConfigurationError(f"a batch writes each key once; repeated: {sorted({k for k in keys if keys.count(k) > 1})}")
        prepared = [self._prepare(i) for i in intents]  # validate and encode once, before any I/O
        for attempt in range(ATTEMPTS):
            now = time.time()
            ops: builtins.list[KvOp] = []
            written: dict[str, Stored] = {}
            for intent, tree in zip(intents, prepared, strict=True):
                current = yield from self._read(intent.key)
                stored_version = current.version if current is not None else 0
                shown = stored_version if current is not None and current.live(now) else 0
                if intent.expected != _ANY and intent.expected != shown:
                    raise ConflictError(key=intent.key, namespace=self.name, expected=intent.expected, found=shown)
                if intent.delete:
                    if current is None or not current.live(now):
                        continue  # nothing to delete (never written, deleted or expired): no write
                    ops.append(KvOp(intent.key, stored_version, None))
                    written[intent.key] = Stored(intent.key, stored_version + 1, None, None, deleted=True)
                    continue
                policy = self._policies.of(intent.key)
                ttl = intent.ttl if intent.ttl is not None else policy.ttl
                expires_at = None if ttl is None else now + ttl
                data = E.pack(self.store.codec, tree, expires_at=expires_at, claim=intent.claim, now=now)
                ops.append(KvOp(intent.key, stored_version, data))
                claim = intent.claim or (None, None)
                written[intent.key] = Stored(intent.key, stored_version + 1, tree, now, expires_at, claim[0], claim[1])
            if not ops:
                return {}
            keep = max(self._policies.of(op.key).history for op in ops)
            try:
                yield call("kv_write", self.name, ops, keep=keep)
            except ConflictError:
                # Another writer moved a key between our read and our write: read again. A
                # cas then raises its conflict with the version the board shows; a put retries.
                if attempt > 1:
                    yield Sleep(backoff(attempt))
                continue
            return written
        raise ConflictError(
            f"board {self.name!r}: {ATTEMPTS} attempts to write {keys[:5]} all met other writers; "
            "the keys are written too often for last-writer-wins: shard them, or use cas/update",
            key=keys[0], namespace=self.name,
        )

    def _prepare(self, intent: _Intent) -> Any:
        E.check_key(intent.key)
        if intent.delete:
            return None
        value = validate(self._policies.of(intent.key), intent.key, intent.value, self.name)
        return self.store.codec.encode(value, f"board {self.name!r} key {intent.key!r}")

    def _update(self, key: str, fn: Callable[[Any], Any], default: Any, ttl: float | None) -> Plan[BoardEntry]:
        E.check_key(key)
        if not callable(fn):
            raise ConfigurationError(f"update needs a function fn(current_value) -> new_value, got {fn!r}")
        for attempt in range(ATTEMPTS):
            current = yield from self._get(key, None)
            version = current.version if current is not None else 0
            new = fn(current.value if current is not None else default)
            try:
                written = yield from self._write([_Intent(key, new, version, ttl=ttl)])
            except ConflictError as exc:
                if exc.key != key:
                    raise
                if attempt > 1:
                    yield Sleep(backoff(attempt))
                continue
            # What this write stored, not a read of the key: by now another writer may have
            # written (and a small history pushed this version out).
            return written[key].entry(self.store.codec, self.name)
        raise ConflictError(
            f"board {self.name!r}: update of {key!r} met another writer {ATTEMPTS} times in a row; "
            "the key is written too often: shard it", key=key, namespace=self.name,
        )

    # -- the sync API --------------------------------------------------------------------

    def get(self, key: str, *, version: int | None = None) -> BoardEntry | None:
        """The key's live entry (value, version, times), or None if it does not exist or expired;
        ``version=n``: that kept version (a delete's version has ``deleted`` True)."""
        result: BoardEntry | None = self.store.run_sync(self._get(key, version))
        return result

    def value(self, key: str, default: Any = None) -> Any:
        """The key's value, or ``default`` if it does not exist."""
        entry = self.get(key)
        return default if entry is None else entry.value

    def put(self, key: str, value: Any, *, ttl: float | None = None) -> int:
        """Store ``value`` under ``key`` (last writer wins); the new version."""
        return self._one(_Intent(key, value, _ANY, ttl=E.check_ttl(ttl)))

    def cas(self, key: str, value: Any, expected_version: int, *, ttl: float | None = None) -> int:
        """Store ``value`` only if the key is at ``expected_version`` (0: it must not exist);
        the new version. Otherwise ``ConflictError`` (``.found``: the current version)."""
        return self._one(_Intent(key, value, _expected(expected_version), ttl=E.check_ttl(ttl)))

    def delete(self, key: str, *, expected_version: int | None = None) -> bool:
        """Delete the key (its history stays until pushed out); whether it existed.
        ``expected_version``: only if it is at that version (``ConflictError`` otherwise)."""
        exp = _ANY if expected_version is None else _expected(expected_version, zero=False)
        written: dict[str, Stored] = self.store.run_sync(self._write([_Intent(key, None, exp, delete=True)]))
        return bool(written) or self.store.run_sync(self._absent(key, "delete"))

    def list(self, prefix: str = "", *, after: str | None = None, limit: int = 100) -> builtins.list[BoardEntry]:
        """Live entries whose key starts with ``prefix``, in key order (code points), only keys
        after ``after``, at most ``limit``: page with ``after=page[-1].key``."""
        result: builtins.list[BoardEntry] = self.store.run_sync(self._list(prefix, after, limit))
        return result

    def scan(self, prefix: str = "") -> Iterator[BoardEntry]:
        """Every live entry under ``prefix``, in key order, read a page at a time."""
        after = None
        while page := self.list(prefix, after=after, limit=_PAGE):
            yield from page
            after = page[-1].key

    def sweep(self, prefix: str = "") -> int:
        """Delete the keys under ``prefix`` whose TTL has passed, and their kept versions (they
        already read as missing; this frees their storage, leaving the delete's version so that
        versions never go back); how many. A key with a live claim is left. Run it from your
        scheduler as often as storage matters: nothing sweeps on its own."""
        result: int = self.store.run_sync(self._sweep(prefix))
        return result

    def history(self, key: str, *, limit: int | None = None) -> builtins.list[BoardEntry]:
        """The kept versions of ``key``, newest first (deletes included, ``deleted`` True).
        A rollback is one write: ``board.put(key, board.get(key, version=n).value)``."""
        result: builtins.list[BoardEntry] = self.store.run_sync(self._history(key, limit))
        return result

    def update(self, key: str, fn: Callable[[Any], Any], *, default: Any = None, ttl: float | None = None) -> BoardEntry:
        """Set the key to ``fn(current value)`` (``default`` when it does not exist) under
        compare-and-swap, calling ``fn`` again when another writer got there first; the new
        entry. ``fn`` must not have side effects: it may run several times."""
        result: BoardEntry = self.store.run_sync(self._update(key, fn, default, E.check_ttl(ttl)))
        return result

    def batch(self) -> Batch:
        """Writes applied together atomically: ``with board.batch() as b: b.put(...); b.cas(...)``
        (applied when the block ends without an exception; ``b.versions`` then holds the new
        versions), or ``b = board.batch(); ...; b.commit()``."""
        return Batch(self)

    def clear(self) -> bool:
        """Delete the whole board, every key and version (no tombstones, no hints): for tests
        and teardown, not for a board other agents are using."""
        result: bool = self.store.call_sync(call("kv_drop", self.name))
        return result

    # -- the async API ----------------------------------------------------------------------

    async def aget(self, key: str, *, version: int | None = None) -> BoardEntry | None:
        result: BoardEntry | None = await self.store.run_async(self._get(key, version))
        return result

    async def avalue(self, key: str, default: Any = None) -> Any:
        entry = await self.aget(key)
        return default if entry is None else entry.value

    async def aput(self, key: str, value: Any, *, ttl: float | None = None) -> int:
        return await self._aone(_Intent(key, value, _ANY, ttl=E.check_ttl(ttl)))

    async def acas(self, key: str, value: Any, expected_version: int, *, ttl: float | None = None) -> int:
        return await self._aone(_Intent(key, value, _expected(expected_version), ttl=E.check_ttl(ttl)))

    async def adelete(self, key: str, *, expected_version: int | None = None) -> bool:
        exp = _ANY if expected_version is None else _expected(expected_version, zero=False)
        written: dict[str, Stored] = await self.store.run_async(self._write([_Intent(key, None, exp, delete=True)]))
        return bool(written) or await self.store.run_async(self._absent(key, "delete"))

    async def alist(self, prefix: str = "", *, after: str | None = None, limit: int = 100) -> builtins.list[BoardEntry]:
        result: builtins.list[BoardEntry] = await self.store.run_async(self._list(prefix, after, limit))
        return result

    async def ascan(self, prefix: str = "") -> AsyncIterator[BoardEntry]:
        """``scan`` for async callers: ``async for entry in board.ascan(prefix)``."""
        after = None
        while page := await self.alist(prefix, after=after, limit=_PAGE):
            for entry in page:
                yield entry
            after = page[-1].key

    async def asweep(self, prefix: str = "") -> int:
        result: int = await self.store.run_async(self._sweep(prefix))
        return result

    async def ahistory(self, key: str, *, limit: int | None = None) -> builtins.list[BoardEntry]:
        result: builtins.list[BoardEntry] = await self.store.run_async(self._history(key, limit))
        return result

    async def aupdate(self, key: str, fn: Callable[[Any], Any], *, default: Any = None, ttl: float | None = None) -> BoardEntry:
        """``update`` for async callers; ``fn`` is a plain (not async) function."""
        result: BoardEntry = await self.store.run_async(self._update(key, fn, default, E.check_ttl(ttl)))
        return result

    async def aclear(self) -> bool:
        result: bool = await self.store.call_async(call("kv_drop", self.name))
        return result

    # -- plumbing -----------------------------------------------------------------------------

    def _one(self, intent: _Intent) -> int:
        written: dict[str, Stored] = self.store.run_sync(self._write([intent]))
        return written[intent.key].version

    async def _aone(self, intent: _Intent) -> int:
        written: dict[str, Stored] = await self.store.run_async(self._write([intent]))
        return written[intent.key].version


def backoff(attempt: int) -> float:
    """Seconds to wait before attempt ``attempt`` of a write that keeps meeting other writers:
    exponential with full jitter, capped at one second (so that writers of one hot key spread
    out whatever a write costs on the store: a millisecond on Redis, a hundred on S3)."""
    return random.uniform(0, min(1.0, 0.001 * 2 ** min(attempt, 10)))


def _expected(v: object, *, zero: bool = True) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < (0 if zero else 1) or v >= 2**62:
        least = "0 (must not exist)" if zero else "1"
        raise ConfigurationError(f"expected_version must be an int >= {least}, got {v!r}")
    return v


class Batch:
    """Writes to one board applied together, atomically, on one store: every one lands or
    none does (a ``cas`` that fails raises ``ConflictError`` and nothing is written)."""

    def __init__(self, board: BoardCore) -> None:
        self._board = board  # private: a scoped handle's batch must not hand out the unscoped board
        self._intents: builtins.list[_Intent] = []
        #: the new version of each written key, once committed
        self.versions: dict[str, int] = {}
        self._done = False
        #: a scoped handle's write check, run on every key as it is added
        self.guard: Callable[[str, str], object] | None = None

    def put(self, key: str, value: Any, *, ttl: float | None = None) -> Batch:
        return self._add(_Intent(key, value, _ANY, ttl=E.check_ttl(ttl)))

    def cas(self, key: str, value: Any, expected_version: int, *, ttl: float | None = None) -> Batch:
        return self._add(_Intent(key, value, _expected(expected_version), ttl=E.check_ttl(ttl)))

    def delete(self, key: str, *, expected_version: int | None = None) -> Batch:
        exp = _ANY if expected_version is None else _expected(expected_version, zero=False)
        return self._add(_Intent(key, None, exp, delete=True))

    def _add(self, intent: _Intent) -> Batch:
        if self._done:
            raise ConfigurationError("this batch was committed already; start a new one with board.batch()")
        E.check_key(intent.key)
        if self.guard is not None:
            self.guard(intent.key, "delete" if intent.delete else "write")
        self._intents.append(intent)
        return self

    def _plan(self) -> Plan[dict[str, int]]:
        if self._done:
            raise ConfigurationError("this batch was committed already; start a new one with board.batch()")
        self._done = True
        written = yield from self._board._write(self._intents)
        return {k: w.version for k, w in written.items()}

    def commit(self) -> dict[str, int]:
        self.versions = self._board.store.run_sync(self._plan())
        return self.versions

    async def acommit(self) -> dict[str, int]:
        self.versions = await self._board.store.run_async(self._plan())
        return self.versions

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.commit()

    async def __aenter__(self) -> Batch:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            await self.acommit()


#: the public name of a batch (``pk.BoardBatch``)
BoardBatch = Batch
