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

import re
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


# -- a state stored as a plain dict counts as version 0 of any class ----------------------------

_SUGGESTED = re.compile(r"@pk\.migration\(([\w.<>]+), from_version=(\d+)\)")  # a local class: its qualname


def _write_dict(store: pk.Store, *, crashed: bool, retyped: bool = False) -> str:
    """A thread whose state is a plain dict (no schema stamp): finished, or crashed after two
    steps; ``retyped``: its ``n`` is ``{"count": n}``, not an int."""

    @pk.checkpointed(name="s")
    def s(x: str) -> str:
        run = pk.current_run()
        assert run is not None
        run.state.setdefault("messages", []).append(x)
        n = run.state.get("n", {"count": 0} if retyped else 0)
        run.state["n"] = {"count": n["count"] + 1} if retyped else n + 1
        return x

    tid = uid("dict")
    try:
        with pk.resume(tid, store=store):
            s("important 1")
            s("important 2")
            if crashed:
                raise Crash
    except Crash:
        pass
    return tid


def _follow(text: str, cls: type[pk.State], calls: list[int]) -> set[int]:
    """Register every migration ``text`` suggests: the first converts the stored fields, all count."""
    suggested = {int(v) for name, v in _SUGGESTED.findall(text) if name.rsplit(".", 1)[-1] == cls.__name__}

    def upgrade(v: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def fn(data: dict[str, Any]) -> dict[str, Any]:
            calls.append(v)
            if v == min(suggested):  # the stored shape -> the class's (the chain after it: unchanged)
                if "history" in cls.model_fields and "messages" in data:
                    data["history"] = data.pop("messages")
                n = data.get("n", 0)
                n = n["count"] if isinstance(n, dict) else n
                data["n"] = type(cls.model_fields["n"].default)(n)
            return data

        return fn

    for v in sorted(suggested):
        pk.migration(cls, from_version=v)(upgrade(v))
    return suggested


@pytest.mark.parametrize("version", [1, 3])
@pytest.mark.parametrize("mismatch", ["renamed", "retyped"])
@pytest.mark.parametrize("crashed", [False, True], ids=["finished", "crashed"])
def test_dict_stored_state_loads_by_following_the_suggested_migration_from_version_0(
    store: pk.Store, crashed: bool, mismatch: str, version: int
) -> None:
    # retyped: the stored fields' names fit the class, a value does not validate
    tid = _write_dict(store, crashed=crashed, retyped=mismatch == "retyped")
    head = _head(store, tid)
    if mismatch == "retyped":

        class Chat(pk.State, name=_schema(), version=version):
            messages: Annotated[list[str], pk.append] = []
            n: int = 0

    else:

        class Chat(pk.State, name=_schema(), version=version):  # type: ignore[no-redef]
            history: Annotated[list[str], pk.append] = []
            n: int = 0

    for path, load in _load_paths(store, tid).items():
        with pytest.raises(pk.SchemaVersionError) as err:
            load(Chat)
        text = str(err.value)
        assert "@pk.migration(Chat, from_version=0)" in text and "a dict" in text, (path, text)
        assert f"version={version + 1}" not in text, (path, text)  # no bump: it would not help
        assert _head(store, tid) == head, path
    calls: list[int] = []
    assert _follow(text, Chat, calls) == set(range(version))  # 0, and the chain up to the class

    @pk.checkpointed(name="s")
    def s(x: str) -> str:
        run = pk.current_run()
        assert run is not None
        getattr(run.state, "messages" if mismatch == "retyped" else "history").append(x)
        return x

    field = "messages" if mismatch == "retyped" else "history"
    want = ["important 1", "important 2"]
    assert getattr(store.get_state(tid, state=Chat), field) == want
    assert calls[:version] == list(range(version))  # version 0 first, then 1 -> 2 -> ...
    fork = store.fork(tid, state=Chat)
    assert getattr(store.get_state(fork.thread_id, state=Chat), field) == want
    with pk.resume(tid, store=store, state=Chat) as run:
        if crashed:  # replayed over the dict-stored steps of the crashed run
            s("important 1")
            s("important 2")
        s("new")
    assert getattr(run.state, field) == [*want, "new"] and run.state.n == 2
    assert store.history(tid)[0].schema == (Chat.__pk_schema__, version)
    calls.clear()
    assert store.get_state(tid, state=Chat).n == 2 and calls == []  # stamped now: no migration
    # The reverse still reads everything: typed state as a dict.
    assert store.get_state(tid)[field] == [*want, "new"]


def test_dict_stored_chain_error_names_every_missing_migration(store: pk.Store) -> None:
    tid = _write_dict(store, crashed=False)

    class Chat(pk.State, name=_schema(), version=3):
        history: list[str] = []
        n: int = 0

    calls: list[int] = []
    _follow("@pk.migration(Chat, from_version=0)", Chat, calls)  # only the first step
    with pytest.raises(pk.SchemaVersionError) as err:
        store.get_state(tid, state=Chat)
    text = str(err.value)
    assert "a dict (no schema, version 0)" in text and calls == []
    assert _follow(text, Chat, calls) == {1, 2}
    assert store.get_state(tid, state=Chat).history == ["important 1", "important 2"]
    assert calls == [0, 1, 2]


def test_dict_stored_state_whose_keys_fit_loads_without_a_migration(store: pk.Store) -> None:
    tid = _write_dict(store, crashed=True)

    class Chat(pk.State, name=_schema(), version=2):
        messages: Annotated[list[str], pk.append] = []
        n: int = 0

    assert store.get_state(tid, state=Chat).messages == ["important 1", "important 2"]


@pytest.mark.parametrize("bad", [-1, 2, None, True, "0"])
def test_migration_from_version_out_of_range_names_the_range_from_0(bad: Any) -> None:
    class Chat(pk.State, name=_schema(), version=2):
        history: list[str] = []

    with pytest.raises(pk.ConfigurationError, match=r"between 0 \(a state stored as a plain dict\) and 1"):
        pk.migration(Chat, from_version=bad)
    pk.migration(Chat, from_version=0)(lambda data: data)  # the low end the message names is accepted
    pk.migration(Chat, from_version=1)(lambda data: data)



@pytest.mark.parametrize("mismatch", ["renamed", "retyped"])
def test_typed_stored_state_loads_by_following_the_suggested_bump(store: pk.Store, mismatch: str) -> None:
    name = _schema()
    tid, _ = _write_v1(store, name, crashed=False)

    def chat(version: int) -> type[pk.State]:
        if mismatch == "retyped":

            class Chat(pk.State, name=name, version=version):
                messages: Annotated[list[str], pk.append] = []
                n: str = ""

            return Chat

        class Chat(pk.State, name=name, version=version):  # type: ignore[no-redef]
            history: Annotated[list[str], pk.append] = []
            n: int = 0

        return Chat

    with pytest.raises(pk.SchemaVersionError) as err:
        store.get_state(tid, state=chat(1))
    text = str(err.value)
    bump = re.search(r"class Chat\(pk\.State, version=(\d+), name=('[^']+')\)", text)
    assert bump is not None and bump.group(2) == repr(name), text
    bumped = chat(int(bump.group(1)))
    calls: list[int] = []
    assert _follow(text, bumped, calls) == {1}
    state = store.get_state(tid, state=bumped)
    assert calls == [1] and state.n == (2 if mismatch == "renamed" else "2")
