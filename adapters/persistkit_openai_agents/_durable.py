"""Model turns and function-tool calls as persistkit steps: :class:`DurableModel`,
:func:`durable` (an agent whose model and tools are steps inside a run)."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from agents import Agent, FunctionTool, Model, ModelProvider, ModelResponse, RunConfig
from agents.items import TResponseOutputItem
from agents.usage import deserialize_usage, serialize_usage
from pydantic import TypeAdapter, ValidationError

import persistkit as pk

from ._digest import _CHECK_INPUT, _changed_input, _input_digest
from ._stream import STREAM, streamed_response, tool_output

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



@pk.checkpointed(name="openai-agents.model", check_args=False)
async def _model_turn(call: _Thunk, input_digest: str) -> dict[str, Any]:
    return {**_dump_response(await call()), "input_digest": input_digest}


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
        stream = STREAM.get()
        if stream is None:
            call = _Thunk(self.model.get_response, args, kwargs)
        else:  # the turn streams, from inside its step: its events follow the stream's rewind rule
            call = _Thunk(lambda *a, **k: streamed_response(self.model, stream, a, k), args, kwargs)
        data = await _model_turn(call, digest)
        recorded = data.get("input_digest")  # absent in turns recorded before the check existed
        if recorded is not None and recorded != digest and _CHECK_INPUT.get():
            raise _changed_input(run)
        return _load_response(data)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        if pk.current_run() is not None:
            raise pk.ConfigurationError(
                "Runner.run_streamed is not durable inside a persistkit run: use "
                "durable_run(..., stream='answer'), whose model turns stream into the persistkit "
                "stream 'answer' (store.read_stream, pk.sse; docs/adapters-openai-agents.md)"
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
        out = await call()
        tool_output(tool.name, call_id, out)  # inside the step: final once it commits
        return out

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
