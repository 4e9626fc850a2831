"""``PersistkitDurability``: a Pydantic AI durability capability whose durable units are
persistkit steps of the current ``pk.resume`` run."""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Self

import pydantic_ai.exceptions
from pydantic import (
    BaseModel,
    ConfigDict,
    ModelWrapValidatorHandler,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    model_validator,
)
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
from pydantic_ai.models import Model
from pydantic_ai.tools import (
    AgentDepsT,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
)

import persistkit as pk

from ._digest import history_digest
from ._stream import STREAM, emitting

_REQUESTS: TypeAdapter[DeferredToolRequests] = TypeAdapter(DeferredToolRequests)
_RESULTS: TypeAdapter[DeferredToolResults] = TypeAdapter(DeferredToolResults)
#: Agent runs started in each persistkit run so far: the n-th gets run id ``<pk run>:<n>``.
_AGENT_RUNS: weakref.WeakKeyDictionary[pk.Run, int] = weakref.WeakKeyDictionary()


class DeferredAnswerError(pk.AnswerError):
    """The answer to a suspended deferred-tool question does not answer its calls: not a
    ``DeferredToolResults`` (or a dict of its fields), a value of the wrong type, a pending
    call id left out, or a call id that is not pending. Raised by ``store.answer`` (nothing
    is stored, the question stays open); ``thread_id`` and ``question`` say which."""

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (str(self), self.thread_id, self.question))


def _rebuild(message: str, thread_id: str, question: str | None) -> DeferredAnswerError:
    return DeferredAnswerError(message, thread_id=thread_id, question=question)


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


def _identity(
    run: pk.Run, operation_id: DurableOperationId, cache_key: tuple[object, ...]
) -> tuple[str, Any]:
    """What a recorded unit must have been recorded for, and the inputs a live unit hands
    the outside world (checked for secret handles before it runs)."""
    if isinstance(operation_id, ModelRequestId):
        messages = cache_key[1]
        assert isinstance(messages, list)
        return f"model:{len(messages)}:{history_digest(run, messages)}", messages
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
        identity, inputs = _identity(run, operation_id, cache_key)

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
        stream: str | None = None,
    ) -> None:
        """``models``, ``event_stream_handler`` and ``name`` are those of Pydantic AI's
        other durability capabilities; ``suspend_deferred=False`` leaves deferred tool
        calls to the agent's output (``DeferredToolRequests``) instead of suspending.
        ``stream="answer"``: inside a run, the agent's events (text and thinking deltas,
        tool calls and results) go into the thread's persistkit stream ``"answer"``, emitted
        inside the step that produced them (docs/adapters-pydantic-ai.md, Streaming); an
        ``event_stream_handler`` still receives every event."""
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        self._suspend_deferred = suspend_deferred
        self._stream = None if stream is None else pk.check_stream_name(stream)
        self._emitters: dict[str, EventStreamHandler[AgentDepsT]] = {}

    def _effective_event_stream_handler(self) -> EventStreamHandler[AgentDepsT] | None:
        # The base's hook for the handler of the current run: with a stream, one that emits
        # every event into it (inside the durable unit, so inside a persistkit step) and hands
        # it on to the user's handler.
        user = super()._effective_event_stream_handler()
        name = STREAM.get() or self._stream
        if name is None or not self.in_durable_context:
            return user
        handler = self._emitters.get(name)
        if handler is None:
            handler = self._emitters[name] = emitting(name, user)
        return handler

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
        payload: dict[str, Any] = {
            "pydantic_ai": "deferred_tool_requests",
            "requests": _REQUESTS.dump_python(requests, mode="json"),
        }
        while True:
            answer = await pk.asuspend(payload, answer_type=DeferredAnswer)
            try:
                return deferred_results(answer, requests)
            except DeferredAnswerError as exc:
                # An answer store.answer could not check (a question asked before the check
                # existed): the run asks again, saying why, instead of failing for good.
                payload = {**payload, "rejected": str(exc)}


@pk.checkpointed(name="pydantic-ai.run_start_time", check_args=False)
async def _run_start(run_id: str) -> str:
    return now_utc().isoformat()


_FIELDS = ("approvals", "calls", "metadata", "answered_by")
_HOW = (
    'answer every pending call by its tool call id: store.answer(thread_id, {"approvals": '
    '{"<id>": True}}) (False, or {"kind": "tool-denied", "message": "..."}, denies it) for a call '
    'that needs approval, {"calls": {"<id>": <the tool\'s result>}} for an external call '
    "(pending_requests(question) lists them)"
)


def deferred_results(
    answer: Any, requests: DeferredToolRequests | None = None
) -> DeferredToolResults:
    """The answer to a suspended deferred-tool question as ``DeferredToolResults``: the object
    itself, or a dict of its fields (``{"approvals": {call_id: True}, "calls": {...}}``).
    Given the question's ``requests``, every pending call must be answered, in its field
    (``approvals`` or ``calls``), and no other; else :class:`DeferredAnswerError` naming the
    call ids and saying how to answer."""
    return _checked(answer, requests, "", None)


def _checked(
    answer: Any, requests: DeferredToolRequests | None, thread_id: str, question: str | None
) -> DeferredToolResults:
    def refuse(why: str) -> DeferredAnswerError:
        where = f"thread {thread_id!r} question {question}: " if thread_id else ""
        tail = ". Nothing was stored; the question is still open" if thread_id else ""
        return DeferredAnswerError(
            f"{where}the answer to the deferred tool calls {why}. To {_HOW}{tail}",
            thread_id=thread_id,
            question=question,
        )

    if isinstance(answer, DeferredAnswer):
        answer = answer.model_dump()
    elif isinstance(answer, DeferredToolResults):  # checked like a dict: its values may be anything
        answer = {field: dict(getattr(answer, field)) for field in _FIELDS}
    if not isinstance(answer, Mapping):
        raise refuse(
            f"must be a DeferredToolResults or a dict of its fields, got {type(answer).__name__}"
        )
    if extra := sorted(str(k) for k in answer if k not in _FIELDS):
        raise refuse(
            f"has keys {extra}, which are not fields of DeferredToolResults {list(_FIELDS)}"
        )
    try:
        results = _RESULTS.validate_python(answer)
    except ValidationError as exc:
        raise refuse(f"has values of the wrong type: {_reasons(exc)}") from None
    if requests is not None and (problems := _mismatch(results, requests)):
        raise refuse("; ".join(problems))
    return results


def _reasons(exc: ValidationError) -> str:
    """pydantic's errors, one per answered call id, in words."""
    reasons: dict[str, str] = {}
    for error in exc.errors():
        loc = error["loc"]
        if loc[2:3] == ("bool",):  # the other branch of an approval's union says more
            continue
        key = f"{loc[0]}[{loc[1]!r}]" if len(loc) > 1 else str(loc[0])
        inner = ".".join(str(p) for p in loc[3:])
        what = error["msg"] + (f" at {inner}" if inner else "")
        if loc[0] == "approvals" and len(loc) > 1:
            what = (
                "must be True, False, or a ToolApproved / ToolDenied "
                f"({{'kind': 'tool-denied', 'message': ...}}): {what}"
            )
        reasons.setdefault(key, f"{key} {what} (got {error['input']!r})")
    return "; ".join(reasons.values())


def _mismatch(results: DeferredToolResults, requests: DeferredToolRequests) -> list[str]:
    """What is wrong with the call ids of ``results`` as the answer to ``requests``."""
    approval = {c.tool_call_id: c.tool_name for c in requests.approvals}
    external = {c.tool_call_id: c.tool_name for c in requests.calls}
    pending = approval | external
    problems: list[str] = []
    for field, own, other in (("approvals", approval, external), ("calls", external, approval)):
        given = set(getattr(results, field))
        if missing := sorted(set(own) - given):
            listed = ", ".join(f"{i!r} ({own[i]})" for i in missing)
            problems.append(f"leaves out pending call ids {listed} in {field!r}")
        if misplaced := sorted(given & set(other)):
            where = "calls" if field == "approvals" else "approvals"
            problems.append(
                f"gives call ids {misplaced} in {field!r}, but they belong in {where!r}"
            )
        if unknown := sorted(given - set(pending)):
            problems.append(f"names call ids {unknown} in {field!r} that are not pending")
    for field in ("metadata", "answered_by"):
        if unknown := sorted(set(getattr(results, field)) - set(pending)):
            problems.append(f"names call ids {unknown} in {field!r} that are not pending")
    if problems:
        problems.append(f"the pending call ids are {sorted(pending)}")
    return problems


def _requests_in(payload: Any) -> DeferredToolRequests | None:
    if not isinstance(payload, dict) or payload.get("pydantic_ai") != "deferred_tool_requests":
        return None
    return _REQUESTS.validate_python(pk.secrets.live(payload["requests"], partial=True))


class DeferredAnswer(BaseModel):
    """The stored answer to a deferred-tool question (its ``answer_type``): the fields of
    ``DeferredToolResults`` as JSON. ``store.answer`` checks it against the question's
    pending call ids (the answering process must import ``persistkit_pydantic_ai``, or
    open the store with ``allow_modules=["persistkit_pydantic_ai"]``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    approvals: dict[str, Any] = {}
    calls: dict[str, Any] = {}
    metadata: dict[str, dict[str, Any]] = {}
    answered_by: dict[str, str] = {}

    @model_validator(mode="wrap")
    @classmethod
    def _answers_the_question(
        cls, value: Any, handler: ModelWrapValidatorHandler[Self], info: ValidationInfo
    ) -> Self:
        context = info.context if isinstance(info.context, dict) else {}
        requests = _requests_in(context.get("payload"))
        thread_id, question = str(context.get("thread_id") or ""), context.get("question")
        results = _checked(value, requests, thread_id, None if question is None else str(question))
        return handler(_RESULTS.dump_python(results, mode="json"))


# Stored as ``persistkit_pydantic_ai:DeferredAnswer``, so ``allow_modules=["persistkit_pydantic_ai"]``
# names it; an answering process that imports the adapter knows it.
DeferredAnswer.__module__ = "persistkit_pydantic_ai"
pk.register(DeferredAnswer)

# A tool's ModelRetry (and the framework's other exceptions) recorded as a step's error replay
# as themselves in a resumed process, where the agent loop catches them: a recorded error's
# class with a constructor of its own revives only when registered (docs/security.md).
for _error in vars(pydantic_ai.exceptions).values():
    if isinstance(_error, type) and issubclass(_error, Exception) and _error.__module__ == "pydantic_ai.exceptions":
        pk.register(_error)


def pending_requests(question: pk.Question) -> DeferredToolRequests | None:
    """The deferred tool calls a suspended run asks about (``store.pending()``), or None if the
    question is not one of this capability's."""
    return _requests_in(question.payload)
