"""Tool calls and model calls inside a durable CrewAI task as persistkit steps.

A task is a step, so a task that finished replays whole. The task in flight at
a crash runs again, and without this every tool it had already called would
run again too (an email sent twice). While a task's step runs, the code of
each CrewAI tool it can use (``func`` of a ``@tool`` function, ``_run`` /
``_arun`` of a ``BaseTool`` subclass: what every CrewAI execution path ends
in, the ReAct loop's structured tool and native function calling alike) is
shadowed by a step nested under the task's step: on the rerun, a call that
returned replays its result instead of running.

The agent's model calls (``call`` / ``acall`` of its LLM) are steps nested the
same way: the rerun task's model calls that answered before the crash replay
their answers (no second model call is paid for, and the rerun asks for the
same tools in the same order). An answer that is not JSON-like data (a pydantic
``response_model`` object, a provider's tool-call objects) is not recorded:
that call runs again on the rerun, as before.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from crewai.tools import BaseTool
from crewai.tools.base_tool import Tool

import persistkit as pk

log = logging.getLogger("persistkit_crewai")

_MARK = "_pk_recorded"
_lock = threading.Lock()  # installs and removals of the shadowing methods


def _digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    text = json.dumps([list(args), kwargs], sort_keys=True, default=repr, ensure_ascii=False)
    return hashlib.blake2b(pk.secrets.scrub(text).encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def _replayed(tool: str, recorded: dict[str, Any], digest: str) -> Any:
    if recorded["args"] != digest:
        # The model calls of the task in flight ran again and asked for this tool with other
        # arguments. The tool ran already at this position: running it again is what the record
        # prevents, so the agent gets what the call returned (and the log says so).
        log.warning(
            "persistkit_crewai: tool %r at a recorded position was called with other arguments than "
            "the call that ran before the crash (the task's model calls ran again); its recorded "
            "result is returned, the tool is not run again",
            tool,
        )
    return recorded["result"]


def _recorded(tool: BaseTool, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (the tool's own code) as a step nested under the running task's step."""
    name = f"crewai.tool:{tool.name}"
    if inspect.iscoroutinefunction(fn):

        # check_args=False: _replayed compares the arguments and warns instead of stranding
        # the run (the model calls of an unfinished task are not replayed).
        @pk.checkpointed(name=name, check_args=False)
        async def astep(digest: str, call: _Thunk) -> dict[str, Any]:
            return {"args": digest, "result": await call()}

        @functools.wraps(fn)
        async def arecorded(*args: Any, **kwargs: Any) -> Any:
            if pk.current_step() is None:  # outside a durable task: the plain tool
                return await fn(*args, **kwargs)
            digest = _digest(args, kwargs)
            return _replayed(tool.name, await astep(digest, _Thunk(lambda: fn(*args, **kwargs))), digest)

        return arecorded

    @pk.checkpointed(name=name, check_args=False)
    def step(digest: str, call: _Thunk) -> dict[str, Any]:
        return {"args": digest, "result": call()}

    @functools.wraps(fn)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        if pk.current_step() is None:
            return fn(*args, **kwargs)
        digest = _digest(args, kwargs)
        return _replayed(tool.name, step(digest, _Thunk(lambda: fn(*args, **kwargs))), digest)

    return recorded


def _shadow(tool: BaseTool) -> Callable[[], None] | None:
    """Make ``tool``'s own code a recorded step; returns the undo, or None."""
    with _lock:
        if tool.__dict__.get(_MARK):
            return None  # another durable kickoff running now already shadows it
        # A @tool function (crewai's Tool) runs self.func from run() and _run() alike, so
        # func is shadowed (shadowing _run too would nest a step in a step); a BaseTool
        # subclass runs _run / _arun from every path.
        attrs = ("func",) if isinstance(tool, Tool) else ("_run", "_arun")
        before = {attr: tool.__dict__[attr] for attr in attrs if attr in tool.__dict__}
        for attr in attrs:
            # Instance attributes win over the class's methods (as for the tasks' execute_sync).
            object.__setattr__(tool, attr, _recorded(tool, getattr(tool, attr)))
        object.__setattr__(tool, _MARK, True)

    def undo() -> None:
        with _lock:
            tool.__dict__.pop(_MARK, None)
            for attr in attrs:
                if attr in before:
                    object.__setattr__(tool, attr, before[attr])
                else:
                    tool.__dict__.pop(attr, None)

    return undo


class _Thunk:
    """A deferred call handed to a step; it is not part of the step's arguments."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn

    def __call__(self) -> Any:
        return self.fn()


def _plain(value: Any) -> bool:
    """Whether ``value`` is JSON-like data, stored and replayed as it is."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


_AGAIN = object()  # a recorded model call whose answer could not be stored: call the model again


def _model_answer(name: str, recorded: dict[str, Any], digest: str, live: list[Any]) -> Any:
    if live:  # the call ran now
        return live[0]
    if recorded.get("unrecorded"):
        return _AGAIN
    if recorded["args"] != digest:
        log.warning(
            "persistkit_crewai: model call %r at a recorded position was asked other messages than the "
            "call that answered before the crash; its recorded answer is returned, the model is not "
            "called again",
            name,
        )
    return recorded["answer"]


def _record(digest: str, answer: Any) -> dict[str, Any]:
    if _plain(answer):
        return {"args": digest, "answer": answer}
    return {"args": digest, "unrecorded": True}


def _messages(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return _digest(args[:1], {"messages": kwargs["messages"]} if "messages" in kwargs else {})


def _recorded_model(llm: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (the LLM's ``call`` or ``acall``) as a step nested under the running task's step."""
    name = f"crewai.llm:{getattr(llm, 'model', '') or type(llm).__name__}"
    if inspect.iscoroutinefunction(fn):

        @pk.checkpointed(name=name, check_args=False)
        async def astep(digest: str, call: _Thunk) -> dict[str, Any]:
            return _record(digest, await call())

        @functools.wraps(fn)
        async def arecorded(*args: Any, **kwargs: Any) -> Any:
            if pk.current_step() is None:
                return await fn(*args, **kwargs)
            live: list[Any] = []

            async def call() -> Any:
                live.append(await fn(*args, **kwargs))
                return live[0]

            digest = _messages(args, kwargs)
            found = _model_answer(name, await astep(digest, _Thunk(call)), digest, live)
            return await fn(*args, **kwargs) if found is _AGAIN else found

        return arecorded

    @pk.checkpointed(name=name, check_args=False)
    def step(digest: str, call: _Thunk) -> dict[str, Any]:
        return _record(digest, call())

    @functools.wraps(fn)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        if pk.current_step() is None:
            return fn(*args, **kwargs)
        live: list[Any] = []

        def call() -> Any:
            live.append(fn(*args, **kwargs))
            return live[0]

        digest = _messages(args, kwargs)
        found = _model_answer(name, step(digest, _Thunk(call)), digest, live)
        return fn(*args, **kwargs) if found is _AGAIN else found

    return recorded


def _shadow_model(llm: Any) -> Callable[[], None] | None:
    """Make ``llm``'s ``call`` and ``acall`` recorded steps; returns the undo, or None."""
    attrs = [attr for attr in ("call", "acall") if callable(getattr(llm, attr, None))]
    if not attrs:
        return None
    with _lock:
        if llm.__dict__.get(_MARK):
            return None  # another durable kickoff running now already shadows it
        before = {attr: llm.__dict__[attr] for attr in attrs if attr in llm.__dict__}
        for attr in attrs:
            object.__setattr__(llm, attr, _recorded_model(llm, getattr(llm, attr)))
        object.__setattr__(llm, _MARK, True)

    def undo() -> None:
        with _lock:
            llm.__dict__.pop(_MARK, None)
            for attr in attrs:
                if attr in before:
                    object.__setattr__(llm, attr, before[attr])
                else:
                    llm.__dict__.pop(attr, None)

    return undo


@contextmanager
def recorded_tools(*groups: Iterable[Any] | None, llm: Any = None) -> Iterator[None]:
    """While the block runs, calls of the ``BaseTool``s in ``groups`` and of ``llm`` are steps."""
    undo: list[Callable[[], None]] = []
    seen: set[int] = set()
    try:
        if llm is not None and hasattr(llm, "__dict__") and (u := _shadow_model(llm)) is not None:
            undo.append(u)
        for group in groups:
            for tool in group or ():
                if isinstance(tool, BaseTool) and id(tool) not in seen:
                    seen.add(id(tool))
                    if (u := _shadow(tool)) is not None:
                        undo.append(u)
        yield
    finally:
        for u in undo:
            u()
