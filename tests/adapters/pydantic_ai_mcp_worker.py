"""A Pydantic AI agent with an MCP server, as its own process (tests/adapters/test_pydantic_ai_mcp.py).

    python pydantic_ai_mcp_worker.py run URL THREAD DIR [--run-id ID] [--kill STEP]
    python pydantic_ai_mcp_worker.py plain DIR

Runs under the MCP target (``fastmcp``, ``mcp>=2``) first on ``PYTHONPATH``; the MCP server is
``pydantic_ai_mcp_server.py`` over stdio, started with this process's environment.

The agent (``FunctionModel``, no network) plays three model requests: the first asks for the
MCP tool ``record(n=1)`` and the function tool ``local(n=1)`` (``sequential=True``: it runs
after the MCP call), the second for ``record(n=2)``, the third answers with the three results
joined. Model requests and the function tool append ``begin`` / ``done`` lines to
``DIR/effects.log`` (``model:<k>``, ``local:1``), as the server does for its calls
(``mcp:<n>``, ``discovery``).

``run``: the agent inside ``pk.resume(THREAD, run_id=ID)`` with ``PersistkitDurability``.
``--kill STEP`` (one of ``STEPS``) SIGKILLs this process inside that unit, after ``begin``
(an MCP call or discovery: the server kills it). Prints ``RESULT <json>``: the output and
the run's status.

``plain``: outside any ``pk.resume``, the agent with the capability and the same agent without
it; prints both outputs and message histories (kinds, parts) as ``RESULT <json>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import persistkit as pk
from persistkit_pydantic_ai import PersistkitDurability

#: Every step of one run, in order: what --kill accepts.
STEPS = ["discovery", "model:0", "mcp:1", "local:1", "model:1", "mcp:2", "model:2"]
SERVER = Path(__file__).with_name("pydantic_ai_mcp_server.py")
#: The tool calls of each model request, by how many tool results came before it; then the answer.
PLAN: dict[int, list[tuple[str, int]]] = {0: [("record", 1), ("local", 1)], 2: [("record", 2)]}
OUTPUT = "mcp 1 ok | local 1 ok | mcp 2 ok"


def effect(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def mcp_toolset(work_dir: Path, kill: str = "", **kwargs: Any) -> MCPToolset[Any]:
    """The test server over stdio, this process's environment passed on (its PYTHONPATH holds
    the MCP target)."""
    env = {
        **os.environ,
        "PK_MCP_EFFECTS": str(work_dir / "effects.log"),
        "PK_MCP_KILL": kill,
        "PK_MCP_AGENT_PID": str(os.getpid()),
    }
    transport = StdioTransport(sys.executable, [str(SERVER)], env=env, keep_alive=False)
    kwargs.setdefault("id", "tests")
    return MCPToolset(transport, init_timeout=60, **kwargs)


def returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]


def scripted(
    work_dir: Path, plan: dict[int, list[tuple[str, int]]], kill: str = ""
) -> FunctionModel:
    """A model that asks, for each number of tool results so far in ``plan``, for those tool
    calls (``(tool, n)``), and otherwise answers with the results joined; model request ``k``
    writes ``model:<k> begin`` / ``done``."""
    effects = work_dir / "effects.log"
    positions = {count: k for k, count in enumerate(sorted(plan))}

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = returns(messages)
        k = positions.get(len(done), len(plan))
        effect(effects, f"model:{k} begin")
        if kill == f"model:{k}":
            os.kill(os.getpid(), signal.SIGKILL)
        parts: list[Any] = [
            ToolCallPart(tool, {"n": n} if n else {}, tool_call_id=f"call_{tool}_{n}_{len(done)}")
            for tool, n in plan.get(len(done), [])
        ] or [TextPart(" | ".join(str(r.content) for r in done))]
        effect(effects, f"model:{k} done")
        return ModelResponse(parts=parts)

    return FunctionModel(model)


def make_agent(work_dir: Path, kill: str = "", *, durable: bool = True) -> Agent[None, str]:
    """The agent of ``run`` and ``plain``: ``PLAN`` with the MCP server and ``local``."""
    effects = work_dir / "effects.log"
    agent = Agent(
        scripted(work_dir, PLAN, kill),
        name="mcp_agent",
        toolsets=[mcp_toolset(work_dir, kill)],
        capabilities=[PersistkitDurability()] if durable else [],
    )

    @agent.tool_plain(sequential=True)
    async def local(n: int) -> str:
        """Do local unit of work ``n`` (a side effect)."""
        effect(effects, f"local:{n} begin")
        if kill == f"local:{n}":
            os.kill(os.getpid(), signal.SIGKILL)
        effect(effects, f"local:{n} done")
        return f"local {n} ok"

    return agent


def history(messages: list[ModelMessage]) -> list[Any]:
    """Kinds, part kinds, tool names, arguments, call ids and contents: no timestamps."""
    keep = {"kind", "part_kind", "tool_name", "args", "tool_call_id", "content"}
    return [
        [m["kind"], [{k: v for k, v in p.items() if k in keep} for p in m["parts"]]]
        for m in ModelMessagesTypeAdapter.dump_python(messages, mode="json")
    ]


async def run(a: argparse.Namespace) -> dict[str, Any]:
    agent = make_agent(a.dir, a.kill)
    async with pk.connect(a.url) as store, pk.resume(a.thread, store=store, run_id=a.run_id) as r:
        result = await agent.run("go")
    return {"output": result.output, "status": r.status, "run_id": r.run_id, "history": history(result.all_messages())}


async def plain(a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for durable in (True, False):
        result = await make_agent(a.dir, durable=durable).run("go")
        out["durable" if durable else "bare"] = {
            "output": result.output,
            "history": history(result.all_messages()),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("run")
    p.add_argument("url")
    p.add_argument("thread")
    p.add_argument("dir", type=Path)
    p.add_argument("--run-id", default=None)
    p.add_argument("--kill", default="", choices=["", *STEPS])
    p = sub.add_parser("plain")
    p.add_argument("dir", type=Path)
    a = parser.parse_args()
    result = asyncio.run(run(a) if a.mode == "run" else plain(a))
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
