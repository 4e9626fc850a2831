"""Conversation memory on the thread: a turn's messages stored with Pydantic AI's own
serialization (``ModelMessagesTypeAdapter``), appended to a list channel; :func:`durable_run`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic_ai.agent import AbstractAgent
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pydantic_ai.run import AgentRunResult

import persistkit as pk

from ._stream import STREAM

#: State channel holding the thread's messages (JSON of ``ModelMessagesTypeAdapter``), oldest first.
MESSAGES_CHANNEL = "pydantic_ai_messages"


def _channel(run: pk.Run) -> Any:
    state = run.state
    if isinstance(state, dict):
        return state.get(MESSAGES_CHANNEL)
    return getattr(state, MESSAGES_CHANNEL, None)


def load_history(run: pk.Run | None = None) -> list[ModelMessage]:
    """The thread's message history as of the start of ``run`` (default: the current run), to
    pass as ``message_history=``. Secret handles are resolved where something knows them; the
    rest stay handle text, which the durable model request refuses before it runs."""
    run = run or pk.current_run()
    if run is None:
        raise pk.ConfigurationError(
            "load_history() needs a run: call it inside `with pk.resume(thread_id)`"
        )
    items = _channel(run)
    if not items:
        return []
    return ModelMessagesTypeAdapter.validate_python(pk.secrets.live(list(items), partial=True))


def save_messages(messages: Sequence[ModelMessage], run: pk.Run | None = None) -> None:
    """Append a turn's new messages (``result.new_messages()``) to the thread's history; stored
    with the run's next checkpoint as an append (only the new messages are written)."""
    run = run or pk.current_run()
    if run is None:
        raise pk.ConfigurationError(
            "save_messages() needs a run: call it inside `with pk.resume(thread_id)`"
        )
    if not messages:
        return
    items = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    state = run.state
    if isinstance(state, dict):
        current = state.get(MESSAGES_CHANNEL)
        if current is None:
            state[MESSAGES_CHANNEL] = items
        else:
            current.extend(items)
        return
    if not hasattr(state, MESSAGES_CHANNEL):
        raise pk.ConfigurationError(
            f"the run's state {type(state).__name__} has no field {MESSAGES_CHANNEL!r}: declare "
            f"`{MESSAGES_CHANNEL}: Annotated[list[Any], pk.append] = []` or use dict state"
        )
    getattr(state, MESSAGES_CHANNEL).extend(items)


async def durable_run(
    agent: AbstractAgent[Any, Any],
    user_prompt: Any = None,
    *,
    thread_id: str,
    store: pk.Store | None = None,
    run_id: str | None = None,
    busy: str | None = pk.ThreadLease.DEFAULT_BUSY,
    lease_ttl: float = pk.ThreadLease.DEFAULT_TTL,
    busy_timeout: float | None = pk.ThreadLease.DEFAULT_BUSY_TIMEOUT,
    unfinished_timeout: float | None = None,
    concurrency: pk.Concurrency | tuple[str, str, int] | None = None,
    stream: str | None = None,
    **kwargs: Any,
) -> AgentRunResult[Any] | None:
    """``agent.run`` as one durable turn of ``thread_id``, with the thread's conversation.

    The turn runs in ``pk.resume(thread_id, run_id=run_id, busy=...)`` (the thread's lease:
    turns of one thread run one at a time, in arrival order). The thread's history is
    loaded and passed as ``message_history``; the turn's new messages are appended to it.
    ``run_id`` is the turn's identity (the id of the message it answers): a redelivered
    turn that finished replays without calling the model or a tool, one whose worker
    died goes on from its last finished step. ``busy``, ``lease_ttl``, ``busy_timeout`` and
    ``unfinished_timeout`` are ``pk.resume``'s (past ``unfinished_timeout`` seconds waiting for
    another turn's unfinished run, this turn raises ``pk.ThreadBusyError`` with
    ``retry_after``: a job queue's worker goes back to the pool); so is ``concurrency=(name,
    key, limit)``: at most ``limit`` turns of that key (a tenant, say) run at once across
    processes (docs/flow-control.md). The agent needs
    :class:`PersistkitDurability` among its capabilities.

    Returns the run's result, or **None** when the turn suspended on a deferred tool call
    (approval required, or a result supplied from outside): the agent run has not ended,
    so there is no result and no messages are saved yet. ``store.pending()`` lists the
    question (``pending_requests(question)`` gives the ``DeferredToolRequests``);
    ``store.answer(thread_id, {"approvals": {call_id: True}, "calls": {call_id: result}})``
    answering every pending call, then ``durable_run`` again with the same ``run_id`` and
    prompt goes on from the question. A wrong answer is refused by ``store.answer``
    (:class:`DeferredAnswerError`; the question stays open).
    ``stream="answer"``: the turn's events (text deltas, tool calls and results) go into
    the thread's persistkit stream ``"answer"`` (as ``PersistkitDurability(stream=)``; the
    model requests stream). Other keyword arguments go to ``agent.run``.
    """
    if stream is not None:
        pk.check_stream_name(stream)
    if kwargs.get("message_history") is not None:
        raise pk.ConfigurationError(
            "durable_run loads the thread's history itself: pass no message_history "
            "(or call agent.run inside pk.resume yourself)"
        )
    kwargs.pop("message_history", None)
    result: AgentRunResult[Any] | None = None
    streaming = STREAM.set(stream)
    try:
        async with pk.resume(
            thread_id,
            store=store,
            run_id=run_id,
            busy=busy,
            lease_ttl=lease_ttl,
            busy_timeout=busy_timeout,
            unfinished_timeout=unfinished_timeout,
            concurrency=concurrency,
        ) as run:
            history = load_history(run)
            result = await agent.run(user_prompt, message_history=history or None, **kwargs)
            save_messages(result.new_messages(), run)
    finally:
        STREAM.reset(streaming)
    return result
