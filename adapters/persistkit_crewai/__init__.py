"""CrewAI on persistkit: durable flows and crews on any persistkit store.

Flows: ``@persist(PersistkitFlowPersistence(store))`` keeps each flow's state
(and which methods completed) on a persistkit thread named after the flow id;
``persistence.restore(flow, flow_id)`` followed by
``flow.kickoff(inputs={"id": flow_id})`` continues a flow after its last
completed method instead of running it again from the start.

Crews: ``durable_kickoff(crew, inputs, thread_id=...)`` runs ``crew.kickoff``
inside ``pk.resume(thread_id)`` with each task's execution as a
``@pk.checkpointed`` step: a crew that died during task 3 replays the recorded
outputs of tasks 1-2 and runs tasks 3 onwards. Each tool call inside a task is
a step nested under it: task 3's tool calls that returned before the crash are
not run again (see ``_tools``).

Built on the public ``persistkit`` API only.
"""

from __future__ import annotations

from typing import Annotated, Any, cast

from crewai.flow.async_feedback.types import PendingFeedbackContext
from crewai.flow.persistence.base import FlowPersistence
from crewai.flow.runtime import Flow, FlowState
from crewai.flow.types import FlowExecutionData
from pydantic import BaseModel, Field, PrivateAttr

import persistkit as pk

from ._crew import adurable_kickoff, durable_kickoff

__all__ = ["PersistkitFlowPersistence", "adurable_kickoff", "durable_kickoff"]

#: How often a flow-state write is retried after another writer moved the thread's head first
#: (CrewAI saves the states of concurrently finishing methods from several threads).
_CONFLICT_RETRIES = 16


class FlowRecord(pk.State, name="persistkit_crewai.FlowRecord", version=1):
    """What one persistkit thread holds for one CrewAI flow id."""

    # The flow's state: its pydantic model as the object (persistkit's codec stores its class and
    # version, so ``pk.register(Model, version=n)`` + ``@pk.migration`` upgrade it on load, and a
    # shape change without a migration is a SchemaVersionError), or the dict of a dict state.
    # Records written before flow states carried a version hold the model's JSON dict: see ``_legacy``.
    state: Any = None
    # Every persisted method completion, in order (append-only: O(1) per save).
    methods: Annotated[list[str], pk.append] = []
    pending: dict[str, Any] | None = None


def _user_model(cls: type[BaseModel]) -> type[BaseModel]:
    """The user's state model behind CrewAI's ``StateWithId(FlowState, Model)``: a class made
    per flow instance, which a new process cannot name and the user cannot version."""
    if "<locals>" in cls.__qualname__ and FlowState in cls.__bases__:
        bases = [b for b in cls.__bases__ if b is not FlowState and issubclass(b, BaseModel)]
        if len(bases) == 1:
            return bases[0]
    return cls


def _stored(state_data: dict[str, Any] | BaseModel) -> dict[str, Any] | BaseModel:
    if isinstance(state_data, BaseModel):
        model = _user_model(type(state_data))
        if model is type(state_data):
            return state_data  # encoded before save_state returns: later mutations are not seen
        # Stored as the user's model (its class and version): the id CrewAI added is the flow id.
        fields = {k: v for k, v in state_data.__dict__.items() if k in model.model_fields}
        return model.model_construct(**fields)
    if isinstance(state_data, dict):
        return dict(state_data)
    raise TypeError(f"flow state must be a dict or a pydantic model, got {type(state_data).__name__}")


def _as_dict(state: Any, flow_uuid: str) -> dict[str, Any]:
    """The dict CrewAI restores a flow's state from (``Flow._restore_state`` needs its id)."""
    data = state.model_dump() if isinstance(state, BaseModel) else dict(state or {})
    data.setdefault("id", flow_uuid)
    return data


class PersistkitFlowPersistence(FlowPersistence):
    """CrewAI ``FlowPersistence`` on a persistkit store: one thread per flow id.

    Each save is one checkpoint (compare-and-swap on the thread head) holding
    the flow's state and the name of the method that completed; ``load_state``
    returns the latest state. Without a store, ``pk.connect()`` picks the
    default ($PERSISTKIT_URL, else a local SQLite file).
    """

    persistence_type: str = Field(default="PersistkitFlowPersistence")
    thread_prefix: str = Field(default="crewai-flow:")
    _store: pk.Store = PrivateAttr()

    def __init__(self, store: pk.Store | None = None, /, **data: Any) -> None:
        super().__init__(**data)
        if store is not None and not isinstance(store, pk.Store):
            raise pk.ConfigurationError(f"store must be a persistkit Store (pk.connect(...)), got {store!r}")
        self._store = store if store is not None else pk.connect()

    @property
    def store(self) -> pk.Store:
        return self._store

    def thread_id(self, flow_uuid: str) -> str:
        """The persistkit thread holding flow ``flow_uuid``."""
        return f"{self.thread_prefix}{flow_uuid}"

    def init_db(self) -> None:
        """Nothing to do: persistkit backends create their schema on first use."""

    def _record(self, flow_uuid: str, model: type[BaseModel] | None = None) -> FlowRecord | None:
        try:
            rec: FlowRecord = self._store.get_state(self.thread_id(flow_uuid), state=FlowRecord)
        except pk.NotFoundError:
            return None
        except pk.SerializationError as exc:
            if "not registered in this process" not in str(exc):
                raise
            if model is not None:  # restore() registered the flow's model: the stored one is another
                raise pk.SchemaVersionError(
                    f"CrewAI flow {flow_uuid!r}: its state was stored as a model class this process "
                    f"does not have, not as the flow's {model.__qualname__} (was the state model "
                    "renamed or moved?). Nothing was loaded. Keep the old class importable and "
                    "registered under its old name and convert in a migration, or finish the flow with "
                    f"the code that stored it. ({exc})"
                ) from exc
            # A process that never named the flow's model (a dashboard, or kickoff(inputs={"id":
            # ...}) without restore() first) reads the stored fields: what load_state returns and
            # CrewAI restores from is a dict anyway. restore() / inspect_state(model=) migrate.
            data = self._store.get_state(self.thread_id(flow_uuid), plain=True)
            return FlowRecord.model_validate({k: data[k] for k in ("state", "methods", "pending") if k in data})
        return rec

    def _write(self, flow_uuid: str, changes: dict[str, Any], method: str) -> None:
        for attempt in range(_CONFLICT_RETRIES):
            try:
                self._store.update_state(
                    self.thread_id(flow_uuid), changes, state=FlowRecord, metadata={"crewai_method": method}
                )
                return
            except pk.ConflictError:  # another save landed first: re-read the head and try again
                if attempt == _CONFLICT_RETRIES - 1:
                    raise

    def save_state(self, flow_uuid: str, method_name: str, state_data: dict[str, Any] | BaseModel) -> None:
        """Record that ``method_name`` completed, with the flow's state after it."""
        self._write(flow_uuid, {"state": _stored(state_data), "methods": [method_name]}, method_name)

    def load_state(self, flow_uuid: str) -> dict[str, Any] | None:
        """The state saved last for ``flow_uuid`` (a model's upgraded by its migrations), or
        None: what ``kickoff(inputs={"id": …})`` restores before the flow's next method runs, so
        secret handles in it are resolved (a key from the environment: from this process's
        environment), or ``SecretResolutionError`` says what to configure before any method
        runs with one."""
        rec = self._record(flow_uuid)
        if rec is None or not rec.state:
            return None
        state: dict[str, Any] = pk.secrets.live(_as_dict(rec.state, flow_uuid), where=self._where(flow_uuid))
        return state

    def inspect_state(self, flow_uuid: str, model: type[BaseModel] | None = None) -> dict[str, Any] | None:
        """The state saved last for ``flow_uuid``, or None, for reading only: secrets stay
        handles (``$CRED{env:OPENAI_API_KEY}``), so it never needs a secret's value. In a
        process that never ran the flow, name its state ``model`` (as ``restore`` does with
        the flow's): the stored state is revived as that class, migrated."""
        if model is not None:
            pk.register(model)
        rec = self._record(flow_uuid)
        return _as_dict(rec.state, flow_uuid) if rec is not None and rec.state else None

    @staticmethod
    def _where(flow_uuid: str) -> str:
        return f"CrewAI flow {flow_uuid!r}: restoring its state before its next method"

    def completed_methods(self, flow_uuid: str) -> list[str]:
        """Names of the persisted methods that completed, in order (repeats for cycles)."""
        rec = self._record(flow_uuid)
        return list(rec.methods) if rec is not None else []

    def restore(self, flow: Flow[Any], flow_id: str) -> bool:
        """Prepare ``flow`` to continue flow ``flow_id`` after its last completed method.

        Marks the recorded methods completed so that the next
        ``flow.kickoff(inputs={"id": flow_id})`` (which loads the state) skips
        them. Routers are not marked: they run again, so that the listeners of
        the route they pick fire. Returns False when nothing was recorded.
        """
        model = _user_model(type(flow.state)) if isinstance(flow.state, BaseModel) else None
        if model is not None:
            pk.register(model)  # revivable in this new process before the flow saves anything
        rec = self._record(flow_id, model)  # decoding runs the model's migrations, or refuses a changed shape
        done = set(rec.methods) if rec is not None else set()
        if not done:
            return False
        if rec is not None and isinstance(rec.state, dict) and model is not None:
            _legacy(model, rec.state, flow_id, self.thread_id(flow_id))
        elif rec is not None and model is not None and isinstance(rec.state, BaseModel) and type(rec.state) is not model:
            raise pk.SchemaVersionError(
                f"CrewAI flow {flow_id!r}: its state is a stored {type(rec.state).__qualname__}, but the "
                f"flow's state model is {model.__qualname__}; loading it would drop or misread fields. "
                "Nothing was loaded. Finish the flow with the code that stored it, or keep one model "
                "class and change it through versions (pk.register(Model, version=n) + @pk.migration)"
            )
        methods = type(flow).flow_definition().methods
        done = {m for m in done if not (m in methods and methods[m].router)}
        if flow.persistence is None:
            flow.persistence = self  # kickoff only restores when the flow has a persistence
        data = {
            "id": flow_id,
            "completed_methods": [{"flow_method": {"name": m}, "status": "completed"} for m in sorted(done)],
            "execution_methods": [],
        }
        flow.reload(cast(FlowExecutionData, data))
        return True

    def save_pending_feedback(
        self, flow_uuid: str, context: PendingFeedbackContext, state_data: dict[str, Any] | BaseModel
    ) -> None:
        """Store the state and the context of a flow paused for human feedback."""
        changes = {"state": _stored(state_data), "pending": context.to_dict()}
        self._write(flow_uuid, changes, context.method_name)

    def load_pending_feedback(self, flow_uuid: str) -> tuple[dict[str, Any], PendingFeedbackContext] | None:
        rec = self._record(flow_uuid)
        if rec is None or rec.pending is None:
            return None
        state, pending = pk.secrets.live(
            (_as_dict(rec.state, flow_uuid), rec.pending), where=self._where(flow_uuid)
        )
        return state, PendingFeedbackContext.from_dict(pending)

    def clear_pending_feedback(self, flow_uuid: str) -> None:
        if self._record(flow_uuid) is not None:
            self._write(flow_uuid, {"pending": None}, "clear_pending_feedback")


def _legacy(model: type[BaseModel], data: dict[str, Any], flow_id: str, thread: str) -> None:
    """A state stored as the model's JSON dict (by an earlier persistkit-crewai) carries no
    version: refuse one that no longer fits the model, rather than CrewAI's raw ValidationError."""
    from pydantic import ValidationError

    try:
        model.model_validate(data)
    except ValidationError as exc:
        detail = "; ".join(
            f"{'.'.join(map(str, e.get('loc') or ())) or '(value)'}: {e['msg']}" for e in exc.errors(include_url=False)[:3]
        )
        raise pk.SchemaVersionError(
            f"CrewAI flow {flow_id!r} (persistkit thread {thread!r}): its state was stored as a plain "
            f"dict by an earlier persistkit-crewai, which records no model version, and no longer "
            f"validates as {model.__qualname__} ({detail}). Finish the flow with the code that "
            "stored it; flows saved from now on carry their model's version and migrate "
            f"(pk.register({model.__qualname__}, version=2) + @pk.migration)"
        ) from exc
