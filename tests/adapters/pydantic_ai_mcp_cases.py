"""The MCP scenarios of Pydantic AI's ``tests/test_dbos.py``, ported to ``PersistkitDurability``,
run in one process under the MCP target (tests/adapters/test_pydantic_ai_mcp.py).

    python pydantic_ai_mcp_cases.py URL DIR

Runs every ``case_*`` on the store at URL (each in its own thread and ``DIR/<case>``) and
prints ``RESULT {"<case>": "ok" | "<traceback>"}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import MCP, Capability, DynamicCapability, Toolset
from pydantic_ai.exceptions import UnexpectedModelBehavior, UserError
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai_mcp_worker import PLAN, effect, make_agent, mcp_toolset, scripted

import persistkit as pk
from persistkit_pydantic_ai import PersistkitDurability

Case = Callable[[pk.Store, Path], Awaitable[None]]
CASES: dict[str, Case] = {}


def case(fn: Case) -> Case:
    CASES[fn.__name__.removeprefix("case_")] = fn
    return fn


def thread() -> str:
    return f"mcp-case-{uuid.uuid4().hex[:12]}"


def steps(store: pk.Store, thread_id: str) -> list[str]:
    return [cp.step or "" for cp in reversed(store.history(thread_id)) if cp.kind == "step"]


def effects(work_dir: Path) -> list[str]:
    path = work_dir / "effects.log"
    return path.read_text().splitlines() if path.exists() else []


def raises(kind: type[BaseException], text: str, fn: Callable[[], object]) -> None:
    try:
        fn()
    except kind as exc:
        assert text in str(exc), f"{kind.__name__} without {text!r}: {exc}"
    else:
        raise AssertionError(f"no {kind.__name__} ({text!r})")


@case
async def case_mcp_and_function_tool_calls_in_parallel(store: pk.Store, d: Path) -> None:
    """test_complex_agent_run_in_workflow: an MCP call and a function-tool call in one response,
    run in parallel; each a step; the same run again replays them all."""
    agent = Agent(
        scripted(d, {0: [("record", 1), ("other", 1)]}),
        name="parallel",
        toolsets=[mcp_toolset(d)],
        capabilities=[PersistkitDurability()],
    )

    @agent.tool_plain
    async def other(n: int) -> str:
        effect(d / "effects.log", f"other:{n}")
        return f"other {n} ok"

    t = thread()
    async with pk.resume(t, store=store) as run:
        first = await agent.run("go")
    assert first.output == "mcp 1 ok | other 1 ok", first.output
    names = steps(store, t)
    assert names[0] == "parallel__mcp_server__tests.get_tools", names
    assert names.count("parallel__mcp_server__tests.call_tool") == 1, names
    assert names.count("parallel__function_toolset__<agent>.call_tool:other") == 1, names
    assert names.count("parallel__model.request") == 2, names
    before = effects(d)
    async with pk.resume(t, store=store, run_id=run.run_id):
        again = await agent.run("go")
    assert again.output == first.output
    assert effects(d) == before, "the replay called the model, a tool or the MCP server"


@case
async def case_mcp_tools_not_cached_when_disabled(store: pk.Store, d: Path) -> None:
    """test_mcp_tools_not_cached_when_disabled: with ``cache_tools=False`` every model request
    is preceded by its own discovery step."""
    agent = Agent(
        scripted(d, PLAN),
        name="uncached",
        toolsets=[mcp_toolset(d, cache_tools=False)],
        capabilities=[PersistkitDurability()],
    )

    @agent.tool_plain(sequential=True)
    async def local(n: int) -> str:
        return f"local {n} ok"

    t = thread()
    async with pk.resume(t, store=store) as run:
        assert (await agent.run("go")).output == "mcp 1 ok | local 1 ok | mcp 2 ok"
    names = steps(store, t)
    assert names.count("uncached__mcp_server__tests.get_tools") == 3, names
    before = effects(d)
    async with pk.resume(t, store=store, run_id=run.run_id):
        assert (await agent.run("go")).output == "mcp 1 ok | local 1 ok | mcp 2 ok"
    assert effects(d) == before


@case
async def case_get_tools_recorded_independently_per_run(store: pk.Store, d: Path) -> None:
    """test_dbos_mcp_get_tools_recorded_independently_per_run: two runs of one agent in one
    process each record their own discovery, first (the tool cache is the run's, not the
    process's); within a run the two model requests share it."""
    agent = make_agent(d)
    for t in (thread(), thread()):
        async with pk.resume(t, store=store):
            assert (await agent.run("go")).output == "mcp 1 ok | local 1 ok | mcp 2 ok"
        names = steps(store, t)
        assert names[0] == "mcp_agent__mcp_server__tests.get_tools", names
        assert names.count("mcp_agent__mcp_server__tests.get_tools") == 1, names


@case
async def case_structured_and_image_results_replay(store: pk.Store, d: Path) -> None:
    """A structured MCP result and an image cross the step as JSON: the replay (a cold agent,
    the results read back from the store) gives the model the same values."""
    seen: list[list[Any]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        results = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if not results:
            calls = [ToolCallPart("data", {"n": 3}, tool_call_id="d"), ToolCallPart("picture", {}, tool_call_id="p")]
            return ModelResponse(parts=calls)
        seen.append(results)
        return ModelResponse(parts=[TextPart("done")])

    def build() -> Agent[None, str]:
        return Agent(FunctionModel(model), name="results", toolsets=[mcp_toolset(d)], capabilities=[PersistkitDurability()])

    t = thread()
    async with pk.resume(t, store=store) as run:
        assert (await build().run("go")).output == "done"
    async with pk.resume(t, store=store, run_id=run.run_id):
        assert (await build().run("go")).output == "done"
    assert effects(d).count("mcp:data") == effects(d).count("mcp:picture") == 1, effects(d)
    assert len(seen) == 1, "the replay called the model"
    [[structured, image]] = seen
    assert structured == {"n": 3, "items": ["a", "b"], "nested": {"ok": True}}, structured
    assert isinstance(image, BinaryContent) and image.data == b"\x89PNG\r\n\x1a\n", image
    assert steps(store, t).count("results__mcp_server__tests.call_tool") == 2, steps(store, t)


def always_fail(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart("fail", {})])


@case
async def case_mcp_tool_error_uses_agent_retries_and_replays(store: pk.Store, d: Path) -> None:
    """test_dbos_mcp_tool_inherits_agent_retries and ..._model_retry_crosses_step_without_engine_
    retries: an MCP tool that always fails is retried by the agent's budget (``retries=3``),
    each failed call a recorded step (the retry crosses the step as a value); resuming the
    failed run replays them without calling the server again."""
    agent = Agent(
        FunctionModel(always_fail),
        name="retries",
        retries=3,
        toolsets=[mcp_toolset(d)],
        capabilities=[PersistkitDurability()],
    )
    t = thread()
    run_id = "r-" + t
    for attempt in range(2):
        try:
            async with pk.resume(t, store=store, run_id=run_id):
                await agent.run("go")
        except UnexpectedModelBehavior as exc:
            assert "exceeded max retries count of 3" in str(exc), exc
        else:
            raise AssertionError("the run did not fail")
        assert effects(d).count("mcp:fail") == 4, (attempt, effects(d))
    names = steps(store, t)
    assert names.count("retries__mcp_server__tests.call_tool") == 4, names


@case
async def case_mcp_instructions_are_a_step(store: pk.Store, d: Path) -> None:
    """test_dbos_mcptoolset_instructions_propagate and ..._uses_step_when_server_warm: the
    server's instructions reach the model through a recorded step; a replay in a cold agent
    gets them from the store without starting the server."""

    def instructions(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart(info.instructions or "")])

    def build() -> Agent[None, str]:
        return Agent(
            FunctionModel(instructions),
            name="instructions",
            toolsets=[mcp_toolset(d, include_instructions=True)],
            capabilities=[PersistkitDurability()],
        )

    t = thread()
    async with pk.resume(t, store=store) as run:
        output = (await build().run("go")).output
    assert "\nAnswer with the recorded values.\n" in output, output
    names = steps(store, t)
    assert "instructions__mcp_server__tests.get_instructions" in names, names
    before = effects(d)
    async with pk.resume(t, store=store, run_id=run.run_id):
        assert (await build().run("go")).output == output
    assert effects(d) == before, "the replay reached the MCP server"


@case
async def case_idless_and_duplicate_mcp_toolsets_refused(store: pk.Store, d: Path) -> None:
    """test_dbos_durability_rejects_idless_mcp_toolset, ..._rejects_duplicate_toolset_id,
    test_capability_contributed_toolsets_with_colliding_derived_id: refused when the agent is
    built (a step name would be ambiguous); the same instance twice and a URL-derived id are
    fine (test_dbos_durability_same_toolset_instance_reused,
    test_capability_contributed_toolset_id_from_capability)."""
    model = FunctionModel(always_fail)
    raises(UserError, "unique `id`", lambda: Agent(
        model, name="idless", toolsets=[mcp_toolset(d, id=None)], capabilities=[PersistkitDurability()]
    ))
    raises(UserError, "same `id` 'dup'", lambda: Agent(
        model, name="dup",
        toolsets=[mcp_toolset(d, id="dup"), mcp_toolset(d, id="dup")],
        capabilities=[PersistkitDurability()],
    ))
    raises(UserError, "Capability id 'a.com' is used by multiple", lambda: Agent(
        model, name="colliding",
        capabilities=[MCP(url="https://a.com/api"), MCP(url="https://a.com/v2/api"), PersistkitDurability()],
    ))
    shared = mcp_toolset(d, id="shared")
    Agent(model, name="shared", toolsets=[shared, shared], capabilities=[PersistkitDurability()])
    Agent(
        model, name="derived",
        capabilities=[Capability(id="billing", tools=[]), MCP(url="https://mcp.example.com/api"), PersistkitDurability()],
    )


@case
async def case_capability_contributed_mcp_toolset_is_recorded(store: pk.Store, d: Path) -> None:
    """test_dbos_durability_wraps_capability_contributed_mcp_toolset: an MCP toolset another
    capability contributes runs in steps too."""
    agent = Agent(
        scripted(d, {0: [("record", 1)]}),
        name="contributed",
        capabilities=[Toolset(mcp_toolset(d, id="cap_mcp")), PersistkitDurability()],
    )
    t = thread()
    async with pk.resume(t, store=store):
        assert (await agent.run("go")).output == "mcp 1 ok"
    names = steps(store, t)
    assert "contributed__mcp_server__cap_mcp.get_tools" in names, names
    assert "contributed__mcp_server__cap_mcp.call_tool" in names, names


@case
async def case_dynamic_capability_mcp_runs_in_steps(store: pk.Store, d: Path) -> None:
    """test_dbos_durability_dynamic_capability_mcp_runs_in_steps: an MCP toolset a dynamic
    capability builds per run is discovered and called in steps of the dynamic toolset."""

    def factory(ctx: RunContext[Any]) -> Capability[Any]:
        return Capability(toolsets=[mcp_toolset(d, id="dynamic_mcp")])

    agent = Agent(
        scripted(d, {0: [("record", 1)]}),
        name="dynamic",
        capabilities=[DynamicCapability(factory, id="dyn_mcp"), PersistkitDurability()],
    )
    t = thread()
    async with pk.resume(t, store=store) as run:
        assert (await agent.run("go")).output == "mcp 1 ok"
    names = steps(store, t)
    assert "dynamic__dynamic_toolset__dyn_mcp.get_tools" in names, names
    assert "dynamic__dynamic_toolset__dyn_mcp.call_tool:record" in names, names
    before = effects(d)
    async with pk.resume(t, store=store, run_id=run.run_id):
        assert (await agent.run("go")).output == "mcp 1 ok"
    assert effects(d) == before


@case
async def case_runtime_mcp_toolset_refused_in_a_run(store: pk.Store, d: Path) -> None:
    """test_dbos_durability_rejects_runtime_mcp_toolset (and ..._in_iter): an MCP toolset given
    to ``run``/``iter`` inside a run would run unrecorded, so it is refused; outside a run it
    works as without the capability."""
    agent = Agent(scripted(d, {0: [("record", 1)]}), name="runtime", capabilities=[PersistkitDurability()])
    message = "MCPToolset 'runtime_mcp' cannot be added at runtime with persistkit"
    for entry in ("run", "iter"):
        try:
            async with pk.resume(thread(), store=store):
                if entry == "run":
                    await agent.run("go", toolsets=[mcp_toolset(d, id="runtime_mcp")])
                else:
                    async with agent.iter("go", toolsets=[mcp_toolset(d, id="runtime_mcp")]):
                        pass
        except UserError as exc:
            assert message in str(exc), exc
        else:
            raise AssertionError(f"{entry}(toolsets=[MCPToolset]) was not refused in a run")
    assert "mcp:1 begin" not in effects(d)
    result = await agent.run("go", toolsets=[mcp_toolset(d, id="runtime_mcp")])
    assert result.output == "mcp 1 ok"
    assert effects(d).count("mcp:1 done") == 1


async def main(url: str, work_dir: Path) -> dict[str, str]:
    results: dict[str, str] = {}
    async with pk.connect(url) as store:
        for name, fn in CASES.items():
            d = work_dir / name
            d.mkdir(parents=True)
            try:
                await fn(store, d)
                results[name] = "ok"
            except BaseException:
                results[name] = traceback.format_exc()
    return results


if __name__ == "__main__":
    out = asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
    print("RESULT " + json.dumps(out), flush=True)
