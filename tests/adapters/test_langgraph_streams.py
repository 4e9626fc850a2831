"""``durable_invoke(..., stream=)``: a durable LangGraph turn's ``messages``-mode chunks go
into a persistkit stream, one persistkit step per superstep (docs/adapters-langgraph.md,
Streaming). Offline: langchain's ``GenericFakeChatModel``; no network."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langgraph", reason="langgraph is not installed")

from conftest import make_url, uid
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from stream_checks import check_offsets, final, records, rewinds, shown

import persistkit as pk
from persistkit_langgraph import PersistkitSaver, durable_invoke

PLAN = "Plan: look it up."
ANSWER = "Durable answers survive a crash."
NS = "lg:s:"


class Script:
    """Two nodes: ``plan`` answers at once (a model called without streaming: one chunk),
    ``answer`` streams ``ANSWER`` token by token; ``fail_at``: it raises after that many
    chunks, once."""

    def __init__(self, fail_at: int = -1) -> None:
        self.fail_at = fail_at
        self.runs: list[str] = []

    def plan(self, state: MessagesState) -> dict[str, Any]:
        self.runs.append("plan")
        model = GenericFakeChatModel(messages=iter([AIMessage(content=PLAN)]))
        return {"messages": [model.invoke(state["messages"])]}

    def answer(self, state: MessagesState) -> dict[str, Any]:
        self.runs.append("answer")
        model = GenericFakeChatModel(messages=iter([AIMessage(content=ANSWER)]))
        chunks: list[AIMessageChunk] = []
        for i, chunk in enumerate(model.stream(state["messages"])):
            if i == self.fail_at:
                self.fail_at = -1
                raise RuntimeError("the model's connection dropped mid-answer")
            chunks.append(chunk)
        whole = chunks[0]
        for c in chunks[1:]:
            whole = whole + c
        return {
            "messages": [whole]
        }  # the streamed message itself (its id: LangGraph sends it once)

    def graph(self, store: pk.Store) -> Any:
        builder: StateGraph[Any] = StateGraph(MessagesState)
        builder.add_node("plan", self.plan)
        builder.add_node("answer", self.answer)
        builder.add_edge(START, "plan")
        builder.add_edge("plan", "answer")
        builder.add_edge("answer", END)
        return builder.compile(checkpointer=PersistkitSaver(store))


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


def texts(events: list[Any], node: str) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "text" and e["node"] == node)


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def test_a_streamed_turn_forwards_the_models_chunks_superstep_by_superstep(url: str) -> None:
    script, thread = Script(), uid("lg-stream")
    with pk.connect(url) as store:
        out = durable_invoke(
            script.graph(store), {"messages": [HumanMessage("hi")]}, cfg(thread), stream="answer"
        )
        assert out["messages"][-1].content == ANSWER
        recs = records(store, thread, namespace=NS)
        check_offsets(recs)
        events = [r.data for r in recs if r.kind == "event"]
        assert texts(events, "plan") == PLAN and texts(events, "answer") == ANSWER
        assert sum(1 for e in events if e["node"] == "answer") > 3  # token by token
        assert not rewinds(recs) and recs[-1].kind == "end"
        assert final(store, thread, namespace=NS) == events
        # each superstep is a step: the plan's chunks and the answer's come from two of them
        assert len({r.step for r in recs if r.kind == "event"}) == 2


def test_a_superstep_that_fails_mid_answer_is_rewound_and_its_rerun_streams_once(url: str) -> None:
    script, thread = Script(fail_at=3), uid("lg-stream")
    with pk.connect(url) as store:
        graph = script.graph(store)
        with pytest.raises(RuntimeError, match="dropped mid-answer"):
            durable_invoke(
                graph,
                {"messages": [HumanMessage("hi")]},
                cfg(thread),
                run_id="m-1",
                stream="answer",
            )
        partial = [r.data for r in records(store, thread, namespace=NS) if r.kind == "event"]
        assert texts(partial, "plan") == PLAN and 0 < len(texts(partial, "answer")) < len(ANSWER)
        out = durable_invoke(
            graph, {"messages": [HumanMessage("hi")]}, cfg(thread), run_id="m-1", stream="answer"
        )
        assert out["messages"][-1].content == ANSWER
        assert script.runs == ["plan", "answer", "answer"]  # the plan's superstep is not run again
        recs = records(store, thread, namespace=NS)
        check_offsets(recs)
        [rewind] = rewinds(recs)
        kept = [r.data for r in recs if r.kind == "event" and r.offset <= (rewind.to or 0)]
        assert texts(kept, "plan") == PLAN and texts(kept, "answer") == ""
        ui = shown(recs)
        assert texts(ui, "plan") == PLAN and texts(ui, "answer") == ANSWER
        assert final(store, thread, namespace=NS) == ui


def test_the_async_turn_streams_too(url: str) -> None:
    import asyncio

    from persistkit_langgraph import adurable_invoke

    script, thread = Script(fail_at=2), uid("lg-stream")
    with pk.connect(url) as store:
        graph = script.graph(store)
        with pytest.raises(RuntimeError, match="dropped mid-answer"):
            asyncio.run(
                adurable_invoke(
                    graph,
                    {"messages": [HumanMessage("hi")]},
                    cfg(thread),
                    run_id="m-1",
                    stream="answer",
                )
            )
        out = asyncio.run(
            adurable_invoke(
                graph,
                {"messages": [HumanMessage("hi")]},
                cfg(thread),
                run_id="m-1",
                stream="answer",
            )
        )
        assert out["messages"][-1].content == ANSWER
        recs = records(store, thread, namespace=NS)
        assert len(rewinds(recs)) == 1 and texts(shown(recs), "answer") == ANSWER
        assert final(store, thread, namespace=NS) == shown(recs)


def test_stream_needs_the_persistkit_saver_and_a_good_name(url: str) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    builder: StateGraph[Any] = StateGraph(MessagesState)
    builder.add_node("plan", Script().plan)
    builder.add_edge(START, "plan")
    with pytest.raises(pk.ConfigurationError, match="PersistkitSaver"):
        durable_invoke(
            builder.compile(checkpointer=InMemorySaver()),
            {"messages": []},
            cfg(uid("lg")),
            stream="answer",
        )
    with pk.connect(url) as store, pytest.raises(pk.ConfigurationError, match="stream name"):
        durable_invoke(Script().graph(store), {"messages": []}, cfg(uid("lg")), stream="a b")


@pytest.mark.slow
# one store per framework, dealt over SQLite and PostgreSQL across the four adapters (#35):
# the stream's rewind across a crash is checked on every store by the stream conformance suite
@pytest.mark.parametrize("kind", ["postgres"])
def test_a_worker_sigkilled_mid_answer_is_rewound_and_the_next_worker_streams_the_answer(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    worker = Path(__file__).with_name("langgraph_stream_worker.py")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parents[2] / "adapters"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    url, thread = make_url(kind, request, tmp_path_factory), uid("lg-kill")

    def worker_run(kill_at: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(worker), url, thread, "m-1", str(kill_at)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )

    first = worker_run(4)  # dies once four of the answer's chunks are in the store
    assert first.returncode == -signal.SIGKILL, first.stderr
    with pk.connect(url) as store:
        died = records(store, thread, namespace=NS)
        assert texts([r.data for r in died if r.kind == "event"], "plan") == PLAN
        assert sum(1 for r in died if r.kind == "event" and r.data["node"] == "answer") >= 4
        assert died[-1].kind == "event"  # no end: the worker died
    second = worker_run(-1)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == ANSWER
    with pk.connect(url) as store:
        recs = records(store, thread, namespace=NS)
        check_offsets(recs)
        [rewind] = rewinds(recs)
        assert rewind.offset == len(died) + 1
        ui = shown(recs)
        assert texts(ui, "plan") == PLAN and texts(ui, "answer") == ANSWER
        assert final(store, thread, namespace=NS) == ui


class _Killed(BaseException):
    """Stands for a process that dies: nothing more is written."""


def test_a_kill_after_langgraphs_checkpoint_but_before_the_step_committed_keeps_that_superstep_once(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from persistkit_langgraph import _stream

    real, armed = _stream._forward, [True]

    def forward(source: Any, mode: str, data: Any, last: str | None) -> str | None:
        done = real(source, mode, data, last)
        if armed and mode == "checkpoints" and data.get("next") == ["answer"]:
            armed.clear()  # LangGraph wrote the plan's checkpoint; the step that read it dies now
            run = pk.current_run()
            assert run is not None and run._streams is not None
            run._streams.flush()  # what it emitted reached the store before the kill
            run._streams.stop(drop=True)  # and a killed process writes nothing more
            raise _Killed
        return done

    monkeypatch.setattr(_stream, "_forward", forward)
    script, thread = Script(), uid("lg-stream")
    with pk.connect(url) as store:
        graph = script.graph(store)
        with pytest.raises(_Killed):
            durable_invoke(
                graph,
                {"messages": [HumanMessage("hi")]},
                cfg(thread),
                run_id="m-1",
                stream="answer",
            )
        out = durable_invoke(
            graph, {"messages": [HumanMessage("hi")]}, cfg(thread), run_id="m-1", stream="answer"
        )
        assert out["messages"][-1].content == ANSWER
        assert script.runs == ["plan", "answer"]  # LangGraph did not run the plan again
        recs = records(store, thread, namespace=NS)
        check_offsets(recs)
        [rewind] = rewinds(recs)  # the plan's chunks were tentative: taken back, then sent again
        again = [r.data for r in recs if r.kind == "event" and r.offset > rewind.offset]
        assert texts(again, "plan") == PLAN
        ui = shown(recs)
        assert texts(ui, "plan") == PLAN and texts(ui, "answer") == ANSWER
        assert final(store, thread, namespace=NS) == ui
