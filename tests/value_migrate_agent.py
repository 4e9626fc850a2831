"""A 4-step chat agent whose *value* classes change between code versions (tests/test_value_migrations_resume.py).

    AGENT_KIND=KIND AGENT_VERSION=V python -c "import value_migrate_agent as a; a.main()" URL THREAD KILL_AT COUNTER

Version 1 is the README's shape: a ``pk.State`` with ``messages: list[Msg]``
(``Msg`` a pydantic model), each step returning the assistant's ``Msg``, the
last reply also kept in a ``dict[str, Any]`` field. Version 2 differs by KIND:

- ``nested``: ``Msg`` renames ``text`` to ``content`` and gains ``chars``,
  converted by a class migration (``pk.register(Msg, version=2)``).
- ``state``: the same ``Msg`` change with no class version: the state class
  goes to version 2, and its migration converts the messages it is handed as
  dicts (and the one held in the ``Any`` field). Its step returns text (a
  recorded ``Msg`` result would need the class version of ``nested``).
- ``result``: the step returns a ``Reply`` dataclass whose ``text`` becomes
  ``body`` plus ``words`` (``@pk.register(version=2)`` and a class migration);
  step 1 raises ``Refused(reply)``, which the agent catches, so a recorded
  error carrying a ``Reply`` is replayed too.

Each step appends its index to COUNTER (a side effect persistkit does not know
about); with KILL_AT >= 0 the process SIGKILLs itself inside that step, after
its side effect. Version-2 code prints, as JSON, the run's output and final
state, then what a new process reads back: the head, every checkpoint of the
(mixed-version) history, a fork of the first step's checkpoint, and a new run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from typing import Annotated, Any

from pydantic import BaseModel

import persistkit as pk

STEPS = 4
KINDS = ("nested", "state", "result")
KIND = os.environ.get("AGENT_KIND", "nested")
VERSION = int(os.environ.get("AGENT_VERSION", "1"))
NEW_MSG = VERSION == 2 and KIND in ("nested", "state")
NEW_REPLY = VERSION == 2 and KIND == "result"


if NEW_MSG:

    class Msg(BaseModel):
        role: str
        content: str
        chars: int

else:

    class Msg(BaseModel):  # type: ignore[no-redef]
        role: str
        text: str


def msg(role: str, text: str) -> Msg:
    return Msg(role=role, content=text, chars=len(text)) if NEW_MSG else Msg(role=role, text=text)  # type: ignore[call-arg]


def msg_text(m: Any) -> str:
    return str(m.content if NEW_MSG else m.text)


if KIND == "nested" and NEW_MSG:
    pk.register(Msg, version=2)

    @pk.migration(Msg, from_version=1)
    def msg_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
        data["content"] = data.pop("text")
        data["chars"] = len(data["content"])
        return data


if NEW_REPLY:

    @pk.register(version=2)
    @dataclasses.dataclass
    class Reply:
        body: str
        words: int

    @pk.migration(Reply, from_version=1)
    def reply_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
        data["body"] = data.pop("text")
        data["words"] = len(data["body"].split())
        return data

else:

    @pk.register
    @dataclasses.dataclass
    class Reply:  # type: ignore[no-redef]
        text: str


def reply(text: str) -> Reply:
    return Reply(body=text, words=len(text.split())) if NEW_REPLY else Reply(text=text)  # type: ignore[call-arg]


def reply_text(r: Any) -> str:
    return f"{r.body} ({r.words} words)" if NEW_REPLY else f"{r.text} ({len(r.text.split())} words)"


class Refused(Exception):
    """A step's failure that the agent handles; its argument is a Reply."""


STATE_V2 = VERSION == 2 and KIND == "state"


class Chat(pk.State, name="tests.value_migrate_agent.chat", version=2 if STATE_V2 else 1):
    messages: Annotated[list[Msg], pk.append] = []
    notes: dict[str, Any] = {}
    turns: int = 0


if STATE_V2:

    @pk.migration(Chat, from_version=1)
    def chat_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
        # Handed plain data: each stored Msg is a dict of its stored fields.
        for m in [*data["messages"], *([data["notes"]["last"]] if "last" in data["notes"] else [])]:
            assert isinstance(m, dict), type(m)
            m["content"] = m.pop("text")
            m["chars"] = len(m["content"])
        return data


def run_agent(
    store: pk.Store, thread: str, run_id: str | None, effect: Any, crash: Any, steps: int = STEPS, first: int = 0
) -> dict[str, Any]:
    @pk.checkpointed(name="turn")
    def turn(i: int) -> Any:
        effect(i)
        crash(i)
        text = f"answer {i} " + "word " * i
        if KIND == "result":
            if i == 1:
                raise Refused(reply(f"no {i}"))
            return reply(text)
        if KIND == "state":
            return text  # a state migration converts state, not recorded results: those need a class version
        return msg("assistant", text)

    out: list[str] = []
    with pk.resume(thread, store=store, state=Chat, run_id=run_id) as run:
        for i in range(first, first + steps):
            run.state.messages.append(msg("user", f"question {i}"))
            try:
                r = turn(i)
            except Refused as exc:
                out.append("refused: " + reply_text(exc.args[0]))
                continue
            run.state.turns += 1
            if KIND == "result":
                out.append(reply_text(r))
            else:
                if KIND == "state":
                    r = msg("assistant", r)
                run.state.messages.append(r)
                run.state.notes["last"] = r
                out.append(msg_text(r))
    return {"out": out, "state": run.state.model_dump(mode="json")}


def dump(state: Any) -> Any:
    return state.model_dump(mode="json")


def inspect(store: pk.Store, thread: str) -> dict[str, Any]:
    """What a new process of this code reads back from the thread."""
    history = store.history(thread)
    first_step = min((cp for cp in history if cp.kind == "step"), key=lambda cp: cp.checkpoint_id)
    fork = store.fork(thread, first_step.checkpoint_id, state=Chat)
    return {
        "head": dump(store.get_state(thread, state=Chat)),
        "history": [dump(store.get_state(thread, cp.checkpoint_id, state=Chat)) for cp in history],
        "schemas": [list(cp.schema) if cp.schema else None for cp in history],
        "fork": dump(store.get_state(fork.thread_id, state=Chat)),
        "fork_of": dump(store.get_state(thread, first_step.checkpoint_id, state=Chat)),
        "next": run_agent(store, thread, None, lambda i: None, lambda i: None, steps=1, first=STEPS),
    }


def main() -> None:
    url, thread, kill_at, counter = sys.argv[1:5]

    def effect(i: int) -> None:
        with open(counter, "a") as f:
            f.write(f"{i}\n")
            f.flush()
            os.fsync(f.fileno())

    def crash(i: int) -> None:
        if i == int(kill_at):
            os.kill(os.getpid(), signal.SIGKILL)

    with pk.connect(url) as store:
        result = run_agent(store, thread, f"{thread}-run", effect, crash)
        if VERSION == 2:
            result["inspect"] = inspect(store, thread)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
