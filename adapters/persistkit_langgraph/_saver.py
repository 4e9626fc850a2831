"""``PersistkitSaver``: the LangGraph checkpointer (storage layout: see the package docstring).

Built only on the public ``persistkit`` API; sync and async share one copy of
each operation (a generator of store calls, driven by a blocking or an awaiting
loop).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

import persistkit as pk

from ._migrate import (
    Migration,
    Migrations,
    ModelCheck,
)
from ._plans import Plan, SaverPlans, T
from ._prune import PrunePlans, check_ids, check_run_ids, check_strategy
from ._values import from_tree

__all__ = ["PersistkitSaver"]


class PersistkitSaver(SaverPlans, PrunePlans, BaseCheckpointSaver[str]):
    """A LangGraph checkpointer that stores in a persistkit :class:`~persistkit.Store`.

    ``latest`` (``get_tuple`` without a checkpoint id) is the checkpoint written
    last in the namespace, which is the newest id for LangGraph's time-ordered ids.
    """

    def __init__(self, store: pk.Store, *, serde: SerializerProtocol | None = None, version: int = 1) -> None:
        super().__init__(serde=serde)
        self.store = store
        self._owns_store = False
        self._migrations = Migrations(version)
        self._pk_ids: dict[str, str] = {}  # LangGraph id -> persistkit id (insertion order: oldest first)
        self._models = ModelCheck(lambda tree: self.serde.loads_typed(("msgpack", from_tree(tree, live=False))))

    @classmethod
    def from_url(
        cls, url: str | None = None, *, serde: SerializerProtocol | None = None, version: int = 1, **options: Any
    ) -> PersistkitSaver:
        """Open ``pk.connect(url, **options)``; the saver closes it in :meth:`close`."""
        saver = cls(pk.connect(url, **options), serde=serde, version=version)
        saver._owns_store = True
        return saver

    def migration(self, *, from_version: int) -> Callable[[Migration], Migration]:
        """Register ``fn(channels) -> channels`` upgrading a checkpoint's channel values from
        graph-state version ``from_version`` to the next (see docs/adapters-langgraph.md)."""
        return self._migrations.register(from_version)

    def close(self) -> None:
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> PersistkitSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- drivers ---------------------------------------------------------------------------------

    def _steps(self, plan: Plan[T], box: list[T]) -> Iterator[Any]:
        try:
            name, args, kwargs = next(plan)
            while True:
                if name == "emit":
                    yield args[0]
                    name, args, kwargs = plan.send(None)
                    continue
                try:
                    result = getattr(self.store, name)(*args, **kwargs)
                except pk.PersistkitError as exc:
                    name, args, kwargs = plan.throw(exc)
                else:
                    name, args, kwargs = plan.send(result)
        except StopIteration as stop:
            box.append(stop.value)

    async def _asteps(self, plan: Plan[T], box: list[T]) -> AsyncIterator[Any]:
        try:
            name, args, kwargs = next(plan)
            while True:
                if name == "emit":
                    yield args[0]
                    name, args, kwargs = plan.send(None)
                    continue
                try:
                    result = await getattr(self.store, "a" + name)(*args, **kwargs)
                except pk.PersistkitError as exc:
                    name, args, kwargs = plan.throw(exc)
                else:
                    name, args, kwargs = plan.send(result)
        except StopIteration as stop:
            box.append(stop.value)

    def _run(self, plan: Plan[T]) -> T:
        box: list[T] = []
        for _ in self._steps(plan, box):
            pass
        return box[0]

    async def _arun(self, plan: Plan[T]) -> T:
        box: list[T] = []
        async for _ in self._asteps(plan, box):
            pass
        return box[0]

    # -- BaseCheckpointSaver -----------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._run(self._get(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        yield from self._steps(self._list(config, filter, before, limit), [])

    def put(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, new_versions: ChannelVersions
    ) -> RunnableConfig:
        return self._run(self._put(config, checkpoint, metadata))

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        self._run(self._put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self.store.delete_thread(str(thread_id))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run(self._copy(str(source_thread_id), str(target_thread_id)))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only the latest checkpoint (and its writes) of each namespace of these threads
        (``"keep_latest"``, through ``store.prune``: needs the store's prune capability), or
        delete them (``"delete"``). See docs/adapters-langgraph.md, Deleting checkpoints."""
        for thread_id in self._prune_targets(thread_ids, strategy):
            self._run(self._prune_plan(thread_id, strategy))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints and writes of these LangGraph runs (``metadata["run_id"]``) in
        every thread of the store; the runs' other threads' checkpoints stay. Needs the store's
        prune capability. See docs/adapters-langgraph.md, Deleting checkpoints."""
        runs = check_run_ids(run_ids)
        if runs:
            self._require_prune("delete_for_runs()")
            self._run(self._delete_runs_plan(runs))

    def _prune_targets(self, thread_ids: Sequence[str], strategy: str) -> tuple[str, ...]:
        check_strategy(strategy)
        ids = tuple(check_ids(thread_ids, "prune(thread_ids)"))
        if ids and strategy == "keep_latest":
            self._require_prune("prune(strategy='keep_latest')")
        return ids

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._arun(self._get(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        async for tup in self._asteps(self._list(config, filter, before, limit), []):
            yield tup

    async def aput(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, new_versions: ChannelVersions
    ) -> RunnableConfig:
        return await self._arun(self._put(config, checkpoint, metadata))

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await self._arun(self._put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        await self.store.adelete_thread(str(thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._arun(self._copy(str(source_thread_id), str(target_thread_id)))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        for thread_id in self._prune_targets(thread_ids, strategy):
            await self._arun(self._prune_plan(thread_id, strategy))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = check_run_ids(run_ids)
        if runs:
            self._require_prune("adelete_for_runs()")
            await self._arun(self._delete_runs_plan(runs))

    def get_next_version(self, current: str | None, channel: None) -> str:
        # Same scheme as LangGraph's own savers: monotonic counter + random tie-breaker.
        n = 0 if current is None else current if isinstance(current, int) else int(str(current).split(".")[0])
        return f"{n + 1:032}.{random.random():016}"
