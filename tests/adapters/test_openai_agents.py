"""The OpenAI Agents SDK adapter: sessions on every store, durable runs, approvals.

No test calls a real model: ``openai_agents_fake.ScriptedModel`` is a
deterministic ``Model`` that emits function calls. Tool and model calls are
counted in log files outside persistkit.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="openai-agents is not installed")

from agents import Agent, Runner, SessionSettings
from conftest import make_url, uid
from openai_agents_fake import (
    APPROVAL_PLAN,
    SEQUENTIAL,
    ScriptedModel,
    lines,
    make_agent,
)

import persistkit as pk
from persistkit.backends import CheckpointRow, Head
from persistkit.backends.memory import MemoryBackend
from persistkit_openai_agents import (
    PersistkitSession,
    SessionSettingsError,
    UnserializableItemError,
    durable,
    durable_run,
    load_run_state,
)

SCRIPT = Path(__file__).with_name("openai_agents_fake.py")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "adapters"), os.environ.get("PYTHONPATH", "")])}


def msg(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# -- Session ---------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgres", "redis", "s3"])
def session_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


def test_session_protocol(session_url: str) -> None:
    async def scenario() -> None:
        sid = uid("sess")
        async with pk.connect(session_url) as store:
            s = PersistkitSession(sid, store)
            assert await s.get_items() == []
            assert await s.pop_item() is None
            await s.add_items([msg("a"), msg("b")])
            await s.add_items([])
            await s.add_items([msg("c")])
        if session_url.startswith("memory://"):
            return  # a memory store lives as long as the Store object
        async with pk.connect(session_url) as store:  # a second open sees the same conversation
            s = PersistkitSession(sid, store)
            assert await s.get_items() == [msg("a"), msg("b"), msg("c")]
            assert await s.get_items(limit=2) == [msg("b"), msg("c")]
            assert await s.pop_item() == msg("c")
            assert await s.get_items() == [msg("a"), msg("b")]
            await s.add_items([msg("d")])
            assert await s.get_items() == [msg("a"), msg("b"), msg("d")]
            await s.clear_session()
            assert await s.get_items() == []
            await s.add_items([msg("e")])
            assert await s.get_items() == [msg("e")]
            assert await PersistkitSession("other-" + sid, store).get_items() == []

    asyncio.run(scenario())


def test_runner_with_session_keeps_the_conversation(session_url: str, tmp_path: Path) -> None:
    agent = make_agent([[("work", {"n": 1})], []], tmp_path)

    async def scenario() -> None:
        sid = uid("sess")
        async with pk.connect(session_url) as store:
            session = PersistkitSession(sid, store)
            first = await Runner.run(agent, "hello", session=session)
            assert first.final_output == "done after 1 tool calls"
            after_first = await session.get_items()
            # user message, function call, its output, final message
            assert [i.get("type", "message") for i in after_first] == [
                "message", "function_call", "function_call_output", "message"
            ]
            await Runner.run(agent, "again", session=session)
            items = await session.get_items()
            assert items[: len(after_first)] == after_first
            assert items[len(after_first)] == msg("again")

    asyncio.run(scenario())
    assert lines(tmp_path / "tools.log") == ["work 1"]  # the 2nd run saw the tool output in its history


class Counting(MemoryBackend):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[int] = []

    def write(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int) -> Head:
        self.writes.append(len(row.payload) + sum(len(b) for b in blobs.values()))
        return super().write(row, blobs, expected_version)


def test_session_append_writes_only_the_new_items() -> None:
    backend = Counting()
    store = pk.connect(backend)
    session = PersistkitSession(uid("sess"), store)

    async def scenario() -> None:
        await session.add_items([msg(os.urandom(512).hex()) for _ in range(2000)])  # ~2 MB
        for _ in range(5):
            await session.add_items([msg(os.urandom(256).hex())])
        assert len(await session.get_items()) == 2005

    asyncio.run(scenario())
    assert backend.writes[0] > 1_000_000
    assert all(w < 1500 for w in backend.writes[1:]), backend.writes[1:]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_concurrent_writers_lose_nothing(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    url = make_url(kind, request, tmp_path_factory)
    sid = uid("sess")

    async def writer(name: str) -> None:
        async with pk.connect(url) as store:  # each writer its own store: real CAS conflicts
            session = PersistkitSession(sid, store)
            for i in range(8):
                await session.add_items([msg(f"{name}{i}")])

    async def scenario() -> list[Any]:
        await asyncio.gather(*(writer(w) for w in "abcd"))
        async with pk.connect(url) as store:
            return await PersistkitSession(sid, store).get_items()

    items = asyncio.run(scenario())
    assert sorted(i["content"] for i in items) == sorted(f"{w}{i}" for w in "abcd" for i in range(8))
    for w in "abcd":  # each writer's items in its own order
        assert [i["content"] for i in items if i["content"][0] == w] == [f"{w}{i}" for i in range(8)]



def test_session_settings_are_normalized_and_limit_get_items() -> None:
    store = pk.connect("memory://")
    assert PersistkitSession("a", store).session_settings == SessionSettings()
    s = PersistkitSession("b", store, session_settings={"limit": 2})
    assert isinstance(s.session_settings, SessionSettings) and s.session_settings.limit == 2
    with pytest.raises(SessionSettingsError, match="Unknown session settings: limitt") as bad:
        PersistkitSession("c", store, session_settings={"limitt": 1})
    assert isinstance(bad.value, TypeError) and isinstance(bad.value, pk.ConfigurationError)
    with pytest.raises(SessionSettingsError, match="must be a SessionSettings or a dict, got int"):
        PersistkitSession("c", store, session_settings=3)  # type: ignore[arg-type]
    with pytest.raises(SessionSettingsError, match="limit"):
        PersistkitSession("c", store, session_settings={"limit": "many"})
    s.session_settings = {"limit": 1}  # type: ignore[assignment]  # the setter normalizes too
    assert s.session_settings == SessionSettings(limit=1)

    async def scenario() -> None:
        await s.add_items([msg("a"), msg("b"), msg("c")])
        assert await s.get_items() == [msg("c")]
        assert await s.get_items(limit=2) == [msg("b"), msg("c")]  # an explicit limit wins
        assert await s.get_items(limit=0) == []

    asyncio.run(scenario())


def test_runner_uses_a_dict_session_settings_limit() -> None:
    # A dict kept as a dict made Runner.run fail with "'dict' object has no attribute 'limit'".
    inputs: list[Any] = []

    class Capturing(ScriptedModel):
        async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
            inputs.append(input)
            return await super().get_response(system_instructions, input, *args, **kwargs)

    agent = Agent(name="a", model=Capturing([[]]))
    session = PersistkitSession(uid("sess"), pk.connect("memory://"), session_settings={"limit": 1})

    async def scenario() -> None:
        await session.add_items([msg("old 1"), msg("old 2")])
        await Runner.run(agent, "new", session=session)

    asyncio.run(scenario())
    assert [i["content"] for i in inputs[0]] == ["old 2", "new"]


def test_an_unstorable_item_is_a_type_error_and_writes_nothing() -> None:
    session = PersistkitSession(uid("sess"), pk.connect("memory://"))

    async def scenario() -> None:
        await session.add_items([msg("kept")])
        with pytest.raises(UnserializableItemError, match=r"none of the 2 given was added") as bad:
            await session.add_items([msg("fine"), {"role": "user", "content": object()}])  # type: ignore[list-item]
        assert isinstance(bad.value, TypeError) and isinstance(bad.value, pk.SerializationError)
        assert "content" in bad.value.path
        assert await session.get_items() == [msg("kept")]
        await session.add_items([msg("after")])  # the session stays usable
        assert await session.get_items() == [msg("kept"), msg("after")]

    asyncio.run(scenario())

# -- durable runs ------------------------------------------------------------------------------


@pk.checkpointed(name="openai-test.earlier")
def earlier_turn_step() -> str:
    return "done"


def test_a_turn_behind_an_unfinished_one_gives_its_worker_back_after_unfinished_timeout(tmp_path: Path) -> None:
    """``unfinished_timeout=`` reaches ``pk.resume``: past it the turn raises ThreadBusyError
    with ``retry_after`` before calling the model (a queue's worker goes back to the pool)."""
    agent = make_agent([[]], tmp_path)

    async def scenario() -> None:
        async with pk.connect(f"sqlite:///{tmp_path}/agent.db") as store:
            with pytest.raises(pk.BackendUnavailableError), pk.resume("t", store=store, run_id="r0"):
                earlier_turn_step()
                raise pk.BackendUnavailableError("the store went away (simulated)")  # r0 stays unfinished
            with pytest.raises(pk.ThreadBusyError) as gave:
                await durable_run(agent, "go", thread_id="t", store=store, run_id="r1", unfinished_timeout=0)
            assert gave.value.unfinished_run == "r0" and gave.value.retry_after is not None
            assert "unfinished_timeout=0" in str(gave.value)
            assert lines(tmp_path / "model.log") == []  # it gave its place back before the model
            with pk.resume("t", store=store, run_id="r0"):  # r0's redelivery goes first
                earlier_turn_step()
            done = await durable_run(agent, "go", thread_id="t", store=store, run_id="r1", unfinished_timeout=0)
            assert done.final_output == "done after 0 tool calls"

    asyncio.run(scenario())


def test_concurrency_reaches_resume_two_turns_of_one_key_never_overlap() -> None:
    """``durable_run(concurrency=)`` reaches ``pk.resume``: two turns of two threads under one
    key with limit 1 run one after the other (their model calls sleep, so without the slot they
    overlap), and the key's slot is free afterwards."""
    running, peak = 0, 0

    class SlowModel(ScriptedModel):
        async def get_response(self, *args: Any, **kwargs: Any) -> Any:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.05)
            running -= 1
            return await super().get_response(*args, **kwargs)

    agent = Agent(name="slots", instructions="Answer.", model=SlowModel([[]]))
    key = uid("tenant")

    async def scenario() -> None:
        async with pk.connect(f"memory://{uid('oa-slot')}") as store:
            results = await asyncio.gather(*(
                durable_run(agent, "go", thread_id=uid(f"oa-slot-{i}"), store=store, run_id="r1",
                            concurrency=("tenant", key, 1))
                for i in range(2)
            ))
            assert [r.final_output for r in results] == ["done after 0 tool calls"] * 2
            info = await pk.Concurrency("tenant", key, 1).ainfo(store)
            assert info is not None and info.holders == () and info.waiting == ()

    asyncio.run(scenario())
    assert peak == 1


def test_a_finished_run_replays_without_calling_model_or_tools(tmp_path: Path) -> None:
    # Parallel tool calls in one turn take step positions in start order.
    plan = [[("work", {"n": 1}), ("work", {"n": 2}), ("work", {"n": 3})], [("work", {"n": 4})], []]
    agent = make_agent(plan, tmp_path)

    async def scenario() -> None:
        async with pk.connect(f"sqlite:///{tmp_path}/agent.db") as store:
            first = await durable_run(agent, "go", thread_id="t", store=store, run_id="r1")
            assert first.final_output == "done after 4 tool calls"
            assert len(lines(tmp_path / "tools.log")) == 4
            assert len(lines(tmp_path / "model.log")) == 3
            again = await durable_run(agent, "go", thread_id="t", store=store, run_id="r1")
            steps = [c.step for c in reversed(await store.ahistory("t")) if c.kind == "step"]
        assert again.final_output == first.final_output
        assert [r.output for r in again.raw_responses] == [r.output for r in first.raw_responses]
        assert again.raw_responses[0].usage.total_tokens == 15
        assert [type(i).__name__ for i in again.new_items] == [type(i).__name__ for i in first.new_items]
        assert steps == ["openai-agents.model"] + ["openai-agents.tool:work"] * 3 + [
            "openai-agents.model", "openai-agents.tool:work", "openai-agents.model"
        ]

    asyncio.run(scenario())
    assert Counter(lines(tmp_path / "tools.log")) == {f"work {n}": 1 for n in range(1, 5)}
    assert len(lines(tmp_path / "model.log")) == 3



def deliver(url: str, thread: str, log_dir: Path, message_id: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(SCRIPT), "deliver", url, thread, str(log_dir), message_id],
                          capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_redelivered_message_with_its_id_as_run_id_does_not_run_tools_again(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    # A queue redelivers a message whose turn finished (the worker died before its ack): each
    # delivery is a new process. With run_id=<message id> the finished run replays.
    url, thread = make_url(kind, request, tmp_path_factory), uid("queue")
    first = deliver(url, thread, tmp_path, "msg-1")
    assert lines(tmp_path / "tools.log") == ["work 1", "work 2"]
    again = deliver(url, thread, tmp_path, "msg-1")
    assert again == first
    assert lines(tmp_path / "tools.log") == ["work 1", "work 2"]  # no second email
    assert len(lines(tmp_path / "model.log")) == 3  # no model call either

    # Without a run_id the redelivery is a new turn: its tools run again. This is what the
    # adapter page warns about.
    deliver(url, thread, tmp_path, "-")
    assert lines(tmp_path / "tools.log") == ["work 1", "work 2", "work 1", "work 2"]


def test_a_durable_run_reads_another_sessions_limited_window_as_recorded_items(tmp_path: Path) -> None:
    # SQLiteSession applies its own session_settings.limit even to get_items(): the read is
    # recorded as the items it returned, and a replay gives the model the same window.
    from agents import SQLiteSession

    inputs: list[Any] = []

    class Capturing(ScriptedModel):
        async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
            inputs.append([i.get("content") for i in input])
            return await super().get_response(system_instructions, input, *args, **kwargs)

    agent = Agent(name="a", model=Capturing([[]]))
    session = SQLiteSession("s", tmp_path / "sdk.db", session_settings=SessionSettings(limit=2))

    async def scenario() -> list[str]:
        await session.add_items([msg("one"), msg("two"), msg("three")])
        async with pk.connect(f"sqlite:///{tmp_path}/agent.db") as store:
            await durable_run(agent, "new", thread_id="t", store=store, run_id="r", session=session)
            await durable_run(agent, "new", thread_id="t", store=store, run_id="r", session=session)
            return [c.step for c in reversed(await store.ahistory("t")) if c.kind == "step"]

    steps = asyncio.run(scenario())
    assert inputs == [["two", "three", "new"]]  # the replay called no model
    assert "openai-agents.session.read-items" in steps and "openai-agents.session.read" not in steps
    session.close()

def test_outside_a_run_the_durable_agent_is_the_plain_agent(tmp_path: Path) -> None:
    agent = durable(make_agent(SEQUENTIAL, tmp_path))
    assert durable(agent) is agent
    result = asyncio.run(Runner.run(agent, "go"))
    assert result.final_output == "done after 5 tool calls"
    assert len(lines(tmp_path / "tools.log")) == 5


def test_model_given_by_name_goes_through_the_provider(tmp_path: Path) -> None:
    from agents import ModelProvider, RunConfig

    class Provider(ModelProvider):
        def get_model(self, model_name: str | None) -> ScriptedModel:
            return ScriptedModel([[]], tmp_path / "model.log")

    agent = Agent(name="named", model="scripted")

    async def scenario() -> None:
        async with pk.connect(f"sqlite:///{tmp_path}/agent.db") as store:
            config = RunConfig(model_provider=Provider())
            for _ in range(2):
                await durable_run(agent, "hi", thread_id="t", store=store, run_id="r", run_config=config)

    asyncio.run(scenario())
    assert len(lines(tmp_path / "model.log")) == 1


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=ENV, timeout=60
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "where", "session"),
    [("sqlite", "tool", False), ("sqlite", "model", False), ("sqlite", "tool", True), ("postgres", "tool", True)],
)
def test_sigkill_after_three_tool_calls_resumes_without_repeating_them(
    kind: str, where: str, session: bool, request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
) -> None:
    # Killed inside the 4th tool call, or inside the 4th model turn (3 tools done).
    kind_url = make_url(kind, request, tmp_path_factory)
    thread = uid("crash")
    extra = ["session"] if session else []
    first = run_script("crash", kind_url, thread, str(tmp_path), where, "4", *extra)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert len(lines(tmp_path / "tools.log")) == (4 if where == "tool" else 3)
    second = run_script("crash", kind_url, thread, str(tmp_path), "none", "-1", *extra)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["final_output"] == "done after 5 tool calls"

    tools = Counter(lines(tmp_path / "tools.log"))
    models = Counter(lines(tmp_path / "model.log"))
    expected_tools = {f"work {n}": 1 for n in range(1, 6)}
    expected_models = {f"model {t}": 1 for t in range(6)}
    if where == "tool":
        expected_tools["work 4"] = 2  # in flight at the kill: at-least-once
    else:
        expected_models["model 3"] = 2  # the 4th turn was in flight
    assert tools == expected_tools
    assert models == expected_models
    if session:  # the conversation was saved once: no item repeated by the resumed process

        async def items() -> list[Any]:
            async with pk.connect(kind_url) as store:
                return await PersistkitSession(thread + "-session", store).get_items()

        saved = asyncio.run(items())
        kinds = [i.get("type", "message") for i in saved]
        assert kinds == ["message"] + ["function_call", "function_call_output"] * 5 + ["message"]
        assert saved[0] == msg("do five units of work")


@pytest.fixture(params=["sqlite", "postgres"])
def kind_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


# -- human approval ----------------------------------------------------------------------------


def test_approval_is_stored_and_resumed_by_another_process(kind_url: str, tmp_path: Path) -> None:
    thread = uid("approve")
    started = run_script("approval", kind_url, thread, str(tmp_path))
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout) == {"final_output": None, "interruptions": 1}
    assert lines(tmp_path / "tools.log") == []  # nothing runs before approval

    agent = make_agent(APPROVAL_PLAN, tmp_path, approval=True)  # this process's own objects

    async def scenario() -> None:
        async with pk.connect(kind_url) as store:
            state = await load_run_state(agent, thread_id=thread, store=store)
            assert state is not None
            [item] = state.get_interruptions()
            assert item.tool_name == "work" and json.loads(item.arguments or "") == {"n": 1}
            state.approve(item)
            second = await durable_run(agent, state, thread_id=thread, store=store)
            assert second.final_output is None and len(second.interruptions) == 1

        async with pk.connect(kind_url) as store:  # yet another open: reject the 2nd call
            state = await load_run_state(agent, thread_id=thread, store=store)
            assert state is not None
            [item] = state.get_interruptions()
            assert json.loads(item.arguments or "") == {"n": 2}
            state.reject(item)
            done = await durable_run(agent, state, thread_id=thread, store=store)
            assert done.final_output == "done after 2 tool calls"
            assert await load_run_state(agent, thread_id=thread, store=store) is None

    asyncio.run(scenario())
    assert lines(tmp_path / "tools.log") == ["work 1"]  # approved ran once, rejected never


def test_no_pending_approval_on_an_unknown_thread(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with pk.connect(f"sqlite:///{tmp_path}/a.db") as store:
            agent = make_agent(SEQUENTIAL, tmp_path)
            assert await load_run_state(agent, thread_id="nobody", store=store) is None

    asyncio.run(scenario())


# -- a changed input on an unfinished run ------------------------------------------------------


class FailingOnce(ScriptedModel):
    """Raises in its ``fail_at``-th call (1-based) of the first run: leaves the run unfinished."""

    def __init__(self, plan: list[Any], log: Path, fail_at: int) -> None:
        super().__init__(plan, log)
        self.fail_at, self.calls = fail_at, 0

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("model unavailable")
        return await super().get_response(system_instructions, input, *args, **kwargs)


def _history(n: int, changed: int | None = None) -> list[dict[str, Any]]:
    """A conversation of ``n`` user messages; item ``changed`` reads differently."""
    return [msg(f"note {i}" + (" (edited)" if i == changed else "")) for i in range(n)]


INPUTS = {  # (input of the unfinished run, input of the resume)
    "text": ("fetch all", "fetch EVERYTHING"),
    "long-history-middle": (_history(40), _history(40, changed=20)),
    "long-history-first": (_history(40), _history(40, changed=0)),
}


@pytest.mark.parametrize("fail_at", [2, 4])
@pytest.mark.parametrize("case", sorted(INPUTS))
def test_changed_input_on_an_unfinished_run_is_reported(case: str, fail_at: int, tmp_path: Path) -> None:
    before, after = INPUTS[case]
    plan = SEQUENTIAL
    agent = make_agent(plan, tmp_path)
    agent.model = FailingOnce(plan, tmp_path / "model.log", fail_at)

    async def scenario() -> None:
        async with pk.connect(f"sqlite:///{tmp_path}/agent.db") as store:
            with pytest.raises(RuntimeError, match="model unavailable"):
                await durable_run(agent, before, thread_id="t", store=store)
            calls = len(lines(tmp_path / "model.log"))
            with pytest.raises(pk.NonDeterminismError, match="different input") as err:
                await durable_run(agent, after, thread_id="t", store=store)
            assert "run_id" in str(err.value) and "check_input=False" in str(err.value)
            assert len(lines(tmp_path / "model.log")) == calls  # no model call for the new input
            # The unfinished run still continues with its own input: its turns replay.
            done = await durable_run(agent, before, thread_id="t", store=store)
            assert done.final_output == "done after 5 tool calls"
            assert len(lines(tmp_path / "model.log")) == 6
            # A new run for the new input runs for real.
            fresh = await durable_run(agent, after, thread_id="t", store=store, run_id="r-new")
            assert fresh.final_output == "done after 5 tool calls"
            assert len(lines(tmp_path / "model.log")) == 12

    asyncio.run(scenario())
    assert Counter(lines(tmp_path / "tools.log")) == {f"work {n}": 2 for n in range(1, 6)}


def test_check_input_false_replays_recorded_turns_for_another_input(tmp_path: Path) -> None:
    agent = make_agent(SEQUENTIAL, tmp_path)
    agent.model = FailingOnce(SEQUENTIAL, tmp_path / "model.log", 3)

    async def scenario() -> None:
        async with pk.connect(f"sqlite:///{tmp_path}/agent.db") as store:
            with pytest.raises(RuntimeError):
                await durable_run(agent, "fetch all", thread_id="t", store=store)
            done = await durable_run(agent, "fetch EVERYTHING", thread_id="t", store=store, check_input=False)
            assert done.final_output == "done after 5 tool calls"

    asyncio.run(scenario())
    assert len(lines(tmp_path / "model.log")) == 6  # turns 1-2 replayed, 3-6 ran
