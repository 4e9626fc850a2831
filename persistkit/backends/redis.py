"""The Redis store: core commands and Lua only (Redis >= 6.2, Valkey, managed services).

No modules (no RedisJSON, no RediSearch). Every checkpoint write is ONE Lua
script that checks the head version, stores the blobs (HSETNX: existing bytes
win), the row and its index entries, and moves the head — so a lost
compare-and-swap writes nothing at all.

URLs
----
``redis://[[user]:password@]host:port/db?prefix=persistkit:&ttl=SECONDS``
    and ``rediss://`` for TLS. ``prefix`` (default ``"persistkit:"``) starts
    every key this store touches; ``ttl`` (seconds, optional) expires a thread
    that has not been written for that long. Every other query option goes to
    redis-py's ``from_url`` unchanged (``socket_timeout``, ``ssl_cert_reqs``, ...).

TTL and durability: Redis keeps data in memory. With ``ttl`` a thread's keys
expire together ``ttl`` seconds after its last write, and under ``maxmemory``
pressure Redis may evict keys of any thread. For durable checkpoints configure
AOF (``appendonly yes``) or RDB persistence and ``maxmemory-policy
noeviction``, or pair this store with a durable one.

Key layout (``P`` = prefix, ``T`` = base64url of the UTF-8 thread id, ``N`` =
base64url of the namespace; base64url has no ``{ } :`` so any thread id works)::

    P{T}:h:N   hash   head: v = version, c = checkpoint id
    P{T}:r:N   hash   checkpoint id -> packed row (parent, run id, payload)
    P{T}:i:N   zset   checkpoint ids, score 0: newest first with ZRANGE BYLEX REV
    P{T}:u:N   zset   "<base64url run id>:<checkpoint id>": the run_id filter
    P{T}:b     hash   blob key -> bytes (HSETNX keeps existing bytes)
    P{T}:k     zset   blob keys, score 0, for scan_blobs ranges
    P{T}:x     set    the h/r/i/u keys of the thread; exists iff it has a head
    Pthreads   zset   thread ids (UTF-8), score 0, for threads()
    Pstore     string the store's identity, written once (_redis_guard.py: a store that lost its data)

Redis Cluster: the ``{T}`` hash tag puts every key of one thread in one slot,
so the write, put_blobs and delete scripts are single-slot. ``Pthreads`` lives
in another slot and cannot join a script; it is maintained by a separate
command in the same pipeline, ordered so that no thread with a head is ever
missing from it: the index entry is added AFTER the write script (on every
write, which also repairs it) and removed AFTER the delete script. Entries
whose thread has no head any more (a failed script, expired TTL, a write that
raced a delete) are skipped by ``threads()``, which checks ``P{T}:x``, and
dropped by the next ``delete_thread`` of that id. A cluster deployment needs a
cluster-aware client passed as ``client=``; the key layout is ready for it.

Errors: connection loss, timeouts, LOADING, TRYAGAIN, READONLY (failover) and
BUSY are :class:`BackendUnavailableError`; other redis errors
:class:`BackendError`; a lost CAS :class:`ConflictError`. Writes are never
re-sent here (an ambiguous commit is resolved above by reading the head);
reads are retried once. Clients made from a URL have redis-py's own retries
turned off for the same reason; user-supplied clients keep their settings.

The kv and watch capabilities (versioned keys per scope, pub/sub hints) live in
:mod:`persistkit.backends._redis_kv`, with their own key layout under ``P{k.<scope>}:``.

Retention (the prune capability): ``prune_rows`` is a Lua script per 500 ids that reads
the head and deletes each asked row below it with its ``i`` and ``u`` entries;
``delete_blobs`` removes hash fields and ``k`` entries together; ``blob_sizes`` pages
through ``P{T}:k`` with ``HSTRLEN`` (never a SCAN). Leases and kv keys are not touched.

One copy of the logic: each operation is a generator that yields batches of
commands and receives their replies (no I/O of its own); a blocking driver
and an awaiting driver run it.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import math
import threading
import weakref
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis
import redis.asyncio
import redis.exceptions as rexc
from redis.backoff import NoBackoff

from .._errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    PersistkitError,
    StoreClosedError,
)
from . import mask_url, unknown_options
from ._protocol import Backend, CheckpointRow, Head, LeaseRecord
from ._redis_guard import HANDSHAKE_TIMEOUT, Guard, TLSConnection, not_tls_error, plaintext_redis
from ._redis_kv import RedisKv
from ._redis_ops import (
    SOURCES,
    Batch,
    Cmd,
    Keys,
    Op,
    op_blob_sizes,
    op_delete,
    op_delete_blobs,
    op_get,
    op_get_blobs,
    op_has_data,
    op_head,
    op_lease_get,
    op_lease_list,
    op_lease_swap,
    op_list,
    op_namespaces,
    op_prune_rows,
    op_put_blobs,
    op_rewrite,
    op_scan_blobs,
    op_threads,
    op_write,
    op_write_fenced,
)

__all__ = ["RedisBackend"]

_T = TypeVar("_T")
_OPTIONS = ("prefix", "ttl", "volatile")
_DEFAULT_PREFIX = "persistkit:"

# -- driver plumbing ---------------------------------------------------------------

# READONLY: a failover demoted the node we write to. BUSY: a script is running.
_TRANSIENT = (
    rexc.ConnectionError,
    rexc.TimeoutError,
    rexc.TryAgainError,
    rexc.ReadOnlyError,
    rexc.ClusterDownError,
)
_PERMANENT = (rexc.AuthenticationError, rexc.AuthorizationError)


def _is_transient(exc: Exception) -> bool:
    if isinstance(exc, _PERMANENT):
        return False
    return isinstance(exc, _TRANSIENT) or str(exc).startswith("BUSY")


def _driver_options(tls: bool) -> frozenset[str]:
    """The URL query options redis-py's ``from_url`` passes on to its connection class."""
    from redis.connection import (
        URL_QUERY_ARGUMENT_PARSERS,
        AbstractConnection,
        Connection,
        SSLConnection,
    )

    names = set(URL_QUERY_ARGUMENT_PARSERS)
    for cls in (AbstractConnection, SSLConnection if tls else Connection):
        names.update(inspect.signature(cls.__init__).parameters)
    return frozenset(names - {"self", "kwargs"})


_UNRESOLVED = ("name or service not known", "nodename nor servname", "name resolution", "no address associated")


def _map_error(exc: Exception, url: str, reached: bool = True) -> PersistkitError:
    """The persistkit error for a driver error. Before the server was ever reached, an
    unknown host or a failed login is the URL's fault, not a transient failure (saying
    "retry" would hide it); a refused or reset connection is an outage, as later."""
    if not reached and isinstance(exc, rexc.AuthenticationError | rexc.AuthorizationError):
        return ConfigurationError(
            f"cannot log in to the redis store {url}: {exc}. Check the user name and password in the URL"
        )
    parts = urlsplit(url)
    if not reached and parts.scheme.lower() == "rediss" and isinstance(exc, rexc.ConnectionError | rexc.TimeoutError):
        # (the sync client's TLSConnection names it itself; the async one times out here)
        host, port = parts.hostname or "localhost", parts.port or 6379
        if plaintext_redis(host, port, HANDSHAKE_TIMEOUT):
            return not_tls_error(host, port, url)
    if not reached and isinstance(exc, rexc.ConnectionError) and not isinstance(exc, rexc.TimeoutError):
        text = str(exc).lower()
        if any(n in text for n in _UNRESOLVED):
            return ConfigurationError(
                f"cannot connect to the redis store {url}: the host name does not resolve ({exc}). "
                "Check the host in the URL"
            )
        # refused or reset: down or restarting (the first connect and the hundredth are the
        # same outage), so a retry can succeed; the message also says what to check
        return BackendUnavailableError(
            f"cannot connect to the redis store {url}: {str(exc).rstrip('.')}. The server is down or restarting, or "
            "the URL's host and port are wrong: safe to retry once it is up (a job queue retries "
            "pk.RetryableError); if it persists, check the host and port, and that the server is "
            "running and reachable from here"
        )
    if isinstance(exc, rexc.ResponseError) and "DB index is out of range" in str(exc):
        # SELECT of the URL's database failed: the URL names a database the server lacks
        db = urlsplit(url).path.strip("/") or "0"
        return ConfigurationError(
            f"the redis store {url} selects database {db}, which the server does not have: "
            "its databases are numbered from 0 below its `databases` setting (16 by default). "
            "Check the number after the port in the URL"
        )
    if _is_transient(exc):
        return BackendUnavailableError(f"redis at {url} is unavailable: {exc!r}; safe to retry")
    return BackendError(f"redis at {url} failed: {exc!r}")


def _needs_eval(replies: list[Any]) -> bool:
    return any(isinstance(r, rexc.NoScriptError) for r in replies)


def _with_eval(commands: tuple[Cmd, ...]) -> tuple[Cmd, ...]:
    # NOSCRIPT means the script did not run, so sending its source is not a retry.
    return tuple(("EVAL", SOURCES[c[1]], *c[2:]) if c[0] == "EVALSHA" else c for c in commands)


def _checked(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _send(client: Any, commands: tuple[Cmd, ...]) -> list[Any]:
    if len(commands) == 1:
        try:
            return [client.execute_command(*commands[0])]
        except rexc.ResponseError as exc:
            return [exc]
    with client.pipeline(transaction=False) as pipe:
        for cmd in commands:
            pipe.execute_command(*cmd)
        return list(pipe.execute(raise_on_error=False))


async def _asend(client: Any, commands: tuple[Cmd, ...]) -> list[Any]:
    if len(commands) == 1:
        try:
            return [await client.execute_command(*commands[0])]
        except rexc.ResponseError as exc:
            return [exc]
    async with client.pipeline(transaction=False) as pipe:
        for cmd in commands:
            pipe.execute_command(*cmd)
        return list(await pipe.execute(raise_on_error=False))


def _check_client(client: Any, what: str) -> None:
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("decode_responses"):
        raise ConfigurationError(
            f"the {what} passed to RedisBackend has decode_responses=True; persistkit stores "
            "binary values and needs decode_responses=False"
        )


def _parse_ttl(ttl: object) -> int:
    """Seconds (number or numeric string, > 0) or None -> milliseconds (0 = no ttl)."""
    if ttl is None or ttl == "":
        return 0
    try:
        seconds = (
            float(ttl) if isinstance(ttl, str | int | float) and not isinstance(ttl, bool) else -1.0
        )
    except ValueError:
        seconds = -1.0
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ConfigurationError(f"redis store: ttl={ttl!r} must be a positive number of seconds")
    return math.ceil(seconds * 1000)


def _flag(value: object) -> bool:
    """``volatile=``: a bool, or its text from the URL (true/false, 1/0, yes/no, on/off)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigurationError(f"redis store: volatile={value!r} must be true or false")


def _check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise ConfigurationError(f"redis store: prefix={prefix!r} must be a str")
    if "{" in prefix or "}" in prefix:
        # A brace in the prefix would become the Cluster hash tag instead of the thread's.
        raise ConfigurationError(f"redis store: prefix={prefix!r} must not contain '{{' or '}}'")
    return prefix


class RedisBackend(RedisKv, Backend):
    """Checkpoints in Redis through redis-py (sync) and redis.asyncio (native async).

    Open with :meth:`from_url`, or pass your own clients:
    ``RedisBackend(client=redis.Redis(...), async_client=redis.asyncio.Redis(...))``
    (either may be omitted: without ``async_client`` the async methods run the
    sync client in a worker thread; without ``client`` the sync methods raise
    ``ConfigurationError``). Clients must use ``decode_responses=False``. The
    backend does not close clients it was given.
    """

    schemes: ClassVar[tuple[str, ...]] = ("redis", "rediss")
    native_async: ClassVar[bool] = True
    # kv and watch: _redis_kv.py (the RedisKv mixin, its key layout and scripts); prune: _redis_ops.py
    capabilities: ClassVar[frozenset[str]] = frozenset({"fencing", "leases", "kv", "watch", "prune"})

    def __init__(
        self,
        client: redis.Redis | None = None,
        async_client: redis.asyncio.Redis | None = None,
        *,
        prefix: str = _DEFAULT_PREFIX,
        ttl: float | None = None,
        volatile: bool = False,
    ) -> None:
        if client is None and async_client is None:
            raise ConfigurationError(
                "RedisBackend needs client= and/or async_client=, or use "
                "RedisBackend.from_url('redis://host:6379/0')"
            )
        for c, what in ((client, "client"), (async_client, "async_client")):
            if c is not None:
                _check_client(c, what)
        self._keys = Keys(_check_prefix(prefix), _parse_ttl(ttl))
        self._client = client
        self._given_async = async_client
        self._async_factory: Callable[[], Any] | None = None
        # redis.asyncio clients are bound to the loop that opened their
        # connections; clients we create are kept per loop (asyncio.run makes a
        # new one), each with the suspended async generator that closes it.
        self._per_loop: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[Any, AsyncGenerator[None, None]]
        ] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._owns = False
        self._closed = False
        self._reached = False  # whether the server ever answered (see _map_error)
        self.prefix = prefix
        self.ttl = ttl
        self.url = _describe(client if client is not None else async_client)
        # the server's persistence and the store's identity (_redis_guard.py): checked by the
        # connect hook of the clients from_url makes, at first use of clients given here
        self._guard = Guard(self._keys.prefix + b"store", self.url, volatile=_flag(volatile), ttl=bool(self._keys.ttl != b"0"))
        self._guarded = False  # True once the guard runs on every connection (or has run)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisBackend:
        """Open ``redis://`` or ``rediss://`` ``url``. Options: ``prefix=``, ``ttl=``
        (override the URL's query values); anything else is ``ConfigurationError``."""
        parts = urlsplit(url)
        if parts.scheme.lower() not in cls.schemes:
            raise ConfigurationError(
                f"not a redis URL: {mask_url(url)!r}; use 'redis://host:6379/0'"
            )
        query = parse_qsl(parts.query, keep_blank_values=True)
        driver = _driver_options(parts.scheme.lower() == "rediss")
        unknown = set(options) - set(_OPTIONS) | {n for n, _ in query if n not in _OPTIONS and n not in driver}
        if unknown:
            # redis-py would pass an unknown query option to its connection class, which
            # raises TypeError on first use: refuse it here, at connect().
            raise unknown_options(
                "redis", url, unknown, _OPTIONS,
                "in the URL query also redis-py's connection options (socket_timeout, "
                "socket_connect_timeout, client_name, health_check_interval, ...)",
            )
        ours = {name: value for name, value in query if name in _OPTIONS}
        rest = parts._replace(query=urlencode([(n, v) for n, v in query if n not in _OPTIONS]))
        driver_url = rest.geturl()
        volatile = _flag(options.get("volatile", ours.get("volatile", False)))
        prefix = _check_prefix(options.get("prefix", ours.get("prefix", _DEFAULT_PREFIX)))
        ttl = options.get("ttl", ours.get("ttl"))
        guard = Guard(Keys(prefix, 0).prefix + b"store", mask_url(url), volatile=volatile, ttl=bool(_parse_ttl(ttl)))
        tls = parts.scheme.lower() == "rediss"
        # No automatic retries by redis-py: a re-sent write would turn our own
        # commit into a ConflictError. Reads are retried once by the driver loop.
        common: dict[str, Any] = {"decode_responses": False}
        sync_only: dict[str, Any] = {"redis_connect_func": guard.on_connect}
        if tls:
            sync_only.update(connection_class=TLSConnection, shown_url=mask_url(url))
        try:
            client = redis.Redis.from_url(
                driver_url, retry=redis.retry.Retry(NoBackoff(), 0), **common, **sync_only
            )
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"invalid redis URL {mask_url(url)!r}: {exc}") from exc

        def make_async() -> Any:
            extra: dict[str, Any] = {"redis_connect_func": guard.aon_connect}
            if tls and "socket_connect_timeout" not in dict(query):
                extra["socket_connect_timeout"] = HANDSHAKE_TIMEOUT  # bounds the TLS handshake too
            return redis.asyncio.Redis.from_url(
                driver_url, retry=redis.asyncio.retry.Retry(NoBackoff(), 0), **common, **extra
            )

        backend = cls(client, prefix=prefix, ttl=ttl, volatile=volatile)
        backend._async_factory = make_async
        backend._owns = True
        backend.url = mask_url(url)
        backend._guard = guard
        backend._guarded = True
        return backend

    # -- drivers ---------------------------------------------------------------

    def _closed_error(self) -> StoreClosedError:
        return StoreClosedError(f"the redis store {self.url!r} was closed; open a new one")

    def _closed_check(self) -> None:
        if self._closed:
            raise self._closed_error()

    def _watch_error(self, exc: Exception, reached: bool) -> PersistkitError:
        """The persistkit error for a watch connection's driver error (see _map_error);
        ``reached``: that watch's own connection once reached the server."""
        return _map_error(exc, self.url, self._reached or reached)

    def _run(self, op: Op[_T]) -> _T:
        if self._closed:
            raise self._closed_error()
        client = self._client
        if client is None:
            raise ConfigurationError(
                "this RedisBackend was given only an async_client; use the a* methods or pass client="
            )
        try:
            batch = next(op)
            while True:
                batch = op.send(self._execute(client, batch))
        except StopIteration as done:
            return cast(_T, done.value)

    def _execute(self, client: Any, batch: Batch) -> builtins.list[Any]:
        attempts = 2 if batch.read_only else 1
        for attempt in range(1, attempts + 1):
            try:
                if not self._guarded:  # a user's client: no connect hook, checked at first use
                    known = self._guard.identity
                    self._guard.judge(_send(client, self._guard.commands()), known)
                    self._guarded = True
                if not batch.read_only and not self._guard.written:
                    self._guard.written_identity(_send(client, self._guard.write_identity()))
                replies = _send(client, batch.commands)
                self._reached = True
                if _needs_eval(replies):
                    replies = _send(client, _with_eval(batch.commands))
                return _checked(replies)
            except rexc.RedisError as exc:
                if attempt < attempts and _is_transient(exc) and self._reached:
                    continue
                raise _map_error(exc, self.url, self._reached) from exc
        raise AssertionError("unreachable")

    async def _async_client(self) -> Any | None:
        if self._given_async is not None:
            return self._given_async
        if self._async_factory is None:
            return None
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._per_loop.get(loop)
            if entry is not None:
                return entry[0]
            client = self._async_factory()
            closer = self._closer(loop, client)
            self._per_loop[loop] = (client, closer)
        # The loop finalizes started async generators when it shuts down
        # (asyncio.run, pytest-asyncio): that is where this client gets closed.
        await anext(closer)
        return client

    async def _closer(
        self, loop: asyncio.AbstractEventLoop, client: Any
    ) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            with self._lock:
                self._per_loop.pop(loop, None)
            await client.aclose()

    async def _arun(self, op: Op[_T]) -> _T:
        if self._closed:
            raise self._closed_error()
        client = await self._async_client()
        if client is None:
            return await asyncio.to_thread(self._run, op)
        try:
            batch = next(op)
            while True:
                batch = op.send(await self._aexecute(client, batch))
        except StopIteration as done:
            return cast(_T, done.value)

    async def _aexecute(self, client: Any, batch: Batch) -> builtins.list[Any]:
        attempts = 2 if batch.read_only else 1
        for attempt in range(1, attempts + 1):
            try:
                if not self._guarded and client is self._given_async:
                    known = self._guard.identity
                    self._guard.judge(await _asend(client, self._guard.commands()), known)
                    self._guarded = True
                if not batch.read_only and not self._guard.written:
                    self._guard.written_identity(await _asend(client, self._guard.write_identity()))
                replies = await _asend(client, batch.commands)
                self._reached = True
                if _needs_eval(replies):
                    replies = await _asend(client, _with_eval(batch.commands))
                return _checked(replies)
            except rexc.RedisError as exc:
                if attempt < attempts and _is_transient(exc) and self._reached:
                    continue
                raise _map_error(exc, self.url, self._reached) from exc
        raise AssertionError("unreachable")

    # -- the protocol: one line each, logic lives in the _op_* generators ---------

    def write(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int) -> Head:
        return self._run(op_write(self._keys, row, blobs, expected_version))

    def put_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        self._run(op_put_blobs(self._keys, thread_id, blobs))

    def head(self, thread_id: str, namespace: str) -> Head | None:
        return self._run(op_head(self._keys, thread_id, namespace))

    def get(self, thread_id: str, namespace: str, checkpoint_id: str) -> CheckpointRow | None:
        return self._run(op_get(self._keys, thread_id, namespace, checkpoint_id))

    def list(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[CheckpointRow]:
        return self._run(op_list(self._keys, thread_id, namespace, run_id, before, limit))

    def get_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        return self._run(op_get_blobs(self._keys, thread_id, keys))

    def scan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        return self._run(op_scan_blobs(self._keys, thread_id, start, stop))

    def threads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        return self._run(op_threads(self._keys, prefix, after, limit))

    def has_data(self) -> bool:
        """Whether anything is stored under this store's prefix. A fresh store (or one
        whose threads were all deleted) has nothing, and neither has a mistyped
        ``?prefix=``: the CLI, which never creates a store, says so instead of listing nothing."""
        return self._run(op_has_data(self._keys))

    def delete_thread(self, thread_id: str) -> bool:
        return self._run(op_delete(self._keys, thread_id))

    def namespaces(self, thread_id: str) -> builtins.list[str]:
        return self._run(op_namespaces(self._keys, thread_id))

    def rewrite(
        self, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]
    ) -> None:
        self._run(op_rewrite(self._keys, thread_id, rows, blobs))

    async def awrite(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int
    ) -> Head:
        return await self._arun(op_write(self._keys, row, blobs, expected_version))

    async def aput_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        await self._arun(op_put_blobs(self._keys, thread_id, blobs))

    async def ahead(self, thread_id: str, namespace: str) -> Head | None:
        return await self._arun(op_head(self._keys, thread_id, namespace))

    async def aget(
        self, thread_id: str, namespace: str, checkpoint_id: str
    ) -> CheckpointRow | None:
        return await self._arun(op_get(self._keys, thread_id, namespace, checkpoint_id))

    async def alist(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[CheckpointRow]:
        return await self._arun(op_list(self._keys, thread_id, namespace, run_id, before, limit))

    async def aget_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        return await self._arun(op_get_blobs(self._keys, thread_id, keys))

    async def ascan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        return await self._arun(op_scan_blobs(self._keys, thread_id, start, stop))

    async def athreads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        return await self._arun(op_threads(self._keys, prefix, after, limit))

    async def adelete_thread(self, thread_id: str) -> bool:
        return await self._arun(op_delete(self._keys, thread_id))

    async def anamespaces(self, thread_id: str) -> builtins.list[str]:
        return await self._arun(op_namespaces(self._keys, thread_id))

    async def arewrite(
        self, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]
    ) -> None:
        await self._arun(op_rewrite(self._keys, thread_id, rows, blobs))

    # -- lifecycle ---------------------------------------------------------------

    def close(self) -> None:
        """Close the clients this backend made (never user-supplied ones). Idempotent.

        Async clients cannot be awaited from here: each is closed when its
        event loop shuts down its async generators (``asyncio.run`` does)."""
        self._closed = True
        if self._owns and self._client is not None:
            self._client.close()
        with self._lock:
            self._per_loop.clear()

    async def aclose(self) -> None:
        """Like :meth:`close`, and also closes this loop's async client properly."""
        with self._lock:
            entry = self._per_loop.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry[1].aclose()
        self.close()


    # -- leases (persistkit.coordination): the write script behind a fence check ----------

    def write_fenced(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int
    ) -> Head:
        return self._run(op_write_fenced(self._keys, row, blobs, expected_version, fence))

    def lease_get(self, thread_id: str, namespace: str) -> LeaseRecord | None:
        return self._run(op_lease_get(self._keys, thread_id, namespace))

    def lease_swap(self, thread_id: str, namespace: str, expected: int, token: int, data: bytes) -> bool:
        return self._run(self._identity_checked(op_lease_swap(self._keys, thread_id, namespace, expected, token, data)))

    def lease_list(self, *, prefix: str = "") -> builtins.list[tuple[str, str, LeaseRecord]]:
        return self._run(op_lease_list(self._keys, prefix))

    async def awrite_fenced(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int
    ) -> Head:
        return await self._arun(op_write_fenced(self._keys, row, blobs, expected_version, fence))

    async def alease_get(self, thread_id: str, namespace: str) -> LeaseRecord | None:
        return await self._arun(op_lease_get(self._keys, thread_id, namespace))

    async def alease_swap(self, thread_id: str, namespace: str, expected: int, token: int, data: bytes) -> bool:
        op = op_lease_swap(self._keys, thread_id, namespace, expected, token, data)
        return await self._arun(self._identity_checked(op))

    def _identity_checked(self, op: Op[_T]) -> Op[_T]:
        """``op`` with the store's identity read in its first round trip: a lease's take and
        renewals (once a turn, not per step) also catch a store emptied while this process
        stayed connected (a FLUSHALL), which the connect hook cannot see (_redis_guard.py)."""
        batch, known = next(op), self._guard.identity
        replies = yield Batch((*batch.commands, ("GET", self._guard.key)), batch.read_only)
        self._guard.seen(replies[-1], known)
        try:
            batch = op.send(replies[:-1])
            while True:
                batch = op.send((yield batch))
        except StopIteration as done:
            return cast(_T, done.value)

    async def alease_list(self, *, prefix: str = "") -> builtins.list[tuple[str, str, LeaseRecord]]:
        return await self._arun(op_lease_list(self._keys, prefix))

    # -- prune (retention): Lua scripts of at most PRUNE_BATCH ids or keys (_redis_ops.py) ----

    def prune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        return self._run(op_prune_rows(self._keys, thread_id, namespace, checkpoint_ids))

    def delete_blobs(self, thread_id: str, keys: Sequence[str]) -> int:
        return self._run(op_delete_blobs(self._keys, thread_id, keys))

    def blob_sizes(self, thread_id: str) -> dict[str, int]:
        return self._run(op_blob_sizes(self._keys, thread_id))

    async def aprune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        return await self._arun(op_prune_rows(self._keys, thread_id, namespace, checkpoint_ids))

    async def adelete_blobs(self, thread_id: str, keys: Sequence[str]) -> int:
        return await self._arun(op_delete_blobs(self._keys, thread_id, keys))

    async def ablob_sizes(self, thread_id: str) -> dict[str, int]:
        return await self._arun(op_blob_sizes(self._keys, thread_id))


def _describe(client: Any) -> str:
    """A password-free URL naming a user-supplied client's server, for messages."""
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix://{kw['path']}?db={kw.get('db', 0)}"
    return f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
