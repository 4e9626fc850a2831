"""A durable turn that streams: ``durable_invoke(..., stream="answer")``.

The turn runs ``graph.stream(..., stream_mode=["messages", "checkpoints"])`` instead of
``graph.invoke``, inside a persistkit run of its own (namespace ``lg:s:<checkpoint_ns>`` of
the LangGraph thread, the turn's ``run_id``; no lease: the turn holds the thread's). Each
**superstep** is one persistkit step, ``langgraph.superstep``: its body reads the graph's
stream up to the next ``checkpoints`` event, forwarding each ``messages`` chunk with
``pk.emit``, and returns that checkpoint's id. So the stream's rule applies superstep by
superstep: a superstep that dies (its process killed, or a node raised) has its events
taken back by a rewind and the rerun's events follow; a superstep whose step committed is
never emitted again (a resumed turn replays those steps without reading the graph, whose
own resume does not run their nodes again). A kill after LangGraph wrote a superstep's
checkpoint but before its step committed: the resumed graph starts from a checkpoint the
last recorded step does not name, and the first live step emits again what the dead attempt
left tentative (``_resend``), so the final view still holds that superstep once. The shapes (docs/adapters-langgraph.md,
Streaming):

* ``{"type": "text", "node", "delta"}``: a piece of a chat model's answer;
* ``{"type": "tool_call", "node", "name", "call_id", "args"}``: a tool call chunk (``args``
  is a piece of the JSON arguments; ``name`` and ``call_id`` come with the first piece);
* ``{"type": "tool_output", "node", "name", "call_id", "output"}``: a ``ToolMessage`` a node
  wrote (``ToolNode``'s), as text cut at ``OUTPUT_LIMIT`` characters.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessageChunk, BaseMessage, ToolMessage

import persistkit as pk

__all__ = ["NAMESPACE", "shape"]

#: the persistkit namespace (before the checkpoint namespace) of the runs that stream turns
NAMESPACE = "lg:s:"
OUTPUT_LIMIT = 2000
_MODES = ["messages", "checkpoints"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks
        return "".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in content)
    return ""


def shape(message: BaseMessage, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The stream events of one ``messages``-mode chunk (``(message, metadata)``)."""
    node = str(meta.get("langgraph_node", ""))
    if isinstance(message, ToolMessage):
        return [
            {
                "type": "tool_output",
                "node": node,
                "name": message.name,
                "call_id": message.tool_call_id,
                "output": _text(message.content)[:OUTPUT_LIMIT],
            }
        ]
    out: list[dict[str, Any]] = []
    text = _text(message.content)
    if text:
        out.append({"type": "text", "node": node, "delta": text})
    if isinstance(message, AIMessageChunk):
        for chunk in message.tool_call_chunks:
            out.append(
                {
                    "type": "tool_call",
                    "node": node,
                    "name": chunk.get("name"),
                    "call_id": chunk.get("id"),
                    "args": chunk.get("args") or "",
                }
            )
    else:  # a whole message a node returned (a model called without streaming)
        for call in getattr(message, "tool_calls", None) or ():
            import json

            out.append(
                {
                    "type": "tool_call",
                    "node": node,
                    "name": call["name"],
                    "call_id": call.get("id"),
                    "args": json.dumps(call.get("args") or {}, sort_keys=True, default=str),
                }
            )
    return out


@dataclass
class Source:
    """The graph's stream, started when a live superstep first reads it (a resumed turn's
    replayed supersteps never do)."""

    graph: Any
    input: Any
    config: Any
    kwargs: dict[str, Any]
    name: str
    _it: Iterator[Any] | None = field(default=None, repr=False)
    _ait: AsyncIterator[Any] | None = field(default=None, repr=False)
    read: bool = False  # an event of the graph's stream was read (by this process)

    def items(self) -> Iterator[Any]:
        if self._it is None:
            self._it = iter(
                self.graph.stream(self.input, self.config, stream_mode=_MODES, **self.kwargs)
            )
        return self._it

    def aitems(self) -> AsyncIterator[Any]:
        if self._ait is None:
            self._ait = aiter(
                self.graph.astream(self.input, self.config, stream_mode=_MODES, **self.kwargs)
            )
        return self._ait

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()

    async def aclose(self) -> None:
        close = getattr(self._ait, "aclose", None)
        if close is not None:
            await close()


@pk.checkpointed(name="langgraph.superstep", check_args=False)
def _superstep(source: Source, last: str | None) -> str | None:
    """Forward the graph's messages up to its next checkpoint; that checkpoint's id, or
    None when the graph's stream ended. ``last``: the checkpoint id the previous step
    recorded (a resumed graph that starts from another one wrote a checkpoint its step never
    committed: see :func:`_resend`)."""
    for mode, data in source.items():
        done = _forward(source, mode, data, last)
        if done is not None:
            return done
    return None


def _forward(source: Source, mode: str, data: Any, last: str | None) -> str | None:
    if mode == "messages":
        message, meta = data
        for event in shape(message, meta):
            pk.emit(event, stream=source.name)
        source.read = True
        return None
    if mode != "checkpoints":
        return None
    done = str(data["config"]["configurable"]["checkpoint_id"])
    if not source.read and last is not None and done != last:
        _resend(
            source.name
        )  # LangGraph wrote a checkpoint whose step the dead attempt never committed
    source.read = True
    return done


def _resend(name: str) -> None:
    """Emit again the events a dead attempt of this run left tentative: the graph resumed
    from a checkpoint it wrote after them, so their superstep will not run again (the
    stream rewinds them at this attempt's first write; these copies stand)."""
    run = pk.current_run()
    assert run is not None
    left: list[Any] = []
    for rec in run.store.read_stream(run.thread_id, name, namespace=run.namespace, follow=False):
        if rec.kind == "event" and rec.run_id == run.run_id:
            left.append(rec)
        elif rec.kind == "final" and rec.to is not None:
            left = [r for r in left if r.offset > rec.to]
        elif rec.kind == "rewind" and rec.to is not None:
            left = [r for r in left if r.offset <= rec.to]
        elif rec.kind == "end":
            left = []
    for rec in left:
        pk.emit(rec.data, stream=name)


@pk.checkpointed(name="langgraph.superstep", check_args=False)
async def _asuperstep(source: Source, last: str | None) -> str | None:
    """:func:`_superstep` of ``graph.astream`` (the same step: a turn may resume either way)."""
    async for mode, data in source.aitems():
        done = _forward(source, mode, data, last)
        if done is not None:
            return done
    return None


async def astream_turn(
    store: pk.Store, thread_id: str, ns: str, run_id: str | None, source: Source
) -> None:
    """:func:`stream_turn` of ``adurable_invoke``."""
    try:
        async with pk.resume(
            thread_id, store=store, namespace=NAMESPACE + ns, run_id=run_id, busy=None
        ):
            last = None
            while (done := await _asuperstep(source, last)) is not None:
                last = done
    finally:
        await source.aclose()


def stream_turn(
    store: pk.Store, thread_id: str, ns: str, run_id: str | None, source: Source
) -> None:
    """Run the graph's turn as a persistkit run whose steps are its supersteps."""
    try:
        with pk.resume(thread_id, store=store, namespace=NAMESPACE + ns, run_id=run_id, busy=None):
            last = None
            while (done := _superstep(source, last)) is not None:
                last = done
    finally:
        source.close()
