"""Adapter state that changes shape: LangGraph graph state and CrewAI flow state.

In process: the saver's graph-state versions and what it refuses; the CrewAI
persistence storing the user's model. Across processes (``adapter_migration``,
shared with the combination matrix): a real graph / flow killed at every step
position, resumed in a new process by code whose state was renamed and retyped,
with the documented migration (finishes, every value migrated) and without it
(a ``SchemaVersionError`` naming what changed, nothing run).
"""

from __future__ import annotations

import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from adapter_migration import FRAMEWORKS, check, check_refused, refusal_positions, run_case
from conftest import make_url, uid

pytest.importorskip("langgraph")

from langchain_core.messages import AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pydantic import BaseModel

import persistkit as pk
from persistkit_langgraph import PersistkitSaver, durable_invoke

# -- LangGraph, in process ------------------------------------------------------------------------


class Ticket(BaseModel):
    title: str
    priority: int


class Old(TypedDict):
    notes: Annotated[list[str], operator.add]
    tickets: Annotated[list[Ticket], operator.add]
    messages: Annotated[list[AnyMessage], add_messages]


class New(TypedDict):
    memo: Annotated[list[str], operator.add]
    tickets: Annotated[list[Ticket], operator.add]
    messages: Annotated[list[AnyMessage], add_messages]


def two_step(schema: Any, field: str, pause: bool = True) -> Any:
    """START -> first -> second -> END; ``pause`` interrupts before ``second`` (a run left mid-way)."""
    builder: StateGraph[Any] = StateGraph(schema)
    builder.add_node("first", lambda s: {field: ["first"], "messages": [HumanMessage("hi", id="m1")]})
    builder.add_node("second", lambda s: {field: ["second"]})
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder, {"interrupt_before": ["second"]} if pause else {}


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


def cfg(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}}


def started(store: pk.Store, thread: str) -> None:
    """Run the old graph on ``thread`` up to its interrupt (state stored, run unfinished)."""
    builder, opts = two_step(Old, "notes")
    graph = builder.compile(checkpointer=PersistkitSaver(store), **opts)
    durable_invoke(graph, {"notes": [], "tickets": [Ticket(title="t", priority=1)]}, cfg(thread))


def test_renamed_channel_is_refused_not_dropped(url: str) -> None:
    store, thread = pk.connect(url), uid("lg")
    started(store, thread)
    builder, opts = two_step(New, "memo")
    graph = builder.compile(checkpointer=PersistkitSaver(store), **opts)
    with pytest.raises(pk.SchemaVersionError) as err:
        durable_invoke(graph, None, cfg(thread))
    text = str(err.value)
    assert f"thread {thread!r}" in text and "['notes']" in text and "['memo', 'messages', 'tickets']" in text
    assert "PersistkitSaver(store, version=2)" in text and "@saver.migration(from_version=1)" in text
    # Nothing was run or written: the old code can still finish the thread.
    builder, _ = two_step(Old, "notes")
    old = builder.compile(checkpointer=PersistkitSaver(store))
    assert durable_invoke(old, None, cfg(thread))["notes"] == ["first", "second"]


def test_renamed_channel_is_refused_by_the_async_twin(url: str) -> None:
    import asyncio

    from persistkit_langgraph import adurable_invoke

    store, thread = pk.connect(url), uid("lg")
    started(store, thread)
    builder, opts = two_step(New, "memo")
    graph = builder.compile(checkpointer=PersistkitSaver(store), **opts)
    with pytest.raises(pk.SchemaVersionError, match=r"stored state channel\(s\) \['notes'\]"):
        asyncio.run(adurable_invoke(graph, None, cfg(thread)))


def test_rename_and_value_type_change_migrate(url: str) -> None:
    store, thread = pk.connect(url), uid("lg")
    started(store, thread)
    saver = PersistkitSaver(store, version=2)
    seen: list[dict[str, Any]] = []

    @saver.migration(from_version=1)
    def upgrade(channels: dict[str, Any]) -> dict[str, Any]:
        seen.append(dict(channels))
        if "notes" in channels:
            channels["memo"] = [n.upper() for n in channels.pop("notes")]
        return channels

    builder, opts = two_step(New, "memo")
    graph = builder.compile(checkpointer=saver, **opts)
    out = durable_invoke(graph, None, cfg(thread))
    assert out["memo"] == ["FIRST", "second"]
    assert out["tickets"] == [Ticket(title="t", priority=1)]
    assert [type(m) for m in out["messages"]] == [HumanMessage]
    assert seen and all(isinstance(m, HumanMessage) for m in seen[0]["messages"])  # messages as objects
    # The new checkpoints carry version 2: loading them runs no migration; history migrates each old one.
    n = len(seen)
    assert graph.get_state(cfg(thread)).values["memo"] == ["FIRST", "second"]
    history = list(graph.get_state_history(cfg(thread)))
    assert all("notes" not in s.values for s in history)
    versions = [c.metadata.get("langgraph_version", 1) for c in store.history(thread, namespace="lg:c:")]
    assert versions[0] == 2 and versions[-1] == 1  # newest written by v2, the first by v1
    assert len(seen) > n
    # The old code no longer reads the thread: newer version, not a silent misread.
    builder, _ = two_step(Old, "notes")
    with pytest.raises(pk.SchemaVersionError, match="graph-state version 2, newer than this saver's version 1"):
        builder.compile(checkpointer=PersistkitSaver(store)).get_state(cfg(thread))


class TicketV2(BaseModel):
    title: str
    priority: int


def test_pydantic_value_that_no_longer_fits_is_refused_or_handed_to_the_migration(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LangGraph builds a stored model that fails validation with model_construct (no error):
    the saver refuses it, naming class, field and channel; a migration gets its fields as a dict."""
    store, thread = pk.connect(url), uid("lg")
    started(store, thread)

    class Loose(BaseModel):  # Ticket with priority now a label: stored ints do not validate
        title: str
        priority: str

    monkeypatch.setattr(Ticket, "__pydantic_validator__", Loose.__pydantic_validator__)
    monkeypatch.setitem(Ticket.model_fields, "priority", Loose.model_fields["priority"])
    builder, opts = two_step(Old, "notes")
    with pytest.raises(pk.SchemaVersionError) as err:
        builder.compile(checkpointer=PersistkitSaver(store), **opts).get_state(cfg(thread))
    text = str(err.value)
    assert "channel 'tickets'[0]" in text and "Ticket" in text and "priority" in text and thread in text

    saver = PersistkitSaver(store, version=2)

    @saver.migration(from_version=1)
    def relabel(channels: dict[str, Any]) -> dict[str, Any]:
        channels["tickets"] = [
            t if isinstance(t, Ticket) else Ticket.model_construct(title=t["title"], priority=f"P{t['priority']}")
            for t in channels["tickets"]
        ]
        return channels

    state = builder.compile(checkpointer=saver, **opts).get_state(cfg(thread))
    assert [(t.title, t.priority) for t in state.values["tickets"]] == [("t", "P1")]


def test_migration_chain_errors(url: str) -> None:
    store, thread = pk.connect(url), uid("lg")
    with pytest.raises(pk.ConfigurationError, match="version must be an int >= 1"):
        PersistkitSaver(store, version=0)
    saver = PersistkitSaver(store, version=3)
    with pytest.raises(pk.ConfigurationError, match="from_version must be between 1"):
        saver.migration(from_version=3)
    started(store, thread)

    @saver.migration(from_version=2)
    def two(channels: dict[str, Any]) -> dict[str, Any]:
        return channels

    builder, opts = two_step(Old, "notes")
    graph = builder.compile(checkpointer=saver, **opts)
    with pytest.raises(pk.SchemaVersionError, match=r"no migration from version 1 to 2 is registered.*@saver.migration\(from_version=1\)"):
        graph.get_state(cfg(thread))

    @saver.migration(from_version=1)
    def broken(channels: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("memo")

    with pytest.raises(pk.SchemaVersionError, match="broken \\(from version 1\\) failed: KeyError"):
        graph.get_state(cfg(thread))


def test_unchanged_graph_and_other_namespaces_are_not_checked(url: str) -> None:
    """A subgraph's channels are not the root's: only the root namespace is compared."""
    store, thread = pk.connect(url), uid("lg")

    class Inner(TypedDict):
        inner_only: Annotated[list[str], operator.add]

    class Outer(TypedDict):
        items: Annotated[list[str], operator.add]

    sub: StateGraph[Any] = StateGraph(Inner)
    sub.add_node("work", lambda s: {"inner_only": ["x"]})
    sub.add_edge(START, "work")
    sub.add_edge("work", END)
    subgraph = sub.compile()

    def call_sub(state: Outer) -> dict[str, Any]:
        return {"items": subgraph.invoke({"inner_only": []})["inner_only"]}

    outer: StateGraph[Any] = StateGraph(Outer)
    outer.add_node("call", call_sub)
    outer.add_edge(START, "call")
    outer.add_edge("call", END)
    graph = outer.compile(checkpointer=PersistkitSaver(store))
    assert durable_invoke(graph, {"items": []}, cfg(thread))["items"] == ["x"]
    assert durable_invoke(graph, {"items": ["y"]}, cfg(thread))["items"] == ["x", "y", "x"]


# -- CrewAI, in process ---------------------------------------------------------------------------


class Report(BaseModel):
    id: str = ""
    steps: list[str] = []


def test_crewai_flow_state_is_stored_as_the_users_model(tmp_path: Path) -> None:
    pytest.importorskip("crewai")
    from typing import ClassVar

    from crewai.flow.flow import Flow, listen, start
    from crewai.flow.persistence import persist

    from persistkit_crewai import PersistkitFlowPersistence

    store = pk.connect(f"sqlite:///{tmp_path}/flow.db")
    p = PersistkitFlowPersistence(store)

    @persist(p)
    class Small(Flow[Report]):
        _skip_auto_memory: ClassVar[bool] = True

        @start()
        def one(self) -> None:
            self.state.steps.append("one")

        @listen(one)
        def two(self) -> None:
            self.state.steps.append("two")

    flow = Small(suppress_flow_events=True)
    fid = uid("flow")
    flow.kickoff(inputs={"id": fid})
    assert type(flow.state).__name__ == "StateWithId"  # CrewAI's per-instance subclass
    stored = store.get_state(p.thread_id(fid))["state"]
    assert type(stored) is Report and stored.steps == ["one", "two"]
    assert p.load_state(fid) == {"id": fid, "steps": ["one", "two"]}


def test_crewai_legacy_dict_state_that_no_longer_fits_is_a_schema_version_error(tmp_path: Path) -> None:
    pytest.importorskip("crewai")
    from typing import ClassVar

    from crewai.flow.flow import Flow, start

    from persistkit_crewai import PersistkitFlowPersistence

    class Typed(BaseModel):
        id: str = ""
        count: int = 0

    class Counting(Flow[Typed]):
        _skip_auto_memory: ClassVar[bool] = True

        @start()
        def go(self) -> None:
            self.state.count += 1

    store = pk.connect(f"sqlite:///{tmp_path}/flow.db")
    p = PersistkitFlowPersistence(store)
    fid = uid("flow")
    # What an earlier persistkit-crewai stored: the model's JSON dict, no class, no version.
    p._write(fid, {"state": {"id": fid, "count": "many"}, "methods": ["go"]}, "go")
    with pytest.raises(pk.SchemaVersionError, match=r"count: Input should be a valid integer.*Finish the flow"):
        p.restore(Counting(suppress_flow_events=True), fid)
    fid2 = uid("flow")
    p._write(fid2, {"state": {"id": fid2, "count": 3}, "methods": ["go"]}, "go")
    assert p.restore(Counting(suppress_flow_events=True), fid2) is True  # a dict that fits: restored


def test_crewai_state_stored_as_another_model_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("crewai")
    from typing import ClassVar

    from crewai.flow.flow import Flow, start

    from persistkit_crewai import PersistkitFlowPersistence

    class Summary(BaseModel):  # the flow's model after a rename of the class (Report before)
        id: str = ""
        steps: list[str] = []

    class Summarizing(Flow[Summary]):
        _skip_auto_memory: ClassVar[bool] = True

        @start()
        def go(self) -> None:
            self.state.steps.append("go")

    p = PersistkitFlowPersistence(pk.connect(f"sqlite:///{tmp_path}/flow.db"))
    fid = uid("flow")
    p.save_state(fid, "go", Report(id=fid, steps=["go"]))
    with pytest.raises(pk.SchemaVersionError, match=r"stored Report, but the flow's state model is .*Summary"):
        p.restore(Summarizing(suppress_flow_events=True), fid)


def test_crewai_new_process_without_restore_reads_the_stored_fields(tmp_path: Path) -> None:
    """A state model only restore() (or pk.register) names in a new process: without it,
    load_state gives the stored fields (a dict, as CrewAI restores from), with it the same."""
    pytest.importorskip("crewai")
    import subprocess
    import sys

    script = tmp_path / "flow_state.py"
    script.write_text(
        "import sys\n"
        "from pydantic import BaseModel\n"
        "import persistkit as pk\n"
        "from persistkit_crewai import PersistkitFlowPersistence\n"
        "class R(BaseModel):\n    id: str = ''\n    n: int = 0\n"
        f"p = PersistkitFlowPersistence(pk.connect('sqlite:///{tmp_path}/s.db'))\n"
        "if sys.argv[1] == 'write':\n    p.save_state('f', 'm', R(id='f', n=2))\n"
        "else:\n"
        "    if sys.argv[1] == 'registered':\n        pk.register(R)\n"
        "    try:\n        print(p.load_state('f'))\n"
        "    except pk.SerializationError as exc:\n        print('ERROR', exc)\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "adapters")])}

    def run(mode: str) -> str:
        out = subprocess.run([sys.executable, str(script), mode], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.strip()

    run("write")
    assert run("bare") == "{'id': 'f', 'n': 2}"
    assert run("registered") == "{'id': 'f', 'n': 2}"


# -- across processes: every crash position, the migrated code in a new process -------------------

LG_STORES = ["sqlite", "postgres", "redis", "s3"]
CREW_STORES = ["sqlite", "postgres", "redis"]


def cases(framework: str, stores: list[str]) -> list[Any]:
    """Each crash position once, dealt round-robin over the stores (issue #35: each case starts
    two interpreters, a CrewAI one imports crewai for 5-20 s). The positions list the
    in-flight kills before the committed ones (``put:``/``saved:``), so every store gets both
    kinds: what a store does is write and read the records, the same at every position."""
    positions = FRAMEWORKS[framework].positions
    return [pytest.param(stores[i % len(stores)], p, id=f"{stores[i % len(stores)]}-{p}") for i, p in enumerate(positions)]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "position"), cases("langgraph", LG_STORES))
def test_langgraph_state_migrates_across_a_crash_in_a_new_process(
    kind: str, position: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    check(run_case("langgraph", make_url(kind, request, tmp_path_factory), uid("lgm"), position, tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("kind", LG_STORES)
def test_langgraph_without_its_migration_refuses_in_a_new_process(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    url = make_url(kind, request, tmp_path_factory)
    assert "put:b" in refusal_positions("langgraph")
    check_refused(run_case("langgraph", url, uid("lgm"), "put:b", tmp_path, variant="v2-nomigration"))


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "position"), cases("crewai", CREW_STORES))
def test_crewai_flow_state_migrates_across_a_crash_in_a_new_process(
    kind: str, position: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    pytest.importorskip("crewai")
    check(run_case("crewai", make_url(kind, request, tmp_path_factory), uid("crm"), position, tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("kind", CREW_STORES)
def test_crewai_without_its_migration_refuses_in_a_new_process(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    pytest.importorskip("crewai")
    url = make_url(kind, request, tmp_path_factory)
    assert "saved:clean" in refusal_positions("crewai")
    check_refused(run_case("crewai", url, uid("crm"), "saved:clean", tmp_path, variant="v2-nomigration"))


# -- each adapter page's migration block runs as written ------------------------------------------


@pytest.mark.parametrize(
    ("page", "heading", "last_line"),
    [
        ("adapters-langgraph.md", "## Migrating graph state",
         "['drafted', 'reviewed'] [Ticket(title='refund', priority=1)] ['draft done', 'review done']"),
        ("adapters-crewai.md", "### Migrating flow state", "['research', 'publish'] 2"),
    ],
)
def test_adapter_page_migration_block_runs(page: str, heading: str, last_line: str, tmp_path: Path) -> None:
    import re
    import subprocess
    import sys

    if "crewai" in page:
        pytest.importorskip("crewai")
    text = (Path(__file__).resolve().parents[2] / "docs" / page).read_text()
    block = re.search(re.escape(heading) + r"\n.*?```python\n(.*?)```", text, re.S)
    assert block is not None
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "PERSISTKIT_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "adapters")])
    out = subprocess.run([sys.executable, "-c", block.group(1)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == last_line, out.stdout[-2000:]
    if "langgraph" in page:
        assert "refused: " in out.stdout and "['notes']" in out.stdout
