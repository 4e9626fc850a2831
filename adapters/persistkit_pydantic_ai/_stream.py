"""A durable agent's events into a persistkit stream: ``PersistkitDurability(stream="answer")``
or ``durable_run(..., stream="answer")``.

Pydantic AI's durability base delivers a durable run's events to its event stream handler
from inside durable units: a model request's stream events inside that request's unit, and
each tool event inside a unit of its own. Both are persistkit steps here, so the handler
this module builds emits each event with ``pk.emit`` from inside the step that produced it
and the stream's rewind rule applies (a request that dies mid-answer is taken back, a
recorded one is never emitted again). The shapes (docs/adapters-pydantic-ai.md, Streaming):

* ``{"type": "text", "delta": str}``: a piece of the answer (a text part's start, or delta);
* ``{"type": "thinking", "delta": str}``: a piece of a thinking part;
* ``{"type": "tool_call", "name", "call_id", "args"}``: a function tool is about to run;
* ``{"type": "tool_output", "name", "call_id", "output"}``: it returned (as text, cut at
  ``OUTPUT_LIMIT`` characters).
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.messages import (
    AgentStreamEvent,
    FunctionToolCallEvent,
    FunctionToolResultEvent,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ThinkingPart,
    ThinkingPartDelta,
)
from pydantic_ai.tools import RunContext

import persistkit as pk

#: the stream ``durable_run(..., stream=)`` forwards to (over the capability's ``stream=``)
STREAM: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "persistkit_pydantic_ai_stream", default=None
)
#: a tool's output is forwarded as text of at most this many characters (events stay small)
OUTPUT_LIMIT = 2000


def shape(event: AgentStreamEvent) -> dict[str, Any] | None:
    """The stream event for one of Pydantic AI's events, or None (not forwarded)."""
    if isinstance(event, PartStartEvent):
        part = event.part
        if isinstance(part, TextPart) and part.content:
            return {"type": "text", "delta": part.content}
        if isinstance(part, ThinkingPart) and part.content:
            return {"type": "thinking", "delta": part.content}
    elif isinstance(event, PartDeltaEvent):
        delta = event.delta
        if isinstance(delta, TextPartDelta) and delta.content_delta:
            return {"type": "text", "delta": delta.content_delta}
        if isinstance(delta, ThinkingPartDelta) and delta.content_delta:
            return {"type": "thinking", "delta": delta.content_delta}
    elif isinstance(event, FunctionToolCallEvent):
        call = event.part
        args = (
            call.args
            if isinstance(call.args, str)
            else json.dumps(call.args, sort_keys=True, default=str)
        )
        return {
            "type": "tool_call",
            "name": call.tool_name,
            "call_id": call.tool_call_id,
            "args": args,
        }
    elif isinstance(event, FunctionToolResultEvent):
        result = event.part
        content = getattr(result, "content", None)
        text = content if isinstance(content, str) else json.dumps(content, default=str)
        return {
            "type": "tool_output",
            "name": result.tool_name,
            "call_id": result.tool_call_id,
            "output": text[:OUTPUT_LIMIT],
        }
    return None


def emitting(stream: str, user: EventStreamHandler[Any] | None) -> EventStreamHandler[Any]:
    """An event stream handler that emits each event into ``stream`` (inside a run), then
    hands it on to ``user``'s handler (if any)."""

    async def handler(ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
        async def forwarded() -> AsyncIterator[AgentStreamEvent]:
            async for event in events:
                out = shape(event) if pk.current_run() is not None else None
                if out is not None:
                    pk.emit(out, stream=stream)
                yield event

        if user is not None:
            await user(ctx, forwarded())
        else:
            async for _ in forwarded():
                pass

    return handler
