"""A durable crew's steps into a persistkit stream: ``durable_kickoff(..., stream="answer")``.

For the kickoff, each agent's ``step_callback`` (its own, else the crew's) is wrapped by one
that first emits the step with ``pk.emit``; CrewAI calls it inside the task's execution,
which is the task's persistkit step, so the stream's rewind rule applies (a task that dies
has its steps taken back; a recorded task replays without emitting). When a task's step
ends, its output is emitted too. The shapes (docs/adapters-crewai.md, Streaming):

* ``{"type": "tool_output", "agent", "output"}``: a tool the agent called returned;
* ``{"type": "action", "agent", "thought", "tool", "tool_input"}``: the step that called it
  (CrewAI hands a step to its step callbacks after the tool ran, its ``ToolResult`` first);
* ``{"type": "finish", "agent", "thought", "output"}``: the agent's final answer, where CrewAI
  hands it to step callbacks (native function calling; its ReAct text loop does not);
* ``{"type": "task_output", "task", "output"}``: a task finished (its raw output).

Texts are cut at ``TEXT_LIMIT`` characters (events stay small).
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from crewai import Crew
from crewai.agents.parser import AgentAction, AgentFinish
from crewai.tools.tool_types import ToolResult

import persistkit as pk

#: the stream of the kickoff in progress (None: it does not stream)
STREAM: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "persistkit_crewai_stream", default=None
)
TEXT_LIMIT = 2000


def _text(value: Any) -> str:
    return (value if isinstance(value, str) else str(value))[:TEXT_LIMIT]


def shape(step: Any, agent: str) -> dict[str, Any] | None:
    """The stream event for what CrewAI hands a step callback, or None (not forwarded)."""
    if isinstance(step, AgentAction):  # handed over after its tool's ToolResult
        return {
            "type": "action",
            "agent": agent,
            "thought": _text(step.thought),
            "tool": step.tool,
            "tool_input": _text(step.tool_input),
        }
    if isinstance(step, ToolResult):
        return {"type": "tool_output", "agent": agent, "output": _text(step.result)}
    if isinstance(step, AgentFinish):
        return {
            "type": "finish",
            "agent": agent,
            "thought": _text(step.thought),
            "output": _text(step.output),
        }
    return None


def emit_task_output(task: str, raw: Any) -> None:
    """Emit a task's output (inside its step) when the kickoff streams."""
    stream = STREAM.get()
    if stream is not None and pk.current_run() is not None:
        pk.emit({"type": "task_output", "task": task, "output": _text(raw)}, stream=stream)


def _emitting(stream: str, agent: str, user: Callable[..., Any] | None) -> Callable[..., Any]:
    def step_callback(step: Any) -> Any:
        out = shape(step, agent) if pk.current_run() is not None else None
        if out is not None:
            pk.emit(out, stream=stream)
        return user(step) if user is not None else None

    step_callback._pk_stream = stream  # type: ignore[attr-defined]
    return functools.wraps(user)(step_callback) if user is not None else step_callback


@contextmanager
def streaming(crew: Crew, stream: str | None) -> Iterator[None]:
    """For one kickoff: every agent of ``crew`` emits its steps into ``stream`` (its own
    step callback, or the crew's, still called after)."""
    if stream is None:
        yield
        return
    # BaseAgent declares no step_callback (CrewAI's Agent does; crews set it on every agent)
    agents: dict[int, Any] = {
        id(a): a for a in [*crew.agents, *(t.agent for t in crew.tasks if t.agent is not None)]
    }
    saved = [(a, getattr(a, "step_callback", None)) for a in agents.values()]
    token = STREAM.set(stream)
    try:
        for agent, own in saved:
            user = own if own is not None else crew.step_callback
            agent.step_callback = _emitting(stream, str(agent.role), user)
        yield
    finally:
        for agent, own in saved:
            agent.step_callback = own
        STREAM.reset(token)
