"""One process of the session-secret test: ``write`` adds an item holding the
environment's key to a ``PersistkitSession``; ``run`` sends a plain
``Runner.run(agent, input, session=...)`` with a model that records what it is handed.

    python openai_session_secret.py write|run URL SESSION_ID OUT_FILE
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from agents import Agent, Runner, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

import persistkit as pk
from persistkit_openai_agents import PersistkitSession

MODE, URL, SESSION, OUT = sys.argv[1:5]


class Recording(Model):
    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        with open(OUT, "a") as f:
            f.write(json.dumps([i.get("content") for i in input if isinstance(i, dict)]) + "\n")
        text = ResponseOutputText(type="output_text", text="ok", annotations=[])
        message = ResponseOutputMessage(type="message", id="m", role="assistant", status="completed", content=[text])
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


async def main() -> dict[str, Any]:
    set_tracing_disabled(True)
    session = PersistkitSession(SESSION, pk.connect(URL))
    if MODE == "write":
        await session.add_items([{"role": "user", "content": f"my key is {os.environ['PK_TEST_OPENAI_API_KEY']}"}])
        return {"done": True}
    try:
        await Runner.run(Agent(name="a", instructions="x", model=Recording()), "what is my key?", session=session)
    except pk.SecretResolutionError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"done": True}


print(json.dumps(asyncio.run(main())))
