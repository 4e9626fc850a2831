"""``durable_run``: ``Runner.run`` as one durable persistkit run (one turn) of a thread,
under the thread's lease; and :func:`load_run_state` for runs stopped for approval."""

from __future__ import annotations

from typing import Any

from agents import Agent, RunConfig, Runner, RunResult, RunState, TResponseInputItem
from agents.exceptions import AgentsException
from agents.memory import Session

import persistkit as pk

from ._digest import _CHECK_INPUT
from ._durable import _durable_config, _Thunk, durable
from ._session import PersistkitSession, _session_settings
from ._stream import STREAM

#: State channel of a durable run's thread holding the RunState of a run awaiting approval.
RUN_STATE_CHANNEL = "openai_agents_run_state"




@pk.checkpointed(name="openai-agents.session.read", check_args=False)
async def _session_read(total: int, limit: int | None) -> list[int]:
    return [max(0, total - limit) if limit is not None else 0, total]


@pk.checkpointed(name="openai-agents.session.read-items", check_args=False)
async def _session_read_items(call: _Thunk) -> Any:
    return await call.fn()


@pk.checkpointed(name="openai-agents.session.write", check_args=False)
async def _session_write(call: _Thunk) -> Any:
    return await call.fn()


class _StepSession:
    """A session whose reads and writes are steps of the durable run: on replay a read
    returns the same slice of the conversation, a recorded write is not repeated."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.session_id = session.session_id
        self.session_settings = getattr(session, "session_settings", None)

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        settings = self.session_settings
        if limit is None and settings is not None:
            limit = _session_settings(settings).limit
        if isinstance(self.session, PersistkitSession):
            items = await self.session._all_items()  # all items: the window is taken here
            # Record the window, not the items: O(1) per read, whatever the history's size.
            # On replay the conversation has only grown (its writes are steps too).
            start, end = await _session_read(len(items), limit)
            return items[start:end]
        # Another session may apply its own settings' limit even when called without one,
        # so its "all items" cannot be trusted: record the items it returned.
        read: list[TResponseInputItem] = await _session_read_items(
            _Thunk(lambda: self.session.get_items(limit))
        )
        return read

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        await _session_write(_Thunk(lambda: self.session.add_items(items)))

    async def pop_item(self) -> TResponseInputItem | None:
        popped: TResponseInputItem | None = await _session_write(_Thunk(self.session.pop_item))
        return popped

    async def clear_session(self) -> None:
        await _session_write(_Thunk(self.session.clear_session))


async def durable_run(
    agent: Agent[Any],
    input: str | list[TResponseInputItem] | RunState[Any],
    *,
    thread_id: str,
    store: pk.Store | None = None,
    run_id: str | None = None,
    busy: str | None = pk.ThreadLease.DEFAULT_BUSY,
    lease_ttl: float = pk.ThreadLease.DEFAULT_TTL,
    busy_timeout: float | None = pk.ThreadLease.DEFAULT_BUSY_TIMEOUT,
    unfinished_timeout: float | None = None,
    concurrency: pk.Concurrency | tuple[str, str, int] | None = None,
    run_config: RunConfig | None = None,
    check_input: bool = True,
    stream: str | None = None,
    **kwargs: Any,
) -> RunResult:
    """``Runner.run`` as a durable persistkit run (one turn) of ``thread_id``.

    ``run_id`` is the turn's identity: pass the id of the message or event the
    turn answers. A redelivered turn that finished returns its recorded result
    without calling the model or a tool; one whose worker died continues from
    its last finished model turn or tool call. ``busy``, ``lease_ttl``,
    ``busy_timeout`` and ``unfinished_timeout`` are ``pk.resume``'s: the turn holds the
    thread's lease, so turns of one thread run one at a time, in arrival order
    (``"queue"``, the default), across processes (docs/coordination.md).
    ``unfinished_timeout`` (seconds) bounds the wait for another turn's unfinished run:
    past it this turn raises ``pk.ThreadBusyError`` with ``retry_after``, so that a job
    queue's worker is free for that run's redelivery (retry after ``err.retry_after``).
    ``concurrency=(name, key, limit)`` is ``pk.resume``'s too: at most ``limit`` turns of that
    key (a tenant, say) run at once across processes (docs/flow-control.md).

    Each model turn and function-tool call is a step. If the process dies, call
    ``durable_run`` again with the same agent and input: finished turns and tool
    calls replay from the store, the first unfinished one runs for real. A
    ``session=`` is read and written through steps too (a replayed read returns
    the same items, a recorded write is not repeated). If the
    run stops for tool approval, its ``RunState`` is stored on the thread (see
    :func:`load_run_state`). Other keyword arguments go to ``Runner.run``.

    A model turn recorded for another input than the one it is called with now
    (the input changed, or an item before it: a tool that is not a step returned
    something else) raises ``NonDeterminismError``; ``check_input=False`` replays
    the recorded turns anyway.

    ``stream="answer"`` streams each model turn (the model's ``stream_response``, as
    ``Runner.run_streamed`` does) and forwards its text deltas, tool calls and tool
    outputs into the thread's persistkit stream ``"answer"`` as they arrive
    (``store.read_stream``, ``pk.sse``; shapes in docs/adapters-openai-agents.md). A turn
    that dies mid-answer is rewound in the stream and its retry's events follow; a
    recorded turn's events are never sent again.
    """
    if stream is not None:
        pk.check_stream_name(stream)
    agent = durable(agent)
    config = _durable_config(run_config)
    if kwargs.get("session") is not None:
        kwargs["session"] = _StepSession(kwargs["session"])
    token = _CHECK_INPUT.set(check_input)
    streaming = STREAM.set(stream)
    try:
        async with pk.resume(
            thread_id, store=store, run_id=run_id, busy=busy, lease_ttl=lease_ttl, busy_timeout=busy_timeout,
            unfinished_timeout=unfinished_timeout, concurrency=concurrency,
        ) as run:
            try:
                result = await Runner.run(agent, input, run_config=config, **kwargs)
            except AgentsException as exc:  # the SDK wraps a tool's error in its UserError
                cause = _persistkit_cause(exc)
                if cause is None:
                    raise
                raise cause from exc
            pending = result.to_state().to_json() if result.interruptions else None
            if run.state.get(RUN_STATE_CHANNEL) != pending:
                run.state[RUN_STATE_CHANNEL] = pending  # committed with the run's end record
    finally:
        _CHECK_INPUT.reset(token)
        STREAM.reset(streaming)
    return result


def _persistkit_cause(exc: AgentsException) -> pk.PersistkitError | None:
    """The persistkit error inside the SDK's wrapper of a tool's error, raised as itself; or None.

    The SDK wraps whatever a tool raises in its ``UserError``; a durable tool's step
    raises persistkit's own errors, which callers catch by class: a tool refused before
    it ran (``pk.SecretResolutionError``, as the docs promise), a turn that lost its
    lease or its store (``pk.RetryableError``: a queue retries on it), a run the
    thread moved past (``pk.ConflictError``)."""
    cause: BaseException | None = exc.__cause__
    for _ in range(4):  # a short chain: the SDK wraps once or twice
        if cause is None:
            return None
        if isinstance(cause, pk.PersistkitError):
            return cause
        cause = cause.__cause__
    return None


async def load_run_state(
    agent: Agent[Any], *, thread_id: str, store: pk.Store, **kwargs: Any
) -> RunState[Any] | None:
    """The ``RunState`` of the thread's run that is waiting for tool approval, or None.

    Approve or reject its ``get_interruptions()`` and pass it to :func:`durable_run`
    with the same ``thread_id``. Keyword arguments go to ``RunState.from_json``
    (``context_override``, ``context_deserializer``).
    """
    try:
        state = await store.aget_state(thread_id)
    except pk.NotFoundError:
        return None
    data = state.get(RUN_STATE_CHANNEL)
    if data is None:
        return None
    # The run goes on from it: handles resolved where something knows them; the rest are
    # refused by the durable model turn or tool call they would reach, before it runs.
    data = pk.secrets.live(data, partial=True)
    return await RunState.from_json(durable(agent), data, **kwargs)
