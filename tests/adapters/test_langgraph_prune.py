"""PersistkitSaver.prune and delete_for_runs on real graphs: what stays still loads, a deleted
latest run rolls the thread back, an interrupted delete is hidden and finished by the next.

On a store without the prune capability (yet) every test here says it waits for it."""

from __future__ import annotations

import asyncio
import operator
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from conftest import make_url, uid

pytest.importorskip("langgraph.checkpoint.conformance")

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
from langgraph.graph import END, START, StateGraph

import persistkit as pk
from persistkit_langgraph import PersistkitSaver, durable_invoke

CUT = "langgraph_cut"


class State(TypedDict):
    items: Annotated[list[str], operator.add]


def graph_of(saver: PersistkitSaver) -> Any:
    """START -> a -> b -> END; each node appends ``<node>:<turn>`` (the input's last item)."""
    builder: StateGraph[Any] = StateGraph(State)
    builder.add_node("a", lambda s: {"items": [f"a:{s['items'][-1]}"]})
    builder.add_node("b", lambda s: {"items": [f"b:{s['items'][-1].split(':')[1]}"]})
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", END)
    return builder.compile(checkpointer=saver)


@pytest.fixture(params=["memory", "sqlite", "postgres", "redis", "s3"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    url = make_url(request.param, request, tmp_path_factory, isolated=True)
    with pk.connect(url) as store:
        if not store.backend.supports_prune:
            pytest.skip(f"depends on the prune capability of the {request.param} store (issue 23: not there yet)")
    return url


MAC = bytes(range(7, 39))


@pytest.fixture
def witness(tmp_path: Path) -> str:
    return f"file:{tmp_path}/witness.log"


@pytest.fixture
def saver(url: str, witness: str) -> Iterator[PersistkitSaver]:
    """With integrity on: the hash chain must survive the deletions (store.verify)."""
    with PersistkitSaver.from_url(url, integrity={"m": MAC}, witness=witness) as s:
        yield s


def turn(graph: Any, thread_id: str, name: str, run_id: str) -> dict[str, Any]:
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}, "metadata": {"run_id": run_id}}
    out: dict[str, Any] = graph.invoke({"items": [name]}, config)
    return out


def cfg(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}}


def runs_of(graph: Any, thread_id: str) -> list[str]:
    return [s.metadata["run_id"] for s in graph.get_state_history(cfg(thread_id))]


def rows(saver: PersistkitSaver, thread_id: str, ns: str = "") -> list[pk.Checkpoint]:
    return saver.store.history(thread_id, namespace="lg:c:" + ns)


def test_delete_latest_run_rolls_back(saver: PersistkitSaver, url: str, witness: str) -> None:
    graph, t = graph_of(saver), uid("lg")
    turn(graph, t, "1", "r1")
    turn(graph, t, "2", "r2")
    before_r2 = [s.values for s in graph.get_state_history(cfg(t)) if s.metadata["run_id"] == "r1"]
    saver.delete_for_runs(["r2"])
    assert set(runs_of(graph, t)) == {"r1"}
    assert [s.values for s in graph.get_state_history(cfg(t))] == before_r2
    assert graph.get_state(cfg(t)).values["items"] == ["1", "a:1", "b:1"]
    # the next turn goes on from there, through this saver and through a fresh one
    assert turn(graph, t, "3", "r3")["items"] == ["1", "a:1", "b:1", "3", "a:3", "b:3"]
    with PersistkitSaver.from_url(url, integrity={"m": MAC}, witness=witness) as other:
        assert turn(graph_of(other), t, "4", "r4")["items"][-3:] == ["4", "a:4", "b:4"]
    # stored: the marker and the kept checkpoints' copies, nothing of r2
    stored = rows(saver, t)
    assert sum(CUT in cp.metadata for cp in stored) == 1
    assert len(stored) == len(runs_of(graph, t)) + 1
    assert saver.store.verify(t).ok


def test_delete_middle_run_keeps_what_stays_loadable(saver: PersistkitSaver) -> None:
    graph, t, other = graph_of(saver), uid("lg"), uid("lg")
    for i in (1, 2, 3):
        turn(graph, t, str(i), f"r{i}")
    turn(graph, other, "x", "r2")  # the run id in another thread goes too
    turn(graph, other, "y", "keep")
    expected = {s.config["configurable"]["checkpoint_id"]: s.values for s in graph.get_state_history(cfg(t))
                if s.metadata["run_id"] != "r2"}
    saver.delete_for_runs(["r2"])
    history = list(graph.get_state_history(cfg(t)))
    assert {s.config["configurable"]["checkpoint_id"]: s.values for s in history} == expected
    assert [s.metadata["step"] for s in history] == sorted((s.metadata["step"] for s in history), reverse=True)
    assert graph.get_state(cfg(t)).values["items"] == ["1", "a:1", "b:1", "2", "a:2", "b:2", "3", "a:3", "b:3"]
    assert set(runs_of(graph, other)) == {"keep"}
    assert saver.store.verify(t).ok
    saver.delete_for_runs(["r1", "r3"])  # every checkpoint of the thread: the thread goes
    assert t not in saver.store.threads(prefix=t)


def test_secret_looking_run_id(saver: PersistkitSaver) -> None:
    """LangGraph's metadata is redacted like any value: a random-looking run id is stored as a
    handle. delete_for_runs matches the digest the saver keeps beside it."""
    graph, t = graph_of(saver), uid("lg")
    token = "run_" + secrets.token_urlsafe(24)
    turn(graph, t, "1", "r1")
    turn(graph, t, "2", token)
    saver.delete_for_runs([token])
    assert set(runs_of(graph, t)) == {"r1"}


def test_prune_keep_latest_on_a_graph(saver: PersistkitSaver) -> None:
    graph, t, other = graph_of(saver), uid("lg"), uid("lg")
    turn(graph, t, "1", "r1")
    turn(graph, t, "2", "r2")
    turn(graph, other, "1", "r1")
    old = [s.config["configurable"]["checkpoint_id"] for s in graph.get_state_history(cfg(t))][1:]
    saver.prune([t])
    (only,) = graph.get_state_history(cfg(t))
    assert only.values["items"] == ["1", "a:1", "b:1", "2", "a:2", "b:2"]
    assert len(rows(saver, t)) == 1
    for lg_id in old:  # the pending writes of the checkpoints that went: emptied, one row left
        space = f"lg:w:{lg_id}:"
        try:
            writes = saver.store.get_state(t, namespace=space)
        except pk.NotFoundError:
            continue
        assert set(writes.values()) == {None}
        assert len(saver.store.history(t, namespace=space)) == 1
    assert len(list(graph.get_state_history(cfg(other)))) == 4  # not named: untouched
    assert saver.store.verify(t).ok
    assert turn(graph, t, "3", "r3")["items"][-3:] == ["3", "a:3", "b:3"]
    saver.prune([t, other], strategy="delete")
    assert graph.get_state(cfg(t)).values == {} and graph.get_state(cfg(other)).values == {}


def test_interrupted_delete_is_hidden_and_finished(saver: PersistkitSaver, monkeypatch: pytest.MonkeyPatch) -> None:
    graph, t = graph_of(saver), uid("lg")
    for i in (1, 2, 3):
        turn(graph, t, str(i), f"r{i}")
    expected = [s.values for s in graph.get_state_history(cfg(t)) if s.metadata["run_id"] != "r2"]

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise pk.BackendError("the process died before the prune")

    with monkeypatch.context() as m:
        m.setattr(saver.store, "prune", crash)
        with pytest.raises(pk.BackendError):
            saver.delete_for_runs(["r2"])
    # rewritten but not yet deleted: the deleted run and the originals are hidden
    assert len(rows(saver, t)) > len(expected) + 1
    assert [s.values for s in graph.get_state_history(cfg(t))] == expected
    saver.delete_for_runs(["r2"])  # again: finishes the work
    assert [s.values for s in graph.get_state_history(cfg(t))] == expected
    assert len(rows(saver, t)) == len(expected) + 1
    assert saver.store.verify(t).ok


def test_emptied_namespace_takes_new_checkpoints(saver: PersistkitSaver) -> None:
    """A namespace all of whose checkpoints went keeps only the marker: it reads as empty, and
    a run's first put there goes on top of it."""
    t = uid("lg")

    def put(ns: str, run: str, parent: str | None = None, running: bool = False) -> str:
        conf: dict[str, Any] = {"thread_id": t, "checkpoint_ns": ns}
        if parent:
            conf["checkpoint_id"] = parent
        if running:
            conf["__pregel_task_id"] = "task"
        out = saver.put({"configurable": conf}, generate_checkpoint(), generate_metadata(run_id=run), {})
        return str(out["configurable"]["checkpoint_id"])

    put("", "keep")
    put("child:1", "gone", parent=put("child:1", "gone"))
    saver.delete_for_runs(["gone"])
    child: RunnableConfig = {"configurable": {"thread_id": t, "checkpoint_ns": "child:1"}}
    assert saver.get_tuple(child) is None and list(saver.list(child)) == []
    assert [cp.metadata.get(CUT) for cp in rows(saver, t, "child:1")] == [[pk_digest("gone")]]
    new = put("child:1", "next", running=True)
    tup = saver.get_tuple(child)
    assert tup is not None and tup.config["configurable"]["checkpoint_id"] == new
    assert [tup.metadata["run_id"] for tup in saver.list({"configurable": {"thread_id": t}})] == ["keep", "next"]


def test_async_twins(saver: PersistkitSaver) -> None:
    graph, t = graph_of(saver), uid("lg")

    async def main() -> None:
        for i in (1, 2):
            config: RunnableConfig = {"configurable": {"thread_id": t}, "metadata": {"run_id": f"r{i}"}}
            await graph.ainvoke({"items": [str(i)]}, config)
        await saver.adelete_for_runs(["r1"])
        assert {s.metadata["run_id"] async for s in graph.aget_state_history(cfg(t))} == {"r2"}
        await saver.aprune([t])
        assert [s.values["items"] async for s in graph.aget_state_history(cfg(t))] == [
            ["1", "a:1", "b:1", "2", "a:2", "b:2"]
        ]

    asyncio.run(main())


def test_bad_arguments(saver: PersistkitSaver) -> None:
    with pytest.raises(pk.ConfigurationError, match="keep_latest"):
        saver.prune([uid("lg")], strategy="keep_last")
    with pytest.raises(pk.ConfigurationError, match="list of ids"):
        saver.prune("thread-1")
    with pytest.raises(pk.ConfigurationError, match="list of ids"):
        saver.delete_for_runs("run-1")


def pk_digest(run_id: str) -> str:
    from persistkit_langgraph._plans import run_digest

    return run_digest(run_id)


def test_abandoned_turn_keeps_its_last_checkpoint(saver: PersistkitSaver) -> None:
    """keep_latest keeps the checkpoint behind an abandon record (the next turn starts on it);
    delete_for_runs refuses to rewrite a namespace under one, changing nothing."""
    calls = {"fail": False}

    def b(state: State) -> dict[str, Any]:
        if calls["fail"]:
            raise RuntimeError("b failed")
        return {"items": ["b"]}

    builder: StateGraph[Any] = StateGraph(State)
    builder.add_node("a", lambda s: {"items": ["a"]})
    builder.add_node("b", b)
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", END)
    graph = builder.compile(checkpointer=saver)
    t = uid("lg")
    config: RunnableConfig = {"configurable": {"thread_id": t}, "metadata": {"run_id": "r1"}}
    durable_invoke(graph, {"items": ["1"]}, config, run_id="turn-1")
    calls["fail"] = True
    with pytest.raises(RuntimeError, match="b failed"):
        durable_invoke(graph, {"items": ["2"]}, {**config, "metadata": {"run_id": "r2"}}, run_id="turn-2")
    saver.store.abandon(t, "turn-2", namespace="lg:c:")
    before = graph.get_state(cfg(t))
    assert before.metadata["persistkit_abandoned"] is True
    stored = rows(saver, t)
    with pytest.raises(pk.ConfigurationError, match="abandoned"):
        saver.delete_for_runs(["r1"])
    assert [cp.checkpoint_id for cp in rows(saver, t)] == [cp.checkpoint_id for cp in stored]
    saver.prune([t])
    assert len(rows(saver, t)) == 2  # the abandon record and the checkpoint behind it
    after = graph.get_state(cfg(t))
    assert after.values == before.values and after.metadata["persistkit_abandoned"] is True
    calls["fail"] = False
    out = durable_invoke(graph, {"items": ["3"]}, cfg(t), run_id="turn-3")
    assert out["items"] == ["1", "a", "b", "2", "a", "3", "a", "b"]
    assert saver.store.verify(t).ok
