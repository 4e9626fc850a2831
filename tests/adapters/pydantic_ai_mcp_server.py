"""A small MCP server (fastmcp, stdio) for tests/adapters/test_pydantic_ai_mcp.py.

Runs under the MCP target's ``fastmcp`` / ``mcp>=2`` (``pydantic_ai_mcp_worker.py`` starts it
with its own environment). Every tool call and tool listing appends ``begin`` and ``done``
lines to the file ``PK_MCP_EFFECTS`` names (side effects persistkit does not know about):

* ``record(n)`` — ``mcp:<n> begin`` / ``mcp:<n> done``, returns ``mcp <n> ok``;
* ``data(n)`` / ``picture()`` — a structured result and an image (``mcp:data`` / ``mcp:picture``);
* ``fail()`` — always a tool error (``mcp:fail``), so the agent's retry budget ends the run;
* a tool listing (discovery) — ``discovery begin`` / ``discovery done``;
* the server's start — ``server start``.

``PK_MCP_KILL`` (``mcp:<n>`` or ``discovery``) makes that call SIGKILL the agent's process
(pid ``PK_MCP_AGENT_PID``) after ``begin``: the agent dies with the call in flight, and this
server exits without writing ``done``.
"""

from __future__ import annotations

import base64
import os
import signal
from collections.abc import Sequence
from typing import Any

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from mcp.types import ImageContent


def effect(line: str) -> None:
    with open(os.environ["PK_MCP_EFFECTS"], "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def begin(unit: str) -> None:
    """Write ``<unit> begin``; if this unit is the one to kill at, kill the agent and exit."""
    effect(f"{unit} begin")
    if os.environ.get("PK_MCP_KILL") == unit:
        os.kill(int(os.environ["PK_MCP_AGENT_PID"]), signal.SIGKILL)
        os._exit(0)


class Discovery(Middleware):
    async def on_list_tools(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Sequence[Any]]) -> Sequence[Any]:
        begin("discovery")
        tools = await call_next(context)
        effect("discovery done")
        return tools


server = FastMCP("persistkit test server", instructions="Answer with the recorded values.")
server.add_middleware(Discovery())


@server.tool()
async def record(n: int) -> str:
    """Record unit of work ``n`` (a side effect) and say so."""
    begin(f"mcp:{n}")
    effect(f"mcp:{n} done")
    return f"mcp {n} ok"


@server.tool()
async def data(n: int) -> dict[str, Any]:
    """A structured result."""
    effect("mcp:data")
    return {"n": n, "items": ["a", "b"], "nested": {"ok": True}}


@server.tool()
async def picture() -> ImageContent:
    """An image result."""
    effect("mcp:picture")
    return ImageContent(type="image", data=base64.b64encode(b"\x89PNG\r\n\x1a\n").decode(), mimeType="image/png")


@server.tool()
async def fail() -> str:
    """Always fails."""
    effect("mcp:fail")
    raise ToolError("this tool always fails")


if __name__ == "__main__":
    effect("server start")
    server.run(show_banner=False)
