"""A step serializes each state channel at most once: an unchanged immutable value is
neither checked before the step nor encoded at its commit again; changed values,
and values that can change in place, still are."""

from __future__ import annotations

from typing import Any

import pytest

import persistkit as pk
from persistkit.codec._pipeline import Codec


class Doc(pk.State, name="tests.serialize_once.Doc"):
    summary: str = ""
    meta: dict[str, Any] = {}
    count: int = 0


@pk.checkpointed
def touch(i: int) -> int:
    return i


def test_unchanged_immutable_channels_are_not_serialized_again(monkeypatch: pytest.MonkeyPatch) -> None:
    paths: list[str] = []
    encode = Codec.encode

    def spy(self: Codec, value: Any, path: str = "value") -> Any:
        paths.append(path)
        return encode(self, value, path)

    monkeypatch.setattr(Codec, "encode", spy)
    store = pk.connect("memory://")
    big = "x" * 50_000
    with pk.resume("t", store=store, state=Doc) as run:
        run.state.summary = big
        run.state.meta = {"k": 1}
        touch(0)  # the first commit encodes every channel
        assert paths.count("state.summary") == 1
        for i in range(1, 6):
            touch(i)
        assert paths.count("state.summary") == 1, paths  # the same str object: not again
        assert paths.count("state.meta") == 6  # a dict can change in place: every commit
        run.state.meta["k"] = 2  # in place: found
        run.state.summary = big + "y"
        touch(6)
        assert paths.count("state.summary") == 2
    with pk.resume("t", store=store, state=Doc) as again:
        assert again.state.summary == big + "y" and again.state.meta == {"k": 2}
    store.close()


def test_an_unstorable_change_is_still_refused_before_the_step() -> None:
    store = pk.connect("memory://")
    ran: list[int] = []

    @pk.checkpointed
    def step(i: int) -> None:
        ran.append(i)

    with pytest.raises(pk.SerializationError, match="was not run"), pk.resume("u", store=store, state=dict) as run:
        run.state["n"] = 1
        step(0)
        run.state["n"] = object()
        step(1)
    assert ran == [0]
    store.close()
