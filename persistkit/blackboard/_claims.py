"""Work items taken by one worker at a time: ``board.claim(prefix, owner, lease_ttl=)``.

An item is any live key under the prefix. A claim is a compare-and-swap that writes the
item again with ``{owner, until}`` in its envelope, so the item's new version is the
claim's **fencing token**: ``complete`` (delete the item, and write results in the same
atomic batch), ``release`` (give it back) and ``renew`` are writes expected at that
version. A claim past its ``until`` can be taken by another worker, whose claim moves the
version on, so the stale worker's ``complete`` is refused (``pk.ClaimLostError``) and
nothing of it is written: every item is completed once, by the worker that held it last.

Claiming reads the prefix a page at a time and walks the page from a random place, so
that many workers do not all race for the first item, decoding each entry only when its
turn comes; an item that another worker took in between is a conflict, and the next one
is tried. The cost is one listing page plus one write per claim when items are plenty;
O(items claimed by others) reads when most are taken. A worker that dies with a claim leaves the item to the next
claimer after ``lease_ttl``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .._errors import ClaimLostError, ConfigurationError, ConflictError
from .._io import Plan, call
from ..backends._protocol import KvEntry, KvOp
from . import _entries as E

if TYPE_CHECKING:
    from ._board import BoardCore as Board

__all__ = ["Claim", "claim_plan"]

_PAGE = 32


def _check(owner: object, lease_ttl: object) -> tuple[str, float]:
    if not isinstance(owner, str) or not owner or len(owner) > 256 or "\x00" in owner:
        raise ConfigurationError(f"owner must name the worker: a non-empty str of at most 256 characters, got {owner!r}")
    if not isinstance(lease_ttl, (int, float)) or isinstance(lease_ttl, bool) or not 0 < lease_ttl <= 7 * 86400:
        raise ConfigurationError(f"lease_ttl must be seconds > 0 (at most a week), got {lease_ttl!r}")
    return owner, float(lease_ttl)


@dataclass
class Claim:
    """An item one worker holds until ``until`` (``board.claim``). ``token`` is its fencing
    token: the item's version this claim wrote; every write of the claim expects it.
    ``board`` names the board; the claim keeps no public way to the board itself (a scoped
    handle's claim must not hand its agent the unscoped board)."""

    _board: Board = field(repr=False)
    key: str
    value: Any
    owner: str
    token: int
    until: float
    #: seconds each claim or renewal holds the item (``renew()`` without an argument)
    lease_ttl: float
    _tree: Any = field(repr=False, default=None)
    _expires_at: float | None = field(repr=False, default=None)
    #: a scoped handle's write check, run on every key ``complete`` writes
    _guard: Callable[[str, str], object] | None = field(repr=False, default=None)

    @property
    def board(self) -> str:
        """The name of the board the item is on."""
        return self._board.name

    @property
    def expires(self) -> datetime:
        return datetime.fromtimestamp(self.until, UTC)

    # -- plans ---------------------------------------------------------------------------

    def _complete(self, results: dict[str, Any] | None) -> Plan[dict[str, int]]:
        from ._board import _ANY, _Intent

        intents = [_Intent(self.key, None, self.token, delete=True)]
        for k, v in (results or {}).items():
            if self._guard is not None:
                self._guard(k, "write")
            intents.append(_Intent(E.check_key(k), v, _ANY))
        try:
            written = yield from self._board._write(intents)
        except ConflictError as exc:
            if exc.key != self.key:
                raise
            raise ClaimLostError(key=self.key, board=self._board.name, token=self.token, found=exc.found) from None
        return {k: w.version for k, w in written.items()}

    def _swap(self, claim: tuple[str, float] | None) -> Plan[None]:
        data = E.pack(self._board.store.codec, self._tree, expires_at=self._expires_at, claim=claim)
        try:
            yield call("kv_write", self._board.name, [KvOp(self.key, self.token, data)], keep=self._board.policy_of(self.key).history)
        except ConflictError as exc:
            raise ClaimLostError(key=self.key, board=self._board.name, token=self.token, found=exc.found) from None
        self.token += 1
        if claim is not None:
            self.until = claim[1]

    def _renew_claim(self, lease_ttl: float | None) -> tuple[str, float]:
        ttl = self.lease_ttl if lease_ttl is None else _check(self.owner, lease_ttl)[1]
        return self.owner, time.time() + ttl

    # -- sync and async ------------------------------------------------------------------------

    def complete(self, *, results: dict[str, Any] | None = None) -> dict[str, int]:
        """Finish the item: delete it and write ``results`` (keys to values) in one atomic batch;
        their new versions. ``pk.ClaimLostError`` if the claim is no longer held (nothing written)."""
        versions: dict[str, int] = self._board.store.run_sync(self._complete(results))
        return versions

    def release(self) -> None:
        """Give the item back unfinished: the next claimer may take it at once."""
        self._board.store.run_sync(self._swap(None))

    def renew(self, lease_ttl: float | None = None) -> None:
        """Hold the item ``lease_ttl`` seconds from now (default: the claim's own ``lease_ttl``)."""
        self._board.store.run_sync(self._swap(self._renew_claim(lease_ttl)))

    async def acomplete(self, *, results: dict[str, Any] | None = None) -> dict[str, int]:
        versions: dict[str, int] = await self._board.store.run_async(self._complete(results))
        return versions

    async def arelease(self) -> None:
        await self._board.store.run_async(self._swap(None))

    async def arenew(self, lease_ttl: float | None = None) -> None:
        await self._board.store.run_async(self._swap(self._renew_claim(lease_ttl)))


def claim_plan(
    board: Board, prefix: str, owner: str, lease_ttl: float, *,
    allow: Callable[[str], bool] | None = None, guard: Callable[[str, str], object] | None = None,
) -> Plan[Claim | None]:
    E.check_prefix(prefix)
    owner, ttl = _check(owner, lease_ttl)
    after: str | None = None
    codec = board.store.codec
    while True:
        page: list[KvEntry] = yield call("kv_list", board.name, prefix=prefix, after=after, limit=_PAGE)
        # From a random place in the page, so that many workers do not all race for the first
        # item; each entry is decoded only when its turn comes (usually the first is free).
        start = random.randrange(len(page)) if page else 0
        for entry in page[start:] + page[:start]:
            s = board._load(entry)
            now = time.time()
            if s is None or not s.live(now) or s.claimed(now) or (allow is not None and not allow(s.key)):
                continue
            until = now + ttl
            data = E.pack(codec, s.tree, expires_at=s.expires_at, claim=(owner, until))
            try:
                yield call("kv_write", board.name, [KvOp(s.key, s.version, data)], keep=board.policy_of(s.key).history)
            except ConflictError:
                continue  # another worker took it (or wrote it) first: the next one
            value = codec.decode(s.tree, f"board {board.name!r} key {s.key!r}")
            return Claim(board, s.key, value, owner, s.version + 1, until, ttl, s.tree, s.expires_at, guard)
        if len(page) < _PAGE:
            # nothing claimable: raise if the store's access rules hide the prefix (PostgreSQL)
            yield from board._absent(prefix, "claim", prefix=True)
            return None
        after = page[-1].key
