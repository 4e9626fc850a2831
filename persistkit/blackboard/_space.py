"""``pk.Board``: a board's data operations (``_board``) with claims, watches and scoped handles.

The class users get from ``store.board(name)``. Its data operations live in
:class:`~persistkit.blackboard._board.BoardCore`, which the claim, watch and access layers
build on; this module puts them together so that none of them imports another's user.
"""

from __future__ import annotations

import builtins
from typing import Any

from ._acl import ScopedBoard
from ._board import BoardCore
from ._claims import Claim, claim_plan
from ._watch import AsyncBoardWatch, BoardWatch

__all__ = ["Board"]


class Board(BoardCore):
    """A shared space of keys on one store: ``store.board(name)`` (docs/shared-state.md).

    Data operations (``get``, ``put``, ``cas``, ``delete``, ``list``, ``update``,
    ``history``, ``batch``), claims of work items, watches and scoped handles; sync
    methods and their ``a``-prefixed async twins. Safe to share across threads and tasks.
    """

    def claim(self, prefix: str, owner: str, *, lease_ttl: float = 60.0) -> Claim | None:
        """Take one unclaimed item under ``prefix`` for ``owner``, held ``lease_ttl`` seconds;
        None when every item is taken or there is none (``persistkit.blackboard._claims``)."""
        result: Claim | None = self.store.run_sync(claim_plan(self, prefix, owner, lease_ttl))
        return result

    def complete(self, claim: Claim, *, results: dict[str, Any] | None = None) -> dict[str, int]:
        """``claim.complete(results=...)``: delete the item and write ``results``, atomically."""
        return claim.complete(results=results)

    def release(self, claim: Claim) -> None:
        """``claim.release()``: give the item back unfinished."""
        claim.release()

    def watch(self, pattern: str = "*", *, poll_interval: float | None = None, since: dict[str, int] | None = None) -> BoardWatch:
        """Change events of the keys matching the glob ``pattern``: ``for change in board.watch("research/*")``
        (``persistkit.blackboard._watch``)."""
        return BoardWatch(self, pattern, poll_interval=poll_interval, since=since)

    def scoped(self, agent: str, *, read: builtins.list[str] | tuple[str, ...] = (), write: builtins.list[str] | tuple[str, ...] = ()) -> ScopedBoard:
        """A handle for one agent that cannot read, list, watch or write outside its grants
        (glob patterns); ``pk.AccessDeniedError`` otherwise (``persistkit.blackboard._acl``)."""
        return ScopedBoard(self, agent, read=read, write=write)

    async def aclaim(self, prefix: str, owner: str, *, lease_ttl: float = 60.0) -> Claim | None:
        result: Claim | None = await self.store.run_async(claim_plan(self, prefix, owner, lease_ttl))
        return result

    async def acomplete(self, claim: Claim, *, results: dict[str, Any] | None = None) -> dict[str, int]:
        return await claim.acomplete(results=results)

    async def arelease(self, claim: Claim) -> None:
        await claim.arelease()

    def awatch(self, pattern: str = "*", *, poll_interval: float | None = None, since: dict[str, int] | None = None) -> AsyncBoardWatch:
        """``watch`` as an async iterator: ``async for change in board.awatch("research/*")``."""
        return AsyncBoardWatch(self, pattern, poll_interval=poll_interval, since=since)
