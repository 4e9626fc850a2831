"""``board.scoped(agent, read=[...], write=[...])``: a handle limited to its grants.

Grants are glob patterns over keys (``research/*``: every key under ``research/``). The
handle checks every key before it reaches the store: a read, history or claim of a key
no ``read`` grant matches, or a write no ``write`` grant matches, raises
``pk.AccessDeniedError`` naming the agent, the key and the grants, and nothing is read or
written. Listings and watches only ever return keys the read grants match (and a prefix
or pattern that no grant can match is refused). A scoped handle cannot change the board's
policies, clear it, or make another scoped handle.

What this protects against: an agent's own code (or a model steering its tools) reading or
overwriting another agent's keys through the handle it was given. What it does not: code
in the same Python process can always reach the raw store (``pk.connect`` the same URL);
for a boundary the agent's process cannot cross, give it a database role that the
database itself limits (PostgreSQL row-level security: docs/shared-state.md).
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from .._errors import AccessDeniedError, ConfigurationError
from . import _entries as E
from ._claims import Claim, claim_plan
from ._entries import BoardEntry
from ._watch import AsyncBoardWatch, BoardWatch

if TYPE_CHECKING:
    from ._board import Batch
    from ._board import BoardCore as Board

__all__ = ["ScopedBoard"]


def _grants(name: str, given: object) -> tuple[str, ...]:
    if isinstance(given, str) or not isinstance(given, (list, tuple)):
        raise ConfigurationError(f"{name}= must be a list of glob patterns such as ['research/*'], got {given!r}")
    for g in given:
        if not isinstance(g, str) or not g or "\x00" in g:
            raise ConfigurationError(f"{name}= grants must be non-empty glob patterns, got {g!r}")
    return tuple(given)


def _may_overlap(grant: str, prefix: str) -> bool:
    """Whether some key under ``prefix`` can match ``grant``."""
    lp = E.literal_prefix(grant)
    return lp.startswith(prefix) or prefix.startswith(lp)


class ScopedBoard:
    """The board as one agent may use it. Made by ``board.scoped(...)``; same methods."""

    def __init__(self, board: Board, agent: str, *, read: Any = (), write: Any = ()) -> None:
        if not isinstance(agent, str) or not agent or len(agent) > 256:
            raise ConfigurationError(f"agent must name the agent (a non-empty str), got {agent!r}")
        self.__board = board
        self.agent = agent
        self.read_grants = _grants("read", read)
        self.write_grants = _grants("write", write)
        self.name = board.name

    def __repr__(self) -> str:
        return f"<persistkit ScopedBoard {self.name!r} agent={self.agent!r} read={list(self.read_grants)} write={list(self.write_grants)}>"

    # -- the checks ----------------------------------------------------------------------

    def _deny(self, operation: str, key: str, kind: str, what: str = "key") -> AccessDeniedError:
        grants = self.read_grants if kind == "read" else self.write_grants
        return AccessDeniedError(
            f"board {self.name!r}: agent {self.agent!r} may not {operation} {what} {key!r}: its {kind} grants "
            f"are {list(grants)}. Nothing was read or written. Use a key its grants cover, or give the "
            "agent a handle with that grant (board.scoped(agent, read=[...], write=[...])).",
            agent=self.agent, key=key, operation=operation,
        )

    def can_read(self, key: str) -> bool:
        return any(E.matches(g, key) for g in self.read_grants)

    def can_write(self, key: str) -> bool:
        return any(E.matches(g, key) for g in self.write_grants)

    def _read(self, key: str, operation: str) -> str:
        E.check_key(key)
        if not self.can_read(key):
            raise self._deny(operation, key, "read")
        return key

    def _write(self, key: str, operation: str) -> str:
        E.check_key(key)
        if not self.can_write(key):
            raise self._deny(operation, key, "write")
        return key

    def _prefix(self, prefix: str, operation: str, grants: tuple[str, ...], kind: str) -> str:
        E.check_prefix(prefix)
        if not any(_may_overlap(g, prefix) for g in grants):
            raise self._deny(operation, prefix, kind, "keys under")
        return prefix

    def _claimable(self, key: str) -> bool:
        return self.can_read(key) and self.can_write(key)

    # -- reads -----------------------------------------------------------------------------

    def get(self, key: str, *, version: int | None = None) -> BoardEntry | None:
        return self.__board.get(self._read(key, "read"), version=version)

    def value(self, key: str, default: Any = None) -> Any:
        return self.__board.value(self._read(key, "read"), default)

    def history(self, key: str, *, limit: int | None = None) -> builtins.list[BoardEntry]:
        return self.__board.history(self._read(key, "read the history of"), limit=limit)

    def list(self, prefix: str = "", *, after: str | None = None, limit: int = 100) -> builtins.list[BoardEntry]:
        self._prefix(prefix, "list", self.read_grants, "read")
        out: builtins.list[BoardEntry] = []
        while len(out) < limit:
            page = self.__board.list(prefix, after=after, limit=limit)
            out += [e for e in page if self.can_read(e.key)]
            if len(page) < limit:
                break
            after = page[-1].key
        return out[:limit]

    def scan(self, prefix: str = "") -> Iterator[BoardEntry]:
        self._prefix(prefix, "list", self.read_grants, "read")
        return (e for e in self.__board.scan(prefix) if self.can_read(e.key))

    # -- writes ----------------------------------------------------------------------------

    def put(self, key: str, value: Any, *, ttl: float | None = None) -> int:
        return self.__board.put(self._write(key, "write"), value, ttl=ttl)

    def cas(self, key: str, value: Any, expected_version: int, *, ttl: float | None = None) -> int:
        return self.__board.cas(self._write(key, "write"), value, expected_version, ttl=ttl)

    def delete(self, key: str, *, expected_version: int | None = None) -> bool:
        return self.__board.delete(self._write(key, "delete"), expected_version=expected_version)

    def update(self, key: str, fn: Callable[[Any], Any], *, default: Any = None, ttl: float | None = None) -> BoardEntry:
        self._read(key, "update")
        return self.__board.update(self._write(key, "update"), fn, default=default, ttl=ttl)

    def batch(self) -> Batch:
        batch = self.__board.batch()
        batch.guard = self._write
        return batch

    # -- claims and watches ---------------------------------------------------------------------

    def claim(self, prefix: str, owner: str, *, lease_ttl: float = 60.0) -> Claim | None:
        self._prefix(prefix, "claim", self.read_grants, "read")
        self._prefix(prefix, "claim", self.write_grants, "write")
        result: Claim | None = self.__board.store.run_sync(
            claim_plan(self.__board, prefix, owner, lease_ttl, allow=self._claimable, guard=self._write)
        )
        return result

    def watch(self, pattern: str = "*", *, poll_interval: float | None = None, since: dict[str, int] | None = None) -> BoardWatch:
        self._prefix(E.literal_prefix(pattern) if isinstance(pattern, str) else pattern, "watch", self.read_grants, "read")
        return BoardWatch(self.__board, pattern, poll_interval=poll_interval, since=since, allow=self.can_read)

    # -- async twins ----------------------------------------------------------------------------

    async def aget(self, key: str, *, version: int | None = None) -> BoardEntry | None:
        return await self.__board.aget(self._read(key, "read"), version=version)

    async def avalue(self, key: str, default: Any = None) -> Any:
        return await self.__board.avalue(self._read(key, "read"), default)

    async def ahistory(self, key: str, *, limit: int | None = None) -> builtins.list[BoardEntry]:
        return await self.__board.ahistory(self._read(key, "read the history of"), limit=limit)

    async def alist(self, prefix: str = "", *, after: str | None = None, limit: int = 100) -> builtins.list[BoardEntry]:
        self._prefix(prefix, "list", self.read_grants, "read")
        out: builtins.list[BoardEntry] = []
        while len(out) < limit:
            page = await self.__board.alist(prefix, after=after, limit=limit)
            out += [e for e in page if self.can_read(e.key)]
            if len(page) < limit:
                break
            after = page[-1].key
        return out[:limit]

    async def aput(self, key: str, value: Any, *, ttl: float | None = None) -> int:
        return await self.__board.aput(self._write(key, "write"), value, ttl=ttl)

    async def acas(self, key: str, value: Any, expected_version: int, *, ttl: float | None = None) -> int:
        return await self.__board.acas(self._write(key, "write"), value, expected_version, ttl=ttl)

    async def adelete(self, key: str, *, expected_version: int | None = None) -> bool:
        return await self.__board.adelete(self._write(key, "delete"), expected_version=expected_version)

    async def aupdate(self, key: str, fn: Callable[[Any], Any], *, default: Any = None, ttl: float | None = None) -> BoardEntry:
        self._read(key, "update")
        return await self.__board.aupdate(self._write(key, "update"), fn, default=default, ttl=ttl)

    async def aclaim(self, prefix: str, owner: str, *, lease_ttl: float = 60.0) -> Claim | None:
        self._prefix(prefix, "claim", self.read_grants, "read")
        self._prefix(prefix, "claim", self.write_grants, "write")
        result: Claim | None = await self.__board.store.run_async(
            claim_plan(self.__board, prefix, owner, lease_ttl, allow=self._claimable, guard=self._write)
        )
        return result

    def awatch(self, pattern: str = "*", *, poll_interval: float | None = None, since: dict[str, int] | None = None) -> AsyncBoardWatch:
        self._prefix(E.literal_prefix(pattern) if isinstance(pattern, str) else pattern, "watch", self.read_grants, "read")
        return AsyncBoardWatch(self.__board, pattern, poll_interval=poll_interval, since=since, allow=self.can_read)

    # -- refused -----------------------------------------------------------------------------------

    def policy(self, *args: Any, **kwargs: Any) -> Any:
        raise self._deny("change the policies of", "*", "write", "the board")

    def clear(self) -> bool:
        raise self._deny("clear", "*", "write", "the board")

    async def aclear(self) -> bool:
        raise self._deny("clear", "*", "write", "the board")

    def scoped(self, *args: Any, **kwargs: Any) -> ScopedBoard:
        raise self._deny("make another scoped handle from", "*", "read", "the board")

    async def ascan(self, prefix: str = "") -> AsyncIterator[BoardEntry]:
        """``scan`` for async callers: the granted live entries under ``prefix``, a page at a time."""
        after = None
        while page := await self.alist(prefix, after=after, limit=200):
            for entry in page:
                yield entry
            after = page[-1].key
