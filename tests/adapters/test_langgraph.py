"""LangGraph checkpointer over persistkit: LangGraph's conformance suite, real graphs, crashes."""

from __future__ import annotations

import asyncio
import json
import operator
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from conftest import make_url, uid

pytest.importorskip("langgraph.checkpoint.conformance")

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import DetectedCapabilities
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

import persistkit as pk
from persistkit.backends import CheckpointRow, Head
from persistkit.backends.memory import MemoryBackend
from persistkit_langgraph import PersistkitSaver, adurable_invoke, durable_invoke

ROOT = Path(__file__).resolve().parents[2]
BASE = {"put", "put_writes", "get_tuple", "list", "delete_thread"}
PRUNING = {"prune", "delete_for_runs"}  # through store.prune: the store's prune capability
CLAIMED = BASE | {"copy_thread"} | PRUNING


# -- LangGraph's published conformance suite --------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres", "redis", "s3"])
def test_conformance(kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every capability LangGraph's suite knows is claimed; all pass on a store with the prune
    capability. On a store without it (yet), prune and delete_for_runs are run by
    test_conformance_pruning, which says so instead of passing."""
    url = make_url(kind, request, tmp_path_factory, isolated=True)  # delete_for_runs lists the whole store
    prunable = _prunable(url)

    @checkpointer_test(name=f"PersistkitSaver[{kind}]")
    async def factory() -> Any:
        saver = PersistkitSaver.from_url(url)
        yield saver
        saver.close()

    report = asyncio.run(validate(factory, capabilities=CLAIMED if prunable else CLAIMED - PRUNING))
    detected = {cap for cap, result in report.results.items() if result.detected}
    assert detected == (CLAIMED if prunable else CLAIMED - PRUNING)
    assert DetectedCapabilities.from_instance(PersistkitSaver(pk.connect("memory://"))).detected == CLAIMED
    failures = {cap: r.failures for cap, r in report.results.items() if r.detected and not r.passed}
    assert not failures, failures
    assert all(report.results[cap].tests_passed > 0 for cap in detected)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres", "redis", "s3"])
def test_conformance_pruning(kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
    """prune and delete_for_runs depend on the store's prune capability (store.prune): where it
    is missing they refuse with a ConfigurationError naming it, and this test says it is
    waiting for the capability; where it is there, LangGraph's suites for them pass."""
    url = make_url(kind, request, tmp_path_factory, isolated=True)
    if not _prunable(url):
        with PersistkitSaver.from_url(url) as saver:
            with pytest.raises(pk.ConfigurationError, match="prune capability"):
                saver.prune([uid("lg")])
            with pytest.raises(pk.ConfigurationError, match="prune capability"):
                saver.delete_for_runs(["run-1"])
            saver.prune([uid("lg")], strategy="delete")  # whole threads: every store
            saver.delete_for_runs([])
        pytest.skip(f"depends on the prune capability of the {kind} store (issue 23: not there yet)")

    @checkpointer_test(name=f"PersistkitSaver[{kind}]")
    async def factory() -> Any:
        saver = PersistkitSaver.from_url(url)
        yield saver
        saver.close()

    report = asyncio.run(validate(factory, capabilities=PRUNING))
    for cap in PRUNING:
        result = report.results[cap]
        assert result.detected and result.passed, (cap, result.failures)
        assert result.tests_passed >= 7


def _prunable(url: str) -> bool:
    with pk.connect(url) as store:
        return bool(store.backend.supports_prune)


# -- real graphs ------------------------------------------------------------------------------------


class State(TypedDict):
    items: Annotated[list[str], operator.add]


def chain(calls: Counter[str], *names: str, ask: str | None = None) -> StateGraph[Any]:
    """START -> names[0] -> ... -> END; each node appends its name; ``ask`` interrupts first."""
    builder: StateGraph[Any] = StateGraph(State)

    def node(name: str) -> Any:
        def run(state: State) -> dict[str, Any]:
            calls[name] += 1
            if name == ask:
                answer = interrupt({"question": f"may {name} run?"})
                return {"items": [f"{name}:{answer}"]}
            return {"items": [name]}

        return run

    prev = START
    for name in names:
        builder.add_node(name, node(name))
        builder.add_edge(prev, name)
        prev = name
    builder.add_edge(prev, END)
    return builder


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


@pytest.fixture
def saver(url: str) -> Iterator[PersistkitSaver]:
    with PersistkitSaver.from_url(url) as s:
        yield s


def cfg(thread_id: str, **extra: Any) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, **extra}}


def test_graph_run_and_time_travel(saver: PersistkitSaver) -> None:
    calls: Counter[str] = Counter()
    graph = chain(calls, "a", "b", "c").compile(checkpointer=saver)
    config = cfg(uid("lg"))
    assert graph.invoke({"items": []}, config)["items"] == ["a", "b", "c"]
    assert graph.get_state(config).values["items"] == ["a", "b", "c"]

    history = list(graph.get_state_history(config))
    assert [s.next for s in history] == [(), ("c",), ("b",), ("a",), ("__start__",)]
    assert [s.metadata["step"] for s in history if s.metadata] == [3, 2, 1, 0, -1]
    before_b = history[2]
    assert before_b.values["items"] == ["a"]

    # Replaying from a past checkpoint re-runs only what came after it, on a new branch.
    assert graph.invoke(None, before_b.config)["items"] == ["a", "b", "c"]
    assert calls == Counter(a=1, b=2, c=2)
    head = graph.get_state(config)
    assert head.parent_config is not None
    assert head.values["items"] == ["a", "b", "c"]
    # The old branch is intact and still addressable.
    assert graph.get_state(history[0].config).values["items"] == ["a", "b", "c"]
    assert len(list(graph.get_state_history(config))) == 5 + 3

    # update_state at a past checkpoint forks from it; resuming runs the rest on the edit.
    edited = graph.update_state(before_b.config, {"items": ["edited"]}, as_node="a")
    assert graph.get_state(edited).values["items"] == ["a", "edited"]
    assert graph.invoke(None, edited)["items"] == ["a", "edited", "b", "c"]
    assert calls == Counter(a=1, b=3, c=3)


def test_interrupt_and_resume_in_another_saver(url: str) -> None:
    calls: Counter[str] = Counter()
    builder = chain(calls, "draft", "send", ask="send")
    config = cfg(uid("lg"))
    with PersistkitSaver.from_url(url) as first:
        out = builder.compile(checkpointer=first).invoke({"items": []}, config)
        assert out["__interrupt__"][0].value == {"question": "may send run?"}
    with PersistkitSaver.from_url(url) as second:  # a later process: only the store is shared
        graph = builder.compile(checkpointer=second)
        state = graph.get_state(config)
        assert state.next == ("send",)
        assert state.tasks[0].interrupts[0].value == {"question": "may send run?"}
        out = graph.invoke(Command(resume="yes"), config)
    assert out["items"] == ["draft", "send:yes"]
    assert calls == Counter(draft=1, send=2)  # the interrupted node re-runs; the one before does not


def test_async_graph_with_parallel_branches_and_subgraph(saver: PersistkitSaver) -> None:
    calls: Counter[str] = Counter()
    sub = chain(calls, "sub1", "sub2", ask="sub2").compile()
    builder: StateGraph[Any] = StateGraph(State)
    for name in ("left", "right"):
        builder.add_node(name, lambda s, n=name: calls.update([n]) or {"items": [n]})
    builder.add_node("inner", sub)
    builder.add_edge(START, "left")
    builder.add_edge(START, "right")
    builder.add_edge(["left", "right"], "inner")
    builder.add_edge("inner", END)
    graph = builder.compile(checkpointer=saver)
    config = cfg(uid("lg"))

    async def scenario() -> dict[str, Any]:
        out = await graph.ainvoke({"items": []}, config)
        assert "__interrupt__" in out
        state = await graph.aget_state(config, subgraphs=True)
        assert state.tasks[0].state is not None  # the subgraph's own checkpoint (child namespace)
        # This thread's every namespace (no checkpoint_ns): alist(None) would read every thread
        # of the shared test schema, other tests' newer graph-state versions included.
        this_thread = {"configurable": {"thread_id": config["configurable"]["thread_id"]}}
        namespaces = {t.config["configurable"]["checkpoint_ns"] async for t in saver.alist(this_thread)}
        assert "" in namespaces and any(ns.startswith("inner:") for ns in namespaces)
        result: dict[str, Any] = await graph.ainvoke(Command(resume="ok"), config)
        return result

    out = asyncio.run(scenario())
    assert sorted(out["items"][:2]) == ["left", "right"]
    assert out["items"][2:] == ["left", "right", "sub1", "sub2:ok"][-len(out["items"][2:]) :]
    assert calls["left"] == calls["right"] == calls["sub1"] == 1
    assert calls["sub2"] == 2


def test_copy_and_delete_thread(saver: PersistkitSaver) -> None:
    calls: Counter[str] = Counter()
    graph = chain(calls, "a", "b").compile(checkpointer=saver)
    src, dst = uid("lg"), uid("lg")
    graph.invoke({"items": []}, cfg(src))
    saver.copy_thread(src, dst)
    src_ids = [t.checkpoint["id"] for t in saver.list(cfg(src))]
    assert [t.checkpoint["id"] for t in saver.list(cfg(dst))] == src_ids
    assert graph.get_state(cfg(dst)).values == {"items": ["a", "b"]}
    saver.delete_thread(src)
    assert saver.get_tuple(cfg(src)) is None
    assert list(saver.list(cfg(src))) == []
    assert graph.get_state(cfg(dst)).values == {"items": ["a", "b"]}


# -- storage cost -------------------------------------------------------------------------------------


class Counting(MemoryBackend):
    """Counts the bytes each write carries."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[int] = []

    def write(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int) -> Head:
        self.writes.append(len(row.payload) + sum(len(b) for b in blobs.values()))
        return super().write(row, blobs, expected_version)


class Chat(TypedDict):
    doc: str
    messages: Annotated[list[str], operator.add]
    turns: int


def test_unchanged_channels_are_not_rewritten() -> None:
    """A 200 KB document and a growing history: each step writes about one message."""
    backend = Counting()
    saver = PersistkitSaver(pk.connect(backend))
    builder: StateGraph[Any] = StateGraph(Chat)
    builder.add_node("talk", lambda s: {"messages": [os.urandom(512).hex()], "turns": s["turns"] + 1})
    builder.add_edge(START, "talk")
    builder.add_conditional_edges("talk", lambda s: END if s["turns"] >= 30 else "talk")
    graph = builder.compile(checkpointer=saver)
    doc = os.urandom(100_000).hex()
    out = graph.invoke({"doc": doc, "messages": [], "turns": 0}, cfg(uid("lg")), durability="sync")
    assert out["turns"] == 30 and len(out["messages"]) == 30 and out["doc"] == doc
    state_size = len(doc) + sum(map(len, out["messages"]))
    assert state_size > 230_000
    # LangGraph hands the document over three times before the first step: the input checkpoint
    # (__start__), the input task's pending write, the first checkpoint with a doc channel.
    # After that no write carries it again. (Their positions among the first writes vary: LangGraph
    # saves pending writes from a background thread, so small writes may land in between.)
    big = [i for i, n in enumerate(backend.writes) if n > 50_000]
    assert len(big) == 3 and big[-1] < 8, backend.writes[:8]
    later = backend.writes[big[-1] + 1 :]
    assert len(later) >= 56  # a checkpoint and a pending-writes record per step (a few may come earlier)
    assert max(later) < 4_000, sorted(later)[-5:]  # ~1 KB message + bookkeeping, never the 200 KB doc
    assert sum(later) < state_size  # all 30 steps together write less than one copy of the state


# -- crash: a real process killed mid-graph -----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_sigkill_mid_superstep_resumes_without_rerunning_finished_nodes(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    url = make_url(kind, request, tmp_path_factory)
    log = tmp_path / "calls.log"
    script = ROOT / "tests" / "adapters" / "langgraph_crash_graph.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "adapters"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(script), url, uid("lg"), str(log)]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == -9, first.stderr  # died by SIGKILL, inside the slow node
    assert Counter(log.read_text().split()) == Counter(plan=1, fast=1, slow=1)
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout) == ["plan", "fast", "slow", "finish"]
    # plan's checkpoint and fast's pending writes replayed; slow was in flight and ran again.
    assert Counter(log.read_text().split()) == Counter(plan=1, fast=1, slow=2, finish=1)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "durability", "kill"),
    [("sqlite", mode, kill) for mode in ("exit", "async", "sync") for kill in "acd"]
    + [("sqlite", "sync", "put:b"), ("postgres", "sync", "put:c"), ("postgres", "async", "c")],
)
def test_durable_invoke_after_a_crash_in_each_durability_mode(
    kind: str, durability: str, kill: str,
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
) -> None:
    """Instant nodes a b c d, the process killed in one: the same call again finishes the run once.

    Never LangGraph's EmptyInputError (nothing committed: the input starts the run again),
    never the turn appended twice (a b c a b c d); "sync" re-runs only the node in flight.
    """
    url = make_url(kind, request, tmp_path_factory)
    log, thread = tmp_path / "calls.log", uid("lg")
    script = ROOT / "tests" / "adapters" / "langgraph_durability_graph.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "adapters"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(script), "persistkit", url, thread, str(log), durability, kill]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == -9, first.stderr
    ran_before = log.read_text().split()
    node = kill.removeprefix("put:")  # "put:b": died after b's writes, before the checkpoint after b
    assert ran_before == list("abcd"[: "abcd".index(node) + 1])
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout) == {"items": ["a", "b", "c", "d"]}
    rerun = log.read_text().split()[len(ran_before) :]
    assert rerun == list("abcd"[4 - len(rerun) :])  # a suffix of the graph, each node once
    if kill.startswith("put:"):  # b's writes were committed: b is not run again
        assert rerun == list("abcd"["abcd".index(node) + 1 :])
    else:
        assert kill in rerun
    if durability == "sync" and node == kill:
        assert rerun == list("abcd"["abcd".index(kill) :])  # only the node in flight, then the rest


def test_durable_invoke_continues_starts_and_refuses_an_empty_thread(saver: PersistkitSaver) -> None:
    calls: Counter[str] = Counter()
    graph = chain(calls, "draft", "send", ask="send").compile(checkpointer=saver)
    config = cfg(uid("lg"))
    with pytest.raises(pk.NotFoundError, match="no committed checkpoint"):
        durable_invoke(graph, None, config)
    out = durable_invoke(graph, {"items": []}, config)
    assert "__interrupt__" in out  # an interrupt is not a crash: the input is not re-applied ...
    out = durable_invoke(graph, Command(resume="yes"), config)  # ... and Command passes through
    assert out["items"] == ["draft", "send:yes"]
    out = asyncio.run(adurable_invoke(graph, {"items": ["next"]}, config))  # a finished run: a new turn
    assert out["items"][:3] == ["draft", "send:yes", "next"]
    assert calls == Counter(draft=2, send=3)


@pytest.mark.slow
def test_documented_setup_gives_secrets_back_in_a_new_process(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """docs/adapters-langgraph.md: from_env in every process gives a restored key back; without
    it a new process sees the handle (never the key)."""
    import secrets as random_source

    url = make_url("sqlite", request, tmp_path_factory)
    key = "sk-proj-" + random_source.token_urlsafe(36)
    script = ROOT / "tests" / "adapters" / "langgraph_secret_process.py"
    env = {
        **os.environ,
        "PK_TEST_OPENAI_KEY": key,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "adapters"), os.environ.get("PYTHONPATH", "")]),
    }
    thread = uid("lg")

    def run(mode: str) -> dict[str, Any]:
        done = subprocess.run([sys.executable, str(script), mode, url, thread], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    assert run("write") == {"written": True}
    shown = {"arg": "$CRED{openai}", "content": "logged in with $CRED{openai} ."}  # inspection: handles
    assert run("read") == {"shown": shown, "arg": key, "content": f"logged in with {key} ."}
    bare = run("read-bare")
    assert key not in json.dumps(bare) and bare["shown"] == shown  # inspected without the value
    assert bare["content"] is None  # resolving says what to configure
    assert "SecretResolutionError" in bare["arg"] and "pk.secrets.register('openai'" in bare["arg"]


@pytest.mark.slow
def test_example_runs(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'adapters'}", "PERSISTKIT_URL": f"sqlite:///{tmp_path}/ex.db"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "langgraph_agent.py")],
        env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "model calls: 3" in done.stdout and "tool calls: 1" in done.stdout
