"""What ``PersistkitSaver`` reads and writes: each operation once, as a plan.

A plan is a generator of store calls (``Request``: method name, args, kwargs) that
``PersistkitSaver``'s blocking and awaiting drivers run, so ``get_tuple`` and
``aget_tuple`` share ``_get``. Here too: how channel values are encoded for the store
(``_dump``/``_load``, LangGraph's serializer under persistkit's codec) and checked on
load (graph-state versions and migrations, ``_migrate``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator, Mapping, Sequence
from typing import Any, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

import persistkit as pk

from ._migrate import (
    CHANNELS_KEY,
    VERSION_KEY,
    Migrations,
    ModelCheck,
    migrate_checkpoint,
    remedy,
)
from ._values import from_tree, to_tree

T = TypeVar("T")


#: One store call: (method name, args, kwargs); the name "emit" hands a value to the caller.
Request = tuple[str, tuple[Any, ...], dict[str, Any]]


Plan = Generator[Request, Any, T]


_CP, _WR, _REG = "lg:c:", "lg:w:", "lg:n"


#: The checkpoint metadata key holding a ``durable_invoke`` turn's ``run_id`` (LangGraph's
#: metadata, so ``graph.get_state(config).metadata`` shows it). The saver stores it as the
#: persistkit record's own run id (indexed: ``history(run_id=)``; an identifier, so never
#: redacted, unlike the rest of the metadata) and puts it back into the metadata on load.
RUN_KEY = "persistkit_run_id"

#: In the metadata of the thread's latest checkpoint when its turn was given up with
#: ``store.abandon(thread, run_id, namespace="lg:c:")``: the abandon's end record (no LangGraph
#: checkpoint of its own) stands behind the turn's last checkpoint, whose pending tasks are
#: dropped; the next turn starts on top of it, a redelivery raises ``RunAbandonedError``.
ABANDONED_KEY = "persistkit_abandoned"

#: persistkit's longest id; a longer ``RUN_KEY`` value stays in the metadata, redacted like any value.
MAX_RUN_ID = 512


#: In the metadata of a cut marker (``delete_for_runs``, ``_prune``): the digests (:func:`run_digest`)
#: of the LangGraph runs whose checkpoints below the marker are deleted (hidden until the
#: rows are gone). A marker is no LangGraph checkpoint; a namespace whose head is one is empty.
CUT_KEY = "langgraph_cut"

#: In a checkpoint's record metadata: the :func:`run_digest` of LangGraph's ``metadata["run_id"]``
#: (hexadecimal, so persistkit's run-metadata redaction never rewrites it, as it may the id itself).
RUN_DIGEST_KEY = "langgraph_run"


def run_digest(run_id: str) -> str:
    """How a LangGraph run id is matched in stored records (``delete_for_runs``)."""
    return hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def cut_marker(cp: pk.Checkpoint) -> bool:
    """A cut marker written by ``delete_for_runs`` (see :data:`CUT_KEY`)."""
    return CUT_KEY in cp.metadata


def record_run(cp: pk.Checkpoint, lg: Mapping[str, Any] | None) -> str | None:
    """The :func:`run_digest` of the LangGraph run a checkpoint record belongs to (None: no run
    id). Records written before the digest was stored: from the decoded metadata ``lg``."""
    digest = cp.metadata.get(RUN_DIGEST_KEY)
    if isinstance(digest, str):
        return digest
    run = lg["metadata"].get("run_id") if lg is not None else None
    return run_digest(run) if isinstance(run, str) else None


def abandon_record(cp: pk.Checkpoint) -> bool:
    """``store.abandon``'s end record in a saver namespace (every other record is a LangGraph
    checkpoint or a cut marker)."""
    return "langgraph_id" not in cp.metadata and CUT_KEY not in cp.metadata


def run_id_problem(run_id: object) -> str | None:
    """Why ``run_id`` cannot be a persistkit run id (None: it can)."""
    if not isinstance(run_id, str) or not run_id.strip():
        return "give the turn's event id as a non-empty str"
    if "\x00" in run_id:
        return "it must not contain a NUL character (\\x00)"
    if len(run_id) > MAX_RUN_ID:
        return f"it must be at most {MAX_RUN_ID} characters, got {len(run_id)}"
    return None


_PAGE = 50  # checkpoints per history page when listing


_RETRIES = 20  # compare-and-swap retries for writes shared by parallel tasks


#: In the config a run loads with when it was asked for a checkpoint_id (time travel): the
#: LangGraph id it branches from. A dunder key: LangGraph keeps it out of checkpoint metadata.
_BRANCH_KEY = "__persistkit_branch__"


_UNCHECKED = object()  # a put written on top of whatever the head is


_KNOWN_IDS = 4096  # LangGraph id -> persistkit checkpoint id, remembered per saver


def _call(name: str, *args: Any, **kwargs: Any) -> Request:
    return (name, args, kwargs)


def _with(metadata: Mapping[str, Any], key: str, value: Any) -> CheckpointMetadata:
    """LangGraph's checkpoint metadata with persistkit's ``key`` (a key its TypedDict does not name)."""
    return cast(CheckpointMetadata, {**metadata, key: value})


def _wns(ns: str, checkpoint_id: str) -> str:
    return f"{_WR}{checkpoint_id}:{ns}"


def _known(config: RunnableConfig) -> frozenset[str] | None:
    """The running graph's channel names, when ``durable_invoke`` put them in the config."""
    known = config["configurable"].get(CHANNELS_KEY)
    return frozenset(known) if known is not None else None


def _running(config: RunnableConfig) -> bool:
    """Whether LangGraph's run loop makes this call (it adds its own keys to the config;
    ``get_state``, ``update_state`` and direct saver calls do not)."""
    return any(str(k).startswith("__pregel_") for k in config["configurable"])


def _lost_race(thread_id: str, ns: str, checkpoint_id: str, parent: str | None, exc: pk.ConflictError) -> pk.ConflictError:
    where = f"LangGraph thread {thread_id!r}{f' namespace {ns!r}' if ns else ''}"
    return pk.ConflictError(
        f"{where}: checkpoint {checkpoint_id} was not written: the run read the thread at "
        f"{f'checkpoint {parent}' if parent else 'no checkpoint'}, and another run of this thread "
        "wrote a newer checkpoint meanwhile (two invokes of one thread at once). Writing on top "
        "would drop that run's turn, so nothing of this step was written; the other run's "
        "checkpoints stay. Run the turns of a thread one at a time: durable_invoke(graph, input, "
        "config, run_id=<event id>) takes the thread's lease and queues them; or invoke again "
        "to apply this input on top of the new head",
        thread_id=thread_id, namespace=_CP + ns, expected=exc.expected, found=exc.found,
        found_checkpoint=exc.found_checkpoint,
    )


def _ids(config: RunnableConfig) -> tuple[str, str]:
    conf = config["configurable"]
    return str(conf["thread_id"]), str(conf.get("checkpoint_ns") or "")


class SaverPlans:
    """The plans and the encoding behind :class:`~persistkit_langgraph.PersistkitSaver`."""

    store: pk.Store
    serde: SerializerProtocol
    _migrations: Migrations
    _models: ModelCheck
    _pk_ids: dict[str, str]

    @property
    def version(self) -> int:
        """The graph-state version this saver stamps on the checkpoints it writes."""
        return self._migrations.version

    # -- encoding ----------------------------------------------------------------------

    def _dump(self, value: Any) -> Any:
        if type(value) is list:  # persistkit stores list channels as append-only segments
            return [self._dump_one(item) for item in value]
        return self._dump_one(value)

    def _dump_one(self, value: Any) -> dict[str, Any]:
        kind, data = self.serde.dumps_typed(value)
        if kind == "msgpack":  # stored as its tree, so that persistkit redacts its strings
            tree = to_tree(data)
            if tree is not None:
                return {"t": kind, "m": tree}
        return {"t": kind, "v": data}

    def _load(self, stored: Any, live: bool = True) -> Any:
        if isinstance(stored, list):
            return [self._load(item, live) for item in stored]
        if "m" in stored:
            return self.serde.loads_typed((stored["t"], from_tree(stored["m"], live=live)))
        return self.serde.loads_typed((stored["t"], stored["v"]))

    def _load_lg(self, stored: dict[str, Any]) -> dict[str, Any]:
        """The ``{"checkpoint", "metadata"}`` of a checkpoint's ``langgraph`` metadata entry."""
        if "c" in stored:
            return {"checkpoint": self._load(stored["c"]), "metadata": self._load(stored["m"])}
        loaded: dict[str, Any] = self._load(stored)  # both in one encoding: written by an earlier saver
        return loaded

    # -- plans (one copy of each operation) -------------------------------------------------

    def _tuple(
        self, cp: pk.Checkpoint, lg: dict[str, Any], known: frozenset[str] | None, live: bool = False
    ) -> Plan[CheckpointTuple]:
        """The checkpoint as LangGraph reads it, migrated to the saver's version. Inspection
        (``live`` false: ``get_state``, ``get_state_history``, ``list``) never needs a secret's
        value: handles stay handle text. A live load (the graph about to run its next nodes)
        resolves them, or raises ``SecretResolutionError`` before any node runs with handle
        text in its input."""
        checkpoint, ns, thread_id = lg["checkpoint"], cp.namespace[len(_CP) :], cp.thread_id
        where = f"LangGraph thread {thread_id!r}{f' namespace {ns!r}' if ns else ''} checkpoint {checkpoint['id']}"
        stored_version = cp.metadata.get(VERSION_KEY, 1)
        steps = [] if stored_version == self.version else self._migrations.plan(int(stored_version), where)
        state = yield _call("get_state", thread_id, cp.checkpoint_id, namespace=cp.namespace)
        stored_writes = yield from self._writes(thread_id, ns, checkpoint["id"])
        if live:
            state, stored_writes = pk.secrets.live((dict(state), stored_writes), where=f"{where}: the graph's next nodes")
        # Subgraphs inherit the root's config: only the root namespace is checked against its channels.
        known = None if ns else known
        if not steps:  # a renamed field first: it explains the values that no longer fit, too
            names = [k for k in checkpoint["channel_versions"] if state.get(k) is not None]
            self._migrations.unknown([*names, *(w["c"] for w in stored_writes.values())], known, where)
        values = {
            k: self._load_checked(state[k], f"{where} channel {k!r}", bool(steps), live)
            for k in checkpoint["channel_versions"]
            if state.get(k) is not None
        }
        writes = [
            (w["k"], w["c"], self._load_checked(w, f"{where} pending write of task {w['k']} to {w['c']!r}", bool(steps), live))
            for w in sorted(stored_writes.values(), key=lambda w: (w["p"], w["k"], w["i"]))
        ]
        if steps:
            values, writes = migrate_checkpoint(self._migrations, checkpoint, values, writes, steps, where)
            self._migrations.unknown([*values, *(c for _, c, _ in writes)], known, where)
        checkpoint["channel_values"] = values
        parent = cp.metadata.get("langgraph_parent")
        metadata = lg["metadata"] if cp.run_id is None else _with(lg["metadata"], RUN_KEY, cp.run_id)
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}},
            checkpoint=checkpoint,
            metadata=metadata,
            parent_config=(
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": parent}}
                if parent
                else None
            ),
            pending_writes=writes,
        )

    def _load_checked(self, stored: Any, where: str, plain: bool, live: bool = True) -> Any:
        """A stored channel value or write, refusing (or, before a migration, handing over as
        dicts) pydantic values that no longer fit their class, which LangGraph would build unvalidated."""
        if isinstance(stored, list):
            return [self._load_checked(item, f"{where}[{i}]", plain, live) for i, item in enumerate(stored)]
        if "m" not in stored:
            return self._load(stored, live)

        def fail(path: str, problem: str) -> Exception:
            return pk.SchemaVersionError(
                f"{where}{path}: {problem}. Nothing was loaded. {remedy(self.version)}"
            )

        tree = self._models.walk(stored["m"], "", plain, fail)
        return self.serde.loads_typed((stored["t"], from_tree(tree, live=live)))

    def _writes(self, thread_id: str, ns: str, checkpoint_id: str) -> Plan[dict[str, Any]]:
        try:
            state = yield _call("get_state", thread_id, None, namespace=_wns(ns, checkpoint_id))
        except pk.NotFoundError:
            return {}
        return {k: v for k, v in state.items() if v is not None}  # None: emptied by a prune

    def _namespaces(self, thread_id: str) -> Plan[list[str]]:
        try:
            reg = yield _call("get_state", thread_id, None, namespace=_REG)
        except pk.NotFoundError:
            return []
        return sorted(key[3:] for key in reg)

    def _update(self, thread_id: str, changes: dict[str, Any], namespace: str) -> Plan[pk.Checkpoint]:
        """``update_state``, retried when a parallel task moved the head first (changes merge)."""
        for attempt in range(_RETRIES):
            try:
                cp: pk.Checkpoint = yield _call("update_state", thread_id, changes, namespace=namespace)
                return cp
            except pk.ConflictError:
                if attempt == _RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _get(self, config: RunnableConfig) -> Plan[CheckpointTuple | None]:
        thread_id, ns = _ids(config)
        cid = get_checkpoint_id(config)
        meta = {"langgraph_id": cid} if cid else None
        cps = yield _call("history", thread_id, limit=1, metadata=meta, namespace=_CP + ns)
        if cps and cut_marker(cps[0]):  # every checkpoint of the namespace was deleted
            return None
        abandoned = cps[0] if cps and abandon_record(cps[0]) else None
        if abandoned is not None:  # the turn's last checkpoint, behind the abandon's end record
            cps = yield _call("history", thread_id, limit=1, before=abandoned.checkpoint_id, namespace=_CP + ns)
        if not cps:
            return None
        live = _running(config)
        self._remember(cps[0])
        result = yield from self._tuple(cps[0], self._load_lg(cps[0].metadata["langgraph"]), _known(config), live)
        if abandoned is not None:
            self._pk_ids[cps[0].metadata["langgraph_id"]] = abandoned.checkpoint_id  # a put on top finds it
            result = result._replace(metadata=_with(result.metadata, ABANDONED_KEY, True))
        if live and cid:  # a run asked for this checkpoint (time travel): its first write branches from it
            conf = {**result.config["configurable"], _BRANCH_KEY: cid}
            result = result._replace(config={**result.config, "configurable": conf})
        return result

    def _remember(self, cp: pk.Checkpoint) -> None:
        known = self._pk_ids
        known[cp.metadata["langgraph_id"]] = cp.checkpoint_id
        while len(known) > _KNOWN_IDS:  # forget the oldest (tasks of one graph share the saver)
            try:
                known.pop(next(iter(known)), None)
            except (RuntimeError, StopIteration):  # another thread changed it meanwhile
                break

    def _expected_head(self, thread_id: str, ns: str, config: RunnableConfig) -> Plan[Any]:
        """What a put must find at the head of its namespace: the persistkit checkpoint of its
        parent (None: an empty namespace). Only a running graph's puts are checked, and not the
        first put of a run asked to start from an older checkpoint (time travel: a branch)."""
        conf = config["configurable"]
        parent = conf.get("checkpoint_id")
        if not _running(config) or (parent and conf.get(_BRANCH_KEY) == parent):
            return _UNCHECKED
        if not parent:
            return None
        known = self._pk_ids.get(parent)
        if known is None:
            cps = yield _call("history", thread_id, limit=1, metadata={"langgraph_id": parent}, namespace=_CP + ns)
            if not cps:
                return _UNCHECKED  # a parent this store never had (a copied config): nothing to compare
            known = cps[0].checkpoint_id
        return known

    def _list(
        self, config: RunnableConfig | None, filter: dict[str, Any] | None, before: RunnableConfig | None, limit: int | None
    ) -> Plan[None]:
        before_id = get_checkpoint_id(before) if before else None
        only_id = get_checkpoint_id(config) if config else None
        if config:
            thread_ids = [str(config["configurable"]["thread_id"])]
        else:
            thread_ids = yield _call("threads")
        wanted = config["configurable"].get("checkpoint_ns") if config else None
        count = 0
        for thread_id in thread_ids:
            namespaces = [str(wanted)] if wanted is not None else (yield from self._namespaces(thread_id))
            for ns in namespaces:
                cursor = None
                seen: set[str] = set()  # a checkpoint rewritten by delete_for_runs: its newest copy
                hidden: set[str] = set()  # runs deleted below a cut marker (see CUT_KEY)
                while True:
                    cps = yield _call("history", thread_id, limit=_PAGE, before=cursor, namespace=_CP + ns)
                    for cp in cps:
                        if cut_marker(cp):
                            hidden.update(cp.metadata[CUT_KEY])
                        if "langgraph_id" not in cp.metadata:
                            continue
                        lg_id = cp.metadata["langgraph_id"]
                        if lg_id in seen:
                            continue
                        seen.add(lg_id)
                        if (only_id and lg_id != only_id) or (before_id and lg_id >= before_id):
                            continue
                        lg = self._load_lg(cp.metadata["langgraph"])
                        if hidden and record_run(cp, lg) in hidden:
                            continue
                        if cp.run_id is not None:
                            lg["metadata"] = {**lg["metadata"], RUN_KEY: cp.run_id}
                        if filter and any(lg["metadata"].get(k) != v for k, v in filter.items()):
                            continue
                        tup = yield from self._tuple(cp, lg, _known(config) if config else None)
                        yield _call("emit", tup)
                        count += 1
                        if limit is not None and count >= limit:
                            return
                    if len(cps) < _PAGE:
                        break
                    cursor = cps[-1].checkpoint_id

    def _put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata) -> Plan[RunnableConfig]:
        thread_id, ns = _ids(config)
        rest: dict[str, Any] = dict(checkpoint)
        values = rest.pop("channel_values")
        # Every channel of the checkpoint is written: unchanged ones cost a hash, not a write.
        state = {k: self._dump(values[k]) if k in values else None for k in checkpoint["channel_versions"]}
        # The checkpoint's bookkeeping (ids, channel versions) is kept as the serializer's bytes:
        # run metadata is text for people, where persistkit's high-entropy rule may rewrite ids.
        # LangGraph's metadata (the caller's included) is a tree, redacted like any value.
        kind, data = self.serde.dumps_typed(rest)
        lg_meta = dict(get_checkpoint_metadata(config, metadata))
        # durable_invoke's turn id (see _invoke): the record's run id, out of the redacted tree.
        run = lg_meta.pop(RUN_KEY) if run_id_problem(lg_meta.get(RUN_KEY)) is None else None
        lg = {"c": {"t": kind, "v": data}, "m": self._dump_one(lg_meta)}
        meta = {
            "langgraph_id": checkpoint["id"],
            "langgraph_parent": config["configurable"].get("checkpoint_id"),
            "langgraph": lg,
            VERSION_KEY: self.version,
        }
        lg_run = lg_meta.get("run_id")
        if isinstance(lg_run, str):
            meta[RUN_DIGEST_KEY] = run_digest(lg_run)
        expected = yield from self._expected_head(thread_id, ns, config)
        check: dict[str, Any] = {} if expected is _UNCHECKED else {"expected_head": expected}
        if run is not None:
            check["run_id"] = run
        try:
            cp = yield _call("update_state", thread_id, state, metadata=meta, namespace=_CP + ns, **check)
        except pk.ConflictError as exc:
            cut = yield from self._cut_head(thread_id, ns, expected, exc)
            if cut is None:
                raise _lost_race(thread_id, ns, checkpoint["id"], config["configurable"].get("checkpoint_id"), exc) from exc
            cp = yield _call("update_state", thread_id, state, metadata=meta, namespace=_CP + ns, **{**check, "expected_head": cut})
        self._remember(cp)
        if cp.parent_id is None:  # first checkpoint of this namespace: register it
            yield from self._update(thread_id, {"ns:" + ns: True}, _REG)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def _cut_head(self, thread_id: str, ns: str, expected: Any, exc: pk.ConflictError) -> Plan[str | None]:
        """The id of the cut marker a first put found at the head instead of an empty namespace
        (every checkpoint of the namespace was deleted: the put goes on top of it), else None."""
        if expected is not None or exc.found_checkpoint is None:
            return None
        try:
            head = yield _call("get_checkpoint", thread_id, exc.found_checkpoint, namespace=_CP + ns)
        except pk.NotFoundError:
            return None
        return head.checkpoint_id if cut_marker(head) else None

    def _put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str) -> Plan[None]:
        thread_id, ns = _ids(config)
        wns = _wns(ns, str(config["configurable"]["checkpoint_id"]))
        for attempt in range(_RETRIES):
            current = yield from self._writes(thread_id, ns, str(config["configurable"]["checkpoint_id"]))
            changes: dict[str, Any] = {}
            for idx, (channel, value) in enumerate(writes):
                i = WRITES_IDX_MAP.get(channel, idx)
                key = f"{task_id}:{i}"
                if i >= 0 and key in current:  # regular writes are kept; special ones are replaced
                    continue
                changes[key] = {**self._dump_one(value), "k": task_id, "c": channel, "i": i, "p": task_path}
            if not changes:
                return
            try:
                yield _call("update_state", thread_id, changes, namespace=wns)
                return
            except pk.ConflictError:
                if attempt == _RETRIES - 1:
                    raise

    def _copy(self, source: str, target: str) -> Plan[None]:
        for ns in (yield from self._namespaces(source)):
            cps = yield _call("history", source, namespace=_CP + ns)
            for cp in reversed(cps):
                state = yield _call("get_state", source, cp.checkpoint_id, namespace=cp.namespace)
                yield _call(
                    "update_state", target, dict(state), metadata=cp.metadata, namespace=cp.namespace, run_id=cp.run_id
                )
                lg_id = cp.metadata.get("langgraph_id")
                writes = (yield from self._writes(source, ns, lg_id)) if lg_id else None
                if writes:
                    yield _call("update_state", target, writes, namespace=_wns(ns, lg_id))
            if cps:
                yield from self._update(target, {"ns:" + ns: True}, _REG)
