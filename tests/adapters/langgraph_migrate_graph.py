"""A LangGraph graph whose state changes shape between a crash and the resume.

usage: python langgraph_migrate_graph.py VARIANT URL THREAD LOG KILL

Four nodes ``a b c d`` in a chain, each appending one note and one log entry.

* ``v1``: ``notes: list[Note]`` with ``Note.priority: str`` ("p0"...), ``log: list[str]``.
* ``v2``: the field renamed ``notes`` -> ``memo``, ``Note.priority`` now an ``int``, and
  ``log`` now holds LangChain messages (``AIMessage``); the saver is graph-state
  version 2 with the migration from version 1 (the documented path).
* ``v2-nomigration``: the v2 graph on a version-1 saver with no migration (a deploy
  that forgot it): must be refused with ``SchemaVersionError``, never run.

Each node run is appended to LOG as ``<variant>:<node>``. With KILL a node name,
the process SIGKILLs itself inside that node (before its writes); ``put:<node>``
kills it after that node's writes are committed, in the ``put`` of the checkpoint
after it (before the next node starts); ``-`` never kills. On success the final
state is printed as JSON; a persistkit error is printed as ``ERROR <class>
<message>`` with exit code 2.
"""

from __future__ import annotations

import json
import operator
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pydantic import BaseModel

import persistkit as pk
from persistkit_langgraph import PersistkitSaver, durable_invoke

VARIANT, URL, THREAD, LOG, KILL = sys.argv[1:6]
NODES = "abcd"
V2 = VARIANT.startswith("v2")


def record(name: str) -> None:
    with open(LOG, "a") as f:
        f.write(f"{VARIANT}:{name}\n")
        f.flush()
        os.fsync(f.fileno())


if not V2:

    class Note(BaseModel):
        text: str
        priority: str

    class State(TypedDict):
        notes: Annotated[list[Note], operator.add]
        log: Annotated[list[str], operator.add]

    def node(name: str) -> Any:
        def run(state: State) -> dict[str, Any]:
            record(name)
            if name == KILL:
                os.kill(os.getpid(), signal.SIGKILL)
            i = NODES.index(name)
            return {"notes": [Note(text=name, priority=f"p{i}")], "log": [f"{name} done"]}

        return run

else:

    class Note(BaseModel):  # type: ignore[no-redef]
        text: str
        priority: int

    class State(TypedDict):  # type: ignore[no-redef]
        memo: Annotated[list[Note], operator.add]
        log: Annotated[list[AnyMessage], add_messages]

    def node(name: str) -> Any:
        def run(state: State) -> dict[str, Any]:
            record(name)
            if name == KILL:
                os.kill(os.getpid(), signal.SIGKILL)
            i = NODES.index(name)
            return {"memo": [Note(text=name, priority=i)], "log": [AIMessage(f"{name} done", id=f"log-{name}")]}

        return run


class Saver(PersistkitSaver):
    """With KILL ``put:<node>``: dies in the ``put`` of the checkpoint after that node, once the
    node's writes are committed (LangGraph saves them from a background thread; under
    ``durability="sync"`` that ``put`` runs before the next node starts)."""

    written = threading.Event()

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        super().put_writes(config, writes, task_id, task_path)
        if KILL.startswith("put:") and any(
            c == "log" and v and str(getattr(v[0], "content", v[0])).startswith(KILL[4:] + " ") for c, v in writes
        ):
            self.written.set()

    def put(self, config: RunnableConfig, checkpoint: Any, metadata: Any, new_versions: Any) -> RunnableConfig:
        if KILL.startswith("put:") and metadata.get("step") == NODES.index(KILL[4:]) + 1:
            if not self.written.wait(20):
                sys.exit(3)  # the scenario did not happen: fail loudly rather than kill
            os.kill(os.getpid(), signal.SIGKILL)
        return super().put(config, checkpoint, metadata, new_versions)


def upgrade_notes(channels: dict[str, Any]) -> dict[str, Any]:
    """The documented v1 -> v2 migration: rename a channel, convert nested values."""

    def note(n: Any) -> Note:
        # A stored v1 Note no longer validates as Note (priority "p0"): it arrives as its fields.
        fields = n if isinstance(n, dict) else n.model_dump()
        return Note(text=fields["text"], priority=int(str(fields["priority"]).lstrip("p")))

    if "notes" in channels:
        channels["memo"] = [note(n) for n in channels.pop("notes")]
    if "log" in channels:  # plain strings become messages (ids keep add_messages from duplicating them)
        channels["log"] = [
            m if isinstance(m, AIMessage) else AIMessage(m, id=f"log-{m.split()[0]}") for m in channels["log"]
        ]
    return channels


builder: StateGraph[Any] = StateGraph(State)
prev = START
for name in NODES:
    builder.add_node(name, node(name))
    builder.add_edge(prev, name)
    prev = name
builder.add_edge(prev, END)

saver = Saver.from_url(URL, version=2 if VARIANT == "v2" else 1)
if VARIANT == "v2":
    saver.migration(from_version=1)(upgrade_notes)
try:
    graph = builder.compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": THREAD}}
    start: dict[str, Any] = {"memo": [], "log": []} if V2 else {"notes": [], "log": []}
    try:
        out = durable_invoke(graph, start, config)
    except pk.PersistkitError as exc:
        print(f"ERROR {type(exc).__name__} {exc}")
        sys.exit(2)
    notes = out["memo"] if V2 else out["notes"]
    print(json.dumps({
        "notes": [[n.text, n.priority] for n in notes],
        "log": [getattr(m, "content", m) for m in out["log"]],
        "log_types": sorted({type(m).__name__ for m in out["log"]}),
    }))
finally:
    saver.close()
