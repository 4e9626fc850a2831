"""Durable crews: ``durable_kickoff`` / ``adurable_kickoff`` run ``crew.kickoff`` as one
durable persistkit run (one turn) of a thread, each task a step, under the thread's lease."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

from crewai import Crew, CrewOutput, Task
from crewai.tasks.task_output import TaskOutput

import persistkit as pk

from ._stream import emit_task_output, streaming
from ._tools import recorded_tools

# -- crews ---------------------------------------------------------------------------------


def _revive(task: Task, data: dict[str, Any]) -> TaskOutput:
    output = TaskOutput.model_validate(data)
    if task.output_pydantic is not None and isinstance(output.pydantic, dict):
        output.pydantic = task.output_pydantic.model_validate(output.pydantic)
    return output


def _recorded_calls(agent: Any, task: Task, tools: Any) -> Any:
    """Tool calls and model calls of the task's agent as steps nested under the task's step."""
    owner = agent or task.agent
    return recorded_tools(tools, task.tools, getattr(owner, "tools", None), llm=getattr(owner, "llm", None))


def _step_name(task: Task, index: int) -> str:
    return f"crewai.task[{index}]" + (f" {task.name}" if task.name else "")


def _sync_step(task: Task, index: int) -> Callable[..., TaskOutput]:
    original = task.execute_sync
    name = _step_name(task, index)

    def execute_sync(agent: Any = None, context: str | None = None, tools: Any = None) -> TaskOutput:
        live: list[TaskOutput] = []

        @pk.checkpointed(name=name)
        def run_task(description: str, context: str | None) -> dict[str, Any]:
            with _recorded_calls(agent, task, tools):
                live.append(original(agent=agent, context=context, tools=tools))
            emit_task_output(task.name or name, live[0].raw)  # inside the step: final once it commits
            return live[0].model_dump(mode="json")

        data = run_task(task.description, context)
        if live:
            return live[0]
        task.output = _revive(task, data)  # later tasks read context from task.output
        return task.output

    return execute_sync


def _async_step(task: Task, index: int) -> Callable[..., Coroutine[Any, Any, TaskOutput]]:
    original = task.aexecute_sync
    name = _step_name(task, index)

    async def aexecute_sync(agent: Any = None, context: str | None = None, tools: Any = None) -> TaskOutput:
        live: list[TaskOutput] = []

        @pk.checkpointed(name=name)
        async def run_task(description: str, context: str | None) -> dict[str, Any]:
            with _recorded_calls(agent, task, tools):
                live.append(await original(agent=agent, context=context, tools=tools))
            emit_task_output(task.name or name, live[0].raw)
            return live[0].model_dump(mode="json")

        data = await run_task(task.description, context)
        if live:
            return live[0]
        task.output = _revive(task, data)
        return task.output

    return aexecute_sync


@contextmanager
def _durable_tasks(crew: Crew) -> Iterator[None]:
    if crew.stream:
        raise pk.ConfigurationError("durable_kickoff does not support streaming crews (stream=True)")
    concurrent = [t.name or t.description[:40] for t in crew.tasks if t.async_execution]
    if concurrent:
        raise pk.ConfigurationError(
            f"durable_kickoff does not support tasks with async_execution=True ({concurrent}): "
            "their start order is not deterministic, so replay could not match them to their records"
        )
    for index, task in enumerate(crew.tasks):
        # Instance attributes shadow the methods for this kickoff only.
        object.__setattr__(task, "execute_sync", _sync_step(task, index))
        object.__setattr__(task, "aexecute_sync", _async_step(task, index))
    try:
        yield
    finally:
        for task in crew.tasks:
            task.__dict__.pop("execute_sync", None)
            task.__dict__.pop("aexecute_sync", None)


def durable_kickoff(
    crew: Crew,
    inputs: dict[str, Any] | None = None,
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
) -> CrewOutput:
    """``crew.kickoff(inputs)`` as a durable run of ``thread_id``: each task is a step.

    A run that died (or raised) continues: tasks whose output was recorded
    return it without running (their agents, tools, callbacks and guardrails
    do not run again); the task in flight at the crash runs again, but its
    tool calls that returned replay their recorded results (each tool call is
    a step).

    ``run_id`` is the turn's identity: pass the id of the message or event the
    kickoff answers. A redelivered kickoff whose run finished returns its recorded
    output without running a task; one whose worker died continues. ``busy``,
    ``lease_ttl``, ``busy_timeout`` and ``unfinished_timeout`` are ``pk.resume``'s: the
    kickoff holds the thread's lease, so kickoffs of one thread run one at a time, in
    arrival order (``"queue"``, the default), across processes (docs/coordination.md).
    ``unfinished_timeout`` (seconds) bounds the wait for another kickoff's unfinished run:
    past it this one raises ``pk.ThreadBusyError`` with ``retry_after``, so that a job
    queue's worker is free for that run's redelivery (retry after ``err.retry_after``).
    ``concurrency=(name, key, limit)`` is ``pk.resume``'s too: at most ``limit`` kickoffs of
    that key (a tenant, say) run at once across processes (docs/flow-control.md).

    ``stream="answer"``: the agents' steps (tool choices, tool outputs, final answers; their
    ``step_callback``) and each task's output go into the thread's persistkit stream
    ``"answer"``, emitted inside the task's step (docs/adapters-crewai.md, Streaming).
    """
    if stream is not None:
        pk.check_stream_name(stream)
    turn = pk.resume(
        thread_id, store=store, run_id=run_id, busy=busy, lease_ttl=lease_ttl, busy_timeout=busy_timeout,
        unfinished_timeout=unfinished_timeout, concurrency=concurrency,
    )
    with _durable_tasks(crew), streaming(crew, stream), turn:
        result = crew.kickoff(inputs=inputs)
    if not isinstance(result, CrewOutput):  # streaming is refused above
        raise TypeError(f"crew.kickoff returned {type(result).__name__}, expected CrewOutput")
    return result


async def adurable_kickoff(
    crew: Crew,
    inputs: dict[str, Any] | None = None,
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
) -> CrewOutput:
    """The ``crew.akickoff`` twin of :func:`durable_kickoff` (same turn identity, busy policy,
    ``concurrency`` and ``stream``)."""
    if stream is not None:
        pk.check_stream_name(stream)
    turn = pk.resume(
        thread_id, store=store, run_id=run_id, busy=busy, lease_ttl=lease_ttl, busy_timeout=busy_timeout,
        unfinished_timeout=unfinished_timeout, concurrency=concurrency,
    )
    with _durable_tasks(crew), streaming(crew, stream):
        async with turn:
            result = await crew.akickoff(inputs=inputs)
    if not isinstance(result, CrewOutput):
        raise TypeError(f"crew.akickoff returned {type(result).__name__}, expected CrewOutput")
    return result
