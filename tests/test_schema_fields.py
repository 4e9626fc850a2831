"""Stored fields the state class no longer declares (issue 13, item 2).

A field renamed or removed without a version bump, or whose type changed so
that the stored value no longer validates, must be a ``SchemaVersionError``
that names the field and says how to migrate — on every load path (a new run
over a finished thread, the replayed steps of a crashed run, get_state at any
checkpoint, fork, update_state), whatever the class's pydantic ``extra``
setting — and nothing may be written. A new field with a default loads
without a bump; dict state has no schema and reads everything.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Annotated, Any

import pytest
from conftest import uid
from pydantic import BaseModel, ConfigDict

import persistkit as pk


class Crash(BaseException):
    pass


def _schema() -> str:
    return f"tests.schema_fields.Chat-{uuid.uuid4().hex[:8]}"


def _write_v1(store: pk.Store, name: str, *, crashed: bool) -> tuple[str, type[pk.State]]:
    """A thread of ``Chat`` (messages, n): finished, or crashed after two committed steps."""

    class Chat(pk.State, name=name):
        messages: Annotated[list[str], pk.append] = []
        n: int = 0

    @pk.checkpointed(name="s")
    def s(x: str) -> str:
        run = pk.current_run()
        assert run is not None
        run.state.messages.append(x)
        run.state.n += 1
        return x

    tid = uid("fields")
    try:
        with pk.resume(tid, store=store, state=Chat):
            s("important 1")
            s("important 2")
            if crashed:
                raise Crash
    except Crash:
        pass
    return tid, Chat


def _load_paths(store: pk.Store, tid: str) -> dict[str, Callable[[type[Any]], Any]]:
    first = min(cp.checkpoint_id for cp in store.history(tid))

    @pk.checkpointed(name="s")
    def s(x: str) -> str:
        raise AssertionError("a step must not run over a state that cannot be loaded")

    def resume(cls: type[Any]) -> None:
        with pk.resume(tid, store=store, state=cls):
            s("important 1")
            s("new")

    return {
        "resume": resume,
        "get_state": lambda cls: store.get_state(tid, state=cls),
        "get_state_first": lambda cls: store.get_state(tid, first, state=cls),
        "fork": lambda cls: store.fork(tid, state=cls),
        "update_state": lambda cls: store.update_state(tid, {"n": 5}, state=cls),
    }


def _head(store: pk.Store, tid: str) -> tuple[str, int]:
    history = store.history(tid)
    return history[0].checkpoint_id, len(history)


def _renamed(name: str, extra: str | None) -> type[Any]:
    config = ConfigDict(extra=extra) if extra else ConfigDict()  # type: ignore[typeddict-item]

    class Renamed(pk.State, name=name):
        model_config = config
        history: Annotated[list[str], pk.append] = []
        n: int = 0

    return Renamed


@pytest.mark.parametrize("extra", [None, "ignore", "allow", "forbid"])
@pytest.mark.parametrize("crashed", [False, True], ids=["finished", "crashed"])
def test_renamed_field_without_version_bump_is_an_error_on_every_load_path(
    store: pk.Store, crashed: bool, extra: str | None
) -> None:
    name = _schema()
    tid, _ = _write_v1(store, name, crashed=crashed)
    head = _head(store, tid)
    renamed = _renamed(name, extra)
    for path, load in _load_paths(store, tid).items():
        with pytest.raises(pk.SchemaVersionError) as err:
            load(renamed)
        text = str(err.value)
        assert "['messages']" in text and "no longer declares" in text, (path, text)
        assert "version=2" in text and "@pk.migration(Renamed, from_version=1)" in text, (path, text)
        assert "data.pop('messages')" in text and repr(tid) in text, (path, text)
        assert _head(store, tid) == head, path
    # The data is intact: a migration recovers it.
    assert store.get_state(tid) == {"messages": ["important 1", "important 2"], "n": 2}


def test_plain_pydantic_model_renamed_is_an_error_too(store: pk.Store) -> None:
    class Chat(BaseModel):
        messages: list[str] = []

    tid = uid("plain")
    with pk.resume(tid, store=store, state=Chat) as run:
        run.state.messages.append("important")
    renamed = type("Chat", (BaseModel,), {"__annotations__": {"history": list[str]}, "history": [],
                                          "__qualname__": Chat.__qualname__, "__module__": Chat.__module__})
    with pytest.raises(pk.SchemaVersionError, match=r"\['messages'\].*pk\.State"):
        store.get_state(tid, state=renamed)


@pytest.mark.parametrize("crashed", [False, True], ids=["finished", "crashed"])
def test_changed_field_type_that_does_not_validate_is_an_error(store: pk.Store, crashed: bool) -> None:
    name = _schema()
    tid, _ = _write_v1(store, name, crashed=crashed)
    head = _head(store, tid)

    class Retyped(pk.State, name=name):
        messages: Annotated[list[int], pk.append] = []
        n: int = 0

    for path, load in _load_paths(store, tid).items():
        with pytest.raises(pk.SchemaVersionError) as err:
            load(Retyped)
        text = str(err.value)
        assert "['messages']" in text and "does not validate" in text and "version=2" in text, (path, text)
        assert "@pk.migration(Retyped, from_version=1)" in text, (path, text)
        assert _head(store, tid) == head, path

    class Rescalar(pk.State, name=name):
        messages: Annotated[list[str], pk.append] = []
        n: list[str] = []

    with pytest.raises(pk.SchemaVersionError, match=r"\['n'\]"):
        _load_paths(store, tid)["resume"](Rescalar)
    assert _head(store, tid) == head


@pytest.mark.parametrize("crashed", [False, True], ids=["finished", "crashed"])
def test_new_field_with_a_default_loads_without_a_bump(store: pk.Store, crashed: bool) -> None:
    name = _schema()
    tid, _ = _write_v1(store, name, crashed=crashed)

    class Grown(pk.State, name=name):
        messages: Annotated[list[str], pk.append] = []
        n: int = 0
        topic: str = "default"

    @pk.checkpointed(name="s")
    def s(x: str) -> str:
        run = pk.current_run()
        assert run is not None
        run.state.messages.append(x)
        run.state.n += 1
        return x

    with pk.resume(tid, store=store, state=Grown) as run:
        if crashed:
            s("important 1")
            s("important 2")
        s("new")
    assert run.state.messages == ["important 1", "important 2", "new"] and run.state.topic == "default"
    assert store.get_state(tid, state=Grown).model_dump() == {
        "messages": ["important 1", "important 2", "new"], "n": 3, "topic": "default"
    }


def test_dict_state_reads_every_stored_field(store: pk.Store) -> None:
    tid, _ = _write_v1(store, _schema(), crashed=True)
    for cp in store.history(tid):  # dict state: no schema to check against
        assert store.get_state(tid, cp.checkpoint_id)["messages"][:1] == ["important 1"]
