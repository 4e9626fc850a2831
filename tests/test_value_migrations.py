"""Versions and migrations of nested values and of any registered class (issue 18, section 1).

Two versions of a class live in one process here by sharing a stored name:
the version-2 class is given the version-1 class's ``__qualname__`` and
registered after the version-1 values were stored, as a deploy would.
Across real processes and every store: tests/test_value_migrations_resume.py.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import pytest
from conftest import uid
from pydantic import BaseModel, ConfigDict

import persistkit as pk
from persistkit.codec._serde import Serializer
from persistkit.codec._versions import Plain

SER = Serializer()


def named(name: str) -> Any:
    """Give a class the stored name ``tests...:name`` (a later version of a class of that name)."""

    def set_name(cls: Any) -> Any:
        cls.__qualname__ = cls.__name__ = name
        return cls

    return set_name


class Crash(BaseException):
    """A process death in miniature: nothing is recorded for the step in flight."""


# -- the README's shape: a state migration is handed nested models as dicts --------------------------


def store_v1_chat(store: pk.Store, tid: str, tag: str) -> None:
    @named(f"Msg_{tag}")
    class Msg(BaseModel):
        role: str
        text: str

    @named(f"Tag_{tag}")
    class Tag(BaseModel):
        name: str

    class Chat(pk.State, name=f"chat_{tag}"):
        messages: Annotated[list[Msg], pk.append] = []
        notes: dict[str, Any] = {}
        pair: tuple[Msg, int] | None = None

    with pk.resume(tid, store=store, state=Chat) as run:
        for i in range(5):
            run.state.messages.append(Msg(role="user", text=f"m{i}"))
        run.state.notes = {"deep": {"list": [Msg(role="x", text="deep")]}, "tag": Tag(name="kept")}
        run.state.pair = (Msg(role="p", text="pair"), 7)


def test_state_migration_is_handed_nested_models_as_dicts_at_any_depth(local_store: pk.Store) -> None:
    tid = uid("readme")
    store_v1_chat(local_store, tid, "a")

    @named("Msg_a")
    class Msg(BaseModel):
        role: str
        content: str

    @named("Tag_a")
    class Tag(BaseModel):
        name: str

    pk.register(Msg)
    pk.register(Tag)
    seen: list[Any] = []

    class Chat(pk.State, name="chat_a", version=2):
        messages: Annotated[list[Msg], pk.append] = []
        notes: dict[str, Any] = {}
        pair: tuple[Msg, int] | None = None

    @pk.migration(Chat, from_version=1)
    def upgrade(data: dict[str, Any]) -> dict[str, Any]:
        deep = data["notes"]["deep"]["list"][0]
        seen.extend([data["messages"][3], deep, data["pair"][0], data["notes"]["tag"]])
        for m in [*data["messages"], deep, data["pair"][0]]:
            m["content"] = m.pop("text")
        return data

    state = local_store.get_state(tid, state=Chat)
    assert all(type(s) is Plain and isinstance(s, dict) for s in seen)
    assert seen[0] == {"role": "user", "content": "m3"}  # mutated in place by the migration
    assert [m.content for m in state.messages] == [f"m{i}" for i in range(5)]
    assert all(type(m) is Msg for m in state.messages)
    # Nodes under Any are revived as their class too (the migration edited or left them).
    assert state.notes["deep"]["list"][0] == Msg(role="x", content="deep")
    assert state.notes["tag"] == Tag(name="kept") and type(state.notes["tag"]) is Tag
    assert state.pair == (Msg(role="p", content="pair"), 7)
    # Every load path: a resumed run, history's checkpoints, a fork.
    with pk.resume(tid, store=local_store, state=Chat) as run:
        assert run.state.messages[4].content == "m4"
        run.state.messages.append(Msg(role="user", content="m5"))
    for cp in local_store.history(tid):
        local_store.get_state(tid, cp.checkpoint_id, state=Chat)
    fork = local_store.fork(tid, local_store.history(tid)[-1].checkpoint_id, state=Chat)
    assert local_store.get_state(fork.thread_id, state=Chat).messages[0].content == "m0"


def test_a_changed_nested_model_without_migration_is_a_schema_error_naming_the_path(local_store: pk.Store) -> None:
    tid = uid("nomig")
    store_v1_chat(local_store, tid, "b")

    @named("Msg_b")
    class Msg(BaseModel):
        role: str
        content: str

    pk.register(Msg)

    class Chat(pk.State, name="chat_b"):
        messages: Annotated[list[Msg], pk.append] = []
        notes: dict[str, Any] = {}
        pair: tuple[Msg, int] | None = None

    before = len(local_store.history(tid))
    for load in (
        lambda: local_store.get_state(tid, state=Chat),
        lambda: pk.resume(tid, store=local_store, state=Chat).__enter__(),
    ):
        with pytest.raises(pk.SchemaVersionError) as err:
            load()
        text = str(err.value)
        assert "state.messages[0].text" in text and "Msg_b" in text, text
        assert "pk.register(Msg_b, version=2)" in text and "@pk.migration(Msg_b, from_version=1)" in text
        assert "finish the runs" in text and "ValidationError" not in text
    assert len(local_store.history(tid)) == before  # nothing written


# -- class versions --------------------------------------------------------------------------------


def test_a_class_version_is_stamped_in_the_tag_and_unstamped_values_are_version_1() -> None:
    @named("Stamp")
    class V1(BaseModel):
        a: int

    old = SER.dumps([V1(a=1)])
    assert b'"r"' not in old  # no version: the tag is as before

    @named("Stamp")
    class V2(BaseModel):
        b: int

    pk.register(V2, version=2)
    new = SER.dumps(V2(b=2))
    assert json.loads(new) == {"__pk__": "m", "c": f"{__name__}:Stamp", "r": 2, "v": {"b": 2}}

    @pk.migration(V2, from_version=1)
    def up(data: dict[str, Any]) -> dict[str, Any]:
        assert type(data) is dict
        return {"b": data["a"] * 10}

    assert SER.loads(old) == [V2(b=10)] and SER.loads(new) == V2(b=2)

    @named("StampOne")
    class One(BaseModel):
        a: int

    pk.register(One, version=1)  # version 1 written out: still no stamp
    assert b'"r"' not in SER.dumps(One(a=1))


def test_class_migrations_apply_at_any_depth_and_chain_from_each_stored_version() -> None:
    @named("Part")
    class P1(BaseModel):
        x: int

    @named("Box")
    @dataclasses.dataclass
    class Box:
        parts: dict[str, list[Any]]

    v1 = SER.dumps({"k": [Box({"a": [P1(x=1), (P1(x=2),)]})]})

    @named("Part")
    class P2(BaseModel):
        y: int

    pk.register(P2, version=2)
    v2 = SER.dumps(P2(y=5))

    @named("Part")
    class P3(BaseModel):
        z: str

    pk.register(P3, version=3)
    pk.migration(P3, from_version=1)(lambda d: {"y": d["x"]})
    pk.migration(P3, from_version=2)(lambda d: {"z": str(d["y"])})
    out = SER.loads(v1)
    parts = out["k"][0].parts["a"]
    assert parts[0] == P3(z="1") and parts[1] == (P3(z="2"),) and type(parts[0]) is P3
    assert SER.loads(v2) == P3(z="5")


def test_a_dataclass_with_the_decorator_form() -> None:
    @named("DC")
    @dataclasses.dataclass(frozen=True)
    class D1:
        name: str

    stored = SER.dumps([D1("a")])

    @pk.register(version=2)
    @named("DC")
    @dataclasses.dataclass(frozen=True)
    class D2:
        first: str
        last: str = ""

    @pk.migration(D2, from_version=1)
    def split(data: dict[str, Any]) -> dict[str, Any]:
        return {"first": data.pop("name")}

    assert SER.loads(stored) == [D2("a")]
    assert json.loads(SER.dumps(D2("b", "c")))["r"] == 2


def test_newer_missing_and_failing_versions_are_schema_errors() -> None:
    @named("Ver")
    class V3(BaseModel):
        a: int

    pk.register(V3, version=3)
    newer = SER.dumps(V3(a=1))
    pk.register(V3, version=2)
    with pytest.raises(pk.SchemaVersionError, match=r"value: the stored Ver .* is version 3, newer than the code's version 2"):
        SER.loads(newer)
    unstamped = b'{"__pk__":"m","c":"%s:Ver","v":{"a":1}}' % __name__.encode()
    with pytest.raises(pk.SchemaVersionError, match=r"no migration from version 1 to 2 .* Add @pk\.migration\(Ver, from_version=1\)"):
        SER.loads(unstamped)

    @pk.migration(V3, from_version=1)
    def broken(data: dict[str, Any]) -> Any:
        return data["nope"]

    with pytest.raises(pk.SchemaVersionError, match=r"broken \(@pk\.migration\(Ver, from_version=1\)\) failed .*KeyError"):
        SER.loads(b"[%s]" % unstamped)


def test_a_removed_field_with_a_default_is_refused_not_dropped() -> None:
    @named("Drop")
    class Old(BaseModel):
        keep: int = 0
        gone: str = ""

    stored = SER.dumps(Old(keep=1, gone="data"))

    @named("Drop")
    class New(BaseModel):
        keep: int = 0

    pk.register(New)
    with pytest.raises(pk.SchemaVersionError, match=r"value\.gone: .*stored field\(s\) \['gone'\] that Drop does not declare"):
        SER.loads(stored)

    @named("Drop")
    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")
        keep: int = 0

    pk.register(Open)
    assert SER.loads(stored).gone == "data"  # a model that keeps extras keeps it


def test_state_and_class_migrations_compose(local_store: pk.Store) -> None:
    """Class chains run first: a state migration sees nested values at their current version."""
    tid = uid("compose")
    store_v1_chat(local_store, tid, "c")

    @named("Msg_c")
    class Msg(BaseModel):
        role: str
        content: str

    pk.register(Msg, version=2)
    pk.migration(Msg, from_version=1)(lambda d: {"role": d["role"], "content": d["text"]})

    class Chat(pk.State, name="chat_c", version=2):
        messages: Annotated[list[Msg], pk.append] = []
        notes: dict[str, Any] = {}
        pair: tuple[Msg, int] | None = None
        count: int = 0

    @pk.migration(Chat, from_version=1)
    def count(data: dict[str, Any]) -> dict[str, Any]:
        assert all(set(m) == {"role", "content"} for m in data["messages"])
        data["count"] = len(data["messages"])
        return data

    state = local_store.get_state(tid, state=Chat)
    assert state.count == 5 and state.messages[2] == Msg(role="user", content="m2")


# -- a step's recorded result and error ----------------------------------------------------------------


class Refused(Exception):
    pass


def run_steps(store: pk.Store, tid: str, make: Any, read: Any, crash_at: int | None) -> list[str]:
    @pk.checkpointed(name="answer")
    def answer(i: int) -> Any:
        if i == 1:
            raise Refused(make(f"no {i}"))
        return make(f"yes {i}")

    out: list[str] = []
    with pk.resume(tid, store=store, run_id=f"{tid}-run"):
        for i in range(4):
            if i == crash_at:
                raise Crash
            try:
                out.append(read(answer(i)))
            except Refused as exc:
                out.append("refused " + read(exc.args[0]))
    return out


def test_a_replayed_result_and_error_are_migrated_or_refused_with_the_step_named(local_store: pk.Store) -> None:
    tid = uid("result")

    @named("Answer")
    class A1(BaseModel):
        text: str

    with pytest.raises(Crash):
        run_steps(local_store, tid, lambda t: A1(text=t), lambda a: a.text, crash_at=3)

    @named("Answer")
    class A2(BaseModel):
        body: str

    pk.register(A2)
    head = local_store.history(tid)[0].checkpoint_id
    with pytest.raises(pk.SchemaVersionError) as err:
        run_steps(local_store, tid, lambda t: A2(body=t), lambda a: a.body, crash_at=None)
    text = str(err.value)
    assert f"thread {tid!r} run {tid}-run, step 'answer' at 0: recorded result.text: the stored Answer" in text
    assert "@pk.migration(Answer, from_version=1)" in text
    assert local_store.history(tid)[0].checkpoint_id == head  # the run wrote nothing

    pk.register(A2, version=2)
    pk.migration(A2, from_version=1)(lambda d: {"body": d["text"].upper()})
    out = run_steps(local_store, tid, lambda t: A2(body=t), lambda a: a.body, crash_at=None)
    assert out == ["YES 0", "refused NO 1", "YES 2", "yes 3"]  # 0-2 replayed (migrated), 3 ran


def test_a_recorded_error_whose_argument_changed_shape_names_the_step(local_store: pk.Store) -> None:
    tid = uid("error")

    @named("Why")
    class W1(BaseModel):
        text: str

    with pytest.raises(Crash):
        run_steps(local_store, tid, lambda t: W1(text=t), lambda a: a.text, crash_at=3)

    @named("Why")
    class W2(BaseModel):
        reason: str

    pk.register(W2, version=2)
    pk.migration(W2, from_version=1)(lambda d: {"reason": d["text"]} if d["text"] != "no 1" else {})
    with pytest.raises(pk.SchemaVersionError, match=r"step 'answer' at 1: recorded error\.args\[0\]\.reason: after migration"):
        run_steps(local_store, tid, lambda t: W2(reason=t), lambda a: a.reason, crash_at=None)


# -- what register(version=) and migration() refuse ---------------------------------------------------


class Color(enum.Enum):
    RED = 1


class Point(NamedTuple):
    x: int


def test_registration_errors_say_what_to_do() -> None:
    with pytest.raises(pk.ConfigurationError, match="only pydantic models and dataclasses carry a version; Color is an Enum"):
        pk.register(Color, version=2)
    with pytest.raises(pk.ConfigurationError, match="Point is a namedtuple"):
        pk.register(Point, version=2)

    class S(pk.State):
        a: int = 0

    with pytest.raises(pk.ConfigurationError, match=r"declare its version on the class: class S\(pk.State, version=2\)"):
        pk.register(S, version=2)

    class M(BaseModel):
        a: int

    for bad in (0, -1, True, "2", 1.5):
        with pytest.raises(pk.ConfigurationError, match="version must be an int >= 1"):
            pk.register(M, version=bad)  # type: ignore[arg-type]
    with pytest.raises(pk.ConfigurationError, match=r"has no version. Give it one first: pk.register\(.*M, version=2\)"):
        pk.migration(M, from_version=1)
    pk.register(M, version=3)
    for bad in (0, 3, True):
        with pytest.raises(pk.ConfigurationError, match="from_version must be between 1"):
            pk.migration(M, from_version=bad)  # type: ignore[arg-type]
    with pytest.raises(pk.ConfigurationError, match="decorates a function"):
        pk.migration(M, from_version=1)(42)  # type: ignore[arg-type]
    pk.migration(M, from_version=2)(lambda d: d)
    with pytest.raises(pk.ConfigurationError, match="already registered"):
        pk.migration(M, from_version=2)(lambda d: d)
    with pytest.raises(pk.ConfigurationError, match="a migration from version 2 is registered, so the version must be at least 3"):
        pk.register(M, version=2)
    with pytest.raises(pk.ConfigurationError, match="takes a class"):
        pk.register(42)  # type: ignore[call-overload]
    pk.register(M)  # without version=: the version stays
    assert json.loads(SER.dumps(M(a=1)))["r"] == 3


def test_the_cli_prints_versioned_values_as_stored_without_their_classes(tmp_path: Any) -> None:
    """The CLI never imports the user's classes, so it runs no migration: it shows what is stored."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    url = f"sqlite:///{tmp_path}/cli.db"

    @named("CliMsg")
    class Old(BaseModel):
        text: str

    with pk.connect(url) as store, pk.resume("cli-thread", store=store) as run:
        run.state["messages"] = [Old(text="old")]

    @named("CliMsg")
    class New(BaseModel):
        content: str

    pk.register(New, version=2)
    pk.migration(New, from_version=1)(lambda d: {"content": d["text"]})
    with pk.connect(url) as store, pk.resume("cli-thread", store=store) as run:
        assert run.state["messages"] == [New(content="old")]
        run.state["messages"].append(New(content="new"))
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'adapters'}"}
    done = subprocess.run(
        [sys.executable, "-m", "persistkit", "state", "cli-thread", "--url", url, "--json"],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["messages"] == [{"text": "old"}, {"content": "new"}]


def test_hashable_values_stay_objects_in_plain_data_and_malformed_stamps_are_refused() -> None:
    """Set items and dict keys must stay hashable, so a migration gets them as objects."""

    @named("Key")
    @dataclasses.dataclass(frozen=True)
    class Key:
        k: str

    @named("Holder")
    class H1(BaseModel):
        keys: set[Key]
        by: dict[Key, int]
        text: str

    stored = SER.dumps(H1(keys={Key("a")}, by={Key("b"): 1}, text="t"))

    @named("Holder")
    class H2(BaseModel):
        keys: set[Key]
        by: dict[Key, int]
        body: str

    pk.register(H2, version=2)

    @pk.migration(H2, from_version=1)
    def up(data: dict[str, Any]) -> dict[str, Any]:
        assert data["keys"] == {Key("a")} and data["by"] == {Key("b"): 1}
        data["body"] = data.pop("text")
        return data

    assert SER.loads(stored) == H2(keys={Key("a")}, by={Key("b"): 1}, body="t")
    node = json.loads(SER.dumps(H2(keys=set(), by={}, body="")))
    for bad in ({**node, "r": 0}, {**node, "r": "2"}, {**node, "r": True}, {**node, "x": 1}):
        with pytest.raises(pk.SerializationError, match="unexpected keys"):
            SER.decode(bad)


def test_get_state_plain_reads_stored_fields_without_classes(tmp_path: Path) -> None:
    """``plain=True``: nested models and dataclasses as dicts of their stored fields, so a
    process that never imported their classes (a dashboard) can read the thread."""
    from pydantic import BaseModel

    class Shape(BaseModel):
        kind: str
        sides: int

    tid = "plain-read"
    with pk.connect(f"sqlite:///{tmp_path}/p.db") as store:
        with pk.resume(tid, store=store) as run:
            run.state["shapes"] = [Shape(kind="tri", sides=3)]
            run.state["one"] = {"s": Shape(kind="sq", sides=4)}
        shown = store.get_state(tid, plain=True)
        assert shown == {"shapes": [{"kind": "tri", "sides": 3}], "one": {"s": {"kind": "sq", "sides": 4}}}
        assert not isinstance(shown["shapes"][0], BaseModel)
        assert isinstance(store.get_state(tid)["shapes"][0], Shape)  # without plain: revived
        with pytest.raises(pk.ConfigurationError, match="plain=True"):
            store.get_state(tid, state=dict, plain=True)
