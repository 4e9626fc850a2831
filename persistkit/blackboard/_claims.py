"""Work items taken by one worker at a time: ``board.claim(prefix, owner, lease_ttl=)``.

An item is any live key under the prefix. A claim is a compare-and-swap that writes the
item again with ``{owner, until}`` in its envelope, so the item's new version is the
claim's **fencing token**: ``complete`` (delete the item, and write results in the same
atomic batch), ``release`` (give it back) and ``renew`` are writes expected at that
version. A claim past its ``until`` can be taken by another worker, whose claim moves the
version on, so the stale worker's ``complete`` is refused (``pk.ClaimLostError``) and
nothing of it is written: every item is completed once, by the worker that held it last.

Claiming reads the prefix a page at a time and tries a random item among the unclaimed
ones of the page, so that many workers do not all race for the first one; an item that
another worker took in between is a conflict, and the next one is tried. The cost is one
listing page plus one write per claim when items are plenty; O(items claimed by others)
reads when most are taken. A worker that dies with a claim leaves the item to the next
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
from ._entries import Stored

if TYPE_CHECKING:
    from ._board import BoardCore as Board

__all__ = ["Claim", "claim_plan"]

_PAGE = 64
_SPREAD = 16  # a claim picks at random among this many unclaimed items of a page


def _check(owner: object, lease_ttl: object) -> tuple[str, float]:
    if not isinstance(owner, str) or not owner or len(owner) > 256 or "\x00" in owner:
        raise ConfigurationError(f"owner must name the worker: a non-empty str of at most 256 characters, got {owner!r}")
    if not isinstance(lease_ttl, (int, float)) or isinstance(lease_ttl, bool) or not 0 < lease_ttl <= 7 * 86400:
        raise ConfigurationError(f"lease_ttl must be seconds > 0 (at most a week), got {lease_ttl!r}")
    return owner, float(lease_ttl)


@dataclass
class Claim:
    """An item one worker holds until ``until`` (``board.claim``). ``token`` is its fencing
    token: the item's version this claim wrote; every write of the claim expects it."""

    board: Board
    key: str
    value: Any
    owner: str
    token: int
    until: float
    _tree: Any = field(repr=False, default=None)
    _expires_at: float | None = field(repr=False, default=None)
    #: a scoped handle's write check, run on every key ``complete`` writes
    _guard: Callable[[str, str], object] | None = field(repr=False, default=None)
    #: the claim's ``lease_ttl``: what ``renew()`` extends it by unless told otherwise
    lease_ttl: float = 60.0

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
            versions: dict[str, int] = yield from self.board._write(intents)
        except ConflictError as exc:
            if exc.key != self.key:
                raise
            raise ClaimLostError(key=self.key, board=self.board.name, token=self.token, found=exc.found) from None
        return versions

    def _swap(self, claim: tuple[str, float] | None) -> Plan[None]:
        data = E.pack(self.board.store.codec, self._tree, expires_at=self._expires_at, claim=claim)
        try:
            yield call("kv_write", self.board.name, [KvOp(self.key, self.token, data)], keep=self.board.policy_of(self.key).history)
        except ConflictError as exc:
            raise ClaimLostError(key=self.key, board=self.board.name, token=self.token, found=exc.found) from None
        self.token += 1
        if claim is not None:
            self.until = claim[1]

    def _renew_claim(self, lease_ttl: float | None) -> tuple[str, float]:
        ttl = self.lease_ttl if lease_ttl is None else _check(self.owner, lease_ttl)[1]
        return self.owner, time.time() + max(ttl, 0.001)

    # -- sync and async ------------------------------------------------------------------------

    def complete(self, *, results: dict[str, Any] | None = None) -> dict[str, int]:
        """Finish the item: delete it and write ``results`` (keys to values) in one atomic batch;
        their new versions. ``pk.ClaimLostError`` if the claim is no longer held (nothing written)."""
        versions: dict[str, int] = self.board.store.run_sync(self._complete(results))
        return versions

    def release(self) -> None:
        """Give the item back unfinished: the next claimer may take it at once."""
        self.board.store.run_sync(self._swap(None))

    def renew(self, lease_ttl: float | None = None) -> None:
        """Hold the item ``lease_ttl`` seconds more (default: as long as the claim first ran)."""
        self.board.store.run_sync(self._swap(self._renew_claim(lease_ttl)))

    async def acomplete(self, *, results: dict[str, Any] | None = None) -> dict[str, int]:
        versions: dict[str, int] = await self.board.store.run_async(self._complete(results))
        return versions

    async def arelease(self) -> None:
        await self.board.store.run_async(self._swap(None))

    async def arenew(self, lease_ttl: float | None = None) -> None:
        await self.board.store.run_async(self._swap(self._renew_claim(lease_ttl)))


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
        now = time.time()
        free: list[Stored] = []
        for entry in page:
            s = board._load(entry)
            if s is not None and s.live(now) and not s.claimed(now) and (allow is None or allow(s.key)):
                free.append(s)
        while free:
            s = free.pop(random.randrange(min(len(free), _SPREAD)))
            until = time.time() + ttl
            data = E.pack(codec, s.tree, expires_at=s.expires_at, claim=(owner, until))
            try:
                yield call("kv_write", board.name, [KvOp(s.key, s.version, data)], keep=board.policy_of(s.key).history)
            except ConflictError:
                continue  # another worker took it (or wrote it) first: the next one
            value = codec.decode(s.tree, f"board {board.name!r} key {s.key!r}")
            return Claim(board, s.key, value, owner, s.version + 1, until, s.tree, s.expires_at, guard, ttl)
        if len(page) < _PAGE:
            return None
        after = page[-1].key
