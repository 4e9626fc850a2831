"""A step handed a value that a migration changed replays; found by the combination matrix.

Version-1 code recorded step ``b(reply)`` with the digest of a version-1
``Reply``; version-2 code replays ``a()``'s recorded result migrated and hands it
to ``b``: the digests cannot match, and that must not be a NonDeterminismError.
Changed arguments with no migration in the run still are.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from conftest import uid

import persistkit as pk


class Crash(BaseException):
    pass


def _reply_class(version: int) -> type:
    fields = [("text", str)] if version == 1 else [("body", str), ("words", int)]
    cls = dataclasses.make_dataclass("MigratedArgReply", fields)
    cls.__module__ = __name__
    if version == 1:
        pk.register(cls)
    else:
        pk.register(cls, version=2)

        @pk.migration(cls, from_version=1)
        def up(data: dict[str, Any]) -> dict[str, Any]:
            data["body"] = data.pop("text")
            data["words"] = len(data["body"].split())
            return data

    return cls


def _agent(store: pk.Store, tid: str, reply: type, ran: list[str], crash_in: str = "") -> list[str]:
    @pk.checkpointed(name="a")
    def a() -> Any:
        ran.append("a")
        return reply(text="two words") if "text" in reply.__dataclass_fields__ else reply(body="two words", words=2)

    @pk.checkpointed(name="b")
    def b(r: Any) -> str:
        ran.append("b")
        return f"b saw {r!r}"

    @pk.checkpointed(name="c")
    def c(seen: str) -> str:
        ran.append("c")
        if crash_in == "c":
            raise Crash
        return seen.upper()

    with pk.resume(tid, store=store, busy=None):
        return [c(b(a()))]


def test_a_migrated_result_handed_to_a_recorded_step_replays(local_store: pk.Store) -> None:
    tid = uid("migargs")
    ran: list[str] = []
    with pytest.raises(Crash):
        _agent(local_store, tid, _reply_class(1), ran, crash_in="c")
    assert ran == ["a", "b", "c"]
    out = _agent(local_store, tid, _reply_class(2), ran)
    assert ran == ["a", "b", "c", "c"]  # a and b replayed, c (in flight) ran again
    assert out == ["B SAW MIGRATEDARGREPLY(TEXT='TWO WORDS')"]  # b's recorded result, as recorded


def test_changed_arguments_without_a_migration_are_still_refused(local_store: pk.Store) -> None:
    tid = uid("migargs-nd")

    @pk.checkpointed(name="echo")
    def echo(x: str) -> str:
        return x

    @pk.checkpointed(name="stop")
    def stop() -> None:
        raise Crash

    with pytest.raises(Crash), pk.resume(tid, store=local_store, busy=None):
        echo("one")
        stop()
    with pytest.raises(pk.NonDeterminismError), pk.resume(tid, store=local_store, busy=None):
        echo("two")
