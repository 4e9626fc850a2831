"""The Redis store's ``kv`` and ``watch`` capabilities: key layout, Lua scripts, operations,
the :class:`RedisKv` mixin and the pub/sub watches.

Key layout of one scope (``P`` = the store's prefix, ``S`` = the scope; scope names are
``[A-Za-z0-9_.-]``, and the ``k.`` start holds a dot, which base64url thread tags never
hold, so no scope tag equals a thread's)::

    P{k.S}:v:<key>   hash   l = latest version; "<n>" = version n: "=" + value, or "-" (tombstone)
    P{k.S}:live      zset   the keys whose latest version is not a tombstone, score 0 (kv_list)
    P{k.S}:all       zset   every key that has a hash, tombstones included (kv_drop)
    P{k.S}:c                the pub/sub channel of the scope's hints (a channel, not a key)

The store's ``ttl=`` applies to threads only: kv keys never expire (a board outlives runs).

Redis Cluster: the ``{k.S}`` hash tag puts every key of one scope in one slot, so each
script is single-slot (one scope is limited to one node's memory and throughput).
Listing reads the ``live`` sorted set with ``ZRANGE BYLEX`` (member = the key's UTF-8,
so byte order is code-point order): never ``SCAN``. The kept versions of a key are
always a contiguous run ending at the latest, so a write trims by deleting downward
from ``latest - keep`` until a field is missing.

``kv_write`` is ONE script: it checks every op's latest version, writes the versions,
trims, updates both sorted sets and ``PUBLISH``es one message to the scope's channel
(``"<version>:<key>"`` per op, joined by NUL, which keys never hold); a conflict
returns before any write, so it publishes nothing. ``kv_drop`` deletes in batches of
:data:`DROP_BATCH` keys per script (a script blocks the server) and publishes an empty
message ("list again").

Watches subscribe on a dedicated connection each (its own one-connection pool, named
``persistkit:watch:<scope>`` in ``CLIENT LIST``, redis-py's retries off so that a
dropped connection is seen, never silently re-made). Pub/sub is at-most-once: after a
dropped connection the next ``hints`` subscribes again and returns ``[KvHint(None)]``.
Keyspace notifications are not used: they are off by default and often not
configurable on managed Redis.
"""

from __future__ import annotations

import asyncio
import builtins
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.asyncio
import redis.exceptions as rexc
from redis.backoff import NoBackoff

from .._errors import ConfigurationError, ConflictError, PersistkitError, StoreClosedError
from ._protocol import KvEntry, KvHint, KvOp, KvWatch
from ._redis_ops import Batch, Keys, Op, _dec, _enc, _script, script_sha

__all__ = ["DROP_BATCH", "RedisKv", "op_kv_drop", "op_kv_get", "op_kv_history", "op_kv_list", "op_kv_write"]

_T = TypeVar("_T")

#: keys deleted per script by kv_drop: bounds how long one script blocks the server
DROP_BATCH = 500
_SCOPE = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
_SUBSCRIBE_TIMEOUT = 10.0

# -- Lua ----------------------------------------------------------------------------

# KEYS: live, all, then one hash per op. ARGV: keep, channel, then per op: key, expected,
# "=" + value or "-". Returns {1} or {0, op index (from 1), found version}.
_LUA_KV_WRITE = b"""
local keep = tonumber(ARGV[1])
local n = #KEYS - 2
local found = {}
for i = 1, n do
  local v = tonumber(redis.call('HGET', KEYS[2 + i], 'l')) or 0
  if v ~= tonumber(ARGV[3 * i + 1]) then return {0, i, v} end
  found[i] = v
end
local hints = {}
for i = 1, n do
  local h, m, val = KEYS[2 + i], ARGV[3 * i], ARGV[3 * i + 2]
  local v = found[i] + 1
  redis.call('HSET', h, 'l', v, v, val)
  local old = v - keep
  while old > 0 and redis.call('HDEL', h, old) == 1 do old = old - 1 end
  if string.sub(val, 1, 1) == '=' then
    redis.call('ZADD', KEYS[1], 0, m)
  else
    redis.call('ZREM', KEYS[1], m)
  end
  redis.call('ZADD', KEYS[2], 0, m)
  hints[i] = v .. ':' .. m
end
redis.call('PUBLISH', ARGV[2], table.concat(hints, '\\0'))
return {1}
"""

# KEYS: hash. Returns {latest version, stored value} or nil.
_LUA_KV_GET = b"""
local v = redis.call('HGET', KEYS[1], 'l')
if not v then return false end
local val = redis.call('HGET', KEYS[1], v)
if not val then return false end
return {v, val}
"""

# KEYS: live. ARGV: lex bound low, lex bound high, limit (-1 = all), hash name prefix.
# Returns key, version, stored value, ... in key order (one round trip, one snapshot).
_LUA_KV_LIST = b"""
local args = {KEYS[1], ARGV[1], ARGV[2], 'BYLEX'}
if ARGV[3] ~= '-1' then
  args[#args + 1] = 'LIMIT'; args[#args + 1] = 0; args[#args + 1] = ARGV[3]
end
local out = {}
for _, m in ipairs(redis.call('ZRANGE', unpack(args))) do
  local h = ARGV[4] .. m
  local v = redis.call('HGET', h, 'l')
  local val = v and redis.call('HGET', h, v)
  if val then out[#out + 1] = m; out[#out + 1] = v; out[#out + 1] = val end
end
return out
"""

# KEYS: live, all. ARGV: hash name prefix, batch size, channel.
# Returns {keys deleted now, keys left}.
_LUA_KV_DROP = b"""
local ms = redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[2]) - 1)
for _, m in ipairs(ms) do redis.call('DEL', ARGV[1] .. m) end
if #ms > 0 then
  redis.call('ZREM', KEYS[2], unpack(ms))
  redis.call('ZREM', KEYS[1], unpack(ms))
  redis.call('PUBLISH', ARGV[3], '')
end
local left = redis.call('ZCARD', KEYS[2])
if left == 0 then redis.call('DEL', KEYS[1]) end
return {#ms, left}
"""

_KV_WRITE, _KV_GET, _KV_LIST, _KV_DROP = map(script_sha, (_LUA_KV_WRITE, _LUA_KV_GET, _LUA_KV_LIST, _LUA_KV_DROP))

# -- pure helpers -------------------------------------------------------------------


def _tag(k: Keys, scope: str) -> bytes:
    if not isinstance(scope, str) or not _SCOPE.match(scope):
        # A brace would move the scope's hash tag; the layer above validates, this guards the slot.
        raise ConfigurationError(f"kv scope {scope!r} must be 1 to 64 characters of [A-Za-z0-9_.-]")
    return k.prefix + b"{k." + scope.encode("ascii") + b"}:"


def channel(k: Keys, scope: str) -> bytes:
    """The pub/sub channel of ``scope``'s hints."""
    return _tag(k, scope) + b"c"


def _entry(key: str, version: bytes | int, raw: bytes) -> KvEntry:
    return KvEntry(key, int(version), None if raw[:1] == b"-" else raw[1:])


def parse_hints(payload: bytes) -> builtins.list[KvHint]:
    """The hints of one published message; an empty one means "list again"."""
    if not payload:
        return [KvHint(None)]
    out = []
    for part in payload.split(b"\0"):
        version, _, key = part.partition(b":")
        out.append(KvHint(_dec(key), int(version)))
    return out


# -- operations ------------------------------------------------------------------------


def op_kv_get(k: Keys, scope: str, key: str, version: int | None) -> Op[KvEntry | None]:
    h = _tag(k, scope) + b"v:" + _enc(key)
    if version is None:
        [found] = yield Batch((_script(_KV_GET, (h,), ()),), True)
        return None if not found else _entry(key, found[0], found[1])
    if int(version) <= 0:
        return None
    [raw] = yield Batch((("HGET", h, str(int(version)).encode()),), True)
    return None if raw is None else _entry(key, version, raw)


def op_kv_history(k: Keys, scope: str, key: str, before: int | None, limit: int | None) -> Op[list[KvEntry]]:
    [flat] = yield Batch((("HGETALL", _tag(k, scope) + b"v:" + _enc(key)),), True)
    items = flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=True)
    kept = sorted(((int(f), raw) for f, raw in items if f != b"l"), key=lambda e: -e[0])
    picked = [_entry(key, v, raw) for v, raw in kept if before is None or v < before]
    return picked if limit is None else picked[: max(limit, 0)]


def op_kv_list(k: Keys, scope: str, prefix: str, after: str | None, limit: int | None) -> Op[list[KvEntry]]:
    if limit is not None and limit <= 0:
        return []
    t = _tag(k, scope)
    lo = b"[" + _enc(prefix) if prefix else b"-"
    if after is not None and after >= prefix:
        lo = b"(" + _enc(after)
    # 0xff never occurs in UTF-8, so it bounds every key starting with ``prefix``.
    hi = b"(" + _enc(prefix) + b"\xff" if prefix else b"+"
    args = (lo, hi, -1 if limit is None else int(limit), t + b"v:")
    [flat] = yield Batch((_script(_KV_LIST, (t + b"live",), args),), True)
    return [_entry(_dec(flat[i]), flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]


def op_kv_write(k: Keys, scope: str, ops: Sequence[KvOp], keep: int) -> Op[None]:
    t = _tag(k, scope)
    if not ops:
        return
    keys = [t + b"live", t + b"all", *(t + b"v:" + _enc(op.key) for op in ops)]
    args: list[Any] = [max(int(keep), 1), t + b"c"]
    for op in ops:
        args += (_enc(op.key), int(op.expected), b"-" if op.value is None else b"=" + bytes(op.value))
    [reply] = yield Batch((_script(_KV_WRITE, keys, args),), False)
    if int(reply[0]) == 0:
        op = ops[int(reply[1]) - 1]
        raise ConflictError(key=op.key, namespace=scope, expected=op.expected, found=int(reply[2]))


def op_kv_drop(k: Keys, scope: str) -> Op[bool]:
    t = _tag(k, scope)
    existed = False
    while True:
        cmd = _script(_KV_DROP, (t + b"live", t + b"all"), (t + b"v:", DROP_BATCH, t + b"c"))
        [(deleted, left)] = yield Batch((cmd,), False)
        existed = existed or int(deleted) > 0
        if int(left) == 0:
            return existed


# -- watches -------------------------------------------------------------------------------

# (driver error, whether this watch's connection ever reached the server) -> the error to raise
_MapError = Callable[[Exception, bool], PersistkitError]


def _dedicated_kwargs(client: Any, scope: str, retry: Any) -> tuple[Any, dict[str, Any]]:
    """The connection class and options of ``client``'s pool, for a watch's own pool:
    redis-py's retries off (a re-made connection would hide lost hints) and a name."""
    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs["retry"] = retry
    _name(kwargs, scope)
    return pool.connection_class, kwargs


def _name(kwargs: dict[str, Any], scope: str) -> None:
    """A watch connection's name (``CLIENT LIST``): the URL's ``client_name=`` when given,
    as every other connection of the store has it (PostgreSQL's ``application_name``
    reaches its LISTEN connection the same way), else ``persistkit:watch:<scope>``."""
    if not kwargs.get("client_name"):
        kwargs["client_name"] = f"persistkit:watch:{scope}"


class _Pending:
    """Coalesces hints: the highest version per key, and whether to list again."""

    def __init__(self) -> None:
        self.keys: dict[str, int] = {}
        self.relist = False

    def add(self, message: Any) -> None:
        if not isinstance(message, dict) or message.get("type") != "message":
            return
        for h in parse_hints(message["data"]):
            if h.key is None:
                self.relist = True
            else:
                self.keys[h.key] = max(h.version, self.keys.get(h.key, 0))

    def hints(self) -> builtins.list[KvHint]:
        out = [KvHint(None)] if self.relist else []
        return out + [KvHint(key, v) for key, v in self.keys.items()]


class RedisWatch(KvWatch):
    """A blocking pub/sub watch of one scope on its own connection."""

    def __init__(self, client: Any, scope: str, chan: bytes, url: str, fail: _MapError) -> None:
        cls, kwargs = _dedicated_kwargs(client, scope, redis.retry.Retry(NoBackoff(), 0))

        def make() -> Any:
            return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=cls, **kwargs))

        self._make: Callable[[], Any] = make
        self._chan, self._url, self._fail = chan, url, fail
        self._lock = threading.Lock()
        self._pubsub: Any = None
        self._closed = False
        self._reached = False
        self._subscribe()

    def _subscribe(self) -> None:
        client = self._make()
        pubsub = client.pubsub()
        try:
            pubsub.subscribe(self._chan)
            # Wait for the confirmation: a write committed after watch_open returns must be seen.
            deadline = time.monotonic() + _SUBSCRIBE_TIMEOUT
            while True:
                msg = pubsub.get_message(timeout=max(deadline - time.monotonic(), 0.0))
                if isinstance(msg, dict) and msg.get("type") == "subscribe":
                    break
                if time.monotonic() >= deadline:
                    raise rexc.TimeoutError(f"no SUBSCRIBE confirmation in {_SUBSCRIBE_TIMEOUT}s")
        except rexc.RedisError as exc:
            pubsub.close()
            client.connection_pool.disconnect()
            raise self._fail(exc, self._reached) from exc
        self._pubsub = pubsub
        self._reached = True

    def _drop(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            pubsub.close()
            pubsub.connection_pool.disconnect()

    def hints(self, timeout: float) -> builtins.list[KvHint]:
        with self._lock:
            if self._closed:
                raise StoreClosedError(f"this watch on {self._url!r} was closed; open a new one")
            if self._pubsub is None:  # dropped before: hints may have been lost meanwhile
                self._subscribe()
                return [KvHint(None)]
            pubsub = self._pubsub
        pending = _Pending()
        end = time.monotonic() + max(timeout, 0.0)
        try:
            while True:
                pending.add(pubsub.get_message(ignore_subscribe_messages=True, timeout=max(end - time.monotonic(), 0.0)))
                if pending.keys or pending.relist:
                    while (msg := pubsub.get_message(ignore_subscribe_messages=True, timeout=0.0)) is not None:
                        pending.add(msg)
                    return pending.hints()
                if time.monotonic() >= end:
                    return []
        except Exception as exc:
            with self._lock:
                if self._closed:  # close() from another thread released the connection under us
                    return []
                if not isinstance(exc, rexc.RedisError | OSError):
                    raise
                self._drop()
                self._subscribe()  # raises BackendUnavailableError; the next call tries again
                return [KvHint(None)]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()


class AsyncRedisWatch(KvWatch):
    """A pub/sub watch of one scope on its own redis.asyncio connection (bound to its loop)."""

    def __init__(self, make: Callable[[], Any], chan: bytes, url: str, fail: _MapError) -> None:
        self._make, self._chan, self._url, self._fail = make, chan, url, fail
        self._closing: asyncio.Task[None] | None = None
        self._pubsub: Any = None
        self._closed = False
        self._reached = False

    async def subscribe(self) -> None:
        client = self._make()
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(self._chan)
            deadline = time.monotonic() + _SUBSCRIBE_TIMEOUT
            while True:
                msg = await pubsub.get_message(timeout=max(deadline - time.monotonic(), 0.0))
                if isinstance(msg, dict) and msg.get("type") == "subscribe":
                    break
                if time.monotonic() >= deadline:
                    raise rexc.TimeoutError(f"no SUBSCRIBE confirmation in {_SUBSCRIBE_TIMEOUT}s")
        except rexc.RedisError as exc:
            await pubsub.aclose()
            await client.connection_pool.disconnect()
            raise self._fail(exc, self._reached) from exc
        self._pubsub = pubsub
        self._reached = True

    async def _drop(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            await pubsub.aclose()
            await pubsub.connection_pool.disconnect()

    def hints(self, timeout: float) -> builtins.list[KvHint]:
        raise ConfigurationError(
            "this watch was opened with awatch_open and is bound to its event loop: use await watch.ahints()"
        )

    async def ahints(self, timeout: float) -> builtins.list[KvHint]:
        if self._closed:
            raise StoreClosedError(f"this watch on {self._url!r} was closed; open a new one")
        if self._pubsub is None:
            await self.subscribe()
            return [KvHint(None)]
        pubsub = self._pubsub
        pending = _Pending()
        end = time.monotonic() + max(timeout, 0.0)
        try:
            while True:
                left = max(end - time.monotonic(), 0.0)
                pending.add(await pubsub.get_message(ignore_subscribe_messages=True, timeout=left))
                if pending.keys or pending.relist:
                    while (msg := await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.0)) is not None:
                        pending.add(msg)
                    return pending.hints()
                if time.monotonic() >= end:
                    return []
        except Exception as exc:
            if self._closed:
                return []
            if not isinstance(exc, rexc.RedisError | OSError):
                raise
            await self._drop()
            await self.subscribe()
            return [KvHint(None)]

    def close(self) -> None:
        """Stop watching. Called from the watch's own loop, the connection is released by a
        task of that loop; prefer ``await watch.aclose()``, which waits for it."""
        self._closed = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop here: the connection is freed with the watch
            return
        self._closing = loop.create_task(self._drop())

    async def aclose(self) -> None:
        self._closed = True
        await self._drop()


# -- the mixin ------------------------------------------------------------------------------


class RedisKv:
    """The kv and watch methods of ``RedisBackend`` (listed before ``Backend`` in its bases)."""

    _keys: Keys
    _client: Any
    _given_async: Any
    _async_factory: Callable[[], Any] | None
    url: str

    if TYPE_CHECKING:

        def _run(self, op: Op[_T]) -> _T: ...

        async def _arun(self, op: Op[_T]) -> _T: ...

        def _watch_error(self, exc: Exception, reached: bool) -> PersistkitError: ...

        def _closed_check(self) -> None: ...

    def kv_get(self, scope: str, key: str, version: int | None = None) -> KvEntry | None:
        return self._run(op_kv_get(self._keys, scope, key, version))

    def kv_history(
        self, scope: str, key: str, *, before: int | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        return self._run(op_kv_history(self._keys, scope, key, before, limit))

    def kv_list(
        self, scope: str, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        return self._run(op_kv_list(self._keys, scope, prefix, after, limit))

    def kv_write(self, scope: str, ops: Sequence[KvOp], *, keep: int) -> None:
        self._run(op_kv_write(self._keys, scope, ops, keep))

    def kv_drop(self, scope: str) -> bool:
        return self._run(op_kv_drop(self._keys, scope))

    def watch_open(self, scope: str) -> KvWatch:
        self._closed_check()
        if self._client is None:
            raise ConfigurationError(
                "this RedisBackend was given only an async_client; use awatch_open or pass client="
            )
        return RedisWatch(self._client, scope, channel(self._keys, scope), self.url, self._watch_error)

    async def akv_get(self, scope: str, key: str, version: int | None = None) -> KvEntry | None:
        return await self._arun(op_kv_get(self._keys, scope, key, version))

    async def akv_history(
        self, scope: str, key: str, *, before: int | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        return await self._arun(op_kv_history(self._keys, scope, key, before, limit))

    async def akv_list(
        self, scope: str, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        return await self._arun(op_kv_list(self._keys, scope, prefix, after, limit))

    async def akv_write(self, scope: str, ops: Sequence[KvOp], *, keep: int) -> None:
        await self._arun(op_kv_write(self._keys, scope, ops, keep))

    async def akv_drop(self, scope: str) -> bool:
        return await self._arun(op_kv_drop(self._keys, scope))

    async def awatch_open(self, scope: str) -> KvWatch:
        self._closed_check()
        chan = channel(self._keys, scope)
        if self._given_async is not None:
            cls, kwargs = _dedicated_kwargs(self._given_async, scope, redis.asyncio.retry.Retry(NoBackoff(), 0))

            def make() -> Any:
                pool = redis.asyncio.ConnectionPool(connection_class=cls, **kwargs)
                return redis.asyncio.Redis(connection_pool=pool)

        elif self._async_factory is not None:
            factory = self._async_factory

            def make() -> Any:
                # A fresh client (no connection made yet): its own pool is the watch's.
                client = factory()
                _name(client.connection_pool.connection_kwargs, scope)
                return client

        else:  # a sync client only: the blocking watch, waited on in a worker thread
            return await asyncio.to_thread(self.watch_open, scope)
        watch = AsyncRedisWatch(make, chan, self.url, self._watch_error)
        await watch.subscribe()
        return watch
