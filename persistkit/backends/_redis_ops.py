"""The Redis store's logic without I/O: key layout, row format, Lua scripts, operations.

Each operation is a generator that yields :class:`Batch` es of commands (sent
in one round trip) and receives their replies; :mod:`persistkit.backends.redis`
drives it with a blocking or an awaiting client. This keeps one copy of every
decision for both drivers (the tenacity pattern). The layout is described in
the docstring of :mod:`persistkit.backends.redis`.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from hashlib import sha1
from typing import Any, TypeVar

from .._errors import BackendError, ConflictError, IntegrityError, LeaseLostError
from ._protocol import CheckpointRow, Head, LeaseRecord
from ._prune import sorted_ids

_T = TypeVar("_T")

__all__ = [
    "SOURCES",
    "Batch",
    "Cmd",
    "Keys",
    "Op",
    "op_blob_sizes",
    "op_delete",
    "op_delete_blobs",
    "op_get",
    "op_get_blobs",
    "op_head",
    "op_lease_get",
    "op_lease_list",
    "op_lease_swap",
    "op_list",
    "op_namespaces",
    "op_prune_rows",
    "op_put_blobs",
    "op_rewrite",
    "op_scan_blobs",
    "op_threads",
    "op_write",
    "op_write_fenced",
    "script_sha",
]

# -- Lua ---------------------------------------------------------------------

# Shared by the write and put_blobs scripts. Keys named by the registry set are
# in the thread's slot, so touching them from a script is Cluster-safe.
_LUA_COMMON = b"""
local function put_blobs(b, k, first)
  for j = first, #ARGV, 2 do
    if redis.call('HSETNX', b, ARGV[j], ARGV[j + 1]) == 1 then
      redis.call('ZADD', k, 0, ARGV[j])
    end
  end
end
local function refresh(ttl, b, k, x)
  if ttl ~= '0' then
    for _, key in ipairs(redis.call('SMEMBERS', x)) do redis.call('PEXPIRE', key, ttl) end
    redis.call('PEXPIRE', b, ttl)
    redis.call('PEXPIRE', k, ttl)
    redis.call('PEXPIRE', x, ttl)
  end
end
"""

# KEYS: head, rows, index, run index, blobs, blob keys, registry
# ARGV: expected version, checkpoint id, packed row, run member or '', ttl ms, blob k/v...
_LUA_WRITE = (
    _LUA_COMMON
    + b"""
local cur = redis.call('HMGET', KEYS[1], 'v', 'c')
local v = tonumber(cur[1]) or 0
if v ~= tonumber(ARGV[1]) then
  return {0, v, cur[2]}
end
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then
  return {3, v}
end
put_blobs(KEYS[5], KEYS[6], 6)
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[3], 0, ARGV[2])
if ARGV[4] ~= '' then redis.call('ZADD', KEYS[4], 0, ARGV[4]) end
redis.call('HSET', KEYS[1], 'v', v + 1, 'c', ARGV[2])
if v == 0 then redis.call('SADD', KEYS[7], KEYS[1], KEYS[2], KEYS[3], KEYS[4]) end
refresh(ARGV[5], KEYS[5], KEYS[6], KEYS[7])
return {1, v + 1}
"""
)

# KEYS: blobs, blob keys, registry. ARGV: ttl ms, blob k/v...
_LUA_PUT_BLOBS = (
    _LUA_COMMON
    + b"""
put_blobs(KEYS[1], KEYS[2], 2)
refresh(ARGV[1], KEYS[1], KEYS[2], KEYS[3])
return 1
"""
)

# KEYS: registry, blobs, blob keys. Returns how many keys existed.
_LUA_DELETE = b"""
local n = 0
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do n = n + redis.call('DEL', key) end
return n + redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
"""

# KEYS: lex zset, hash. ARGV: range bound 1, range bound 2, 'REV' or '', limit (-1 = all),
# bytes to strip from each member to get the hash field.
# Returns field, value, field, value, ... in zset order (one round trip for list/scan).
_LUA_RANGE = b"""
local args = {KEYS[1], ARGV[1], ARGV[2], 'BYLEX'}
if ARGV[3] ~= '' then args[#args + 1] = 'REV' end
if ARGV[4] ~= '-1' then
  args[#args + 1] = 'LIMIT'; args[#args + 1] = 0; args[#args + 1] = ARGV[4]
end
local out = {}
local strip = tonumber(ARGV[5])
for _, m in ipairs(redis.call('ZRANGE', unpack(args))) do
  local field = string.sub(m, strip + 1)
  local value = redis.call('HGET', KEYS[2], field)
  if value then out[#out + 1] = field; out[#out + 1] = value end
end
return out
"""

# Maintenance (key rotation). KEYS: blobs hash, then one rows hash per namespace.
# ARGV: number of row entries, then per row: index into KEYS, checkpoint id,
# new payload; then blob key/value pairs. Only fields that exist are replaced;
# a row keeps its stored parent and run id (the packed prefix is copied).
_LUA_REWRITE = b"""
local nrows = tonumber(ARGV[1])
local j = 2
for _ = 1, nrows do
  local key = KEYS[tonumber(ARGV[j])]
  local raw = redis.call('HGET', key, ARGV[j + 1])
  if raw and string.byte(raw, 1) == 1 then
    local pos = 2
    for _ = 1, 2 do
      local b1, b2, b3, b4 = string.byte(raw, pos, pos + 3)
      pos = pos + 4
      if b1 < 128 then pos = pos + ((b1 * 256 + b2) * 256 + b3) * 256 + b4 end
    end
    redis.call('HSET', key, ARGV[j + 1], string.sub(raw, 1, pos - 1) .. ARGV[j + 2])
  end
  j = j + 3
end
for i = j, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return 1
"""

SOURCES: dict[str, bytes] = {}


def script_sha(source: bytes) -> str:
    digest = sha1(source, usedforsecurity=False).hexdigest()
    SOURCES[digest] = source
    return digest


_WRITE, _PUT_BLOBS, _DELETE, _RANGE, _REWRITE = map(
    script_sha, (_LUA_WRITE, _LUA_PUT_BLOBS, _LUA_DELETE, _LUA_RANGE, _LUA_REWRITE)
)

# -- pure helpers (no I/O) ------------------------------------------------------

Cmd = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Batch:
    """Commands sent in one round trip. ``read_only`` batches may be re-sent once."""

    commands: tuple[Cmd, ...]
    read_only: bool


Op = Generator[Batch, list[Any], _T]


def _enc(s: str) -> bytes:
    # surrogatepass: a str may hold lone surrogates; UTF-8 byte order stays code-point order.
    return s.encode("utf-8", "surrogatepass")


def _dec(b: bytes) -> str:
    return b.decode("utf-8", "surrogatepass")


def _b64(s: str) -> bytes:
    return base64.urlsafe_b64encode(_enc(s)).rstrip(b"=")


def _script(sha: str, keys: Sequence[bytes], args: Sequence[Any]) -> Cmd:
    return ("EVALSHA", sha, len(keys), *keys, *args)


_NONE = struct.pack(">i", -1)


def _field(value: str | None) -> bytes:
    if value is None:
        return _NONE
    raw = _enc(value)
    return struct.pack(">i", len(raw)) + raw


def _pack(row: CheckpointRow) -> bytes:
    """Version byte, then parent and run id (length-prefixed, -1 = None), then the payload."""
    return b"\x01" + _field(row.parent_id) + _field(row.run_id) + bytes(row.payload)


def _unpack(thread_id: str, namespace: str, checkpoint_id: str, raw: bytes) -> CheckpointRow:
    try:
        if raw[:1] != b"\x01":
            raise ValueError(f"unknown row format {raw[:1]!r}")
        pos, fields = 1, []
        for _ in range(2):
            (n,) = struct.unpack_from(">i", raw, pos)
            pos += 4
            fields.append(None if n < 0 else _dec(raw[pos : pos + n]))
            pos += max(n, 0)
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        raise IntegrityError(
            f"thread {thread_id!r}: stored row {checkpoint_id!r} is malformed ({exc})"
        ) from exc
    return CheckpointRow(thread_id, namespace, checkpoint_id, fields[0], fields[1], raw[pos:])


def _pairs(flat: Sequence[bytes]) -> list[tuple[bytes, bytes]]:
    return list(zip(flat[::2], flat[1::2], strict=True))


class Keys:
    """Key names for one prefix, and the ttl applied on writes."""

    def __init__(self, prefix: str, ttl_ms: int) -> None:
        self.prefix = _enc(prefix)
        self.ttl = str(ttl_ms).encode()
        self.threads = self.prefix + b"threads"

    def thread(self, thread_id: str) -> bytes:
        return self.prefix + b"{" + _b64(thread_id) + b"}:"

    def ns(self, thread_id: str, namespace: str, kind: bytes) -> bytes:
        return self.thread(thread_id) + kind + b":" + _b64(namespace)


# -- operations: generators yielding batches, receiving replies ---------------------


def op_write(k: Keys, row: CheckpointRow, blobs: Mapping[str, bytes], expected: int) -> Op[Head]:
    t, ns = row.thread_id, row.namespace
    tk = k.thread(t)
    cid = _enc(row.checkpoint_id)
    run_member = b"" if row.run_id is None else _b64(row.run_id) + b":" + cid
    keys = (
        *(k.ns(t, ns, kind) for kind in (b"h", b"r", b"i", b"u")),
        tk + b"b",
        tk + b"k",
        tk + b"x",
    )
    args = [int(expected), cid, _pack(row), run_member, k.ttl]
    for key, value in blobs.items():
        args += (key.encode("ascii"), bytes(value))
    # ZADD after the script, on every write: a thread with a head is always listed.
    # With a ttl the index expires ttl after the newest write of ANY thread, so never
    # before a thread it lists (each expires ttl after its own newest write).
    index: tuple[Cmd, ...] = (("ZADD", k.threads, 0, _enc(t)),)
    if k.ttl != b"0":
        index += (("PEXPIRE", k.threads, k.ttl),)
    replies = yield Batch((_script(_WRITE, keys, args), *index), False)
    ok, version, *found = replies[0]
    if ok == 1:
        return Head(row.checkpoint_id, int(version))
    if ok == 3:  # (2 is the fenced script's stale token)
        raise BackendError(
            f"thread {t!r}: checkpoint {row.checkpoint_id} already exists; checkpoint ids are "
            "never reused (nothing was written)"
        )
    found_cid = found[0] if found else None
    raise ConflictError(
        thread_id=t,
        namespace=ns,
        expected=expected,
        found=int(version),
        found_checkpoint=_dec(found_cid) if found_cid else None,
    )


def op_put_blobs(k: Keys, thread_id: str, blobs: Mapping[str, bytes]) -> Op[None]:
    if not blobs:
        return
    tk = k.thread(thread_id)
    args: list[Any] = [k.ttl]
    for key, value in blobs.items():
        args += (key.encode("ascii"), bytes(value))
    yield Batch((_script(_PUT_BLOBS, (tk + b"b", tk + b"k", tk + b"x"), args),), False)


def op_head(k: Keys, thread_id: str, namespace: str) -> Op[Head | None]:
    [(v, c)] = yield Batch((("HMGET", k.ns(thread_id, namespace, b"h"), b"v", b"c"),), True)
    return None if v is None else Head(_dec(c), int(v))


def op_get(k: Keys, thread_id: str, namespace: str, checkpoint_id: str) -> Op[CheckpointRow | None]:
    cmd = ("HGET", k.ns(thread_id, namespace, b"r"), _enc(checkpoint_id))
    [raw] = yield Batch((cmd,), True)
    return None if raw is None else _unpack(thread_id, namespace, checkpoint_id, raw)


def op_list(
    k: Keys,
    thread_id: str,
    namespace: str,
    run_id: str | None,
    before: str | None,
    limit: int | None,
) -> Op[list[CheckpointRow]]:
    if limit is not None and limit <= 0:
        return []
    if run_id is None:
        index, member = k.ns(thread_id, namespace, b"i"), b""
    else:
        index, member = k.ns(thread_id, namespace, b"u"), _b64(run_id) + b":"
    if before is not None:
        hi = b"(" + member + _enc(before)
    else:
        # 0xff never occurs in UTF-8, so it bounds every member starting with ``member``.
        hi = b"(" + member + b"\xff" if member else b"+"
    lo = b"[" + member if member else b"-"
    args = (hi, lo, b"REV", -1 if limit is None else limit, len(member))
    cmd = _script(_RANGE, (index, k.ns(thread_id, namespace, b"r")), args)
    [flat] = yield Batch((cmd,), True)
    return [_unpack(thread_id, namespace, _dec(c), raw) for c, raw in _pairs(flat)]


def op_get_blobs(k: Keys, thread_id: str, keys: Sequence[str]) -> Op[dict[str, bytes]]:
    if not keys:
        return {}
    names = list(dict.fromkeys(keys))
    cmd = ("HMGET", k.thread(thread_id) + b"b", *(n.encode("ascii") for n in names))
    [values] = yield Batch((cmd,), True)
    return {n: v for n, v in zip(names, values, strict=True) if v is not None}


def op_scan_blobs(k: Keys, thread_id: str, start: str, stop: str) -> Op[dict[str, bytes]]:
    if start >= stop:
        return {}
    tk = k.thread(thread_id)
    args = (b"[" + start.encode("ascii"), b"(" + stop.encode("ascii"), b"", -1, 0)
    [flat] = yield Batch((_script(_RANGE, (tk + b"k", tk + b"b"), args),), True)
    return {key.decode("ascii"): value for key, value in _pairs(flat)}


def op_has_data(k: Keys) -> Op[bool]:
    """Whether any key lives under the prefix: the thread index, else a SCAN matching the
    prefix (the CLI's test that a store is there before it reads; never on the step path)."""
    [indexed] = yield Batch((("EXISTS", k.threads),), True)
    if indexed:
        return True
    pattern = b"".join(b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c]) for c in k.prefix) + b"*"
    cursor: Any = 0
    while True:
        [(cursor, found)] = yield Batch((("SCAN", cursor, "MATCH", pattern, "COUNT", 1000),), True)
        if any(key != k.prefix + b"store" for key in found):  # (the store's identity: _redis_guard.py)
            return True
        if int(cursor) == 0:
            return False


def op_threads(k: Keys, prefix: str, after: str | None, limit: int | None) -> Op[list[str]]:
    if limit is not None and limit <= 0:
        return []
    lo = b"[" + _enc(prefix) if prefix else b"-"
    if after is not None and after >= prefix:
        lo = b"(" + _enc(after)
    hi = b"(" + _enc(prefix) + b"\xff" if prefix else b"+"
    out: list[str] = []
    while True:
        want = None if limit is None else limit - len(out)
        page = () if want is None else ("LIMIT", 0, want)
        [members] = yield Batch((("ZRANGE", k.threads, lo, hi, "BYLEX", *page),), True)
        if not members:
            return out
        ids = [_dec(m) for m in members]
        # Skip index entries whose thread has no head (see the module docstring).
        alive = yield Batch(tuple(("EXISTS", k.thread(t) + b"x") for t in ids), True)
        out += [t for t, n in zip(ids, alive, strict=True) if n]
        dead = [m for m, n in zip(members, alive, strict=True) if not n]
        if dead and k.ttl != b"0":
            # Threads that expired (ttl): drop their stale ids, then put back any that a
            # write re-created meanwhile (its ZADD may have come before our ZREM; the
            # registry key exists from its script on). The index and the registries
            # live in different hash slots, so this cannot be one script on a cluster.
            yield Batch((("ZREM", k.threads, *dead),), True)
            back = yield Batch(tuple(("EXISTS", k.thread(_dec(m)) + b"x") for m in dead), True)
            revived = [m for m, n in zip(dead, back, strict=True) if n]
            if revived:
                yield Batch((("ZADD", k.threads, *(x for m in revived for x in (0, m))),), True)
        if want is None or len(members) < want or (limit is not None and len(out) >= limit):
            return out
        lo = b"(" + members[-1]


def op_namespaces(k: Keys, thread_id: str) -> Op[list[str]]:
    # The registry set names the h/r/i/u keys of every namespace the thread wrote.
    [members] = yield Batch((("SMEMBERS", k.thread(thread_id) + b"x"),), True)
    # (rows never exist without that head entry: both are added by the same script).
    head_tag = k.thread(thread_id) + b"h:"
    found = set()
    for m in members:
        if m.startswith(head_tag):
            enc = m[len(head_tag) :]
            found.add(_dec(base64.urlsafe_b64decode(enc + b"=" * (-len(enc) % 4))))
    return sorted(found)


def op_rewrite(
    k: Keys, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]
) -> Op[None]:
    if not rows and not blobs:
        return
    keys: list[bytes] = [k.thread(thread_id) + b"b"]
    index: dict[str, int] = {}
    args: list[Any] = [len(rows)]
    for row in rows:
        if row.namespace not in index:
            keys.append(k.ns(thread_id, row.namespace, b"r"))
            index[row.namespace] = len(keys)  # Lua indexes KEYS from 1
        args += (index[row.namespace], _enc(row.checkpoint_id), bytes(row.payload))
    for key, value in blobs.items():
        args += (key.encode("ascii"), bytes(value))
    yield Batch((_script(_REWRITE, keys, args),), False)


def op_delete(k: Keys, thread_id: str) -> Op[bool]:
    tk = k.thread(thread_id)
    script = _script(_DELETE, (tk + b"x", tk + b"b", tk + b"k"), ())
    # Index entry removed after the data: a listed thread never lacks data it had.
    replies = yield Batch((script, ("ZREM", k.threads, _enc(thread_id))), False)
    return int(replies[0]) > 0


# -- leases (persistkit.coordination) ---------------------------------------------------
#
#   P{T}:l:N   hash   the lease of (thread, namespace): t = fencing token, d = data, v = version
#
# In the thread's slot, so the fenced write checks it inside its own script. Not in
# the registry set: delete_thread keeps it, since tokens must keep increasing. The
# expiry lives in the data (judged by the coordination layer), not in a PX: a record
# that vanished on expiry would restart the tokens.

# The write script, behind a check of the fence (the last ARGV, taken off before the
# write reads its blob pairs) against the lease's token (KEYS[8]): both in ONE script.
_LUA_WRITE_FENCED = (
    _LUA_COMMON
    + b"""
local fence = tonumber(table.remove(ARGV))
local held = tonumber(redis.call('HGET', KEYS[8], 't')) or 0
if held ~= fence then
  return {2, held}
end
"""
    + _LUA_WRITE[len(_LUA_COMMON) :]
)

# KEYS: lease. ARGV: expected version, token, data.
_LUA_LEASE_SWAP = b"""
local v = tonumber(redis.call('HGET', KEYS[1], 'v')) or 0
if v ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'v', v + 1, 't', ARGV[2], 'd', ARGV[3])
return 1
"""

_WRITE_FENCED, _LEASE_SWAP = map(script_sha, (_LUA_WRITE_FENCED, _LUA_LEASE_SWAP))


def op_write_fenced(k: Keys, row: CheckpointRow, blobs: Mapping[str, bytes], expected: int, fence: int) -> Op[Head]:
    write = op_write(k, row, blobs, expected)
    batch = next(write)
    script, *index = batch.commands  # the write script, then the thread index's ZADD (+ PEXPIRE with a ttl)
    n = script[2]
    keys, args = script[3 : 3 + n], script[3 + n :]
    fenced = _script(_WRITE_FENCED, (*keys, k.ns(row.thread_id, row.namespace, b"l")), (*args, int(fence)))
    replies = yield Batch((fenced, *index), False)
    if replies[0][0] == 2:
        write.close()
        raise LeaseLostError(thread_id=row.thread_id, namespace=row.namespace, token=fence, found=int(replies[0][1]))
    try:
        write.send(replies)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise AssertionError("op_write yields one batch")


def op_lease_get(k: Keys, thread_id: str, namespace: str) -> Op[LeaseRecord | None]:
    [(t, d, v)] = yield Batch((("HMGET", k.ns(thread_id, namespace, b"l"), b"t", b"d", b"v"),), True)
    return None if v is None else LeaseRecord(int(t), bytes(d), int(v))


def op_lease_swap(k: Keys, thread_id: str, namespace: str, expected: int, token: int, data: bytes) -> Op[bool]:
    cmd = _script(_LEASE_SWAP, (k.ns(thread_id, namespace, b"l"),), (int(expected), int(token), bytes(data)))
    [ok] = yield Batch((cmd,), False)
    return int(ok) == 1


def _unb64(enc: bytes) -> str:
    return _dec(base64.urlsafe_b64decode(enc + b"=" * (-len(enc) % 4)))


def op_lease_list(k: Keys, prefix: str) -> Op[list[tuple[str, str, LeaseRecord]]]:
    escaped = b"".join(b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c]) for c in k.prefix)
    pattern = escaped + b"{*}:l:*"
    cursor: Any = 0
    names: set[bytes] = set()
    while True:
        [(cursor, found)] = yield Batch((("SCAN", cursor, "MATCH", pattern, "COUNT", 1000),), True)
        names.update(found)
        if int(cursor) == 0:
            break
    out: list[tuple[str, str, LeaseRecord]] = []
    picked: list[tuple[str, str, bytes]] = []
    for name in sorted(names):
        t_enc, _, ns_enc = name[len(k.prefix) + 1 :].partition(b"}:l:")
        t = _unb64(t_enc)
        if t.startswith(prefix):
            picked.append((t, _unb64(ns_enc), name))
    if not picked:
        return out
    replies = yield Batch(tuple(("HMGET", name, b"t", b"d", b"v") for _, _, name in picked), True)
    for (t, ns, _), (tok, d, v) in zip(picked, replies, strict=True):
        if v is not None:
            out.append((t, ns, LeaseRecord(int(tok), bytes(d), int(v))))
    out.sort(key=lambda e: (e[0], e[1]))
    return out


# -- prune (retention; persistkit/backends/_prune.py) ---------------------------------
#
# A script blocks the server while it runs, so a long list goes in batches of
# PRUNE_BATCH ids or keys, each its own script (and round trip), newest first (the
# order of backends/_prune.py: an interrupted prune leaves the older part); each batch
# reads the head anew, and the head only moves forward, so a later batch never deletes
# what an earlier one had to keep.

PRUNE_BATCH = 500

# KEYS: head, rows, index, run index. ARGV: checkpoint ids. Deletes each row whose id
# is below the head's (in byte order: Lua's ``<`` on strings follows the server's
# locale), its index entry, and its run index entry, whose member is the base64url of
# the run id read from the packed row (``_pack``: format byte, then parent and run as
# 4-byte big-endian lengths, -1 = None). Returns how many rows it deleted.
_LUA_PRUNE_ROWS = b"""
local B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'
local function b64(s)
  local out = {}
  for i = 1, #s, 3 do
    local a, b, c = string.byte(s, i, i + 2)
    local n = (a * 256 + (b or 0)) * 256 + (c or 0)
    for j = 1, (b == nil and 2) or (c == nil and 3) or 4 do
      local x = math.floor(n / 2 ^ (6 * (4 - j))) % 64
      out[#out + 1] = string.sub(B64, x + 1, x + 1)
    end
  end
  return table.concat(out)
end
local function below(x, y)
  for i = 1, math.min(#x, #y) do
    local p, q = string.byte(x, i), string.byte(y, i)
    if p ~= q then return p < q end
  end
  return #x < #y
end
local function field(raw, pos)
  local b1, b2, b3, b4 = string.byte(raw, pos, pos + 3)
  if b1 == nil or b1 >= 128 then return nil, pos + 4 end
  local n = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
  return string.sub(raw, pos + 4, pos + 3 + n), pos + 4 + n
end
local head = redis.call('HGET', KEYS[1], 'c')
if not head then return 0 end
local n = 0
for _, cid in ipairs(ARGV) do
  if below(cid, head) then
    local raw = redis.call('HGET', KEYS[2], cid)
    if raw then
      redis.call('HDEL', KEYS[2], cid)
      redis.call('ZREM', KEYS[3], cid)
      if string.byte(raw, 1) == 1 then
        local _, pos = field(raw, 2)
        local run = field(raw, pos)
        if run then redis.call('ZREM', KEYS[4], b64(run) .. ':' .. cid) end
      end
      n = n + 1
    end
  end
end
return n
"""

# KEYS: blobs, blob keys. ARGV: blob keys. Returns how many existed.
_LUA_DELETE_BLOBS = b"""
local n = 0
for _, key in ipairs(ARGV) do
  n = n + redis.call('HDEL', KEYS[1], key)
  redis.call('ZREM', KEYS[2], key)
end
return n
"""

# KEYS: blob keys, blobs. ARGV: lower bound (ZRANGE BYLEX), page size. Returns the last
# index member read ('' after the last page), then key, size, key, size, ... of the page.
_LUA_BLOB_SIZES = b"""
local page = redis.call('ZRANGE', KEYS[1], ARGV[1], '+', 'BYLEX', 'LIMIT', 0, ARGV[2])
local out = {''}
if #page == tonumber(ARGV[2]) then out[1] = page[#page] end
for _, key in ipairs(page) do
  local size = redis.call('HSTRLEN', KEYS[2], key)
  if size > 0 or redis.call('HEXISTS', KEYS[2], key) == 1 then
    out[#out + 1] = key; out[#out + 1] = size
  end
end
return out
"""

_PRUNE_ROWS, _DELETE_BLOBS, _BLOB_SIZES = map(script_sha, (_LUA_PRUNE_ROWS, _LUA_DELETE_BLOBS, _LUA_BLOB_SIZES))


def op_prune_rows(k: Keys, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> Op[int]:
    keys = tuple(k.ns(thread_id, namespace, kind) for kind in (b"h", b"r", b"i", b"u"))
    ids = [_enc(c) for c in sorted_ids(checkpoint_ids)]
    deleted = 0
    for i in range(0, len(ids), PRUNE_BATCH):
        [n] = yield Batch((_script(_PRUNE_ROWS, keys, ids[i : i + PRUNE_BATCH]),), False)
        deleted += int(n)
    return deleted


def op_delete_blobs(k: Keys, thread_id: str, keys: Sequence[str]) -> Op[int]:
    tk = k.thread(thread_id)
    names = [key.encode("ascii") for key in sorted(set(keys))]
    deleted = 0
    for i in range(0, len(names), PRUNE_BATCH):
        [n] = yield Batch((_script(_DELETE_BLOBS, (tk + b"b", tk + b"k"), names[i : i + PRUNE_BATCH]),), False)
        deleted += int(n)
    return deleted


def op_blob_sizes(k: Keys, thread_id: str) -> Op[dict[str, int]]:
    """Sizes from the thread's blob index (``P{T}:k``), a page per script: never a SCAN."""
    tk = k.thread(thread_id)
    sizes: dict[str, int] = {}
    lo = b"-"
    while True:
        [(last, *flat)] = yield Batch((_script(_BLOB_SIZES, (tk + b"k", tk + b"b"), (lo, PRUNE_BATCH)),), True)
        sizes.update((key.decode("ascii"), int(size)) for key, size in _pairs(flat))
        if not last:
            return sizes
        lo = b"(" + last
