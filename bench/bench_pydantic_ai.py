"""Per-step cost of a durable Pydantic AI agent: ``PersistkitDurability`` vs ``DBOSDurability``.

One agent turn: a ``FunctionModel`` (no network) asks for one tool call per request,
``TURNS`` times, then answers. Four subjects run the same turn, interleaved, ROUNDS
times each, in one process on one database (PostgreSQL at $PERSISTKIT_BENCH_PG, default
``postgresql://127.0.0.1:5432/test``, each in its own schema; ``--sqlite`` for files):

* plain: the agent without durability (the baseline);
* persistkit: ``PersistkitDurability`` inside ``pk.resume`` — each model request and each
  tool call is a step (2 * TURNS + 1 steps);
* DBOS: ``DBOSDurability`` inside a ``@DBOS.workflow`` — each model request is a step;
  function tools are not wrapped (TURNS + 1 steps), so DBOS records fewer steps.

Printed: the median turn time, the durable steps recorded, the cost per step over the
plain baseline (``(turn - plain) / steps``), and persistkit's ratio to DBOS.
Run: ``python bench/bench_pydantic_ai.py [--sqlite]``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import persistkit as pk
from persistkit_pydantic_ai import PersistkitDurability

TURNS = 20
ROUNDS = 7
PG = os.environ.get("PERSISTKIT_BENCH_PG", "postgresql://127.0.0.1:5432/test")
TAG = uuid.uuid4().hex[:8]


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
    if done < TURNS:
        return ModelResponse(parts=[ToolCallPart("work", {"n": done}, tool_call_id=f"c{done}")])
    return ModelResponse(parts=[TextPart("x" * 200)])


def make(name: str, capability: Any | None) -> Agent[None, str]:
    agent = Agent(FunctionModel(model), name=name, capabilities=[capability] if capability else [])

    @agent.tool_plain
    def work(n: int) -> str:
        return f"result {n} " + "y" * 200

    return agent


def main() -> None:
    use_sqlite = "--sqlite" in sys.argv
    tmp = Path(tempfile.mkdtemp(prefix="pkbench-pyd-"))
    from dbos import DBOS
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    logging.getLogger("dbos").setLevel(logging.ERROR)
    if use_sqlite:
        pk_url, dbos_url = f"sqlite:///{tmp}/pk.db", f"sqlite:///{tmp}/dbos.sqlite"
        where = "SQLite files"
    else:
        pk_url, dbos_url = f"{PG}?schema=pkbench_pyd_{TAG}", PG
        where = f"PostgreSQL {PG}"
    config: dict[str, Any] = {
        "name": f"pkbench-pyd-{TAG}",
        "system_database_url": dbos_url,
        "run_admin_server": False,
    }
    if not use_sqlite:
        config["dbos_system_schema"] = f"dbos_pyd_{TAG}"
    DBOS(config=config)  # type: ignore[arg-type]

    plain = make("plain", None)
    durable = make("pk", PersistkitDurability())
    dbos_agent = make("dbosagent", DBOSDurability())

    @DBOS.workflow()
    async def dbos_turn(prompt: str) -> str:
        return (await dbos_agent.run(prompt)).output

    DBOS.launch()
    store = pk.connect(pk_url)

    async def run_plain() -> None:
        await plain.run("go")

    async def run_pk() -> None:
        async with pk.resume(uuid.uuid4().hex, store=store):
            await durable.run("go")

    async def run_dbos() -> None:
        await dbos_turn("go")

    subjects = {"plain": run_plain, "persistkit": run_pk, "DBOS": run_dbos}
    steps = {"plain": 0, "persistkit": 2 * TURNS + 1, "DBOS": TURNS + 1}
    times: dict[str, list[float]] = {k: [] for k in subjects}

    async def bench() -> None:
        for fn in subjects.values():  # warm up
            await fn()
        for _ in range(ROUNDS):
            for key, fn in subjects.items():
                t0 = time.perf_counter()
                await fn()
                times[key].append(time.perf_counter() - t0)

    try:
        asyncio.run(bench())
    finally:
        store.close()
        DBOS.destroy(destroy_registry=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    per_step = {k: (med[k] - med["plain"]) / steps[k] * 1e6 for k in ("persistkit", "DBOS")}
    print(f"Pydantic AI agent turn ({TURNS} tool calls) on {where}; median of {ROUNDS} rounds")
    print(f"{'subject':<12}{'turn ms':>10}{'steps':>8}{'µs/step over plain':>22}")
    for k in subjects:
        extra = f"{per_step[k]:>22.0f}" if k in per_step else f"{'(baseline)':>22}"
        print(f"{k:<12}{med[k] * 1e3:>10.1f}{steps[k]:>8}{extra}")
    print(f"persistkit / DBOS per step: {per_step['persistkit'] / per_step['DBOS']:.2f}")
    print(
        f"persistkit / DBOS per turn: {(med['persistkit'] - med['plain']) / (med['DBOS'] - med['plain']):.2f}"
        " (persistkit also records every tool call)"
    )


if __name__ == "__main__":
    main()
