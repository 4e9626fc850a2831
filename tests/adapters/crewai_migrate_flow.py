"""A CrewAI flow whose state model changes shape between a crash and the resume.

usage: python crewai_migrate_flow.py VARIANT URL FLOW_ID LOG KILL

Methods ``fetch -> clean -> route (router) -> summarize -> publish``, each adding
one step to the flow's state.

* ``v1``: ``Report.steps: list[str]`` and ``Report.score: str`` ("s1", "s2", ...).
* ``v2``: ``steps`` renamed ``done``, ``score`` now an ``int``; the model is
  registered as version 2 with the migration from version 1 (the documented path).
* ``v2-nomigration``: the v2 model without a version or migration (a deploy that
  forgot it): must be refused with ``SchemaVersionError`` before any method runs.

Each method run is appended to LOG as ``<variant>:<method>``. KILL names a method
(the process SIGKILLs itself inside it, before it returns), ``saved:<method>``
(right after that method's state was saved), or ``-``. On success the final state
is printed as ``RESULT <json>``; a persistkit error as ``ERROR <class> <message>``
with exit code 2. No model and no network are used.
"""

from __future__ import annotations

import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

import json
import signal
import sys
from typing import Any, ClassVar

from crewai.flow.flow import Flow, listen, router, start
from crewai.flow.persistence import persist
from pydantic import BaseModel

import persistkit as pk
from persistkit_crewai import PersistkitFlowPersistence

VARIANT, URL, FLOW_ID, LOG, KILL = sys.argv[1:6]
V2 = VARIANT.startswith("v2")
METHODS = ["fetch", "clean", "route", "summarize", "publish"]


def record(name: str) -> None:
    with open(LOG, "a") as f:
        f.write(f"{VARIANT}:{name}\n")
        f.flush()
        os.fsync(f.fileno())
    if name == KILL:
        os.kill(os.getpid(), signal.SIGKILL)


if not V2:

    class Report(BaseModel):
        id: str = ""
        steps: list[str] = []
        score: str = "s0"

    def add(state: Report, name: str) -> None:
        state.steps.append(name)
        state.score = f"s{len(state.steps)}"

    def steps(state: Report) -> list[str]:
        return state.steps

else:

    class Report(BaseModel):  # type: ignore[no-redef]
        id: str = ""
        done: list[str] = []
        score: int = 0

    def add(state: Report, name: str) -> None:
        state.done.append(name)
        state.score = len(state.done)

    def steps(state: Report) -> list[str]:
        return state.done

    if VARIANT == "v2":
        pk.register(Report, version=2)  # type: ignore[call-arg]

        @pk.migration(Report, from_version=1)
        def upgrade(data: dict[str, Any]) -> dict[str, Any]:
            """The documented v1 -> v2 migration: rename a field, convert a value's type."""
            data["done"] = data.pop("steps", [])
            data["score"] = int(str(data.get("score", "s0")).lstrip("s"))
            return data


class Persistence(PersistkitFlowPersistence):
    """Dies right after a method's state was saved when KILL is ``saved:<method>``."""

    def save_state(self, flow_uuid: str, method_name: str, state_data: Any) -> None:
        super().save_state(flow_uuid, method_name, state_data)
        if f"saved:{method_name}" == KILL:
            os.kill(os.getpid(), signal.SIGKILL)


store = pk.connect(URL)
persistence = Persistence(store)


@persist(persistence)
class Pipeline(Flow[Report]):
    _skip_auto_memory: ClassVar[bool] = True  # CrewAI's switch against creating a (lancedb) Memory

    def _step(self, name: str) -> str:
        record(name)
        add(self.state, name)
        return name

    @start()
    def fetch(self) -> str:
        return self._step("fetch")

    @listen(fetch)
    def clean(self) -> str:
        return self._step("clean")

    @router(clean)
    def route(self) -> str:
        record("route")
        return "ready" if "clean" in steps(self.state) else "abort"

    @listen("ready")
    def summarize(self) -> str:
        return self._step("summarize")

    @listen(summarize)
    def publish(self) -> str:
        return self._step("publish")


if __name__ == "__main__":
    flow = Pipeline(suppress_flow_events=True)
    try:
        persistence.restore(flow, FLOW_ID)  # False when nothing was saved yet
        flow.kickoff(inputs={"id": FLOW_ID})
    except pk.PersistkitError as exc:
        print(f"ERROR {type(exc).__name__} {exc}")
        sys.exit(2)
    finally:
        store.close()
    print("RESULT " + json.dumps({"steps": steps(flow.state), "score": flow.state.score}))
