"""``PersistkitStore``: LangGraph's long-term memory (``BaseStore``) on a persistkit board.

Layout: one board of the store (``store.board("langgraph")`` unless told otherwise) holds
every item; the board key of item ``key`` in namespace ``(l1, ..., ln)`` is the path
``l1/.../ln/key``, each part with ``%``, ``/`` and NUL percent-escaped (``%25``, ``%2F``,
``%00``). So a namespace's items and its sub-namespaces' items share the key prefix
``l1/.../ln/`` (a search is one prefix listing), and two different (namespace, key) pairs
never share a board key. The board value is an envelope::

    {"value": <the item's dict>, "created_at": <unix s>, "updated_at": <unix s>, "ttl": <minutes or None>}

``created_at`` survives updates (a put reads the item and writes under compare-and-swap);
``ttl`` is kept so that a read can push the expiry forward again. Values go through the
board, so the store's codec applies: secrets become handles, encryption and integrity
tags wrap the stored bytes.

Semantics follow LangGraph's ``InMemoryStore`` (tests/test_langgraph_store.py runs both on
the same random operations), with these documented differences: search results come in
board-key order (the path order above) where ``InMemoryStore`` keeps insertion order; a
namespace exists while it holds an item (``InMemoryStore`` keeps listing a namespace after
its last item is deleted, or after a ``get`` touched it); a range operator (``$gt`` ...)
on a value that is missing or not a number does not match (``InMemoryStore`` raises
``TypeError``); a dotted filter key (``"user.level"``) names a top-level field, as in
``InMemoryStore`` (LangGraph's SQLite and PostgreSQL stores read it as a path); there is no vector index, so ``query`` is ignored (as ``InMemoryStore``
without ``index`` ignores it) and every ``score`` is None.

Every operation is written once, as a generator of board calls, driven by a blocking or
an awaiting loop (as the saver does); the rules that do no I/O (keys, filters, namespace
conditions, TTL settings) live in ``_store_rules``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading
import time
from collections.abc import Generator, Iterable, Mapping
from typing import Any, TypeVar

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    validate_op_namespace,
)

import persistkit as pk

from ._store_rules import (
    board_key,
    board_prefix,
    check_count,
    check_minutes,
    check_ttl_config,
    matches_condition,
    matches_filter,
    parse_key,
    when,
)

__all__ = ["PersistkitStore"]

T = TypeVar("T")
#: a request to the driver: (board method, args, kwargs); "commit" applies a list of writes
Req = tuple[str, tuple[Any, ...], dict[str, Any]]
Plan = Generator[Req, Any, T]

_PAGE = 200
_ATTEMPTS = 100


# -- the store -------------------------------------------------------------------------------------


class PersistkitStore(BaseStore):
    """LangGraph's ``BaseStore`` (long-term memory) over a persistkit board:
    ``graph = builder.compile(checkpointer=saver, store=PersistkitStore("s3://bucket/agents"))``.

    ``store_or_url``: a ``pk.Store`` (left open by :meth:`close`) or a URL to open (closed by
    :meth:`close`); the store must have the ``kv`` capability. ``board``: the board's name.
    ``ttl``: LangGraph's ``TTLConfig`` — ``default_ttl`` (minutes) for puts without ``ttl=``,
    ``refresh_on_read`` (default True) whether reads push an item's expiry forward (a write
    per item read). Expired items are hidden at once; :meth:`sweep_ttl` removes them from
    storage, and :meth:`start_ttl_sweeper` runs it every ``sweep_interval_minutes`` in a
    thread, as LangGraph's own stores do. ``history``: versions kept per board key.
    """

    supports_ttl = True

    def __init__(
        self, store_or_url: pk.Store | str, *, board: str = "langgraph", ttl: TTLConfig | None = None,
        history: int | None = None, **options: Any,
    ) -> None:
        self._sweeper: tuple[threading.Event, concurrent.futures.Future[None]] | None = None
        self._owns_store = False
        if "index" in options:
            raise pk.ConfigurationError(
                "PersistkitStore has no vector index (index=...): search filters on values and ignores query; "
                "for semantic search use a store with an index beside it"
            )
        if isinstance(store_or_url, str):
            self.store = pk.connect(store_or_url, **options)
            self._owns_store = True
        elif isinstance(store_or_url, pk.Store):
            if options:
                raise pk.ConfigurationError(f"options {sorted(options)} are for a URL; this store is open already")
            self.store = store_or_url
            self._owns_store = False
        else:
            raise pk.ConfigurationError(f"PersistkitStore needs a pk.Store or a store URL, got {store_or_url!r}")
        try:
            self.ttl_config = check_ttl_config(ttl)
            self.board = self.store.board(board, history=history)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the TTL sweeper, and close the store if this object opened it (from a URL)."""
        self.stop_ttl_sweeper()
        if self._owns_store:
            self.store.close()

    # -- TTL sweeping (LangGraph's SqliteStore / PostgresStore API) -----------------------------------

    def sweep_ttl(self) -> int:
        """Remove the expired items from storage (``board.sweep``); how many."""
        return self.board.sweep()

    async def asweep_ttl(self) -> int:
        return await self.board.asweep()

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> concurrent.futures.Future[None]:
        """Sweep every ``sweep_interval_minutes`` (default: the TTL config's, else 5) in a
        daemon thread until :meth:`stop_ttl_sweeper` or :meth:`close`; the future completes
        when it stops."""
        minutes = sweep_interval_minutes or (self.ttl_config or {}).get("sweep_interval_minutes") or 5
        if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not minutes > 0:
            raise pk.ConfigurationError(f"sweep_interval_minutes must be minutes > 0, got {minutes!r}")
        if self._sweeper is not None and not self._sweeper[1].done():
            return self._sweeper[1]
        stop = threading.Event()
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def loop() -> None:
            try:
                while not stop.wait(float(minutes) * 60):
                    try:
                        self.sweep_ttl()
                    except pk.PersistkitError:
                        continue  # a store that is down now may be back at the next sweep
            finally:
                done.set_result(None)

        threading.Thread(target=loop, name="persistkit-ttl-sweeper", daemon=True).start()
        self._sweeper = (stop, done)
        return done

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper thread; whether it stopped within ``timeout`` (True if none ran)."""
        if self._sweeper is None:
            return True
        stop, done = self._sweeper
        stop.set()
        try:
            done.result(timeout)
        except concurrent.futures.TimeoutError:
            return False
        self._sweeper = None
        return True

    def __enter__(self) -> PersistkitStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<PersistkitStore board {self.board.name!r} on {self.store.url}>"

    # -- BaseStore ---------------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops``: every read sees the items as they were before the batch, then the
        puts and deletes land together, atomically (the last put of a key wins)."""
        return self._run(self._batch(list(ops)))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await self._arun(self._batch(list(ops)))

    # -- drivers -----------------------------------------------------------------------------------

    def _run(self, plan: Plan[T]) -> T:
        try:
            name, args, kwargs = next(plan)
            while True:
                try:
                    if name == "commit":
                        result: Any = self._fill(args[0]).commit()
                    elif name == "sleep":
                        time.sleep(args[0])
                        result = None
                    else:
                        result = getattr(self.board, name)(*args, **kwargs)
                except pk.PersistkitError as exc:
                    name, args, kwargs = plan.throw(exc)
                else:
                    name, args, kwargs = plan.send(result)
        except StopIteration as stop:
            value: T = stop.value
            return value

    async def _arun(self, plan: Plan[T]) -> T:
        try:
            name, args, kwargs = next(plan)
            while True:
                try:
                    if name == "commit":
                        result: Any = await self._fill(args[0]).acommit()
                    elif name == "sleep":
                        await asyncio.sleep(args[0])
                        result = None
                    else:
                        result = await getattr(self.board, "a" + name)(*args, **kwargs)
                except pk.PersistkitError as exc:
                    name, args, kwargs = plan.throw(exc)
                else:
                    name, args, kwargs = plan.send(result)
        except StopIteration as stop:
            value: T = stop.value
            return value

    def _fill(self, writes: list[tuple[str, int, dict[str, Any] | None, float | None]]) -> pk.BoardBatch:
        b = self.board.batch()
        for bkey, expected, env, ttl in writes:
            if env is None:
                b.delete(bkey, expected_version=expected)
            else:
                b.cas(bkey, env, expected, ttl=ttl)
        return b

    # -- plans -------------------------------------------------------------------------------------

    def _batch(self, ops: list[Op]) -> Plan[list[Result]]:
        for op in ops:
            if not isinstance(op, (GetOp, PutOp, SearchOp, ListNamespacesOp)):
                raise pk.ConfigurationError(f"unknown store operation {op!r}: expected GetOp, PutOp, SearchOp or ListNamespacesOp")
            validate_op_namespace(op)
            if isinstance(op, PutOp) and not op.namespace:
                raise InvalidNamespaceError("Namespace cannot be empty.")
        results: list[Result] = [None] * len(ops)
        refresh: dict[str, pk.BoardEntry] = {}
        puts: dict[str, PutOp] = {}
        for i, op in enumerate(ops):
            if isinstance(op, GetOp):
                results[i] = yield from self._get(op, refresh)
            elif isinstance(op, SearchOp):
                results[i] = yield from self._search(op, refresh)
            elif isinstance(op, ListNamespacesOp):
                results[i] = yield from self._namespaces(op)
            else:
                puts[board_key(tuple(op.namespace), str(op.key))] = op
        for bkey, entry in refresh.items():
            if bkey not in puts:
                yield from self._refresh(entry)
        if puts:
            yield from self._write(puts)
        return results

    def _envelope(self, entry: pk.BoardEntry) -> dict[str, Any]:
        env = entry.value
        if type(env) is not dict or type(env.get("value")) is not dict or "created_at" not in env:
            raise pk.SerializationError(
                f"board {self.board.name!r} key {entry.key!r} holds no LangGraph store item (written by something "
                "else?): give PersistkitStore a board of its own (board=...)",
                path=f"board {self.board.name!r} key {entry.key!r}",
            )
        return env

    def _item(self, entry: pk.BoardEntry, namespace: tuple[str, ...], key: str, refresh_ttl: bool, refresh: dict[str, pk.BoardEntry]) -> Item:
        env = self._envelope(entry)
        if refresh_ttl and env.get("ttl") is not None:
            refresh[entry.key] = entry
        return Item(
            value=env["value"], key=key, namespace=namespace,
            created_at=when(env["created_at"]), updated_at=when(env["updated_at"]),
        )

    def _get(self, op: GetOp, refresh: dict[str, pk.BoardEntry]) -> Plan[Item | None]:
        namespace, key = tuple(op.namespace), str(op.key)
        if not namespace:
            return None  # nothing can be stored in the empty namespace
        entry: pk.BoardEntry | None = yield ("get", (board_key(namespace, key),), {})
        if entry is None:
            return None
        return self._item(entry, namespace, key, op.refresh_ttl, refresh)

    def _search(self, op: SearchOp, refresh: dict[str, pk.BoardEntry]) -> Plan[list[SearchItem]]:
        limit, offset = check_count(op.limit, "search limit"), check_count(op.offset, "search offset")
        if op.filter is not None and not isinstance(op.filter, dict):
            raise pk.ConfigurationError(f"search filter must be a dict or None, got {op.filter!r}")
        out: list[SearchItem] = []
        skipped = 0
        prefix, after = board_prefix(tuple(op.namespace_prefix)), None
        while limit and len(out) < limit:
            page: list[pk.BoardEntry] = yield ("list", (prefix,), {"after": after, "limit": _PAGE})
            for entry in page:
                parsed = parse_key(entry.key)
                if parsed is None:
                    continue
                env = self._envelope(entry)
                if not matches_filter(env["value"], op.filter):
                    continue
                if skipped < offset:
                    skipped += 1
                    continue
                item = self._item(entry, parsed[0], parsed[1], op.refresh_ttl, refresh)
                out.append(SearchItem(item.namespace, item.key, item.value, item.created_at, item.updated_at))
                if len(out) == limit:
                    break
            if len(page) < _PAGE:
                break
            after = page[-1].key
        return out

    def _namespaces(self, op: ListNamespacesOp) -> Plan[list[tuple[str, ...]]]:
        limit, offset = check_count(op.limit, "list_namespaces limit"), check_count(op.offset, "list_namespaces offset")
        if op.max_depth is not None:
            check_count(op.max_depth, "max_depth")
        conditions = tuple(op.match_conditions or ())
        literal: tuple[str, ...] = ()  # the labels every listed namespace starts with
        for c in conditions:
            if c.match_type == "prefix":
                lead = tuple(c.path[: next((i for i, p in enumerate(c.path) if p == "*"), len(c.path))])
                literal = lead if len(lead) > len(literal) else literal
        found: set[tuple[str, ...]] = set()
        prefix, after = board_prefix(literal), None
        while True:
            page: list[pk.BoardEntry] = yield ("list", (prefix,), {"after": after, "limit": _PAGE})
            for entry in page:
                parsed = parse_key(entry.key)
                if parsed is not None:
                    found.add(parsed[0])
            if len(page) < _PAGE:
                break
            after = page[-1].key
        namespaces = [ns for ns in found if all(matches_condition(c, ns) for c in conditions)]
        if op.max_depth is not None:
            namespaces = sorted({ns[: op.max_depth] for ns in namespaces})
        else:
            namespaces = sorted(namespaces)
        return namespaces[offset : offset + limit]

    def _refresh(self, entry: pk.BoardEntry) -> Plan[None]:
        """Push a read item's expiry ``ttl`` minutes from now: the same envelope again, under
        compare-and-swap (another writer's write got there first: its write set the expiry)."""
        env = self._envelope(entry)
        try:
            yield ("commit", ([(entry.key, entry.version, env, env["ttl"] * 60.0)],), {})
        except pk.ConflictError:
            return

    def _write(self, puts: dict[str, PutOp]) -> Plan[None]:
        """Apply the puts and deletes atomically, each put keeping the item's ``created_at``:
        read the items, write under compare-and-swap, read again when another writer moved one."""
        for attempt in range(_ATTEMPTS):
            now = time.time()
            writes: list[tuple[str, int, dict[str, Any] | None, float | None]] = []
            for bkey, op in puts.items():
                current: pk.BoardEntry | None = yield ("get", (bkey,), {})
                if op.value is None:
                    if current is not None:
                        writes.append((bkey, current.version, None, None))
                    continue
                if not isinstance(op.value, Mapping):
                    raise pk.ConfigurationError(f"a store item's value must be a dict (or None to delete), got {op.value!r:.80}")
                ttl = None if op.ttl is None else check_minutes(op.ttl, "ttl")
                created = self._envelope(current)["created_at"] if current is not None else now
                env = {"value": dict(op.value), "created_at": created, "updated_at": now, "ttl": ttl}
                writes.append((bkey, current.version if current is not None else 0, env, None if ttl is None else ttl * 60.0))
            if not writes:
                return
            try:
                yield ("commit", (writes,), {})
            except pk.ConflictError:
                if attempt > 2:  # a hot key: back off a little, at random, so writers spread out
                    yield ("sleep", (random.uniform(0, min(1.0, 0.001 * 2 ** min(attempt, 10))),), {})
                continue
            return
        raise pk.ConflictError(
            f"board {self.board.name!r}: {_ATTEMPTS} attempts to write {sorted(puts)[:5]} all met other writers",
            namespace=self.board.name, key=next(iter(puts)),
        )

