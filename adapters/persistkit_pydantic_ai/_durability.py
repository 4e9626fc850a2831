"""``PersistkitDurability``: a Pydantic AI durability capability whose durable units are
persistkit steps of the current ``pk.resume`` run."""

from __future__ import annotations

import hashlib
import json
import re
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_ai._utils import now_utc
from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationId,
    JournalCallableOperationBackend,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    conversation_id_from_run_id,
)
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pydantic_ai.models import Model
from pydantic_ai.tools import AgentDepsT, DeferredToolRequests, DeferredToolResults, RunContext

import persistkit as pk

_REQUESTS: TypeAdapter[DeferredToolRequests] = TypeAdapter(DeferredToolRequests)
_RESULTS: TypeAdapter[DeferredToolResults] = TypeAdapter(DeferredToolResults)
#: Agent runs started in each persistkit run so far: the n-th gets run id ``<pk run>:<n>``.
_AGENT_RUNS: weakref.WeakKeyDictionary[pk.Run, int] = weakref.WeakKeyDictionary()


class DeferredAnswerError(pk.ConfigurationError, ValueError):
    """The answer given (``store.answer``) to a suspended deferred-tool question is not a
    ``DeferredToolResults`` (or a dict of its fields)."""


@dataclass
class _Call:
    """A step's body: not an argument of the step's digest (``check_args=False``)."""

    body: Callable[[], Awaitable[object]]

    async def __call__(self) -> object:
        return await self.body()


_STEPS: dict[str, Callable[..., Awaitable[dict[str, Any]]]] = {}


def _step(name: str) -> Callable[..., Awaitable[dict[str, Any]]]:
    """The persistkit step that runs durable units named ``name`` (one per name, made once)."""
    step = _STEPS.get(name)
    if step is None:

        async def unit(identity: str, call: _Call) -> dict[str, Any]:
            return {"id": identity, "v": await call()}

        step = _STEPS[name] = pk.checkpointed(name=name, check_args=False)(unit)
    return step


def _comparable(node: Any) -> Any:
    """The parts of a message history that a replay must see again: kinds, texts, tool names,
    arguments and call ids, with secrets as a bare ``$CRED{}`` (so no digest hashes one and a
    key read back as its handle compares equal). Timestamps and provider ids are left out: a
    replayed run rebuilds its requests at other times."""
    if isinstance(node, str):
        text = pk.secrets.scrub(node)
        return text if "$CRED{" not in text else _HANDLE.sub("$CRED{}", text)
    if isinstance(node, dict):
        return {k: _comparable(v) for k, v in node.items() if k in _KEPT or not isinstance(k, str)}
    if isinstance(node, list):
        return [_comparable(v) for v in node]
    return node


_HANDLE = re.compile(r"\$CRED\{[^{}\s]{1,200}\}")
_KEPT = frozenset(
    {"kind", "parts", "part_kind", "content", "tool_name", "args", "tool_call_id", "instructions"}
)


def _history_digest(messages: list[ModelMessage]) -> str:
    data = _comparable(ModelMessagesTypeAdapter.dump_python(messages, mode="json"))
    text = json.dumps(data, ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _identity(operation_id: DurableOperationId, cache_key: tuple[object, ...]) -> tuple[str, Any]:
    """What a recorded unit must have been recorded for, and the inputs a live unit hands
    the outside world (checked for secret handles before it runs)."""
    if isinstance(operation_id, ModelRequestId):
        messages = cache_key[1]
        assert isinstance(messages, list)
        return f"model:{len(messages)}:{_history_digest(messages)}", messages
    if isinstance(operation_id, ToolsetCallToolId):
        name, args, ctx = cache_key[0], cache_key[1], cache_key[2]
        call_id = getattr(ctx, "tool_call_id", None)
        return f"tool:{name}#{call_id}", args
    return "", None


class _Backend(JournalCallableOperationBackend[None]):
    """Runs every durable unit as one persistkit step named after Pydantic AI's journal name."""

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: None,
    ) -> object:
        run = pk.current_run()
        if run is None:  # a unit reached outside a run (an agent nested in a tool, say)
            return await body()
        identity, inputs = _identity(operation_id, cache_key)

        async def checked() -> object:
            if inputs is not None:  # a handle nothing resolves never reaches a model or a tool
                pk.secrets.live(inputs, where=f"pydantic-ai {name}")
            return await body()

        record = await _step(name)(identity, _Call(checked))
        if record.get("id") != identity:
            raise pk.NonDeterminismError(
                f"thread {run.thread_id!r} run {run.run_id}: the Pydantic AI unit {name!r} at this "
                f"position was recorded for {record.get('id')!r} but is now called for {identity!r} "
                "(the prompt, the message history or the tool calls changed, or parallel tool calls "
                "started in another order). Resume with the input of the unfinished run, or start a "
                "new run with a new run_id"
            )
        return record["v"]


@dataclass(init=False, kw_only=True)
class PersistkitDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes an agent durable on persistkit: ``Agent(..., capabilities=[PersistkitDurability()])``.

    Inside a ``pk.resume`` block every model request, every function-tool and MCP call, each
    event-stream-handler call for a tool event and each discovery call of an MCP or dynamic
    toolset is a persistkit step: a resumed run replays the finished ones from the store and
    runs the first unfinished one for real. A deferred tool call (approval required, result
    supplied later) suspends the run (``pk.asuspend``) unless ``suspend_deferred=False``.
    Outside a block the agent runs exactly as without the capability.
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="persistkit",
        durable_unit_noun="step",
        durable_unit_plural="steps",
        durable_container_noun="run",
        codec=JSON_CODEC,  # results are stored as JSON: redacted, encrypted and migrated like state
        # a toolset given to run()/override() inside a run would run its tools unrecorded: refused
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-in-durable-unit",
            "dynamic": "enter-never",
        },
        tool_call_result_upgrade_lenient=False,
        journal_discovery=True,
        sequential_tools_in_durable_context=False,
        tool_config_key=None,
    )

    def __init__(
        self,
        *,
        models: Mapping[str, Model] | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        name: str | None = None,
        suspend_deferred: bool = True,
    ) -> None:
        """``models``, ``event_stream_handler`` and ``name`` are those of Pydantic AI's
        other durability capabilities; ``suspend_deferred=False`` leaves deferred tool
        calls to the agent's output (``DeferredToolRequests``) instead of suspending."""
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        self._suspend_deferred = suspend_deferred

    @property
    def in_durable_context(self) -> bool:
        return pk.current_run() is not None

    def get_durable_operation_backend(self) -> _Backend:
        return _Backend(
            agent_name=self.name,
            config=RoleBasedOperationConfig(model=None, event=None, capability=None, tool=None),
        )

    def get_default_run_id(self) -> str | None:
        run = pk.current_run()
        if run is None:
            return None
        n = _AGENT_RUNS.get(run, 0)
        _AGENT_RUNS[run] = n + 1
        return f"{run.run_id}:{n}"

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id) if self.in_durable_context else None

    async def get_run_start_time(self, run_id: str) -> datetime | None:
        if not self.in_durable_context:
            return None
        # A step, so a resumed run counts its ``timeout=`` from when it first started.
        stamp = await _run_start(run_id)
        return datetime.fromisoformat(stamp)

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[AgentDepsT], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        if not (self._suspend_deferred and self.in_durable_context):
            return None
        payload = {
            "pydantic_ai": "deferred_tool_requests",
            "requests": _REQUESTS.dump_python(requests, mode="json"),
        }
        answer = await pk.asuspend(payload)
        return deferred_results(answer)


@pk.checkpointed(name="pydantic-ai.run_start_time", check_args=False)
async def _run_start(run_id: str) -> str:
    return now_utc().isoformat()


def deferred_results(answer: Any) -> DeferredToolResults:
    """The answer to a suspended deferred-tool question as ``DeferredToolResults``: the object
    itself, or a dict of its fields (``{"approvals": {call_id: True}, "calls": {...}}``)."""
    if isinstance(answer, DeferredToolResults):
        return answer
    try:
        return _RESULTS.validate_python(answer)
    except ValidationError as exc:
        raise DeferredAnswerError(
            f"the answer to a deferred tool call must be a DeferredToolResults or a dict with "
            f"'approvals' and/or 'calls' keyed by tool call id, got {type(answer).__name__}: {exc}"
        ) from None


def pending_requests(question: pk.Question) -> DeferredToolRequests | None:
    """The deferred tool calls a suspended run asks about (``store.pending()``), or None if the
    question is not one of this capability's."""
    payload = question.payload
    if not isinstance(payload, dict) or payload.get("pydantic_ai") != "deferred_tool_requests":
        return None
    return _REQUESTS.validate_python(pk.secrets.live(payload["requests"], partial=True))
