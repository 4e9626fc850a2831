"""A durable model turn that streams: ``durable_run(..., stream="answer")``.

The turn's step calls the model's ``stream_response`` (what ``Runner.run_streamed`` calls)
instead of ``get_response``, forwards its events into the persistkit stream with ``pk.emit``
from inside the step (so the stream's rewind rule applies: a turn that dies has its events
taken back, a recorded turn's events are never emitted again) and records the response the
stream completed with, as ``get_response`` would have returned it. The shapes
(docs/adapters-openai-agents.md, Streaming):

* ``{"type": "text", "delta": str}``: a piece of the answer (``response.output_text.delta``);
* ``{"type": "reasoning", "delta": str}``: a piece of a reasoning summary;
* ``{"type": "tool_call", "name", "call_id", "arguments"}``: the model asked for a function
  tool (``response.output_item.done`` of a ``function_call``);
* ``{"type": "tool_output", "name", "call_id", "output"}``: a function tool returned (emitted
  by its step; ``output`` as text, cut at ``OUTPUT_LIMIT`` characters).
"""

from __future__ import annotations

import contextvars
from typing import Any

from agents import Model, ModelResponse, Usage
from agents.exceptions import ModelBehaviorError

import persistkit as pk

#: the persistkit stream a durable run forwards its model's events to (None: it does not stream)
STREAM: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "persistkit_openai_agents_stream", default=None
)
#: a tool's output is forwarded as text of at most this many characters (events stay small)
OUTPUT_LIMIT = 2000


def shape(event: Any) -> dict[str, Any] | None:
    """The stream event for one of the SDK's raw response events, or None (not forwarded)."""
    kind = getattr(event, "type", None)
    if kind == "response.output_text.delta":
        return {"type": "text", "delta": str(event.delta)}
    if kind == "response.reasoning_summary_text.delta":
        return {"type": "reasoning", "delta": str(event.delta)}
    if kind == "response.output_item.done":
        item = event.item
        if getattr(item, "type", None) == "function_call":
            return {
                "type": "tool_call",
                "name": item.name,
                "call_id": item.call_id,
                "arguments": item.arguments,
            }
    return None


def tool_output(name: str, call_id: str, output: Any) -> None:
    """Emit a tool's output (inside the tool's step) when the run streams."""
    stream = STREAM.get()
    if stream is None or pk.current_run() is None:
        return
    text = output if isinstance(output, str) else repr(output)
    pk.emit(
        {"type": "tool_output", "name": name, "call_id": call_id, "output": text[:OUTPUT_LIMIT]},
        stream=stream,
    )


def _usage(usage: Any) -> Usage:
    if usage is None:
        return Usage(requests=1)
    return Usage(
        requests=1,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        total_tokens=usage.total_tokens,
        input_tokens_details=usage.input_tokens_details,
        output_tokens_details=usage.output_tokens_details,
    )


async def streamed_response(
    model: Model, stream: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> ModelResponse:
    """``model.get_response(*args, **kwargs)`` made by streaming: each event is forwarded to
    ``stream`` as it arrives; the response is the one the stream completed with."""
    done: list[Any] = []
    final = None
    async for raw in model.stream_response(*args, **kwargs):
        event: Any = raw  # the Responses API's union of ~50 event classes: told apart by `type`
        out = shape(event)
        if out is not None:
            pk.emit(out, stream=stream)
        kind = getattr(event, "type", None)
        if kind == "response.output_item.done":
            done.append(event.item)
        elif kind == "response.completed":
            final = event.response
        elif kind in ("response.failed", "response.incomplete", "error"):
            raise ModelBehaviorError(
                f"the model's stream ended with {kind!r}: {getattr(event, 'response', event)!r:.300}"
            )
    if final is None:
        raise ModelBehaviorError("the model's stream ended without a response.completed event")
    return ModelResponse(
        output=list(final.output)
        or done,  # some backends leave the completed response's output empty
        usage=_usage(final.usage),
        response_id=final.id,
        request_id=getattr(final, "_request_id", None),
    )
