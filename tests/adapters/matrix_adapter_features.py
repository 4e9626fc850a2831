"""Adapter-state migrations as features of the combination matrix (persistkit.testing.combination).

Imported by the matrix (``combination_modules``) where the framework is installed;
a feature whose framework is missing drops out of the design (``requires``).

``langgraph_migration``: each step of the matrix agent runs one turn of a real
LangGraph graph (``durable_invoke``, ``PersistkitSaver`` on the matrix's store, so
with its encryption, integrity, offload...) on a graph thread of the case. Version 1
of the graph keeps ``notes: list[Note]`` with ``Note.priority: str`` and ``log:
list[str]``; version 2 renames ``notes`` to ``memo``, makes ``priority`` an int and
``log`` LangChain messages, with the documented saver migration
(docs/adapters-langgraph.md). A crash of the matrix step in flight happens before
the turn (it runs once, in version 2, on the migrated state); a crash after the
step leaves the turn committed by version 1, replayed, not run again.
"""

from __future__ import annotations

import operator
import os
from functools import cache
from typing import Annotated, Any, ClassVar, TypedDict

from pydantic import BaseModel, create_model

import persistkit as pk
from persistkit.testing.combination import Case, Feature, Stored, register_feature

try:  # imported here, once, by the matrix's driver: its forked jobs then do not pay for it
    import langchain_core.messages  # noqa: F401
    import langgraph.graph
    import langgraph.graph.message  # noqa: F401
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    import persistkit_langgraph  # noqa: F401
except ImportError:  # the feature drops out of the design (requires=)
    pass

# -- LangGraph ------------------------------------------------------------------------------


@cache
def note_class(version: int) -> type[BaseModel]:
    """The graph's nested model, one class name for both versions (as two releases have):
    version 2's ``priority`` is an int, so a stored version-1 Note no longer fits it."""
    kind: type = str if version == 1 else int
    cls = create_model("Note", __module__=__name__, text=(str, ...), priority=(kind, ...))
    globals()["Note"] = cls  # where LangGraph's serializer finds the class by name
    return cls


@cache
def _builder(version: int) -> Any:
    from langchain_core.messages import AIMessage, AnyMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages

    note = note_class(version)
    # TypedDict's functional form: the annotations are objects (this module's are strings)
    if version == 1:
        state = TypedDict("State", {"notes": Annotated[list[note], operator.add], "log": Annotated[list[str], operator.add]})  # type: ignore[misc, valid-type]  # noqa: UP013

        def turn(values: Any) -> dict[str, Any]:
            k = len(values["notes"])
            return {"notes": [note(text=f"n{k}", priority=f"p{k}")], "log": [f"turn {k}"]}

    else:
        state = TypedDict("State", {"memo": Annotated[list[note], operator.add], "log": Annotated[list[AnyMessage], add_messages]})  # type: ignore[misc, valid-type]  # noqa: UP013

        def turn(values: Any) -> dict[str, Any]:
            k = len(values["memo"])
            return {"memo": [note(text=f"n{k}", priority=k)], "log": [AIMessage(f"turn {k}", id=f"log-{k}")]}

    builder: Any = StateGraph(state)
    builder.add_node("turn", turn)
    builder.add_edge(START, "turn")
    builder.add_edge("turn", END)
    return builder


def _upgrade(channels: dict[str, Any]) -> dict[str, Any]:
    """The documented v1 -> v2 migration: a channel renamed, nested values converted."""
    from langchain_core.messages import AIMessage

    def upgrade(n: Any) -> Any:
        fields = n if isinstance(n, dict) else n.model_dump()  # a stored v1 Note arrives as its fields
        return note_class(2)(text=fields["text"], priority=int(str(fields["priority"]).lstrip("p")))

    if "notes" in channels:
        channels["memo"] = [upgrade(n) for n in channels.pop("notes")]
    if "log" in channels:
        channels["log"] = [m if isinstance(m, AIMessage) else AIMessage(m, id=f"log-{m.split()[1]}") for m in channels["log"]]
    return channels


def _graph(store: pk.Store, version: int) -> Any:
    from persistkit_langgraph import PersistkitSaver

    # this module's Note is trusted by the graph's serializer, as a user's model would be
    serde = JsonPlusSerializer(allowed_msgpack_modules=[(__name__, "Note")])
    saver = PersistkitSaver(store, version=version, serde=serde)
    if version == 2:
        saver.migration(from_version=1)(_upgrade)
    return _builder(version).compile(checkpointer=saver)


def _config(case: Case) -> Any:
    return {"configurable": {"thread_id": f"{case.thread}-lg"}}


def _lg_step(case: Case, version: int, i: int, state: Any, handed: Any) -> list[list[Any]]:
    from persistkit_langgraph import durable_invoke

    run = pk.current_run()
    assert run is not None
    out = durable_invoke(_graph(run.store, version), {"log": []}, _config(case))
    notes = out["notes"] if version == 1 else out["memo"]
    # version-independent: [text, priority as int]
    return [[n.text, int(str(n.priority).lstrip("p"))] for n in notes]


def _lg_check(case: Case, store: pk.Store, data: Stored, final: dict[str, Any]) -> list[str]:
    values = _graph(store, 2).get_state(_config(case)).values
    turns = case.steps + 1  # the later run's step ran a turn too
    problems: list[str] = []
    memo = [(n.text, n.priority, type(n).__name__) for n in values.get("memo", [])]
    if any(type(n) is not note_class(2) for n in values.get("memo", [])):
        problems.append("graph memo holds values that are not version 2's Note")
    if memo != [(f"n{k}", k, "Note") for k in range(turns)]:
        problems.append(f"graph memo after a later run: {memo}")
    log = [(type(m).__name__, m.content) for m in values.get("log", [])]
    if log != [("AIMessage", f"turn {k}") for k in range(turns)]:
        problems.append(f"graph log after a later run: {log}")
    if "notes" in values:
        problems.append("the renamed channel 'notes' is still in the graph state")
    return problems


register_feature(
    Feature(
        name="langgraph_migration",
        doc="each step runs a LangGraph turn whose graph state is renamed/retyped between the versions",
        step=_lg_step,
        check=_lg_check,
        changes_schema=True,
        requires=("langgraph", "persistkit_langgraph"),
    )
)


# -- CrewAI ---------------------------------------------------------------------------------
#
# Each step kicks off a one-method flow on the case's flow id: CrewAI's @persist loads
# the flow's saved state (through PersistkitFlowPersistence on the matrix's store) and
# ``turn`` appends to it. Version 1's ``Report`` keeps ``steps: list[str]`` and
# ``score: str``; version 2 renames ``steps`` to ``done`` and makes ``score`` an int,
# registered as version 2 with its class migration (docs/adapters-crewai.md).

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

try:
    import crewai.flow.flow
    import crewai.flow.persistence  # noqa: F401

    import persistkit_crewai  # noqa: F401
except ImportError:  # the feature drops out of the design (requires=)
    pass


@cache
def report_class(version: int) -> type[BaseModel]:
    if version == 1:
        cls = create_model("Report", __module__=__name__, id=(str, ""), steps=(list[str], []), score=(str, "s0"))
        pk.register(cls)
    else:
        cls = create_model("Report", __module__=__name__, id=(str, ""), done=(list[str], []), score=(int, 0))
        pk.register(cls, version=2)

        @pk.migration(cls, from_version=1)
        def upgrade(data: dict[str, Any]) -> dict[str, Any]:
            data["done"] = data.pop("steps", [])
            data["score"] = int(str(data.get("score", "s0")).lstrip("s"))
            return data

    globals()["Report"] = cls
    return cls


def _flow_class(version: int) -> Any:
    """A new class each time: ``@persist`` binds the class to one persistence (one store)."""
    from crewai.flow.flow import Flow, start

    report = report_class(version)
    field = "steps" if version == 1 else "done"

    class Turns(Flow[report]):  # type: ignore[valid-type, misc]
        _skip_auto_memory: ClassVar[bool] = True  # no (lancedb) Memory

        @start()
        def turn(self) -> str:
            done = getattr(self.state, field)
            done.append(f"t{len(done)}")
            self.state.score = f"s{len(done)}" if version == 1 else len(done)
            return done[-1]

    return Turns


def _cw_run(case: Case, store: pk.Store, version: int) -> Any:
    from crewai.flow.persistence import persist

    from persistkit_crewai import PersistkitFlowPersistence

    persistence = PersistkitFlowPersistence(store)
    flow = persist(persistence)(_flow_class(version))(suppress_flow_events=True)
    flow.kickoff(inputs={"id": f"{case.thread}-cw"})
    return flow.state


def _cw_step(case: Case, version: int, i: int, state: Any, handed: Any) -> list[str]:
    run = pk.current_run()
    assert run is not None
    done = _cw_run(case, run.store, version)
    return list(done.steps if version == 1 else done.done)


def _cw_check(case: Case, store: pk.Store, data: Stored, final: dict[str, Any]) -> list[str]:
    from persistkit_crewai import PersistkitFlowPersistence

    loaded = PersistkitFlowPersistence(store).load_state(f"{case.thread}-cw") or {}
    want = {"done": [f"t{k}" for k in range(case.steps + 1)], "score": case.steps + 1}
    got = {k: loaded.get(k) for k in want}
    return [] if got == want else [f"flow state after a later run: {loaded}"]


register_feature(
    Feature(
        name="crewai_migration",
        doc="each step kicks off a CrewAI flow whose state model is renamed/retyped between the versions",
        setup=lambda case, version: _define(report_class, version),
        step=_cw_step,
        check=_cw_check,
        changes_schema=True,
        requires=("crewai", "persistkit_crewai"),
    )
)


def _define(make: Any, version: int) -> None:
    make(version)
