"""Running one turn of a graph durably: ``durable_invoke`` / ``adurable_invoke``.

A turn is one ``graph.invoke`` on one LangGraph thread (one Slack event, one queue
message). What ``pk.resume`` gives a block, a turn gets here:

* the thread's lease (``persistkit.coordination``, the same record ``pk.resume``
  takes), with the busy policy: turns of one thread run one at a time, in arrival
  order, across processes; the saver's checkpoint writes inside the turn carry the
  lease's fencing token (a replaced holder gets ``LeaseLostError``, writes nothing);
* a turn identity, ``run_id=`` (the event id), recorded with each checkpoint the turn
  writes (the persistkit record's run id, indexed and never redacted; LangGraph's
  metadata shows it as ``persistkit_run_id``): a redelivered turn that finished
  returns its result without running a node, one that crashed continues, and one
  that did not finish (a node raised, or it was cut off) while the thread moved on
  past it raises ``pk.ConflictError`` instead of passing partial output off as its result;
* a crashed turn keeps its place: while the thread's latest checkpoint belongs to a
  turn that stopped mid-way (its process died), a turn with another ``run_id`` does
  not start on top of it. It gives the lease up and waits for the crashed turn to be
  continued (its redelivery, or ``durable_invoke`` without ``run_id``) or abandoned
  (``store.abandon(thread, run_id, namespace="lg:c:")``: the saver shows the turn's last
  checkpoint, flagged ``persistkit_abandoned``, its tasks dropped), up to
  ``busy_timeout``, then raises ``pk.ThreadBusyError`` naming it and the LangGraph remedies.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.pregel import Pregel
from langgraph.types import Command, StateSnapshot

import persistkit as pk

from ._migrate import CHANNELS_KEY
from ._plans import ABANDONED_KEY, RUN_KEY, abandon_record, run_id_problem
from ._saver import PersistkitSaver
from ._stream import Source, astream_turn, stream_turn

__all__ = ["RUN_KEY", "adurable_invoke", "durable_invoke"]

_CP = "lg:c:"  # the saver's checkpoint namespaces (see the package docstring)
#: What the lease is reserved for while a crashed turn that had no run_id keeps its place.
_NO_RUN_ID = "(a turn without run_id)"
_HOW = "In LangGraph, durable_invoke(graph, None, config) with that run_id (or none) continues it"
_DEFAULT_BUSY = pk.ThreadLease.DEFAULT_BUSY  # "queue", asked of a store only if it has leases
_DEFAULT_TTL, _DEFAULT_TIMEOUT = pk.ThreadLease.DEFAULT_TTL, pk.ThreadLease.DEFAULT_BUSY_TIMEOUT


def _ids(config: RunnableConfig) -> tuple[str, str]:
    conf = config.get("configurable") or {}
    if "thread_id" not in conf:
        raise pk.ConfigurationError(
            "durable_invoke needs config={'configurable': {'thread_id': ...}}: the thread is the unit "
            "of durability and of the lease"
        )
    return str(conf["thread_id"]), str(conf.get("checkpoint_ns") or "")


def _with_channels(graph: Pregel[Any, Any, Any, Any], config: RunnableConfig) -> RunnableConfig:
    """``config`` telling the saver the graph's channels, so that stored channels the graph no
    longer has (a renamed state field) are refused instead of dropped. A dunder key: LangGraph
    keeps it out of checkpoint metadata."""
    names = frozenset(graph.channels) | frozenset(getattr(graph, "managed", None) or ())
    return {**config, "configurable": {**config.get("configurable", {}), CHANNELS_KEY: names}}


def _with_run(config: RunnableConfig, run_id: str | None) -> RunnableConfig:
    """``config`` whose checkpoints record ``run_id`` (LangGraph copies ``config["metadata"]``
    into each checkpoint's metadata)."""
    if run_id is None:
        return config
    return {**config, "metadata": {**(config.get("metadata") or {}), RUN_KEY: run_id}}


def _abandoned(state: StateSnapshot) -> bool:
    """The latest checkpoint's turn was given up (``store.abandon``): its tasks never run."""
    return bool((state.metadata or {}).get(ABANDONED_KEY))


def _open(state: StateSnapshot) -> bool:
    """The latest checkpoint's run stopped mid-way (a crash, or a node that raised) and can go on.
    Its tasks: still to run, or done with their writes saved but no checkpoint after them yet
    (``state.next`` leaves those out). A finished run has none."""
    return bool(state.tasks) and not state.interrupts and not _abandoned(state)


def _turn_input(state: StateSnapshot, input: Any, config: RunnableConfig) -> Any:
    """What to invoke the graph with when no turn identity is given: None continues the
    thread's unfinished run (crashed, or stopped by a node that raised)."""
    if isinstance(input, Command):
        return input  # an answer to interrupt(): LangGraph's own resume
    if _open(state):
        return None  # a run stopped mid-way (a crash, or a node that raised): continue it
    if input is None and _abandoned(state):
        thread_id, ns = _ids(config)
        raise pk.ConfigurationError(
            f"thread {thread_id!r}{f' namespace {ns!r}' if ns else ''}: its latest turn was abandoned "
            "(store.abandon), so there is nothing to continue: call durable_invoke(graph, input, config) "
            "with the next turn's input"
        )
    if input is None and not state.config.get("configurable", {}).get("checkpoint_id"):
        thread_id, ns = _ids(config)
        raise pk.NotFoundError(
            f"thread {thread_id!r}{f' namespace {ns!r}' if ns else ''} has no committed checkpoint "
            "to continue: the run that should have written one was never started, or died before "
            "its first checkpoint was committed (durability \"exit\" writes only when a run ends, "
            "\"async\" in the background). Call durable_invoke(graph, input, config) with the "
            "run's input to start it again"
        )
    return input


@dataclass(frozen=True, slots=True)
class _Step:
    """What a turn does once it holds the lease and has read the thread's latest checkpoint."""

    kind: str  # "run" (invoke with ``input`` under ``run_id``), "done", "wait" or "lookup"
    input: Any = None
    run_id: str | None = None
    state: StateSnapshot | None = None  # "done": the turn's last checkpoint


def _crashed(state: StateSnapshot) -> bool:
    """The latest checkpoint belongs to a run that stopped mid-way without a node failing:
    its process died (or lost its lease) and the run can be continued."""
    return _open(state) and not any(t.error for t in state.tasks)


def _decide(state: StateSnapshot, input: Any, run_id: str | None, config: RunnableConfig) -> _Step:
    found = (state.metadata or {}).get(RUN_KEY) if state.config.get("configurable", {}).get("checkpoint_id") else None
    head_run = found if isinstance(found, str) else None  # the turn that wrote the latest checkpoint
    if run_id is None:
        # No identity: continue whatever stopped mid-way (keeping its identity), else start.
        inherited = head_run if _open(state) else None
        return _Step("run", _turn_input(state, input, config), inherited)
    if isinstance(input, Command):
        return _Step("run", input, run_id)
    if head_run == run_id:
        if _abandoned(state):
            thread_id, _ = _ids(config)
            raise _abandoned_error(thread_id, run_id)
        if _open(state):
            return _Step("run", None, run_id)  # this turn crashed (or a node raised): continue it
        return _Step("done", state=state)  # this turn finished (or waits at an interrupt)
    if _crashed(state):
        return _Step("wait", run_id=head_run)  # another turn crashed: it keeps its place
    return _Step("lookup")  # did this turn run before, earlier in the thread?


def _abandoned_error(thread_id: str, run_id: str) -> pk.RunAbandonedError:
    return pk.RunAbandonedError(
        f"LangGraph thread {thread_id!r}: turn {run_id} was abandoned (store.abandon): it does not run "
        "again, and retrying will not change that. The nodes it ran stay in the thread and later turns "
        "go on from them. Drop this message (ack it); to do its work anyway, run it as a new turn with "
        "a new run_id",
        thread_id=thread_id, run_id=run_id,
    )


def _output(graph: Pregel[Any, Any, Any, Any], state: StateSnapshot) -> Any:
    """What ``graph.invoke`` returned for the turn that ended at ``state``."""
    values = state.values
    out = graph.output_channels
    if isinstance(out, str):
        return values.get(out) if isinstance(values, dict) else values
    result: dict[str, Any] = {k: values[k] for k in out if k in values} if isinstance(values, dict) else values
    if state.interrupts and isinstance(result, dict):
        result["__interrupt__"] = list(state.interrupts)
    return result


class _Turn:
    """One call of ``durable_invoke``: its options, checked, and its lease (``pk.ThreadLease``
    on the thread's root checkpoint namespace, the same record ``pk.resume`` would take)."""

    def __init__(
        self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, run_id: str | None,
        busy: str | None, lease_ttl: float, busy_timeout: float | None, unfinished_timeout: float | None,
        concurrency: pk.Concurrency | tuple[str, str, int] | None = None,
    ) -> None:
        problem = None if run_id is None else run_id_problem(run_id)
        if problem is not None:
            raise pk.ConfigurationError(f"run_id={run_id!r}: {problem}")
        self.thread_id, self.ns = _ids(config)
        saver = graph.checkpointer
        self.saver = saver if isinstance(saver, PersistkitSaver) else None
        self.config = _with_channels(graph, config)
        self.run_id = run_id
        self.unfinished = unfinished_timeout
        self.lease_ns = _CP + self.ns
        pk.ThreadLease.check_options(busy, lease_ttl, busy_timeout)
        self.lease: pk.ThreadLease | None = None
        if self.saver is not None:
            self.lease = pk.ThreadLease(
                self.saver.store, self.thread_id, self.lease_ns, run_id=run_id, busy=busy,
                lease_ttl=lease_ttl, busy_timeout=busy_timeout, unfinished_timeout=unfinished_timeout,
                concurrency=concurrency,
            )
        elif (
            (busy is not _DEFAULT_BUSY and busy is not None) or unfinished_timeout is not None or concurrency is not None
        ):
            what = (
                f"unfinished_timeout={unfinished_timeout!r}" if unfinished_timeout is not None
                else f"concurrency={concurrency!r}" if concurrency is not None else f"busy={busy!r}"
            )
            raise pk.ConfigurationError(
                f"{what} needs the graph compiled with checkpointer=PersistkitSaver(...): the "
                f"lease lives in the persistkit store (this graph's checkpointer is {type(saver).__name__})"
            )

    def crashed(self, crashed: str | None) -> str:
        # A crashed turn started without run_id is continued by a durable_invoke without one.
        return crashed if crashed is not None else _NO_RUN_ID

    def no_lease(self, crashed: str | None) -> pk.ThreadBusyError:
        return pk.ThreadBusyError(
            f"LangGraph thread {self.thread_id!r}: its latest turn {self.crashed(crashed)} stopped mid-way (its "
            "process died), and this turn takes no lease (busy=None, or a checkpointer other than "
            "PersistkitSaver), so it cannot wait for it. Continue it first: "
            f"durable_invoke(graph, None, config, run_id={crashed!r})",
            thread_id=self.thread_id, unfinished_run=self.crashed(crashed),
        )

    def earlier(self, graph: Pregel[Any, Any, Any, Any]) -> RunnableConfig | None:
        """The config of this turn's last checkpoint further back in the thread, if any."""
        if self.saver is None:  # any checkpointer: LangGraph's own metadata filter
            assert graph.checkpointer is not None and not isinstance(graph.checkpointer, bool)
            for tup in graph.checkpointer.list(self.config, filter={RUN_KEY: self.run_id}, limit=1):
                return self._at(tup.config["configurable"]["checkpoint_id"])
            return None
        return self._found(self.saver.store.history(self.thread_id, namespace=self.lease_ns, run_id=self.run_id, limit=1))

    async def aearlier(self, graph: Pregel[Any, Any, Any, Any]) -> RunnableConfig | None:
        if self.saver is None:
            assert graph.checkpointer is not None and not isinstance(graph.checkpointer, bool)
            async for tup in graph.checkpointer.alist(self.config, filter={RUN_KEY: self.run_id}, limit=1):
                return self._at(tup.config["configurable"]["checkpoint_id"])
            return None
        return self._found(
            await self.saver.store.ahistory(self.thread_id, namespace=self.lease_ns, run_id=self.run_id, limit=1)
        )

    def _found(self, cps: list[pk.Checkpoint]) -> RunnableConfig | None:
        # The turn's records are indexed by the store (the record's run id): one read, no scan.
        if not cps:
            return None
        if abandon_record(cps[0]):
            assert self.run_id is not None
            raise _abandoned_error(self.thread_id, self.run_id)
        return self._at(cps[0].metadata["langgraph_id"])

    def result(self, graph: Pregel[Any, Any, Any, Any], last: StateSnapshot, head: StateSnapshot) -> Any:
        """The output of this turn, whose last checkpoint ``last`` is behind the thread's
        ``head``: the turn must have finished (or stopped at an interrupt)."""
        if not (last.tasks and not last.interrupts):
            return _output(graph, last)
        at = last.config["configurable"]["checkpoint_id"]
        failed = [t.name for t in last.tasks if t.error]
        why = f"node {', '.join(map(repr, failed))} raised" if failed else "it was cut off"
        head_id = head.config.get("configurable", {}).get("checkpoint_id")
        head_run = (head.metadata or {}).get(RUN_KEY)
        where = f"LangGraph thread {self.thread_id!r}{f' namespace {self.ns!r}' if self.ns else ''}"
        raise pk.ConflictError(
            f"{where}: turn {self.run_id} did not finish before the thread moved on ({why} at checkpoint "
            f"{at}, before node(s) {', '.join(repr(t.name) for t in last.tasks)}; the thread's head is "
            f"checkpoint {head_id}" + (f" of turn {head_run}" if isinstance(head_run, str) else "") + "): it "
            "cannot run on this thread now, and its partial output is no result. Do not redeliver it under "
            "a new run_id (its nodes that ran would run again); to go on from its state, run the graph "
            f"from its last checkpoint: graph.invoke(None, {{'configurable': {{'thread_id': {self.thread_id!r}, "
            f"'checkpoint_id': {at!r}}}}}) (a branch of the thread)",
            thread_id=self.thread_id, namespace=self.lease_ns,
        )

    def busy(self, exc: pk.ThreadBusyError, busy: str | None, busy_timeout: float | None) -> pk.ThreadBusyError:
        """``exc`` (the lease's, about an unfinished turn) with the LangGraph remedies."""
        run = exc.unfinished_run
        if not run:
            return exc
        if exc.retry_after is not None:  # unfinished_timeout ran out: the worker goes back to the pool
            how = (
                f"Waited unfinished_timeout={self.unfinished} s and gives its place back, so that its worker is "
                f"free for that turn's redelivery: retry this turn in about {exc.retry_after} s (err.retry_after)"
            )
        else:
            how = (
                "(busy='reject')" if busy == "reject"
                else f"Waited busy_timeout={busy_timeout} s; raise busy_timeout= in durable_invoke(...) to wait longer"
            )
        t, ns = self.thread_id, self.lease_ns
        if run == _NO_RUN_ID:  # recorded under no run id: nothing to abandon it by
            again = "durable_invoke(graph, None, config) (no run_id)"
            give_up = "continue it with that call yourself"
        else:
            again = f"durable_invoke(graph, None, config, run_id={run!r})"
            give_up = (
                f"give it up: store.abandon({t!r}, {run!r}, namespace={ns!r}) or `persistkit abandon {t} "
                f"{run} --namespace {ns}` (the nodes it ran stay; the next turn starts on top of them)"
            )
        return pk.ThreadBusyError(
            f"LangGraph thread {t!r}: its latest turn {run} stopped mid-way (its process died or lost its "
            "lease), and turns of a thread run in arrival order: this turn starts once that turn is "
            f"continued, by its redelivery or by {again} with this thread's config. {how}. If it will "
            f"never be redelivered, {give_up}",
            thread_id=exc.thread_id, holder=exc.holder, expires_at=exc.expires_at, waiting=exc.waiting,
            unfinished_run=run, retry_after=exc.retry_after,
        )

    def _at(self, checkpoint_id: str) -> RunnableConfig:
        return {**self.config, "configurable": {**self.config["configurable"], "checkpoint_id": checkpoint_id}}


def _check_stream(turn: _Turn, stream: str | None) -> None:
    if stream is None:
        return
    pk.check_stream_name(stream)
    if turn.saver is None:
        raise pk.ConfigurationError(
            f"durable_invoke(stream={stream!r}) needs the graph compiled with checkpointer=PersistkitSaver(...): "
            "the stream lives in the persistkit store, next to the turn's checkpoints"
        )


def durable_invoke(
    graph: Pregel[Any, Any, Any, Any],
    input: Any,
    config: RunnableConfig,
    *,
    run_id: str | None = None,
    busy: str | None = _DEFAULT_BUSY,
    lease_ttl: float = _DEFAULT_TTL,
    busy_timeout: float | None = _DEFAULT_TIMEOUT,
    unfinished_timeout: float | None = None,
    concurrency: pk.Concurrency | tuple[str, str, int] | None = None,
    stream: str | None = None,
    **kwargs: Any,
) -> Any:
    """``graph.invoke`` for one turn of a thread, safe to call again with the same arguments.

    The turn holds the thread's lease while it runs (``busy``: ``"queue"``, the default,
    waits in arrival order; ``"wait"`` waits; ``"reject"`` raises ``pk.ThreadBusyError``
    at once; ``None`` takes no lease), renewed every ``lease_ttl / 3`` seconds; waiting
    ends after ``busy_timeout`` seconds with ``pk.ThreadBusyError``. ``unfinished_timeout``
    (seconds; ``pk.resume``'s) bounds the wait for a crashed turn alone: past it this turn
    gives its place back and raises ``pk.ThreadBusyError`` with ``retry_after``, so that a
    job queue's worker is free for the crashed turn's redelivery (retry after
    ``err.retry_after``). ``concurrency=(name, key, limit)`` (``pk.resume``'s): at most
    ``limit`` turns of that key (a tenant, say) run their nodes at once across processes; a
    turn takes its slot once it knows it runs (one that returns a recorded result takes none)
    and gives it up when it returns. All three need ``PersistkitSaver`` (the lease lives in its
    store).

    ``run_id`` (the event id) names the turn: called again with the same ``run_id``, a
    finished turn returns its result without running a node, a crashed one continues
    (``input`` is not applied again). A turn with another ``run_id`` waits while the
    thread's latest turn is crashed (not failed: a node that raised fails its turn, and
    the next turn starts on top of it), until it is continued or given up
    (``store.abandon(thread, run_id, namespace="lg:c:")``). A turn that did not finish
    (failed, or cut off) redelivered after the thread moved on raises ``pk.ConflictError``;
    an abandoned one ``pk.RunAbandonedError``.

    Without ``run_id``: if the thread's latest checkpoint has tasks (the process died
    mid-run, or a node raised), the run continues from it and ``input`` is not applied;
    otherwise ``input`` starts a run. ``input=None`` on a thread with no checkpoint is a
    ``pk.NotFoundError``. A ``Command(resume=...)`` is passed as is. ``durability``
    defaults to ``"sync"``; other keyword arguments go to ``graph.invoke``.

    ``stream="answer"`` (needs ``PersistkitSaver``): the turn runs ``graph.stream`` in
    ``"messages"`` mode and forwards the chat models' token chunks, tool calls and tool
    messages into the thread's persistkit stream ``"answer"`` (namespace ``"lg:s:"``), one
    persistkit step per superstep, so a superstep that dies is rewound in the stream and a
    finished one is never sent again (docs/adapters-langgraph.md, Streaming).
    """
    kwargs.setdefault("durability", "sync")
    turn = _Turn(graph, config, run_id, busy, lease_ttl, busy_timeout, unfinished_timeout, concurrency)
    _check_stream(turn, stream)
    lease = turn.lease
    try:
        if lease is not None:
            lease.acquire()
    except pk.ThreadBusyError as exc:
        raise turn.busy(exc, busy, busy_timeout) from exc
    try:
        while True:
            with lease.fenced() if lease is not None else nullcontext():
                state = graph.get_state(turn.config)
                step = _decide(state, input, run_id, turn.config)
                if step.kind == "lookup":
                    earlier = turn.earlier(graph)
                    if earlier is not None:
                        return turn.result(graph, graph.get_state(earlier), state)
                    step = _Step("run", input, run_id)
                if step.kind == "done":
                    assert step.state is not None
                    return _output(graph, step.state)
                if step.kind == "run" and lease is not None:  # concurrency=: a slot, once it runs
                    lease.take_slot()
                if step.kind == "run" and stream is not None:
                    assert turn.saver is not None
                    source = Source(graph, step.input, _with_run(turn.config, step.run_id), kwargs, stream)
                    stream_turn(turn.saver.store, turn.thread_id, turn.ns, step.run_id, source)
                    return _output(graph, graph.get_state(turn.config))
                if step.kind == "run":
                    return graph.invoke(step.input, _with_run(turn.config, step.run_id), **kwargs)
            if lease is None or not lease.held:  # "wait": a crashed turn goes first
                raise turn.no_lease(step.run_id)
            try:
                lease.wait_for(turn.crashed(step.run_id), _HOW)
            except pk.ThreadBusyError as exc:
                raise turn.busy(exc, busy, busy_timeout) from exc
    finally:
        if lease is not None:
            lease.release()


async def adurable_invoke(
    graph: Pregel[Any, Any, Any, Any],
    input: Any,
    config: RunnableConfig,
    *,
    run_id: str | None = None,
    busy: str | None = _DEFAULT_BUSY,
    lease_ttl: float = _DEFAULT_TTL,
    busy_timeout: float | None = _DEFAULT_TIMEOUT,
    unfinished_timeout: float | None = None,
    concurrency: pk.Concurrency | tuple[str, str, int] | None = None,
    stream: str | None = None,
    **kwargs: Any,
) -> Any:
    """The ``graph.ainvoke`` twin of :func:`durable_invoke` (``stream=``: ``graph.astream``)."""
    kwargs.setdefault("durability", "sync")
    turn = _Turn(graph, config, run_id, busy, lease_ttl, busy_timeout, unfinished_timeout, concurrency)
    _check_stream(turn, stream)
    lease = turn.lease
    try:
        if lease is not None:
            await lease.aacquire()
    except pk.ThreadBusyError as exc:
        raise turn.busy(exc, busy, busy_timeout) from exc
    try:
        while True:
            with lease.fenced() if lease is not None else nullcontext():
                state = await graph.aget_state(turn.config)
                step = _decide(state, input, run_id, turn.config)
                if step.kind == "lookup":
                    earlier = await turn.aearlier(graph)
                    if earlier is not None:
                        return turn.result(graph, await graph.aget_state(earlier), state)
                    step = _Step("run", input, run_id)
                if step.kind == "done":
                    assert step.state is not None
                    return _output(graph, step.state)
                if step.kind == "run" and lease is not None:
                    await lease.atake_slot()
                if step.kind == "run" and stream is not None:
                    assert turn.saver is not None
                    source = Source(graph, step.input, _with_run(turn.config, step.run_id), kwargs, stream)
                    await astream_turn(turn.saver.store, turn.thread_id, turn.ns, step.run_id, source)
                    return _output(graph, await graph.aget_state(turn.config))
                if step.kind == "run":
                    return await graph.ainvoke(step.input, _with_run(turn.config, step.run_id), **kwargs)
            if lease is None or not lease.held:
                raise turn.no_lease(step.run_id)
            try:
                await lease.await_for(turn.crashed(step.run_id), _HOW)
            except pk.ThreadBusyError as exc:
                raise turn.busy(exc, busy, busy_timeout) from exc
    finally:
        if lease is not None:
            await lease.arelease()
