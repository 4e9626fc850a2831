"""CrewAI on persistkit: flow persistence and durable crews, offline, over real stores.

The crash tests kill a real subprocess (``crewai_crash_agent.py``) with
SIGKILL in the middle of a flow method or a task's model call, resume in a
second process, and count side effects written to a file persistkit does not
know about: completed methods and tasks ran once, the one in flight twice.
"""

from __future__ import annotations

import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from conftest import make_url, uid

pytest.importorskip("crewai")

from crewai import Agent, Crew, Process, Task
from crewai.flow.async_feedback.types import PendingFeedbackContext
from crewai.flow.flow import Flow, listen, router, start
from crewai.flow.persistence import persist
from crewai.llms.base_llm import BaseLLM
from pydantic import BaseModel

import persistkit as pk
from persistkit_crewai import PersistkitFlowPersistence, adurable_kickoff, durable_kickoff

AGENT = Path(__file__).with_name("crewai_crash_agent.py")
ROOT = Path(__file__).resolve().parents[2]
STORES = ["sqlite", "postgres", "redis"]
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning:crewai"),  # crewai's own, on every Agent/Crew
    pytest.mark.filterwarnings("ignore:function callbacks cannot be serialized:UserWarning"),
]
CRASH_STORES = ["sqlite", "postgres"]


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Fail any connection to a non-loopback address (telemetry, a real model)."""
    attempts: list[Any] = []
    real = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> Any:
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            attempts.append(address)
            raise OSError(f"test blocked a network connection to {address!r}")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    yield attempts
    assert not attempts, f"crewai tried to reach the network: {attempts}"


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[pk.Store]:
    s = pk.connect(make_url(request.param, request, tmp_path_factory))
    yield s
    s.close()


# -- flows ---------------------------------------------------------------------------------


class Doc(BaseModel):
    id: str = ""
    steps: list[str] = []


def test_flow_persistence_round_trip(store: pk.Store) -> None:
    p = PersistkitFlowPersistence(store)
    fid = uid("flow")
    assert p.load_state(fid) is None and p.completed_methods(fid) == []
    assert p.load_pending_feedback(fid) is None
    p.save_state(fid, "fetch", Doc(id=fid, steps=["fetch"]))
    p.save_state(fid, "clean", {"id": fid, "steps": ["fetch", "clean"], "n": 2})
    assert p.load_state(fid) == {"id": fid, "steps": ["fetch", "clean"], "n": 2}
    assert p.completed_methods(fid) == ["fetch", "clean"]
    assert [c.metadata["crewai_method"] for c in store.history(p.thread_id(fid))] == ["clean", "fetch"]

    ctx = PendingFeedbackContext(
        flow_id=fid, flow_class="tests.Review", method_name="review", method_output={"draft": "x"}, message="ok?"
    )
    p.save_pending_feedback(fid, ctx, Doc(id=fid, steps=["fetch", "clean", "review"]))
    state, loaded = p.load_pending_feedback(fid) or ({}, None)
    assert loaded is not None and loaded.method_name == "review" and loaded.method_output == {"draft": "x"}
    assert state["steps"] == ["fetch", "clean", "review"]
    assert p.completed_methods(fid) == ["fetch", "clean"]  # paused, not completed
    p.clear_pending_feedback(fid)
    assert p.load_pending_feedback(fid) is None
    assert p.load_state(fid) == {"id": fid, "steps": ["fetch", "clean", "review"]}


def test_flow_concurrent_saves_all_land(store: pk.Store) -> None:
    """CrewAI saves concurrently finishing methods from worker threads: no save is lost."""
    p = PersistkitFlowPersistence(store)
    fid = uid("flow")
    gate = threading.Barrier(6)

    def save(i: int) -> None:
        gate.wait()
        for j in range(3):
            p.save_state(fid, f"m{i}.{j}", {"id": fid, "last": i})

    threads = [threading.Thread(target=save, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(p.completed_methods(fid)) == sorted(f"m{i}.{j}" for i in range(6) for j in range(3))


def test_flow_restore_skips_completed_methods_and_reruns_routers(tmp_path: Path) -> None:
    p = PersistkitFlowPersistence(pk.connect(f"sqlite:///{tmp_path}/flow.db"))
    ran: list[str] = []
    fail = {"summarize": True}

    @persist(p)
    class Pipeline(Flow[Doc]):
        _skip_auto_memory: ClassVar[bool] = True  # no lancedb Memory: seconds per flow

        @start()
        def fetch(self) -> None:
            ran.append("fetch")
            self.state.steps.append("fetch")

        @router(fetch)
        def route(self) -> str:
            ran.append("route")
            return "ready"

        @listen("ready")
        def summarize(self) -> None:
            ran.append("summarize")
            if fail["summarize"]:
                raise RuntimeError("model down")
            self.state.steps.append("summarize")

        @listen(summarize)
        def publish(self) -> str:
            ran.append("publish")
            self.state.steps.append("publish")
            return "published"

    fid = uid("flow")
    first = Pipeline(suppress_flow_events=True)
    assert p.restore(first, fid) is False
    with pytest.raises(RuntimeError, match="model down"):
        first.kickoff(inputs={"id": fid})
    assert ran == ["fetch", "route", "summarize"]

    fail["summarize"], ran[:] = False, []
    second = Pipeline(suppress_flow_events=True)
    assert p.restore(second, fid) is True
    assert second.kickoff(inputs={"id": fid}) == "published"
    assert ran == ["route", "summarize", "publish"]  # fetch replayed; the router re-decides
    assert second.state.steps == ["fetch", "summarize", "publish"]


def test_flow_persistence_without_store_uses_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERSISTKIT_URL", f"sqlite:///{tmp_path}/default.db")
    p = PersistkitFlowPersistence()
    p.save_state("f", "m", {"id": "f"})
    assert pk.connect(f"sqlite:///{tmp_path}/default.db").get_state("crewai-flow:f")["state"] == {"id": "f"}
    with pytest.raises(pk.ConfigurationError):
        PersistkitFlowPersistence("sqlite:///x.db")  # type: ignore[arg-type]


# -- crews ---------------------------------------------------------------------------------


class FakeLLM(BaseLLM):
    """A deterministic model: answers each task at once, or fails on ``fail_on``."""

    calls: list[str] = []
    fail_on: str | None = None

    def call(self, messages: Any, *args: Any, from_task: Any = None, **kwargs: Any) -> str:
        name = from_task.name if from_task is not None else "?"
        self.calls.append(name)
        if name == self.fail_on:
            raise RuntimeError(f"model down during {name}")
        seen = json.dumps(messages).count("ANSWER<")
        return f"Thought: done\nFinal Answer: ANSWER<{name} saw {seen}>"

    async def acall(self, messages: Any, *args: Any, from_task: Any = None, **kwargs: Any) -> str:
        return self.call(messages, from_task=from_task)

    def supports_function_calling(self) -> bool:
        return False


EXPECTED = [f"ANSWER<t{i} saw {i}>" for i in range(5)]


def make_crew(llm: FakeLLM, callbacks: list[str] | None = None) -> Crew:
    agent = Agent(role="writer", goal="write", backstory="offline", llm=llm, max_retry_limit=0)
    tasks = [
        Task(
            name=f"t{i}",
            description=f"part {i} about {{topic}}",
            expected_output="text",
            agent=agent,
            callback=(lambda out: callbacks.append(out.name)) if callbacks is not None else None,
        )
        for i in range(5)
    ]
    return Crew(agents=[agent], tasks=tasks, process=Process.sequential)


def test_durable_kickoff_replays_finished_tasks(store: pk.Store) -> None:
    llm, callbacks, tid = FakeLLM(model="fake", calls=[], fail_on="t2"), [], uid("crew")
    with pytest.raises(RuntimeError, match="model down during t2"):
        durable_kickoff(make_crew(llm, callbacks), {"topic": "x"}, thread_id=tid, store=store)
    assert llm.calls == ["t0", "t1", "t2"] and callbacks == ["t0", "t1"]

    llm.calls[:], llm.fail_on, callbacks[:] = [], None, []
    crew = make_crew(llm, callbacks)
    out = durable_kickoff(crew, {"topic": "x"}, thread_id=tid, store=store)
    assert llm.calls == ["t2", "t3", "t4"] and callbacks == ["t2", "t3", "t4"]
    assert [t.raw for t in out.tasks_output] == EXPECTED and out.raw == EXPECTED[-1]
    assert [t.output.raw if t.output else None for t in crew.tasks] == EXPECTED  # replayed tasks too
    assert all("execute_sync" not in t.__dict__ for t in crew.tasks)  # the wrappers are gone
    steps = [c.step or "" for c in reversed(store.history(tid)) if c.kind == "step" and c.status == "completed"]
    assert [s for s in steps if s.startswith("crewai.task")] == [f"crewai.task[{i}] t{i}" for i in range(5)]
    # Each task's model call is a step nested under it (the one that raised recorded nothing).
    assert steps.count("crewai.llm:fake") == 5


def test_durable_kickoff_same_run_id_replays_everything(store: pk.Store) -> None:
    llm, tid = FakeLLM(model="fake", calls=[]), uid("crew")
    first = durable_kickoff(make_crew(llm), {"topic": "x"}, thread_id=tid, store=store, run_id="delivery-1")
    again = durable_kickoff(make_crew(llm), {"topic": "x"}, thread_id=tid, store=store, run_id="delivery-1")
    assert llm.calls == [f"t{i}" for i in range(5)]
    assert [t.raw for t in again.tasks_output] == [t.raw for t in first.tasks_output] == EXPECTED


@pk.checkpointed(name="crew-test.earlier")
def earlier_turn_step() -> str:
    return "done"


def test_a_kickoff_behind_an_unfinished_one_gives_its_worker_back_after_unfinished_timeout(tmp_path: Path) -> None:
    """``unfinished_timeout=`` reaches ``pk.resume`` (both twins): past it the kickoff raises
    ThreadBusyError with ``retry_after`` before any task runs."""
    store, tid, llm = pk.connect(f"sqlite:///{tmp_path}/crew.db"), uid("crew"), FakeLLM(model="fake", calls=[])
    with pytest.raises(pk.BackendUnavailableError), pk.resume(tid, store=store, run_id="delivery-0"):
        earlier_turn_step()
        raise pk.BackendUnavailableError("the store went away (simulated)")  # delivery-0 stays unfinished
    for kickoff in (
        lambda: durable_kickoff(make_crew(llm), {"topic": "x"}, thread_id=tid, store=store, run_id="delivery-1", unfinished_timeout=0),
        lambda: asyncio.run(adurable_kickoff(
            make_crew(llm), {"topic": "x"}, thread_id=tid, store=store, run_id="delivery-1", unfinished_timeout=0
        )),
    ):
        with pytest.raises(pk.ThreadBusyError) as gave:
            kickoff()
        assert gave.value.unfinished_run == "delivery-0" and gave.value.retry_after is not None
        assert "unfinished_timeout=0" in str(gave.value)
    assert llm.calls == []  # it gave its place back before any task
    with pk.resume(tid, store=store, run_id="delivery-0"):  # the redelivery goes first
        earlier_turn_step()
    out = durable_kickoff(make_crew(llm), {"topic": "x"}, thread_id=tid, store=store, run_id="delivery-1", unfinished_timeout=0)
    assert [t.raw for t in out.tasks_output] == EXPECTED
    store.close()


class SlowLLM(FakeLLM):
    """FakeLLM whose calls take a while, counting how many are in flight at once."""

    gate: ClassVar[threading.Lock] = threading.Lock()
    running: ClassVar[list[int]] = [0, 0]  # now, peak

    def call(self, messages: Any, *args: Any, from_task: Any = None, **kwargs: Any) -> str:
        with self.gate:
            self.running[0] += 1
            self.running[1] = max(self.running)
        threading.Event().wait(0.05)
        with self.gate:
            self.running[0] -= 1
        return super().call(messages, *args, from_task=from_task, **kwargs)


def test_concurrency_reaches_resume_two_kickoffs_of_one_key_never_overlap() -> None:
    """``durable_kickoff(concurrency=)`` reaches ``pk.resume``: two kickoffs of two threads under
    one key with limit 1, from two Python threads, run one after the other (their model calls
    sleep, so without the slot they overlap), and the key's slot is free afterwards."""
    store, key = pk.connect(f"memory://{uid('crew-slot')}"), uid("tenant")
    SlowLLM.running[:] = [0, 0]
    outs: list[Any] = []

    def kickoff(i: int) -> None:
        llm = SlowLLM(model="fake", calls=[])
        outs.append(durable_kickoff(
            make_crew(llm), {"topic": "x"}, thread_id=uid(f"crew-slot-{i}"), store=store, run_id="delivery-1",
            concurrency=("tenant", key, 1),
        ))

    workers = [threading.Thread(target=kickoff, args=(i,)) for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert [[t.raw for t in out.tasks_output] for out in outs] == [EXPECTED, EXPECTED]
    assert SlowLLM.running == [0, 1]
    info = pk.Concurrency("tenant", key, 1).info(store)
    assert info is not None and info.holders == () and info.waiting == ()
    store.close()


def test_durable_kickoff_refuses_changed_inputs_on_resume(tmp_path: Path) -> None:
    store, tid = pk.connect(f"sqlite:///{tmp_path}/crew.db"), uid("crew")
    llm = FakeLLM(model="fake", calls=[], fail_on="t1")
    with pytest.raises(RuntimeError):
        durable_kickoff(make_crew(llm), {"topic": "cats"}, thread_id=tid, store=store)
    llm.fail_on = None
    with pytest.raises(pk.NonDeterminismError, match=r"crewai.task\[0\]"):
        durable_kickoff(make_crew(llm), {"topic": "dogs"}, thread_id=tid, store=store)


def test_adurable_kickoff_replays_finished_tasks(tmp_path: Path) -> None:
    store, tid = pk.connect(f"sqlite:///{tmp_path}/crew.db"), uid("crew")
    llm = FakeLLM(model="fake", calls=[], fail_on="t3")
    with pytest.raises(RuntimeError):
        asyncio.run(adurable_kickoff(make_crew(llm), {"topic": "x"}, thread_id=tid, store=store))
    llm.calls[:], llm.fail_on = [], None
    out = asyncio.run(adurable_kickoff(make_crew(llm), {"topic": "x"}, thread_id=tid, store=store))
    assert llm.calls == ["t3", "t4"]
    assert [t.raw for t in out.tasks_output] == EXPECTED


def test_durable_kickoff_refuses_what_it_cannot_replay(tmp_path: Path) -> None:
    store, llm = pk.connect(f"sqlite:///{tmp_path}/crew.db"), FakeLLM(model="fake", calls=[])
    crew = make_crew(llm)
    crew.tasks[4].async_execution = True
    with pytest.raises(pk.ConfigurationError, match="async_execution"):
        durable_kickoff(crew, {"topic": "x"}, thread_id=uid(), store=store)
    crew = make_crew(llm)
    crew.stream = True
    with pytest.raises(pk.ConfigurationError, match="stream"):
        durable_kickoff(crew, {"topic": "x"}, thread_id=uid(), store=store)
    assert llm.calls == []


# -- real process death --------------------------------------------------------------------


def crash_and_resume(kind: str, url: str, key: str, tmp: Path, kill_at: str) -> tuple[int, Counter[str], Any]:
    counter = tmp / f"{key}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "adapters"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(AGENT), kind, url, key, str(counter)]
    first = subprocess.run([*cmd, kill_at], capture_output=True, text=True, env=env, timeout=60)
    assert "NETWORK ATTEMPT" not in first.stderr, first.stderr
    second = subprocess.run([*cmd, "-"], capture_output=True, text=True, env=env, timeout=60)
    assert second.returncode == 0, second.stderr[-3000:]
    result = [line for line in second.stdout.splitlines() if line.startswith("RESULT ")]
    assert result, second.stdout[-3000:]
    return first.returncode, Counter(counter.read_text().split()), json.loads(result[-1][len("RESULT ") :])


@pytest.mark.slow
@pytest.mark.parametrize("kind", CRASH_STORES)
def test_flow_killed_mid_method_resumes_in_a_new_process(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    url = make_url(kind, request, tmp_path_factory)
    code, counts, result = crash_and_resume("flow", url, uid("flow"), tmp_path, kill_at="summarize")
    assert code == -signal.SIGKILL
    assert counts == {"flow:fetch": 1, "flow:clean": 1, "flow:summarize": 2, "flow:publish": 1, "flow:route": 2}
    assert result == {"steps": ["fetch", "clean", "summarize", "publish"]}


@pytest.mark.slow
@pytest.mark.parametrize("kind", CRASH_STORES)
def test_crew_killed_during_task_3_of_5_resumes_in_a_new_process(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    url = make_url(kind, request, tmp_path_factory)
    code, counts, result = crash_and_resume("crew", url, uid("crew"), tmp_path, kill_at="t2")
    assert code == -signal.SIGKILL
    expected = {f"{what}:t{i}": 1 for i in range(5) for what in ("llm", "cb")}
    expected["llm:t2"] = 2  # in flight at the kill: at-least-once; its callback had not run
    assert counts == expected
    assert result == {"tasks": EXPECTED, "outputs": EXPECTED}
