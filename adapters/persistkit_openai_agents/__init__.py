"""persistkit for the OpenAI Agents SDK (``pip install persistkit[openai-agents]``).

* :class:`PersistkitSession` — the SDK's ``Session`` over any persistkit store:
  ``Runner.run(agent, input, session=PersistkitSession("thread-1", store))``.
* :func:`durable_run` — ``Runner.run`` in which every model turn and every
  function-tool call is a persistkit step: a crashed run, run again with the
  same input, replays its finished turns and tool calls from the store.
* :func:`load_run_state` — a run that stopped for tool approval stored its
  ``RunState`` on the thread; a later process loads it, approves or rejects,
  and passes it back to :func:`durable_run`.

Built only on the public ``persistkit`` API.
"""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import functools
import hashlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    Model,
    ModelProvider,
    ModelResponse,
    RunConfig,
    Runner,
    RunResult,
    RunState,
    TResponseInputItem,
)
from agents.exceptions import AgentsException
from agents.items import TResponseOutputItem
from agents.memory import Session
from agents.usage import deserialize_usage, serialize_usage
from pydantic import TypeAdapter, ValidationError

import persistkit as pk

from ._session import (
    SESSION_NAMESPACE as SESSION_NAMESPACE,
)
from ._session import (
    PersistkitSession,
    SessionSettingsError,
    UnserializableItemError,
    _session_settings,
)

__all__ = [
    "DurableModel",
    "PersistkitSession",
    "SessionSettingsError",
    "UnserializableItemError",
    "durable",
    "durable_run",
    "load_run_state",
]

#: State channel of a durable run's thread holding the RunState of a run awaiting approval.
RUN_STATE_CHANNEL = "openai_agents_run_state"


# -- durable runs: model turns and tool calls as steps ---------------------------------------

_OUTPUT_ITEM: TypeAdapter[TResponseOutputItem] = TypeAdapter(TResponseOutputItem)


def _dump_response(resp: ModelResponse) -> dict[str, Any]:
    # Stored as plain JSON, not as SDK classes: survives SDK upgrades and needs no pk.register.
    return {
        "output": [
            item.model_dump(mode="json", exclude_unset=True) if hasattr(item, "model_dump") else item
            for item in resp.output
        ],
        "usage": serialize_usage(resp.usage),
        "response_id": resp.response_id,
        "request_id": resp.request_id,
    }


def _load_item(data: Any) -> Any:
    try:
        return _OUTPUT_ITEM.validate_python(data)
    except ValidationError:
        return data  # an item type this SDK does not model: the SDK accepts raw mappings too


def _load_response(data: dict[str, Any]) -> ModelResponse:
    return ModelResponse(
        output=[_load_item(item) for item in data["output"]],
        usage=deserialize_usage(data["usage"]),
        response_id=data.get("response_id"),
        request_id=data.get("request_id"),
    )


@dataclasses.dataclass
class _Thunk:
    """A deferred call passed to a step; it is not part of the step's args digest.

    Its ``inputs`` are the step's arguments too: a live step resolves the secret
    handles in them before its body runs (or fails before it, ``SecretResolutionError``),
    so a model or tool is never called with ``$CRED{…}`` text; a replayed one never
    needs the values.
    """

    fn: Callable[..., Awaitable[Any]]
    inputs: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __call__(self) -> Awaitable[Any]:
        return self.fn(*self.inputs, **self.kwargs)


#: Whether a replayed model turn must have been recorded for the same input (durable_run's check_input).
_CHECK_INPUT: contextvars.ContextVar[bool] = contextvars.ContextVar("persistkit_openai_agents_check_input", default=True)
_ANY_HANDLE = re.compile(r"\$CRED\{[^{}\s]{1,200}\}")


def _comparable(node: Any) -> Any:
    """``node`` as plain JSON with its secrets as bare ``$CRED{}`` (see :func:`_input_digest`)."""
    if isinstance(node, str):
        return _ANY_HANDLE.sub("$CRED{}", pk.secrets.scrub(node))
    if isinstance(node, dict):
        return {_comparable(str(k)): _comparable(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [_comparable(v) for v in node]
    if hasattr(node, "model_dump"):
        return _comparable(node.model_dump(mode="json", exclude_unset=True))
    if node is None or isinstance(node, bool | int | float):
        return node
    return type(node).__qualname__


def _input_digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A digest of the whole conversation a model turn is called with (``input``).

    Every item counts, whatever the length (persistkit's own argument digest looks
    only at the ends of a long list). It is taken over the text with secrets
    replaced by a bare ``$CRED{}``: no stored digest hashes a secret, and a key
    that a replayed tool output brings back as its handle in a new process
    compares equal to the key itself.
    """
    conversation = kwargs["input"] if "input" in kwargs else args[1] if len(args) > 1 else None
    text = json.dumps(_comparable(conversation), ensure_ascii=False, sort_keys=True)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


@pk.checkpointed(name="openai-agents.model", check_args=False)
async def _model_turn(call: _Thunk, input_digest: str) -> dict[str, Any]:
    return {**_dump_response(await call()), "input_digest": input_digest}


def _changed_input(run: pk.Run) -> pk.NonDeterminismError:
    return pk.NonDeterminismError(
        f"thread {run.thread_id!r} run {run.run_id}: a model turn of this unfinished run was "
        "recorded for a different input (the conversation passed to the model changed: the "
        "input given to durable_run, or an item before this turn). Its recorded answer would "
        "be replayed for the new input. Call durable_run with the input of the unfinished run "
        "to continue it, or pass a new run_id (durable_run(..., run_id=...)) to start a new "
        "run; durable_run(..., check_input=False) replays recorded turns whatever the input"
    )


class DurableModel(Model):
    """A ``Model`` whose ``get_response`` is a persistkit step inside a ``pk.resume`` block
    (a recorded turn returns its recorded response without calling the model).

    A recorded turn replays only for the input it was recorded for (a digest of
    the whole conversation): another input is a ``NonDeterminismError``, unless
    ``durable_run(..., check_input=False)``.
    """

    def __init__(self, model: Model) -> None:
        self.model = model

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        run = pk.current_run()
        if run is None:
            return await self.model.get_response(*args, **kwargs)
        digest = _input_digest(args, kwargs)
        data = await _model_turn(_Thunk(self.model.get_response, args, kwargs), digest)
        recorded = data.get("input_digest")  # absent in turns recorded before the check existed
        if recorded is not None and recorded != digest and _CHECK_INPUT.get():
            raise _changed_input(run)
        return _load_response(data)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        if pk.current_run() is not None:
            raise pk.ConfigurationError(
                "streamed model turns are not durable: use durable_run (Runner.run), "
                "not Runner.run_streamed, inside a persistkit run"
            )
        return self.model.stream_response(*args, **kwargs)

    async def close(self) -> None:
        await self.model.close()


class _DurableProvider(ModelProvider):
    def __init__(self, provider: ModelProvider) -> None:
        self.provider = provider

    def get_model(self, model_name: str | None) -> Model:
        return DurableModel(self.provider.get_model(model_name))

    async def aclose(self) -> None:
        await self.provider.aclose()


def _durable_tool(tool: FunctionTool) -> FunctionTool:
    invoke = tool.on_invoke_tool
    if getattr(invoke, "_pk_durable", False):
        return tool

    @pk.checkpointed(name=f"openai-agents.tool:{tool.name}")
    async def step(call_id: str, arguments: str, call: _Thunk) -> Any:
        return await call()

    @functools.wraps(invoke)  # keeps the signature the SDK inspects to pick the context type
    async def on_invoke_tool(ctx: Any, arguments: str) -> Any:
        if pk.current_run() is None:
            return await invoke(ctx, arguments)
        call_id = str(getattr(ctx, "tool_call_id", ""))
        return await step(call_id, arguments, _Thunk(functools.partial(invoke, ctx), (arguments,)))

    on_invoke_tool._pk_durable = True  # type: ignore[attr-defined]
    new = copy.copy(tool)
    new.on_invoke_tool = on_invoke_tool
    return new


def durable(agent: Agent[Any], _seen: dict[int, Agent[Any]] | None = None) -> Agent[Any]:
    """A copy of ``agent`` (and of the agents it hands off to) whose model turns and function
    tools are persistkit steps inside a run. Idempotent; the original is not changed."""
    seen = {} if _seen is None else _seen
    if id(agent) in seen:
        return seen[id(agent)]
    if isinstance(agent.model, DurableModel):
        return agent
    clone = agent.clone()
    seen[id(agent)] = clone
    if isinstance(agent.model, Model):
        clone.model = DurableModel(agent.model)
    clone.tools = [_durable_tool(t) if isinstance(t, FunctionTool) else t for t in agent.tools]
    clone.handoffs = [
        durable(h, seen) if isinstance(h, Agent) else h for h in agent.handoffs
    ]  # Handoff objects build their agent lazily: they are left as they are
    return clone


def _durable_config(config: RunConfig | None) -> RunConfig:
    config = copy.copy(config) if config is not None else RunConfig()
    if isinstance(config.model, Model) and not isinstance(config.model, DurableModel):
        config.model = DurableModel(config.model)
    if not isinstance(config.model_provider, _DurableProvider):
        config.model_provider = _DurableProvider(config.model_provider)
    return config


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
    run_config: RunConfig | None = None,
    check_input: bool = True,
    **kwargs: Any,
) -> RunResult:
    """``Runner.run`` as a durable persistkit run on ``thread_id``.

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
    """
    agent = durable(agent)
    config = _durable_config(run_config)
    if kwargs.get("session") is not None:
        kwargs["session"] = _StepSession(kwargs["session"])
    token = _CHECK_INPUT.set(check_input)
    try:
        async with pk.resume(thread_id, store=store, run_id=run_id) as run:
            try:
                result = await Runner.run(agent, input, run_config=config, **kwargs)
            except AgentsException as exc:  # the SDK wraps a tool's error in its UserError
                refused = _secret_refusal(exc)
                if refused is None:
                    raise
                raise refused from exc
            pending = result.to_state().to_json() if result.interruptions else None
            if run.state.get(RUN_STATE_CHANNEL) != pending:
                run.state[RUN_STATE_CHANNEL] = pending  # committed with the run's end record
    finally:
        _CHECK_INPUT.reset(token)
    return result


def _secret_refusal(exc: AgentsException) -> pk.SecretResolutionError | None:
    """The ``pk.SecretResolutionError`` of a tool refused before it ran (a secret handle
    nothing resolves) inside the SDK's wrapper, raised as the docs promise; or None."""
    cause: BaseException | None = exc.__cause__
    for _ in range(4):  # a short chain: the SDK wraps once or twice
        if cause is None or isinstance(cause, pk.SecretResolutionError):
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
