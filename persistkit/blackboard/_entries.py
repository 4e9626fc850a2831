"""What a board stores: keys, values in an envelope, entries, change events, policies.

A value is stored as the codec stores a step's result (type-tagged JSON, secrets redacted
into handles, compressed when large; the store's wrappers then seal or tag the bytes), in
an envelope that carries what the board needs beside the value::

    {"v": <the value's tree>, "t": <written at, unix seconds>,
     "x": <expires at>, "c": {"o": <claim owner>, "u": <claim until>}}

``x`` and ``c`` only when set. Expiry and claim deadlines are judged by the clock
of the host that reads them (as leases are): a skewed clock makes them early or late, and
the fencing token (the item's version) keeps a claim safe either way.
"""

from __future__ import annotations

import fnmatch
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .._errors import ConfigurationError, SerializationError

if TYPE_CHECKING:
    from .._io import Call, Plan
    from ..backends._protocol import Backend
    from ..codec._pipeline import Codec

__all__ = [
    "BoardChange",
    "BoardEntry",
    "Policy",
    "StoreLike",
    "Stored",
    "check_key",
    "check_name",
    "check_prefix",
    "literal_prefix",
    "matches",
]

class StoreLike(Protocol):
    """What a board needs of ``pk.Store`` (named so, not imported: the store makes its boards)."""

    backend: Backend
    codec: Codec

    @property
    def url(self) -> str: ...

    def run_sync(self, plan: Plan[Any]) -> Any: ...

    async def run_async(self, plan: Plan[Any]) -> Any: ...

    def call_sync(self, req: Call) -> Any: ...

    async def call_async(self, req: Call) -> Any: ...


_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_KEY = 1024
#: versions kept per key unless a policy says otherwise (the latest included)
DEFAULT_HISTORY = 10


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"a board name must be 1 to 64 of A-Z a-z 0-9 _ . - (e.g. 'default', 'research'), got {name!r}"
        )
    return name


def check_key(key: object) -> str:
    if not isinstance(key, str) or not key or "\x00" in key or len(key) > MAX_KEY or not _utf8(key):
        raise ConfigurationError(
            f"a board key must be a non-empty str of valid unicode (no lone surrogates) without NUL, "
            f"at most {MAX_KEY} characters (a path such as 'tasks/pending/item-42'), got {key!r:.80}"
        )
    return key


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or "\x00" in prefix or len(prefix) > MAX_KEY or not _utf8(prefix):
        raise ConfigurationError(f"a key prefix must be a str without NUL ('' for every key), got {prefix!r:.80}")
    return prefix


def matches(pattern: str, key: str) -> bool:
    """Glob match of a key: ``*`` and ``?`` match any characters, ``/`` included, so
    ``research/*`` is every key under ``research/``; ``[...]`` is a character class."""
    return fnmatch.fnmatchcase(key, pattern)


def literal_prefix(pattern: str) -> str:
    """The part of a glob pattern before its first wildcard: every matching key starts with it."""
    cut = [i for i in (pattern.find("*"), pattern.find("?"), pattern.find("[")) if i >= 0]
    return pattern[: min(cut)] if cut else pattern


def _when(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


@dataclass(frozen=True, slots=True)
class BoardEntry:
    """One version of a board key: what ``get``, ``list``, ``history`` and ``claim`` return.

    ``value`` is ``None`` and ``deleted`` True for a delete's version (in ``history``).
    ``expires_at`` is set when the key has a TTL; ``claimed_by`` / ``claimed_until`` while a
    worker holds a claim on it (``board.claim``).
    """

    key: str
    version: int
    value: Any
    written_at: datetime | None
    expires_at: datetime | None = None
    claimed_by: str | None = None
    claimed_until: datetime | None = None
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class BoardChange:
    """One change a watch saw: ``key`` reached ``version`` by a ``put`` (any write that
    leaves a value: put, cas, update, a claim) or a ``delete``."""

    key: str
    version: int
    kind: Literal["put", "delete"]


@dataclass(frozen=True, slots=True)
class Stored:
    """A key's stored version, decoded as far as the board's own bookkeeping needs: the
    envelope's fields, with the value's tree left undecoded until someone reads it."""

    key: str
    version: int
    tree: Any  # the value's encoded tree; None for a delete
    written_at: float | None
    expires_at: float | None = None
    claim_owner: str | None = None
    claim_until: float | None = None
    deleted: bool = False

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def live(self, now: float) -> bool:
        return not self.deleted and not self.expired(now)

    def claimed(self, now: float) -> bool:
        return self.claim_until is not None and self.claim_until > now

    @classmethod
    def load(cls, codec: Codec, key: str, version: int, data: bytes | None, board: str) -> Stored:
        if data is None:
            return cls(key, version, None, None, deleted=True)
        path = f"board {board!r} key {key!r} version {version}"
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise SerializationError(f"the store returned {type(data).__name__}, not bytes: written by something else?", path=path)
        env = codec.unpack_tree(bytes(data), path)
        if type(env) is not dict or "v" not in env:
            raise SerializationError("not a board value (no envelope): written by something else?", path=path)
        claim = env.get("c")
        if claim is not None and not (type(claim) is dict and isinstance(claim.get("o"), str)):
            raise SerializationError("the value's claim is not {owner, until}: written by something else?", path=path)
        return cls(
            key, version, env["v"], _time(env.get("t"), path, "written at"), _time(env.get("x"), path, "expires at"),
            claim.get("o") if claim else None, _time(claim.get("u"), path, "claimed until") if claim else None,
        )

    def entry(self, codec: Codec, board: str) -> BoardEntry:
        value = None if self.deleted else codec.decode(self.tree, f"board {board!r} key {self.key!r}")
        return BoardEntry(
            self.key, self.version, value, _when(self.written_at), _when(self.expires_at),
            self.claim_owner, _when(self.claim_until), self.deleted,
        )


def _time(t: Any, path: str, what: str) -> float | None:
    """A stored time (unix seconds), checked: a number within the years 1970 to 9999."""
    if t is None:
        return None
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < 253402300800:
        raise SerializationError(f"the value's {what} time {t!r:.40} is not a time: written by something else?", path=path)
    return float(t)


def pack(
    codec: Codec, tree: Any, *, expires_at: float | None = None, claim: tuple[str, float] | None = None,
    now: float | None = None,
) -> bytes:
    """The stored bytes of a value's encoded ``tree`` and its envelope fields."""
    env: dict[str, Any] = {"v": tree, "t": time.time() if now is None else now}
    if expires_at is not None:
        env["x"] = expires_at
    if claim is not None:
        env["c"] = {"o": claim[0], "u": claim[1]}
    return codec.pack_tree(env)


@dataclass(frozen=True)
class Policy:
    """Rules for the keys under one prefix (``board.policy``): kept versions, TTL, validators.

    ``history``: versions kept per key, the latest included (>= 1). ``ttl``: seconds a value
    lives after its write (None: forever); ``refresh_on_read``: a read of a live key moves its
    expiry to ``ttl`` from now (a write; a conflict with another writer is ignored).
    ``schema``: a pydantic model class (or any class with ``model_validate``) every value is
    validated into; ``checks``: callables ``check(key, value) -> str | None`` (a reason to
    refuse, or None), run before anything is stored.
    """

    prefix: str = ""
    history: int = DEFAULT_HISTORY
    ttl: float | None = None
    refresh_on_read: bool = False
    schema: Any = None
    checks: tuple[Any, ...] = field(default=())

    def __post_init__(self) -> None:
        check_prefix(self.prefix)
        if not isinstance(self.history, int) or isinstance(self.history, bool) or self.history < 1:
            raise ConfigurationError(f"history must be an int >= 1 (versions kept per key), got {self.history!r}")
        check_ttl(self.ttl)
        if self.schema is not None and not callable(getattr(self.schema, "model_validate", None)):
            raise ConfigurationError(f"schema must be a pydantic model class, got {self.schema!r}")
        for c in self.checks:
            if not callable(c):
                raise ConfigurationError(f"checks must be callables check(key, value) -> str | None, got {c!r}")


def check_ttl(ttl: object) -> float | None:
    if ttl is None:
        return None
    if not isinstance(ttl, (int, float)) or isinstance(ttl, bool) or not ttl > 0 or ttl > 10 * 365 * 86400:
        raise ConfigurationError(f"ttl must be seconds > 0 (at most ten years) or None, got {ttl!r}")
    return float(ttl)


class Policies:
    """The policies of a board, found by the longest prefix of a key."""

    def __init__(self, history: int) -> None:
        self._by_prefix: dict[str, Policy] = {"": Policy("", history=history)}

    def set(self, policy: Policy) -> None:
        self._by_prefix[policy.prefix] = policy

    def of(self, key: str) -> Policy:
        best = ""
        for p in self._by_prefix:
            if key.startswith(p) and len(p) > len(best):
                best = p
        return self._by_prefix[best]
